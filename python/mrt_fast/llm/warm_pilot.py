"""Warm pilots: the pilot's losses from the model in the state and format training starts from.

`variance_budget` reads V_x and V_y|x off per-response pilot losses. Scored by
a base instruct model on plain text, those losses are dominated by the
surprise at the format (several nats per token that the first few optimizer
steps remove), not by the task. A warm pilot scores them after taking the
format away:

* ``none``: the model as it is, in the given ``prompt_format``;
* ``chat``: the model as it is, prompts formatted by the tokenizer's chat
  template (the format an instruct model was tuned in);
* ``lora``: a short LoRA warm-up (`mrt_fast.llm.train.train`, ``steps``
  optimizer steps) on prompts of the same task that are **not** scored, then
  the warmed model scores the pilot in the format training uses.

The warm-up's prompts must be disjoint from the scored ones (checked: a
shared prompt is an error), so the pilot measures how the model spreads its
loss over prompts and responses it has not trained on.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

import polars as pl

from mrt_fast.errors import MrtInputError

__all__ = ["WARM_PILOTS", "WarmPilot", "warm_config", "check_disjoint", "warm_up", "warm_up_for_dataset", "warm_up_tag",
           "warm_pilot_table"]

WARM_PILOTS = ("none", "chat", "lora")


@dataclass
class WarmPilot:
    """How a pilot was warmed: the adapter to load (``lora``; else None), the prompt format to score in, and a tag
    naming the warm state (e.g. for a stage's record)."""

    mode: str
    prompt_format: str
    adapter: Path | None
    tag: str
    warm_prompts: int = 0


def warm_config(steps: int, **overrides: Any):
    """The warm-up's training settings: ``steps`` optimizer steps of 8 pairs at learning rate 1e-3, LoRA r 8, no
    scheduler warm-up (a short run that learns the format); any `TrainConfig` field overrides."""
    from mrt_fast.llm.train import TrainConfig

    kw = dict(max_steps=steps, batch_size=8, grad_accum=1, learning_rate=1e-3, lora_r=8, lora_alpha=16,
              warmup_ratio=0.0, log_every=max(steps, 1), resume=False)
    kw.update(overrides)
    cfg = TrainConfig(**kw)
    cfg.validate()
    return cfg


def check_disjoint(warm: Iterable[str], scored: Iterable[str]) -> None:
    """Refuse a warm-up that shares a prompt with the scored pilot (named in the error)."""
    shared = set(warm) & set(scored)
    if shared:
        first = sorted(shared)[0]
        raise MrtInputError(f"the warm-up data shares {len(shared)} prompt(s) with the scored pilot, e.g. "
                            f"{first[:60]!r}: warm up on prompts the pilot does not score")


def _data_tag(df: pl.DataFrame, prompt: str, response: str) -> str:
    h = int(df.select(prompt, response).hash_rows(seed=0).sum())
    return hashlib.sha1(str((df.height, h)).encode()).hexdigest()[:12]


def warm_up_tag(warm_data: Any, steps: int, prompt: str = "prompt", response: str = "response") -> str:
    """The tag of a ``lora`` warm-up of ``steps`` steps on ``warm_data`` (`WarmPilot.tag`): equal tags, same warm-up."""
    from mrt_fast.datasets.formats import as_polars

    return f"lora:{steps}:{_data_tag(as_polars(warm_data), prompt, response)}"


def warm_up(model: Any, mode: str, *, scored_prompts: Iterable[str], warm_data: Any = None, steps: int = 16,
            prompt_format: str = "auto", work_dir: str | os.PathLike | None = None, tokenizer: Any = None,
            prompt: str = "prompt", response: str = "response", by: str = "prompt_id", seed: int = 0,
            device: str = "cpu", progress: bool = False, **train_overrides: Any) -> WarmPilot:
    """Bring ``model`` (a path or hub id; a loaded model with ``tokenizer``) to the pilot's warm state.

    ``mode`` is one of `WARM_PILOTS`. ``lora`` trains on ``warm_data`` (a table with ``prompt`` and
    ``response`` columns, and ``by`` if present: else each distinct prompt is one prompt id), whose prompts
    must not be among ``scored_prompts``, for ``steps`` optimizer steps (settings `warm_config`, overridden
    by ``train_overrides``), and writes the adapter under ``work_dir``. ``prompt_format``: the format
    training uses (``chat`` mode always scores with the chat template).
    """
    from mrt_fast.llm.models import load_tokenizer, uses_chat_template

    if mode not in WARM_PILOTS:
        raise MrtInputError(f"warm pilot must be one of {WARM_PILOTS}, got {mode!r}")
    if mode == "none":
        return WarmPilot("none", prompt_format, None, "none")
    if mode == "lora" and not isinstance(model, (str, os.PathLike)):
        raise MrtInputError("warm pilot 'lora' needs the model as a path or hub id (the warm-up trains an adapter "
                            "for it), not a loaded model")
    tok = load_tokenizer(tokenizer if tokenizer is not None else model)
    if mode == "chat":
        if not getattr(tok, "chat_template", None):
            raise MrtInputError("warm pilot 'chat': the tokenizer has no chat template")
        return WarmPilot("chat", "chat", None, "chat")
    if steps < 1:
        raise MrtInputError(f"warm pilot 'lora' needs --warm-steps >= 1, got {steps}")
    if warm_data is None:
        raise MrtInputError("warm pilot 'lora' needs warm-up data: prompts and responses of the task that the "
                            "pilot does not score")
    from mrt_fast.datasets.formats import as_polars
    from mrt_fast.llm.train import train

    df = as_polars(warm_data)
    for c in (prompt, response):
        if c not in df.columns:
            raise MrtInputError(f"warm-up data: column {c!r} not found; it has columns {df.columns}", column=c)
    if df.height == 0:
        raise MrtInputError("warm-up data is empty")
    check_disjoint(df[prompt].drop_nulls().to_list(), scored_prompts)
    if by not in df.columns:
        df = df.with_columns(pl.col(prompt).alias(by))
    fmt = "chat" if uses_chat_template(tok, prompt_format) else "plain"
    cfg = warm_config(steps, seed=seed, prompt_format=fmt, device=device, **train_overrides)
    work = Path(work_dir) if work_dir is not None else Path(tempfile.mkdtemp(prefix="mrt_warm_"))
    res = train(df.select(by, prompt, response), model, work, cfg, tokenizer=tokenizer, by=by, prompt=prompt,
                response=response, progress=progress)
    tag = warm_up_tag(df, steps, prompt, response)
    return WarmPilot("lora", fmt, Path(res.adapter_dir), tag, int(df[by].n_unique()))


@contextlib.contextmanager
def warm_up_for_dataset(model: str, mode: str, source: Any, *, warm_data: Any = None, steps: int = 16,
                        prompt: str = "prompt", response: str = "response", prompt_format: str = "auto",
                        device: str = "cpu", engine: str = "local") -> Iterator[WarmPilot]:
    """`warm_up` for a dataset job (``mrt nll --warm-pilot``): the scored prompts are the distinct prompts of
    ``source`` (a file, directory or glob); a ``lora`` adapter lives in a temporary directory for the job's
    duration, so it runs with the local engine."""
    if mode not in WARM_PILOTS:
        raise MrtInputError(f"--warm-pilot must be one of {'|'.join(WARM_PILOTS)}, got {mode!r}")
    if mode != "lora" and warm_data is not None:
        raise MrtInputError("--warm-data is for --warm-pilot lora")
    if mode == "lora" and engine != "local":
        raise MrtInputError("--warm-pilot lora runs with --engine local (its adapter is a local directory)")
    scored: list[str] = []
    if mode == "lora":
        from mrt_fast.datasets.sources import discover

        if warm_data is None:
            raise MrtInputError("--warm-pilot lora needs --warm-data: prompts and responses of the task that the "
                                "pilot does not score")
        scored = discover(str(source)).scan().select(pl.col(prompt).unique()).collect()[prompt].to_list()
    with tempfile.TemporaryDirectory(prefix="mrt_warm_") as tmp:
        yield warm_up(model, mode, scored_prompts=[p for p in scored if p is not None], warm_data=warm_data,
                      steps=steps, prompt_format=prompt_format, work_dir=tmp, prompt=prompt, response=response,
                      device=device)


def warm_pilot_table(table: Any, model: Any, mode: str, *, tokenizer: Any = None, warm_data: Any = None,
                     steps: int = 16, prompt_format: str = "auto", prompt: str = "prompt",
                     response: str = "response", out: str = "loss", device: str = "cpu",
                     work_dir: str | os.PathLike | None = None, batch_size: int = 32, **train_overrides: Any):
    """The pilot table with an ``out`` column of per-response losses under the warmed model (`warm_up`),
    each distinct prompt run once (`mrt_fast.llm.prefix_loss.prefix_pair_losses`). Returns (table, WarmPilot)."""
    from mrt_fast.datasets.formats import as_polars
    from mrt_fast.llm.models import load_causal_lm, load_tokenizer
    from mrt_fast.llm.prefix_loss import prefix_pair_losses

    df = as_polars(table)
    for c in (prompt, response):
        if c not in df.columns:
            raise MrtInputError(f"column {c!r} not found; the table has columns {df.columns}", column=c)
    with tempfile.TemporaryDirectory(prefix="mrt_warm_") as tmp:
        state = warm_up(model, mode, scored_prompts=df[prompt].unique().to_list(), warm_data=warm_data, steps=steps,
                        prompt_format=prompt_format, work_dir=work_dir or tmp, tokenizer=tokenizer, prompt=prompt,
                        response=response, device=device, **train_overrides)
        tok = load_tokenizer(tokenizer if tokenizer is not None else model)
        net = load_causal_lm(model, device=device, adapter=str(state.adapter) if state.adapter else None)
        vals = prefix_pair_losses(net, tok, df[prompt].to_list(), df[response].to_list(),
                                  prompt_format=state.prompt_format, batch_size=batch_size)
    return df.with_columns(pl.Series(out, vals, dtype=pl.Float64)), state
