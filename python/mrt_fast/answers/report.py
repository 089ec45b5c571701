"""What an answers run found: answered rows, one-answer pools and the pools with no learning signal.

A pool carries **no learning signal** when every response in it gets the same
reward (all correct or all wrong: a group-relative advantage is zero for each
of them, the case DAPO's dynamic sampling and verl's accuracy band filter
out); without a reward (no reference), when all its responses reach one
answer. :func:`pool_stats` measures it per pool from the columns a run wrote.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from mrt_fast.datasets.report import JobReport

__all__ = ["AnswerReport", "pool_stats", "zero_signal_mask"]

#: rewards closer than this are equal
REWARD_TIE = 1e-12


@dataclass(repr=False)
class AnswerReport(JobReport):
    """What an answers run did: the job's fields (:class:`~mrt_fast.datasets.report.JobReport`;
    for the in-memory :func:`~mrt_fast.answers.answers`, one part of the whole table) and the
    answers' counts. ``responses`` and the pools are those read, before any drop; ``rows`` are
    the input rows (prompts in the grouped layout) and ``rows_out`` the output's."""

    extract: str = ""
    responses: int = 0
    pools: int = 0
    answered: int = 0
    unanswered: int = 0
    one_answer_pools: int = 0
    zero_signal_pools: int = 0
    all_correct_pools: int = 0
    all_wrong_pools: int = 0
    rewarded: bool = False
    dropped_pools: int = 0
    dropped_rows: int = 0  # responses of the dropped pools
    null_references: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    kept_only: bool = False  # answers and the all-correct/all-wrong split counted over the kept prompts only

    def stage_lines(self) -> list[tuple[str, str]]:
        among = " (among the kept prompts)" if self.kept_only else ""
        out = [("extract", self.extract), ("responses", f"{self.responses:,} in {self.pools:,} prompts"),
               ("answered", f"{self.answered:,}; {self.unanswered:,} with no answer (each its own mode){among}")]
        if self.null_references:
            out.append(("null references", f"{self.null_references:,} responses (scored wrong)"))
        if self.statuses:
            out.append(("program runs", ", ".join(f"{k} {v:,}" for k, v in sorted(self.statuses.items()))))
        out.append(("prompts with one answer", f"{self.one_answer_pools:,} (one mode){among}"))
        split = f"{self.all_correct_pools:,} all correct, {self.all_wrong_pools:,} all wrong"
        if self.kept_only:
            why = f"all rewards equal; {split} of those kept"
        else:
            other = self.zero_signal_pools - self.all_correct_pools - self.all_wrong_pools
            why = f"all rewards equal: {split}" + (f", {other:,} other" if other else "")
        if not self.rewarded:
            why = "one answer, no reference"
        out.append(("no learning signal", f"{self.zero_signal_pools:,} of {self.pools:,} prompts ({why})"))
        if self.dropped_pools:
            out.append(("dropped", f"{self.dropped_pools:,} of them ({self.dropped_rows:,} responses)"))
        return out

    def __repr__(self) -> str:
        return (f"AnswerReport(output={self.output!r}, extract={self.extract!r}, responses={self.responses}, "
                f"pools={self.pools}, answered={self.answered}, zero_signal_pools={self.zero_signal_pools}, "
                f"dropped_pools={self.dropped_pools}, parts={self.parts}, seconds={self.seconds:.2f})")


def zero_signal_mask(stats: pl.DataFrame, rewarded: bool) -> pl.Series:
    """Per pool of :func:`pool_stats`: True where it carries no learning signal."""
    if rewarded:
        return (stats["r_max"] - stats["r_min"]).abs() <= REWARD_TIE
    return stats["n_modes"] == 1


def pool_stats(flat: pl.DataFrame | pl.LazyFrame, by: str, mode: str, reward: str | None,
               correct: str | None) -> pl.DataFrame:
    """Per pool (one row per prompt id, in first-appearance order): ``n``, ``n_modes``,
    ``r_min``/``r_max`` and ``n_correct`` (when rewarded)."""
    aggs = [pl.len().alias("n"), pl.col(mode).n_unique().alias("n_modes")]
    if reward is not None:
        aggs += [pl.col(reward).min().alias("r_min"), pl.col(reward).max().alias("r_max")]
    if correct is not None:
        aggs.append(pl.col(correct).cast(pl.Int64).sum().alias("n_correct"))
    lf = flat.lazy() if isinstance(flat, pl.DataFrame) else flat
    return lf.group_by(by, maintain_order=True).agg(aggs).collect()


def fill(rep: AnswerReport, stats: pl.DataFrame, rewarded: bool) -> None:
    """The pool counts of ``rep`` from :func:`pool_stats`."""
    rep.rewarded = rewarded
    rep.pools = stats.height
    rep.one_answer_pools = int((stats["n_modes"] == 1).sum())
    z = zero_signal_mask(stats, rewarded)
    rep.zero_signal_pools = int(z.sum())
    if rewarded and "n_correct" in stats.columns:
        rep.all_correct_pools = int((z & (stats["n_correct"] == stats["n"])).sum())
        rep.all_wrong_pools = int((z & (stats["n_correct"] == 0)).sum())
