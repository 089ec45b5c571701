"""Implicit multi-response: redundant prompts act as one prompt with several responses.

Single-response data over Np prompts in C clusters of near-equivalent prompts
behaves like C prompts with K_eff ~ Np / C responses each.
:func:`implicit_mrt` finds the clusters from prompt embeddings (a cosine
threshold, or k-means) and, given one loss per prompt, the cluster-level
variance components.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mrt_fast.errors import MrtInputError
from mrt_fast.variance.accumulator import VarianceAccumulator
from mrt_fast.variance.inputs import losses_array
from mrt_fast.variance.report import json_num

@dataclass
class RedundancyReport:
    """Prompt redundancy: C clusters of near-equivalent prompts among Np.

    Single-response data over Np prompts in C clusters behaves like C prompts
    with K_eff ~ Np / C responses each; its variance is about
    V_x* / C + V_y|x* / Np with the cluster-level components (estimated from
    per-prompt losses grouped by cluster when given).
    """

    n_prompts: int
    n_clusters: int
    k_eff: float
    method: str
    threshold: float | None
    labels: np.ndarray
    cluster_sizes: np.ndarray
    v_x_star: float | None = None
    v_y_given_x_star: float | None = None
    implied_variance: float | None = None
    naive_variance: float | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "n_prompts": self.n_prompts,
            "n_clusters": self.n_clusters,
            "k_eff": json_num(self.k_eff),
            "method": self.method,
            "threshold": self.threshold,
            "largest_cluster": int(self.cluster_sizes.max()) if len(self.cluster_sizes) else 0,
            "v_x_star": json_num(self.v_x_star),
            "v_y_given_x_star": json_num(self.v_y_given_x_star),
            "implied_variance": json_num(self.implied_variance),
            "naive_variance": json_num(self.naive_variance),
            "notes": list(self.notes),
        }


def _threshold_components(x: np.ndarray, threshold: float, block: int = 4096) -> np.ndarray:
    """Connected components of the graph cos(x_i, x_j) >= threshold."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    n = len(x)
    rows, cols = [], []
    try:
        import faiss

        index = faiss.IndexFlatIP(x.shape[1])
        index.add(x)
        for s in range(0, n, block):
            lims, _, nbr = index.range_search(x[s : s + block], float(threshold) - 1e-6)
            counts = np.diff(lims.astype(np.int64))
            rows.append(np.repeat(np.arange(s, s + len(counts)), counts))
            cols.append(nbr.astype(np.int64))
    except ImportError:  # pragma: no cover - faiss is in the embed extra
        for s in range(0, n, block):
            sim = x[s : s + block] @ x.T
            r, c = np.nonzero(sim >= threshold - 1e-6)
            rows.append(r + s)
            cols.append(c)
    r = np.concatenate(rows) if rows else np.zeros(0, np.int64)
    c = np.concatenate(cols) if cols else np.zeros(0, np.int64)
    g = coo_matrix((np.ones(len(r), dtype=np.int8), (r, c)), shape=(n, n)).tocsr()
    _, labels = connected_components(g, directed=False)
    return labels.astype(np.int64)


def implicit_mrt(
    embeddings: Any,
    *,
    losses: Any = None,
    threshold: float = 0.9,
    method: str = "threshold",
    n_clusters: int | None = None,
    v_x_star: float | None = None,
    v_y_given_x_star: float | None = None,
    seed: int = 0,
) -> RedundancyReport:
    """Estimate prompt redundancy from prompt embeddings (one row per prompt).

    `method="threshold"`: prompts i, j are near-equivalent when their cosine
    similarity is >= `threshold`; clusters are the connected components of that
    graph (exact range search with FAISS, scipy connected components).
    `method="kmeans"`: `n_clusters` modes by the k-means policy of `mrt_fast.selection.modes`.

    With `losses` (one single-response loss per prompt), the cluster-level
    components V_x*, V_y|x* are estimated by treating each cluster as a prompt
    and its members as responses; or pass them directly. Then
    `implied_variance = V_x*/C + V_y|x*/Np` and `naive_variance` (every prompt
    its own cluster) = (V_x* + V_y|x*)/Np.
    """
    x = np.asarray(embeddings, dtype=np.float32)
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] == 0:
        raise MrtInputError(f"embeddings must be a non-empty (n_prompts, dim) matrix, got shape {x.shape}")
    if not np.isfinite(x).all():
        bad = int(np.nonzero(~np.isfinite(x).all(axis=1))[0][0])
        raise MrtInputError(f"embedding of prompt {bad} has NaN/inf values")
    norms = np.linalg.norm(x, axis=1)
    if np.any(norms == 0):
        raise MrtInputError(f"embedding of prompt {int(np.nonzero(norms == 0)[0][0])} is the zero vector")
    x = np.ascontiguousarray(x / norms[:, None], dtype=np.float32)
    n = len(x)
    notes: list[str] = []
    if method == "threshold":
        if not -1 <= threshold <= 1:
            raise MrtInputError(f"threshold must be a cosine in [-1, 1], got {threshold}")
        labels = _threshold_components(x, threshold)
    elif method == "kmeans":
        if n_clusters is None or not 1 <= int(n_clusters) <= n:
            raise MrtInputError(f"method='kmeans' needs 1 <= n_clusters <= {n}, got {n_clusters}")
        from mrt_fast.selection.modes import kmeans

        labels = kmeans(x, int(n_clusters), seed=seed)
    else:
        raise MrtInputError(f"method must be 'threshold' or 'kmeans', got {method!r}")
    sizes = np.bincount(labels)
    sizes = sizes[sizes > 0]
    c = int(len(sizes))
    rep = RedundancyReport(
        n_prompts=n,
        n_clusters=c,
        k_eff=n / c,
        method=method,
        threshold=float(threshold) if method == "threshold" else None,
        labels=labels,
        cluster_sizes=sizes,
        notes=notes,
    )
    if losses is not None:
        lv = losses_array(losses)
        if len(lv) != n:
            raise MrtInputError(f"losses must have one value per prompt: {len(lv)} losses for {n} prompts")
        acc = VarianceAccumulator().update(labels.astype(np.int64), lv)
        try:
            s = acc.summary()
            v_x_star = v_x_star if v_x_star is not None else float(s["v_x"])
            v_y_given_x_star = v_y_given_x_star if v_y_given_x_star is not None else float(s["v_y_given_x"])
        except MrtInputError:
            notes.append("fewer than 2 clusters with >= 2 prompts: cluster-level variances cannot be estimated")
    if v_x_star is not None and v_y_given_x_star is not None:
        rep.v_x_star, rep.v_y_given_x_star = float(v_x_star), float(v_y_given_x_star)
        rep.implied_variance = v_x_star / c + v_y_given_x_star / n
        rep.naive_variance = (v_x_star + v_y_given_x_star) / n
    return rep
