"""The batch jobs of mrt_fast on Ray Data: selection and the variance budget
over a `ray.data.Dataset`, on one machine or a cluster, with the same result
as the in-memory functions.

* `select(ds, k, method, **options)` keeps K candidates per prompt and
  returns a lazy `ray.data.Dataset` of the kept rows, with the columns
  `mrt_fast.select` adds. For every pool the kept rows and their order are
  those of `mrt_fast.select` on the whole table (same seed), whatever the
  number of workers, blocks or task retries.
* `variance_budget(ds, **options)` folds each block into a
  `VarianceAccumulator`, merges the accumulators and returns the
  `VarianceReport` of `mrt_fast.variance_budget` on the whole table.

Two layouts are accepted: *flat* (one row per candidate) and *grouped* (one
row per prompt, the per-candidate fields as list columns of equal length).

Flat rows of a pool may lie anywhere in the dataset. They are brought together
without a per-prompt groupby: every row gets a coarse bucket,
``pool_key(prompt id) % n_buckets`` with ``n_buckets`` sized from the data,
and a row-order id; Ray Data groups the rows by bucket (a shuffle with a few
dozen keys, not millions), and each bucket task puts its rows back in dataset
order and selects all its pools with one call of the Rust batch selector.
Grouped rows are already whole pools: they are selected block by block with
`map_batches`, with no shuffle at all.

Ray is imported on first use (the ``ray`` extra: ``pip install 'mrt_fast[ray]'``).
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from .errors import MrtInputError

__all__ = [
    "select",
    "variance_budget",
    "init",
    "layout_of",
    "TransientTaskError",
    "FAULT_ENV",
]

#: environment variable naming a marker file: the first bucket task that
#: creates it raises `InjectedFault` (the test hook for retries; see `select`)
FAULT_ENV = "MRT_RAY_FAULT_ONCE"

_BUCKET = "__mrt_bucket"
_ORDER = "__mrt_order"
#: rows per bucket aimed at when sizing the bucket count from the data
ROWS_PER_BUCKET = 1_000_000


class TransientTaskError(RuntimeError):
    """A task failure worth retrying (Ray retries tasks that raise it)."""


class InjectedFault(TransientTaskError):
    """Raised once by the fault-injection hook."""


# --------------------------------------------------------------------------- ray


def _ray():
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "mrt_fast.distributed needs Ray Data: pip install 'mrt_fast[ray]' " f"({e})"
        ) from None
    return ray


def init(address: str | None = None, **kwargs: Any) -> None:
    """Start a local Ray instance (``address=None``) or join a cluster
    (``"auto"`` or ``"ray://host:10001"`` / ``"host:6379"``); a no-op when Ray is
    already initialised in this process."""
    ray = _ray()
    if ray.is_initialized():
        return
    kwargs.setdefault("include_dashboard", False)
    kwargs.setdefault("log_to_driver", False)
    ray.init(address=address, **kwargs)


def _unwrap(e: BaseException) -> BaseException:
    """The user's exception inside Ray's task-error wrappers (or `e` itself)."""
    seen = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, MrtInputError):
            return cur
        nxt = getattr(cur, "cause", None)
        if not isinstance(nxt, BaseException):
            nxt = cur.__cause__ or cur.__context__
        cur = nxt
    return e


class _Unwrapping:
    """Re-raise an `MrtInputError` from inside Ray's task errors as itself."""

    def __enter__(self):
        return self

    def __exit__(self, et, ev, tb):
        if ev is None or isinstance(ev, MrtInputError):
            return False
        inner = _unwrap(ev)
        if isinstance(inner, MrtInputError):
            raise MrtInputError(str(inner), pool=inner.pool, column=inner.column, row=inner.row) from None
        return False


def _retry_args(max_retries: int = 3) -> dict:
    # system failures (a worker or node lost) and TransientTaskError (the
    # injected fault among them) are retried; bad input is not
    if isinstance(max_retries, bool) or not isinstance(max_retries, (int, np.integer)) or max_retries < -1:
        raise MrtInputError(f"max_retries must be an integer >= -1 (-1: no limit), got {max_retries!r}")
    return {"max_retries": int(max_retries), "retry_exceptions": [TransientTaskError]}


