"""Kept rows as training files for the trainers people already use.

* ``trl``: TRL's prompt/completion format, one row per kept (prompt, response):
  conversational, ``prompt = [{"role": "user", "content": ...}]`` and
  ``completion = [{"role": "assistant", "content": ...}]``, or with
  ``conversational=False`` ``prompt`` and ``completion`` strings. By default
  the prompt format is the one `mrt_fast.llm.train` uses: conversational when
  the ``tokenizer`` has a chat template (TRL then applies that template, so the
  model sees the same prompt text as in ``mrt train`` and ``mrt nll``), plain
  strings when it has none; without a tokenizer, conversational (the bundled
  SmolLM2 and instruct models have a template). Plus ``prompt_id``
  and ``weight``, the per-pair weight of the multi-response objective,
  N / (N_p K_i) times the stratified selector's ``weight`` when present (mean
  1 without it): a prompt with K_i kept responses counts once in total.
  TRL's SFTTrainer ignores extra columns; use ``weight`` in a custom loss, or
  ``mrt train``, which applies it.
* ``openrlhf``: JSON lines with ``input``, ``output`` and (when the rows have a
  reward) ``reward``, the keys OpenRLHF's ``--input_key``/``--output_key``
  options read by default in its examples.
* ``dpo``: TRL's preference format, ``prompt``/``chosen``/``rejected`` (plus
  ``prompt_id`` and ``margin``), conversational when asked. Pairs are built in
  each pool from its rows' rewards: sorted by reward (ties by row order), the
  best is paired with the worst, the second best with the second worst, and so
  on, while the reward gap is at least ``min_margin``; at most ``max_pairs``
  pairs a prompt (each response in at most one pair). Pools with fewer than
  two responses, or no gap of ``min_margin``, give no pair (reported).
* ``kto``: TRL's unpaired format, ``prompt``/``completion``/``label``: a
  response is desirable (``label=True``) when its reward is above its pool's
  mean reward, undesirable when below; responses at the mean are left out.

The format of a TRL file follows the suffix of ``out`` (.jsonl, .parquet,
.csv not supported for the conversational lists); OpenRLHF files are JSONL.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import polars as pl

from mrt_fast.errors import MrtInputError
from mrt_fast.llm.models import uses_chat_template
from mrt_fast.tables.layouts import GROUPED, candidate_columns, detect, explode
from mrt_fast.datasets.formats import as_polars, write_table
from mrt_fast.tables.arrays import require_columns

FORMATS = ("trl", "openrlhf", "dpo", "kto")


def export(kept: Any, out: str | os.PathLike, format: str = "trl", *, conversational: bool | None = None,
           tokenizer: Any = None, by: str = "prompt_id", prompt: str = "prompt", response: str = "response", reward: str = "reward",
           weight: str = "weight", layout: str = "auto", min_margin: float = 0.0,
           max_pairs: int | None = None) -> pl.DataFrame:
    """Write the kept rows (a table or a path) as a TRL or OpenRLHF training file; returns what was written.

    One training row per kept response, whatever the layout: a grouped table
    (one row per prompt, ``response`` holding the list of kept responses, as
    `select` writes it for grouped input) is exploded first, so each response
    gets its own row and its own weight. ``conversational=None``: for ``trl``,
    the prompt format of ``mrt train`` with ``tokenizer`` (see the module doc);
    plain strings for the other formats."""
    from mrt_fast.llm.train import pair_weights

    if format not in FORMATS:
        raise MrtInputError(f"format must be one of {FORMATS}, got {format!r}")
    if conversational is None:
        conversational = format == "trl" and (tokenizer is None or uses_chat_template(tokenizer))
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
    if format in ("dpo", "kto"):
        if reward not in df.columns:
            raise MrtInputError(f"{format} rows are built from rewards: the kept rows have no {reward!r} column "
                                "(score them first: mrt score)", column=reward)
        if not df[reward].dtype.is_numeric() or df[reward].null_count() or not df[reward].cast(pl.Float64).is_finite().all():
            raise MrtInputError(f"column {reward!r} must hold finite numbers", column=reward)
        if conversational and out.suffix == ".csv":
            raise MrtInputError("conversational rows hold lists of messages: write .jsonl or .parquet")
        res = (preference_pairs(df, by, prompt, response, reward, min_margin, max_pairs, conversational)
               if format == "dpo" else kto_rows(df, by, prompt, response, reward, conversational))
        if res.height == 0:
            raise MrtInputError(f"no {format} row could be built: every pool has fewer than two responses"
                                + (f" or no reward gap of {min_margin}" if format == "dpo" else " or equal rewards"))
        write_table(res, out)
        return res
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
                raise MrtInputError("conversational TRL rows hold lists of messages: write .jsonl or .parquet "
                                    "(or plain strings: conversational=False, mrt export --plain)")
            msg = lambda role, c: pl.concat_list(pl.struct(pl.lit(role).alias("role"), pl.col(c).alias("content")))  # noqa: E731
            cols = [msg("user", prompt).alias("prompt"), msg("assistant", response).alias("completion")]
        else:
            cols = [pl.col(prompt).alias("prompt"), pl.col(response).alias("completion")]
        res = df.select(pl.col(by).alias("prompt_id"), *cols).with_columns(pl.Series("weight", w))
    write_table(res, out)
    return res


def _message(role: str, col: str) -> pl.Expr:
    return pl.concat_list(pl.struct(pl.lit(role).alias("role"), pl.col(col).alias("content")))


def preference_pairs(df: pl.DataFrame, by: str, prompt: str, response: str, reward: str, min_margin: float = 0.0,
                     max_pairs: int | None = None, conversational: bool = False) -> pl.DataFrame:
    """DPO pairs of each pool: best with worst, second best with second worst, ..., while the reward
    gap is at least ``min_margin``; at most ``max_pairs`` a pool. Pools in order of first appearance."""
    if not isinstance(min_margin, (int, float)) or isinstance(min_margin, bool) or not min_margin >= 0:
        raise MrtInputError(f"min_margin must be a number >= 0, got {min_margin!r}")
    if max_pairs is not None and (isinstance(max_pairs, bool) or not isinstance(max_pairs, int) or max_pairs < 1):
        raise MrtInputError(f"max_pairs must be an integer >= 1, got {max_pairs!r}")
    ranked = df.with_row_index("__row").with_columns(pl.col(reward).cast(pl.Float64).alias("__r"),
                                                     pl.len().over(by).alias("__n"))
    # each pool best-first and worst-first (ties by row order), paired position by position
    best = ranked.sort([by, "__r", "__row"], descending=[False, True, False], maintain_order=True)
    best = best.with_columns(pl.int_range(pl.len()).over(by).alias("__i"))
    worst = ranked.sort([by, "__r", "__row"], descending=[False, False, True], maintain_order=True)
    worst = worst.with_columns(pl.int_range(pl.len()).over(by).alias("__i"))
    pairs = best.select(by, prompt, "__i", "__n", pl.col(response).alias("chosen"), pl.col("__r").alias("__rc"),
                        pl.col("__row").alias("__first")).join(
        worst.select(by, "__i", pl.col(response).alias("rejected"), pl.col("__r").alias("__rr")), on=[by, "__i"])
    pairs = pairs.filter((pl.col("__i") < pl.col("__n") // 2) & (pl.col("__rc") - pl.col("__rr") >= min_margin)
                         & (pl.col("__rc") > pl.col("__rr")))
    if max_pairs is not None:
        pairs = pairs.filter(pl.col("__i") < max_pairs)
    first = df.with_row_index("__row").group_by(by, maintain_order=True).agg(pl.col("__row").first().alias("__o"))
    pairs = pairs.join(first, on=by).sort(["__o", "__i"]).with_columns((pl.col("__rc") - pl.col("__rr")).alias("margin"))
    if conversational:
        cols = [_message("user", prompt).alias("prompt"), _message("assistant", "chosen").alias("chosen"),
                _message("assistant", "rejected").alias("rejected")]
    else:
        cols = [pl.col(prompt).alias("prompt"), "chosen", "rejected"]
    return pairs.select(pl.col(by).alias("prompt_id"), *cols, "margin")


def kto_rows(df: pl.DataFrame, by: str, prompt: str, response: str, reward: str,
             conversational: bool = False) -> pl.DataFrame:
    """KTO rows: each response labelled desirable above its pool's mean reward, undesirable below."""
    r = pl.col(reward).cast(pl.Float64)
    rows = df.with_columns((r - r.mean().over(by)).alias("__d")).filter(pl.col("__d") != 0)
    label = (pl.col("__d") > 0).alias("label")
    if conversational:
        cols = [_message("user", prompt).alias("prompt"), _message("assistant", response).alias("completion")]
    else:
        cols = [pl.col(prompt).alias("prompt"), pl.col(response).alias("completion")]
    return rows.select(pl.col(by).alias("prompt_id"), *cols, label)
