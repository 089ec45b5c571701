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
and a row-order id; the rows reach their bucket's task through Ray Data's
shuffle keyed by bucket (a few dozen keys, not millions; `select`) or, in the
file jobs (`select_dataset`), as Arrow IPC pieces each read task writes per
bucket; each bucket task puts its rows back in dataset order and selects all
its pools with one call of the Rust batch selector. Grouped rows are already
whole pools: they are selected where they are read, with no shuffle at all.
The file jobs write the local engine's parts and manifest (`mrt_fast.datasets.local`,
`mrt_fast.datasets.manifest`), so a job resumes on either engine.

Ray is imported on first use (the ``ray`` extra: ``pip install 'mrt_fast[ray]'``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from mrt_fast._util.object_store import object_store_error
from mrt_fast.errors import InjectedFault, MrtInputError, MrtResourceError, TransientTaskError
from mrt_fast.datasets import storage
from mrt_fast.tables.layouts import check_layout, detect, explode, list_depth
from mrt_fast.selection.report import SelectionReport

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

#: environment variable naming a marker file: the first bucket task that
#: creates it raises `InjectedFault` (the test hook for retries; see `select`)
FAULT_ENV = "MRT_RAY_FAULT_ONCE"

_BUCKET = "__mrt_bucket"
_ORDER = "__mrt_order"
#: rows per bucket aimed at when sizing the bucket count from the data
ROWS_PER_BUCKET = 1_000_000


# --------------------------------------------------------------------------- ray


def _ray():
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "mrt_fast.datasets.ray_engine needs Ray Data: pip install 'mrt_fast[ray]' " f"({e})"
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
    kwargs.setdefault("logging_level", logging.WARNING)  # "Started a local Ray instance" and the like: to the log
    ray.init(address=address, **kwargs)


def quiet_console() -> str | None:
    """Send Ray Data's information lines and progress bars to its log file only (the job
    shows its own progress and summary); warnings and errors still reach the terminal.
    Returns the Ray session's log directory (:func:`log_file`)."""
    import ray.data

    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    with contextlib.suppress(AttributeError):
        ctx.print_on_execution_start = False
    for name in ("ray.data", "ray"):
        for h in logging.getLogger(name).handlers:
            if not isinstance(h, logging.FileHandler) and type(h).__name__ != "SessionFileHandler":
                h.setLevel(max(h.level, logging.WARNING))
    return log_file()


def log_file() -> str | None:
    """The log directory of this driver's Ray session (tasks, workers, nodes, and Ray Data
    under ``ray-data/``); None before ``init`` or when Ray does not say."""
    try:
        from ray._private import worker  # not public: without it the summary names no directory

        node = worker._global_node
        return None if node is None else node.get_logs_dir_path()
    except Exception:  # noqa: BLE001
        return None


def _unwrap(e: BaseException) -> BaseException:
    """The user's exception inside Ray's task-error wrappers (or `e` itself).
    Ray's wrapper of a task's `MrtInputError` is itself an instance of it (a
    class deriving from both), so the wrapper is looked through too."""
    seen = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, (MrtInputError, MrtResourceError)) and not _is_ray_wrapper(cur):
            return cur
        nxt = getattr(cur, "cause", None)
        if not isinstance(nxt, BaseException):
            nxt = cur.__cause__ or cur.__context__
        cur = nxt
    return e


def _is_ray_wrapper(e: BaseException) -> bool:
    """Whether ``e`` is one of Ray's errors (a task error wrapping the task's own)."""
    return any(c.__module__.startswith("ray.") for c in type(e).__mro__)


class _Unwrapping:
    """Re-raise an `MrtInputError` from inside Ray's task errors as itself,
    with its own first line (Ray appends its retry advice to the message)."""

    def __enter__(self):
        return self

    def __exit__(self, et, ev, tb):
        if ev is None or (isinstance(ev, (MrtInputError, MrtResourceError)) and not _is_ray_wrapper(ev)):
            return False
        inner = _unwrap(ev)
        if isinstance(inner, MrtInputError):
            first = (str(inner).strip().splitlines() or [""])[0]
            raise MrtInputError(first, pool=inner.pool, column=inner.column, row=inner.row) from None
        if isinstance(inner, MrtResourceError):  # a full disk in a task
            raise MrtResourceError((str(inner).strip().splitlines() or [""])[0], path=inner.path) from None
        lost = object_store_error(ev)  # Ray's object store lost or full
        if lost is not None:
            raise lost from None
        return False


