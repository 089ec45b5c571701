"""How many responses per prompt are worth keeping: the variance-budget law.

Streaming per-prompt statistics (:class:`VarianceAccumulator`), the estimators
of V_x and V_y|x, the law's K*, bootstrap intervals, per-prompt K
(Neyman allocation) and per-prompt n for the next generation round.
"""

from __future__ import annotations

from mrt_fast.variance.allocate import Allocation, allocate_k, neyman_allocation, shrink_variances
from mrt_fast.variance.intervals import INTERVALS, bootstrap_intervals
from mrt_fast.variance.plan import GenerationPlan, plan_generation
from mrt_fast.variance.law import (
    EXACT_BOOTSTRAP_DRAWS,
    RedundancyReport,
    VarianceAccumulator,
    VarianceReport,
    bernstein_bound,
    best_integer_k,
    budget_prompts,
    implicit_mrt,
    k2_beats_k1,
    k_star,
    mrt_pays,
    predicted_variance,
    report_from_accumulator,
    variance_budget,
)

__all__ = [
    "Allocation",
    "EXACT_BOOTSTRAP_DRAWS",
    "GenerationPlan",
    "INTERVALS",
    "RedundancyReport",
    "VarianceAccumulator",
    "VarianceReport",
    "allocate_k",
    "bernstein_bound",
    "best_integer_k",
    "bootstrap_intervals",
    "budget_prompts",
    "implicit_mrt",
    "k2_beats_k1",
    "k_star",
    "mrt_pays",
    "neyman_allocation",
    "plan_generation",
    "predicted_variance",
    "report_from_accumulator",
    "shrink_variances",
    "variance_budget",
]
