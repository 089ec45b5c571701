"""`make` installs into the project's own virtual environment unless an interpreter is named."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def _dry_run(*args: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PY", "VENV", "MAKEFLAGS", "MAKELEVEL")}
    out = subprocess.run(["make", "-n", "-B", "-C", str(ROOT), *args], env=env, capture_output=True, text=True,
                         check=True).stdout
    return [line for line in out.splitlines() if any(w in line for w in ("pip install", "-m venv", " -m "))]


@pytest.mark.parametrize("target", ["setup", "demo", "test"])
def test_setup_installs_into_the_projects_venv_by_default(target):
    lines = _dry_run(target)
    assert any(line.startswith("python3 -m venv .venv") for line in lines), lines
    runs = [line for line in lines if "-m venv" not in line]  # pip, and the demo or the tests
    assert runs and all(line.startswith(".venv/bin/python -m ") for line in runs), runs


@pytest.mark.parametrize("target", ["setup", "demo", "test"])
def test_a_named_interpreter_is_used_instead_and_no_venv_is_made(target):
    lines = _dry_run(target, "PY=/opt/some/python")
    assert not any("-m venv" in line for line in lines), lines
    assert lines and all(line.startswith("/opt/some/python -m ") for line in lines), lines
