"""`variance_budget`: the variance-budget diagnosis of per-response losses, whatever holds them.

A table (polars, Arrow, pandas, a ``datasets.Dataset``) is read here; a path
(a file, a directory of Parquet/JSONL files, a finished ``mrt`` dataset
directory, a glob) or a ``ray.data.Dataset`` is read by :mod:`mrt_fast.datasets`
(streamed through the accumulator, or folded on Ray), through the hook
``"variance_budget.source"`` the root package provides. Every path builds the
same :class:`~mrt_fast.variance.report.VarianceReport` from one checked
:class:`~mrt_fast.variance.options.VarianceOptions`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import polars as pl

from mrt_fast._util.hooks import handler
from mrt_fast.errors import MrtInputError
from mrt_fast.tables.arrays import table_kind
from mrt_fast.tables.hf import is_hf
from mrt_fast.variance.accumulator import VarianceAccumulator
from mrt_fast.variance.diagnosis import diagnose
from mrt_fast.variance.inputs import loss_column, loss_frame
from mrt_fast.variance.options import DEFAULT_K_GRID, VarianceOptions
from mrt_fast.variance.report import VarianceReport

#: the hook that reads a path or a Ray Dataset (provided by the root package)
SOURCE_HOOK = "variance_budget.source"
ENGINES = ("local", "ray")


def variance_budget(
    data: Any,
    *,
    by: str = "prompt_id",
    loss: str = "loss",
    cost_prompt: float = 1.0,
    cost_response: float = 1.0,
    k_grid: Sequence[int] = DEFAULT_K_GRID,
    k_max: int = 1024,
    budget: float | None = None,
    n_prompts: int | None = None,
    delta: float = 0.05,
    loss_bound: float | None = None,
    n_boot: int = 1000,
    seed: int = 0,
    ci_level: float = 0.95,
    bootstrap: str = "auto",
    interval: str = "auto",
    layout: str = "auto",
    tokens: str | None = None,
    engine: str = "local",
    address: str | None = None,
    batch_rows: int = 1_000_000,
    allow_partial: bool = False,
) -> VarianceReport:
    """Estimate V_x and V_y|x from per-response losses and say how many
    responses per prompt the budget law recommends.

    `data`: a table (polars/Arrow/pandas/``datasets.Dataset``), a path (a file,
    a directory of Parquet/JSONL files, a finished ``mrt`` output, a glob;
    streamed: memory grows with the prompts, not the rows) or a
    ``ray.data.Dataset`` (folded on Ray). One row per response with a prompt
    id column `by` (any type) and a numeric `loss` column, or one row per
    prompt with a list of losses (the grouped layout; `layout` "auto" tells
    them apart by the loss column, "flat" or "grouped" says which). `tokens`: a
    column of token counts; then `loss` is a sum of token log-probabilities
    (the `logprob` that `mrt generate` writes) and the loss is the mean token
    NLL `-loss / tokens`, a pilot loss that costs no extra forward pass (a
    table, or a path on the local engine).

    `cost_prompt`/`cost_response` are C_p, C_r (only their ratio matters for
    K*). `k_grid`: the K values of the predicted-variance table; `k_max`: the
    largest K considered for `k_best`. `budget`: B, to tabulate
    Np = floor(B / (C_p + K C_r)) and the variance it buys. `n_prompts`: the
    Np of the predicted-variance table (default: the pilot's). `delta`,
    `loss_bound`: the Bernstein bound's failure probability and loss range
    B_loss (losses in [0, B_loss]); None uses the observed range max - min of
    the losses (noted). `n_boot`, `seed`, `ci_level`: seeded bootstrap over
    prompts. `bootstrap`: "exact" resamples the prompts (time grows as
    prompts x n_boot); "normal" draws each resample's means of the per-prompt
    statistics from their large-sample normal law (time independent of the
    prompt count); "auto" (default) is exact up to 5e7 draws. `interval`: how
    the resamples become intervals (`mrt_fast.variance.intervals`):
    "studentized" (bootstrap-t on log V_y|x and on the log of the ANOVA
    F = vm / leak, with leave-one-prompt-out jackknife standard errors; the
    ratio, K* and k_best follow from V_x / V_y|x's interval), "bca",
    "calibrated" (double bootstrap; n_boot x 200 resamples), "expanded" or
    "percentile". "auto" (default): studentized where prompts are resampled,
    expanded with the normal approximation. Measured coverage:
    docs/results/interval_coverage.md. These knobs are `VarianceOptions`, checked
    before any data is read.

    `engine` ("local" or "ray") and `address` (the Ray cluster) apply to a
    path; `batch_rows` to a path on the local engine. An unfinished ``mrt``
    output is refused unless `allow_partial` (its finished parts are read,
    with a warning). A flag that does not apply to `data` is refused in one line.
    """
    options = VarianceOptions(cost_prompt=cost_prompt, cost_response=cost_response, k_grid=k_grid, k_max=k_max,
                              budget=budget, n_prompts=n_prompts, delta=delta, loss_bound=loss_bound, n_boot=n_boot,
                              seed=seed, ci_level=ci_level, bootstrap=bootstrap, interval=interval)
    if not isinstance(engine, str) or engine not in ENGINES:
        raise MrtInputError(f"engine must be 'local' or 'ray', got {engine!r}")
    if address is not None and engine != "ray":
        raise MrtInputError("address needs engine='ray'")
    on_ray = engine == "ray" or type(data).__module__.startswith("ray.data")
    if tokens is not None and on_ray:
        raise MrtInputError("tokens= (generation log-probabilities as the loss) runs on the local engine only")
    if not is_table(data):
        return handler(SOURCE_HOOK)(data, by=by, loss=loss, layout=layout, tokens=tokens, engine=engine,
                                    address=address, batch_rows=batch_rows, allow_partial=allow_partial,
                                    options=options)
    if engine == "ray":
        raise MrtInputError("engine='ray' applies to a path; pass a ray.data.Dataset to fold a table on Ray")
    return table_budget(data, by=by, loss=loss, layout=layout, tokens=tokens, options=options)


def is_table(data: Any) -> bool:
    """Whether ``data`` is a table in memory (a ``LazyFrame`` counts: it is refused as one)."""
    if is_hf(data) or isinstance(data, pl.LazyFrame):
        return True
    try:
        table_kind(data)
    except MrtInputError:
        return False
    return True


def table_budget(table: Any, *, by: str, loss: str, layout: str, tokens: str | None,
                 options: VarianceOptions) -> VarianceReport:
    """`variance_budget` over a table in memory."""
    df = loss_frame(table, by, loss, layout, tokens)
    x = loss_column(df, loss)
    acc = VarianceAccumulator().update(df[by], x)
    notes_extra = []
    if options.loss_bound is None and len(x):
        # both ends in one polars pass (the update checked that every loss is finite)
        lb = float(pl.DataFrame({"x": x}).select(pl.col("x").max() - pl.col("x").min()).item())
        options = options.replace(loss_bound=lb)
        notes_extra.append(f"loss_bound not given: using the observed loss range {lb:.4g}")
    rep = diagnose(acc, options)
    rep.notes.extend(notes_extra)
    rep._pilot = (df[by], x)
    return rep
