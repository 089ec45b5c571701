"""How many responses per prompt are worth keeping: the variance-budget law's formulas.

The empirical loss over Np prompts with K responses each has variance
``V_x / Np + V_y|x / (Np K)``: ``V_x`` is the spread of the prompts' expected
losses (a floor no K removes) and ``V_y|x`` the average spread of responses
within a prompt. At a cost of C_p a prompt and C_r a response, the K that
minimises the variance a budget buys is ``K* = sqrt((V_y|x / V_x)(C_p / C_r))``.
Here are that optimum and what follows from it, as plain functions of
V_x, V_y|x and the costs; :func:`mrt_fast.variance.variance_budget` estimates
the two variances from losses and applies them.

The names of the whole variance area (the accumulator, the report,
``variance_budget``, ``implicit_mrt``) are also served from this module, so
``from mrt_fast.variance.law import VarianceAccumulator`` keeps working; their
homes are the modules of :mod:`mrt_fast.variance`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from mrt_fast._util.lazy import lazy_names
from mrt_fast.errors import MrtInputError

__all__ = [
    "k_star",
    "best_integer_k",
    "predicted_variance",
    "budget_prompts",
    "bernstein_bound",
    "tightening_factor",
    "mrt_pays",
    "k2_beats_k1",
    "check_costs",
    "saturation",
]


def check_costs(cost_prompt: Any, cost_response: Any) -> tuple[float, float]:
    """C_p and C_r as floats: positive finite numbers."""
    for name, v in (("cost_prompt", cost_prompt), ("cost_response", cost_response)):
        if not isinstance(v, (int, float, np.integer, np.floating)) or not math.isfinite(v) or v <= 0:
            raise MrtInputError(f"{name} must be a positive finite number, got {v!r}")
    return float(cost_prompt), float(cost_response)


def k_star(v_x: float, v_y_given_x: float, cost_prompt: float = 1.0, cost_response: float = 1.0) -> float:
    """Continuous optimum sqrt((V_y|x / V_x)(C_p / C_r)); inf when V_x = 0 < V_y|x,
    0 when V_y|x = 0 < V_x, nan when both are 0 (every K is equally good)."""
    cp, cr = check_costs(cost_prompt, cost_response)
    if v_x < 0 or v_y_given_x < 0:
        raise MrtInputError(f"variances must be >= 0, got V_x={v_x}, V_y|x={v_y_given_x}")
    if v_x == 0:
        return math.inf if v_y_given_x > 0 else math.nan
    return math.sqrt(v_y_given_x / v_x * cp / cr)


def _objective(v_x, v_y, cp, cr, k):
    return (v_x + v_y / k) * (cp + k * cr)


def best_integer_k(
    v_x: float, v_y_given_x: float, cost_prompt: float = 1.0, cost_response: float = 1.0, *, k_max: int = 1024
) -> int:
    """The integer K in [1, k_max] minimising (V_x + V_y|x / K)(C_p + K C_r)
    (ties to the smaller K). The objective is convex in K, so the answer is
    the better of floor(K*) and ceil(K*), clipped; with V_x = 0 it is k_max."""
    if int(k_max) < 1:
        raise MrtInputError(f"k_max must be >= 1, got {k_max}")
    ks = k_star(v_x, v_y_given_x, cost_prompt, cost_response)
    if math.isnan(ks):
        return 1
    if math.isinf(ks):
        return int(k_max)
    lo = min(max(1, math.floor(ks)), k_max)
    hi = min(max(1, math.ceil(ks)), k_max)
    f = lambda k: _objective(v_x, v_y_given_x, cost_prompt, cost_response, k)  # noqa: E731
    return lo if f(lo) <= f(hi) else hi


def mrt_pays(v_x: float, v_y_given_x: float, cost_prompt: float = 1.0, cost_response: float = 1.0) -> bool:
    """Continuous criterion V_y|x / V_x > C_r / C_p (K* > 1)."""
    cp, cr = check_costs(cost_prompt, cost_response)
    return bool(v_y_given_x * cp > v_x * cr)


def k2_beats_k1(v_x: float, v_y_given_x: float, cost_prompt: float = 1.0, cost_response: float = 1.0) -> bool:
    """Integer criterion V(2) < V(1) iff V_y|x / V_x > 2 C_r / C_p (sharp: equal at the boundary)."""
    cp, cr = check_costs(cost_prompt, cost_response)
    return bool(v_y_given_x * cp > 2.0 * v_x * cr)


def predicted_variance(v_x: float, v_y_given_x: float, k: Any, n_prompts: Any) -> np.ndarray:
    """V_x / Np + V_y|x / (Np K), elementwise; inf where Np = 0."""
    k = np.asarray(k, dtype=np.float64)
    n = np.asarray(n_prompts, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = (v_x + v_y_given_x / k) / n
    return np.where(n > 0, out, np.inf)


def budget_prompts(budget: float, k: Any, cost_prompt: float = 1.0, cost_response: float = 1.0) -> np.ndarray:
    """Np = floor(B / (C_p + K C_r))."""
    cp, cr = check_costs(cost_prompt, cost_response)
    if not math.isfinite(budget) or budget <= 0:
        raise MrtInputError(f"budget must be a positive finite number, got {budget!r}")
    k = np.asarray(k, dtype=np.float64)
    # tiny slack so that exact multiples are not lost to rounding
    return np.floor(budget / (cp + k * cr) * (1 + 1e-12)).astype(np.int64)


def bernstein_bound(
    v_x: float, v_y_given_x: float, k: Any, n_prompts: Any, *, delta: float = 0.05, loss_bound: float
) -> np.ndarray:
    """sqrt(2 (V_x + V_y|x/K) log(2/delta) / Np) + 2 B log(2/delta) / (3 Np), for losses in [0, B]."""
    if not 0 < delta < 1:
        raise MrtInputError(f"delta must be in (0, 1), got {delta}")
    if not math.isfinite(loss_bound) or loss_bound < 0:
        raise MrtInputError(f"loss_bound must be a finite number >= 0, got {loss_bound}")
    k = np.asarray(k, dtype=np.float64)
    n = np.asarray(n_prompts, dtype=np.float64)
    lg = math.log(2.0 / delta)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.sqrt(2.0 * (v_x + v_y_given_x / k) * lg / n) + 2.0 * loss_bound * lg / (3.0 * n)
    return np.where(n > 0, out, np.inf)


def tightening_factor(v_x: float, v_y_given_x: float, k: Any) -> np.ndarray:
    """sqrt((V_x + V_y|x) / (V_x + V_y|x / K)): how much K tightens the bound's leading term over K = 1."""
    k = np.asarray(k, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.sqrt((v_x + v_y_given_x) / (v_x + v_y_given_x / k))


def saturation(v_x: float, v_y: float) -> float:
    if v_x == 0:
        return math.inf if v_y > 0 else math.nan
    return math.sqrt(1.0 + v_y / v_x)


#: the names this module serves from the other modules of the area (module -> names)
_ELSEWHERE = {
    "mrt_fast.variance.accumulator": ("VarianceAccumulator",),
    "mrt_fast.variance.inputs": ("loss_column",),
    "mrt_fast.variance.options": ("VarianceOptions", "DEFAULT_K_GRID"),
    "mrt_fast.variance.bootstrap": ("BOOTSTRAP_METHODS", "EXACT_BOOTSTRAP_DRAWS"),
    "mrt_fast.variance.report": ("VarianceReport", "PLOT_FORMATS", "json_num"),
    "mrt_fast.variance.diagnosis": ("report_from_accumulator",),
    "mrt_fast.variance.budget": ("variance_budget",),
    "mrt_fast.variance.redundancy": ("RedundancyReport", "implicit_mrt"),
    "mrt_fast.variance.intervals": ("INTERVALS", "bootstrap_intervals", "expanded_tail"),
}
__getattr__, _ = lazy_names(__name__, {n: m for m, names in _ELSEWHERE.items() for n in names}, globals())
