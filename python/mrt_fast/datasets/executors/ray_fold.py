"""The variance budget on Ray: each block of a Ray Dataset folds into a
`VarianceAccumulator` (one task per block, no shuffle), the driver merges
them in dataset order (:func:`variance_budget`); over the files of a source
with :func:`mrt_fast.datasets.executors.ray.variance_budget_files`. Also the
schema and layout of a Ray Dataset, and its rows collected with the user's
errors raised as themselves.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from mrt_fast.datasets.executors.ray_runtime import (Unwrapping, own_context, quiet_remote_args, ray_module,
                                                     retry_args, to_polars)
from mrt_fast.errors import MrtInputError
from mrt_fast.tables.layouts import check_layout, detect, explode, list_depth


def dataset_schema(ds) -> pa.Schema:
    s = ds.schema()
    if s is None:
        raise MrtInputError("the dataset is empty: there is nothing to select from")
    base = getattr(s, "base_schema", s)
    if isinstance(base, pa.Schema):
        return base
    return pa.schema([pa.field(n, t if isinstance(t, pa.DataType) else pa.null()) for n, t in zip(s.names, s.types)])


def layout_of(schema: pa.Schema, *, by: str = "prompt_id", embedding: str = "embedding",
              reward: str = "reward", mode: str = "mode", loss: str = "loss") -> str:
    """``"grouped"`` when the per-candidate columns present are lists (an
    embedding column of lists of vectors, a reward/mode/loss column of lists),
    else ``"flat"`` (:func:`mrt_fast.tables.layouts.detect`)."""
    if by in schema.names and list_depth(schema.field(by).type):
        raise MrtInputError(f"column {by!r} (prompt id) holds lists; in the grouped layout it holds one id per row")
    return detect(schema, {embedding: 1, reward: 0, mode: 0, loss: 0})



def dataset_layout(schema: pa.Schema, layout: str, options: dict, loss: str = "loss") -> str:
    layout = check_layout(layout)
    if layout != "auto":
        return layout
    keys = {k: options[k] for k in ("by", "embedding", "reward", "mode") if k in options}
    return layout_of(schema, loss=loss, **keys)


def collect(ds: Any) -> pl.DataFrame:
    """The rows of a (small) Dataset as one polars frame, `MrtInputError`s
    from tasks raised as themselves."""
    with Unwrapping():
        t = ds.to_arrow_refs()
        ray = ray_module()
        tables = ray.get(t)
    tables = [x for x in tables if x.num_rows] or tables[:1]
    return to_polars(pa.concat_tables(tables, promote_options="default")) if tables else pl.DataFrame()


def run(ds: Any):
    """Execute a lazy Dataset into a `MaterializedDataset`, raising task
    `MrtInputError`s as themselves."""
    with Unwrapping():
        return ds.materialize()


class _Fold:
    def __init__(self, by: str, loss: str, grouped: bool):
        self.by, self.loss, self.grouped = by, loss, grouped
        self.__name__ = "fold_variance"

    def __call__(self, t: pa.Table) -> pa.Table:
        from mrt_fast.variance.accumulator import VarianceAccumulator
        from mrt_fast.variance.inputs import loss_column

        df = to_polars(t.select([self.by, self.loss]))
        if self.grouped:
            df = explode(df, self.by, [self.loss])
        x = loss_column(df, self.loss)
        acc = VarianceAccumulator().update(df[self.by], x)
        lo = float(x.min()) if len(x) else np.inf
        hi = float(x.max()) if len(x) else -np.inf
        return pa.table({"acc": pa.array([acc.to_bytes()], pa.binary()), "lo": [lo], "hi": [hi]})


def variance_budget(ds: Any, *, by: str = "prompt_id", loss: str = "loss", layout: str = "auto",
                    **options: Any):
    """`mrt_fast.variance_budget` over a Ray Dataset: each block folds its rows
    into a `VarianceAccumulator` (one task per block, no shuffle), the driver
    merges them in dataset order and builds the same `VarianceReport`
    (equal to the local one up to floating-point rounding, exactly equal
    where no prompt is split across blocks). `options` are those of
    `variance_budget` (costs, k_grid, k_max, budget, n_prompts, delta,
    loss_bound, n_boot, seed, ci_level, bootstrap, interval)."""
    ray_module()
    from mrt_fast.tables.arrays import require
    from mrt_fast.variance.accumulator import VarianceAccumulator
    from mrt_fast.variance.diagnosis import report_from_accumulator

    schema = dataset_schema(ds)
    cols = list(schema.names)
    require(cols, by, "prompt id")
    require(cols, loss, "loss")
    lay = dataset_layout(schema, layout, {"by": by}, loss=loss)
    # argument checks before any task runs (on a two-prompt stand-in)
    probe = VarianceAccumulator().update(np.array([0, 0, 1, 1]), np.array([0.0, 1.0, 0.0, 2.0]))
    report_from_accumulator(probe, **{**options, "n_boot": 0})
    ds = own_context(ds)
    with quiet_remote_args():
        parts = ds.map_batches(_Fold(by, loss, lay == "grouped"), batch_size=None, batch_format="pyarrow",
                               zero_copy_batch=True, **retry_args())
    out = collect(parts)
    acc = VarianceAccumulator()
    for b in out["acc"].to_list():
        acc.merge(VarianceAccumulator.from_bytes(b))
    notes_extra = []
    if options.get("loss_bound") is None and acc.n_rows:
        lb = float(out["hi"].max() - out["lo"].min())
        options = {**options, "loss_bound": lb}
        notes_extra.append(f"loss_bound not given: using the observed loss range {lb:.4g}")
    rep = report_from_accumulator(acc, **options)
    rep.notes.extend(notes_extra)
    return rep


