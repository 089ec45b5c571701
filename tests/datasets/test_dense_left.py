"""The dense block a pool may hold inside a job (`local_plan.dense_left`): what the plan's data leaves,
shared by the core's threads, within `dense_budget` and never below `MIN_DENSE`."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mrt_fast._util.memory import Budget
from mrt_fast.datasets.executors import local_plan as lp

MiB = 1 << 20


@given(limit=st.integers(64 * MiB, 64 << 30), base=st.integers(0, 256 * MiB), data=st.integers(0, 16 << 30),
       buckets=st.integers(1, 1000), workers=st.integers(1, 4))
def test_the_block_is_what_the_data_leaves_within_bounds(limit, base, data, buckets, workers):
    b = Budget(limit, base)
    got = lp.dense_left(b, data, buckets, workers)
    assert lp.MIN_DENSE <= got <= max(lp.MIN_DENSE, lp.dense_budget(b))
    held = lp.WORK_FACTOR * data if buckets == 1 else workers * lp.WORK_FACTOR * lp.SLACK * data / buckets
    if got > lp.MIN_DENSE:  # the data and every thread's block fit the work
        assert held + got * lp.core_threads() <= b.work + lp.core_threads()
    # more data never leaves a larger block
    assert lp.dense_left(b, 2 * data + 1, buckets, workers) <= got
