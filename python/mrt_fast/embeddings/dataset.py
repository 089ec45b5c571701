"""Embedding a dataset: a file, directory or glob in; a file or a resumable dataset directory out.

The input is found by :func:`mrt_fast.datasets.sources.discover` (one file, a directory of
Parquet/JSONL files with hive partitions, or a glob). Its rows, in file order,
are cut into parts of ``rows_per_part``; each part is read, embedded
(:func:`mrt_fast.embeddings.embed.embed`) and written as ``part-NNNNN.parquet`` under a
temporary name renamed into place, then recorded in ``_manifest.json``
(:mod:`mrt_fast.datasets.manifest`). A killed job loses at most the part it was
working on: re-running the same command finishes the missing parts; a
finished directory is left as it is; another job's directory is refused
unless ``overwrite``. A file output (``.parquet``/``.jsonl``/``.csv``) is
written whole or not at all.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import polars as pl

from mrt_fast._util import messages as _messages

from mrt_fast.datasets import formats as _formats

from mrt_fast.datasets import sources as _sources
from mrt_fast.errors import MrtInputError
from mrt_fast.datasets.lock import output_lock
from mrt_fast.datasets.manifest import Manifest, discard_unfinished, part_check, part_path, prepare_output


@dataclass
class EmbedReport:
    output: str
    rows: int
    parts: int
    parts_done_now: int
    rows_done_now: int
    computed: int
    from_cache: int
    model_id: str | None
    seconds: float
    embed_seconds: float = 0.0
    resumed: bool = False
    already_done: bool = False

    @property
    def texts_per_second(self) -> float:
        """Texts done by this run per second of reading, embedding and writing (model loading excluded)."""
        return self.rows_done_now / self.embed_seconds if self.embed_seconds > 0 else 0.0

    def to_dict(self) -> dict:
        return {**asdict(self), "texts_per_second": self.texts_per_second}


class _Killed(RuntimeError):
    """Raised by the test hook ``_fail_after`` (a job stopped after N parts)."""


def _count(ds: _sources.Dataset) -> int:
    counts = ds.row_counts()
    if counts is not None:
        return sum(counts)
    try:
        return int(ds.scan().select(pl.len()).collect().item())
    except Exception as e:  # noqa: BLE001
        ds.find_unreadable()
        raise MrtInputError(f"cannot read {ds.source!r}: {_messages.one_line(e)}") from None


def embed_dataset(
    source: str | os.PathLike,
    output: str | os.PathLike,
    *,
    text: str = "response",
    column: str = "embedding",
    model: str | os.PathLike | None = None,
    batch_size: int = 64,
    cache_dir: str | os.PathLike | None | bool = None,
    device: str | None = None,
    processes: int = 1,
    overwrite_column: bool = False,
    overwrite: bool = False,
    rows_per_part: int = 100_000,
    progress: Callable[[int], None] | None = None,
    on_total: Callable[[int, int], None] | None = None,
    command: str | None = None,
    _fail_after: int | None = None,
) -> EmbedReport:
    """Add an embedding column to every row of a dataset (see the module doc).

    ``progress(n)`` is called as ``n`` more texts are done; ``on_total(total,
    already_done)`` once the work is known. The other options are those of
    :func:`mrt_fast.embeddings.embed.embed`.
    """
    from mrt_fast.embeddings.embed import check_model, check_output_column, embed

    t0 = time.perf_counter()
    if not isinstance(rows_per_part, int) or rows_per_part < 1:
        raise MrtInputError(f"rows_per_part must be an integer >= 1, got {rows_per_part!r}")
    out = Path(output)
    ds = _sources.discover(source)
    if _sources.output_inside_input(out, ds):
        raise MrtInputError(f"output {str(out)!r} is the input or inside it; write it elsewhere")
    schema = ds.check_columns([(text, "text to embed")])
    names = list(schema.names())
    if schema[text] not in (pl.String, pl.Utf8):
        raise MrtInputError(f"column {text!r} (text to embed) must hold strings, got {schema[text]}", column=text)
    check_output_column(names, column, text, overwrite_column)
    to_dir = out.is_dir() or out.suffix.lower() not in _formats.FORMATS
    if not to_dir:
        _formats.fmt_of(out, "output")
        parent = out.parent if str(out.parent) else Path(".")
        if not parent.is_dir():
            raise MrtInputError(f"output directory {str(parent)!r} does not exist")
    model_id = check_model(model, device, cache_dir)  # before any work: fails fast, distils the static tier once
    n = _count(ds)
    if n == 0:
        raise MrtInputError(f"{ds.source!r} has no rows: there is no text to embed")
    params = {"text": text, "column": column, "model_id": model_id, "rows_per_part": rows_per_part,
              "overwrite_column": overwrite_column}
    fp = ds.fingerprint()
    with output_lock(out, directory=to_dir):
        state, man = ("new", None)
        if to_dir:
            state, man = prepare_output(out, params, fp, overwrite=overwrite)
        n_parts = math.ceil(n / rows_per_part)
        rep = EmbedReport(output=str(out), rows=n, parts=n_parts if to_dir else 1, parts_done_now=0, rows_done_now=0,
                          computed=0, from_cache=0, model_id=model_id, seconds=0.0, resumed=state == "resume",
                          already_done=state == "done")
        if state == "done":
            rep.seconds = time.perf_counter() - t0
            return rep
        cache = False if cache_dir is False else cache_dir
        kw = dict(text=text, out=column, model=model, batch_size=batch_size, cache_dir=cache, device=device,
                  processes=processes, overwrite=overwrite_column, progress=False, callback=progress)
        lf = ds.scan()
        t_work = time.perf_counter()

        def part(i: int, rows: int) -> pl.DataFrame:
            start = i * rows_per_part
            try:
                df = lf.slice(start, rows).collect()
            except Exception as e:  # noqa: BLE001
                ds.find_unreadable()
                raise MrtInputError(f"cannot read {ds.source!r}: {_messages.one_line(e)}") from None
            st: dict = {}
            try:
                df = embed(df, stats=st, **kw)
            except MrtInputError as e:
                if e.row is None:
                    raise
                f, r0 = ds.locate(start + e.row)
                raise MrtInputError(f"{str(e)} (file {str(f)!r}, row {r0})", column=e.column,
                                    row=start + e.row) from None
            rep.computed += st.get("computed", 0)
            rep.from_cache += st.get("hits", 0)
            return df

        if not to_dir:
            if on_total is not None:
                on_total(n, 0)
            with _formats.AtomicWriter(out) as w:
                for i in range(n_parts):
                    df = part(i, rows_per_part)
                    w.write(df)
                    rep.rows_done_now += df.height
                w.commit()
            rep.parts_done_now = 1
            rep.embed_seconds = time.perf_counter() - t_work
            rep.seconds = time.perf_counter() - t0
            return rep

        if man is None:
            man = Manifest(command=command or "mrt_fast.embeddings.dataset", parameters=params,
                           input={"source": ds.source, "files": len(ds.files), "fingerprint": fp, "rows": n},
                           n_parts=n_parts, rows_per_part=rows_per_part)
            man.write(out)
        todo = man.missing_parts(out)
        if on_total is not None:
            on_total(n, man.rows)
        try:
            for i in todo:
                df = part(i, rows_per_part)
                _formats.write_parquet_atomic(df, part_path(out, i))
                man.record(i, df.height, part_check(part_path(out, i)))
                man.write(out)
                rep.parts_done_now += 1
                rep.rows_done_now += df.height
                if _fail_after is not None and rep.parts_done_now >= _fail_after:
                    raise _Killed(f"stopped after {rep.parts_done_now} part(s)")
        except MrtInputError:
            if state == "new":
                discard_unfinished(out)  # bad input before any part: leave nothing behind
            raise
        man.done = True
        man.finished = time.time()
        man.write(out)
        rep.embed_seconds = time.perf_counter() - t_work
        rep.seconds = time.perf_counter() - t0
        return rep


def read_dataset(path: str | os.PathLike) -> pl.DataFrame:
    """Every part of a finished dataset directory, in order (a single file is read as it is)."""
    p = Path(path)
    if p.is_dir():
        m = Manifest.read(p)
        if m is None or not m.done:
            raise MrtInputError(f"{str(p)!r} is not a finished dataset (its job has not completed)")
        return pl.read_parquet([str(part_path(p, i)) for i in range(m.n_parts)])
    return _formats.read_table(p)


__all__: list[Any] = ["EmbedReport", "embed_dataset", "read_dataset"]
