"""The variance report of an accumulator's statistics: estimates, K*, the budget table, intervals.

:func:`report_from_accumulator` turns the per-prompt statistics of a
:class:`~mrt_fast.variance.accumulator.VarianceAccumulator` into a
:class:`~mrt_fast.variance.report.VarianceReport` under a
:class:`~mrt_fast.variance.options.VarianceOptions`; every path of
``variance_budget`` (a table, a streamed file, Ray) ends here.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import polars as pl

from mrt_fast.variance.bootstrap import EXACT_BOOTSTRAP_DRAWS, accumulator_intervals
from mrt_fast.variance.intervals import with_point
from mrt_fast.variance.law import (
    bernstein_bound,
    best_integer_k,
    budget_prompts,
    k2_beats_k1,
    k_star,
    mrt_pays,
    predicted_variance,
    saturation,
    tightening_factor,
)
from mrt_fast.variance.options import VarianceOptions
from mrt_fast.variance.report import VarianceReport

#: ``acc`` below is a :class:`~mrt_fast.variance.accumulator.VarianceAccumulator` (not imported: the
#: accumulator imports this module for its ``report``)
def report_from_accumulator(acc: Any, options: VarianceOptions | None = None,
                            **keywords: Any) -> VarianceReport:
    """The diagnosis from per-prompt statistics: ``options`` (a `VarianceOptions`) or its keywords
    (those of `variance_budget`: costs, k_grid, k_max, budget, n_prompts, delta, loss_bound,
    n_boot, seed, ci_level, bootstrap, interval)."""
    return diagnose(acc, VarianceOptions.of(options, **keywords))


def diagnose(acc: Any, options: VarianceOptions) -> VarianceReport:
    """`report_from_accumulator` with options already checked."""
    o = options
    cp, cr, k_max = o.cost_prompt, o.cost_response, o.k_max
    grid = np.asarray(o.k_grid, dtype=np.int64)
    budget, n_prompts, delta, loss_bound = o.budget, o.n_prompts, o.delta, o.loss_bound
    n_boot, seed, ci_level, bootstrap, interval = o.n_boot, o.seed, o.ci_level, o.bootstrap, o.interval

    s = acc.summary()
    vx, vy = float(s["v_x"]), float(s["v_y_given_x"])
    notes: list[str] = []
    if s["n_single_response_prompts"]:
        notes.append(
            f"{s['n_single_response_prompts']} prompt(s) with a single response carry no within-prompt "
            "information and were left out of V_x and V_y|x"
        )
    if vx == 0 and vy > 0:
        ratio = math.inf
        notes.append(
            f"V_x estimate is 0 (raw {s['v_x_raw']:.4g}: the spread of prompt means is within the response noise), "
            f"so K* is infinite and k_best is the cap k_max = {k_max}; measure more prompts to resolve the prompt floor"
        )
    elif vx == 0:
        ratio = math.nan
        notes.append("every loss is the same: V_x = V_y|x = 0, every K is equally good; k_best = 1")
    else:
        ratio = vy / vx
    ks = k_star(vx, vy, cp, cr)
    kb = best_integer_k(vx, vy, cp, cr, k_max=k_max)
    if math.isfinite(ks) and ks > k_max:
        notes.append(f"K* = {ks:.4g} is above k_max = {k_max}; k_best is capped")

    n_ref = int(n_prompts) if n_prompts is not None else int(s["n_prompts"])
    cols: dict[str, Any] = {"k": grid}
    kf = grid.astype(np.float64)
    cols["var_per_prompt"] = vx + vy / kf
    cols["n_prompts"] = np.full(len(grid), n_ref, dtype=np.int64)
    cols["predicted_variance"] = predicted_variance(vx, vy, kf, n_ref)
    cols["tightening_factor"] = tightening_factor(vx, vy, kf)
    if loss_bound is not None:
        cols["bernstein_bound"] = bernstein_bound(vx, vy, kf, n_ref, delta=delta, loss_bound=loss_bound)
    if budget is not None:
        npb = budget_prompts(budget, kf, cp, cr)
        cols["budget_n_prompts"] = npb
        cols["budget_variance"] = predicted_variance(vx, vy, kf, npb)
        if loss_bound is not None:
            cols["budget_bernstein_bound"] = bernstein_bound(vx, vy, kf, npb, delta=delta, loss_bound=loss_bound)
        if np.any(npb == 0):
            notes.append(f"the budget {budget:g} buys no prompt at K >= {int(grid[npb == 0][0])}")
    else:
        notes.append("no budget given: predicted variance is at the observed number of prompts")
    if loss_bound is None:
        notes.append("no loss_bound given: Bernstein bounds omitted")

    ci: dict[str, tuple[float, float]] = {}
    method = used = "none"
    if n_boot > 0:
        p_used = int(s["n_used_prompts"])
        ci, frac0, method, used = accumulator_intervals(
            acc._core,
            p_used,
            float(s["grand_mean"]),
            n_boot=int(n_boot),
            seed=int(seed),
            cp=cp,
            cr=cr,
            k_max=k_max,
            level=ci_level,
            method=bootstrap,
            interval=interval,
        )
        # the report's own figures (the core's sums) may differ from the resampling's in the last bit
        reported = {"v_x": vx, "v_y_given_x": vy, "ratio": ratio, "k_star": ks, "k_best": float(kb)}
        ci = {name: with_point(iv, reported[name]) if name in reported else iv for name, iv in ci.items()}
        if method == "normal":
            why = (
                f"{p_used} prompts x {n_boot} resamples is above {EXACT_BOOTSTRAP_DRAWS:.0e} draws"
                if bootstrap == "auto"
                else "as asked"
            )
            notes.append(
                f"intervals from the normal approximation of the bootstrap ({why}; bootstrap='exact' resamples the prompts)"
            )
        if interval not in ("auto", used):
            notes.append(f"interval={interval!r} needs the prompts resampled and at least 4 of them with "
                         f"V_y|x > 0: {used} intervals instead")
        if frac0 > 0:
            notes.append(f"V_x was 0 in {frac0:.1%} of bootstrap resamples (K* infinite there)")
    identified, identification = _identification(s, vx, vy, ci, ci_level)
    k_at_least = kb
    if "k_best" in ci and math.isfinite(ci["k_best"][0]):
        k_at_least = int(min(kb, max(1, math.ceil(ci["k_best"][0]))))
    elif not identified:
        k_at_least = 1
    if not identified:
        notes.insert(0, identification)

    return VarianceReport(
        n_rows=int(s["n_rows"]),
        n_prompts=int(s["n_prompts"]),
        n_single_response_prompts=int(s["n_single_response_prompts"]),
        n_used_prompts=int(s["n_used_prompts"]),
        mean_k=float(s["mean_k"]),
        v_x=vx,
        v_x_raw=float(s["v_x_raw"]),
        v_y_given_x=vy,
        var_of_means=float(s["var_of_means"]),
        ratio=ratio,
        cost_prompt=cp,
        cost_response=cr,
        k_star=ks,
        k_best=kb,
        k_max=k_max,
        mrt_pays=mrt_pays(vx, vy, cp, cr),
        k2_beats_k1=k2_beats_k1(vx, vy, cp, cr),
        tightening_saturation=saturation(vx, vy),
        delta=float(delta),
        loss_bound=None if loss_bound is None else float(loss_bound),
        budget=None if budget is None else float(budget),
        ci_level=float(ci_level),
        n_boot=int(n_boot),
        seed=int(seed),
        bootstrap=method,
        interval=used,
        pilot_k_max=int(np.max(acc._core.per_prompt()["count"])) if len(acc) else None,
        ci=ci,
        predicted=pl.DataFrame(cols),
        notes=notes,
        identified=identified,
        identification=identification,
        k_at_least=k_at_least,
    )


def _identification(s: dict, vx: float, vy: float, ci: dict, level: float) -> tuple[bool, str | None]:
    """Whether the pilot bounds the ratio V_y|x / V_x, and if not, why and what more data would fix it."""
    if vy == 0:
        return True, None  # no within-prompt spread: K = 1, whatever V_x is
    raw = float(s["v_x_raw"])
    if vx <= 0:
        why = (f"the V_x estimate is {raw:.4g} <= 0 (the spread of the prompt means is within their "
               "response noise)")
    elif "ratio" in ci and not math.isfinite(ci["ratio"][1]):
        why = f"the ratio's {level:.0%} interval is unbounded above (V_x's interval reaches 0)"
    else:
        return True, None
    p = int(s["n_used_prompts"])
    vm = float(s["var_of_means"])
    noise = max(vm - raw, 0.0)  # mean s_i^2 / K_i: the response noise in the spread of the means
    # the spread of P prompt means has a standard error of about vm * sqrt(2 / (P - 1)); a prompt
    # floor below about twice that cannot be told from 0
    floor = 2.0 * max(vm, noise) * math.sqrt(2.0 / max(p - 1, 1))
    return False, (
        f"ratio not identified: {why}, so K* is not a recommendation. With {p} prompts this pilot cannot "
        f"tell a prompt floor V_x below about {floor:.3g} from 0; that limit shrinks as 1/sqrt(prompts) "
        f"(4x the prompts halves it), and more responses per prompt shrink the response noise ({noise:.3g}) "
        "it must be told apart from"
    )
