"""NumPy to Arrow without a copy and without loading pandas."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mrt_fast.tables.arrays import arrow_of

DTYPES = st.sampled_from([np.int8, np.int32, np.int64, np.uint16, np.uint64, np.float32, np.float64, np.bool_])


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(DTYPES, st.integers(0, 40)), st.integers(1, 3), st.booleans())
def test_arrow_of_holds_the_same_values(a, step, swap):
    """Any 1-d numeric or boolean array, strided or of foreign byte order, converts to the same values."""
    a = a[::step]
    if swap:
        a = a.astype(a.dtype.newbyteorder(">"))
    got = arrow_of(a)
    assert len(got) == len(a)
    back = np.array(got.to_pylist(), dtype=a.dtype.newbyteorder("="))
    assert np.array_equal(back, a, equal_nan=a.dtype.kind == "f")


def test_arrow_of_loads_no_pandas():
    code = ("import sys, numpy as np\nfrom mrt_fast.tables.arrays import arrow_of\n"
            "arrow_of(np.arange(5)); arrow_of(np.ones(3, np.float32)[::2])\nprint('pandas' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "False"


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 30), st.integers(1, 9), st.lists(st.integers(0, 12), min_size=1, max_size=5),
       st.sampled_from(["f16", "f64", "f32"]), st.integers(0, 2**31), st.booleans(), st.integers(-1, 40))
def test_float_vectors_of_any_width_become_the_cast_matrix(n, d, cuts, width, seed, large, null_at):
    """A list column of float16, float32 or float64 vectors, in several chunks (sliced ones too), is
    the (n, d) float32 matrix polars' cast gives, bit for bit (float16 widened by the core, infinities
    and NaNs included); a null vector or value is refused as before, naming its row."""
    import polars as pl
    import pyarrow as pa
    import pytest

    from mrt_fast.errors import MrtInputError
    from mrt_fast.tables.arrays import embeddings

    rng = np.random.default_rng(seed)
    dt = {"f16": np.float16, "f32": np.float32, "f64": np.float64}[width]
    x = (rng.standard_normal((n, d)) * 10.0 ** rng.integers(-3, 4)).astype(dt)
    x.reshape(-1)[rng.integers(0, n * d, 3)] = rng.choice(np.array([np.inf, -np.inf, 0.0, -0.0, np.nan], dtype=dt), 3)
    lists = (pa.LargeListArray if large else pa.ListArray).from_arrays(
        np.arange(0, n * d + 1, d, dtype=np.int64 if large else np.int32), pa.array(x.reshape(-1)))
    bounds = sorted({min(c, n) for c in cuts} | {0, n})
    chunks = [lists.slice(a, b - a) for a, b in zip(bounds, bounds[1:])]
    s = pl.Series("e", pa.chunked_array(chunks, type=lists.type))
    df = pl.DataFrame([s])
    if 0 <= null_at < n:
        df = df.with_columns(pl.when(pl.int_range(pl.len()) == null_at).then(None).otherwise(pl.col("e")).alias("e"))
        with pytest.raises(MrtInputError, match=f"row {null_at}"):
            embeddings(df, "e")
        return
    got = embeddings(df, "e")
    want = df["e"].explode().cast(pl.Float32).to_numpy().reshape(n, d)
    assert got.dtype == np.float32 and got.flags.c_contiguous and got.shape == (n, d)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got.view(np.uint32)[~nan], want.view(np.uint32)[~nan])


def test_float16_widening_refuses_lengths_that_differ():
    import pytest

    from mrt_fast import _grades_core as core
    from mrt_fast.errors import MrtInputError

    with pytest.raises(MrtInputError, match="2 values for 3 places"):
        core.widen_f16(np.zeros(2, np.uint16), np.zeros(3, np.float32))
