""".ci/run installs into a virtual environment of the checkout, never into the interpreter
it was started with (a root install there broke other packages' pins). Run on a copy of
the checkout's tracked files, offline: a venv that sees the base interpreter's packages
(``CI_VENV_ARGS``) gets the project alone, built with the base's setuptools (the real CI
run makes a clean venv and downloads every dependency into it)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _tracked_copy(dest: Path) -> None:
    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.split(b"\0")
    for name in filter(None, files):
        src = REPO / os.fsdecode(name)
        if src.is_file():
            target = dest / os.fsdecode(name)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)


def _base_site_entries() -> list[str]:
    """What of toposlice the base interpreter's site-packages holds."""
    base = sysconfig.get_path("purelib", vars={"base": sys.base_prefix})
    return sorted(glob.glob(os.path.join(base, "*toposlice*")))


def _base_can_build_editable() -> bool:
    """The offline build uses the base interpreter's setuptools: an editable install needs
    its ``bdist_wheel``, built in from setuptools 70.1 and from the ``wheel`` package
    before (a fresh pyenv 3.11 has setuptools 65.5 and no ``wheel``)."""
    probe = (
        "import importlib.util, setuptools; v = tuple(int(x) for x in "
        "setuptools.__version__.split('.')[:2]); "
        "raise SystemExit(0 if v >= (70, 1) or importlib.util.find_spec('wheel') else 1)"
    )
    base = Path(sys.base_prefix) / "bin" / "python3"
    done = subprocess.run([str(base), "-I", "-c", probe], capture_output=True, timeout=60)
    return done.returncode == 0


def test_setup_installs_into_a_venv_of_the_checkout(tmp_path: Path) -> None:
    if shutil.which("git") is None:
        pytest.skip("git not installed")
    if not _base_can_build_editable():
        pytest.skip("the base interpreter's setuptools cannot build offline (no bdist_wheel)")
    clone = tmp_path / "clone"
    _tracked_copy(clone)
    before = _base_site_entries()
    env = {
        **os.environ,
        "CI_VENV_ARGS": "--system-site-packages --without-pip",
        "PIP_NO_INDEX": "1",
        "PIP_NO_DEPS": "1",
        "PIP_NO_BUILD_ISOLATION": "0",  # pip's inverted spelling: 0 = --no-build-isolation
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    env.pop("VIRTUAL_ENV", None)
    env.pop("CI_VENV", None)
    done = subprocess.run(
        ["bash", ".ci/run", "setup"],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ci: installed into .venv" in done.stdout
    venv_python = clone / ".venv" / "bin" / "python3"
    where = subprocess.run(
        [str(venv_python), "-c", "import sys, toposlice; print(sys.prefix, toposlice.__file__)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert where == [str(clone / ".venv"), str(clone / "toposlice" / "__init__.py")]
    assert (clone / ".venv" / "bin" / "toposlice").is_file()
    assert _base_site_entries() == before, "nothing installed into the base interpreter"
