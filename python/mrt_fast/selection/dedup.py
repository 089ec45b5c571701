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


def check_dedup(dedup: Any) -> float | None:
    if dedup is None:
        return None
    if isinstance(dedup, bool) or not isinstance(dedup, (int, float, np.integer, np.floating)) \
            or not -1.0 < float(dedup) <= 1.0:
        raise MrtInputError(f"dedup must be None or a cosine threshold in (-1, 1], got {dedup!r}")
    return float(dedup)


def near_duplicate_mask(x: np.ndarray, offsets: np.ndarray, rows: np.ndarray, order_key: np.ndarray,
                        reward: np.ndarray | None, threshold: float, content: np.ndarray | None = None) -> np.ndarray:
    """A keep-mask over the rows of `x`: False for rows within `threshold`
    (cosine) of a row kept before them in their pool. Pool p holds rows
    ``rows[offsets[p]:offsets[p+1]]``, visited by reward (highest first), then
    `order_key`, then `content` (a key of every column, for rows equal in the
    first two). Rows that are not finite or have zero norm are kept (selection
    refuses them by name)."""
    keep = np.ones(len(x), dtype=bool)
    norms = np.linalg.norm(x.astype(np.float64), axis=1)
    ok = np.isfinite(norms) & (norms > 0)
    unit = np.where(ok[:, None], x / np.where(ok, norms, 1.0)[:, None], 0.0)
    off = offsets.astype(np.int64)
    for p in range(len(off) - 1):
        r = rows[off[p]:off[p + 1]].astype(np.int64)
        r = r[ok[r]]
        if len(r) < 2:
            continue
        rew = -reward[r] if reward is not None else np.zeros(len(r))
        tie = content[r] if content is not None else np.zeros(len(r), dtype=np.uint64)
        r = r[np.lexsort((tie, order_key[r], rew))]
        s = unit[r] @ unit[r].T
        kept: list[int] = []
        for i in range(len(r)):
            if kept and np.max(s[i, kept]) >= threshold:
                keep[r[i]] = False
            else:
                kept.append(i)
    return keep
