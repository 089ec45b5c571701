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
  ``prompt_id`` and ``margin``), pairs chosen in each prompt's responses by a
  named rule (``pairs``: sweet-spot, the default, best-worst, margin, diverse,
  all; see `mrt_fast.llm.pairs` and docs/guides/preference.md).
* ``kto``: TRL's unpaired format, ``prompt``/``completion``/``label``, the
  label by a named rule (``kto_label``: quantile:Q, the default quantile:0.5,
  threshold:X, column:NAME or pool-mean; see `mrt_fast.llm.labels`).
* ``listwise``: one row per prompt, ``prompt``, ``completions`` (best first)
  and their ``rewards``.

The prompt format is one rule for ``trl``, ``dpo``, ``kto`` and ``listwise``:
with ``conversational=None`` it is the one `mrt_fast.llm.train` uses,
conversational when the ``tokenizer`` has a chat template (TRL then applies
that template, so the model sees the same prompt text as in ``mrt train`` and
``mrt nll``), plain strings when it has none; without a tokenizer,
conversational (the bundled SmolLM2 and instruct models have a template).

The preference formats take the rows of the kept responses (``pairs_from=
"kept"``) or, given the whole candidate table as ``pool``, every candidate of
the kept prompts (``pairs_from="pool"``). Copies of one text in a prompt are
one response with their mean reward; a non-finite or missing reward, or a
missing prompt id, is refused naming its row. Prompts and responses that give
no row (one response, equal rewards, no pair under the rule, no label) are
counted in the `ExportReport` (``return_report=True``; otherwise a warning
names them).

The format of a TRL file follows the suffix of ``out`` (.jsonl, .parquet,
.csv not supported for the conversational lists); OpenRLHF files are JSONL.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import polars as pl

from mrt_fast.errors import MrtInputError
from mrt_fast.llm.labels import DEFAULT_LABEL, parse_label_rule
from mrt_fast.llm.models import load_tokenizer, uses_chat_template
from mrt_fast.llm.pairs import DEFAULT_RULE, NEEDS_EMBEDDING, check_pair_options
from mrt_fast.llm.preference import ExportReport, candidates, dpo_rows, kto_rows, listwise_rows
from mrt_fast.tables.layouts import GROUPED, candidate_columns, detect, explode
from mrt_fast.datasets.formats import as_polars, write_table
from mrt_fast.tables.arrays import embeddings as embedding_matrix, require_columns

__all__ = ["FORMATS", "PREFERENCE_FORMATS", "ExportReport", "export"]

FORMATS = ("trl", "openrlhf", "dpo", "kto", "listwise")
PREFERENCE_FORMATS = ("dpo", "kto", "listwise")
SOURCES = ("kept", "pool")