class _quiet_remote_args(warnings.catch_warnings):
    """Ray warns that task options given as keywords will be renamed; the
    retry options have no named form yet."""

    def __enter__(self):
        r = super().__enter__()
        warnings.filterwarnings("ignore", message=".*ray_remote_args.*deprecated")
        return r


# --------------------------------------------------------------------------- layouts


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _schema(ds) -> pa.Schema:
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
    else ``"flat"``."""
    names = schema.names
    if by in names and _is_list(schema.field(by).type):
        raise MrtInputError(f"column {by!r} (prompt id) holds lists; in the grouped layout it holds one id per row")
    if embedding in names:
        t = schema.field(embedding).type
        if _is_list(t) and _is_list(t.value_type):
            return "grouped"
    for c in (reward, mode, loss):
        if c in names and _is_list(schema.field(c).type):
            return "grouped"
    return "flat"


def _candidate_columns(schema: pa.Schema, by: str) -> list[str]:
    """The per-candidate (list) columns of a grouped table."""
    return [f.name for f in schema if f.name != by and _is_list(f.type)]


def explode(df: pl.DataFrame, by: str, columns: list[str]) -> pl.DataFrame:
    """Grouped layout -> flat: one row per candidate, the prompt's scalar
    columns repeated. The list columns of a row must have equal lengths."""
    if not columns:
        raise MrtInputError(f"grouped layout: no list column to take candidates from (columns {df.columns})")
    lens = [df[c].list.len() for c in columns]
    for c, n in zip(columns[1:], lens[1:]):
        bad = (n != lens[0]).fill_null(True)
        if bad.any():
            r = int(bad.arg_true()[0])
            raise MrtInputError(
                f"grouped layout: row {r} ({by}={df[by][r]!r}) has {lens[0][r]} {columns[0]!r} but {n[r]} {c!r}",
                column=c, row=r,
            )
    dup = df[by].is_duplicated()
    if dup.any():
        r = int(dup.arg_true()[0])
        raise MrtInputError(f"grouped layout: prompt {df[by][r]!r} has more than one row (first at row {r})",
                            pool=df[by][r], column=by, row=r)
    return df.explode(columns)


def implode(flat: pl.DataFrame, by: str, columns: list[str], scalars: list[str]) -> pl.DataFrame:
    """Flat kept rows -> grouped layout, pools in order of first appearance,
    candidates in row (pick) order."""
    return flat.group_by(by, maintain_order=True).agg(
        [pl.col(c).first() for c in scalars] + [pl.col(c) for c in columns]
    )


# --------------------------------------------------------------------------- tasks


def _to_polars(t: pa.Table) -> pl.DataFrame:
    # tensors held in Ray's extension type become fixed-size lists
    cols = []
    for name, col in zip(t.column_names, t.columns):
        if isinstance(col.type, pa.ExtensionType):
            col = pa.chunked_array([c.storage for c in col.chunks], type=col.type.storage_type)
        cols.append((name, col))
    return pl.from_arrow(pa.table(dict(cols)))  # type: ignore[return-value]


def _maybe_fail(marker: str | None) -> None:
    if not marker:
        return
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.close(fd)
    raise InjectedFault(f"injected fault (first attempt; marker {marker})")


def _select_frame(df: pl.DataFrame, k: int, method: str, opts: dict) -> pl.DataFrame:
    from .select import SmallPoolWarning, select as local_select

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SmallPoolWarning)
        return local_select(df, k, method, **opts)


class _SelectBucket:
    """One bucket (many whole pools): dataset order back, one batch selection."""

    def __init__(self, k: int, method: str, opts: dict, fault: str | None):
        self.k, self.method, self.opts, self.fault = k, method, opts, fault
        self.__name__ = "select_bucket"

    def __call__(self, t: pa.Table) -> pa.Table:
        _maybe_fail(self.fault)
        df = _to_polars(t)
        if df.height == 0:
            return t.drop_columns([_BUCKET, _ORDER]).slice(0, 0)
        df = df.sort(_ORDER).drop(_BUCKET, _ORDER)
        return _select_frame(df, self.k, self.method, self.opts).to_arrow()


class _SelectGrouped:
    """A block of grouped rows (whole pools): explode, select, implode."""

    def __init__(self, k: int, method: str, opts: dict, fault: str | None):
        self.k, self.method, self.opts, self.fault = k, method, opts, fault
        self.__name__ = "select_grouped"

    def __call__(self, t: pa.Table) -> pa.Table:
        _maybe_fail(self.fault)
        by = self.opts.get("by", "prompt_id")
        df = _to_polars(t)
        cand = _candidate_columns(t.schema, by)
        scalars = [c for c in df.columns if c not in cand and c != by]
        flat = explode(df, by, cand)
        kept = _select_frame(flat, self.k, self.method, self.opts)
        added = [c for c in kept.columns if c not in flat.columns]
        return implode(kept, by, cand + added, scalars).select(df.columns + added).to_arrow()


def _tag(by: str, n_buckets: int):
    def tag(t: pa.Table) -> pa.Table:
        from ._tables import pool_keys

        ids = pl.from_arrow(t.column(by))
        if isinstance(ids, pl.DataFrame):
            ids = ids.to_series()
        if ids.null_count():
            first = int(ids.is_null().arg_true()[0])
            raise MrtInputError(f"column {by!r} has {ids.null_count()} null prompt id(s)", column=by, row=first)
        b = (pool_keys(ids) % np.uint64(n_buckets)).astype(np.int32)
        return t.append_column(_BUCKET, pa.array(b))

    return tag


# --------------------------------------------------------------------------- checks


def _empty_like(schema: pa.Schema) -> pl.DataFrame:
    return _to_polars(schema.empty_table())


def _check_select_args(schema: pa.Schema, layout: str, k: int, method: str, opts: dict) -> None:
    """Run `mrt_fast.select`'s own checks on an empty table of this schema, so
    bad arguments and missing columns fail here with the local message."""
    from .select import select as local_select

    df = _empty_like(schema)
    if layout == "grouped":
        by = opts.get("by", "prompt_id")
        if by not in df.columns:
            from ._tables import require

            require(df.columns, by, "prompt id")
        df = df.explode(_candidate_columns(schema, by)) if _candidate_columns(schema, by) else df
    try:
        local_select(df, k, method, **opts)
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
    k: int,
    method: str = "grades",
    *,
    layout: str = "auto",
    n_buckets: int | None = None,
    shuffle: str = "sort",
    max_retries: int = 3,
    fault_once: str | None = None,
    **options: Any,
):
    """Keep K candidates per prompt of a Ray Dataset; returns a lazy
    `ray.data.Dataset` of the kept rows (with ``pick_rank`` and, by method,
    ``gain`` / ``weight``, as `mrt_fast.select` adds them).

    `options` are those of `mrt_fast.select` (``by``, ``embedding``, ``reward``,
    ``mode``, ``alpha``, ``eps``, ``k_max``, ``kernel``, ``seed``,
    ``candidate_key``, ``optimizer``). ``layout`` is ``"flat"``, ``"grouped"``
    or ``"auto"`` (see `layout_of`). ``n_buckets`` (flat layout) overrides the
    bucket count, by default ``max(cluster CPUs, rows / 1e6)``.

    Per pool, the kept rows and their order are those of `mrt_fast.select`
    on the dataset's rows in dataset order. The output holds the pools bucket
    by bucket (flat) or block by block (grouped), each bucket's pools in order
    of first appearance.

    ``fault_once`` (or the ``MRT_RAY_FAULT_ONCE`` environment variable of the
    driver) names a marker file: the first selection task that creates it
    raises a `TransientTaskError`, which Ray retries; the output is unchanged.
    Bad arguments and missing columns raise `MrtInputError` here, before any
    task runs; bad values found by a task raise the same `MrtInputError`.
    """
    ray = _ray()
    from ray.data.expressions import monotonically_increasing_id

    if "return_report" in options:
        raise MrtInputError("return_report is not available on a Dataset: the report is per bucket")
    fault = fault_once if fault_once is not None else os.environ.get(FAULT_ENV) or None
    schema = _schema(ds)
    by = options.get("by", "prompt_id")
    lay = _layout(schema, layout, options)
    _check_select_args(schema, lay, k, method, options)
    _own_context(ds)
    with _quiet_remote_args():
        if lay == "grouped":
            return ds.map_batches(
                _SelectGrouped(k, method, dict(options), fault), batch_size=None, batch_format="pyarrow",
                zero_copy_batch=True, compute=ray.data.TaskPoolStrategy(), **_retry_args(max_retries),
            )
        nb = _n_buckets(ds, n_buckets)
        tagged = ds.with_column(_ORDER, monotonically_increasing_id()).map_batches(
            _tag(by, nb), batch_size=None, batch_format="pyarrow", zero_copy_batch=True
        )
        tagged.context.shuffle_strategy = _shuffle_strategy(shuffle)
        return tagged.groupby(_BUCKET, num_partitions=nb).map_groups(
            _SelectBucket(k, method, dict(options), fault), batch_format="pyarrow",
            compute=ray.data.TaskPoolStrategy(), **_retry_args(max_retries),
        )


def _own_context(ds) -> None:
    """Keep the dataset order (the row-order ids follow it) and let a UDF's
    own exception (an `MrtInputError`) through instead of Ray's wrapper."""
    ctx = ds.context
    ctx.execution_options.preserve_order = True
    ctx.raise_original_map_exception = True


