"""Variance-component estimates used by the simulations.

`decompose` is the single place the simulations estimate V_x and V_y|x; it is
the library's own bias-corrected estimator (the Rust core's
`variance_summary`: per prompt mean g_i and unbiased variance s_i^2;
V_y|x = mean s_i^2, V_x = max(0, var(g_i) - mean(s_i^2 / K_i))). `_decompose`
is an independent NumPy transcription of the same formula, kept for the tests.
"""

from __future__ import annotations


import numpy as np


def _decompose(losses: np.ndarray) -> dict[str, float]:
    """V_x and V_y|x from a [prompts, responses] matrix of losses (NaN = missing)."""
    a = np.asarray(losses, dtype=np.float64)
    if a.ndim != 2:
        raise ValueError(f"losses must be a 2-D [prompts, responses] matrix, got shape {a.shape}")
    k = np.sum(~np.isnan(a), axis=1)
    if a.shape[0] < 2:
        raise ValueError(f"need at least 2 prompts, got {a.shape[0]}")
    if np.any(k < 2):
        raise ValueError(f"every prompt needs at least 2 responses; prompt {int(np.argmax(k < 2))} has {int(k.min())}")
    if np.any(np.isinf(a)):
        raise ValueError("losses contain inf")
    g = np.nanmean(a, axis=1)
    s2 = np.nanvar(a, axis=1, ddof=1)
    v_y = float(np.mean(s2))
    v_x = float(max(0.0, np.var(g, ddof=1) - np.mean(s2 / k)))
    return {"v_x": v_x, "v_y_given_x": v_y, "n_prompts": int(a.shape[0]), "mean_k": float(k.mean())}


def decompose(losses: np.ndarray) -> dict[str, float]:
    """Estimate V_x and V_y|x with the library estimator (see module doc)."""
    from mrt_fast import _grades_core as core

    _decompose(losses)  # the same input checks and messages
    a = np.asarray(losses, dtype=np.float64)
    ok = ~np.isnan(a)
    k = ok.sum(axis=1)
    mean = np.nanmean(a, axis=1)
    m2 = np.nansum((a - mean[:, None]) ** 2, axis=1)
    s = core.variance_summary(k.astype(np.uint64), mean, m2)
    return {"v_x": float(s["v_x"]), "v_y_given_x": float(s["v_y_given_x"]), "n_prompts": int(s["n_prompts"]),
            "mean_k": float(k.mean())}


def k_star(v_x: float, v_y: float, c_p: float, c_r: float) -> float:
    """Continuous cost-aware optimum sqrt((V_y|x / V_x) (C_p / C_r)); inf when V_x = 0."""
    from mrt_fast.variance.law import k_star as _k_star

    return _k_star(v_x, v_y, c_p, c_r)