def export(kept: Any, out: str | os.PathLike, format: str = "trl", *, conversational: bool | None = None,
           tokenizer: Any = None, by: str = "prompt_id", prompt: str = "prompt", response: str = "response",
           reward: str = "reward", weight: str = "weight", layout: str = "auto", pairs: str = DEFAULT_RULE,
           min_margin: float = 0.0, max_pairs: int | None = None, embedding: str = "embedding",
           kto_label: str = DEFAULT_LABEL, pool: Any = None, pairs_from: str | None = None,
           return_report: bool = False) -> pl.DataFrame | tuple[pl.DataFrame, ExportReport]:
    """Write the kept rows (a table or a path) as a TRL or OpenRLHF training file; returns what was written
    (and, with ``return_report``, the `ExportReport`).

    One training row per kept response for ``trl`` and ``openrlhf``, whatever the layout: a grouped
    table (one row per prompt, ``response`` holding the list of kept responses, as `select` writes it
    for grouped input) is exploded first. ``conversational=None``: the prompt format of ``mrt train``
    with ``tokenizer`` (a tokenizer, or a model path or id whose tokenizer is read; see the module
    doc); ``openrlhf`` writes strings. ``pairs``, ``min_margin``, ``max_pairs``, ``embedding``: the
    ``dpo`` pairing rule and its options; ``kto_label``: the ``kto`` label rule; ``pool`` and
    ``pairs_from``: where the preference formats take their responses from (``None``: the pool
    when one is given, else the kept rows)."""
    if format not in FORMATS:
        raise MrtInputError(f"format must be one of {FORMATS}, got {format!r}")
    check_pair_options(pairs, min_margin, max_pairs)
    label_rule = parse_label_rule(kto_label)
    if pairs_from is None:
        pairs_from = "kept" if pool is None else "pool"
    if pairs_from not in SOURCES:
        raise MrtInputError(f"pairs_from must be one of {SOURCES}, got {pairs_from!r}")
    if (pool is not None) != (pairs_from == "pool"):
        raise MrtInputError("pairs from the pool need the candidate table (pool=, mrt export --pool), and the pool "
                            "is read only for pairs from the pool (pairs_from='pool', --pairs-from pool)")
    if pairs_from == "pool" and format not in PREFERENCE_FORMATS:
        raise MrtInputError(f"pairs_from='pool' applies to {PREFERENCE_FORMATS}, not {format!r}")
    if conversational is None:
        if isinstance(tokenizer, (str, os.PathLike)):
            tokenizer = load_tokenizer(tokenizer)
        conversational = format != "openrlhf" and (tokenizer is None or uses_chat_template(tokenizer))
    df = _rows(kept, by, prompt, response, layout, "kept rows")
    out = Path(out)
    if format in PREFERENCE_FORMATS:
        res, rep = _preference(df, out, format, conversational, by, prompt, response, reward, pairs, min_margin,
                               max_pairs, embedding, label_rule, pool, pairs_from, layout)
    else:
        res = _training_rows(df, out, format, conversational, by, prompt, response, reward, weight)
        rep = ExportReport(format, rows_in=df.height, prompts_in=df[by].n_unique(), rows_out=res.height)
    write_table(res, out)
    if return_report:
        return res, rep
    if rep.dropped:
        warnings.warn(f"{format} export: {rep.left_out()} (return_report=True gives the counts)", UserWarning,
                      stacklevel=2)
    return res


def _rows(table: Any, by: str, prompt: str, response: str, layout: str, what: str) -> pl.DataFrame:
    df = as_polars(table)
    require_columns(df, [by, prompt, response], what)
    if detect(df.schema, {response: 0}, layout) == GROUPED:
        df = explode(df, by, candidate_columns(df, by))
    if df.height == 0:
        raise MrtInputError(f"the {what} are empty: there is nothing to export")
    for c in (prompt, response, by):
        if df[c].null_count():
            row = int(df[c].is_null().arg_true()[0])
            raise MrtInputError(f"column {c!r} of the {what} is null at row {row}", column=c, row=row)
    return df


def _check_rewards(df: pl.DataFrame, reward: str, by: str, what: str) -> None:
    s = df[reward]
    if not s.dtype.is_numeric():
        raise MrtInputError(f"column {reward!r} must hold numbers, got {s.dtype}", column=reward)
    bad = ~s.cast(pl.Float64).is_finite().fill_null(False)
    if bad.any():
        row = int(bad.arg_true()[0])
        v = s[row]
        v = "null" if v is None else "NaN" if v != v else v
        raise MrtInputError(f"column {reward!r} of the {what} is {v} at row {row} (prompt {df[by][row]!r}): "
                            "rewards must be finite numbers", column=reward, row=row, pool=df[by][row])


def _pool_rows(pool: Any, kept: pl.DataFrame, by: str, prompt: str, response: str, layout: str) -> pl.DataFrame:
    """The candidate rows of the kept prompts."""
    rows = _rows(pool, by, prompt, response, layout, "pool rows")
    if rows[by].dtype != kept[by].dtype:
        raise MrtInputError(f"column {by!r} is {kept[by].dtype} in the kept rows but {rows[by].dtype} in the pool",
                            column=by)
    ids = kept[by].unique(maintain_order=True)
    missing = ids.filter(~ids.is_in(rows[by].implode()))
    if len(missing):
        raise MrtInputError(f"{len(missing)} prompts of the kept rows are not in the pool, e.g. {missing[0]!r}: "
                            "pass the candidate table the kept rows were selected from", pool=missing[0])
    return rows.filter(pl.col(by).is_in(ids.implode()))


