"""Inputs whose pools lie in consecutive rows: read in place by parts, no spill, the in-memory
result; found only when every pool is one run; resumed as they were started."""

from __future__ import annotations

from unittest import mock

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_batch import _select_in_child, by_pool, cut, make_rows, read_dir, ref_select, text_pools
from typer.testing import CliRunner

from mrt_fast._util.memory import parse_memory
from mrt_fast.cli import app
from mrt_fast.datasets import pool_runs
from mrt_fast.datasets import sources
from mrt_fast.datasets.executors import local as local_executor
from mrt_fast.datasets.job import StoppedForTest, stopping_after
from mrt_fast.datasets.local import select_dataset
from mrt_fast.datasets.manifest import Manifest, part_path
from mrt_fast.datasets.spill import SPILL_DIR

runner = CliRunner()


def consecutive(df: pl.DataFrame) -> pl.DataFrame:
    """The rows with every pool's rows together, pools in the order of their first row, rows in input order."""
    return (df.with_row_index("__i").with_columns(pl.col("__i").min().over("prompt_id").alias("__f"))
            .sort(["__f", "__i"]).drop("__i", "__f"))


def _same_parts(a, b, n: int) -> None:
    """Directories ``a`` and ``b`` hold the same ``n`` parts, byte for byte (a part of no rows: no file in either)."""
    for i in range(n):
        assert part_path(a, i).exists() == part_path(b, i).exists()
        if part_path(a, i).exists():
            assert part_path(a, i).read_bytes() == part_path(b, i).read_bytes()


# --------------------------------------------------------------------------- equal to in memory


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    n_pools=st.integers(1, 30),
    seed=st.integers(0, 10_000),
    n_files=st.integers(1, 5),
    n_parts=st.integers(2, 7),
    method=st.sampled_from(["random", "top", "grades", "diverse", "stratified"]),
    k=st.integers(1, 5),
    str_ids=st.booleans(),
    workers=st.integers(1, 2),
)
def test_read_in_place_equals_select_on_the_whole_table(tmp_path_factory, n_pools, seed, n_files, n_parts, method,
                                                        k, str_ids, workers):
    tmp = tmp_path_factory.mktemp("inplace")
    df = consecutive(make_rows(n_pools, seed, str_ids=str_ids))
    cut(df, tmp / "in", n_files, seed)
    ref = ref_select(df, k, method, seed=seed % 7)
    # a file output: the same rows in the same order
    rep = select_dataset(tmp / "in", tmp / "out.parquet", k, method, seed=seed % 7, parts=n_parts, workers=workers)
    assert rep.in_place and not rep.spilled
    assert pl.read_parquet(tmp / "out.parquet").equals(ref)
    # a dataset output: the same rows per pool in pick order, every pool in one part, nothing spilled
    rep = select_dataset(tmp / "in", tmp / "out", k, method, seed=seed % 7, parts=n_parts, workers=workers)
    assert rep.in_place and rep.n_kept == ref.height
    assert by_pool(read_dir(tmp / "out")).equals(by_pool(ref))
    m = Manifest.read(tmp / "out")
    assert m.done and m.layout == pool_runs.LAYOUT and m.n_parts == n_parts and m.rows == ref.height
    ids = [pl.read_parquet(part_path(tmp / "out", i))["prompt_id"].unique() for i in range(n_parts)
           if part_path(tmp / "out", i).exists()]
    assert sum(len(p) for p in ids) == ref["prompt_id"].n_unique()
    assert not (tmp / "out" / SPILL_DIR).exists()
    assert not list(tmp.glob(".out.parquet.spill-*"))


def test_a_shuffled_input_is_spilled_and_the_summary_says_which(tmp_path):
    df = make_rows(40, 5)
    cut(df, tmp_path / "shuffled", 3)
    cut(consecutive(df), tmp_path / "together", 3)
    assert select_dataset(tmp_path / "shuffled", tmp_path / "a", 2, "grades", parts=4).spilled
    r = runner.invoke(app, ["select", str(tmp_path / "together"), str(tmp_path / "b"), "--k", "2", "--parts", "4"])
    assert r.exit_code == 0, r.output
    assert "4 (pools in consecutive rows, read in place)" in r.output
    assert by_pool(read_dir(tmp_path / "a")).equals(by_pool(read_dir(tmp_path / "b")))


