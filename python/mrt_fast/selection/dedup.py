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

from mrt_fast import _grades_core as core
from mrt_fast.errors import MrtInputError
from mrt_fast.tables.embedding_blocks import EmbeddingBlocks


def check_dedup(dedup: Any) -> float | None:
    if dedup is None:
        return None
    if isinstance(dedup, bool) or not isinstance(dedup, (int, float, np.integer, np.floating)) \
            or not -1.0 < float(dedup) <= 1.0:
        raise MrtInputError(f"dedup must be None or a cosine threshold in (-1, 1], got {dedup!r}")
    return float(dedup)


def near_duplicate_mask(x: EmbeddingBlocks, offsets: np.ndarray, rows: np.ndarray, order_key: np.ndarray,
                        reward: np.ndarray | None, threshold: float, content: np.ndarray | None = None) -> np.ndarray:
    """A keep-mask over the rows of `x`: False for rows within `threshold`
    (cosine) of a row kept before them in their pool. Pool p holds rows
    ``rows[offsets[p]:offsets[p+1]]``, visited by reward (highest first), then
    `order_key`, then `content` (a key of every column, for rows equal in the
    first two). Rows that are not finite or have zero norm are kept (selection
    refuses them by name). The core compares each pool's unit rows in float64,
    pools in parallel, reading the embeddings where they lie."""
    def arr(a, dtype):
        return None if a is None else np.ascontiguousarray(a, dtype=dtype)

    return core.near_duplicates(x.blocks, arr(offsets, np.uint64), float(threshold), order=arr(order_key, np.uint64),
                                rows=arr(rows, np.uint64), rewards=arr(reward, np.float64),
                                content=arr(content, np.uint64))
