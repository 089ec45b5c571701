"""Scored rows as preference data: DPO pairs, KTO rows, listwise rows, and what was left out.

A pool's *candidates* are its distinct response texts: copies of one text are
merged into one candidate with the mean of their rewards (counted in the
report), so no pair holds one text twice and no text gets two labels. Inside
a pool the candidates are in canonical order, reward descending and equal
rewards by text; pools keep the order of their first row. Nothing here
depends on the order of the rows inside a pool.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl

from mrt_fast.llm.labels import LabelRule, kto_labels
from mrt_fast.llm.pairs import TIE_TOLERANCE, pool_pairs, tie_width
from mrt_fast.tables.arrays import embeddings as embedding_matrix

__all__ = ["ExportReport", "candidates", "dpo_rows", "kto_rows", "listwise_rows"]

ONE = "one response"
FLAT = "equal rewards"
NO_PAIR = "no pair under the rule"


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def _spread(x) -> tuple[float, float, float] | None:
    x = np.asarray(x, dtype=np.float64)
    return (float(x.min()), float(np.median(x)), float(x.max())) if len(x) else None


@dataclass
class ExportReport:
    """What an export wrote, and every prompt or response it left out, by reason."""

    format: str
    rule: str | None = None
    source: str = "kept"
    rows_in: int = 0
    prompts_in: int = 0
    rows_out: int = 0
    duplicates_merged: int = 0
    ties: int = 0
    prompts_dropped: dict[str, int] = field(default_factory=dict)
    responses_unlabelled: dict[str, int] = field(default_factory=dict)
    labels: dict[str, int] = field(default_factory=dict)
    margins: tuple[float, float, float] | None = None
    pairs_per_prompt: tuple[float, float, float] | None = None

    @property
    def dropped(self) -> int:
        return sum(self.prompts_dropped.values()) + sum(self.responses_unlabelled.values())

    def lines(self) -> list[str]:
        """The report as short lines: what was read, written, and left out."""
        what = f"{self.format} rows" + (f" ({self.rule})" if self.rule else "")
        out = [f"{self.rows_out} {what} from {self.rows_in} {self.source} rows of {self.prompts_in} prompts"]
        if self.pairs_per_prompt:
            out.append("pairs per prompt min/median/max: {:g} / {:g} / {:g}".format(*self.pairs_per_prompt))
        if self.margins:
            out.append("reward margin min/median/max: {:.4g} / {:.4g} / {:.4g}".format(*self.margins))
        if self.labels:
            out.append(", ".join(f"{v} {k}" for k, v in self.labels.items()))
        for k, v in self.prompts_dropped.items():
            if v:
                out.append(f"{_count(v, 'prompt')} dropped: {k}")
        for k, v in self.responses_unlabelled.items():
            if v:
                out.append(f"{_count(v, 'response')} without a label: {k}")
        if self.duplicates_merged:
            out.append(f"{_count(self.duplicates_merged, 'duplicate response')} merged into another copy "
                       "of the text (mean reward)")
        if self.ties:
            out.append(f"{_count(self.ties, 'response')} with a reward tied within its prompt (ordered by text)")
        return out

    def left_out(self) -> str:
        """The lines naming what was left out, joined; empty when nothing was."""
        return "; ".join(x for x in self.lines() if "dropped:" in x or "without a label:" in x)

    def __str__(self) -> str:
        return "; ".join(self.lines())


def candidates(df: pl.DataFrame, by: str, prompt: str, response: str, reward: str, embedding: str | None = None,
               label: str | None = None) -> pl.DataFrame:
    """One row per (pool, distinct response), in canonical order, with the pool's statistics:
    ``__pool`` (0, 1, ... in order of first row), ``__r`` (mean reward of the copies), ``__copies``,
    ``__mu``/``__sigma`` (mean and population standard deviation of the pool's row rewards),
    ``__lo``/``__hi`` (the pool's lowest/highest candidate reward), ``__n`` (candidates of the pool)."""
    d = df.with_row_index("__row").with_columns(pl.col(reward).cast(pl.Float64).alias("__r"))
    # sorted first, so every sum (mean, std) adds the same numbers in the same order whatever the row order
    d = d.sort([by, response, "__r"], maintain_order=True)
    pools = d.group_by(by, maintain_order=True).agg(
        pl.col("__row").min().alias("__o"), pl.col("__r").sort().mean().alias("__mu"),
        pl.col("__r").sort().std(ddof=0).alias("__sigma"))
    aggs = [pl.col(prompt).first(), pl.col("__r").mean(), pl.len().alias("__copies")]
    if embedding is not None:
        aggs.append(pl.col(embedding).first())
    if label is not None:
        aggs += [pl.col(label).min().alias("__lab_lo"), pl.col(label).max().alias("__lab_hi")]
    c = d.group_by([by, response], maintain_order=True).agg(aggs).join(pools, on=by)
    c = c.sort(["__o", "__r", response], descending=[False, True, False])
    return c.with_columns((pl.col("__o").rank("dense") - 1).cast(pl.Int64).alias("__pool"),
                          pl.col("__r").min().over(by).alias("__lo"), pl.col("__r").max().over(by).alias("__hi"),
                          pl.len().over(by).alias("__n"))


def _bounds(cands: pl.DataFrame) -> np.ndarray:
    pool = cands["__pool"].to_numpy()
    return np.concatenate([[0], np.flatnonzero(np.diff(pool)) + 1, [len(pool)]])


def _ties(cands: pl.DataFrame, by: str) -> int:
    return int(cands.select((pl.len().over([by, "__r"]) > 1).sum()).item())


def _unit(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    norm = np.linalg.norm(x, axis=1, keepdims=True)
    return np.divide(x, norm, out=np.zeros_like(x), where=norm > 0)


def _messages(role: str, col: str) -> pl.Expr:
    return pl.concat_list(pl.struct(pl.lit(role).alias("role"), pl.col(col).alias("content")))


def _prompt_col(prompt: str, conversational: bool) -> pl.Expr:
    return (_messages("user", prompt) if conversational else pl.col(prompt)).alias("prompt")


def _drop_reasons(cands: pl.DataFrame, by: str) -> pl.DataFrame:
    """Per pool: why it can give nothing (one candidate; equal rewards), or null."""
    return cands.group_by("__pool", maintain_order=True).agg(
        pl.col(by).first(), pl.when(pl.len() < 2).then(pl.lit(ONE))
        .when(pl.col("__r").max() - pl.col("__r").min() <= TIE_TOLERANCE * pl.col("__r").abs().max())
        .then(pl.lit(FLAT)).alias("__why").first())


def dpo_rows(cands: pl.DataFrame, report: ExportReport, by: str, prompt: str, response: str, rule: str,
             min_margin: float, max_pairs: int | None, conversational: bool,
             embedding: str | None = None) -> pl.DataFrame:
    """TRL preference rows (prompt_id, prompt, chosen, rejected, margin) of every pool under ``rule``."""
    r = cands["__r"].to_numpy()
    mu, sigma = cands["__mu"].to_numpy(), cands["__sigma"].to_numpy()
    e = _unit(embedding_matrix(cands, embedding)) if embedding is not None else None
    bounds = _bounds(cands)
    ci, ri, per_prompt = [], [], []
    dropped = {ONE: 0, FLAT: 0, NO_PAIR: 0}
    for a, b in zip(bounds[:-1], bounds[1:]):
        rr = r[a:b]
        if b - a < 2:
            dropped[ONE] += 1
            continue
        if rr[0] - rr[-1] <= tie_width(rr):
            dropped[FLAT] += 1
            continue
        pairs = pool_pairs(rule, rr, embedding=None if e is None else e[a:b], mu=float(mu[a]),
                           sigma=float(sigma[a]), min_margin=min_margin, max_pairs=max_pairs)
        if not pairs:
            dropped[NO_PAIR] += 1
            continue
        per_prompt.append(len(pairs))
        ci += [a + i for i, _ in pairs]
        ri += [a + j for _, j in pairs]
    report.prompts_dropped = {(f"no pair with a reward margin >= {min_margin:g} under {rule}" if k == NO_PAIR
                               else f"{k} (nothing to pair)" if k == ONE else "all rewards equal (no preference)"): v
                              for k, v in dropped.items()}
    report.pairs_per_prompt = _spread(per_prompt)
    report.ties = _ties(cands, by)
    chosen = cands[ci].select(by, prompt, pl.col(response).alias("chosen"), pl.col("__r").alias("__rc"))
    rejected = cands[ri].select(pl.col(response).alias("rejected"), pl.col("__r").alias("__rr"))
    pairs = pl.concat([chosen, rejected], how="horizontal").with_columns(
        (pl.col("__rc") - pl.col("__rr")).alias("margin"))
    report.margins = _spread(pairs["margin"].to_numpy())
    if conversational:
        cols = [_messages("assistant", "chosen").alias("chosen"), _messages("assistant", "rejected").alias("rejected")]
    else:
        cols = ["chosen", "rejected"]
    return pairs.select(pl.col(by).alias("prompt_id"), _prompt_col(prompt, conversational), *cols, "margin")


def kto_rows(cands: pl.DataFrame, report: ExportReport, by: str, prompt: str, response: str, rule: LabelRule,
             row_rewards: np.ndarray, conversational: bool) -> pl.DataFrame:
    """TRL unpaired rows (prompt_id, prompt, completion, label) of the candidates ``rule`` labels."""
    label, left = kto_labels(cands, rule, row_rewards)
    rows = cands.with_columns(label).filter(pl.col("label").is_not_null())
    report.responses_unlabelled = left
    report.labels = {"desirable": int(rows["label"].sum()), "undesirable": int((~rows["label"]).sum())}
    report.ties = _ties(cands, by)
    completion = (_messages("assistant", response) if conversational else pl.col(response)).alias("completion")
    return rows.select(pl.col(by).alias("prompt_id"), _prompt_col(prompt, conversational), completion, "label")


def listwise_rows(cands: pl.DataFrame, report: ExportReport, by: str, prompt: str, response: str,
                  conversational: bool) -> pl.DataFrame:
    """One row per prompt: its responses best first (``completions``) and their ``rewards``; pools with
    one response or equal rewards give none (nothing to rank)."""
    why = _drop_reasons(cands, by)
    report.prompts_dropped = {f"{ONE} (nothing to rank)": int((why["__why"] == ONE).sum()),
                              "all rewards equal (no ranking)": int((why["__why"] == FLAT).sum())}
    report.ties = _ties(cands, by)
    keep = cands.join(why.filter(pl.col("__why").is_null()).select("__pool"), on="__pool", maintain_order="left")
    completion = _messages("assistant", response) if conversational else pl.col(response)
    out = keep.with_columns(completion.alias("__c")).group_by("__pool", maintain_order=True).agg(
        pl.col(by).first().alias("prompt_id"), pl.col(prompt).first(), pl.col("__c").alias("completions"),
        pl.col("__r").alias("rewards"))
    return out.select("prompt_id", _prompt_col(prompt, conversational), "completions", "rewards")
