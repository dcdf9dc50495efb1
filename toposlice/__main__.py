"""``python -m toposlice``: the CLI, with Ctrl-C during its own import ending as quietly
as one during the command (toposlice.cli.main)."""

try:
    from toposlice.cli import exit_interrupted, main
except KeyboardInterrupt:
    import os

    os._exit(130)
try:
    rc = main()
except KeyboardInterrupt:  # between the import and main's own try
    exit_interrupted()
raise SystemExit(rc)
