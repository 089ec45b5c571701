"""Rewards for candidates: a sequence-classification reward model (one logit per
(prompt, response)), a Python hook (`load_reward_fn`: exact match, unit tests,
any callable over the rows) or the built-in offline `relevance_reward`."""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

import numpy as np
import polars as pl

from mrt_fast._util.device import resolve_device

from mrt_fast.llm.models import load_tokenizer, resolve_dtype, resolve_model_path
from mrt_fast.datasets.formats import as_polars
from mrt_fast.tables.arrays import require_columns
from mrt_fast.errors import MrtInputError
from mrt_fast.tables.layouts import GROUPED, attach, detect, explode


class RewardModel:
    """A reward model: ``rm(prompts, responses) -> np.ndarray`` of float64 rewards.

    ``model``: a path / hub id of an ``AutoModelForSequenceClassification`` with
    ``num_labels=1``, or a loaded one (then pass ``tokenizer``). Pairs are shown
    to the model through the tokenizer's chat template (user / assistant turns)
    when it has one, else as ``prompt + response``. Scored in batches sorted by
    length (less padding), truncated to ``max_length`` tokens from the left of
    the prompt so the response is always seen.
    """

    def __init__(self, model: Any, tokenizer: Any = None, *, device: str = "auto", dtype: str = "auto",
                 batch_size: int = 16, max_length: int = 2048):
        self.device = resolve_device(device)
        if isinstance(model, (str, os.PathLike)):
            from transformers import AutoModelForSequenceClassification

            self.model = AutoModelForSequenceClassification.from_pretrained(
                resolve_model_path(str(model)), dtype=resolve_dtype(dtype, self.device)
            )
            tokenizer = tokenizer if tokenizer is not None else resolve_model_path(str(model))
        else:
            if tokenizer is None:
                raise MrtInputError("pass tokenizer= when the reward model is a loaded object")
            self.model = model
        self.model = self.model.to(self.device).eval()
        if getattr(self.model.config, "num_labels", 1) != 1:
            raise MrtInputError(f"a reward model has one output; this one has num_labels={self.model.config.num_labels}")
        self.tok = load_tokenizer(tokenizer)
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tok.pad_token_id
        self.batch_size = batch_size
        self.max_length = max_length

    def _ids(self, prompt: str, response: str) -> list[int]:
        tok = self.tok
        if getattr(tok, "chat_template", None):
            text = tok.apply_chat_template(
                [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}], tokenize=False
            )
            ids = tok(text, add_special_tokens=False).input_ids
        else:
            ids = tok(prompt + response).input_ids
        return list(ids[-self.max_length :])

    def __call__(self, prompts: list[str], responses: list[str], progress: bool = False,
                 callback: Any = None) -> np.ndarray:
        """Rewards of the pairs; ``callback(n)``, if given, is called as each batch of ``n`` is done."""
        import torch
        from tqdm.auto import tqdm

        if len(prompts) != len(responses):
            raise MrtInputError(f"{len(prompts)} prompts but {len(responses)} responses")
        seqs = [self._ids(p, r) for p, r in zip(prompts, responses)]
        order = np.argsort([len(s) for s in seqs], kind="stable")
        out = np.empty(len(seqs), dtype=np.float64)
        pad = self.tok.pad_token_id
        for s in tqdm(range(0, len(seqs), self.batch_size), desc="scoring", disable=not progress, leave=False):
            idx = order[s : s + self.batch_size]
            width = max(len(seqs[i]) for i in idx)
            ids = torch.full((len(idx), width), pad, dtype=torch.long)
            mask = torch.zeros((len(idx), width), dtype=torch.long)
            for r, i in enumerate(idx):
                ids[r, : len(seqs[i])] = torch.tensor(seqs[i])
                mask[r, : len(seqs[i])] = 1
            with torch.no_grad():
                logits = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device)).logits
            out[idx] = logits[:, 0].float().cpu().numpy()
            if callback is not None:
                callback(len(idx))
        if not np.isfinite(out).all():
            raise MrtInputError("the reward model returned NaN/inf rewards")
        return out


