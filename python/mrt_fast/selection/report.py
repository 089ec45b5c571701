"""What a `select` call did: its report."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np


def pick_lines(report: Any) -> list[tuple[str, str]]:
    """What decided the picks, as (label, value) rows: ties, duplicates, near-duplicates
    and, for stratified, one-mode pools and modes left without a pick (any report with
    those counts: `SelectionReport`, `BatchReport`)."""
    rows = [("picks decided by the tie rule", f"{report.n_tie_picks:,}"),
            ("duplicates skipped", f"{report.n_duplicates_skipped:,}")]
    if report.n_near_duplicates_removed:
        rows.append(("near-duplicates removed (dedup)", f"{report.n_near_duplicates_removed:,}"))
    if getattr(report, "n_no_embedding", 0):
        rows.append(("candidates without an embedding (left out)", f"{report.n_no_embedding:,}"))
    if report.method == "stratified":
        rows.append(("one-mode pools", f"{report.n_one_mode_pools:,}"))
        rows.append(("modes with no pick", f"{report.modes_missed:,}"))
    return rows


def summary_text(title: str, rows: list[tuple[str, str]]) -> str:
    """A report's (label, value) rows as a short aligned table under `title`."""
    w = max((len(a) for a, _ in rows), default=0)
    return "\n".join([title] + [f"  {a:<{w}}  {b}" for a, b in rows])


@dataclass(repr=False)
class SelectionReport:
    """What a `select` call did, pool by pool where it matters.

    Besides the sizes, it counts what decided the picks: ``n_tie_picks``
    (picks among gains equal within rounding, decided by the tie rule:
    quality, coverage, content), ``n_zero_gain_picks`` (facility-location
    picks whose marginal gain is 0: the kept set already covers the pool),
    ``n_duplicates_skipped`` (candidates left out because they repeat a kept
    one's embedding or text), ``n_near_duplicates_removed`` (rows removed by
    ``dedup=`` before selection) and ``n_one_mode_pools`` (stratified: pools
    whose candidates form a single mode, where stratified is a uniform draw).
    ``print(report)`` shows them as a short table.
    """

    method: str
    k: int | str
    n_pools: int
    n_candidates: int
    n_kept: int
    n_small_pools: int
    small_pool_ids: list = field(default_factory=list)
    objective: np.ndarray | None = None  # per pool (facility-location methods)
    upper_bound: np.ndarray | None = None  # per pool
    modes_missed: int = 0  # stratified: pool-modes that got no pick
    seconds: float = 0.0
    n_tie_picks: int = 0
    n_zero_gain_picks: int = 0
    n_duplicates_skipped: int = 0
    n_near_duplicates_removed: int = 0
    n_one_mode_pools: int = 0
    n_no_embedding: int = 0  # dataset jobs: candidates with a null embedding (an empty text kept), left out

    #: the counts that add up over parts of a selection
    COUNTS: ClassVar[tuple[str, ...]] = (
        "n_tie_picks", "n_zero_gain_picks", "n_duplicates_skipped", "n_near_duplicates_removed", "n_one_mode_pools",
        "n_no_embedding",
    )

    @property
    def approximation_ratio(self) -> np.ndarray | None:
        """Per pool F(S) / certified upper bound on OPT (a lower bound on the true ratio)."""
        if self.objective is None:
            return None
        ub = self.upper_bound
        with np.errstate(invalid="ignore", divide="ignore"):
            r = np.where(ub > 0, self.objective / np.where(ub > 0, ub, 1.0), 1.0)
        return r

    @property
    def mean_ratio(self) -> float | None:
        r = self.approximation_ratio
        return None if r is None or len(r) == 0 else float(np.mean(r))

    def to_dict(self) -> dict:
        return {
            "method": self.method,
            "k": self.k,
            "n_pools": self.n_pools,
            "n_candidates": self.n_candidates,
            "n_kept": self.n_kept,
            "n_small_pools": self.n_small_pools,
            "small_pool_ids": list(self.small_pool_ids),
            "mean_approximation_ratio": self.mean_ratio,
            "min_approximation_ratio": None
            if self.approximation_ratio is None or not len(self.approximation_ratio)
            else float(np.min(self.approximation_ratio)),
            "modes_missed": self.modes_missed,
            **{f: getattr(self, f) for f in self.COUNTS},
            "seconds": self.seconds,
        }

    def lines(self) -> list[tuple[str, str]]:
        """The summary as (label, value) rows: what `str(report)` prints."""
        d = self.to_dict()
        rows = [
            ("method", f"{self.method}, k = {self.k}"),
            ("pools", f"{self.n_pools:,} ({self.n_candidates:,} candidates, {self.n_kept:,} kept)"),
            ("pools with <= k candidates", f"{self.n_small_pools:,} (kept whole)"),
        ]
        if d["mean_approximation_ratio"] is not None:
            rows.append(("certified ratio", f"mean {d['mean_approximation_ratio']:.4f}, "
                                            f"min {d['min_approximation_ratio']:.4f}"))
            rows.append(("zero-gain picks", f"{self.n_zero_gain_picks:,}"))
        rows += pick_lines(self)
        rows.append(("time", f"{self.seconds:.3f} s"))
        return rows

    def __str__(self) -> str:
        return summary_text("SelectionReport", self.lines())

    def __repr__(self) -> str:
        return (f"SelectionReport(method={self.method!r}, k={self.k!r}, n_pools={self.n_pools}, "
                f"n_kept={self.n_kept}, n_small_pools={self.n_small_pools}, n_tie_picks={self.n_tie_picks}, "
                f"n_zero_gain_picks={self.n_zero_gain_picks}, n_duplicates_skipped={self.n_duplicates_skipped}, "
                f"n_one_mode_pools={self.n_one_mode_pools})")
