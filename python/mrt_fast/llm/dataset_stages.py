"""Per-response losses and rewards over a dataset: `mrt nll` and `mrt score` as stages of the job.

Both read a file, a directory (an ``mrt`` output included) or a glob, in
either layout, and write a file or a resumable directory of parts
(:class:`mrt_fast.datasets.job.Job`): parts are runs of ``rows_per_part``
consecutive input rows; a rerun of a killed job does only the missing parts.
They run on the local engine (the model loaded once, before the first part,
and only when there is work) or on Ray (``engine="ray"``: a pool of
``workers`` actors, each loading the model once, with the same parts,
manifest and resume). The stages are picklable row stages
(:class:`NllRows`, :class:`ScoreRows`; :mod:`mrt_fast.datasets.stage`):
opening one loads the model and returns the function of a part.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable

import polars as pl

from mrt_fast.datasets.report import JobReport
from mrt_fast.datasets.stage import FromFactory, RowStage
from mrt_fast.errors import MrtInputError

__all__ = ["NllRows", "ScoreRows", "StageReport", "nll_dataset", "run_text_stage", "score_dataset"]


@dataclass(repr=False)
class StageReport(JobReport):
    """What a dataset stage run did (nll, score, or any :func:`run_text_stage`): the job's
    fields (:class:`~mrt_fast.datasets.report.JobReport`)."""


def _check_rows_per_part(rows_per_part: Any) -> int:
    if isinstance(rows_per_part, bool) or not isinstance(rows_per_part, int) or rows_per_part < 1:
        raise MrtInputError(f"rows_per_part must be an integer >= 1, got {rows_per_part!r}")
    return rows_per_part


def run_text_stage(source: Any, output: str | os.PathLike, *, name: str, columns: tuple[str, ...], out_column: str,
                   parameters: dict, make_stage: Any, rows_per_part: int = 50_000, overwrite: bool = False,
                   engine: str = "local", ray_address: str | None = None, workers: int | None = None,
                   progress: Any = False, layout: str = "auto", allow_partial: bool = False) -> StageReport:
    """Run a stage that adds ``out_column`` to rows holding text ``columns``: ``make_stage`` is a
    row stage (:class:`~mrt_fast.datasets.stage.RowStage`) or a factory whose call (once per
    worker, when there is work; picklable for ``engine="ray"``) returns the function of a part.
    ``progress``: the job's display (:class:`mrt_fast.datasets.progress.JobProgress`), by rows
    (prompts in the grouped layout, told from the last of ``columns``, the responses) and, on the
    local engine, by candidates as the model does them: a factory that takes ``tick`` gets the
    display's :meth:`~mrt_fast.datasets.progress.JobProgress.tick` to call after each batch.
    ``allow_partial``: read the finished parts of an unfinished ``mrt`` output (refused otherwise)."""
    from mrt_fast.datasets import sources
    from mrt_fast.datasets.executors import executor, only_on, run_row_parts
    from mrt_fast.datasets.job import Job
    from mrt_fast.tables.layouts import GROUPED, detect

    t0 = time.perf_counter()
    rows_per_part = _check_rows_per_part(rows_per_part)
    executor(engine)
    only_on(engine, "ray", {"ray_address": ray_address, "workers": workers})
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise MrtInputError(f"workers must be an integer >= 1, got {workers!r}")
    stage = make_stage if isinstance(make_stage, RowStage) else FromFactory(make_stage, name=name, loads="the model")
    ds = sources.discover(source, allow_partial=allow_partial)
    schema = ds.check_columns([(c, "text") for c in columns])
    if out_column in schema.names():
        raise MrtInputError(f"{ds.source!r} already has a {out_column!r} column", column=out_column)
    grouped = detect(schema, {columns[-1]: 0}, layout) == GROUPED
    job_ = Job(ds, output, {**parameters, "rows_per_part": rows_per_part}, overwrite=overwrite,
               command=f"mrt {name}", what=name, progress=progress)
    if grouped:
        job_.progress.set_unit("prompts")
    with job_ as job:
        n = job.count_rows()
        parts = max(1, -(-n // rows_per_part))
        rep = StageReport(output=str(job.out), engine=engine, layout="grouped" if grouped else "flat", rows=n,
                          parts=parts if job.to_dir else 1, resumed=job.resumed, already_done=job.done,
                          notes=list(job.notes))
        if job.done:
            rep.rows_out = job.rows_written
            rep.seconds = time.perf_counter() - t0
            return rep
        ticks = getattr(stage, "takes_tick", False) if job.progress.mode != "off" else False

        def items() -> int:  # the candidates, for a display ticked by the stage (counted when it is shown)
            return count_candidates(ds, columns[-1], grouped, n)

        r = run_row_parts(job, stage, engine=engine, rows_per_part=rows_per_part, n_rows=n, workers=workers,
                          address=ray_address, items_total=items if ticks else None)
        rep.parts = r["parts"] if job.to_dir else 1
        rep.parts_done_now = r["parts_done_now"] if job.to_dir else 1
        rep.rows_done_now, rep.rows_out = r["rows_done_now"], r["rows_written"]
        rep.logs = job.logs
    rep.seconds = time.perf_counter() - t0
    return rep


def count_candidates(ds: Any, column: str, grouped: bool, n_rows: int) -> int:
    """The candidates of a dataset: its rows, or (grouped) the sum of the lengths of ``column``'s lists."""
    if not grouped:
        return n_rows
    try:
        return int(ds.scan().select(pl.col(column).list.len().sum()).collect().item() or 0)
    except Exception:  # noqa: BLE001 - a count for the display only; the stage names a bad file
        return n_rows