def score(table: Any, model: Any, *, tokenizer: Any = None, prompt: str = "prompt", response: str = "response",
          column: str = "reward", batch_size: int = 16, progress: bool = True, by: str = "prompt_id",
          layout: str = "auto", callback: Any = None, **kw) -> pl.DataFrame:
    """Add a ``reward`` column scoring every (prompt, response) row of ``table``
    (``callback(n)``, if given, called as each batch of ``n`` pairs is scored).

    In the grouped layout (``response`` holds a list of responses per prompt)
    the column holds one list of rewards per prompt, in the order of its responses."""
    df = as_polars(table)
    require_columns(df, [prompt, response], "score")
    rm = model if isinstance(model, RewardModel) else RewardModel(model, tokenizer, batch_size=batch_size, **kw)
    if detect(df.schema, {response: 0}, layout) == GROUPED:
        keyed = df.select(by, prompt, response) if by in df.columns else (
            df.select(prompt, response).with_row_index(by))
        flat = explode(keyed, by, [response])
        r = rm(flat[prompt].to_list(), flat[response].fill_null("").to_list(), progress=progress, callback=callback)
        return attach(df, [response], {column: pl.Series(column, r, dtype=pl.Float64)})
    r = rm(df[prompt].to_list(), df[response].fill_null("").to_list(), progress=progress, callback=callback)
    return df.with_columns(pl.Series(column, r))


# ------------------------------------------------------------------ rewards without a reward model

#: a reward hook: rows (prompt_id, prompt, response and the prompt table's other columns) -> one float per row
RewardFn = Callable[[pl.DataFrame], Sequence[float]]

BUILTIN_REWARDS = ("relevance",)


def relevance_reward(embedder: Callable[[list[str]], np.ndarray]) -> RewardFn:
    """Built-in offline scorer: cosine similarity of the prompt's and the response's embeddings.

    Rewards on-topic answers and penalises empty or off-topic ones; no reward
    model, no download (with the bundled MiniLM or the hashing embedder), CPU
    speed. A weak judge of quality: prefer a task's own check (exact match,
    unit tests) through a hook when there is one.
    """

    def score_rows(rows: pl.DataFrame) -> np.ndarray:
        prompts = rows["prompt"].to_list()
        uniq = list(dict.fromkeys(prompts))
        pe = np.asarray(embedder(uniq), dtype=np.float64)
        re = np.asarray(embedder(rows["response"].fill_null("").to_list()), dtype=np.float64)
        pe /= np.maximum(np.linalg.norm(pe, axis=1, keepdims=True), 1e-12)
        re /= np.maximum(np.linalg.norm(re, axis=1, keepdims=True), 1e-12)
        where = {p: i for i, p in enumerate(uniq)}
        return np.einsum("ij,ij->i", pe[[where[p] for p in prompts]], re)

    return score_rows


def load_reward_fn(spec: Any, embedder: Callable[[list[str]], np.ndarray] | None = None) -> RewardFn:
    """A reward hook from a callable, ``"package.module:function"`` or ``"builtin:relevance"``.

    The hook is called once with a polars DataFrame of the rows to score
    (``prompt_id``, ``prompt``, ``response`` and the prompt table's other
    columns, e.g. a gold ``answer``) and returns one float per row, in order.
    """
    if callable(spec):
        return spec
    if not isinstance(spec, str) or not spec:
        raise MrtInputError(f"reward_fn must be a callable, 'module:function' or 'builtin:<name>', got {spec!r}")
    if spec.startswith("builtin:"):
        name = spec.split(":", 1)[1]
        if name not in BUILTIN_REWARDS:
            raise MrtInputError(f"unknown built-in reward {name!r}; built-in: {list(BUILTIN_REWARDS)}")
        if embedder is None:
            from mrt_fast.embeddings.embedders import make_embedder

            embedder = make_embedder("minilm")
        return relevance_reward(embedder)
    mod, sep, attr = spec.partition(":")
    if not sep or not mod or not attr:
        raise MrtInputError(f"reward_fn {spec!r} must look like 'package.module:function'")
    import importlib

    try:
        fn = getattr(importlib.import_module(mod), attr)
    except (ImportError, AttributeError) as e:
        raise MrtInputError(f"reward_fn {spec!r} cannot be loaded: {e}") from None
    if not callable(fn):
        raise MrtInputError(f"reward_fn {spec!r} is not callable")
    return fn


def score_with(rows: Any, fn: RewardFn, column: str = "reward") -> pl.DataFrame:
    """Add ``column`` = ``fn(rows)``, checking there is one finite float per row."""
    df = as_polars(rows)
    require_columns(df, ["prompt", "response"], "score")
    try:
        out = fn(df)
    except (KeyError, LookupError, pl.exceptions.ColumnNotFoundError) as e:
        raise MrtInputError(f"the reward function looked for something the rows do not have ({e}); "
                            f"the rows have columns {df.columns}") from e
    try:
        r = np.asarray(out, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError) as e:
        raise MrtInputError(f"the reward function did not return numbers: {e}") from None
    if len(r) != df.height:
        raise MrtInputError(f"the reward function returned {len(r)} values for {df.height} rows")
    if not np.isfinite(r).all():
        bad = int(np.nonzero(~np.isfinite(r))[0][0])
        raise MrtInputError(f"the reward function returned {r[bad]} for row {bad}", row=bad, column=column)
    return df.with_columns(pl.Series(column, r))
