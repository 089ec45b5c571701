"""The Ray executor: a job's parts on the workers of a Ray cluster (or a local Ray instance).

The job (lock, manifest, resume, progress, the report) stays in the driver;
the workers read the input themselves and write the parts (a directory
output), which the driver records as they come back; a file output's rows
come back to the driver, which writes the file whole. The parts are those of
the local executor, byte for byte, so a job either started the other can finish.

Row stages (:func:`run_row_parts`): a pool of ``workers`` actors, each opening
the stage once (a model loaded once per worker), part ``i`` being input rows
``[i r, (i + 1) r)``; what the stage counted comes back with each part.

Select (:func:`run_select`), flat layout: rows reach their bucket's task
through files (``shuffle="files"``, the default: the bucket exchange of
:mod:`mrt_fast.datasets.spill` on storage every worker sees, as the parts need
anyway) or through Ray Data's own shuffle (``"sort"``, ``"hash"``, ``"v2"``:
the object store, no shared storage); each bucket task selects its pools with
the local executor's code (:mod:`mrt_fast.datasets.executors.ray_tasks`).
Where every pool lies in consecutive rows (:mod:`mrt_fast.datasets.pool_runs`)
and the exchange would go through files, there is none: a task per part reads
the part's rows in place, with the local executor's cuts (:func:`consecutive_cuts`).
Grouped layout: parts of consecutive prompts, run as a row stage.

Ray is imported on first use (the ``ray`` extra: ``pip install 'mrt_fast[ray]'``).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from typing import Any, Callable

import numpy as np
import polars as pl
import pyarrow as pa

from mrt_fast._util.memory import peak_rss
from mrt_fast.datasets.executors.ray_runtime import (BUCKET, FAULT_ENV, ORDER, ROWS_PER_BUCKET, QuietInputErrors, Unwrapping,
                                                     init, own_context, quiet_console, quiet_remote_args, ray_module,
                                                     read, retry_args, run_tasks, shuffle_strategy, to_polars)
from mrt_fast.datasets.executors.ray_tasks import (BucketToPart, FilesToPart, PartInPlace, ReadAndSplit,
                                                   SpilledBucketToPart, SpillRuns, row_ranges, spill_runs,
                                                   tag_buckets)
from mrt_fast.datasets.job import start_row_parts
from mrt_fast.datasets.pool_runs import LAYOUT as CONSECUTIVE
from mrt_fast.datasets.select_stage import SelectRows, counts_into, finish_select
from mrt_fast.datasets.spill import null_ids_error, spill_area
from mrt_fast.datasets.stage import Counts, as_stage, split_result
from mrt_fast.errors import MrtInputError

__all__ = ["last_job_stats", "prepare_select", "run_row_parts", "run_select", "variance_budget_files"]

_last_stats: str | None = None


def last_job_stats() -> str | None:
    """Ray Data's per-stage statistics of the last select job run on Ray in this process
    (wall and CPU time of reading, tagging, the shuffle and the bucket tasks), or None."""
    return _last_stats


# --------------------------------------------------------------------------- row stages


class _RowPartWorker:
    """A Ray actor running a row stage: the stage opened once (a model loaded once per worker), then
    for each part index of a batch, that part's input rows read, mapped and (for a directory) written."""

    def __init__(self, source: str, stage: Any, per: int, out_dir: str | None):
        import warnings

        from mrt_fast.datasets.sources import discover
        from mrt_fast.errors import PartialOutputWarning

        with warnings.catch_warnings():  # the driver refused an unfinished source, or was asked to read it
            warnings.simplefilter("ignore", PartialOutputWarning)
            self.ds = discover(source, allow_partial=True)
        self.fn = stage.open()
        self.per, self.out_dir = per, out_dir
        self.__name__ = "row_stage_part"

    def __call__(self, batch: dict) -> dict:
        from mrt_fast.datasets.job import write_part

        parts, rows, tables, counts = [], [], [], []
        for i in batch["part"]:
            i = int(i)
            df = self.ds.rows(i * self.per, self.per)
            res, c = split_result(self.fn(df))
            if self.out_dir is not None:
                rows.append(write_part(res, self.out_dir, i))
            else:
                rows.append(res.height)
                tables.append(res.write_ipc(None).getvalue())
            parts.append(i)
            counts.append(json.dumps(dict(c or {})))
        out = {"part": np.asarray(parts, dtype=np.int64), "rows": np.asarray(rows, dtype=np.int64),
               "counts": np.asarray(counts, dtype=object)}
        if self.out_dir is None:
            out["ipc"] = np.asarray(tables, dtype=object)
        return out


