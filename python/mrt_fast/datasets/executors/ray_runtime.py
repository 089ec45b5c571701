"""What every use of Ray here shares: starting or joining it, its console and log,
task retries, and the user's errors raised as themselves.

Ray is imported on first use (the ``ray`` extra: ``pip install 'mrt_fast[ray]'``).
A task's `MrtInputError` reaches the driver inside Ray's wrappers, with Ray's
retry advice appended: :class:`Unwrapping` raises it as itself, with its own
first line, and :class:`QuietInputErrors` drops Ray Data's log record of it.
Lost workers and nodes, and :class:`TransientTaskError`, are retried
(:func:`retry_args`); bad input is not.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from mrt_fast.datasets import storage
from mrt_fast._util.object_store import object_store_error
from mrt_fast.errors import InjectedFault, MrtInputError, MrtResourceError, TransientTaskError

#: environment variable naming a marker file: the first bucket task that
#: creates it raises `InjectedFault` (the test hook for retries; see `select`)
FAULT_ENV = "MRT_RAY_FAULT_ONCE"

BUCKET = "__mrt_bucket"
ORDER = "__mrt_order"
#: rows per bucket aimed at when sizing the bucket count from the data
ROWS_PER_BUCKET = 1_000_000


def ray_module():
    """The ``ray`` module, with Ray Data (a one-line error naming the extra when missing)."""
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
    ray = ray_module()
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


def unwrap(e: BaseException) -> BaseException:
    """The user's exception inside Ray's task-error wrappers (or `e` itself).
    Ray's wrapper of a task's `MrtInputError` is itself an instance of it (a
    class deriving from both), so the wrapper is looked through too."""
    seen = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, (MrtInputError, MrtResourceError)) and not is_ray_wrapper(cur):
            return cur
        nxt = getattr(cur, "cause", None)
        if not isinstance(nxt, BaseException):
            nxt = cur.__cause__ or cur.__context__
        cur = nxt
    return e


def is_ray_wrapper(e: BaseException) -> bool:
    """Whether ``e`` is one of Ray's errors (a task error wrapping the task's own)."""
    return any(c.__module__.startswith("ray.") for c in type(e).__mro__)


class Unwrapping:
    """Re-raise an `MrtInputError` from inside Ray's task errors as itself,
    with its own first line (Ray appends its retry advice to the message)."""

    def __enter__(self):
        return self

    def __exit__(self, et, ev, tb):
        if ev is None or (isinstance(ev, (MrtInputError, MrtResourceError)) and not is_ray_wrapper(ev)):
            return False
        inner = unwrap(ev)
        if isinstance(inner, MrtInputError):
            first = (str(inner).strip().splitlines() or [""])[0]
            raise MrtInputError(first, pool=inner.pool, column=inner.column, row=inner.row) from None
        if isinstance(inner, MrtResourceError):  # a full disk in a task
            raise MrtResourceError((str(inner).strip().splitlines() or [""])[0], path=inner.path) from None
        lost = object_store_error(ev)  # Ray's object store lost or full
        if lost is not None:
            raise lost from None
        return False


class QuietInputErrors(logging.Filter):
    """Drop Ray Data's log record of a task that failed on bad input (the
    traceback it prints before the job raises that `MrtInputError` itself)."""

    def filter(self, record: logging.LogRecord) -> bool:
        ev = record.exc_info[1] if record.exc_info else None
        return not (ev is not None and isinstance(unwrap(ev), (MrtInputError, MrtResourceError)))

    def __enter__(self):
        self._handlers = [h for name in ("ray.data", "ray") for h in logging.getLogger(name).handlers]
        for h in self._handlers:
            h.addFilter(self)
        return self

    def __exit__(self, *exc):
        for h in self._handlers:
            h.removeFilter(self)
        return False


def retry_args(max_retries: int = 3) -> dict:
    # system failures (a worker or node lost) and TransientTaskError (the
    # injected fault among them) are retried; bad input is not
    if isinstance(max_retries, bool) or not isinstance(max_retries, (int, np.integer)) or max_retries < -1:
        raise MrtInputError(f"max_retries must be an integer >= -1 (-1: no limit), got {max_retries!r}")
    return {"max_retries": int(max_retries), "retry_exceptions": [TransientTaskError]}


class quiet_remote_args(warnings.catch_warnings):
    """Ray warns that task options given as keywords will be renamed; the
    retry options have no named form yet."""

    def __enter__(self):
        r = super().__enter__()
        warnings.filterwarnings("ignore", message=".*ray_remote_args.*deprecated")
        return r


def to_polars(t: pa.Table) -> pl.DataFrame:
    # tensors held in Ray's extension type become fixed-size lists
    cols = []
    for name, col in zip(t.column_names, t.columns):
        if isinstance(col.type, pa.ExtensionType):
            col = pa.chunked_array([c.storage for c in col.chunks], type=col.type.storage_type)
        cols.append((name, col))
    return pl.from_arrow(pa.table(dict(cols)))  # type: ignore[return-value]


def maybe_fail(marker: str | None) -> None:
    if not marker:
        return
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.close(fd)
    raise InjectedFault(f"injected fault (first attempt; marker {marker})")



def own_context(ds):
    """`ds` with a context of its own (a dataset and those derived from it
    share one: the caller's is left alone) that keeps the dataset order (the
    row-order ids follow it) and lets a UDF's own exception (an
    `MrtInputError`) through instead of Ray's wrapper."""
    ray = ray_module()
    ds = ray.data.Dataset.copy(ds, _deep_copy=True)
    ctx = ds.context
    ctx.execution_options.preserve_order = True
    ctx.raise_original_map_exception = True
    return ds


