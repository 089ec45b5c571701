"""Where a select job's time goes: the report's profile names the steps each path runs, and
`mrt select --profile` prints it."""

from __future__ import annotations

import numpy as np
import polars as pl
from typer.testing import CliRunner

from mrt_fast.cli import app
from mrt_fast.datasets.select_job import select_dataset


def _table(n: int = 6_000, pools: int = 300, d: int = 8, seed: int = 0) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    return pl.DataFrame({"prompt_id": rng.integers(0, pools, n), "embedding": rng.normal(size=(n, d)).astype(np.float32),
                         "reward": rng.random(n)})


def _check_times(prof: dict) -> None:
    for s in prof["steps"].values():
        assert s["wall"] >= 0 and s["cpu"] >= 0
    for p in prof["pieces"].values():
        assert p["wall"] >= 0 and p["count"] >= 1


def test_in_memory_job_times_plan_read_select_write(tmp_path):
    _table().write_parquet(tmp_path / "in.parquet")
    rep = select_dataset(tmp_path / "in.parquet", tmp_path / "out", 2, "grades")
    assert list(rep.profile["steps"]) == ["plan", "read", "select", "write"]
    assert rep.profile["pieces"] == {}
    _check_times(rep.profile)
    # the steps are parts of the job: their wall seconds add up to no more than the job's
    assert sum(s["wall"] for s in rep.profile["steps"].values()) <= rep.seconds + 1e-6
    assert rep.to_dict()["profile"] == rep.profile


def test_spilled_job_times_each_bucket_piece(tmp_path):
    _table().write_parquet(tmp_path / "in.parquet")
    rep = select_dataset(tmp_path / "in.parquet", tmp_path / "out", 2, "grades", parts=4)
    # the ids are looked at for pools in consecutive rows first (one batch of a shuffled input)
    assert rep.spilled and list(rep.profile["steps"]) == ["plan", "find pools", "spill", "select by bucket", "finish"]
    pieces = rep.profile["pieces"]
    assert set(pieces) == {"bucket read", "bucket select", "bucket write"}
    # every bucket holds rows here: each piece ran once a bucket
    assert all(p["count"] == 4 for p in pieces.values())
    _check_times(rep.profile)
    lines = dict(rep.profile_lines())
    assert lines["  bucket select"].endswith("summed over 4 buckets")


def test_job_read_in_place_times_each_part_piece(tmp_path):
    _table().sort("prompt_id", maintain_order=True).write_parquet(tmp_path / "in.parquet")
    rep = select_dataset(tmp_path / "in.parquet", tmp_path / "out", 2, "grades", parts=3)
    assert rep.in_place and list(rep.profile["steps"]) == ["plan", "find pools", "select by part", "finish"]
    pieces = rep.profile["pieces"]
    assert set(pieces) == {"part read", "part select", "part write"}
    assert all(p["count"] == 3 for p in pieces.values())
    _check_times(rep.profile)
    assert dict(rep.profile_lines())["  part select"].endswith("summed over 3 parts")


def test_grouped_and_resumed_jobs_name_their_steps(tmp_path):
    df = _table()
    g = df.group_by("prompt_id", maintain_order=True).agg("embedding", "reward")
    g.write_parquet(tmp_path / "g.parquet")
    rep = select_dataset(tmp_path / "g.parquet", tmp_path / "out", 2, "grades")
    assert list(rep.profile["steps"]) == ["plan", "select by part"]
    again = select_dataset(tmp_path / "g.parquet", tmp_path / "out", 2, "grades")
    assert again.already_done and list(again.profile["steps"]) == ["plan"]


def test_cli_profile_prints_the_steps(tmp_path):
    _table().write_parquet(tmp_path / "in.parquet")
    r = CliRunner().invoke(app, ["select", str(tmp_path / "in.parquet"), str(tmp_path / "out"), "--k", "2",
                                 "--parts", "2", "--profile"])
    assert r.exit_code == 0, r.output
    text = r.output[r.output.index("where the time went"):]
    for name in ("plan", "spill", "select by bucket", "bucket select"):
        assert name in text
    r = CliRunner().invoke(app, ["select", str(tmp_path / "in.parquet"), str(tmp_path / "out2"), "--k", "2"])
    assert r.exit_code == 0 and "where the time went" not in r.output