class NllRows(RowStage):
    """The nll stage (:mod:`mrt_fast.datasets.stage`), picklable: ``NllRows(kw, model=, tokenizer=)()`` or with ``loader``
    (called in the worker) returns the function of a part, :func:`mrt_fast.llm.nll.nll_table` with ``kw``."""

    name, loads, takes_tick = "nll", "the model", True

    def __init__(self, kw: dict, model: Any = None, tokenizer: Any = None,
                 loader: Callable[[], tuple[Any, Any]] | None = None):
        if (model is None) == (loader is None):
            raise MrtInputError("give a model (and its tokenizer) or a loader, one of the two")
        self.kw, self.model, self.tokenizer, self.loader = kw, model, tokenizer, loader

    def open(self, tick: Callable[[int], None] | None = None) -> Callable[[pl.DataFrame], pl.DataFrame]:
        """The function of a part; ``tick(n)`` (local engine) is called as each batch of ``n`` pairs is done."""
        from mrt_fast.llm.nll import nll_table

        m, tok = self.loader() if self.loader is not None else (self.model, self.tokenizer)
        kw = self.kw if tick is None else {**self.kw, "callback": tick}
        return lambda df: nll_table(df, m, tok, **kw)


class ScoreRows(RowStage):
    """The score stage (:mod:`mrt_fast.datasets.stage`), picklable: ``ScoreRows(model, kw, batch_size, device)()`` loads the
    reward model (a path, or a loaded :class:`~mrt_fast.llm.reward.RewardModel`) and returns the
    function of a part, :func:`mrt_fast.llm.reward.score` with ``kw``."""

    name, loads, takes_tick = "score", "the model", True

    def __init__(self, model: Any, kw: dict, batch_size: int = 16, device: str = "auto"):
        self.model, self.kw, self.batch_size, self.device = model, kw, batch_size, device

    def open(self, tick: Callable[[int], None] | None = None) -> Callable[[pl.DataFrame], pl.DataFrame]:
        """The function of a part; ``tick(n)`` (local engine) is called as each batch of ``n`` pairs is scored."""
        from mrt_fast.llm.reward import RewardModel, score

        rm = self.model if isinstance(self.model, RewardModel) else RewardModel(
            self.model, batch_size=self.batch_size, device=self.device)
        kw = self.kw if tick is None else {**self.kw, "callback": tick}
        return lambda df: score(df, rm, **kw)


def nll_dataset(source: Any, output: str | os.PathLike, model: Any = None, tokenizer: Any = None, *,
                loader: Callable[[], tuple[Any, Any]] | None = None, prompt: str = "prompt", response: str = "response",
                loss: str = "loss", by: str = "prompt_id", layout: str = "auto", batch_size: int = 8,
                max_length: int | None = None, prompt_format: str = "auto", device: str | None = None,
                rows_per_part: int = 50_000, overwrite: bool = False, progress: Any = False,
                engine: str = "local", ray_address: str | None = None, workers: int | None = None,
                allow_partial: bool = False) -> StageReport:
    """Every response's loss (:func:`mrt_fast.llm.nll.nll_table`) over a dataset: ``model`` and
    ``tokenizer`` loaded, or ``loader()`` returning them, called only when there is work (once per
    Ray worker with ``engine="ray"``). ``progress``: the job's display (True: a bar on a terminal,
    plain lines otherwise). ``allow_partial``: read the finished parts of an unfinished ``mrt``
    output (refused otherwise)."""
    kw = dict(prompt=prompt, response=response, out=loss, by=by, layout=layout, batch_size=batch_size,
              max_length=max_length, prompt_format=prompt_format, device=device, progress=False)
    make = NllRows(kw, model=model, tokenizer=tokenizer, loader=loader)
    name = getattr(getattr(model, "config", None), "name_or_path", None) or getattr(loader, "model_id", None)
    params = {"model": str(name), "prompt": prompt,
              "response": response, "loss": loss, "max_length": max_length, "prompt_format": prompt_format}
    return run_text_stage(source, output, name="nll", columns=(prompt, response), out_column=loss,
                          parameters=params, make_stage=make, rows_per_part=rows_per_part, overwrite=overwrite,
                          engine=engine, ray_address=ray_address, workers=workers, progress=progress,
                          layout=layout, allow_partial=allow_partial)


def score_dataset(source: Any, output: str | os.PathLike, model: Any, *, prompt: str = "prompt",
                  response: str = "response", column: str = "reward", by: str = "prompt_id", layout: str = "auto",
                  batch_size: int = 16, device: str = "auto", rows_per_part: int = 50_000,
                  overwrite: bool = False, progress: Any = False, engine: str = "local",
                  ray_address: str | None = None, workers: int | None = None,
                  allow_partial: bool = False) -> StageReport:
    """Every response's reward (:func:`mrt_fast.llm.reward.score`) over a dataset; ``model`` a
    reward model path or a loaded :class:`~mrt_fast.llm.reward.RewardModel` (loaded once per Ray
    worker with ``engine="ray"``). ``progress`` and ``allow_partial`` as in :func:`nll_dataset`."""
    make = ScoreRows(model, dict(prompt=prompt, response=response, column=column, by=by, layout=layout,
                                 progress=False), batch_size=batch_size, device=device)
    params = {"model": str(model) if isinstance(model, (str, os.PathLike)) else repr(type(model)),
              "prompt": prompt, "response": response, "column": column}
    return run_text_stage(source, output, name="score", columns=(prompt, response), out_column=column,
                          parameters=params, make_stage=make, rows_per_part=rows_per_part, overwrite=overwrite,
                          engine=engine, ray_address=ray_address, workers=workers, progress=progress,
                          layout=layout, allow_partial=allow_partial)
