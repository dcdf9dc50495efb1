"""Moved: the orchestrator (backends then probes) is :mod:`toposlice.discover`.

Kept only for callers not yet moved up (``discovery/gather.py``, ``discovery/replay.py``,
``scorer/topology.py``); ``tests/test_layers.py`` lists it as the one known exception to
"discovery imports nothing above it". Import ``toposlice.discover`` instead.
"""

from __future__ import annotations

from typing import Any


def discover(*args: Any, **kwargs: Any) -> Any:
    from toposlice.discover import discover as _discover

    return _discover(*args, **kwargs)