class _QuietInputErrors(logging.Filter):
    """Drop Ray Data's log record of a task that failed on bad input (the
    traceback it prints before the job raises that `MrtInputError` itself)."""

    def filter(self, record: logging.LogRecord) -> bool:
        ev = record.exc_info[1] if record.exc_info else None
        return not (ev is not None and isinstance(_unwrap(ev), (MrtInputError, MrtResourceError)))

    def __enter__(self):
        self._handlers = [h for name in ("ray.data", "ray") for h in logging.getLogger(name).handlers]
        for h in self._handlers:
            h.addFilter(self)
        return self

    def __exit__(self, *exc):
        for h in self._handlers:
            h.removeFilter(self)
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
    else ``"flat"`` (:func:`mrt_fast.tables.layouts.detect`)."""
    if by in schema.names and list_depth(schema.field(by).type):
        raise MrtInputError(f"column {by!r} (prompt id) holds lists; in the grouped layout it holds one id per row")
    return detect(schema, {embedding: 1, reward: 0, mode: 0, loss: 0})


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
        _maybe_fail(self.fault)
        df = _to_polars(t)
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
        _maybe_fail(self.fault)
        return _select_frame(_to_polars(t), self.opts).to_arrow()


# --------------------------------------------------------------------------- checks


def _empty_like(schema: pa.Schema) -> pl.DataFrame:
    return _to_polars(schema.empty_table())


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
    ds = _own_context(ds)
    with _quiet_remote_args():
        if lay == "grouped":
            return ds.map_batches(
                _SelectGrouped(opts.replace(layout="grouped"), fault), batch_size=None, batch_format="pyarrow",
                zero_copy_batch=True, compute=ray.data.TaskPoolStrategy(), **_retry_args(max_retries),
            )
        nb = _n_buckets(ds, n_buckets)
        tagged = ds.with_column(_ORDER, monotonically_increasing_id()).map_batches(
            _tag_job(by, nb, None), batch_size=None, batch_format="pyarrow", zero_copy_batch=True
        )
        tagged.context.shuffle_strategy = _shuffle_strategy(shuffle)
        return tagged.groupby(_BUCKET, num_partitions=nb).map_groups(
            _SelectBucket(opts.replace(layout="flat", candidate_columns=None), fault), batch_format="pyarrow",
            compute=ray.data.TaskPoolStrategy(), **_retry_args(max_retries),
        )


def _own_context(ds):
    """`ds` with a context of its own (a dataset and those derived from it
    share one: the caller's is left alone) that keeps the dataset order (the
    row-order ids follow it) and lets a UDF's own exception (an
    `MrtInputError`) through instead of Ray's wrapper."""
    ray = _ray()
    ds = ray.data.Dataset.copy(ds, _deep_copy=True)
    ctx = ds.context
    ctx.execution_options.preserve_order = True
    ctx.raise_original_map_exception = True
    return ds


def _shuffle_strategy(shuffle: str):
    from ray.data.context import ShuffleStrategy

    table = {"sort": ShuffleStrategy.SORT_SHUFFLE_PULL_BASED, "hash": ShuffleStrategy.HASH_SHUFFLE,
             "v2": ShuffleStrategy.SHUFFLE_V2}
    if shuffle not in table:
        raise MrtInputError(f"shuffle must be one of {sorted(table)}, got {shuffle!r}")
    return table[shuffle]


def _layout(schema: pa.Schema, layout: str, options: dict, loss: str = "loss") -> str:
    layout = check_layout(layout)
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
        from mrt_fast.variance.law import VarianceAccumulator, loss_column

        df = _to_polars(t.select([self.by, self.loss]))
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
    _ray()
    from mrt_fast.tables.arrays import require
    from mrt_fast.variance.law import VarianceAccumulator, report_from_accumulator

    schema = _schema(ds)
    cols = list(schema.names)
    require(cols, by, "prompt id")
    require(cols, loss, "loss")
    lay = _layout(schema, layout, {"by": by}, loss=loss)
    # argument checks before any task runs (on a two-prompt stand-in)
    probe = VarianceAccumulator().update(np.array([0, 0, 1, 1]), np.array([0.0, 1.0, 0.0, 2.0]))
    report_from_accumulator(probe, **{**options, "n_boot": 0})
    ds = _own_context(ds)
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


# --------------------------------------------------------------------------- dataset jobs (files in, parts out)


def read(source: Any, columns: list[str] | None = None, *, allow_partial: bool = False):
    """A Ray Dataset over the files of a source (a file, a directory of
    Parquet/JSONL files or a glob, found as `mrt_fast.datasets.sources.discover` finds
    them, an unfinished ``mrt`` output only with ``allow_partial``), rows in the same
    order: files sorted by path, then row order."""
    ray = _ray()
    from mrt_fast.datasets import hf_disk, json_text
    from mrt_fast.datasets import sources as _sources
    src = source if isinstance(source, _sources.Dataset) else _sources.discover(source, allow_partial=allow_partial)
    files = [str(f) for f in src.files]
    if src.fmt == "parquet":
        fs = {"filesystem": storage.filesystem()} if src.files and storage.is_url(src.files[0]) else {}
        return ray.data.read_parquet(files, columns=columns, shuffle=None, **fs)
    # text formats are parsed by polars in the tasks, file by file, as the
    # local engine parses them (the Arrow readers infer other types and round
    # some decimals differently)
    schema = src.scan().collect_schema()
    fmt = src.fmt
    by_name = {str(f): f for f in src.files}

    def read_files(t: pa.Table) -> pa.Table:
        out = []
        for f in t.column("path").to_pylist():
            if fmt == "jsonl":
                df = json_text.scan_json(by_name[f], schema).collect()
            elif fmt == hf_disk.FORMAT:
                df = src.scan_file(Path(f)).collect()
            else:
                df = pl.read_csv(f, schema=schema)
            out.append(df.to_arrow())
        return pa.concat_tables(out)

    ds = ray.data.from_items([{"path": f} for f in files], override_num_blocks=len(files))
    ds = ds.map_batches(read_files, batch_size=1, batch_format="pyarrow")
    return ds.select_columns(columns) if columns else ds


_last_stats: str | None = None
#: where the "files" exchange puts the bucket pieces (inside the output directory)
SPILL_DIR = "_spill"


def last_job_stats() -> str | None:
    """Ray Data's per-stage statistics of the last `select_dataset` run in
    this process (wall and CPU time of reading, tagging, the shuffle and the
    bucket tasks), or None."""
    return _last_stats