def test_a_memory_limit_reads_in_place_within_it(tmp_path):
    df = consecutive(make_rows(60, 3))
    cut(df, tmp_path / "in", 3)
    ref = ref_select(df, 3, "grades")
    from mrt_fast._util.memory import rss

    # the tiny table made to look too big to select whole
    with mock.patch.object(local_executor, "fits_in_memory", return_value=False):
        rep = select_dataset(tmp_path / "in", tmp_path / "out.parquet", 3, "grades", memory_limit=rss() + (512 << 20))
    assert rep.in_place and rep.parts >= 2
    assert pl.read_parquet(tmp_path / "out.parquet").equals(ref)


def test_read_in_place_holds_the_limit_from_the_least_one_up(tmp_path):
    """Float16 vectors and a text column with every pool's rows together, in files of small row
    groups: from the smallest limit the job accepts up, the peak stays under the limit, the job
    reads in place (from 1.5x that limit at least) and every limit keeps the same rows."""
    n = 300_000
    t = text_pools(seed=5, dim=128, n=n).to_arrow()
    src = tmp_path / "in"
    src.mkdir()
    for i, (a, b) in enumerate([(0, 120_000), (120_000, 200_000), (200_000, n)]):
        pq.write_table(t.slice(a, b - a), src / f"f{i}.parquet", row_group_size=8192)
    rc, err, _ = _select_in_child(src, tmp_path / "refused", "64MiB")
    assert rc == 2 and "use a limit of at least" in err, err
    least = parse_memory(err.strip().splitlines()[-1].rsplit("at least ", 1)[1].replace(" ", ""))
    kept, layouts = None, []
    for i, f in enumerate([1.0, 1.2, 1.5, 2.0, 3.0]):
        limit = int(least * f)
        rc, err, peak = _select_in_child(src, tmp_path / f"o{i}", str(limit))
        assert rc == 0, err
        assert peak <= limit, (f, limit, peak)
        layouts.append(Manifest.read(tmp_path / f"o{i}").layout)
        got = read_dir(tmp_path / f"o{i}").sort("prompt_id", "pick_rank")
        assert kept is None or got.equals(kept), f
        kept = got
    assert layouts[2:] == [pool_runs.LAYOUT] * 3, layouts


def test_a_large_input_of_consecutive_pools_is_read_in_place_even_where_it_fits(tmp_path, monkeypatch):
    df = consecutive(make_rows(60, 4))
    cut(df, tmp_path / "in", 3)
    ref = ref_select(df, 3, "grades")
    rep = select_dataset(tmp_path / "in", tmp_path / "small.parquet", 3, "grades")  # small: read whole
    assert not rep.in_place and not rep.spilled and rep.parts == 1
    monkeypatch.setattr(local_executor, "IN_PLACE_MIN_BYTES", 0)  # every input "large"
    rep = select_dataset(tmp_path / "in", tmp_path / "large.parquet", 3, "grades")
    assert rep.in_place and not rep.spilled and rep.parts >= 2
    assert pl.read_parquet(tmp_path / "large.parquet").equals(ref)
    rep = select_dataset(tmp_path / "in", tmp_path / "large", 3, "grades")
    assert rep.in_place and Manifest.read(tmp_path / "large").layout == pool_runs.LAYOUT
    assert by_pool(read_dir(tmp_path / "large")).equals(by_pool(ref))
    # shuffled rows of any size that fit are read whole
    cut(make_rows(60, 4), tmp_path / "shuffled", 3)
    rep = select_dataset(tmp_path / "shuffled", tmp_path / "s.parquet", 3, "grades")
    assert not rep.in_place and not rep.spilled and rep.parts == 1


# --------------------------------------------------------------------------- finding runs


def _write_ids(path, ids: list, row_group: int) -> None:
    pq.write_table(pa.table({"prompt_id": pa.array(ids, pa.int64()), "x": pa.array(range(len(ids)))}), path,
                   row_group_size=row_group)