def shuffle_strategy(shuffle: str):
    from ray.data.context import ShuffleStrategy

    table = {"sort": ShuffleStrategy.SORT_SHUFFLE_PULL_BASED, "hash": ShuffleStrategy.HASH_SHUFFLE,
             "v2": ShuffleStrategy.SHUFFLE_V2}
    if shuffle not in table:
        raise MrtInputError(f"shuffle must be one of {sorted(table)}, got {shuffle!r}")
    return table[shuffle]



def _timed(fn: Any, arg: Any) -> tuple[Any, float, float]:
    """``fn(arg)`` in a task, with the task's wall and CPU seconds (every thread of its process)."""
    t, c = time.perf_counter(), time.process_time()
    out = fn(arg)
    return out, time.perf_counter() - t, time.process_time() - c


def run_tasks(name: str, fn: Any, args: list, on_result: Any, max_retries: int) -> str:
    """``fn(a)`` for every ``a`` of ``args`` as Ray tasks of one CPU each (a lost worker or node,
    and a `TransientTaskError`, retried), ``on_result`` called in the driver as each one ends;
    returns the stage's line of statistics in Ray Data's form (``last_job_stats``)."""
    ray = ray_module()
    task = ray.remote(num_cpus=1, **retry_args(max_retries))(_timed)
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



def read(source: Any, columns: list[str] | None = None, *, allow_partial: bool = False):
    """A Ray Dataset over the files of a source (a file, a directory of
    Parquet/JSONL files or a glob, found as `mrt_fast.datasets.sources.discover` finds
    them, an unfinished ``mrt`` output only with ``allow_partial``), rows in the same
    order: files sorted by path, then row order. Parquet objects on object storage are
    walked first (:func:`mrt_fast.datasets.parquet_pages.verify_pages`): Ray Data's reader
    does not check page checksums."""
    ray = ray_module()
    from mrt_fast.datasets import hf_disk, json_text
    from mrt_fast.datasets import sources as _sources
    src = source if isinstance(source, _sources.Dataset) else _sources.discover(source, allow_partial=allow_partial)
    files = [str(f) for f in src.files]
    if src.fmt == "parquet":
        objects = bool(src.files) and storage.is_url(src.files[0])
        if objects:  # Ray Data's reader does not check page checksums: each object walked first
            from mrt_fast.datasets.parquet_pages import verify_pages

            for f in src.files:
                verify_pages(f)
        fs = {"filesystem": storage.filesystem()} if objects else {}
        return ray.data.read_parquet(files, columns=columns, shuffle=None, **fs)
    # text formats are parsed by polars in the tasks, file by file, as the
    # local executor parses them (the Arrow readers infer other types and round
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