class _BucketToPart:
    """One bucket of a job: its rows back in input order, `batch.select_frame`
    (the local engine's own), part ``i`` written atomically; returns one row
    of counts (or, for a file output, the kept rows with their pool's first row)."""

    def __init__(self, opts: Any, out_dir: str | None, fault: str | None):
        self.opts, self.out_dir, self.fault = opts, out_dir, fault
        self.__name__ = "select_bucket_to_part"

    def __call__(self, t: pa.Table) -> pa.Table:
        from mrt_fast.datasets.local import ROW, select_frame

        _maybe_fail(self.fault)
        df = _to_polars(t)
        i = int(df[_BUCKET][0])
        kept, rep = select_frame(df.drop(_BUCKET).rename({_ORDER: ROW}), self.opts, first=self.out_dir is None)
        return _part_result(i, kept, rep, self.out_dir)


def _part_result(i: int, kept: pl.DataFrame, rep: Any, out_dir: str | None) -> pa.Table:
    """What a bucket task returns: part ``i`` written (one row of counts), or, for a
    file output, the kept rows themselves."""
    from mrt_fast.datasets.job import write_part

    if out_dir is None:
        return kept.to_arrow()
    return _part_stats(i, write_part(kept, out_dir, i), rep)


def _part_stats(i: int, n: int, rep: Any) -> pa.Table:
    """One row of what part `i` did (`n` rows written; `rep` its selection report), summed by the driver."""
    r = rep.approximation_ratio
    return pa.table({
        "part": [i], "rows": [n], "pools": [rep.n_pools], "candidates": [rep.n_candidates],
        "small": [rep.n_small_pools], "missed": [rep.modes_missed],
        "ratio_sum": [float(np.sum(r)) if r is not None else 0.0], "ratio_n": [0 if r is None else len(r)],
        **{f: [int(getattr(rep, f))] for f in SelectionReport.COUNTS},
    })


class _GroupedPart:
    """Part ``i`` of a grouped job: input rows ``[i * per, (i + 1) * per)``, read
    by the task itself, selected and written (as the local engine does)."""

    def __init__(self, source: Any, opts: Any, lists: list[str], per: int, out_dir: str | None, fault: str | None):
        self.source, self.opts, self.lists, self.per = source, opts, lists, per
        self.out_dir, self.fault = out_dir, fault
        self.__name__ = "select_grouped_part"

    def __call__(self, t: pa.Table) -> pa.Table:
        from mrt_fast.datasets.local import select_frame, write_part

        _maybe_fail(self.fault)
        outs = []
        for i in t.column("part").to_pylist():
            df = self.source.scan().slice(i * self.per, self.per).collect()
            kept, rep = select_frame(df, self.opts, layout="grouped", list_columns=self.lists)
            if self.out_dir is None:
                outs.append(kept.with_columns(pl.lit(i).alias("__part")).to_arrow())
                continue
            n = write_part(kept, self.out_dir, i)
            outs.append(_part_stats(i, n, rep))
        return pa.concat_tables(outs)


def _piece_path(spill: str, bucket: int, first: int) -> Path:
    return Path(spill) / f"b{bucket:05d}" / f"o{first:020d}.arrow"


class _SplitToFiles:
    """A block of rows (with their row-order ids) cut by bucket into Arrow IPC
    pieces ``spill/bNNNNN/o<first row id>.arrow``, each written under a temp
    name and renamed: a retried task rewrites the same pieces."""

    def __init__(self, spill: str, by: str, n_buckets: int, todo: set[int] | None):
        self.spill, self.by, self.n, self.todo = spill, by, n_buckets, todo
        self.__name__ = "split_by_bucket"

    def __call__(self, t: pa.Table) -> pa.Table:
        import pyarrow.ipc as ipc

        if t.num_rows == 0:
            return pa.table({"rows": pa.array([0], pa.int64())})
        t = _tag_job(self.by, self.n, None)(t)
        b = t.column(_BUCKET).to_numpy()
        t = t.drop_columns([_BUCKET])
        first = int(t.column(_ORDER)[0].as_py())
        order = np.argsort(b, kind="stable")
        cuts = np.searchsorted(b[order], np.arange(self.n + 1))
        for i in np.flatnonzero(np.diff(cuts)):
            if self.todo is not None and int(i) not in self.todo:
                continue
            piece = t.take(pa.array(order[cuts[i]:cuts[i + 1]]))
            if storage.is_url(self.spill):  # one PUT: the piece appears whole or not at all
                sink = pa.BufferOutputStream()
                with ipc.new_file(sink, piece.schema) as w:
                    w.write_table(piece)
                storage.write_bytes(storage.join(self.spill, f"b{int(i):05d}", f"o{first:020d}.arrow"),
                                    sink.getvalue().to_pybytes())
                continue
            path = _piece_path(self.spill, int(i), first)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            with ipc.new_file(str(tmp), piece.schema) as w:
                w.write_table(piece)
            os.replace(tmp, path)
        return pa.table({"rows": pa.array([t.num_rows], pa.int64())})


#: input rows read by one task of the "files" exchange
ROWS_PER_READ_TASK = 500_000


def _row_ranges(src: Any, counts: list[int] | None) -> list[dict]:
    """The read tasks of a job: (file, first row, rows, global row of the first),
    at most `ROWS_PER_READ_TASK` rows each for Parquet (row counts from the
    footers); one task per file for text formats."""
    out = []
    start = 0
    for j, f in enumerate(src.files):
        if counts is None:
            out.append({"file": j, "offset": 0, "rows": -1, "start": -1})
            continue
        n = counts[j]
        for a in range(0, n, ROWS_PER_READ_TASK):
            m = min(ROWS_PER_READ_TASK, n - a)
            out.append({"file": j, "offset": a, "rows": m, "start": start + a})
        start += n
    return out


