"""Rows grouped by prompt id: the core's grouping of integer ids is polars' order-keeping group-by."""

from __future__ import annotations

import numpy as np
import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from mrt_fast.tables.arrays import group, group_by_polars

INT_TYPES = [pl.Int8, pl.Int16, pl.Int32, pl.Int64, pl.UInt8, pl.UInt16, pl.UInt32, pl.UInt64]


def _same(a, b) -> None:
    assert a.keys.dtype == b.keys.dtype
    assert a.keys.to_list() == b.keys.to_list()
    assert np.array_equal(a.offsets, b.offsets) and a.offsets.dtype == b.offsets.dtype == np.uint64
    assert np.array_equal(a.rows, b.rows) and a.rows.dtype == b.rows.dtype == np.uint64
    assert a.identity == b.identity


@settings(max_examples=120, deadline=None)
@given(st.sampled_from(INT_TYPES), st.lists(st.integers(0, 6), min_size=1, max_size=60),
       st.booleans(), st.integers(0, 2**31), st.sampled_from([0, 100, 2**62]))
def test_integer_ids_group_as_polars_does(dtype, ids, runs, seed, shift):
    """Any integer ids, in runs or shuffled, of any integer type: the same pools, in order of first
    appearance, the same rows in each, the same identity flag as polars' group-by."""
    vals = sorted(ids) if runs else ids
    top = {pl.Int8: 100, pl.UInt8: 200, pl.Int16: 30000, pl.UInt16: 60000, pl.Int32: 2**30, pl.UInt32: 2**31}.get(
        dtype, shift)
    s = pl.Series("p", [v + min(shift, top) for v in vals]).cast(dtype)
    df = pl.DataFrame({"p": s, "x": np.random.default_rng(seed).random(len(s))})
    _same(group(df, "p"), group_by_polars(df, "p"))


def test_unsigned_ids_past_int64_and_negative_ids():
    """uint64 ids beyond the int64 range (polars' group-by keeps them apart), and negative ids."""
    big = pl.Series("p", [2**64 - 1, 2**63, 5, 2**64 - 1, 5], dtype=pl.UInt64)
    _same(group(pl.DataFrame({"p": big}), "p"), group_by_polars(pl.DataFrame({"p": big}), "p"))
    neg = pl.DataFrame({"p": [-3, 7, -3, -(2**63), 7, -(2**63)]})
    g = group(neg, "p")
    assert g.keys.to_list() == [-3, 7, -(2**63)]
    assert g.rows.tolist() == [0, 2, 1, 4, 3, 5] and not g.identity
    _same(g, group_by_polars(neg, "p"))