def _preference(df, out, format, conversational, by, prompt, response, reward, rule, min_margin, max_pairs,
                embedding, label_rule, pool, pairs_from, layout) -> tuple[pl.DataFrame, ExportReport]:
    src = df if pairs_from == "kept" else _pool_rows(pool, df, by, prompt, response, layout)
    what = f"{pairs_from} rows"
    label = label_rule.column if format == "kto" else None
    if label is None or label_rule.kind != "column":
        if reward not in src.columns:
            raise MrtInputError(f"{format} rows are built from rewards: the {what} have no {reward!r} column "
                                "(score them first: mrt score)", column=reward)
        _check_rewards(src, reward, by, what)
    else:
        if label not in src.columns:
            raise MrtInputError(f"kto_label {label_rule.spec!r}: the {what} have no {label!r} column", column=label)
        if src[label].dtype != pl.Boolean:
            raise MrtInputError(f"kto_label {label_rule.spec!r}: column {label!r} must be boolean (a checker's "
                                f"verdict), got {src[label].dtype}", column=label)
        if reward not in src.columns:  # the verdict is the label; rows keep their order by it
            src = src.with_columns(pl.col(label).cast(pl.Float64).fill_null(0.5).alias(reward))
        else:
            _check_rewards(src, reward, by, what)
    emb = None
    if format == "dpo" and rule in NEEDS_EMBEDDING:
        if embedding not in src.columns:
            raise MrtInputError(f"the {rule!r} pairing rule compares responses by their embeddings: the {what} "
                                f"have no {embedding!r} column (mrt embed, or --embedding NAME)", column=embedding)
        embedding_matrix(src, embedding)  # refuses nulls and ragged embeddings, naming the row
        emb = embedding
    if conversational and out.suffix == ".csv":
        raise MrtInputError("conversational rows hold lists of messages: write .jsonl or .parquet "
                            "(or plain strings: conversational=False, mrt export --plain)")
    cands = candidates(src, by, prompt, response, reward, emb, label)
    rep = ExportReport(format, rule=rule if format == "dpo" else label_rule.spec if format == "kto" else None,
                       source=pairs_from, rows_in=src.height, prompts_in=src[by].n_unique(),
                       duplicates_merged=src.height - cands.height)
    if format == "dpo":
        res = dpo_rows(cands, rep, by, prompt, response, rule, min_margin, max_pairs, conversational, emb)
    elif format == "kto":
        rewards = src[reward].cast(pl.Float64).to_numpy()
        res = kto_rows(cands, rep, by, prompt, response, label_rule, rewards, conversational)
    else:
        res = listwise_rows(cands, rep, by, prompt, response, conversational)
    rep.rows_out = res.height
    if res.height == 0:
        raise MrtInputError(f"no {format} row could be built: {rep}")
    return res, rep


def _training_rows(df, out, format, conversational, by, prompt, response, reward, weight) -> pl.DataFrame:
    from mrt_fast.llm.train import pair_weights

    if format == "openrlhf":
        if out.suffix not in (".jsonl", ".ndjson"):
            raise MrtInputError(f"an OpenRLHF file is JSON lines: name it .jsonl, got {out.name!r}")
        cols = [pl.col(prompt).alias("input"), pl.col(response).alias("output")]
        if reward in df.columns:
            _check_rewards(df, reward, by, "kept rows")
            cols.append(pl.col(reward).cast(pl.Float64).alias("reward"))
        return df.select(cols)
    w = pair_weights(df[by], True, df[weight].cast(pl.Float64).to_numpy() if weight in df.columns else None)
    if conversational:
        if out.suffix == ".csv":
            raise MrtInputError("conversational TRL rows hold lists of messages: write .jsonl or .parquet "
                                "(or plain strings: conversational=False, mrt export --plain)")
        msg = lambda role, c: pl.concat_list(pl.struct(pl.lit(role).alias("role"), pl.col(c).alias("content")))  # noqa: E731
        cols = [msg("user", prompt).alias("prompt"), msg("assistant", response).alias("completion")]
    else:
        cols = [pl.col(prompt).alias("prompt"), pl.col(response).alias("completion")]
    return df.select(pl.col(by).alias("prompt_id"), *cols).with_columns(pl.Series("weight", w))
