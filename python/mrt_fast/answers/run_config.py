"""The ``answers`` section of an ``mrt run`` config: modes and rewards from the answer itself.

.. code-block:: yaml

    answers:
      extract: boxed          # any extract of mrt_fast.answers (json:PATH, regex:PATTERN, code, ...)
      reference: answer       # a column of the train prompts table (code: tests)
      mode: answer            # stratified selection by answer (default); embedding: k-means modes
      reward: checker         # the checker's verdict is the reward (default); model: reward_model/reward_fn
      # any other keyword of mrt_fast.answers: check, abs_tol, normalize, partial, drop_zero_signal, sandbox ...

The scoring stage then adds ``answer``, ``mode``, ``reward`` and ``correct`` to the
candidates (``scored.parquet``), joining the reference (or tests) column of the
train prompts by prompt id.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from mrt_fast.errors import MrtInputError

__all__ = ["answer_columns", "check_answers_config"]

MODES = ("answer", "embedding")
REWARDS = ("checker", "model")
_NOT_HERE = {"by", "response", "layout", "return_report", "answer", "mode", "reward", "correct"}


def check_answers_config(section: Any, reward_model: Any = None, reward_fn: Any = None) -> dict | None:
    """The ``answers`` section checked (one-line errors before any work); None when absent."""
    if section is None:
        return None
    if not isinstance(section, dict):
        raise MrtInputError(f"config answers must be a mapping (extract, reference, mode, reward, ...), "
                            f"got {type(section).__name__}")
    sec = dict(section)
    mode, reward = sec.get("mode", "answer"), sec.get("reward", "checker")
    if mode not in MODES:
        raise MrtInputError(f"config answers.mode must be one of {MODES}, got {mode!r}")
    if reward not in REWARDS:
        raise MrtInputError(f"config answers.reward must be one of {REWARDS}, got {reward!r}")
    if reward == "checker" and (reward_model or reward_fn is not None):
        raise MrtInputError("config answers.reward: checker gives the reward; leave out reward_model and reward_fn, "
                            "or set answers.reward: model")
    if reward == "checker" and sec.get("reference") is None and sec.get("tests") is None:
        raise MrtInputError("config answers.reward: checker needs answers.reference (or answers.tests with "
                            "extract: code), a column of the train prompts")
    bad = sorted(set(sec) & _NOT_HERE - {"mode", "reward"})
    if bad:
        raise MrtInputError(f"config answers: {bad} are set by mrt run (the candidates' columns)")
    from mrt_fast.answers.table import options

    kw = _keywords(sec)
    options(**{**kw, **_inner(kw)})  # every other keyword checked now
    return sec


def _keywords(sec: dict) -> dict:
    kw = {k: v for k, v in sec.items() if k not in ("mode", "reward")}
    if sec.get("reward", "checker") == "model":
        kw["reward"], kw["correct"] = "answer_reward", "answer_correct"
    return kw


def _inner(kw: dict) -> dict:
    """The reference (or tests) column under a name of its own: a column of the prompts named like an
    output of answers (``answer``) then serves as the reference."""
    return {k: f"__mrt_{k}" for k in ("reference", "tests") if kw.get(k) is not None}


def answer_columns(df: pl.DataFrame, sec: dict, prompts: pl.DataFrame) -> pl.DataFrame:
    """The candidates ``df`` with the answer columns of ``sec`` (a checked ``answers`` section);
    the reference (or tests) column comes from the ``prompts`` table by prompt id."""
    from mrt_fast.answers.table import answers

    kw = _keywords(sec)
    inner = _inner(kw)
    given = {k: kw[k] for k in inner}
    ref = [c for c in given.values() if c not in df.columns]
    for c in ref:
        if c not in prompts.columns:
            raise MrtInputError(f"config answers: column {c!r} not found in the train prompts; they have columns "
                                f"{prompts.columns}", column=c)
    joined = df.join(prompts.select("prompt_id", *ref).with_columns(pl.col("prompt_id").cast(df["prompt_id"].dtype)),
                     on="prompt_id", how="left", maintain_order="left") if ref else df
    joined = joined.with_columns(pl.col(c).alias(inner[k]) for k, c in given.items()).drop(ref)
    if sec.get("reward", "checker") == "checker" and "reward" in joined.columns:
        joined = joined.drop("reward")
    out = answers(joined, **{**kw, **inner}).drop(list(inner.values()))
    if sec.get("mode", "answer") == "embedding":
        out = out.drop("mode")
    return out
