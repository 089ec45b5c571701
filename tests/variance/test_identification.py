"""A pilot that cannot bound V_y|x / V_x says so: it never hands out an infinite K* as advice."""

from __future__ import annotations

import json
import math

import numpy as np
import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from mrt_fast.variance import variance_budget


def _pilot(p: int, k: int, v_x: float, v_y: float, seed: int) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    mu = rng.normal(0.0, math.sqrt(v_x), p)
    loss = (mu[:, None] + rng.normal(0.0, math.sqrt(v_y), (p, k))).ravel()
    return pl.DataFrame({"prompt_id": np.repeat(np.arange(p), k), "loss": loss})


def test_negative_v_x_is_not_identified():
    df = pl.DataFrame({"prompt_id": [1, 1, 2, 2, 3, 3], "loss": [0.0, 2.0, 2.0, 0.0, 1.0, 1.0]})
    r = variance_budget(df, cost_prompt=2, cost_response=1, n_boot=50, k_max=64)
    assert r.v_x_raw < 0 and not r.identified
    assert "not identified" in r.identification and "prompts" in r.identification
    assert r.notes[0] == r.identification
    assert "NOT identified" in repr(r)
    # every resample puts V_x at 0 here, so only the cap is supported, and the report says so
    assert r.k_at_least == max(1, math.ceil(r.ci["k_best"][0]))
    d = json.loads(json.dumps(r.to_dict()))
    assert d["identified"] is False and d["k_at_least"] == r.k_at_least


def test_unbounded_ratio_interval_is_not_identified():
    # a small prompt floor, few prompts: V_x > 0 but its interval reaches 0
    df = _pilot(12, 4, 0.02, 1.0, seed=3)
    r = variance_budget(df, n_boot=400, seed=0)
    if r.v_x > 0:
        assert math.isinf(r.ci["ratio"][1])
    assert not r.identified
    assert "unbounded" in r.identification or "<= 0" in r.identification


def test_clear_prompt_floor_is_identified():
    r = variance_budget(_pilot(200, 4, 1.0, 1.0, seed=1), cost_prompt=4, n_boot=300)
    assert r.identified and r.identification is None
    assert math.isfinite(r.ci["ratio"][1])
    assert r.k_at_least <= r.k_best
    assert "NOT identified" not in repr(r)


@settings(max_examples=25, deadline=None)
@given(st.integers(4, 60), st.integers(2, 6), st.floats(0.0, 2.0), st.floats(0.05, 2.0), st.integers(0, 10**6))
def test_identified_means_a_finite_ratio_interval(p, k, v_x, v_y, seed):
    r = variance_budget(_pilot(p, k, v_x, v_y, seed), n_boot=100, seed=seed)
    bounded = r.v_x > 0 and math.isfinite(r.ci["ratio"][1])
    assert r.identified == bounded
    assert 1 <= r.k_at_least <= max(r.k_best, 1)
    if not r.identified:
        assert r.notes[0].startswith("ratio not identified")
