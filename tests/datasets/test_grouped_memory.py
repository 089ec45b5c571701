"""A memory limit on a grouped job: refused up front when a part cannot fit (counting its rows
exploded to one per candidate), never cut into one part per prompt; and the similarity block of a
large pool sized from the limit (beyond it, similarity columns on demand)."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from mrt_fast._util.memory import SELECT_WORKER, Budget
from mrt_fast.cli import app
from mrt_fast.datasets.local import GroupedSize, plan_grouped
from mrt_fast.errors import MrtInputError

MiB = 2**20


def grouped_table(n_prompts: int, n: int, d: int, seed: int = 0) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    return pl.DataFrame({
        "prompt_id": np.arange(n_prompts),
        "prompt": [f"question {i}" for i in range(n_prompts)],
        "responses": [[f"answer {i}.{j}" for j in range(n)] for i in range(n_prompts)],
        "reward": [list(rng.normal(size=n)) for _ in range(n_prompts)],
        "embedding": [rng.normal(size=(n, d)).astype(np.float32).tolist() for _ in range(n_prompts)],
    }, schema_overrides={"embedding": pl.List(pl.List(pl.Float32))})


def test_grouped_job_under_a_small_limit_is_refused_before_any_part(tmp_path):
    src = tmp_path / "g.parquet"
    grouped_table(60, 8, 16).write_parquet(src)
    out = tmp_path / "kept"
    r = CliRunner().invoke(app, ["select", str(src), str(out), "--k", "4", "--memory-limit", "100MB"])
    assert r.exit_code == 2, r.output
    assert "use a limit of at least" in r.output
    assert "as one row per candidate" in r.output
    assert not out.exists() or not list(out.glob("part-*.parquet"))


@settings(max_examples=200, deadline=None)
@given(rows=st.integers(1, 200_000), row_kib=st.floats(0.1, 512.0), factor=st.floats(1.0, 20.0),
       cands=st.floats(1.0, 64.0), limit_mib=st.integers(64, 8192), base_mib=st.integers(50, 400),
       workers=st.one_of(st.none(), st.integers(1, 8)))
def test_grouped_plan_holds_the_floor_or_refuses_naming_a_limit_that_fits(rows, row_kib, factor, cands, limit_mib,
                                                                          base_mib, workers):
    size = GroupedSize(rows, row_kib * 1024, row_kib * 1024 * factor, cands)
    budget = Budget(limit_mib * MiB, base_mib * MiB)
    try:
        parts, w = plan_grouped(size, budget, workers, "the input")
    except MrtInputError as e:
        least = float(str(e).rsplit("at least ", 1)[1].split()[0]) * (2**30 if "GiB" in str(e) else MiB)
        assert least > budget.limit
        # the named limit plans: a part of the floor's rows fits in it
        parts, w = plan_grouped(size, Budget(int(least) + MiB, budget.base), workers, "the input")
        return
    assert 1 <= parts <= rows
    per = math.ceil(rows / parts)
    assert per >= size.floor_rows  # never a part per prompt (unless a prompt is the floor)
    if parts > 1:
        assert size.floor_rows * size.work_row_bytes + SELECT_WORKER <= budget.work
    assert w >= 1


def test_grouped_floor_is_thousands_of_candidates():
    size = GroupedSize(2400, 30_000.0, 60_000.0, 8.0)
    assert size.floor_rows == 512
    # a budget that would have fitted a handful of prompts plans parts of at least the floor, or refuses
    budget = Budget(512 * MiB, 200 * MiB)
    parts, _ = plan_grouped(size, budget, None, "x")
    assert math.ceil(2400 / parts) >= 512


def test_job_limit_sets_the_dense_similarity_budget(tmp_path, monkeypatch):
    """The core is told a dense-block budget derived from the limit, not its fixed 2 GiB."""
    import importlib

    from mrt_fast.datasets.local import select_dataset

    sel = importlib.import_module("mrt_fast.selection.select")
    real, seen = sel.core, []

    class Spy:
        def __getattr__(self, name):
            return getattr(real, name)

        def fl_batch(self, *a, **kw):
            seen.append(kw.get("dense_limit"))
            return real.fl_batch(*a, **kw)

    rng = np.random.default_rng(0)
    n = 400
    pl.DataFrame({"prompt_id": np.zeros(n, dtype=np.int64), "reward": rng.normal(size=n),
                  "embedding": rng.normal(size=(n, 8)).astype(np.float32)}).write_parquet(tmp_path / "f.parquet")
    monkeypatch.setattr(sel, "core", Spy())
    # a GiB above what this process holds already (a long test session holds a lot)
    with open("/proc/self/status") as f:
        rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS"))
    limit = (1 << 30) + rss
    select_dataset(str(tmp_path / "f.parquet"), str(tmp_path / "o.parquet"), 4, "grades", memory_limit=limit)
    assert seen and all(v is not None and v < limit // 2 for v in seen)


_ONE_POOL = r"""
import sys
import numpy as np, polars as pl
from mrt_fast.datasets.local import select_dataset
src, out, limit = sys.argv[1], sys.argv[2], sys.argv[3]
rep = select_dataset(src, out, 4, "diverse", memory_limit=limit)
print("PEAK", rep.peak_rss, "NOTES", rep.notes)
"""


def test_one_large_pool_stays_under_the_limit(tmp_path):
    rng = np.random.default_rng(1)
    n = 9000  # its dense block: 9000^2 float32 = 309 MiB
    pl.DataFrame({"prompt_id": np.zeros(n, dtype=np.int64),
                  "embedding": rng.normal(size=(n, 8)).astype(np.float32)}).write_parquet(tmp_path / "big.parquet")
    r = subprocess.run([sys.executable, "-c", _ONE_POOL, str(tmp_path / "big.parquet"), str(tmp_path / "o.parquet"),
                        "450MB"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "went over the limit" not in r.stdout, r.stdout


def test_hints_for_rows_on_grouped_data_and_selection_without_embeddings(tmp_path):
    from mrt_fast.datasets.local import select_dataset

    src = tmp_path / "g.parquet"
    grouped_table(4, 3, 4).write_parquet(src)
    with pytest.raises(MrtInputError, match="looks grouped.*--layout grouped"):
        select_dataset(src, tmp_path / "o.parquet", 2, "grades", layout="rows")
    grouped_table(4, 3, 4).drop("embedding").write_parquet(src)
    r = CliRunner().invoke(app, ["select", str(src), str(tmp_path / "o2.parquet"), "--k", "2"])
    assert r.exit_code == 2 and "mrt embed" in r.output and "--text responses" in r.output, r.output