class _ReadAndSplit(_SplitToFiles):
    """A read task of the "files" exchange: rows ``[offset, offset + rows)`` of
    one file, read with polars (as the local engine reads them), their global
    row index added, cut by bucket into pieces."""

    def __init__(self, src: Any, spill: str, by: str, n_buckets: int, todo: set[int] | None):
        super().__init__(spill, by, n_buckets, todo)
        self.src = src
        self.__name__ = "read_and_split"

    def __call__(self, t: pa.Table) -> pa.Table:
        from mrt_fast._util import messages as _messages
        from mrt_fast.datasets import sources as _sources
        d = t.to_pylist()[0]
        f = self.src.files[d["file"]]
        one = _sources.Dataset(str(f), [f], self.src.fmt, self.src.hive, self.src.root)
        try:
            lf = one.scan()
            if d["rows"] >= 0:
                lf = lf.slice(d["offset"], d["rows"])
            df = lf.collect()
        except MrtInputError:
            raise
        except Exception as e:  # noqa: BLE001 - name the file
            raise MrtInputError(f"cannot read {str(f)!r}: {_messages.one_line(e)}") from None
        if d["start"] >= 0:
            row = np.arange(d["start"], d["start"] + df.height, dtype=np.int64)
        else:  # text formats: the file index in the high bits keeps the order
            row = (np.int64(d["file"]) << np.int64(36)) + np.arange(df.height, dtype=np.int64)
        tb = df.to_arrow().append_column(_ORDER, pa.array(row))
        return super().__call__(tb)


class _FilesToPart:
    """Bucket tasks of the "files" exchange: a bucket's pieces read back,
    selected with `batch.select_frame` and written as its part."""

    def __init__(self, opts: Any, spill: str, out_dir: str | None, fault: str | None):
        self.opts, self.spill, self.out_dir, self.fault = opts, spill, out_dir, fault
        self.__name__ = "select_bucket_to_part"

    def __call__(self, t: pa.Table) -> pa.Table:
        import pyarrow.ipc as ipc

        _maybe_fail(self.fault)
        outs = []
        for i in t.column("part").to_pylist():
            if storage.is_url(self.spill):
                files = [f for f in storage.list_files(storage.join(self.spill, f"b{i:05d}"))
                         if f.name.startswith("o") and f.suffix == ".arrow"]
            else:
                files = sorted((Path(self.spill) / f"b{i:05d}").glob("o*.arrow"))
            if not files:
                continue
            tables = []
            for f in files:
                with ipc.open_file(storage.open_input(f) if storage.is_url(f) else str(f)) as r:
                    tables.append(r.read_all())
            tb = pa.concat_tables(tables).append_column(_BUCKET, pa.array(np.full(sum(x.num_rows for x in tables),
                                                                                   i, dtype=np.int32)))
            outs.append(_BucketToPart(self.opts, self.out_dir, None)(tb))
        if not outs:
            return pa.table({"part": pa.array([], pa.int64())}) if self.out_dir else pa.table({})
        return pa.concat_tables(outs, promote_options="default")


#: input rows read by one task of the spilled exchange (tasks: at least one per CPU)
ROWS_PER_SPILL_TASK = 2_000_000


class _SpillRuns:
    """Read tasks of the "files" exchange over Parquet files that Arrow reads as polars
    would: task ``j`` cuts run ``j`` of row groups into the local engine's bucket files
    (:func:`mrt_fast.datasets.local.spill_run`, files ``bucket-NNNNN.j.arrow``);
    a retried task rewrites its own files."""

    def __init__(self, runs: list, spill: str, by: str, n_buckets: int):
        from mrt_fast._util.memory import spill_batch_rows
        from mrt_fast.datasets.local import spill_staging

        self.runs, self.spill, self.by, self.n = runs, spill, by, n_buckets
        self.batch_rows, self.staging = spill_batch_rows(n_buckets), spill_staging(n_buckets, 1)
        self.__name__ = "read_and_spill"

    def __call__(self, t: pa.Table) -> pa.Table:
        from mrt_fast.datasets.local import spill_run

        j = int(t.column("run")[0].as_py())
        nulls = spill_run(self.runs[j], Path(self.spill), self.n, self.by, j, self.batch_rows, self.staging)
        return pa.table({"rows": [sum(p.rows for p in self.runs[j])], "nulls": [nulls]})


class _SpilledBucketToPart:
    """Bucket tasks over the local engine's bucket files: the local engine's own read
    (rows back in input order, embeddings in one matrix) and selection, part ``i`` written."""

    def __init__(self, src: Any, opts: Any, schema: pl.Schema, spill: str, out_dir: str | None, fault: str | None):
        self.src, self.opts, self.spill, self.out_dir, self.fault = src, opts, spill, out_dir, fault
        self.schema = schema
        self.__name__ = "select_bucket_to_part"

    def __call__(self, t: pa.Table) -> tuple[pa.Table | None, pa.Table | None]:
        """(the kept rows for a file output, else None; one row of counts per part done, or None)."""
        from mrt_fast.datasets.job import write_part
        from mrt_fast.datasets.local import ROW, _select_rows, read_bucket

        _maybe_fail(self.fault)
        empty = pl.Schema({ROW: pl.get_index_type(), **dict(self.schema)})
        emb = self.opts.embedding if self.opts.uses_embedding(list(self.schema.names())) else None
        kept_rows, counts = [], []
        for i in t.column("part").to_pylist():
            df = read_bucket(Path(self.spill), i, empty, emb)
            if df.height == 0:
                continue
            kept, rep = _select_rows(df, self.opts, self.src, first=self.out_dir is None)
            if self.out_dir is None:
                kept_rows.append(kept.to_arrow())
                counts.append(_part_stats(i, kept.height, rep))
            else:
                counts.append(_part_stats(i, write_part(kept, self.out_dir, i), rep))
        return (pa.concat_tables(kept_rows, promote_options="default") if kept_rows else None,
                pa.concat_tables(counts) if counts else None)