def _shuffle_strategy(shuffle: str):
    from ray.data.context import ShuffleStrategy

    table = {"sort": ShuffleStrategy.SORT_SHUFFLE_PULL_BASED, "hash": ShuffleStrategy.HASH_SHUFFLE,
             "v2": ShuffleStrategy.SHUFFLE_V2}
    if shuffle not in table:
        raise MrtInputError(f"shuffle must be one of {sorted(table)}, got {shuffle!r}")
    return table[shuffle]


def _layout(schema: pa.Schema, layout: str, options: dict, loss: str = "loss") -> str:
    if layout not in ("auto", "flat", "grouped"):
        raise MrtInputError(f"layout must be 'auto', 'flat' or 'grouped', got {layout!r}")
    if layout != "auto":
        return layout
    keys = {k: options[k] for k in ("by", "embedding", "reward", "mode") if k in options}
    return layout_of(schema, loss=loss, **keys)


def collect(ds: Any) -> pl.DataFrame:
    """The rows of a (small) Dataset as one polars frame, `MrtInputError`s
    from tasks raised as themselves."""
    with _Unwrapping():
        t = ds.to_arrow_refs()
        ray = _ray()
        tables = ray.get(t)
    tables = [x for x in tables if x.num_rows] or tables[:1]
    return _to_polars(pa.concat_tables(tables, promote_options="default")) if tables else pl.DataFrame()


