"""How many responses per prompt are worth keeping: the variance-budget law.

Streaming per-prompt statistics (:class:`VarianceAccumulator`, ``accumulator``),
the estimators of V_x and V_y|x and the law's K* (``law``), the report
(``report``, built by ``diagnosis`` under :class:`VarianceOptions`,
``options``), bootstrap intervals (``bootstrap``, ``intervals``), the one
:func:`variance_budget` over a table, a path or a Ray Dataset (``budget``),
prompt redundancy (``redundancy``), per-prompt K (Neyman allocation,
``allocate``) and per-prompt n for the next generation round (``plan``).
"""

from __future__ import annotations

from mrt_fast.variance.accumulator import VarianceAccumulator
from mrt_fast.variance.allocate import Allocation, allocate_k, neyman_allocation, shrink_variances
from mrt_fast.variance.bootstrap import EXACT_BOOTSTRAP_DRAWS
from mrt_fast.variance.budget import variance_budget
from mrt_fast.variance.diagnosis import report_from_accumulator
from mrt_fast.variance.intervals import INTERVALS, bootstrap_intervals
from mrt_fast.variance.law import (
    bernstein_bound,
    best_integer_k,
    budget_prompts,
    k2_beats_k1,
    k_star,
    mrt_pays,
    predicted_variance,
    tightening_factor,
)
from mrt_fast.variance.options import DEFAULT_K_GRID, VarianceOptions
from mrt_fast.variance.plan import GenerationPlan, plan_generation
from mrt_fast.variance.redundancy import RedundancyReport, implicit_mrt
from mrt_fast.variance.report import VarianceReport

__all__ = [
    "Allocation",
    "DEFAULT_K_GRID",
    "EXACT_BOOTSTRAP_DRAWS",
    "GenerationPlan",
    "INTERVALS",
    "RedundancyReport",
    "VarianceAccumulator",
    "VarianceOptions",
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
    "tightening_factor",
    "variance_budget",
]
