"""mrt_fast on Ray Data: selection and the variance budget over a `ray.data.Dataset`,
on one machine or a cluster, with the same result as the in-memory functions.

* `select(ds, k, method, **options)` keeps K candidates per prompt and
  returns a lazy `ray.data.Dataset` of the kept rows, with the columns
  `mrt_fast.select` adds. For every pool the kept rows and their order are
  those of `mrt_fast.select` on the whole table (same seed), whatever the
  number of workers, blocks or task retries.
* `variance_budget(ds, **options)` folds each block into a
  `VarianceAccumulator`, merges the accumulators and returns the
  `VarianceReport` of `mrt_fast.variance_budget` on the whole table.
* `select_dataset(source, output, ...)` is `mrt_fast.select_dataset` with
  ``engine="ray"``: files in, parts out (:mod:`mrt_fast.datasets.executors.ray`).

Two layouts are accepted: *flat* (one row per candidate) and *grouped* (one
row per prompt, the per-candidate fields as list columns of equal length).

Flat rows of a pool may lie anywhere in the dataset. They are brought together
without a per-prompt groupby: every row gets a coarse bucket,
``pool_key(prompt id) % n_buckets`` with ``n_buckets`` sized from the data,
and a row-order id; the rows reach their bucket's task through Ray Data's
shuffle keyed by bucket (a few dozen keys, not millions); each bucket task
puts its rows back in dataset order and selects all its pools with one call
of the Rust batch selector. Grouped rows are already whole pools: they are
selected where they are read, with no shuffle at all.

Ray is imported on first use (the ``ray`` extra: ``pip install 'mrt_fast[ray]'``).
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from mrt_fast.datasets.executors.ray_runtime import (BUCKET, FAULT_ENV, ORDER, ROWS_PER_BUCKET, InjectedFault,
                                                     TransientTaskError, init, maybe_fail, own_context,
                                                     quiet_remote_args, read, retry_args, shuffle_strategy, to_polars)
from mrt_fast.datasets.executors.ray_runtime import ray_module as _ray
from mrt_fast.datasets.executors.ray_fold import collect, dataset_layout, dataset_schema, layout_of, run, variance_budget
from mrt_fast.datasets.executors.ray_tasks import tag_buckets
from mrt_fast.errors import MrtInputError
from mrt_fast.tables.layouts import list_depth

__all__ = [
    "select",
    "variance_budget",
    "select_dataset",
    "read",
    "collect",
    "run",
    "init",
    "layout_of",
    "TransientTaskError",
    "FAULT_ENV",
]

# the names the columns of the exchange had here
_BUCKET, _ORDER = BUCKET, ORDER
_schema, _layout = dataset_schema, dataset_layout
_ = (InjectedFault, ROWS_PER_BUCKET)  # served here too


def _select_frame(df: pl.DataFrame, opts: Any) -> pl.DataFrame:
    from mrt_fast.selection.select import select as local_select
    from mrt_fast.errors import SmallPoolWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SmallPoolWarning)
        return local_select(df, options=opts)


class _SelectBucket:
    """One bucket (many whole pools): dataset order back, one batch selection."""

    def __init__(self, opts: Any, fault: str | None):
        self.opts, self.fault = opts, fault
        self.__name__ = "select_bucket"

    def __call__(self, t: pa.Table) -> pa.Table:
        maybe_fail(self.fault)
        df = to_polars(t)
        if df.height == 0:
            return t.drop_columns([_BUCKET, _ORDER]).slice(0, 0)
        df = df.sort(_ORDER).drop(_BUCKET, _ORDER)
        return _select_frame(df, self.opts).to_arrow()


class _SelectGrouped:
    """A block of grouped rows (whole pools): exploded, selected, regrouped (:mod:`mrt_fast.selection.grouped`)."""

    def __init__(self, opts: Any, fault: str | None):
        self.opts, self.fault = opts, fault
        self.__name__ = "select_grouped"

    def __call__(self, t: pa.Table) -> pa.Table:
        maybe_fail(self.fault)
        return _select_frame(to_polars(t), self.opts).to_arrow()



def _empty_like(schema: pa.Schema) -> pl.DataFrame:
    return to_polars(schema.empty_table())


def _check_select_args(schema: pa.Schema, layout: str, opts: Any) -> None:
    """Run `mrt_fast.select`'s own checks on an empty table of this schema, so
    bad arguments and missing columns fail here with the local message."""
    from mrt_fast.selection.select import select as local_select

    df = _empty_like(schema)
    if layout == "grouped":
        by = opts.by
        if by not in df.columns:
            from mrt_fast.tables.arrays import require

            require(df.columns, by, "prompt id")
        cand = [f.name for f in schema if f.name != by and list_depth(f.type)]
        df = df.explode(cand) if cand else df
    try:
        local_select(df, options=opts.replace(layout="flat", candidate_columns=None))
    except MrtInputError as e:
        if not str(e).startswith("the table is empty"):
            raise MrtInputError(str(e), pool=e.pool, column=e.column, row=e.row) from None


def _n_buckets(ds, n_buckets: int | None) -> int:
    if n_buckets is not None:
        if isinstance(n_buckets, bool) or not isinstance(n_buckets, (int, np.integer)) or n_buckets < 1:
            raise MrtInputError(f"n_buckets must be an integer >= 1, got {n_buckets!r}")
        return int(n_buckets)
    ray = _ray()
    cpus = int(ray.cluster_resources().get("CPU", 1))
    rows = ds.count()
    return max(cpus, -(-rows // ROWS_PER_BUCKET), 1)


# --------------------------------------------------------------------------- API


def select(
    ds: Any,
    k: int | str | None = None,
    method: str | None = None,
    *,
    options: Any = None,
    n_buckets: int | None = None,
    shuffle: str = "sort",
    max_retries: int = 3,
    **knobs: Any,
):
    """Keep K candidates per prompt of a Ray Dataset; returns a lazy
    `ray.data.Dataset` of the kept rows (with ``pick_rank`` and, by method,
    ``gain`` / ``weight``, as `mrt_fast.select` adds them).

    The selection is ``options`` (a `SelectOptions`) or ``k``, ``method`` and
    the keywords of `mrt_fast.select` (``by``, ``embedding``, ``reward``,
    ``mode``, ``alpha``, ``eps``, ``k_max``, ``kernel``, ``seed``,
    ``candidate_key``, ``optimizer``) with ``layout`` (``"flat"``,
    ``"grouped"`` or ``"auto"``, see `layout_of`). ``n_buckets`` (flat
    layout) overrides the bucket count, by default ``max(cluster CPUs, rows / 1e6)``.

    Per pool, the kept rows and their order are those of `mrt_fast.select`
    on the dataset's rows in dataset order. The output holds the pools bucket
    by bucket (flat) or block by block (grouped), each bucket's pools in order
    of first appearance.

    Test hook: the ``MRT_RAY_FAULT_ONCE`` environment variable of the driver
    names a marker file: the first selection task that creates it
    raises a `TransientTaskError`, which Ray retries; the output is unchanged.
    Bad arguments and missing columns raise `MrtInputError` here, before any
    task runs; bad values found by a task raise the same `MrtInputError`.
    """
    ray = _ray()
    from ray.data.expressions import monotonically_increasing_id

    from mrt_fast.selection.options import SelectOptions

    if "return_report" in knobs:
        raise MrtInputError("return_report is not available on a Dataset: the report is per bucket")
    opts = SelectOptions.of(k, method, options, **knobs)
    fault = os.environ.get(FAULT_ENV) or None
    schema = _schema(ds)
    by = opts.by
    lay = _layout(schema, opts.layout, {"by": by, "embedding": opts.embedding, "reward": opts.reward,
                                        "mode": opts.mode})
    _check_select_args(schema, lay, opts)
    ds = own_context(ds)
    with quiet_remote_args():
        if lay == "grouped":
            return ds.map_batches(
                _SelectGrouped(opts.replace(layout="grouped"), fault), batch_size=None, batch_format="pyarrow",
                zero_copy_batch=True, compute=ray.data.TaskPoolStrategy(), **retry_args(max_retries),
            )
        nb = _n_buckets(ds, n_buckets)
        tagged = ds.with_column(_ORDER, monotonically_increasing_id()).map_batches(
            tag_buckets(by, nb, None), batch_size=None, batch_format="pyarrow", zero_copy_batch=True
        )
        tagged.context.shuffle_strategy = shuffle_strategy(shuffle)
        return tagged.groupby(_BUCKET, num_partitions=nb).map_groups(
            _SelectBucket(opts.replace(layout="flat", candidate_columns=None), fault), batch_format="pyarrow",
            compute=ray.data.TaskPoolStrategy(), **retry_args(max_retries),
        )


def select_dataset(source: Any, output: Any, k: int | str | None = None, method: str | None = None, *,
                   address: str | None = None, max_retries: int = 3, shuffle: str = "files", **kwargs: Any):
    """:func:`mrt_fast.select_dataset` with ``engine="ray"`` (``address``: its ``ray_address``):
    the same input, selection, output, job and parts as the local engine; see
    :mod:`mrt_fast.datasets.executors.ray`. Returns a
    :class:`~mrt_fast.datasets.report.BatchReport`."""
    from mrt_fast.datasets.select_job import select_dataset as one_select_dataset

    return one_select_dataset(source, output, k, method, engine="ray", ray_address=address,
                              max_retries=max_retries, shuffle=shuffle, **kwargs)


def last_job_stats() -> str | None:
    """Ray Data's per-stage statistics of the last `select_dataset` run in
    this process (wall and CPU time of reading, tagging, the shuffle and the
    bucket tasks), or None."""
    from mrt_fast.datasets.executors.ray import last_job_stats as last

    return last()


def run_row_parts(job: Any, make_stage: Any, *, rows_per_part: int, n_rows: int, workers: int | None = None,
                  address: str | None = None, layout: str = "flat") -> dict[str, Any]:
    """A row stage given as a factory (``make_stage()`` is the function of a part) on Ray:
    :func:`mrt_fast.datasets.executors.ray.run_row_parts`."""
    from mrt_fast.datasets.executors.ray import run_row_parts as on_ray
    from mrt_fast.datasets.stage import FromFactory, RowStage

    stage = make_stage if isinstance(make_stage, RowStage) else FromFactory(make_stage)
    return on_ray(job, stage, rows_per_part=rows_per_part, n_rows=n_rows, workers=workers, address=address,
                  layout=layout)