def _timed(fn: Any, arg: Any) -> tuple[Any, float, float]:
    """``fn(arg)`` in a task, with the task's wall and CPU seconds (every thread of its process)."""
    t, c = time.perf_counter(), time.process_time()
    out = fn(arg)
    return out, time.perf_counter() - t, time.process_time() - c


def _run_tasks(name: str, fn: Any, args: list, on_result: Any, max_retries: int) -> str:
    """``fn(a)`` for every ``a`` of ``args`` as Ray tasks of one CPU each (a lost worker or node,
    and a `TransientTaskError`, retried), ``on_result`` called in the driver as each one ends;
    returns the stage's line of statistics in Ray Data's form (``last_job_stats``)."""
    ray = _ray()
    task = ray.remote(num_cpus=1, **_retry_args(max_retries))(_timed)
    t0 = time.perf_counter()
    fn_ref = ray.put(fn)
    pending = [task.remote(fn_ref, a) for a in args]
    walls: list[float] = []
    cpus: list[float] = []
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        for ref in done:
            out, w, c = ray.get(ref)
            walls.append(w)
            cpus.append(c)
            on_result(out)
    wall = time.perf_counter() - t0

    def line(what: str, xs: list[float]) -> str:
        xs = xs or [0.0]
        return (f"* Remote {what} time: {min(xs):.3f}s min, {max(xs):.3f}s max, {sum(xs) / len(xs):.3f}s mean, "
                f"{sum(xs):.3f}s total")

    return "\n".join([f"Operator 1 {name}: {len(args)} tasks executed, {len(args)} blocks produced in {wall:.3f}s",
                      line("wall", walls), line("cpu", cpus)])