def _reference_runs(ids: list) -> np.ndarray | None:
    starts = [i for i in range(len(ids)) if i == 0 or ids[i] != ids[i - 1]]
    if len({ids[i] for i in starts}) != len(starts):
        return None
    return np.array([*starts, len(ids)])


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    runs=st.lists(st.tuples(st.integers(0, 6), st.integers(1, 5)), min_size=1, max_size=14),
    n_files=st.integers(1, 3),
    row_group=st.integers(1, 7),
    batch=st.integers(1, 6),
)
def test_consecutive_pools_finds_the_runs_of_every_pool_or_none(tmp_path_factory, runs, n_files, row_group, batch):
    tmp = tmp_path_factory.mktemp("runs")
    ids = [v for v, n in runs for _ in range(n)]
    cuts = np.linspace(0, len(ids), n_files + 1).astype(int)
    for i in range(n_files):
        _write_ids(tmp / f"f{i}.parquet", ids[cuts[i]:cuts[i + 1]], row_group)
    ds = sources.discover(str(tmp))
    with mock.patch.object(pool_runs, "ID_BATCH_ROWS", batch):
        got = pool_runs.consecutive_pools(ds, "prompt_id", 10_000)
    want = _reference_runs(ids)
    if want is None:
        assert got is None
    else:
        assert got is not None and got.tolist() == want.tolist()
        # too many runs to hold: none
        with mock.patch.object(pool_runs, "ID_BATCH_ROWS", batch):
            assert pool_runs.consecutive_pools(ds, "prompt_id", len(want) - 2) is None


def test_null_ids_text_inputs_and_unreadable_columns_are_not_read_in_place(tmp_path):
    pq.write_table(pa.table({"prompt_id": pa.array([1, 1, None, 2], pa.int64())}), tmp_path / "n.parquet")
    assert pool_runs.consecutive_pools(sources.discover(str(tmp_path / "n.parquet")), "prompt_id", 100) is None
    pl.DataFrame({"prompt_id": [1, 1, 2]}).write_ndjson(tmp_path / "t.jsonl")
    assert pool_runs.consecutive_pools(sources.discover(str(tmp_path / "t.jsonl")), "prompt_id", 100) is None
    pq.write_table(pa.table({"prompt_id": pa.array([1, 1, 2], pa.int64())}), tmp_path / "ok.parquet")
    ds = sources.discover(str(tmp_path / "ok.parquet"))
    assert pool_runs.consecutive_pools(ds, "prompt_id", 100).tolist() == [0, 2, 3]
    assert pool_runs.consecutive_pools(ds, "no_such_column", 100) is None


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(1, 50), min_size=1, max_size=40), n_parts=st.integers(1, 60))
def test_cut_runs_cuts_only_between_runs_into_parts_of_about_equal_rows(sizes, n_parts):
    bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    cuts = pool_runs.cut_runs(bounds, n_parts)
    n = int(bounds[-1])
    assert len(cuts) == n_parts + 1 and cuts[0] == 0 and cuts[-1] == n
    assert (np.diff(cuts) >= 0).all()
    assert set(cuts.tolist()) <= set(bounds.tolist())  # every cut is a run start (or the end)
    # each cut is the first run start at or after its share of the rows
    for i in range(1, n_parts):
        target = int(i * n / n_parts)
        assert cuts[i] == bounds[np.searchsorted(bounds, target)]
    assert (pool_runs.cut_runs(bounds, n_parts) == cuts).all()


# --------------------------------------------------------------------------- resume


def test_a_stopped_job_read_in_place_resumes_to_the_same_parts(tmp_path):
    df = consecutive(make_rows(80, 11))
    cut(df, tmp_path / "in", 4)
    select_dataset(tmp_path / "in", tmp_path / "full", 3, "grades", parts=6)
    with stopping_after(2), pytest.raises(StoppedForTest):  # one worker: no part written as the stop comes
        select_dataset(tmp_path / "in", tmp_path / "part", 3, "grades", parts=6, workers=1)
    m = Manifest.read(tmp_path / "part")
    assert not m.done and len(m.parts) == 2 and m.layout == pool_runs.LAYOUT
    rep = select_dataset(tmp_path / "in", tmp_path / "part", 3, "grades")
    assert rep.resumed and rep.in_place and rep.parts_done_now == 4
    _same_parts(tmp_path / "full", tmp_path / "part", 6)


def test_a_job_that_spilled_resumes_spilled(tmp_path):
    df = consecutive(make_rows(80, 12))
    cut(df, tmp_path / "in", 3)
    with mock.patch.object(local_executor, "plan_consecutive", return_value=None):
        select_dataset(tmp_path / "in", tmp_path / "full", 3, "grades", parts=5)
        with stopping_after(2), pytest.raises(StoppedForTest):
            select_dataset(tmp_path / "in", tmp_path / "part", 3, "grades", parts=5)
    assert Manifest.read(tmp_path / "part").layout == "flat"
    rep = select_dataset(tmp_path / "in", tmp_path / "part", 3, "grades")
    assert rep.resumed and rep.spilled and not rep.in_place
    _same_parts(tmp_path / "full", tmp_path / "part", 5)
