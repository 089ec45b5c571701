"""How many spilled buckets are selected and read at once (`local_plan.bucket_workers`): the selecting
workers and one bucket read ahead, counted as a worker and a reserve, fit the work left; a bucket is read ahead
wherever the workers are fewer than the cores and one more and the memory holds another worker; a
bucket that alone does not fit is refused. A lone worker overlaps its steps only with room for the
next bucket besides its own (`local_plan.overlap_fits`)."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mrt_fast._util.memory import Budget
from mrt_fast.datasets.executors import local_plan as lp
from mrt_fast.errors import MrtInputError

MiB = 1 << 20


def spilled(tmp, sizes: list[int]) -> list[int]:
    """A spill folder whose bucket ``i`` is one file of ``sizes[i]`` bytes (sparse); returns the buckets."""
    tmp.mkdir(parents=True, exist_ok=True)
    for f in tmp.glob("bucket-*"):
        f.unlink()
    for i, n in enumerate(sizes):
        with open(tmp / f"bucket-{i:05d}.0.arrow", "wb") as f:
            f.truncate(n)
    return list(range(len(sizes)))


@settings(max_examples=150, deadline=None)
@given(sizes=st.lists(st.integers(0, 64 * MiB), min_size=1, max_size=6), work=st.integers(1 * MiB, 1 << 30),
       workers=st.integers(1, 6))
def test_workers_and_the_bucket_read_ahead_fit_the_work(tmp_path_factory, sizes, work, workers):
    base = 100 * MiB
    b = Budget(0, base).with_work(work)
    d = tmp_path_factory.mktemp("spill")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(lp.Budget, "now", classmethod(lambda cls, limit: Budget(limit, base)))
        check(d, sizes, b, workers)


def check(d, sizes: list[int], b: Budget, workers: int) -> None:
    todo = spilled(d, sizes)
    largest = max(sizes)
    need = lp.WORK_FACTOR * largest + lp.SELECT_WORKER
    if need > b.work:
        with pytest.raises(MrtInputError, match="never split"):
            lp.bucket_workers(d, todo, b.limit, workers)
        return
    w, readers = lp.bucket_workers(d, todo, b.limit, workers)
    assert 1 <= w <= workers
    assert w * need <= b.work
    assert w == workers or (w + 1) * need > b.work  # the most that fit
    assert readers in (w, w + 1)
    assert readers * need <= b.work
    if readers > w:  # with room to spare for what the selection touches that the plan does not size
        assert readers * need + lp.AHEAD_RESERVE <= b.work
    cpus = os.cpu_count() or 1
    could = w < cpus + (cpus > 1) and len(todo) > w and (w + 1) * need + lp.AHEAD_RESERVE <= b.work
    assert (readers == w + 1) == could
    if w < workers:  # memory cut the workers: no room to read ahead
        assert readers == w


def test_a_bucket_is_read_ahead_only_with_room_for_another_worker(tmp_path, monkeypatch):
    base = 100 * MiB
    monkeypatch.setattr(lp.Budget, "now", classmethod(lambda cls, limit: Budget(limit, base)))
    todo = spilled(tmp_path, [8 * MiB] * 10)
    need = lp.WORK_FACTOR * 8 * MiB + lp.SELECT_WORKER
    two = Budget(0, base).with_work(int(2 * need + lp.AHEAD_RESERVE))
    # one worker asked for (`--parts`), room for two: the second reads ahead
    assert lp.bucket_workers(tmp_path, todo, two.limit, 1) == (1, 2)
    # room for two workers but not the reserve besides: none reads ahead
    assert lp.bucket_workers(tmp_path, todo, Budget(0, base).with_work(int(2 * need)).limit, 1) == (1, 1)
    # three asked for, room for one and a half: one selects, none reads ahead
    tight = Budget(0, base).with_work(int(1.5 * need))
    assert lp.bucket_workers(tmp_path, todo, tight.limit, 3) == (1, 1)
    # a single bucket left: nothing to read ahead
    assert lp.bucket_workers(tmp_path, todo[:1], two.limit, 1) == (1, 1)


@settings(max_examples=150, deadline=None)
@given(sizes=st.lists(st.integers(0, 64 * MiB), min_size=1, max_size=6), work=st.integers(1 * MiB, 1 << 30))
def test_a_lone_worker_overlaps_only_with_room_for_the_next_bucket(tmp_path_factory, sizes, work):
    base = 100 * MiB
    b = Budget(0, base).with_work(work)
    d = tmp_path_factory.mktemp("spill")
    todo = spilled(d, sizes)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(lp.Budget, "now", classmethod(lambda cls, limit: Budget(limit, base)))
        fits = lp.overlap_fits(d, todo, b.limit)
    room = (lp.WORK_FACTOR + lp.OVERLAP_FACTOR) * max(sizes) + lp.SELECT_WORKER <= b.work
    assert fits == (len(sizes) > 1 and room)
