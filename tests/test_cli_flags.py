"""The command line's own promises, through the real command (a subprocess): ranges of
every duration and count flag checked by the parser, one meaning per flag name, one
device-name parser and one score, ``--version``, ``help``, shell completion, and a
description and an example in every ``--help``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_cli_errors import HOST_DIRS, KUBECONFIG, cli_env, toposlice

REPO = Path(__file__).resolve().parent.parent

#: (command line, the flag the parser names, the value it quotes); {tmp} and {run} (the
#: rest of a ``run`` command line) filled in by _args.
OUT_OF_RANGE = [
    *(
        (f"serve --fake cpu-2s --http-addr 127.0.0.1:0 --rediscover-interval {v}", v)
        for v in ("1e308", "0", "-5", "nan", "inf", "soon")
    ),
    ("serve --fake cpu-2s --http-addr 127.0.0.1:0 --observe-interval 0", "0"),
    ("run --fake cpu-2s --node-name n1 {run} --rediscover-interval nan", "nan"),
    ("run --fake cpu-2s --node-name n1 {run} --resync-interval 0", "0"),
    ("run --fake cpu-2s --node-name n1 {run} --startup-timeout -1", "-1"),
    ("REDISCOVER_INTERVAL=1e308 run --fake cpu-2s --node-name n1 {run}", "1e308"),
    ("score --request {tmp}/two.yaml --fake dgx-h100 --top 0", "0"),
    ("score --request {tmp}/two.yaml --fake dgx-h100 --top -3", "-3"),
    ("claim --gpus 0", "0"),
    ("claim --gpus 4 --nics-per-gpu 9", "9"),
    ("claim --gpus 4 --cpu-groups -1", "-1"),
]
FLAGS = {"REDISCOVER_INTERVAL": "--rediscover-interval"}
JSON = ("-o", "json")
REFS = "GPU0,gpu1,NIC0,nic1"


def _args(line: str, tmp: Path) -> list[str]:
    import shlex

    (tmp / "two.yaml").write_text("gpus: 2\n")
    (tmp / "kc.yaml").write_text(KUBECONFIG)
    run = f"--kubeconfig {tmp}/kc.yaml " + HOST_DIRS.format(host=tmp / "h")
    return shlex.split(line.format(tmp=tmp, run=run))


@pytest.mark.parametrize(("line", "value"), OUT_OF_RANGE, ids=[c[0] for c in OUT_OF_RANGE])
def test_out_of_range_refused_before_start(line: str, value: str, tmp_path: Path) -> None:
    """Refused by the parser (exit 2, the flag and value named), before anything binds,
    discovers or is created (was: 1e308 an OverflowError after start, 0/-5/nan a 50 ms
    rediscovery loop, --top 0 an empty answer with exit 1, --top -3 ten placements)."""
    r = toposlice(_args(line, tmp_path), tmp_path, timeout=30)
    last = r.stderr.strip().splitlines()[-1]
    words = line.split()
    flag = FLAGS.get(words[0].split("=")[0]) or words[-2]
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert re.search(rf"error: argument {flag}: '{re.escape(value)}'(: give| is not a)", last)
    assert not (tmp_path / "h").exists()


def test_one_meaning_per_flag(tmp_path: Path) -> None:
    """``-o`` is a format in every command; files go to ``--output-file``."""
    r = toposlice(["nccl-topo", "--fake", "cpu-2s", "-o", "json"], tmp_path)
    assert r.returncode == 2 and "invalid choice: 'json'" in r.stderr
    assert not (tmp_path / "json").exists()  # was: the XML written to ./json
    r = toposlice(["machines", "capture", "--fake", "cpu-2s", "-o", "node.yaml"], tmp_path)
    assert r.returncode == 2 and "invalid choice" in r.stderr
    for command in (
        ["nccl-topo", "--fake", "cpu-2s"],
        ["machines", "capture", "--fake", "cpu-2s"],
        ["gather", "--fake", "cpu-2s", "--no-check"],
    ):
        r = toposlice([*command, "--output-file", "out.file"], tmp_path)
        assert r.returncode == 0, r.stderr
        assert (tmp_path / "out.file").stat().st_size > 0
        (tmp_path / "out.file").unlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no temp file left
    r = toposlice(["run", "--driver-name", "x.example.com"], tmp_path)
    assert r.returncode == 2 and "unrecognized arguments: --driver-name" in r.stderr


def test_inventory_reads_yaml(tmp_path: Path) -> None:
    saved = toposlice(["discover", "--fake", "dgx-h100", "-o", "yaml"], tmp_path)
    (tmp_path / "inv.yaml").write_text(saved.stdout)
    direct = toposlice(["slices", "--fake", "dgx-h100", "--node-name", "n", "-o", "json"], tmp_path)
    replay = toposlice(
        ["slices", "--inventory", "inv.yaml", "--node-name", "n", "-o", "json"], tmp_path
    )
    assert replay.returncode == 0, replay.stderr
    assert json.loads(replay.stdout) == json.loads(direct.stdout)


def _score(tmp: Path, devices: str, request: str = "gpus: 4\nnicsPerGpu: 1\n") -> dict:  # type: ignore[type-arg]
    (tmp / "req.yaml").write_text(request)
    r = toposlice(
        ["score", "--request", "req.yaml", "--fake", "dgx-h100", "--devices", devices, *JSON],
        tmp,
    )
    assert r.returncode == 0, r.stderr
    placement: dict = json.loads(r.stdout)["placements"][0]  # type: ignore[type-arg]
    return placement


def test_score_devices_takes_what_nccl_topo_takes(tmp_path: Path) -> None:
    """``GPU<n>``/``NIC<n>`` (graph's labels, any case), DRA names and bus ids alike."""
    by_label = _score(tmp_path, REFS)
    by_name = _score(tmp_path, ",".join(by_label["devices"]))
    assert by_label == by_name
    topo = toposlice(
        ["nccl-topo", "--fake", "dgx-h100", "--node-name", "n", "--devices", REFS],
        tmp_path,
    )
    assert topo.returncode == 0, topo.stderr
    buses = re.findall(r'<pci busid="([0-9a-f:.]+)" class="0x0[32]', topo.stdout)
    assert buses, topo.stdout
    assert _score(tmp_path, ",".join(buses))["devices"] == by_label["devices"]


def test_claim_and_score_agree(tmp_path: Path) -> None:
    """``claim --fake`` reports the scorer's score of the set it lands on (was "score 64",
    the scheduler's rank, while `score` said 88.97 for the same devices)."""
    r = toposlice(["claim", "--gpus", "4", "--nics-per-gpu", "1", "--fake", "dgx-h100"], tmp_path)
    assert r.returncode == 0, r.stderr
    m = re.search(r"# dgx-h100: score ([0-9.]+); (.*)", r.stderr)
    assert m, r.stderr
    devices = re.findall(r"= (\S+?)(?:;|$)", m[2])
    assert len(devices) == 8, m[2]
    placement = _score(tmp_path, ",".join(devices))
    assert f"{placement['score']:.2f}" == m[1]


def test_version(tmp_path: Path) -> None:
    from importlib import metadata

    r = toposlice(["--version"], tmp_path)
    assert r.returncode == 0
    assert r.stdout.strip() == f"toposlice {metadata.version('toposlice')}"
    pyproject = (REPO / "pyproject.toml").read_text()
    assert f'version = "{metadata.version("toposlice")}"' in pyproject


def test_help_command_is_dash_dash_help(tmp_path: Path) -> None:
    for topic in (["serve"], ["machines", "capture"], ["scorer", "serve"], []):
        via_help = toposlice(["help", *topic], tmp_path)
        direct = toposlice([*topic, "--help"], tmp_path)
        assert via_help.returncode == direct.returncode == 0, via_help.stderr
        assert via_help.stdout == direct.stdout
    r = toposlice(["help", "nope"], tmp_path)
    assert r.returncode == 2 and "no command 'nope'" in r.stderr


def _all_parsers() -> dict[str, object]:
    import argparse

    from toposlice.cli import build_parser

    out: dict[str, object] = {}

    def walk(prefix: str, parser: argparse.ArgumentParser) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    out[f"{prefix} {name}".strip()] = sub
                    walk(f"{prefix} {name}", sub)

    walk("", build_parser("*"))
    return out


def test_every_help_has_a_description_an_example_and_option_help() -> None:
    import argparse

    parsers = _all_parsers()
    assert {"serve", "machines capture", "scorer serve", "nccl-topo", "help"} <= set(parsers)
    for name, parser in parsers.items():
        assert isinstance(parser, argparse.ArgumentParser)
        assert parser.description and "\n" not in parser.description.strip(), name
        assert re.search(r"^examples:\n  .*toposlice ", parser.epilog or "", re.M), name
        for action in parser._actions:
            if "-o" in action.option_strings or action.option_strings:
                assert action.help, f"{name} {action.option_strings}: no help text"


def test_bash_completion(tmp_path: Path) -> None:
    """The script `toposlice completion bash` prints, run by the real bash."""
    env = cli_env(tmp_path)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    if not (Path(sys.executable).parent / "toposlice").exists():
        pytest.skip("no toposlice executable beside the interpreter (not pip-installed)")
    script = r"""
eval "$(toposlice completion bash)"
complete_line() {
    COMP_LINE="$1"; COMP_POINT=${#COMP_LINE}; read -ra COMP_WORDS <<< "$1"
    [[ "$1" == *" " ]] && COMP_WORDS+=("")
    COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
    _python_argcomplete toposlice; echo "${COMPREPLY[*]}"
}
complete_line "toposlice ser"
complete_line "toposlice serve --redis"
complete_line "toposlice slices -o "
"""
    r = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr
    lines = [line.split() for line in r.stdout.splitlines()]
    assert lines == [["serve"], ["--rediscover-interval"], ["yaml", "json"]], r.stdout
