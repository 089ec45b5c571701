"""Rewards from a sequence-classification reward model (one logit per (prompt, response))."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import polars as pl

from ._llm import load_tokenizer, pick_device, resolve_dtype, resolve_model_path
from .io import as_polars, require_columns
from .errors import MrtInputError


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
        self.device = pick_device(device)
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

    def __call__(self, prompts: list[str], responses: list[str], progress: bool = False) -> np.ndarray:
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
        if not np.isfinite(out).all():
            raise MrtInputError("the reward model returned NaN/inf rewards")
        return out


def score(table: Any, model: Any, *, tokenizer: Any = None, prompt: str = "prompt", response: str = "response",
          column: str = "reward", batch_size: int = 16, progress: bool = True, **kw) -> pl.DataFrame:
    """Add a ``reward`` column scoring every (prompt, response) row of ``table``."""
    df = as_polars(table)
    require_columns(df, [prompt, response], "score")
    rm = model if isinstance(model, RewardModel) else RewardModel(model, tokenizer, batch_size=batch_size, **kw)
    r = rm(df[prompt].to_list(), df[response].fill_null("").to_list(), progress=progress)
    return df.with_columns(pl.Series(column, r))
