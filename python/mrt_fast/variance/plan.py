"""How many responses to generate per prompt: the variance law applied before generation.

A pilot gives a few responses per prompt with a reward (or loss). For the
next generation round of R responses in all, each prompt i gets n_i:

1. **No variance, no new answer: starved.** A prompt whose pilot values are
   all equal (within 1e-9 of the largest absolute value) teaches nothing new
   by sampling more of the same, so it gets ``n_zero`` responses (default 0),
   unless it is *kept* (its ``keep`` column is true, e.g. a prompt you must
   cover) or, where a ``mode`` column (the normalised answer) exists, its
   pilot still shows answers seen only once (Good-Turing: the chance that the
   next response is an answer not seen yet is N1 / n, N1 the number of
   answers seen exactly once in n pilot responses; a prompt with N1 > 0 may
   still find a different answer with a different reward). A prompt with one
   pilot value has no variance estimate and is not starved.
2. **Neyman allocation over the rest.** The remaining budget is split in
   proportion to each prompt's within-prompt standard deviation (the V_y|x of
   `mrt_fast.variance`), the pilot variances first shrunk toward the pooled
   V_y|x (`shrink_variances`), with the floor ``n_min`` and the cap ``n_max``
   (`neyman_allocation`: the integer optimum of sum_i var_i / n_i).

The `GenerationPlan` compares the predicted within-prompt variance of the
per-prompt mean, sum_i var_i / n_i / Np^2 (starved prompts count 0: their
pilot shows none), with uniform n = R / Np, and says how many responses
uniform n would need for the plan's variance. ``mrt generate`` reads the
plan's ``n`` column as each prompt's number of responses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from mrt_fast.errors import MrtInputError
from mrt_fast.tables.arrays import as_frame, require_columns
from mrt_fast.tables.layouts import GROUPED, detect, explode
from mrt_fast.variance.allocate import neyman_allocation, shrink_variances

__all__ = ["GenerationPlan", "plan_generation"]

TIE_TOLERANCE = 1e-9


@dataclass
class GenerationPlan:
    """Per-prompt n for the next generation round.

    ``table``: prompt_id, n, pilot_n, sd (the shrunk within-prompt standard
    deviation), no_variance, kept, unseen (Good-Turing mass; null without a
    mode column), and the prompt text when the pilot has one."""

    table: pl.DataFrame
    total: int
    v_y_given_x: float
    predicted_within: float
    uniform_within: float
    uniform_needed: int
    cost_prompt: float = 0.0
    cost_response: float = 1.0

    def cost(self, responses: float, prompts: int) -> float:
        """C_p per prompt sampled plus C_r per response."""
        return self.cost_prompt * prompts + self.cost_response * responses

    @property
    def starved(self) -> int:
        """Prompts starved for showing no variance (they get ``n_zero`` responses)."""
        return int((self.table["no_variance"] & ~self.table["kept"] & ~(self.table["unseen"].fill_null(0.0) > 0))
                   .sum())

    def lines(self) -> list[str]:
        t = self.table
        np_ = t.height
        live = t.filter(pl.col("n") > 0)["n"]
        out = [f"{int(t['n'].sum())} responses over {np_} prompts (n from {live.min()} to {live.max()} where "
               "n > 0)" if len(live) else f"{int(t['n'].sum())} responses over {np_} prompts"]
        nv = int(t["no_variance"].sum())
        if nv:
            out.append(f"prompts with no variance in the pilot: {nv}, {self.starved} of them starved (n = n_zero)"
                       + ("" if nv == self.starved else " (the others are kept or may still give an unseen answer)"))
        if self.starved == np_:
            out.append(f"no prompt shows variance in the pilot: {int(t['n'].sum())} of the {self.total} responses "
                       "planned")
            return out
        gain = self.uniform_within / self.predicted_within if self.predicted_within > 0 else math.inf
        out.append(f"predicted within-prompt variance {self.predicted_within:.4g} vs {self.uniform_within:.4g} at "
                   f"uniform n = {self.total / np_:.3g} ({gain:.3g}x)")
        planned = int(t["n"].sum())
        sampled = int((t["n"] > 0).sum())
        out.append(f"expected cost {self.cost(planned, sampled):.6g} (C_p {self.cost_prompt:g} x {sampled} prompts + "
                   f"C_r {self.cost_response:g} x {planned} responses) vs {self.cost(self.total, np_):.6g} at uniform "
                   f"n with the same budget and {self.cost(self.uniform_needed, np_):.6g} at the uniform n of the "
                   f"same variance ({self.uniform_needed} responses)")
        return out

    def __str__(self) -> str:
        return "; ".join(self.lines())


def _int(name: str, v: Any, least: int) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < least:
        raise MrtInputError(f"{name} must be an integer >= {least}, got {v!r}")
    return int(v)


def plan_generation(pilot: Any, total: int, *, by: str = "prompt_id", value: str = "reward", n_min: int = 1,
                    n_max: int | None = None, n_zero: int = 0, keep: str | None = None, mode: str | None = "mode",
                    prompt: str | None = "prompt", shrink: Any = "auto", cost_prompt: float = 0.0,
                    cost_response: float = 1.0) -> GenerationPlan:
    """Per-prompt n for ``total`` responses from a pilot table (one row per pilot response, ``value`` its
    reward or loss; or grouped, one row per prompt with ``value`` a list). ``keep``: a boolean column, true for prompts never starved; ``mode``: the answer
    column for the Good-Turing unseen mass (used when present); ``prompt``: carried to the plan when
    present, so the plan is a prompt table for ``mrt generate``; ``cost_prompt``, ``cost_response``: the
    cost of sampling a prompt at all and of one response, for the comparison with uniform n."""
    for name, c in (("cost_prompt", cost_prompt), ("cost_response", cost_response)):
        if isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c) or c < 0:
            raise MrtInputError(f"{name} must be a finite number >= 0, got {c!r}")
    total = _int("total", total, 1)
    n_min = _int("n_min", n_min, 1)
    n_zero = _int("n_zero", n_zero, 0)
    if n_max is not None:
        n_max = _int("n_max", n_max, n_min)
    df = as_frame(pilot)
    require_columns(df, [by, value], "pilot")
    if detect(df.schema, {value: 0}) == GROUPED:  # a row a prompt, value lists: a row a pilot response
        df = explode(df, by, [c for c in (value, mode, keep) if c is not None and c in df.columns
                              and isinstance(df.schema[c], (pl.List, pl.Array))])
    if df.height == 0:
        raise MrtInputError("the pilot is empty: there is nothing to plan from")
    for c in (by, value):
        if df[c].null_count():
            r = int(df[c].is_null().arg_true()[0])
            raise MrtInputError(f"column {c!r} of the pilot is null at row {r}", column=c, row=r)
    if not df[value].dtype.is_numeric():
        raise MrtInputError(f"column {value!r} must hold numbers, got {df[value].dtype}", column=value)
    bad = ~df[value].cast(pl.Float64).is_finite()
    if bad.any():
        r = int(bad.arg_true()[0])
        x = df[value][r]
        raise MrtInputError(f"column {value!r} of the pilot is {'NaN' if x != x else x} at row {r} (prompt {df[by][r]!r}): "
                            "pilot values must be finite", column=value, row=r, pool=df[by][r])
    if keep is not None:
        require_columns(df, [keep], "pilot")
        if df[keep].dtype != pl.Boolean:
            raise MrtInputError(f"keep column {keep!r} must be boolean, got {df[keep].dtype}", column=keep)
    v = pl.col(value).cast(pl.Float64)
    aggs = [pl.len().alias("pilot_n"), v.sort().var(ddof=1).alias("__s2"),
            ((v.max() - v.min()) <= TIE_TOLERANCE * v.abs().max()).alias("__flat"),
            (pl.col(keep).fill_null(False).any() if keep else pl.lit(False)).alias("kept")]
    if prompt is not None and prompt in df.columns:
        aggs.append(pl.col(prompt).sort().first())
    has_mode = mode is not None and mode in df.columns
    if has_mode:
        aggs.append((pl.col(mode).is_unique().sum() / pl.len()).alias("unseen"))  # N1 / n
    stats = df.sort(by).group_by(by, maintain_order=True).agg(aggs)
    if not has_mode:
        stats = stats.with_columns(pl.lit(None, pl.Float64).alias("unseen"))
    n = stats["pilot_n"].to_numpy().astype(np.int64)
    s2 = stats["__s2"].fill_null(0.0).to_numpy()
    no_var = stats["__flat"].to_numpy() & (n >= 2)
    starve = no_var & ~stats["kept"].to_numpy() & ~(stats["unseen"].fill_null(0.0).to_numpy() > 0)
    live = ~starve
    df_ = np.maximum(n - 1, 0)
    v_pooled = float((df_ * s2).sum() / df_.sum()) if df_.sum() else 0.0
    var = np.zeros(len(n))
    if live.any():
        var[live] = shrink_variances(s2[live], n[live], v_pooled, shrink)
    rest = total - n_zero * int(starve.sum())
    if rest < n_min * int(live.sum()):
        raise MrtInputError(f"total = {total} is less than n_min x {int(live.sum())} prompts to sample"
                            + (f" plus n_zero x {int(starve.sum())} starved" if n_zero else ""))
    caps = None if n_max is None else np.full(int(live.sum()), n_max)
    if caps is not None and rest > int(caps.sum()):
        raise MrtInputError(f"total = {total} is more than n_max x {int(live.sum())} prompts to sample can take")
    alloc = np.full(len(n), n_zero, dtype=np.int64)
    if live.any():
        alloc[live] = neyman_allocation(var[live], rest, n_min, caps)
    np_ = len(n)
    uni = total / np_
    pw = float(np.sum(var[live] / alloc[live]) / np_**2)
    uw = float(np.sum(var[live]) / uni / np_**2)
    # uniform n has within-variance sum var / (n Np^2): equal to the plan's at n = sum var / (pw Np^2)
    needed = int(math.ceil(float(np.sum(var[live])) / (pw * np_) - 1e-9)) if pw > 0 else total
    cols = [pl.col(by).alias(by), pl.Series("n", alloc), "pilot_n", pl.Series("sd", np.sqrt(var)),
            pl.Series("no_variance", no_var), "kept", "unseen"]
    if prompt is not None and prompt in stats.columns:
        cols.insert(1, prompt)
    return GenerationPlan(stats.select(cols), total, v_pooled, pw, uw, needed, float(cost_prompt),
                          float(cost_response))
