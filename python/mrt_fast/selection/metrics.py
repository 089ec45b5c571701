"""What a kept set holds of its pool: diversity and coverage of unit embeddings."""

from __future__ import annotations

import numpy as np


def kept_metrics(x_pool: np.ndarray, kept: np.ndarray) -> tuple[float, float]:
    """(diversity, coverage) of kept rows of a pool of unit embeddings.

    diversity = 1 - mean pairwise cosine of the kept set (0 for one row);
    coverage = mean over the pool's candidates of the max cosine to a kept one.
    """
    xk = x_pool[kept]
    c = xk @ xk.T
    m = len(kept)
    div = 0.0 if m < 2 else float(1.0 - (c.sum() - np.trace(c)) / (m * (m - 1)))
    cov = float((x_pool @ xk.T).max(axis=1).mean())
    return div, cov
