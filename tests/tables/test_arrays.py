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
