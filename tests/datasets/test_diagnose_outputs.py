"""`mrt diagnose --json/--plot/--allocation` (and `mrt export`): a place that cannot take the
output is refused before any work, in one line with exit code 2; a write that fails at the
end is one line too, naming the output, and leaves no partial file."""

from __future__ import annotations

import errno
import json
import os
from unittest import mock

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from mrt_fast.cli import app

runner = CliRunner()


def losses(path, null_at=None):
    rng = np.random.default_rng(0)
    ids = np.repeat(np.arange(30), 4)
    loss = rng.gamma(2.0, 1.0, len(ids)).tolist()
    if null_at is not None:
        loss[null_at] = None
    pl.DataFrame({"prompt_id": ids, "loss": loss}).write_parquet(path)
    return path


def diagnose(*args):
    return runner.invoke(app, ["diagnose", *map(str, args), "--n-boot", "0"])


def one_line_exit_2(r, *needles):
    assert r.exit_code == 2, (r.exit_code, r.output)
    err = r.stderr
    assert err.startswith("error: ") and err.count("\n") == 1, err
    for n in needles:
        assert n in err, (n, err)


@pytest.mark.parametrize("args, needle", [
    (["--plot", "{d}/v.txt"], "unsupported image format '.txt'"),
    (["--plot", "{d}/v"], "unsupported image format ''"),
    (["--plot", "/dev/full"], "--plot '/dev/full'"),
    (["--json", "/dev/full"], "--json '/dev/full' is not a regular file"),
    (["--allocate", "100", "--allocation", "{d}/a.txt"], "unsupported format '.txt'"),
    (["--allocate", "100", "--allocation", "/dev/full"], "--allocation"),
    (["--allocate", "100", "--allocation", "{d}/in.parquet/a.parquet"], "is not a directory"),
    (["--json", "{d}"], "is a directory"),
])
def test_bad_output_is_refused_before_any_work(tmp_path, args, needle):
    # the input has a null loss: reading it would fail with another message
    inp = losses(tmp_path / "in.parquet", null_at=7)
    before = sorted(os.listdir(tmp_path))
    r = diagnose(inp, *[a.format(d=tmp_path) for a in args])
    one_line_exit_2(r, needle)
    assert "null" not in r.output
    assert sorted(os.listdir(tmp_path)) == before
    assert os.path.exists("/dev/full") and not os.path.isfile("/dev/full")


def test_outputs_in_missing_directories_are_written_there(tmp_path):
    inp = losses(tmp_path / "in.parquet")
    new = tmp_path / "new" / "deeper"
    r = diagnose(inp, "--json", new / "r.json", "--plot", new / "p" / "v.png", "--allocate", "100",
                 "--allocation", new / "a" / "a.parquet")
    assert r.exit_code == 0, r.output
    assert json.loads((new / "r.json").read_text())
    assert (new / "p" / "v.png").stat().st_size > 0
    assert pl.read_parquet(new / "a" / "a.parquet")["k"].sum() > 0


@pytest.mark.parametrize("what", ["json", "plot", "allocation"])
def test_a_write_that_fails_at_the_end_is_one_line_and_leaves_nothing(tmp_path, what):
    inp = losses(tmp_path / "in.parquet")
    out = {"json": tmp_path / "r.json", "plot": tmp_path / "v.png", "allocation": tmp_path / "a.parquet"}[what]
    full = OSError(errno.ENOSPC, "No space left on device")
    target = {"json": "pathlib.Path.write_text", "plot": "matplotlib.figure.Figure.savefig",
              "allocation": "pyarrow.parquet.ParquetWriter.write_table"}[what]
    def disk_full(*args, **kwargs):
        raise full

    with mock.patch(target, disk_full):
        r = diagnose(inp, f"--{what}", out, "--allocate", "100")
    one_line_exit_2(r, "no space left on device while writing", f"--{what} {str(out)!r}", "bytes free")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.parquet"]


def test_export_on_a_full_disk_names_its_output(tmp_path):
    inp = tmp_path / "kept.parquet"
    pl.DataFrame({"prompt_id": [0, 0, 1], "prompt": ["a", "a", "b"], "response": ["x", "y", "z"]}).write_parquet(inp)
    out = tmp_path / "train.jsonl"

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    with mock.patch("polars.DataFrame.write_ndjson", disk_full):
        r = runner.invoke(app, ["export", str(inp), str(out), "--plain"])
    one_line_exit_2(r, "no space left on device while writing", repr(str(out)), "bytes free")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.parquet"]


def test_every_output_is_written(tmp_path):
    inp = losses(tmp_path / "in.parquet")
    r = diagnose(inp, "--json", tmp_path / "r.json", "--plot", tmp_path / "v.svg", "--allocate", "100",
                 "--allocation", tmp_path / "a.csv")
    assert r.exit_code == 0, r.output
    assert "v_x" in json.loads((tmp_path / "r.json").read_text())
    assert (tmp_path / "v.svg").read_text().lstrip().startswith("<?xml")
    assert pl.read_csv(tmp_path / "a.csv")["k"].sum() <= 100