def run_row_parts(job: Any, stage: Any, *, rows_per_part: int, n_rows: int | None = None, layout: str = "flat",
                  workers: int | None = None, address: str | None = None, items_total: int | None = None,
                  on_total: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """The Ray executor of a row stage (:mod:`mrt_fast.datasets.stage`), the counterpart of
    :func:`mrt_fast.datasets.executors.local.run_row_parts`: part ``i`` is input rows
    ``[i r, (i + 1) r)``, mapped by the stage (opened once per worker) on a pool of ``workers``
    actors (default: the cluster's CPUs) of the Ray cluster at ``address`` (None: the current or a
    new local instance); a directory's parts are written by the workers and recorded by the job, a
    file's rows gathered here; ``job.progress`` advances by input rows as parts come back
    (``items_total`` is the local executor's). Returns ``{"parts", "parts_done_now",
    "rows_done_now", "rows_out", "rows_written", "counts"}``."""
    st = as_stage(stage)
    n, per, n_parts, todo, before = start_row_parts(job, rows_per_part, n_rows, layout)
    done: dict[str, Any] = {"parts": n_parts, "parts_done_now": len(todo), "rows_done_now": 0, "rows_out": 0}
    counts = Counts()
    job.progress.start(n, before)
    if on_total is not None:
        on_total(n, before)
    if not todo:
        return {**done, "rows_written": job.finish() if job.to_dir else 0, "counts": counts.total}
    init(address)
    if job.progress.mode != "off":
        job.logs = quiet_console()
    ray = ray_module()
    n_workers = max(1, min(len(todo), workers or int(ray.cluster_resources().get("CPU", 1))))
    out_dir = str(job.out) if job.to_dir else None
    results: dict[int, pl.DataFrame] = {}
    with Unwrapping(), QuietInputErrors(), quiet_remote_args():
        # a context of its own: the order kept, and a stage's own exception let through Ray's wrapper
        items = own_context(ray.data.from_items([{"part": i} for i in todo], override_num_blocks=len(todo)))
        mapped = items.map_batches(_RowPartWorker, batch_size=1, concurrency=n_workers, batch_format="numpy",
                                   fn_constructor_kwargs={"source": job.ds.source, "stage": st,
                                                          "per": per, "out_dir": out_dir})
        for b in mapped.iter_batches(batch_size=None, batch_format="numpy"):
            for j, i in enumerate(b["part"]):
                done["rows_out"] += int(b["rows"][j])
                rows_in = min(per, n - int(i) * per)
                done["rows_done_now"] += rows_in
                counts.add(json.loads(b["counts"][j]))
                job.progress.advance(rows_in)
                if out_dir is not None:
                    job.record_written(int(i), int(b["rows"][j]))
                else:
                    results[int(i)] = pl.read_ipc(io.BytesIO(b["ipc"][j]))
    written = job.finish() if job.to_dir else job.write_file([results[i] for i in sorted(results)])
    return {**done, "rows_written": written, "counts": counts.total}


# --------------------------------------------------------------------------- select


def prepare_select(address: str | None = None, max_retries: int | None = None, shuffle: str | None = None,
                   **local_only: Any) -> dict[str, Any]:
    """The Ray executor's settings of a select job: the cluster (None: the current or a new local
    instance), the task retries (3; -1: no limit) and how rows reach their bucket (``"files"``);
    ``local_only``: the local executor's settings, None here."""
    if max_retries is not None:
        retry_args(max_retries)  # refused before any work
    return {"address": address, "max_retries": 3 if max_retries is None else max_retries,
            "shuffle": "files" if shuffle is None else shuffle}


def run_select(job: Any, rep: Any, *, opts: Any, layout: str, lists: list[str] | None, schema: pl.Schema,
               n_rows: int | None, parts: int | None, rows_per_part: int | None, settings: dict,
               profile: Any = None) -> None:
    """The Ray executor of the select stage inside ``job``, filling ``rep`` (a
    :class:`~mrt_fast.datasets.report.BatchReport`). Flat layout: part ``i`` holds the pools of
    bucket ``i`` (``pool_key % parts``), selected by one task; grouped layout: part ``i`` holds
    input rows ``[i r, (i + 1) r)``. The part count: ``parts``, or parts of about
    ``rows_per_part`` input rows, or ``max(cluster CPUs, rows / 1e6)``; a resumed job keeps its
    manifest's. ``profile`` (:class:`~mrt_fast.datasets.profile.Profile`): the run is timed as
    one step, ``run on Ray`` (its tasks run elsewhere)."""
    with profile.step("run on Ray") if profile is not None else contextlib.nullcontext():
        _run_select(job, rep, opts=opts, layout=layout, lists=lists, schema=schema, n_rows=n_rows, parts=parts,
                    rows_per_part=rows_per_part, settings=settings)


def _run_select(job: Any, rep: Any, *, opts: Any, layout: str, lists: list[str] | None, schema: pl.Schema,
                n_rows: int | None, parts: int | None, rows_per_part: int | None, settings: dict) -> None:
    global _last_stats
    src, man = job.ds, job.man
    rep.spilled = layout == "flat"
    init(settings["address"])
    if job.progress.mode != "off":  # the job shows progress and a summary: Ray's own lines go to its log
        job.logs = rep.logs = quiet_console()
    ray = ray_module()
    rds = None
    if n_rows is None:
        rds = read(src)
        n_rows = rds.count()
    if n_rows == 0:
        raise MrtInputError(f"{src.source!r} has no rows: there is nothing to select from")
    rep.rows = n_rows
    cpus = int(ray.cluster_resources().get("CPU", 1))
    if man is not None:
        nb = man.n_parts
    elif parts is not None:
        nb = int(parts)
    elif rows_per_part is not None:
        nb = -(-n_rows // rows_per_part)
    else:
        nb = max(cpus, -(-n_rows // ROWS_PER_BUCKET))
    rep.parts, rep.workers = nb, cpus
    if layout == "grouped":
        nb = max(1, min(nb, n_rows))
        job.progress.set_unit("prompts")
        r = run_row_parts(job, SelectRows(opts, lists or []), rows_per_part=-(-n_rows // nb), n_rows=n_rows,
                          layout="grouped", address=settings["address"])
        rep.parts, rep.parts_done_now, rep.rows_done_now = r["parts"], r["parts_done_now"], r["rows_done_now"]
        rep.rows_out = r["rows_written"]
        counts_into(r["counts"], rep)
        rep.n_kept = r["counts"].get("kept", 0)
        rep.peak_rss = peak_rss()
        return
    cuts = consecutive_cuts(job, opts.by, nb, settings["shuffle"])
    if cuts is not None:
        layout = CONSECUTIVE
        rep.spilled, rep.in_place = False, True
    todo = job.start(nb, layout=layout, n_rows=n_rows)
    job.progress.start(n_rows if len(todo) == nb else None)  # the rows of the buckets done before are unknown
    run = _FlatRun(job, opts, schema, nb, todo, n_rows, cpus, settings, rds)
    with Unwrapping(), QuietInputErrors(), quiet_remote_args():
        if cuts is not None:
            run.in_place(cuts)
        elif run.shuffle == "files":
            with spill_area(job, shared=True, fresh=True) as spill:
                run.through_files(str(spill))
        else:
            run.through_ray_shuffle()
    _last_stats = run.stats_text()
    kept = to_polars(pa.concat_tables(run.kept_tables, promote_options="default")) if run.kept_tables else None
    rep.n_kept = rep.rows_out = finish_select(job, src, opts, kept)  # once the exchange is gone
    rep.parts_done_now = len(todo)
    counts_into(run.counts.total, rep)
    rep.rows_done_now = rep.n_candidates
    rep.peak_rss = peak_rss()


#: runs of consecutive pools the driver holds at most while it cuts them into parts (8 bytes each)
MOST_RUNS = 1 << 27


def consecutive_cuts(job: Any, by: str, n_parts: int, shuffle: str) -> Any:
    """The cuts of a flat job's parts when its input's pools lie in consecutive rows and the bucket
    exchange would go through files (the default), else None. A job started with parts in place (by
    either engine) is resumed in place, with the same cuts; one that exchanged keeps exchanging."""
    from mrt_fast.datasets.arrow_runs import arrow_schema
    from mrt_fast.datasets.pool_runs import consecutive_pools, cut_runs

    man, src = job.man, job.ds
    if man is not None and man.layout != CONSECUTIVE or man is None and shuffle != "files":
        return None
    bounds = consecutive_pools(src, by, MOST_RUNS) if arrow_schema(src, objects=True) is not None else None
    if bounds is None:
        if man is not None:
            raise MrtInputError(f"{str(job.out)!r} was started reading the consecutive pools of {src.source!r} in "
                                "place, and its pools no longer lie in consecutive rows: remove it to start over")
        return None
    return cut_runs(bounds, n_parts)


class _FlatRun:
    """The flat layout's buckets on Ray: rows to their bucket's task, each bucket's part back."""

    def __init__(self, job: Any, opts: Any, schema: pl.Schema, nb: int, todo: list[int], n_rows: int, cpus: int,
                 settings: dict, rds: Any):
        self.job, self.opts, self.schema, self.nb, self.todo = job, opts, schema, nb, todo
        self.n_rows, self.cpus, self.rds = n_rows, cpus, rds
        self.max_retries, self.shuffle = settings["max_retries"], settings["shuffle"]
        self.fault = os.environ.get(FAULT_ENV) or None
        self.out_dir = str(job.out) if job.to_dir else None
        self.todo_set = None if len(todo) == nb else set(todo)
        self.counts = Counts()
        self.kept_tables: list[pa.Table] = []
        self.stats: list[str] = []
        self.res: Any = None

    def account(self, t: pa.Table, written: bool = True) -> None:
        """Rows of part counts (:func:`~mrt_fast.datasets.executors.ray_tasks.part_stats`): recorded and summed."""
        for row in t.to_pylist():
            if written:
                self.job.record_written(row["part"], row["rows"])
            self.job.progress.advance(row["candidates"])
            self.counts.add({k: v for k, v in row.items() if k not in ("part", "rows")})

    def part_done(self, out: tuple) -> None:
        """What a task of parts returned: (the kept rows of a file output, or None; one row of counts a part)."""
        kept_rows, part_counts = out
        if kept_rows is not None:
            self.kept_tables.append(kept_rows)
        if part_counts is not None:
            self.account(part_counts, written=self.job.to_dir)

    def in_place(self, cuts: Any) -> None:
        """Pools in consecutive rows: a task per part reads its rows where they lie and selects them."""
        from mrt_fast.datasets.arrow_runs import arrow_schema, row_groups

        src = self.job.ds
        task = PartInPlace(src, self.opts, row_groups(src), arrow_schema(src, objects=True), cuts, self.out_dir,
                           self.fault, src.memory_bytes() / max(1, self.n_rows))
        self.stats.append(run_tasks("PartInPlace", task, [pa.table({"part": [i]}) for i in self.todo],
                                    self.part_done, self.max_retries))

    def through_files(self, spill: str) -> None:
        """The bucket exchange through files: read tasks write each bucket's rows, bucket tasks read them."""
        ray, job, src, by = ray_module(), self.job, self.job.ds, self.opts.by
        counts = src.row_counts()
        # local (shared) storage: the read tasks spill as the local executor does
        runs = spill_runs(src, self.n_rows, self.cpus) if not job.remote and counts is not None else None
        if runs is not None:
            # plain Ray tasks: a read task per run, then a task per bucket (Ray Data's
            # executor would add its actors and backpressure to a job of a few dozen tasks)
            nulls = [0]

            def spilled(t: pa.Table) -> None:
                nulls[0] += sum(t.column("nulls").to_pylist())

            from mrt_fast.datasets.arrow_runs import arrow_schema, polars_decodes_faster

            schema = arrow_schema(src, objects=True)  # spill_runs read objects only where they carry checksums
            faster = polars_decodes_faster(schema)
            sr = SpillRuns(runs, spill, by, self.nb, schema if faster else None,
                           src.memory_bytes() / max(1, self.n_rows))
            self.stats.append(run_tasks("SpillRuns", sr,
                                        [pa.table({"run": [j]}) for j in range(len(runs))], spilled,
                                        self.max_retries))
            if nulls[0]:
                raise null_ids_error(src, spill, self.nb, by, nulls[0])

            self.stats.append(run_tasks("SpilledBucketToPart",
                                        SpilledBucketToPart(src, self.opts, self.schema, spill, self.out_dir,
                                                            self.fault),
                                        [pa.table({"part": [i]}) for i in self.todo], self.part_done,
                                        self.max_retries))
            return
        ranges = row_ranges(src, counts)
        items = own_context(ray.data.from_items(ranges, override_num_blocks=len(ranges)))
        split = items.map_batches(ReadAndSplit(src, spill, by, self.nb, self.todo_set), batch_size=1,
                                  batch_format="pyarrow", **retry_args(self.max_retries))
        for _ in split.iter_internal_ref_bundles():  # every piece written before any bucket is read
            pass
        self.stats.append(split.stats())
        buckets = own_context(ray.data.from_items([{"part": i} for i in self.todo],
                                                  override_num_blocks=max(1, len(self.todo))))
        self.collect(buckets.map_batches(FilesToPart(self.opts, spill, self.out_dir, self.fault), batch_size=1,
                                         batch_format="pyarrow", **retry_args(self.max_retries)))

    def through_ray_shuffle(self) -> None:
        """Ray Data's shuffle keyed by bucket (a few dozen keys, not millions) brings each bucket together."""
        from ray.data.expressions import monotonically_increasing_id

        rds = own_context(self.rds if self.rds is not None else read(self.job.ds))
        ordered = rds.with_column(ORDER, monotonically_increasing_id())
        tagged = ordered.map_batches(tag_buckets(self.opts.by, self.nb, self.todo_set), batch_size=None,
                                     batch_format="pyarrow", zero_copy_batch=True)
        tagged.context.shuffle_strategy = shuffle_strategy(self.shuffle)
        self.collect(tagged.groupby(BUCKET, num_partitions=self.nb).map_groups(
            BucketToPart(self.opts, self.out_dir, self.fault), batch_format="pyarrow",
            **retry_args(self.max_retries)))

    def collect(self, res: Any) -> None:
        """The blocks of the bucket tasks: part counts recorded (a directory) or kept rows gathered (a file)."""
        ray = ray_module()
        self.res = res
        for ref in res.iter_internal_ref_bundles():
            for block_ref in ref.block_refs:
                t = ray.get(block_ref)
                if t.num_rows == 0:
                    continue
                if self.job.to_dir:
                    self.account(t)
                else:
                    self.kept_tables.append(t)

    def stats_text(self) -> str | None:
        try:
            if self.res is not None:
                self.stats.append(self.res.stats())
            return "\n".join(self.stats)
        except Exception:  # noqa: BLE001 - diagnostics only
            return None


# --------------------------------------------------------------------------- the variance fold


def variance_budget_files(source: Any, *, by: str = "prompt_id", loss: str = "loss", address: str | None = None,
                          allow_partial: bool = False, layout: str = "auto", batch_rows: int | None = None,
                          tokens: str | None = None, options: Any = None):
    """`mrt_fast.variance_budget` over the files of a source on Ray: each block
    of the two columns folds into an accumulator, the driver merges them
    (either layout: grouped when the loss column holds lists). ``batch_rows`` and ``tokens``
    are the local executor's (the caller refuses ``tokens`` here)."""
    from mrt_fast.datasets import sources as _sources
    from mrt_fast.datasets.executors.ray_fold import variance_budget
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
    kw = {} if options is None else options.keywords()
    return variance_budget(read(src, columns=[by, loss]), by=by, loss=loss, layout=lay, **kw)
