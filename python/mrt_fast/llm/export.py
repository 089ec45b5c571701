"""Kept rows as training files for the trainers people already use.

* ``trl``: TRL's prompt/completion format, one row per kept (prompt, response):
  ``prompt`` and ``completion`` strings, or with ``conversational=True``
  ``prompt = [{"role": "user", "content": ...}]`` and
  ``completion = [{"role": "assistant", "content": ...}]``; plus ``prompt_id``
  and ``weight``, the per-pair weight of the multi-response objective,
  N / (N_p K_i) times the stratified selector's ``weight`` when present (mean
  1 without it): a prompt with K_i kept responses counts once in total.
  TRL's SFTTrainer ignores extra columns; use ``weight`` in a custom loss, or
  ``mrt train``, which applies it.
* ``openrlhf``: JSON lines with ``input``, ``output`` and (when the rows have a
  reward) ``reward``, the keys OpenRLHF's ``--input_key``/``--output_key``
  options read by default in its examples.

The format of a TRL file follows the suffix of ``out`` (.jsonl, .parquet,
.csv not supported for the conversational lists); OpenRLHF files are JSONL.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import polars as pl

from mrt_fast.errors import MrtInputError
from mrt_fast.tables.layouts import GROUPED, candidate_columns, detect, explode
from mrt_fast.datasets.formats import as_polars, write_table
from mrt_fast.tables.arrays import require_columns

FORMATS = ("trl", "openrlhf")


def export(kept: Any, out: str | os.PathLike, format: str = "trl", *, conversational: bool = False,
           by: str = "prompt_id", prompt: str = "prompt", response: str = "response", reward: str = "reward",
           weight: str = "weight", layout: str = "auto") -> pl.DataFrame:
    """Write the kept rows (a table or a path) as a TRL or OpenRLHF training file; returns what was written.

    One training row per kept response, whatever the layout: a grouped table
    (one row per prompt, ``response`` holding the list of kept responses, as
    `select` writes it for grouped input) is exploded first, so each response
    gets its own row and its own weight."""
    from mrt_fast.llm.train import pair_weights

    if format not in FORMATS:
        raise MrtInputError(f"format must be one of {FORMATS}, got {format!r}")
    df = as_polars(kept)
    require_columns(df, [by, prompt, response], "kept rows")
    if detect(df.schema, {response: 0}, layout) == GROUPED:
        df = explode(df, by, candidate_columns(df, by))
    if df.height == 0:
        raise MrtInputError("the kept rows are empty: there is nothing to export")
    for c in (prompt, response):
        if df[c].null_count():
            row = int(df[c].is_null().arg_true()[0])
            raise MrtInputError(f"column {c!r} is null at row {row}", column=c, row=row)
    out = Path(out)
    if format == "openrlhf":
        if out.suffix not in (".jsonl", ".ndjson"):
            raise MrtInputError(f"an OpenRLHF file is JSON lines: name it .jsonl, got {out.name!r}")
        cols = [pl.col(prompt).alias("input"), pl.col(response).alias("output")]
        if reward in df.columns:
            cols.append(pl.col(reward).cast(pl.Float64).alias("reward"))
        res = df.select(cols)
    else:
        w = pair_weights(df[by], True, df[weight].cast(pl.Float64).to_numpy() if weight in df.columns else None)
        if conversational:
            if out.suffix == ".csv":
                raise MrtInputError("conversational TRL rows hold lists of messages: write .jsonl or .parquet")
            msg = lambda role, c: pl.concat_list(pl.struct(pl.lit(role).alias("role"), pl.col(c).alias("content")))  # noqa: E731
            cols = [msg("user", prompt).alias("prompt"), msg("assistant", response).alias("completion")]
        else:
            cols = [pl.col(prompt).alias("prompt"), pl.col(response).alias("completion")]
        res = df.select(pl.col(by).alias("prompt_id"), *cols).with_columns(pl.Series("weight", w))
    write_table(res, out)
    return res