def run(ds: Any):
    """Execute a lazy Dataset into a `MaterializedDataset`, raising task
    `MrtInputError`s as themselves."""
    with _Unwrapping():
        return ds.materialize()


class _Fold:
    def __init__(self, by: str, loss: str, grouped: bool):
        self.by, self.loss, self.grouped = by, loss, grouped
        self.__name__ = "fold_variance"

    def __call__(self, t: pa.Table) -> pa.Table:
        from .variance import VarianceAccumulator, _loss_column

        df = _to_polars(t.select([self.by, self.loss]))
        if self.grouped:
            df = explode(df, self.by, [self.loss])
        x = _loss_column(df, self.loss)
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
    loss_bound, n_boot, seed, ci_level, bootstrap)."""
    _ray()
    from ._tables import require
    from .variance import VarianceAccumulator, report_from_accumulator

    schema = _schema(ds)
    cols = list(schema.names)
    require(cols, by, "prompt id")
    require(cols, loss, "loss")
    lay = _layout(schema, layout, {"by": by}, loss=loss)
    # argument checks before any task runs (on a two-prompt stand-in)
    probe = VarianceAccumulator().update(np.array([0, 0, 1, 1]), np.array([0.0, 1.0, 0.0, 2.0]))
    report_from_accumulator(probe, **{**options, "n_boot": 0})
    _own_context(ds)
    with _quiet_remote_args():
        parts = ds.map_batches(_Fold(by, loss, lay == "grouped"), batch_size=None, batch_format="pyarrow",
                               zero_copy_batch=True, **_retry_args())
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
