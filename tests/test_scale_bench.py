"""The scale benchmark's own logic (bench/perf/bench_scale.py, scale_doc.py): the --profile breakdown it keeps,
the datasets it builds, a miniature curve end to end, and the page's arithmetic."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench" / "perf"))

import bench_scale  # noqa: E402
import scale_doc  # noqa: E402

OUTPUT = """\
 seconds                                                         0.22
wrote 8000 rows to /somewhere/out
where the time went
 start (interpreter, imports, arguments)               0.710 s wall
 plan                                     0.069 s wall, 0.069 s CPU
 spill                                   12.178 s wall, 16.388 s CPU
   bucket read                             2.237 s summed over 11 buckets
"""


def test_the_profile_keeps_each_step_and_no_path():
    p = bench_scale.profile(OUTPUT)
    assert p == {"start (interpreter, imports, arguments)": "0.710 s wall", "plan": "0.069 s wall, 0.069 s CPU",
                 "spill": "12.178 s wall, 16.388 s CPU", "bucket read": "2.237 s summed over 11 buckets"}
    assert "/somewhere" not in json.dumps(p)
    # a tail cut inside a line drops that line only
    assert bench_scale.profile(OUTPUT[OUTPUT.index("wall, 0.069"):]) == {
        "spill": "12.178 s wall, 16.388 s CPU", "bucket read": "2.237 s summed over 11 buckets"}


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_the_dataset_has_every_row_in_pools_of_8_to_128(tmp_path, dtype):
    import polars as pl

    bench_scale.make_dataset(tmp_path, 5000, 3, 4, dtype, block=2000)
    t = pl.read_parquet(tmp_path / "*.parquet")
    assert t.height == 5000 and len(list(tmp_path.glob("*.parquet"))) == 3
    assert t.schema["embedding"] == pl.List({"float16": pl.Float16, "float32": pl.Float32}[dtype])
    sizes = t.group_by("prompt_id").len()["len"]
    assert sizes.max() <= 128 and (sizes >= 8).mean() > 0.95  # a block's last pool may be cut short


def test_a_miniature_curve_runs_the_job_and_its_floor(tmp_path):
    out = tmp_path / "s.json"
    assert bench_scale.main(["--sizes", "3000,6000", "--files", "2", "--dim", "4", "--memory-limit", "400MB",
                             "--repeats", "1", "--workdir", str(tmp_path / "w"), "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    assert [r["candidates"] for r in d["results"]] == [3000, 6000]
    for r in d["results"]:
        s = r["select"]
        assert s["kept"] > 0 and 0 < s["peak_rss_bytes"] and s["peak_rss_over_limit"] < 1.0
        assert s["ratio_to_floor"] == pytest.approx(s["seconds"] / r["floor"]["seconds"])
        assert "plan" in s["profile"]
    rows = scale_doc.table(d)[2:]
    assert [r.split(" | ")[0] for r in rows] == ["| 3,000", "| 6,000"]


def test_the_linear_fit_recovers_a_line():
    n = np.array([1e6, 3e6, 1e7, 3e7])
    a, b, r2 = scale_doc.fit(n, 2.0 + 1.5e-6 * n)
    assert a == pytest.approx(2.0) and b == pytest.approx(1.5e-6) and r2 == pytest.approx(1.0)
