"""read_ahead: the same items in the same order, an error where it came, and no thread left behind."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mrt_fast._util.read_ahead import read_ahead


class Boom(Exception):
    pass


def source(items, fail_at=None, made=None):
    for i, x in enumerate(items):
        if i == fail_at:
            raise Boom(i)
        if made is not None:
            made.append(x)
        yield x


@settings(max_examples=60, deadline=None)
@given(items=st.lists(st.integers(), max_size=40), depth=st.integers(0, 4))
def test_the_same_items_in_order(items, depth):
    assert list(read_ahead(source(items), depth)) == items


@settings(max_examples=60, deadline=None)
@given(items=st.lists(st.integers(), min_size=1, max_size=30), depth=st.integers(0, 3), data=st.data())
def test_an_error_comes_after_the_items_before_it(items, depth, data):
    fail_at = data.draw(st.integers(0, len(items) - 1))
    got = []
    with pytest.raises(Boom) as e:
        for x in read_ahead(source(items, fail_at), depth):
            got.append(x)
    assert got == items[:fail_at]
    assert e.value.args == (fail_at,)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 50), take=st.integers(0, 50), depth=st.integers(1, 3))
def test_leaving_early_stops_the_thread_within_depth(n, take, depth):
    made: list[int] = []
    before = threading.active_count()
    it = read_ahead(source(range(n), made=made), depth)
    got = []
    for x in it:
        if len(got) == take:
            break
        got.append(x)
    it.close()
    assert got == list(range(min(take, n)))
    # the one in the caller's hand, the ones waiting, the one the thread held when told to stop
    assert len(made) <= min(n, take + 1 + depth + 1)
    assert threading.active_count() == before


def test_the_thread_is_gone_after_an_error_in_the_callers_loop():
    before = threading.active_count()
    with pytest.raises(RuntimeError):
        for x in read_ahead(source(range(100)), 2):
            if x == 3:
                raise RuntimeError("the caller's own error")
    assert threading.active_count() == before
