"""The Ray engine on inputs whose pools lie in consecutive rows: a task per part reads its rows in
place (no exchange), the local engine's parts byte for byte, the in-memory result, and a job either
engine started in place is finished by the other."""

from __future__ import annotations


import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_batch import by_pool, cut, make_rows, read_dir, ref_select
from test_in_place import _same_parts, consecutive

from mrt_fast.datasets import pool_runs
from mrt_fast.datasets.job import StoppedForTest, stopping_after
from mrt_fast.datasets.local import select_dataset
from mrt_fast.datasets.manifest import Manifest, part_path

ray = pytest.importorskip("ray")

from mrt_fast.datasets import ray_engine  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("local_ray")]


@pytest.mark.parametrize("method", ["grades", "stratified", "top"])
def test_parts_read_in_place_are_the_local_engines_byte_for_byte(tmp_path, method):
    df = consecutive(make_rows(70, 3))
    cut(df, tmp_path / "in", 3)
    ref = select_dataset(tmp_path / "in", tmp_path / "local", 3, method, parts=5)
    assert ref.in_place
    rep = ray_engine.select_dataset(tmp_path / "in", tmp_path / "ray", 3, method, parts=5)
    assert rep.in_place and not rep.spilled and rep.n_parts == 5
    assert "5 (pools in consecutive rows, read in place)" in str(rep)
    assert not (tmp_path / "ray" / "_spill").exists()
    _same_parts(tmp_path / "local", tmp_path / "ray", 5)
    m = Manifest.read(tmp_path / "ray")
    assert m.done and m.layout == pool_runs.LAYOUT and m.rows == rep.n_kept == ref.n_kept
    assert m.checks == Manifest.read(tmp_path / "local").checks


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n_pools=st.integers(1, 25), seed=st.integers(0, 10_000), n_files=st.integers(1, 4),
       n_parts=st.integers(1, 6), method=st.sampled_from(["random", "grades", "diverse"]), k=st.integers(1, 4),
       str_ids=st.booleans(), to_file=st.booleans())
def test_read_in_place_on_ray_equals_select_on_the_whole_table(tmp_path_factory, n_pools, seed, n_files, n_parts,
                                                                method, k, str_ids, to_file):
    tmp = tmp_path_factory.mktemp("rayin")
    df = consecutive(make_rows(n_pools, seed, str_ids=str_ids))
    cut(df, tmp / "in", n_files, seed)
    out = tmp / ("kept.parquet" if to_file else "out")
    rep = ray_engine.select_dataset(tmp / "in", out, k, method, parts=n_parts, seed=seed)
    assert rep.in_place
    ref = ref_select(df, k, method, seed=seed)
    if to_file:  # the in-memory order too
        got = pl.read_parquet(out)
        assert got.select(ref.columns).equals(ref)
        assert sorted(p.name for p in tmp.iterdir()) == ["in", "kept.parquet"]  # nothing left beside it
    else:
        got = read_dir(out)
        assert by_pool(got.select(ref.columns)).equals(by_pool(ref))


def test_each_engine_finishes_a_job_the_other_started_in_place(tmp_path):
    df = consecutive(make_rows(90, 5))
    cut(df, tmp_path / "in", 4)
    select_dataset(tmp_path / "in", tmp_path / "full", 3, "grades", parts=6)
    # the local engine stops after two parts; Ray cuts the same parts and does the other four
    with stopping_after(2), pytest.raises(StoppedForTest):
        select_dataset(tmp_path / "in", tmp_path / "a", 3, "grades", parts=6, workers=1)
    rep = ray_engine.select_dataset(tmp_path / "in", tmp_path / "a", 3, "grades")
    assert rep.resumed and rep.in_place and rep.parts_done_now == 4
    _same_parts(tmp_path / "full", tmp_path / "a", 6)
    # Ray stops after two parts; the local engine does the rest
    with stopping_after(2), pytest.raises(StoppedForTest):
        ray_engine.select_dataset(tmp_path / "in", tmp_path / "b", 3, "grades", parts=6)
    m = Manifest.read(tmp_path / "b")
    assert not m.done and m.layout == pool_runs.LAYOUT
    rep = select_dataset(tmp_path / "in", tmp_path / "b", 3, "grades")
    # a part a task wrote as the stop came is found on the rerun (as after a kill)
    assert rep.resumed and rep.in_place and 1 <= rep.parts_done_now <= 6 - len(m.parts)
    _same_parts(tmp_path / "full", tmp_path / "b", 6)


def test_a_job_that_exchanged_keeps_exchanging_and_a_chosen_shuffle_is_kept(tmp_path):
    df = consecutive(make_rows(60, 8))
    cut(df, tmp_path / "in", 2)
    select_dataset(tmp_path / "in", tmp_path / "full", 2, "grades", parts=4)
    # a spilled job's manifest (layout flat) on the same input: its rerun exchanges again
    rep = ray_engine.select_dataset(tmp_path / "in", tmp_path / "sorted", 2, "grades", parts=4, shuffle="sort")
    assert rep.spilled and not rep.in_place
    assert Manifest.read(tmp_path / "sorted").layout == "flat"
    m = Manifest.read(tmp_path / "sorted")
    (tmp_path / "sorted" / "part-00001.parquet").unlink()
    del m.parts["part-00001.parquet"]
    m.done = False
    m.write(tmp_path / "sorted")
    rep = ray_engine.select_dataset(tmp_path / "in", tmp_path / "sorted", 2, "grades")
    assert rep.resumed and rep.spilled and not rep.in_place and rep.parts_done_now == 1
    # the parts of an exchange are buckets, not runs: the kept rows are the same all the same
    assert by_pool(read_dir(tmp_path / "sorted")).equals(by_pool(read_dir(tmp_path / "full")))
    assert part_path(tmp_path / "sorted", 1).exists()


def test_a_shuffled_input_is_exchanged(tmp_path):
    df = make_rows(60, 9)
    cut(df, tmp_path / "in", 2)
    rep = ray_engine.select_dataset(tmp_path / "in", tmp_path / "out", 2, "grades", parts=3)
    assert rep.spilled and not rep.in_place and Manifest.read(tmp_path / "out").layout == "flat"
    assert by_pool(read_dir(tmp_path / "out").select("prompt_id", "pick_rank", "text")).equals(
        by_pool(ref_select(df, 2, "grades").select("prompt_id", "pick_rank", "text")))
