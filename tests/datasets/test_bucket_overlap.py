"""A lone selecting worker's buckets overlapped (`local_overlap.run_overlapped`): every step of every
bucket in order, the next bucket's bytes read while this one is selected, the last one's rows written
while this one is decoded, a buffer slot read into again only once the rows of the bucket it held are
written; a failure raised where it came, with nothing of a later bucket decoded, selected or written.
And a job run that way: the in-memory result, resumable after a stop."""

from __future__ import annotations

import random
import threading
import time

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mrt_fast.datasets.executors import local as local_exec
from mrt_fast.datasets.executors.local_overlap import run_overlapped
from mrt_fast.datasets.job import StoppedForTest, stopping_after
from mrt_fast.datasets.local import select_dataset
from mrt_fast.datasets.manifest import Manifest, part_path

from test_batch import by_pool, cut, make_rows, read_dir, ref_select


class Boom(Exception):
    pass


STEPS = ("read", "decode", "select", "write")


def run_logged(n: int, empty: set[int], fail: tuple[str, int] | None, seed: int):
    """run_overlapped over buckets 0..n-1 (``empty``: select gives None), steps sleeping at random, one
    step failing if asked; returns the log of (step, bucket, 'start'|'end', slot) and the error."""
    rng = random.Random(seed)
    lock = threading.Lock()
    log: list[tuple] = []
    slots = [None, None]  # what each buffer slot holds now: the bucket read into it

    def step(name, i, slot=None):
        with lock:
            log.append((name, i, "start", slot))
            delay = rng.random() * 0.002
        time.sleep(delay)
        if fail == (name, i):
            raise Boom(name, i)
        with lock:
            log.append((name, i, "end", slot))

    def read(i, slot):
        step("read", i, slot)
        slots[slot] = i
        return ("raw", i, slot)

    def decode(i, raw, slot):
        assert raw == ("raw", i, slot) and slots[slot] == i  # its slot still holds its bytes
        step("decode", i, slot)
        return ("df", i, slot)

    def select(i, df):
        assert df[:2] == ("df", i)
        step("select", i)
        return None if i in empty else ("kept", i, df[2])

    def write(i, kept):
        assert kept[:2] == ("kept", i) and slots[kept[2]] == i  # the slot its rows may share is untouched
        step("write", i, kept[2])

    before = threading.active_count()
    err = None
    try:
        run_overlapped(list(range(n)), read, decode, select, write)
    except Boom as e:
        err = e
    assert threading.active_count() == before  # no helper thread left behind
    return log, err


def at(log, step, i, what):
    return next((k for k, e in enumerate(log) if e[:3] == (step, i, what)), None)


@settings(max_examples=120, deadline=None)
@given(n=st.integers(0, 9), data=st.data(), seed=st.integers(0, 10**6))
def test_every_step_in_order_and_a_slot_reused_only_once_written(n, data, seed):
    empty = set(data.draw(st.lists(st.integers(0, max(0, n - 1)), max_size=3))) if n else set()
    log, err = run_logged(n, empty, None, seed)
    assert err is None
    for i in range(n):
        ends = [at(log, s, i, "end") for s in STEPS[:3]]
        assert None not in ends and ends == sorted(ends)  # read, decode, select: each once, in turn
        assert log[at(log, "read", i, "start")][3] == i % 2  # slots in turn
        w = at(log, "write", i, "end")
        assert (w is None) == (i in empty)
        if w is not None:
            assert w > ends[2]
            # the slot of bucket i is read into again (bucket i + 2) only once its rows are written
            nxt = at(log, "read", i + 2, "start")
            assert nxt is None or nxt > w
        if i:  # nothing of bucket i decoded before bucket i - 1 is selected
            assert at(log, "decode", i, "start") > at(log, "select", i - 1, "end")
    writes = [e[1] for e in log if e[0] == "write" and e[2] == "start"]
    assert writes == [i for i in range(n) if i not in empty]
    # one write at a time
    running = 0
    for e in log:
        if e[0] == "write":
            running += 1 if e[2] == "start" else -1
            assert running <= 1


