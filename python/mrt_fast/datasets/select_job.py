"""Selection over datasets larger than memory: one read, bounded memory, resumable, on either engine.

:func:`select_dataset` is the select stage (:mod:`mrt_fast.datasets.select_stage`)
as a job (:class:`mrt_fast.datasets.job.Job`): it checks the arguments,
discovers the input, resolves its layout, opens the job (lock, manifest,
resume; a finished output is left as it is), and hands the parts to an
executor (:mod:`mrt_fast.datasets.executors`): ``engine="local"`` on this
machine within a memory limit, ``engine="ray"`` on a Ray cluster. The rows of
a dataset (flat layout, one row per candidate) are partitioned by a digest of
their prompt id into buckets, every pool whole in one bucket
(:mod:`mrt_fast.datasets.spill`); bucket ``i`` becomes part ``i`` of the
output (``part-00000.parquet`` ..., with the ``.mrt/`` manifest), written
atomically, so a killed job resumes with the missing parts only. In the
grouped layout (one row per prompt, list columns, as vLLM returns the
completions of a prompt) the pools are already together: parts are runs of
consecutive rows, read straight from the input, nothing is exchanged.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from mrt_fast._util.memory import peak_rss
from mrt_fast.datasets import sources as _sources
from mrt_fast.datasets.executors import executor, only_on
from mrt_fast.datasets.job import Job
from mrt_fast.datasets.profile import Profile
from mrt_fast.datasets.report import BatchReport
from mrt_fast.datasets.spill import remove_stale_spills
from mrt_fast.datasets.select_stage import layout_hint, list_columns, refuse_missing_embedding, resolve_layout
from mrt_fast.errors import MrtInputError
from mrt_fast.selection.options import SelectOptions

__all__ = ["select_dataset"]


def select_dataset(
    source: str | os.PathLike,
    output: str | os.PathLike,
    k: int | str | None = None,
    method: str | None = None,
    *,
    options: SelectOptions | None = None,
    engine: str = "local",
    memory_limit: Any = None,
    workers: int | None = None,
    parts: int | None = None,
    rows_per_part: int | None = None,
    overwrite: bool = False,
    progress: Any = False,
    command: str | None = None,
    allow_partial: bool = False,
    ray_address: str | None = None,
    max_retries: int | None = None,
    shuffle: str | None = None,
    **knobs: Any,
) -> BatchReport:
    """Keep K candidates per prompt of a dataset, in bounded memory; resumable.

    ``source``: a file, a directory of Parquet/JSONL files (hive partitions
    included; a finished ``mrt`` output directory too), a glob or an ``s3://``
    prefix. ``output``: a directory (any name without a table suffix) that gets
    ``part-00000.parquet`` ... and the hidden ``.mrt/`` manifest, or a file
    (``.parquet``/``.jsonl``/``.csv``) holding every kept row. The selection
    is ``options`` (a :class:`~mrt_fast.selection.options.SelectOptions`) or
    ``k``, ``method`` and the keywords of :func:`mrt_fast.select` (``by``,
    ``embedding``, ``reward``, ``mode``, ``alpha``, ``eps``, ``k_max``,
    ``kernel``, ``seed``, ``candidate_key``, ``optimizer``) with ``n_modes``,
    ``max_mode_cosine``, ``layout`` and ``candidate_columns``; the kept rows are those of
    :func:`mrt_fast.select` on the whole table; a file output also has its
    order. Re-running an unfinished directory output finishes it; a finished one is left as
    it is (``report.already_done``); another job's directory is refused unless ``overwrite``.
    ``parts``: the number of parts (buckets) instead of one planned by the engine;
    ``rows_per_part``: parts of about this many input rows. ``progress``: the job's display by
    rows (True: a bar on a terminal, plain lines every few seconds otherwise; see
    :class:`mrt_fast.datasets.progress.JobProgress`). An unfinished ``mrt`` output as the
    source is refused unless ``allow_partial`` (its finished parts are read, with a warning).

    ``engine``: ``"local"`` (this machine) or ``"ray"`` (a Ray cluster), with the same parts.
    Local only: ``memory_limit`` (bytes or ``"2GB"``; default half the available memory)
    bounds the peak memory; ``workers``: buckets selected at once (default: as memory and
    cores allow). Ray only: ``ray_address`` (the cluster; None: the current or a new local
    instance), ``max_retries`` (task retries, 3; -1: no limit) and ``shuffle``: how rows
    reach their bucket's task, ``"files"`` (default: the bucket exchange on storage every
    worker sees) or Ray Data's own shuffle (``"sort"``, ``"hash"``, ``"v2"``). The part count
    on Ray defaults to ``max(cluster CPUs, rows / 1e6)``.
    Returns a :class:`~mrt_fast.datasets.report.BatchReport`.
    """
    t0, c0 = time.perf_counter(), time.process_time()
    prof = Profile()
    opts = SelectOptions.of(k, method, options, **knobs)
    ex = executor(engine)
    if parts is not None and rows_per_part is not None:
        raise MrtInputError("give parts or rows_per_part, not both")
    for name, v in (("parts", parts), ("rows_per_part", rows_per_part), ("workers", workers)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1):
            raise MrtInputError(f"{name} must be an integer >= 1, got {v!r}")
    only_on(engine, "local", {"memory_limit": memory_limit, "workers": workers})
    only_on(engine, "ray", {"ray_address": ray_address, "max_retries": max_retries, "shuffle": shuffle})
    settings = ex.prepare_select(memory_limit=memory_limit, workers=workers, address=ray_address,
                                 max_retries=max_retries, shuffle=shuffle)
    ds = _sources.discover(source, allow_partial=allow_partial)
    names = list(ds.file_schemas()[0].names()) + _sources.hive_columns(ds)
    refuse_missing_embedding(opts, names, ds.source)
    schema = ds.check_columns(opts.needed(names))
    lay = resolve_layout(opts, schema)
    lists = list_columns(opts, schema) if lay == "grouped" else None
    params = {**opts.parameters(), "layout": lay}
    command = command or f"select_dataset(k={opts.k}, method={opts.method!r})"
    with Job(ds, output, params, overwrite=overwrite, command=command, what="select", progress=progress) as job:
        if not job.to_dir and not job.remote:  # a killed run's spill beside the file: gone, whether this run spills
            remove_stale_spills(job.out.parent if str(job.out.parent) else Path("."), job.out.name)
        counts = ds.row_counts()
        n_rows = sum(counts) if counts is not None else None
        rep = BatchReport(output=str(job.out), engine=engine, layout=lay, method=opts.method, k=opts.k,
                          rows=n_rows or 0, resumed=job.resumed, already_done=job.done,
                          memory_limit=settings.get("limit", 0), notes=list(job.notes))
        # the checks, discovery and the job's start: the plan step
        prof.steps["plan"] = {"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0}
        if job.done:
            rep.parts = job.man.n_parts if job.man is not None else 1
            rep.n_kept = rep.rows_out = job.rows_written
            rep.peak_rss = peak_rss()
            rep.seconds = time.perf_counter() - t0
            rep.profile = prof.to_dict()
            return rep
        with layout_hint(opts, lay, schema):
            ex.run_select(job, rep, opts=opts, layout=lay, lists=lists, schema=schema, n_rows=n_rows, parts=parts,
                          rows_per_part=rows_per_part, settings=settings, profile=prof)
    rep.seconds = time.perf_counter() - t0
    rep.profile = prof.to_dict()
    return rep
