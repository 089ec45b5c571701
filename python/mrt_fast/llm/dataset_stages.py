"""Per-response losses and rewards over a dataset: `mrt nll` and `mrt score` as stages of the job.

Both read a file, a directory (an ``mrt`` output included) or a glob, in
either layout, and write a file or a resumable directory of parts
(:class:`mrt_fast.datasets.job.Job`): parts are runs of ``rows_per_part``
consecutive input rows; a rerun of a killed job does only the missing parts.
They run on the local engine (the model loaded once, before the first part,
and only when there is work) or on Ray (``engine="ray"``: a pool of
``workers`` actors, each loading the model once, with the same parts,
manifest and resume). The stages are picklable factories (:class:`NllRows`,
:class:`ScoreRows`): calling one loads the model and returns the function of
a part.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import polars as pl

from mrt_fast.errors import MrtInputError

__all__ = ["NllRows", "ScoreRows", "StageReport", "nll_dataset", "run_text_stage", "score_dataset"]

ENGINES = ("local", "ray")


@dataclass
class StageReport:
    """What a dataset stage run did."""

    output: str
    rows: int
    parts: int
    parts_done_now: int
    rows_done_now: int
    resumed: bool
    already_done: bool
    seconds: float
    logs: str | None = None  # Ray's log file, when the job sent Ray's own lines there
    notes: list[str] = field(default_factory=list)  # what the job did beside its work (Job.notes)
    unit: str = "rows"  # what a row is: rows, or prompts in the grouped layout

    def __str__(self) -> str:
        from mrt_fast.datasets.job import run_summary

        u = self.unit
        if self.already_done or (self.resumed and self.parts_done_now == 0):
            return f"{self.output}: already complete ({self.rows} {u} in {self.parts} part(s)); nothing to do"
        how = "resumed" if self.resumed else "done"
        return (f"{self.output}: {how}; " + run_summary({"parts": self.parts_done_now, u: self.rows_done_now},
                                                        {"parts": self.parts, u: self.rows})
                + f", {self.seconds:.1f} s" + (f"; Ray's logs: {self.logs}" if self.logs else ""))


def _check_rows_per_part(rows_per_part: Any) -> int:
    if isinstance(rows_per_part, bool) or not isinstance(rows_per_part, int) or rows_per_part < 1:
        raise MrtInputError(f"rows_per_part must be an integer >= 1, got {rows_per_part!r}")
    return rows_per_part


def run_text_stage(source: Any, output: str | os.PathLike, *, name: str, columns: tuple[str, ...], out_column: str,
                   parameters: dict, make_stage: Callable[[], Callable[[pl.DataFrame], pl.DataFrame]],
                   rows_per_part: int = 50_000, overwrite: bool = False, engine: str = "local",
                   ray_address: str | None = None, workers: int | None = None, progress: Any = False,
                   layout: str = "auto", allow_partial: bool = False) -> StageReport:
    """Run a stage that adds ``out_column`` to rows holding text ``columns``: ``make_stage()`` (called
    once per worker, when there is work; picklable for ``engine="ray"``) returns the function of a part.
    ``progress``: the job's display (:class:`mrt_fast.datasets.progress.JobProgress`), by rows
    (prompts in the grouped layout, told from the last of ``columns``, the responses) and, on the
    local engine, by candidates as the model does them: a factory that takes ``tick`` gets the
    display's :meth:`~mrt_fast.datasets.progress.JobProgress.tick` to call after each batch.
    ``allow_partial``: read the finished parts of an unfinished ``mrt`` output (refused otherwise)."""
    from mrt_fast.datasets import sources
    from mrt_fast.datasets.job import Job, run_row_parts
    from mrt_fast.tables.layouts import GROUPED, detect

    t0 = time.perf_counter()
    rows_per_part = _check_rows_per_part(rows_per_part)
    if engine not in ENGINES:
        raise MrtInputError(f"engine must be one of {ENGINES}, got {engine!r}")
    if engine == "local" and (ray_address is not None or workers is not None):
        raise MrtInputError("ray_address and workers apply to engine='ray' only")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise MrtInputError(f"workers must be an integer >= 1, got {workers!r}")
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
        rep = StageReport(output=str(job.out), rows=n, parts=parts if job.to_dir else 1, parts_done_now=0,
                          rows_done_now=0, resumed=job.resumed, already_done=job.done, seconds=0.0,
                          notes=list(job.notes), unit="prompts" if grouped else "rows")
        if job.done:
            rep.seconds = time.perf_counter() - t0
            return rep
        if engine == "ray":
            from mrt_fast.datasets import ray_engine

            r = ray_engine.run_row_parts(job, make_stage, rows_per_part=rows_per_part, n_rows=n, workers=workers,
                                         address=ray_address)
        else:
            import inspect

            fn: list = []
            try:
                ticks = "tick" in inspect.signature(make_stage).parameters
            except (TypeError, ValueError):  # a callable without a signature: no ticks
                ticks = False
            items = count_candidates(ds, columns[-1], grouped, n) if ticks and job.progress.mode != "off" else None

            def stage(df: pl.DataFrame) -> pl.DataFrame:
                if not fn:
                    job.progress.say("loading the model")
                    fn.append(make_stage(tick=job.progress.tick) if ticks else make_stage())
                    job.progress.phase(f"{name} by part")
                return fn[0](df)

            r = run_row_parts(job, stage, rows_per_part=rows_per_part, n_rows=n, items_total=items)
        rep.parts = r["parts"] if job.to_dir else 1
        rep.parts_done_now = r["parts_done_now"] if job.to_dir else 1
        rep.rows_done_now = r["rows_done_now"]
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


class NllRows:
    """The nll stage as a picklable factory: ``NllRows(kw, model=, tokenizer=)()`` or with ``loader``
    (called in the worker) returns the function of a part, :func:`mrt_fast.llm.nll.nll_table` with ``kw``."""

    def __init__(self, kw: dict, model: Any = None, tokenizer: Any = None,
                 loader: Callable[[], tuple[Any, Any]] | None = None):
        if (model is None) == (loader is None):
            raise MrtInputError("give a model (and its tokenizer) or a loader, one of the two")
        self.kw, self.model, self.tokenizer, self.loader = kw, model, tokenizer, loader

    def __call__(self, tick: Callable[[int], None] | None = None) -> Callable[[pl.DataFrame], pl.DataFrame]:
        """The function of a part; ``tick(n)`` (local engine) is called as each batch of ``n`` pairs is done."""
        from mrt_fast.llm.nll import nll_table

        m, tok = self.loader() if self.loader is not None else (self.model, self.tokenizer)
        kw = self.kw if tick is None else {**self.kw, "callback": tick}
        return lambda df: nll_table(df, m, tok, **kw)


class ScoreRows:
    """The score stage as a picklable factory: ``ScoreRows(model, kw, batch_size, device)()`` loads the
    reward model (a path, or a loaded :class:`~mrt_fast.llm.reward.RewardModel`) and returns the
    function of a part, :func:`mrt_fast.llm.reward.score` with ``kw``."""

    def __init__(self, model: Any, kw: dict, batch_size: int = 16, device: str = "auto"):
        self.model, self.kw, self.batch_size, self.device = model, kw, batch_size, device

    def __call__(self, tick: Callable[[int], None] | None = None) -> Callable[[pl.DataFrame], pl.DataFrame]:
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
