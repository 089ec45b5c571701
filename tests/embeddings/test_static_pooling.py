"""The static tier's pooling in the core: each text's token vectors summed, normalised, re-centred."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mrt_fast import _grades_core as core
from mrt_fast.errors import MrtInputError


def definition(vectors, ids, starts, center):
    """The NumPy definition, in float64: a segmented sum, unit norm, minus the centre, unit norm."""
    ends = np.append(starts[1:], len(ids))
    out = np.zeros((len(starts), vectors.shape[1]))
    for t, (a, b) in enumerate(zip(starts, ends)):
        out[t] = vectors[ids[a:b]].astype(np.float64).sum(axis=0)

    def unit(v):
        n = np.linalg.norm(v, axis=1, keepdims=True)
        return v / np.where(n == 0, 1.0, n)

    out = unit(out)
    return out if center is None else unit(out - center)


@settings(max_examples=60, deadline=None)
@given(dim=st.integers(1, 16), vocab=st.integers(1, 50), lens=st.lists(st.integers(0, 30), max_size=700),
       seed=st.integers(0, 2**32 - 1), centred=st.booleans())
def test_rows_are_the_normalised_sums(dim, vocab, lens, seed, centred):
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((vocab, dim)).astype(np.float32)
    ids = rng.integers(0, vocab, size=sum(lens)).astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64) if lens else np.zeros(0, np.int64)
    center = (0.1 * rng.standard_normal(dim)).astype(np.float32) if centred else None
    got = core.static_embed(vectors, ids, starts, center).reshape(len(lens), dim)
    np.testing.assert_allclose(got, definition(vectors, ids, starts, center), atol=2e-5)


def test_a_token_outside_the_vocabulary_is_an_input_error():
    v = np.ones((3, 2), np.float32)
    with pytest.raises(MrtInputError, match="token id 7 at position 1 is outside the vocabulary of 3"):
        core.static_embed(v, np.array([0, 7], np.int64), np.array([0], np.int64))
    with pytest.raises(MrtInputError, match="text 0 runs from 0 to 2, outside 0..1"):
        core.static_embed(v, np.array([0], np.int64), np.array([0, 2], np.int64))
    with pytest.raises(MrtInputError, match="center: 3 values"):
        core.static_embed(v, np.array([0], np.int64), np.array([0], np.int64), np.zeros(3, np.float32))
