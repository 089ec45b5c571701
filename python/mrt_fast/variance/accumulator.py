"""`VarianceAccumulator`: streaming, mergeable per-prompt loss statistics (the Rust core's).

Estimators (prompts with K_i >= 2 responses; g_i their mean, s_i^2 their
unbiased variance):

* ``V_y|x = mean_i s_i^2``;
* ``V_x = max(0, var_i(g_i) - mean_i(s_i^2 / K_i))`` with the ddof = 1
  variance of the means, which keeps the estimate unbiased (before the clip)
  also when the K_i differ; prompts with one response are counted and left out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from mrt_fast import _grades_core as core
from mrt_fast.errors import MrtInputError
from mrt_fast.tables.arrays import pool_keys
from mrt_fast.variance.inputs import id_series, loss_column, loss_frame, losses_array, to_numpy_1d

if TYPE_CHECKING:  # pragma: no cover
    from mrt_fast.variance.options import VarianceOptions
    from mrt_fast.variance.report import VarianceReport


def _core_call(fn, *args):
    """A call into the core; its `MrtInputError` (row, pool and column kept) passes as it is,
    a plain `ValueError` becomes one."""
    try:
        return fn(*args)
    except MrtInputError:
        raise
    except ValueError as e:
        raise MrtInputError(str(e)) from None


class VarianceAccumulator:
    """Streaming, mergeable per-prompt loss statistics (count, mean, M2).

    Rows may come in any order and in any number of `update` calls; shards
    built by different workers `merge` into the same statistics as one pass
    (to floating-point rounding; for a given row order, the same bits however
    the rows are cut into updates). `to_bytes`/`from_bytes` (and pickling)
    move partial results between processes; the bytes carry a checksum, so a
    corrupted or truncated file is refused. Losses whose statistics would
    overflow float64 are refused with the row, and nothing is added.
    """

    __slots__ = ("_core",)

    def __init__(self, _core: Any = None) -> None:
        self._core = _core if _core is not None else core.VarianceAccumulator()

    def update(self, prompt_ids: Any, losses: Any, *, hashed: bool = False) -> "VarianceAccumulator":
        """Add rows. `prompt_ids` of any type (hashed to stable 64-bit keys)
        unless `hashed=True`, in which case they must already be uint64 keys.
        A NaN/inf loss raises `MrtInputError` naming the row (its ``row``
        attribute: the row counted from the first this accumulator has seen);
        nothing is added."""
        x = losses_array(losses)
        if hashed:
            k = to_numpy_1d(prompt_ids, "keys")
            if k.dtype != np.uint64:
                raise MrtInputError(f"hashed keys must be uint64, got {k.dtype}")
            k = np.ascontiguousarray(k)
        else:
            ids = id_series(prompt_ids)
            if ids.dtype.is_integer() and ids.dtype not in (pl.Int128, getattr(pl, "UInt128", pl.Int128)) and \
                    not (ids.dtype == pl.UInt64 and (ids.max() or 0) > np.iinfo(np.int64).max):
                # keyed inside the accumulator's scan, once per run of equal ids
                # (ids beyond int64 are keyed by `pool_keys`, by value, below)
                k = np.ascontiguousarray(ids.cast(pl.Int64).to_numpy())
            else:
                k = np.ascontiguousarray(pool_keys(ids), dtype=np.uint64)
        if len(k) != len(x):
            raise MrtInputError(f"prompt ids and losses differ in length: {len(k)} vs {len(x)}")
        _core_call(self._core.update_int_ids if k.dtype == np.int64 else self._core.update, k, x)
        return self

    def update_table(self, table: Any, *, by: str = "prompt_id", loss: str = "loss") -> "VarianceAccumulator":
        """Add the rows of a polars/Arrow/pandas table."""
        df = loss_frame(table, by, loss)
        return self.update(df[by], loss_column(df, loss))

    def merge(self, other: "VarianceAccumulator") -> "VarianceAccumulator":
        """Fold `other` into this accumulator (exact Chan merge); returns self.
        `acc.merge(acc)` counts every row twice. Statistics that would
        overflow float64 raise `MrtInputError`, with this accumulator unchanged."""
        if not isinstance(other, VarianceAccumulator):
            raise MrtInputError(f"can only merge a VarianceAccumulator, got {type(other).__name__}")
        _core_call(self._core.merge, other._core)
        return self

    def copy(self) -> "VarianceAccumulator":
        return VarianceAccumulator(self._core.copy())

    def to_bytes(self) -> bytes:
        """Stable little-endian serialisation: magic, version, the per-prompt
        statistics in key order and a checksum."""
        return self._core.to_bytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> "VarianceAccumulator":
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise MrtInputError(f"expected the bytes of a serialised accumulator, got {type(data).__name__}")
        return cls(_core_call(core.VarianceAccumulator.from_bytes, bytes(data)))

    def __reduce__(self):
        return (VarianceAccumulator.from_bytes, (self.to_bytes(),))

    def __len__(self) -> int:
        return len(self._core)

    @property
    def n_rows(self) -> int:
        return int(self._core.n_rows)

    def per_prompt(self) -> pl.DataFrame:
        """One row per prompt (sorted by key): key, count, mean, m2."""
        d = self._core.per_prompt()
        return pl.DataFrame({"key": d["key"], "count": d["count"], "mean": d["mean"], "m2": d["m2"]})

    def summary(self) -> dict[str, float]:
        """The estimators: v_x, v_x_raw (before the clip), v_y_given_x, ...
        Raises `MrtInputError` when fewer than two prompts have >= 2 responses."""
        return dict(_core_call(self._core.summary))

    def report(self, options: "VarianceOptions | None" = None, **keywords: Any) -> "VarianceReport":
        """`VarianceReport` from this accumulator: ``options`` (a `VarianceOptions`) or its
        keywords (those of `variance_budget`: costs, k_grid, budget, n_boot, ...)."""
        from mrt_fast.variance.diagnosis import report_from_accumulator

        return report_from_accumulator(self, options, **keywords)

    def __repr__(self) -> str:
        return f"VarianceAccumulator(prompts={len(self)}, rows={self.n_rows})"
