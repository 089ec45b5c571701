"""Embedding a dataset: a file, directory or glob in; a file or a resumable dataset directory out.

Embedding is a row-wise stage of the dataset job (:mod:`mrt_fast.datasets.job`):
the input is a file, a directory of Parquet/JSONL files with hive partitions,
or a glob; its rows, in file order, are cut into parts of ``rows_per_part``;
each part is read, embedded (:func:`mrt_fast.embeddings.embed.embed`) and
written as ``part-NNNNN.parquet`` under a temporary name renamed into place,
then recorded in the manifest (:mod:`mrt_fast.datasets.manifest`). A killed job loses at most the part it was
working on: re-running the same command finishes the missing parts; a
finished directory is left as it is; another job's directory is refused
unless ``overwrite``. A file output (``.parquet``/``.jsonl``/``.csv``) is
written whole or not at all.

The text column is read once before any model loads: a null list of
responses is refused, and so is an empty (or whitespace, or null) text unless
``empty_text`` says what it gets (``skip``: the candidate is left out;
``keep``: a null embedding, which selection leaves out), each refusal naming
the file, the row and, in the grouped layout, the candidate's index in its
prompt's list.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import polars as pl


from mrt_fast.datasets import formats as _formats

from mrt_fast.datasets import sources as _sources
from mrt_fast.datasets.manifest import Manifest, part_path
from mrt_fast.datasets.report import JobReport
from mrt_fast.datasets.stage import RowStage
from mrt_fast.errors import MrtInputError


@dataclass(repr=False)
class EmbedReport(JobReport):
    """What an `embed_dataset` run did: the job's fields (:class:`~mrt_fast.datasets.report.JobReport`)
    and the texts embedded."""

    model_id: str | None = None
    computed: int = 0  # texts embedded by this run
    from_cache: int = 0  # texts this run read from the cache
    embed_seconds: float = 0.0
    candidates: int = 0  # texts of the input (rows in the flat layout, list entries in the grouped one)
    texts_done_now: int = 0  # texts this run embedded or read from the cache
    empty_text: str = "refuse"
    empty_skipped: int = 0  # candidates left out by empty_text="skip" (this run)
    prompts_skipped: int = 0  # grouped rows left with no candidate by empty_text="skip" (this run)
    empty_kept: int = 0  # candidates given a null embedding by empty_text="keep" (this run)

    @property
    def texts_per_second(self) -> float:
        """Texts (candidates) done by this run per second of reading, embedding and writing (model loading
        excluded); in the grouped layout a row holds many texts."""
        return self.texts_done_now / self.embed_seconds if self.embed_seconds > 0 else 0.0

    @property
    def rows_per_second(self) -> float:
        """Input rows (prompts in the grouped layout) done by this run per second, as :attr:`texts_per_second`."""
        return self.rows_done_now / self.embed_seconds if self.embed_seconds > 0 else 0.0

    def to_dict(self) -> dict:
        return {**super().to_dict(), "texts_per_second": self.texts_per_second}

    def stage_lines(self) -> list[tuple[str, str]]:
        lines = [("candidates", f"{self.candidates:,}")] if self.layout == "grouped" else []
        lines += [("model", str(self.model_id)), ("computed", f"{self.computed:,}"),
                  ("from cache", f"{self.from_cache:,}")]
        if self.empty_skipped or self.empty_text == "skip":
            lines.append(("empty texts skipped", f"{self.empty_skipped:,}"
                          + (f" ({self.prompts_skipped:,} prompts left with none, left out)" if self.prompts_skipped
                             else "")))
        if self.empty_kept or self.empty_text == "keep":
            lines.append(("empty texts kept (null embedding)", f"{self.empty_kept:,}"))
        tps = self.texts_per_second
        lines.append(("texts/s", f"{tps:,.1f}" if tps < 10 else f"{tps:,.0f}"))
        if self.layout == "grouped":
            lines.append(("prompts/s", f"{self.rows_per_second:,.1f}"))
        return lines


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
    progress: Callable[[int], None] | bool | str | None = None,
    on_total: Callable[[int, int], None] | None = None,
    command: str | None = None,
    engine: str = "local",
    ray_address: str | None = None,
    workers: int | None = None,
    allow_partial: bool = False,
    empty_text: str = "refuse",
    layout: str = "auto",
    by: str = "prompt_id",
) -> EmbedReport:
    """Add an embedding column to every row of a dataset (see the module doc).

    A stage of :class:`mrt_fast.datasets.job.Job`: parts are runs of
    ``rows_per_part`` consecutive input rows. ``progress``: the job's display
    (True: a bar on a terminal, plain lines otherwise; see
    :class:`mrt_fast.datasets.progress.JobProgress`), or a function called
    as ``progress(n)`` when ``n`` more texts are done; ``on_total(total,
    already_done)`` once the work is known. The other options are those of :func:`mrt_fast.embeddings.embed.embed`.
    ``engine="ray"`` runs the parts on a Ray cluster (``ray_address``; ``workers`` actors, each
    loading the model once), with the same parts, manifest and resume as the local engine.
    An unfinished ``mrt`` output as ``source`` is refused unless ``allow_partial`` (its finished
    parts are read, with a warning).
    ``empty_text``: ``"refuse"`` (default), ``"skip"`` or ``"keep"`` (see the module doc and
    :func:`mrt_fast.embeddings.embed.embed`); ``layout``: ``"auto"`` (grouped when the text column
    holds lists), ``"flat"`` or ``"grouped"``.
    """
    from mrt_fast.datasets.executors import executor, only_on, run_row_parts
    from mrt_fast.datasets.job import Job
    from mrt_fast.embeddings.embed import EMPTY_TEXT, check_model, check_output_column
    from mrt_fast.tables.layouts import GROUPED, detect

    t0 = time.perf_counter()
    if isinstance(rows_per_part, bool) or not isinstance(rows_per_part, int) or rows_per_part < 1:
        raise MrtInputError(f"rows_per_part must be an integer >= 1, got {rows_per_part!r}")
    executor(engine)
    callback = progress if callable(progress) else None
    if engine != "local" and (callback is not None or processes != 1):
        raise MrtInputError("on the Ray engine each worker embeds its own parts: progress callbacks and "
                            "processes apply to the local engine only")
    only_on(engine, "ray", {"ray_address": ray_address, "workers": workers})
    ds = _sources.discover(source, allow_partial=allow_partial)
    schema = ds.check_columns([(text, "text to embed")])
    names = list(schema.names())
    if schema[text] not in (pl.String, pl.List(pl.String)):  # one text a row, or one list a prompt (grouped)
        raise MrtInputError(f"column {text!r} (text to embed) must hold strings (or lists of strings, one list a "
                            f"prompt), got {schema[text]}", column=text)
    check_output_column(names, column, text, overwrite_column)
    if empty_text not in EMPTY_TEXT:
        raise MrtInputError(f"empty_text must be one of {EMPTY_TEXT}, got {empty_text!r}")
    grouped = detect(schema, {text: 0}, layout) == GROUPED
    job_ = Job(ds, output, {}, overwrite=overwrite, command=command or "mrt_fast.embed_dataset", what="embed",
               progress=None if callback is not None else progress)
    n = job_.count_rows()
    if n == 0:
        raise MrtInputError(f"{ds.source!r} has no rows: there is no text to embed")
    # the texts are checked before the model loads: a bad text is found in seconds, not after loading
    scan = scan_texts(ds, text, grouped, empty_text)
    job_.progress.say("loading the model")
    try:
        model_id = check_model(model, device, cache_dir)  # before any work: fails fast, distils the static tier once
    finally:
        job_.progress.quiet()
    job_.parameters = {"text": text, "column": column, "model_id": model_id, "rows_per_part": rows_per_part,
                       "overwrite_column": overwrite_column,
                       **({"empty_text": empty_text} if empty_text != "refuse" else {})}
    if grouped:
        job_.progress.set_unit("prompts")
    cache = False if cache_dir is False else cache_dir
    kw = dict(text=text, out=column, model=model, batch_size=batch_size, cache_dir=cache, device=device,
              processes=processes, overwrite=overwrite_column, empty_text=empty_text,
              layout="grouped" if grouped else "flat", by=by)
    with job_ as job:
        n_parts = math.ceil(n / rows_per_part)
        rep = EmbedReport(output=str(job.out), engine=engine, layout="grouped" if grouped else "flat", rows=n,
                          parts=n_parts if job.to_dir else 1, model_id=model_id, resumed=job.resumed,
                          already_done=job.done, notes=list(job.notes), candidates=scan["candidates"],
                          empty_text=empty_text)
        if job.done:
            rep.rows_out = job.rows_written
            rep.seconds = time.perf_counter() - t0
            return rep
        t_work = time.perf_counter()
        r = run_row_parts(job, EmbedRows(kw, callback=callback), engine=engine, rows_per_part=rows_per_part,
                          n_rows=n, workers=workers, address=ray_address, on_total=on_total,
                          items_total=scan["candidates"])
        c = r["counts"]
        rep.computed, rep.from_cache = c.get("computed", 0), c.get("hits", 0)
        rep.empty_skipped, rep.prompts_skipped = c.get("empty_skipped", 0), c.get("prompts_skipped", 0)
        rep.empty_kept, rep.texts_done_now = c.get("empty_kept", 0), c.get("texts", 0)
        rep.parts_done_now = r["parts_done_now"] if job.to_dir else 1
        rep.rows_done_now, rep.rows_out = r["rows_done_now"], r["rows_written"]
        rep.logs = job.logs
        rep.embed_seconds = time.perf_counter() - t_work
        rep.seconds = time.perf_counter() - t0
        return rep


def count_texts(df: pl.DataFrame, text: str, grouped: bool) -> int:
    """The texts (candidates) of a frame: its rows, or the entries of its text lists."""
    if not grouped:
        return df.height
    return int(df.select(pl.col(text).list.len().sum()).item() or 0)


def scan_texts(ds: Any, text: str, grouped: bool, empty_text: str = "refuse") -> dict:
    """One pass over the text column before any model loads: ``{"candidates", "blank"}`` (texts that
    are empty, whitespace only or null). A null list of responses (grouped) is refused; so is a blank
    text when ``empty_text`` is ``"refuse"``, naming the file, the row and (grouped) the candidate."""
    from mrt_fast._util import messages as _messages

    is_blank = lambda e: e.is_null() | (e.str.strip_chars().str.len_chars() == 0)  # noqa: E731
    lf = ds.scan()
    try:
        if grouped:
            per = pl.col(text).list.eval(is_blank(pl.element()))
            got = lf.select(pl.col(text).list.len().sum().alias("candidates"), per.list.sum().sum().alias("blank"),
                            (per.list.sum() > 0).arg_true().first().alias("first"), pl.col(text).null_count().alias("nulls"),
                            pl.col(text).is_null().arg_true().first().alias("first_null")).collect().row(0, named=True)
        else:
            b = is_blank(pl.col(text))
            got = lf.select(pl.len().alias("candidates"), b.sum().alias("blank"), b.arg_true().first().alias("first"),
                            pl.lit(0).alias("nulls"), pl.lit(0).alias("first_null")).collect().row(0, named=True)
    except Exception as e:  # noqa: BLE001
        ds.find_unreadable()
        raise MrtInputError(f"cannot read {ds.source!r}: {_messages.one_line(e)}") from None
    if got["nulls"]:
        f, r = ds.locate(int(got["first_null"]))
        raise MrtInputError(f"column {text!r} is null in {got['nulls']} row(s), the first at row {r} of {str(f)!r}: "
                            "each prompt needs its list of responses", column=text, row=r)
    blank = int(got["blank"] or 0)
    if blank and empty_text == "refuse":
        row = int(got["first"])
        f, r = ds.locate(row)
        cell = lf.slice(row, 1).select(pl.col(text)).collect()[text][0]
        if grouped:
            cand = next(i for i, t in enumerate(cell) if t is None or not t.strip())
            value, where = cell[cand], f"row {r}, candidate {cand} of {str(f)!r}"
        else:
            value, where = cell, f"row {r} of {str(f)!r}"
        what = "null" if value is None else "empty" if value == "" else "whitespace only"
        raise MrtInputError(
            f"column {text!r}: {blank:,} text(s) are empty, whitespace or null, the first ({what}) at {where}; "
            "--empty-text skip leaves such candidates out, keep gives them a null embedding that selection "
            "leaves out", column=text, row=r)
    return {"candidates": int(got["candidates"] or 0), "blank": blank}


class EmbedRows(RowStage):
    """The embed stage (:mod:`mrt_fast.datasets.stage`): the function of a part is
    :func:`mrt_fast.embeddings.embed.embed` with ``kw``, counting the texts it embedded, read from
    the cache or left out. ``callback(n)`` (else the executor's ``tick``) as texts are done."""

    name = "embed"

    def __init__(self, kw: dict, callback: Callable[[int], None] | None = None):
        self.kw = {k: v for k, v in kw.items() if k not in ("callback", "progress")}
        self.callback = callback

    def open(self, tick: Callable[[int], None] | None = None) -> Callable[[pl.DataFrame], Any]:
        from mrt_fast.embeddings.embed import embed

        cb = self.callback or tick
        kw = {**self.kw, "progress": False, **({"callback": cb} if cb is not None else {})}
        text, grouped = kw.get("text", "response"), kw.get("layout") == "grouped"

        def part(df: pl.DataFrame):
            st: dict = {}
            out = embed(df, stats=st, **kw)
            return out, {**{k: st.get(k, 0) for k in ("computed", "hits", "empty_skipped", "prompts_skipped",
                                                        "empty_kept")}, "texts": count_texts(df, text, grouped)}

        return part


def read_dataset(path: str | os.PathLike) -> pl.DataFrame:
    """Every part of a finished dataset directory, in order (a single file is read as it is)."""
    p = Path(path)
    if p.is_dir():
        m = Manifest.read(p)
        if m is None or not m.done:
            raise MrtInputError(f"{str(p)!r} is not a finished dataset (its job has not completed)")
        files = [part_path(p, i) for i in range(m.n_parts)]
        return pl.read_parquet([str(f) for f in files if f.exists()])
    return _formats.read_table(p)


__all__: list[Any] = ["EmbedReport", "embed_dataset", "read_dataset"]
