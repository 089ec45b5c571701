"""The shapes and huge-pool benchmarks' own logic (bench/perf/bench_shapes.py, bench_huge_pool.py): the data
each shape asks for, one shape's miniature run and its table, and the huge-pool table."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench" / "perf"))

import bench_batch  # noqa: E402
import bench_objects  # noqa: E402
import bench_shapes  # noqa: E402
import bench_small  # noqa: E402
import benchmarks_doc  # noqa: E402
import limits_doc  # noqa: E402


def test_the_data_has_the_pool_sizes_and_ids_asked_for(tmp_path):
    bench_batch.make_dataset(tmp_path / "d", 20_000, 3, 4, pool_sizes=(300, 900), ids="string")
    df = pl.read_parquet(sorted((tmp_path / "d").glob("*.parquet")))
    assert df.height == 20_000 and df["prompt_id"].dtype == pl.String
    assert df["prompt_id"].str.starts_with("prompt-").all()
    sizes = df.group_by("prompt_id").len()["len"].to_numpy()
    # every pool but each block's last (cut to fit the block) holds 300 to 900 candidates
    assert np.sum((sizes < 300) | (sizes > 900)) <= 1 and sizes.max() <= 900
    assert df.group_by("prompt_id").agg(pl.col("cand").n_unique() == pl.len())["cand"].all()


def test_one_shape_runs_and_is_tabled(tmp_path):
    out = tmp_path / "s.json"
    assert bench_shapes.main(["--size", "3000", "--limits", "900MB", "--shapes", "2", "--out", str(out)]) == 0
    sh = json.loads(out.read_text())
    (s,) = sh["shapes"]
    assert s["shape"] == "string ids" and s["ids"] == "string" and s["candidates"] == 3000
    text = "\n".join(limits_doc.shapes_section(sh))
    assert text.count("\n| string ids |") == len(s["results"]) == 3  # the minimum, 1.5x it, 900MB


def test_the_huge_pool_table_has_a_row_per_method():
    doc = {"results": [{"candidates": 20_000, "dim": 64, "k": 50, "methods": {
        "on_demand": {"seconds": 2.0, "runs_seconds": [2.0], "cpu_seconds": 3.0, "peak_rss_bytes": 2**28,
                      "limit_bytes": 512_000_000, "peak_rss_over_limit": 0.52},
        "apricot": {"seconds": 4.0, "runs_seconds": [4.0], "cpu_seconds": 5.0, "peak_rss_bytes": 2**30,
                    "on_demand_over_this": 0.5, "same_set_as_on_demand": True}}}]}
    rows = benchmarks_doc._render_huge_pool(doc).splitlines()[2:]
    assert len(rows) == 2 and "limit 512 MB (peak 52%)" in rows[0] and "| 0.50 | True |" in rows[1]


def test_the_bucket_counts_run_and_are_tabled(tmp_path):
    import bench_buckets

    out = tmp_path / "b.json"
    assert bench_buckets.main(["--size", "4000", "--limit", "2GB", "--parts-list", "plan,3", "--repeats", "1",
                               "--workdir", str(tmp_path / "w"), "--out", str(out)]) == 0
    bk = json.loads(out.read_text())
    planned, forced = bk["results"]
    assert planned["asked"] == "plan" and planned["parts"] == 1 and planned["ratio_to_planned"] == 1.0
    assert forced["asked"] == "3" and forced["parts"] == 3 and forced["ratio_to_planned"] > 0
    rows = "\n".join(limits_doc.buckets_section(bk)).splitlines()
    assert sum(line.startswith("| 1 | the plan |") for line in rows) == 1
    assert sum(line.startswith("| 3 | --parts 3 |") for line in rows) == 1


def test_small_jobs_bench_runs_a_shape_and_is_tabled(tmp_path):
    out = tmp_path / "small.json"
    assert bench_small.main(["--size", "3000", "--repeats", "2", "--shapes", "2", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    (r,) = doc["results"]
    assert r["shape"] == "string ids" and r["candidates"] == 3000 and len(r["ratio_runs"]) == 2
    # the ratio is the median of each round's job over the floor of the same round
    assert r["ratio_to_floor"] == np.median([j / f for j, f in zip(r["runs_seconds"], r["floor_runs"])])
    assert r["steps_seconds"]["select"] > 0 and r["steps_seconds"]["read"] > 0
    text = benchmarks_doc._render_small(doc)
    assert text.count("\n| string ids | 3,000 |") == 1


def test_objects_bench_pairs_checked_and_unchecked_reads(tmp_path):
    import pytest

    pytest.importorskip("moto.server")
    out = tmp_path / "objects.json"
    assert bench_objects.main(["--size", "3000", "--repeats", "2", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    d = doc["paired_difference_seconds"]
    assert doc["same_kept_rows"] and len(d["each"]) == 2
    assert d["each"] == [c - u for c, u in zip(doc["runs_seconds"]["checked"], doc["runs_seconds"]["unchecked"])]
    assert d["ci95"][0] <= d["mean"] <= d["ci95"][1]
    assert "| with page checksums (checked) |" in benchmarks_doc._render_objects(doc)
