"""What a command shows when it fails: one line for a user's error, a traceback for a bug."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

import mrt_fast.variance
from mrt_fast.cli import app
from mrt_fast.errors import MissingDependencyError, MrtInputError, MrtResourceError


@pytest.fixture
def losses(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "l.parquet"
    pl.DataFrame({"prompt_id": np.repeat(np.arange(10), 3), "loss": rng.normal(size=30)}).write_parquet(path)
    return path


def _failing(exc):
    def fail(*args, **kwargs):
        raise exc

    return fail


@pytest.mark.parametrize("exc", [
    MrtInputError("column 'loss' (loss) must be numeric\nsecond line"),
    MissingDependencyError("--engine ray needs Ray Data: pip install 'mrt_fast[ray]'"),
    MrtResourceError("no space left on device while writing 'out' (0 bytes free); free space and rerun"),
    PermissionError(13, "Permission denied"),
])
def test_a_users_error_is_one_line_and_exit_2(losses, monkeypatch, exc):
    monkeypatch.setattr(mrt_fast.variance, "variance_budget", _failing(exc))
    r = CliRunner().invoke(app, ["diagnose", str(losses)])
    assert r.exit_code == 2, (r.exit_code, r.output)
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr
    assert "Traceback" not in r.output


@pytest.mark.parametrize("exc", [TypeError("unsupported operand type(s) for +: 'int' and 'str'"),
                                 KeyError("n_rows"), AttributeError("'NoneType' object has no attribute 'v_x'")])
def test_a_bug_keeps_its_traceback(losses, monkeypatch, exc):
    """A TypeError (or any exception that is no user's error) raised by our code is a bug: it is not
    turned into a one-line 'error:' with exit code 2."""
    monkeypatch.setattr(mrt_fast.variance, "variance_budget", _failing(exc))
    r = CliRunner().invoke(app, ["diagnose", str(losses)])
    assert r.exit_code != 2 and isinstance(r.exception, type(exc)), (r.exit_code, r.output)
    assert not r.stderr.startswith("error: ")


def test_a_bug_prints_a_traceback_in_a_real_run(tmp_path):
    """Run as a command, a bug in a command's code ends with Python's traceback on stderr."""
    code = ("import sys, mrt_fast.variance as v\n"
            "def bug(*a, **k):\n    return None + 1\n"
            "v.variance_budget = bug\n"
            "from mrt_fast.cli import app\n"
            f"sys.argv = ['mrt', 'diagnose', {str(tmp_path / 'l.parquet')!r}]\n"
            "app()\n")
    pl.DataFrame({"prompt_id": [0, 0, 1, 1], "loss": [0.0, 1.0, 2.0, 0.5]}).write_parquet(tmp_path / "l.parquet")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode not in (0, 2), (r.returncode, r.stderr)
    assert "Traceback" in r.stderr and "TypeError" in r.stderr, r.stderr
