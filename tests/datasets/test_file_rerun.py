"""A file output follows a directory's rerun rule: the same job again is already complete, another
job (other parameters, another input, a file no job wrote) is refused unless overwrite."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from mrt_fast.cli import app
from mrt_fast.datasets.local import select_dataset
from mrt_fast.errors import MrtInputError


def write_grouped(path, seed=0):
    rng = np.random.default_rng(seed)
    pl.DataFrame({"prompt_id": np.arange(6), "responses": [[f"r{i}{j}" for j in range(4)] for i in range(6)],
                  "reward": [list(rng.normal(size=4)) for _ in range(6)]}).write_parquet(path)


@pytest.mark.parametrize("suffix", ["parquet"])
def test_file_output_rerun_rule(tmp_path, suffix):
    src, out = tmp_path / "g.parquet", tmp_path / f"kept.{suffix}"
    write_grouped(src)
    a = select_dataset(src, out, 2, "top")
    assert not a.already_done
    again = select_dataset(src, out, 2, "top")
    assert again.already_done and again.n_out_rows == 6
    with pytest.raises(MrtInputError, match="exists, written by .* with other parameters.*--overwrite"):
        select_dataset(src, out, 3, "top")
    b = select_dataset(src, out, 3, "top", overwrite=True)
    assert not b.already_done
    got = pl.read_parquet(out) if suffix == "parquet" else pl.read_ndjson(out)
    assert got["responses"].list.len().to_list() == [3] * 6
    # another input, and a file changed since the job wrote it
    write_grouped(tmp_path / "h.parquet", seed=1)
    with pytest.raises(MrtInputError, match="from another input"):
        select_dataset(tmp_path / "h.parquet", out, 3, "top")
    # nothing is written beside the output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.parquet", "h.parquet", out.name]


def test_a_jsonl_output_has_no_record_so_a_rerun_needs_overwrite(tmp_path):
    src, out = tmp_path / "g.parquet", tmp_path / "kept.jsonl"
    write_grouped(src)
    select_dataset(src, out, 2, "top")
    with pytest.raises(MrtInputError, match="JSONL/CSV file holds no record"):
        select_dataset(src, out, 2, "top")
    assert not select_dataset(src, out, 2, "top", overwrite=True).already_done


def test_a_file_no_job_wrote_is_refused_and_the_cli_says_complete(tmp_path):
    src, out = tmp_path / "g.parquet", tmp_path / "kept.parquet"
    write_grouped(src)
    out.write_text("mine")
    r = CliRunner().invoke(app, ["select", str(src), str(out), "--k", "2", "--method", "top"])
    assert r.exit_code == 2 and "holds no record" in r.output, r.output
    assert out.read_text() == "mine"
    r = CliRunner().invoke(app, ["select", str(src), str(out), "--k", "2", "--method", "top", "--overwrite"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, ["select", str(src), str(out), "--k", "2", "--method", "top"])
    assert r.exit_code == 0 and "already complete" in r.output, r.output
