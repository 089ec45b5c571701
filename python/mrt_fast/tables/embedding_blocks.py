"""An embedding column as the core reads it: the value buffers of its Arrow chunks,
float32 or float16, as 2-d views, with no copy, no concatenation and no widening.

A column read from several files comes in chunks; the core takes the chunks as row
blocks and widens float16 rows only as it gathers a pool. Any other column (float64
or integer values, ragged or null embeddings) goes through `arrays.embeddings`, which
gives one float32 matrix or names what is wrong.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa

from mrt_fast.tables.arrays import embeddings

_VIEWED = {pa.float16(): np.float16, pa.float32(): np.float32}


class EmbeddingBlocks:
    """Row blocks of one embedding matrix (``blocks``: (n_i, d) arrays of one dtype,
    rows numbered across them in order): what `fl_batch` takes."""

    def __init__(self, blocks: list[np.ndarray], dim: int):
        self.blocks = blocks
        self.dim = dim
        self.starts = np.cumsum([0] + [len(b) for b in blocks], dtype=np.int64)

    def __len__(self) -> int:
        return int(self.starts[-1])

    def all_finite(self) -> bool:
        """Whether every value is finite."""
        return all(bool(np.isfinite(b).all()) for b in self.blocks)

    def rows(self, idx: np.ndarray) -> np.ndarray:
        """Rows ``idx`` as a C-contiguous (len(idx), d) float32 matrix."""
        return self._gather(idx, (len(idx), self.dim), lambda block, local: block[local])

    def column(self, idx: np.ndarray, j: int = 0) -> np.ndarray:
        """Coordinate ``j`` of rows ``idx`` as float32 (no whole rows gathered)."""
        return self._gather(idx, (len(idx),), lambda block, local: block[local, j])

    def _gather(self, idx, shape: tuple, read) -> np.ndarray:
        """``read(block, rows of that block)`` for every block that rows ``idx`` fall in, placed in a
        float32 array of ``shape`` in the order of ``idx``."""
        idx = np.asarray(idx, dtype=np.int64)
        if len(self.blocks) == 1:
            return np.ascontiguousarray(read(self.blocks[0], idx), dtype=np.float32)
        out = np.empty(shape, dtype=np.float32)
        order = np.argsort(idx, kind="stable")
        cuts = np.searchsorted(idx[order], self.starts)  # each block's run of the sorted rows
        for b, block in enumerate(self.blocks):
            at = order[cuts[b]:cuts[b + 1]]
            if len(at):
                out[at] = read(block, idx[at] - self.starts[b])
        return out


def embedding_blocks(df: pl.DataFrame, name: str) -> EmbeddingBlocks:
    """Column ``name`` of ``df`` as `EmbeddingBlocks`: views of its chunks when it holds
    float16 or float32 vectors of one length with no nulls, else one float32 matrix
    (`arrays.embeddings`, which refuses what cannot be embeddings)."""
    s = df[name]
    views = _views(s) if isinstance(s.dtype, (pl.List, pl.Array)) and not s.null_count() else None
    if views is not None:
        return EmbeddingBlocks(*views)
    x = embeddings(df, name)
    return EmbeddingBlocks([x], x.shape[1])


def _views(s: pl.Series) -> tuple[list[np.ndarray], int] | None:
    """The chunks of a list or array column as (n_i, d) views of their value buffers;
    None when they are not all float16 or all float32 vectors of one nonzero length
    without nulls."""
    if s.dtype.inner not in (pl.Float16, pl.Float32):  # type: ignore[union-attr]
        return None
    if isinstance(s.dtype, pl.Array):
        d = s.dtype.size
    else:
        lens = s.list.len()
        if not len(lens) or lens.min() != lens.max():
            return None
        d = int(lens.min())  # type: ignore[arg-type]
    if d == 0:
        return None
    blocks = []
    for chunk in s.get_chunks():  # each chunk's Arrow export shares its buffers
        c = chunk.to_arrow()
        if isinstance(c, pa.ChunkedArray):
            c = c.combine_chunks() if c.num_chunks != 1 else c.chunk(0)
        m = len(c)
        if not m:
            continue
        if c.null_count:
            return None
        if pa.types.is_fixed_size_list(c.type):
            first = c.offset * d
        else:
            wide = pa.types.is_large_list(c.type)
            offs = np.frombuffer(c.buffers()[1], dtype=np.int64 if wide else np.int32, count=m + 1,
                                 offset=c.offset * (8 if wide else 4))
            first = int(offs[0])
            if int(offs[-1]) - first != m * d:
                return None
        vals = c.values.slice(first, m * d)
        dtype = _VIEWED.get(vals.type)
        if dtype is None or vals.null_count:
            return None
        size = np.dtype(dtype).itemsize
        blocks.append(np.frombuffer(vals.buffers()[1], dtype=dtype, count=m * d,
                                    offset=vals.offset * size).reshape(m, d))
    return (blocks, d) if blocks else None
