"""Near-duplicate removal inside a pool (``select(..., dedup=threshold)``).

As semantic deduplication does, candidates whose embeddings are closer than a
cosine threshold count as one: in each pool, candidates are visited by
quality (reward, highest first; then content key, so the row order plays no
part) and a candidate is dropped when its cosine with one already kept is at
least the threshold. Selection then runs on what remains.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mrt_fast.errors import MrtInputError
from mrt_fast.tables.embedding_blocks import EmbeddingBlocks


def check_dedup(dedup: Any) -> float | None:
    if dedup is None:
        return None
    if isinstance(dedup, bool) or not isinstance(dedup, (int, float, np.integer, np.floating)) \
            or not -1.0 < float(dedup) <= 1.0:
        raise MrtInputError(f"dedup must be None or a cosine threshold in (-1, 1], got {dedup!r}")
    return float(dedup)


#: bytes of float64 rows (whole pools) compared at once
DEDUP_BYTES = 1 << 24


def near_duplicate_mask(x: EmbeddingBlocks, offsets: np.ndarray, rows: np.ndarray, order_key: np.ndarray,
                        reward: np.ndarray | None, threshold: float, content: np.ndarray | None = None) -> np.ndarray:
    """A keep-mask over the rows of `x`: False for rows within `threshold`
    (cosine) of a row kept before them in their pool. Pool p holds rows
    ``rows[offsets[p]:offsets[p+1]]``, visited by reward (highest first), then
    `order_key`, then `content` (a key of every column, for rows equal in the
    first two). Rows that are not finite or have zero norm are kept (selection
    refuses them by name). Whole pools of at most ``DEDUP_BYTES`` of float64 rows
    are compared at once (a larger pool alone), so memory stays within a few
    integers per row beyond the table."""
    keep = np.ones(len(x), dtype=bool)
    off = offsets.astype(np.int64)
    n_pools = len(off) - 1
    step = max(1, DEDUP_BYTES // (8 * x.dim))
    p = 0
    while p < n_pools:
        q = max(p + 1, int(np.searchsorted(off, off[p] + step, side="right")) - 1)
        at = rows[off[p]:off[q]].astype(np.int64)
        xs = x.rows(at).astype(np.float64)
        norms = np.linalg.norm(xs, axis=1)
        ok = np.isfinite(norms) & (norms > 0)
        unit = np.where(ok[:, None], xs / np.where(ok, norms, 1.0)[:, None], 0.0)
        del xs
        for a in range(p, q):
            i0, i1 = off[a] - off[p], off[a + 1] - off[p]
            local = np.arange(i0, i1)[ok[i0:i1]]
            if len(local) < 2:
                continue
            r = at[local]
            rew = -reward[r] if reward is not None else np.zeros(len(r))
            tie = content[r] if content is not None else np.zeros(len(r), dtype=np.uint64)
            visit = np.lexsort((tie, order_key[r], rew))
            u = unit[local[visit]]
            _drop_close(u @ u.T, r[visit], threshold, keep)
        p = q
    return keep


def _drop_close(s: np.ndarray, r: np.ndarray, threshold: float, keep: np.ndarray) -> None:
    """Rows ``r`` (in visiting order, cosines ``s``) within ``threshold`` of one kept before them:
    marked False in ``keep``."""
    kept: list[int] = []
    for i in range(len(r)):
        if kept and np.max(s[i, kept]) >= threshold:
            keep[r[i]] = False
        else:
            kept.append(i)