def _spill_runs(src: Any, n_rows: int, cpus: int) -> list | None:
    """The runs of row groups the read tasks spill, or None when the local engine's
    spill cannot read the input (text formats, hive folders, files Arrow reads otherwise
    than polars, more rows than polars' row index holds)."""
    from mrt_fast.datasets.arrow_runs import arrow_schema, plan_runs
    from mrt_fast.datasets.local import pa_index_type

    if arrow_schema(src) is None or (pa_index_type() == np.uint32 and n_rows >= 2**32):
        return None
    return plan_runs(src, max(cpus, -(-n_rows // ROWS_PER_SPILL_TASK))) or None


def _tag_job(by: str, n_buckets: int, todo: set[int] | None):
    """A map adding each row's bucket (`batch.bucket_of`: pool key % n), keeping
    only the rows of the buckets in `todo` (all when None)."""

    def tag(t: pa.Table) -> pa.Table:
        from mrt_fast.datasets.local import bucket_of

        ids = pl.from_arrow(t.column(by))
        if isinstance(ids, pl.DataFrame):
            ids = ids.to_series()
        if ids.null_count():
            raise MrtInputError(f"column {by!r} has {ids.null_count()} null prompt id(s); give every row a prompt id",
                                column=by)
        b = bucket_of(ids, n_buckets).astype(np.int32)
        t = t.append_column(_BUCKET, pa.array(b))
        if todo is not None:
            t = t.filter(pa.array(np.isin(b, np.fromiter(todo, dtype=np.int32))))
        return t

    return tag


def select_dataset(
    source: Any,
    output: Any,
    k: int | str | None = None,
    method: str | None = None,
    *,
    options: Any = None,
    parts: int | None = None,
    rows_per_part: int | None = None,
    overwrite: bool = False,
    address: str | None = None,
    command: str | None = None,
    max_retries: int = 3,
    shuffle: str = "files",
    progress: Any = False,
    allow_partial: bool = False,
    **knobs: Any,
):
    """`mrt_fast.select_dataset` on Ray: the same input (file, directory, glob),
    the same selection (``options`` or ``k``, ``method`` and every keyword of
    `mrt_fast.select`, as `SelectOptions` holds them), the same output (a
    directory of ``part-NNNNN.parquet`` + the ``.mrt/`` manifest, or one file)
    and the same job (:class:`mrt_fast.datasets.job.Job`: lock, resume,
    checksums), the same parts as the local engine with the same part count.
    Flat layout: part ``i`` holds the pools of bucket ``i`` (``pool_key %
    n_parts``), selected by one Ray task; grouped layout: part ``i`` holds
    input rows ``[i r, (i + 1) r)``, read and selected by one task, nothing
    shuffled. ``parts``: the part count (default: from the data,
    ``max(cluster CPUs, rows / 1e6)``); ``rows_per_part``: parts of about
    this many input rows; a resumed job keeps its manifest's. ``address``:
    the Ray cluster (None: the current or a new local instance). ``shuffle``
    (flat layout): how rows reach their bucket's task: ``"files"`` (default:
    each read task writes its rows, cut by bucket, as Arrow IPC pieces under
    ``OUTPUT/_spill``; each bucket task reads its pieces: storage every worker
    sees, as the parts need anyway) or Ray Data's own shuffle (``"sort"``,
    ``"hash"``, ``"v2"``: through the object store, no shared storage).
    ``progress``: the job's display by input rows, as on the local engine;
    ``allow_partial``: read an unfinished ``mrt`` output's finished parts, as on the local engine.
    Returns a `mrt_fast.datasets.local.BatchReport`."""

    from mrt_fast.datasets import sources as _sources
    from mrt_fast.datasets.job import Job
    from mrt_fast.datasets.local import FIRST, BatchReport, _empty_output, list_columns, peak_rss, resolve_layout
    from mrt_fast.selection.options import SelectOptions

    t0 = time.perf_counter()
    opts = SelectOptions.of(k, method, options, **knobs)
    if parts is not None and rows_per_part is not None:
        raise MrtInputError("give parts or rows_per_part, not both")
    if rows_per_part is not None and (isinstance(rows_per_part, bool) or not isinstance(rows_per_part, int)
                                      or rows_per_part < 1):
        raise MrtInputError(f"rows_per_part must be an integer >= 1, got {rows_per_part!r}")
    if parts is not None:
        _n_buckets(None, parts)
    fault = os.environ.get(FAULT_ENV) or None
    src = _sources.discover(source, allow_partial=allow_partial)
    names = list(src.file_schemas()[0].names()) + _sources.hive_columns(src)
    schema = src.check_columns(opts.needed(names))
    lay = resolve_layout(opts, schema)
    lists = list_columns(opts, schema) if lay == "grouped" else None
    by = opts.by
    params = {**opts.parameters(), "layout": lay}
    cmd = command or f"ray_engine.select_dataset(k={opts.k}, method={opts.method!r})"
    with Job(src, output, params, overwrite=overwrite, command=cmd, what="select", progress=progress) as job:
        out, to_dir, man = job.out, job.to_dir, job.man
        state = job.state
        cleanup: list[Path] = []
        try:
            counts = src.row_counts()
            n_rows = sum(counts) if counts is not None else None
            rep = BatchReport(output=str(out), layout=lay, method=opts.method, k=opts.k, n_parts=0,
                              parts_done_now=0, n_input_rows=n_rows or 0, n_pools=0, n_candidates=0, n_kept=0,
                              n_small_pools=0, modes_missed=0, mean_ratio=None, spilled=lay == "flat",
                              resumed=state == "resume", already_done=state == "done", memory_limit=0, peak_rss=0,
                              seconds=0.0, engine="ray", notes=list(job.notes))
            if state == "done":
                rep.n_parts = man.n_parts if man is not None else 1
                rep.n_kept = rep.n_out_rows = job.rows_written
                rep.seconds = time.perf_counter() - t0
                return rep
            init(address)
            if job.progress.mode != "off":  # the job shows progress and a summary: Ray's own lines go to its log
                job.logs = rep.logs = quiet_console()
            ray = _ray()
            rds = None
            if n_rows is None:
                rds = read(src)
                n_rows = rds.count()
            if n_rows == 0:
                raise MrtInputError(f"{src.source!r} has no rows: there is nothing to select from")
            rep.n_input_rows = n_rows
            cpus = int(ray.cluster_resources().get("CPU", 1))
            if man is not None:
                nb = man.n_parts
            elif parts is not None:
                nb = int(parts)
            elif rows_per_part is not None:
                nb = -(-n_rows // rows_per_part)
            else:
                nb = max(cpus, -(-n_rows // ROWS_PER_BUCKET))
            per = None
            if lay == "grouped":
                nb = max(1, min(nb, n_rows))
                per = int(man.rows_per_part) if man is not None and man.rows_per_part else -(-n_rows // nb)
                nb = man.n_parts if man is not None else -(-n_rows // per)
            rep.n_parts, rep.workers = nb, cpus
            todo = job.start(nb, layout=lay, rows_per_part=per, n_rows=n_rows)
            man = job.man
            if lay == "grouped":
                from mrt_fast.datasets.job import rows_before

                job.progress.start(n_rows, rows_before(n_rows, per, nb, todo))
            else:  # the rows of the buckets done before are not known without reading them
                job.progress.start(n_rows if len(todo) == nb else None)

            def part_rows(i: int, candidates: int) -> int:
                return min(per, n_rows - i * per) if lay == "grouped" else candidates
            out_dir = str(out) if to_dir else None
            ratio = [0.0, 0]
            kept_tables = []
            stats: list[str] = []

            def account(t: pa.Table, written: bool = True) -> None:
                d = t.to_pydict()
                for j in range(t.num_rows):
                    if written:
                        job.record_written(d["part"][j], d["rows"][j])
                    job.progress.advance(part_rows(d["part"][j], d["candidates"][j]))
                    rep.n_pools += d["pools"][j]
                    rep.n_candidates += d["candidates"][j]
                    rep.n_small_pools += d["small"][j]
                    rep.modes_missed += d["missed"][j]
                    for f in SelectionReport.COUNTS:
                        setattr(rep, f, getattr(rep, f) + d[f][j])
                    ratio[0] += d["ratio_sum"][j]
                    ratio[1] += d["ratio_n"][j]

            with _Unwrapping(), _QuietInputErrors(), _quiet_remote_args():
                if lay == "grouped":
                    parts = ray.data.from_items([{"part": i} for i in todo], override_num_blocks=max(1, len(todo)))
                    parts = _own_context(parts)
                    res = parts.map_batches(_GroupedPart(src, opts, lists, per, out_dir, fault), batch_size=1,
                                            batch_format="pyarrow", **_retry_args(max_retries))
                else:
                    from ray.data.expressions import monotonically_increasing_id

                    todo_set = None if len(todo) == nb else set(todo)
                    if shuffle == "files" and job.remote:  # the exchange under the output's prefix
                        spill = storage.join(out, SPILL_DIR) if to_dir else storage.join(
                            out.rpartition("/")[0], f".{out.rpartition('/')[2]}.spill-{os.getpid()}-{time.time_ns()}")
                        storage.delete(storage.list_files(spill))
                        cleanup.append(spill)
                    elif shuffle == "files":
                        spill = (out / SPILL_DIR) if to_dir else Path(tempfile.mkdtemp(
                            prefix=f".{out.name}.spill-", dir=out.parent if str(out.parent) else "."))
                        shutil.rmtree(spill, ignore_errors=True)
                        spill.mkdir()
                        cleanup.append(spill)
                    # local (shared) storage: the read tasks spill as the local engine does
                    runs = _spill_runs(src, n_rows, cpus) if shuffle == "files" and not job.remote \
                        and counts is not None else None
                    if shuffle == "files" and runs is not None:
                        # plain Ray tasks: a read task per run, then a task per bucket (Ray Data's
                        # executor would add its actors and backpressure to a job of a few dozen tasks)
                        nulls = [0]

                        def spilled(t: pa.Table) -> None:
                            nulls[0] += sum(t.column("nulls").to_pylist())

                        stats.append(_run_tasks("SpillRuns", _SpillRuns(runs, str(spill), by, nb),
                                                [pa.table({"run": [j]}) for j in range(len(runs))], spilled,
                                                max_retries))
                        if nulls[0]:
                            from mrt_fast.datasets.local import null_ids_error

                            raise null_ids_error(src, spill, nb, by, nulls[0])

                        def bucket_done(out: tuple) -> None:
                            kept_rows, counts = out
                            if kept_rows is not None:
                                kept_tables.append(kept_rows)
                            if counts is not None:
                                account(counts, written=to_dir)

                        stats.append(_run_tasks("SpilledBucketToPart",
                                                _SpilledBucketToPart(src, opts, schema, str(spill), out_dir, fault),
                                                [pa.table({"part": [i]}) for i in todo], bucket_done, max_retries))
                        res = None
                    elif shuffle == "files":
                        ranges = _row_ranges(src, counts)
                        items = ray.data.from_items(ranges, override_num_blocks=len(ranges))
                        items = _own_context(items)
                        split = items.map_batches(_ReadAndSplit(src, str(spill), by, nb, todo_set), batch_size=1,
                                                  batch_format="pyarrow", **_retry_args(max_retries))
                        for _ in split.iter_internal_ref_bundles():  # every piece written before any bucket is read
                            pass
                        stats.append(split.stats())
                        buckets = ray.data.from_items([{"part": i} for i in todo],
                                                      override_num_blocks=max(1, len(todo)))
                        buckets = _own_context(buckets)
                        res = buckets.map_batches(_FilesToPart(opts, str(spill), out_dir, fault), batch_size=1,
                                                  batch_format="pyarrow", **_retry_args(max_retries))
                    else:
                        rds = rds if rds is not None else read(src)
                        rds = _own_context(rds)
                        ordered = rds.with_column(_ORDER, monotonically_increasing_id())
                        tagged = ordered.map_batches(_tag_job(by, nb, todo_set), batch_size=None,
                                                     batch_format="pyarrow", zero_copy_batch=True)
                        tagged.context.shuffle_strategy = _shuffle_strategy(shuffle)
                        res = tagged.groupby(_BUCKET, num_partitions=nb).map_groups(
                            _BucketToPart(opts, out_dir, fault), batch_format="pyarrow", **_retry_args(max_retries))
                for ref in (res.iter_internal_ref_bundles() if res is not None else ()):
                    for block_ref in ref.block_refs:
                        t = ray.get(block_ref)
                        if t.num_rows == 0:
                            continue
                        if to_dir:
                            account(t)
                        else:
                            kept_tables.append(t)
                            if "__part" in t.column_names:
                                for i in set(t.column("__part").to_pylist()):
                                    job.progress.advance(part_rows(i, 0))
            global _last_stats
            try:
                if res is not None:
                    stats.append(res.stats())
                _last_stats = "\n".join(stats)
            except Exception:  # noqa: BLE001 - diagnostics only
                _last_stats = None
            if to_dir:
                for i in man.missing_parts(out):  # buckets no row went to
                    job.commit(i, _empty_output(src, opts, True))
                rep.n_kept = rep.n_out_rows = job.finish()
            else:
                kept = _to_polars(pa.concat_tables(kept_tables, promote_options="default")) if kept_tables \
                    else _empty_output(src, opts, False)
                if FIRST in kept.columns:
                    kept = kept.sort([FIRST, "pick_rank"]).drop(FIRST)
                elif "__part" in kept.columns:
                    kept = kept.sort("__part", maintain_order=True).drop("__part")
                rep.n_kept = rep.n_out_rows = job.write_file(kept)
            rep.parts_done_now = len(todo)
            rep.mean_ratio = ratio[0] / ratio[1] if ratio[1] else None
            rep.peak_rss = peak_rss()
            rep.seconds = time.perf_counter() - t0
            return rep
        finally:
            for d in cleanup:  # the spill, also when the job fails
                if storage.is_url(d):
                    storage.delete(storage.list_files(d))
                else:
                    shutil.rmtree(d, ignore_errors=True)


def _variance_budget_files(source: Any, *, by: str = "prompt_id", loss: str = "loss", address: str | None = None,
                            allow_partial: bool = False, layout: str = "auto", **options: Any):
    """`mrt_fast.variance_budget` over the files of a source on Ray: each block
    of the two columns folds into an accumulator, the driver merges them
    (either layout: grouped when the loss column holds lists)."""
    from mrt_fast.datasets import sources as _sources
    from mrt_fast.tables.layouts import GROUPED, detect
    src = source if isinstance(source, _sources.Dataset) else _sources.discover(source, allow_partial=allow_partial)
    schema = src.check_columns([(by, "prompt id"), (loss, "loss")])
    lay = detect(schema, {loss: 0}, layout)
    t = schema[loss]
    inner = t.inner if lay == GROUPED and isinstance(t, (pl.List, pl.Array)) else t
    if not inner.is_numeric():
        want = "a list of numbers (grouped layout)" if lay == GROUPED else "numeric"
        raise MrtInputError(f"column {loss!r} (loss) must be {want}, got {t}", column=loss)
    init(address)
    return variance_budget(read(src, columns=[by, loss]), by=by, loss=loss, layout=lay, **options)


# --------------------------------------------------------------------------- row stages on Ray


class _RowPartWorker:
    """A Ray actor running a row stage: ``make_stage()`` once (a model loaded once per worker), then
    for each part index of a batch, that part's input rows read, mapped and (for a directory) written."""

    def __init__(self, source: str, make_stage: Any, per: int, out_dir: str | None):
        import warnings

        from mrt_fast.datasets.sources import discover
        from mrt_fast.errors import PartialOutputWarning

        with warnings.catch_warnings():  # the driver refused an unfinished source, or was asked to read it
            warnings.simplefilter("ignore", PartialOutputWarning)
            self.ds = discover(source, allow_partial=True)
        self.stage = make_stage()
        self.per, self.out_dir = per, out_dir
        self.__name__ = "row_stage_part"

    def __call__(self, batch: dict) -> dict:
        from mrt_fast.datasets.job import write_part

        parts, rows, tables = [], [], []
        for i in batch["part"]:
            i = int(i)
            df = self.ds.scan().slice(i * self.per, self.per).collect()
            res = self.stage(df)
            if self.out_dir is not None:
                rows.append(write_part(res, self.out_dir, i))
            else:
                rows.append(res.height)
                tables.append(res.write_ipc(None).getvalue())
            parts.append(i)
        out = {"part": np.asarray(parts, dtype=np.int64), "rows": np.asarray(rows, dtype=np.int64)}
        if self.out_dir is None:
            out["ipc"] = np.asarray(tables, dtype=object)
        return out


def run_row_parts(job: Any, make_stage: Any, *, rows_per_part: int, n_rows: int, workers: int | None = None,
                  address: str | None = None, layout: str = "flat") -> dict[str, int]:
    """The Ray executor of a row-wise stage, the counterpart of
    :func:`mrt_fast.datasets.job.run_row_parts`: part ``i`` is input rows ``[i r, (i + 1) r)``,
    mapped by ``make_stage()`` (built once per worker) on a pool of ``workers`` actors (default: the
    cluster's CPUs); a directory's parts are written by the workers and recorded by the job, a
    file's rows gathered here; ``job.progress`` advances as parts come back. Returns
    ``{"parts", "parts_done_now", "rows_done_now", "rows_out"}``."""
    import io

    from mrt_fast.datasets.job import rows_before

    per = int(job.rows_per_part or rows_per_part)
    n_parts = job.n_parts or max(1, -(-n_rows // per))
    todo = job.start(n_parts, layout=layout, rows_per_part=per, n_rows=n_rows)
    done = {"parts": n_parts, "parts_done_now": len(todo), "rows_done_now": 0, "rows_out": 0}
    job.progress.start(n_rows, rows_before(n_rows, per, n_parts, todo))
    if not todo:
        if job.to_dir:
            job.finish()
        return done
    init(address)
    if job.progress.mode != "off":
        job.logs = quiet_console()
    ray = _ray()
    n_workers = max(1, min(len(todo), workers or int(ray.cluster_resources().get("CPU", 1))))
    out_dir = str(job.out) if job.to_dir else None
    results: dict[int, pl.DataFrame] = {}
    with _Unwrapping(), _QuietInputErrors(), _quiet_remote_args():
        items = ray.data.from_items([{"part": i} for i in todo], override_num_blocks=len(todo))
        mapped = items.map_batches(_RowPartWorker, batch_size=1, concurrency=n_workers, batch_format="numpy",
                                   fn_constructor_kwargs={"source": job.ds.source, "make_stage": make_stage,
                                                          "per": per, "out_dir": out_dir})
        for b in mapped.iter_batches(batch_size=None, batch_format="numpy"):
            for j, i in enumerate(b["part"]):
                done["rows_out"] += int(b["rows"][j])
                rows_in = min(per, n_rows - int(i) * per)
                done["rows_done_now"] += rows_in
                job.progress.advance(rows_in)
                if out_dir is not None:
                    job.record_written(int(i), int(b["rows"][j]))
                else:
                    results[int(i)] = pl.read_ipc(io.BytesIO(b["ipc"][j]))
    if job.to_dir:
        job.finish()
    else:
        job.write_file([results[i] for i in sorted(results)])
    return done