@settings(max_examples=120, deadline=None)
@given(n=st.integers(1, 8), data=st.data(), seed=st.integers(0, 10**6))
def test_a_failure_is_raised_and_stops_the_later_buckets(n, data, seed):
    f = data.draw(st.integers(0, n - 1))
    step = data.draw(st.sampled_from(STEPS))
    log, err = run_logged(n, set(), (step, f), seed)
    assert isinstance(err, Boom) and err.args == (step, f)
    # nothing of a later bucket is selected or written, at most the next one's bytes read (and decoded,
    # where the failure was the write, which is waited for after the next decode)
    later = ("select", "write") if step == "write" else ("decode", "select", "write")
    assert not any(e[1] > f for e in log if e[0] in later)
    assert not any(e[1] > f + 1 for e in log if e[0] in ("read", "decode"))
    # every bucket before the failing one is selected and written (a write in flight is waited for)
    selected = {e[1] for e in log if e[0] == "select" and e[2] == "end"}
    written = {e[1] for e in log if e[0] == "write" and e[2] == "end"}
    assert selected == set(range(f + (step == "write")))
    assert written == set(range(f))


@pytest.fixture
def overlapped(monkeypatch):
    """Spilled jobs select with one worker, overlapped; returns the calls to run_overlapped."""
    calls = []

    def spy(todo, *a):
        calls.append(list(todo))
        return run_overlapped(todo, *a)

    monkeypatch.setattr(local_exec, "bucket_workers", lambda d, todo, limit, w: (1, 1))
    monkeypatch.setattr(local_exec, "overlap_fits", lambda d, todo, limit: True)
    monkeypatch.setattr(local_exec, "run_overlapped", spy)
    return calls


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n_pools=st.integers(2, 30), seed=st.integers(0, 1000), n_parts=st.integers(2, 7),
       method=st.sampled_from(["random", "top", "grades", "diverse", "stratified"]), str_ids=st.booleans())
def test_an_overlapped_job_equals_select_on_the_whole_table(tmp_path_factory, overlapped, n_pools, seed, n_parts,
                                                            method, str_ids):
    tmp = tmp_path_factory.mktemp("ov")
    df = make_rows(n_pools, seed, str_ids=str_ids, dim=8)
    cut(df, tmp / "in", 3, seed)
    ref = ref_select(df, 3, method, seed=seed % 5)
    overlapped.clear()
    select_dataset(tmp / "in", tmp / "out.parquet", 3, method, seed=seed % 5, parts=n_parts, workers=1)
    assert pl.read_parquet(tmp / "out.parquet").equals(ref)
    select_dataset(tmp / "in", tmp / "out", 3, method, seed=seed % 5, parts=n_parts, workers=1)
    assert by_pool(read_dir(tmp / "out")).equals(by_pool(ref))
    assert overlapped == [list(range(n_parts))] * 2  # both ran overlapped, every bucket


def test_an_overlapped_job_stopped_resumes_to_the_same_parts(tmp_path, overlapped):
    df = make_rows(80, 11)
    cut(df, tmp_path / "in", 4)
    select_dataset(tmp_path / "in", tmp_path / "full", 3, "grades", parts=6, workers=1)
    with stopping_after(2), pytest.raises(StoppedForTest):
        select_dataset(tmp_path / "in", tmp_path / "part", 3, "grades", parts=6, workers=1)
    m = Manifest.read(tmp_path / "part")
    assert not m.done and len(m.parts) == 2
    rep = select_dataset(tmp_path / "in", tmp_path / "part", 3, "grades", parts=6, workers=1)
    assert rep.resumed and rep.parts_done_now == 4
    for i in range(6):
        p, q = part_path(tmp_path / "part", i), part_path(tmp_path / "full", i)
        assert p.exists() == q.exists()
        if p.exists():
            assert p.read_bytes() == q.read_bytes()
    assert len(overlapped) == 3
