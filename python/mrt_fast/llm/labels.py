"""KTO labels: which responses are desirable, which undesirable, by a named rule.

* ``quantile:Q`` (default ``quantile:0.5``) — an absolute bar: X is the Q-th
  quantile (linear interpolation) of the rewards of every exported row, and
  then as ``threshold:X``.
* ``threshold:X`` — desirable when the reward is above X, undesirable when
  below; responses at X get no label (counted).
* ``column:NAME`` — a boolean checker verdict (e.g. ``correct``): true is
  desirable, false undesirable; a null verdict, or copies of one text whose
  verdicts differ, get no label (counted).
* ``pool-mean`` — pool-relative: desirable above the mean reward of the
  response's own pool, undesirable below. A pool whose rewards are all equal
  gives no label (counted: there is nothing to prefer), and a reward at the
  pool's mean gets none either.

Rewards within 1e-9 (relative) of each other, or of the bar, are equal: the
rounding of a mean never decides a label.

Copies of one text in a pool are one response with the mean of their rewards.
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from mrt_fast.errors import MrtInputError
from mrt_fast.llm.pairs import TIE_TOLERANCE

__all__ = ["DEFAULT_LABEL", "LabelRule", "kto_labels", "parse_label_rule"]

DEFAULT_LABEL = "quantile:0.5"


class LabelRule:
    """A parsed ``--kto-label``: ``kind`` in pool-mean, threshold, quantile, column; ``value``."""

    def __init__(self, kind: str, value=None, spec: str = "") -> None:
        self.kind, self.value, self.spec = kind, value, spec

    @property
    def column(self) -> str | None:
        return self.value if self.kind == "column" else None


def parse_label_rule(spec: str) -> LabelRule:
    usage = "threshold:X, quantile:Q (0 <= Q <= 1), column:NAME or pool-mean"
    if not isinstance(spec, str):
        raise MrtInputError(f"kto_label must be {usage}, got {spec!r}")
    if spec == "pool-mean":
        return LabelRule("pool-mean", None, spec)
    kind, _, value = spec.partition(":")
    if kind == "column" and value:
        return LabelRule("column", value, spec)
    if kind in ("threshold", "quantile"):
        try:
            x = float(value)
        except ValueError:
            x = math.nan
        if math.isfinite(x) and (kind == "threshold" or 0.0 <= x <= 1.0):
            return LabelRule(kind, x, spec)
    raise MrtInputError(f"kto_label must be {usage}, got {spec!r}")


def kto_labels(cands: pl.DataFrame, rule: LabelRule, row_rewards: np.ndarray) -> tuple[pl.Series, dict[str, int]]:
    """Each candidate's label (True, False, or null for none) and the responses left without one, by reason.

    ``cands``: one row per candidate with ``__r`` (its reward), ``__mu`` (its pool's mean row reward),
    ``__lo``/``__hi`` (its pool's lowest/highest candidate reward) and, for ``column:``, ``__lab_lo``/
    ``__lab_hi`` (the least and greatest verdict of its copies); ``row_rewards``: every exported row's reward."""
    r = cands["__r"].to_numpy()
    left: dict[str, int] = {}
    if rule.kind == "column":
        lo, hi = cands["__lab_lo"], cands["__lab_hi"]
        label = lo.to_numpy(allow_copy=True)
        none = lo.is_null().to_numpy()
        conflict = (~none) & (lo != hi).fill_null(False).to_numpy()
        left = {"no verdict": int(none.sum()), "copies with different verdicts": int(conflict.sum())}
        return pl.Series("label", [None if n or c else bool(v) for v, n, c in zip(label, none, conflict)],
                         dtype=pl.Boolean), left
    if rule.kind == "pool-mean":
        lo, hi, mu = cands["__lo"].to_numpy(), cands["__hi"].to_numpy(), cands["__mu"].to_numpy()
        width = TIE_TOLERANCE * np.maximum(np.abs(lo), np.abs(hi))
        flat = hi - lo <= width
        tie = ~flat & (np.abs(r - mu) <= width)
        left = {"pools with equal rewards": int(flat.sum()), "at the pool mean": int(tie.sum())}
        out = np.where(flat | tie, None, r > mu)
    else:
        x = float(np.quantile(np.sort(row_rewards), rule.value)) if rule.kind == "quantile" else rule.value
        at = np.abs(r - x) <= TIE_TOLERANCE * np.maximum(np.abs(r), abs(x))
        left = {f"at the threshold {x:g}": int(at.sum())}
        out = np.where(at, None, r > x)
    return pl.Series("label", out.tolist(), dtype=pl.Boolean), left
