"""Per-response losses and rewards over a dataset: `mrt nll` and `mrt score` as stages of the job.

Both read a file, a directory (an ``mrt`` output included) or a glob, in
either layout, and write a file or a resumable directory of parts
(:class:`mrt_fast.datasets.job.Job`): parts are runs of ``rows_per_part``
consecutive input rows; a rerun of a killed job does only the missing parts.
The model is loaded once, before the first part, and only when there is work.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable

import polars as pl

from mrt_fast.errors import MrtInputError


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

    def __str__(self) -> str:
        if self.already_done:
            return f"{self.output}: already complete ({self.rows} rows in {self.parts} part(s))"
        how = "resumed" if self.resumed else "done"
        return (f"{self.output}: {how}; {self.rows_done_now} of {self.rows} rows in {self.parts_done_now} of "
                f"{self.parts} part(s) this run, {self.seconds:.1f} s")


def _check_rows_per_part(rows_per_part: Any) -> int:
    if isinstance(rows_per_part, bool) or not isinstance(rows_per_part, int) or rows_per_part < 1:
        raise MrtInputError(f"rows_per_part must be an integer >= 1, got {rows_per_part!r}")
    return rows_per_part


def run_text_stage(source: Any, output: str | os.PathLike, *, name: str, columns: tuple[str, ...], out_column: str,
                   parameters: dict, load: Callable[[], Callable[[pl.DataFrame], pl.DataFrame]],
                   rows_per_part: int = 50_000, overwrite: bool = False) -> StageReport:
    """Run a stage that adds ``out_column`` to rows holding text ``columns``; ``load()`` (called
    once, when there is work) returns the stage's function of a part."""
    from mrt_fast.datasets import sources
    from mrt_fast.datasets.job import Job, run_row_parts

    t0 = time.perf_counter()
    rows_per_part = _check_rows_per_part(rows_per_part)
    ds = sources.discover(source)
    schema = ds.check_columns([(c, "text") for c in columns])
    if out_column in schema.names():
        raise MrtInputError(f"{ds.source!r} already has a {out_column!r} column", column=out_column)
    job_ = Job(ds, output, {**parameters, "rows_per_part": rows_per_part}, overwrite=overwrite,
               command=f"mrt {name}")
    with job_ as job:
        n = job.count_rows()
        parts = max(1, -(-n // rows_per_part))
        rep = StageReport(output=str(job.out), rows=n, parts=parts if job.to_dir else 1, parts_done_now=0,
                          rows_done_now=0, resumed=job.resumed, already_done=job.done, seconds=0.0)
        if job.done:
            rep.seconds = time.perf_counter() - t0
            return rep
        fn: list = []

        def stage(df: pl.DataFrame) -> pl.DataFrame:
            if not fn:
                fn.append(load())
            return fn[0](df)

        r = run_row_parts(job, stage, rows_per_part=rows_per_part, n_rows=n)
        rep.parts_done_now = r["parts_done_now"] if job.to_dir else 1
        rep.rows_done_now = r["rows_done_now"]
    rep.seconds = time.perf_counter() - t0
    return rep


def nll_dataset(source: Any, output: str | os.PathLike, model: Any = None, tokenizer: Any = None, *,
                loader: Callable[[], tuple[Any, Any]] | None = None, prompt: str = "prompt", response: str = "response", loss: str = "loss", by: str = "prompt_id",
                layout: str = "auto", batch_size: int = 8, max_length: int | None = None,
                prompt_format: str = "auto", device: str | None = None, rows_per_part: int = 50_000,
                overwrite: bool = False, progress: bool = False) -> StageReport:
    """Every response's loss (:func:`mrt_fast.llm.nll.nll_table`) over a dataset: ``model`` and
    ``tokenizer`` loaded, or ``loader()`` returning them, called only when there is work."""
    from mrt_fast.llm.nll import nll_table

    if (model is None) == (loader is None):
        raise MrtInputError("give a model (and its tokenizer) or a loader, one of the two")

    def load():
        m, tok = loader() if loader is not None else (model, tokenizer)
        return lambda df: nll_table(df, m, tok, prompt=prompt, response=response, out=loss, by=by, layout=layout,
                                    batch_size=batch_size, max_length=max_length, prompt_format=prompt_format,
                                    device=device, progress=progress)

    name = getattr(getattr(model, "config", None), "name_or_path", None) or getattr(loader, "model_id", None)
    params = {"model": str(name), "prompt": prompt,
              "response": response, "loss": loss, "max_length": max_length, "prompt_format": prompt_format}
    return run_text_stage(source, output, name="nll", columns=(prompt, response), out_column=loss,
                          parameters=params, load=load, rows_per_part=rows_per_part, overwrite=overwrite)


def score_dataset(source: Any, output: str | os.PathLike, model: Any, *, prompt: str = "prompt",
                  response: str = "response", column: str = "reward", by: str = "prompt_id", layout: str = "auto",
                  batch_size: int = 16, device: str = "auto", rows_per_part: int = 50_000,
                  overwrite: bool = False, progress: bool = False) -> StageReport:
    """Every response's reward (:func:`mrt_fast.llm.reward.score`) over a dataset; ``model`` a
    reward model path or a loaded :class:`~mrt_fast.llm.reward.RewardModel`."""
    from mrt_fast.llm.reward import RewardModel, score

    def load():
        rm = model if isinstance(model, RewardModel) else RewardModel(model, batch_size=batch_size, device=device)
        return lambda df: score(df, rm, prompt=prompt, response=response, column=column, by=by, layout=layout,
                                progress=progress)

    params = {"model": str(model) if isinstance(model, (str, os.PathLike)) else repr(type(model)),
              "prompt": prompt, "response": response, "column": column}
    return run_text_stage(source, output, name="score", columns=(prompt, response), out_column=column,
                          parameters=params, load=load, rows_per_part=rows_per_part, overwrite=overwrite)
