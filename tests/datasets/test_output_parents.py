"""An output's missing parent directories are made, for a file output as for a directory
output, by every engine and every command that writes; a run that writes nothing leaves
none of them behind, and a file where a directory is needed is refused before any work."""

from __future__ import annotations

import warnings

import mrt_fast
import numpy as np
import polars as pl
import pytest
from mrt_fast import MrtInputError
from mrt_fast.cli import app
from mrt_fast.datasets import select_dataset
from mrt_fast.datasets.job import Job
from typer.testing import CliRunner

runner = CliRunner()
OUTPUTS = ["kept.parquet", "kept.jsonl", "kept.csv", "kept"]


def table(n_pools: int = 10) -> pl.DataFrame:
    rng = np.random.default_rng(0)
    ids = np.repeat(np.arange(n_pools), 4)
    return pl.DataFrame({"prompt_id": ids, "prompt": [f"p{i}" for i in ids],
                         "response": [f"r{i}" for i in range(len(ids))], "reward": rng.normal(size=len(ids))})


def kept_rows(out) -> pl.DataFrame:
    if not out.suffix:
        return pl.read_parquet(out / "part-*.parquet")
    return {".parquet": pl.read_parquet, ".jsonl": pl.read_ndjson, ".csv": pl.read_csv}[out.suffix](out)


def want(df: pl.DataFrame) -> pl.DataFrame:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mrt_fast.SmallPoolWarning)
        return mrt_fast.select(df, 2, "top")


@pytest.mark.parametrize("name", OUTPUTS)
def test_select_makes_the_missing_directories_of_any_output(tmp_path, name):
    df = table()
    df.write_parquet(tmp_path / "in.parquet")
    out = tmp_path / "new" / "deeper" / name
    select_dataset(tmp_path / "in.parquet", out, 2, "top")
    assert kept_rows(out).height == want(df).height


@pytest.mark.parametrize("name", ["kept.parquet", "kept"])
def test_a_job_that_writes_nothing_leaves_no_directory_behind(tmp_path, name):
    table().write_parquet(tmp_path / "in.parquet")
    with pytest.raises(MrtInputError, match="bad row"), Job(tmp_path / "in.parquet",
                                                            tmp_path / "new" / "deeper" / name, {}):
        raise MrtInputError("bad row")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.parquet"]


@pytest.mark.parametrize("name", ["kept.parquet", "kept"])
def test_a_file_where_a_directory_is_needed_is_refused_before_work(tmp_path, name):
    table().write_parquet(tmp_path / "in.parquet")
    (tmp_path / "f.txt").write_text("x")
    with pytest.raises(MrtInputError, match="is not a directory"):
        select_dataset(tmp_path / "in.parquet", tmp_path / "f.txt" / "sub" / name, 2, "top")


@pytest.mark.parametrize("name", ["kept.parquet", "kept"])
def test_the_cli_writes_into_missing_directories(tmp_path, name):
    df = table()
    df.write_parquet(tmp_path / "in.parquet")
    out = tmp_path / "a" / "b" / name
    r = runner.invoke(app, ["select", str(tmp_path / "in.parquet"), str(out), "--k", "2", "--method", "top"])
    assert r.exit_code == 0, r.output
    assert kept_rows(out).height == want(df).height
    sft = tmp_path / "c" / "d" / "sft.jsonl"
    r = runner.invoke(app, ["export", str(out), str(sft)])
    assert r.exit_code == 0, r.output
    assert pl.read_ndjson(sft).height == want(df).height


@pytest.mark.ray
@pytest.mark.parametrize("name", ["kept.parquet", "kept"])
def test_the_ray_engine_makes_them_too(tmp_path, name):
    pytest.importorskip("ray")
    from mrt_fast.datasets import ray_engine

    df = table()
    df.write_parquet(tmp_path / "in.parquet")
    out = tmp_path / "new" / "deeper" / name
    ray_engine.select_dataset(tmp_path / "in.parquet", out, 2, "top", parts=2)
    assert kept_rows(out).height == want(df).height
