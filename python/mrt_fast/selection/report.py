"""What a `select` call did: its report."""

from __future__ import annotations

from dataclasses import dataclass, field
import numpy as np


@dataclass
class SelectionReport:
    """What a `select` call did, pool by pool where it matters."""

    method: str
    k: int
    n_pools: int
    n_candidates: int
    n_kept: int
    n_small_pools: int
    small_pool_ids: list = field(default_factory=list)
    objective: np.ndarray | None = None  # per pool (facility-location methods)
    upper_bound: np.ndarray | None = None  # per pool
    modes_missed: int = 0  # stratified: pool-modes that got no pick
    seconds: float = 0.0

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
            "seconds": self.seconds,
        }
