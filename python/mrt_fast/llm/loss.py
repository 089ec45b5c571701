"""The per-response loss l_ij: one definition for diagnosis, training and evaluation.

A (prompt, response) pair becomes one example:

* the prompt is formatted by the tokenizer's chat template (a user turn with
  the generation prompt) when it has one and ``prompt_format`` is ``"auto"``
  or ``"chat"``, else used as plain text with the tokenizer's special tokens
  (e.g. BOS); an empty plain prompt falls back to the BOS token;
* the response is tokenised without special tokens and followed by EOS, which
  is scored (the model learns where to stop);
* prompt positions get label -100 (masked);
* longer than ``max_length`` tokens: the response keeps its start (at most
  ``max_length - 1`` tokens) and the prompt is cut from the left.

``l_ij`` is the token mean of the response's cross-entropy (EOS included).
`pair_losses` computes it for many pairs under a causal LM in batches;
`mrt_fast.llm.nll.response_nll` (the losses `variance_budget` diagnoses),
`mrt_fast.llm.train` (the losses it minimises) and `mrt_fast.llm.evaluate` (the
reference loss) all go through `build_example` and `sequence_losses` here.

`scored_losses` runs the model on a batch and computes the vocabulary
projection only over the batch's scored window (from the earliest response
start to the end, the model's ``logits_to_keep``): with long prompts and short
responses the projection and its softmax over the whole prompt are most of a
small model's step, and the prompt positions' logits are never scored.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from mrt_fast.llm.models import prompt_ids, response_ids
from mrt_fast.errors import MrtInputError

__all__ = ["build_example", "collate", "sequence_losses", "scored_losses", "pair_losses", "IGNORE"]

#: label of positions that are not scored
IGNORE = -100


def build_example(tokenizer: Any, prompt: str, response: str, max_length: int | None = None,
                  prompt_format: str = "auto") -> dict:
    """``input_ids`` and ``labels`` of one pair: prompt labels -100, response (+EOS) labels = its ids."""
    p = prompt_ids(tokenizer, prompt, prompt_format)
    r = response_ids(tokenizer, response)
    if not p:
        bos = getattr(tokenizer, "bos_token_id", None)
        if bos is None:
            raise MrtInputError(f"prompt {prompt[:40]!r} tokenizes to nothing and the tokenizer has no BOS token: "
                                "the first response token has no context")
        p = [bos]
    if max_length is not None:
        if max_length < 2:
            raise MrtInputError(f"max_length must be >= 2 (one prompt and one response token), got {max_length}")
        if len(r) >= max_length:
            r = r[: max_length - 1]  # at least one prompt token stays so the first response token is predicted
        p = p[-(max_length - len(r)) :]
    return {"input_ids": p + r, "labels": [IGNORE] * len(p) + r}


def collate(examples: list[dict], pad_id: int):
    """Right-padded (input_ids, attention_mask, labels) tensors of a list of examples."""
    import torch

    width = max(len(e["input_ids"]) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for r, e in enumerate(examples):
        n = len(e["input_ids"])
        ids[r, :n] = torch.tensor(e["input_ids"])
        labels[r, :n] = torch.tensor(e["labels"])
        mask[r, :n] = 1
    return ids, mask, labels


def sequence_losses(logits, labels):
    """Per-sequence token-mean cross-entropy over positions whose label is not -100.

    logits (B, T, V) predict the next token: logits[:, t] is scored against labels[:, t + 1].
    Returns (losses (B,), token counts (B,)).
    """
    import torch

    shift_logits = logits[:, :-1].float()
    shift_labels = labels[:, 1:]
    mask = shift_labels != IGNORE
    tok = torch.nn.functional.cross_entropy(
        shift_logits.reshape(-1, shift_logits.shape[-1]),
        shift_labels.clamp_min(0).reshape(-1),
        reduction="none",
    ).view(shift_labels.shape)
    tok = tok * mask
    counts = mask.sum(dim=1)
    if (counts == 0).any():
        raise MrtInputError("a pair has no response token to score")
    return tok.sum(dim=1) / counts, counts


def scored_window(labels) -> int:
    """How many trailing positions' logits score every label of a right-padded batch: from the position before
    the earliest scored label to the end (at least 2, so one prediction is made)."""
    import torch

    scored = labels != IGNORE
    if not bool(scored.any()):
        raise MrtInputError("a pair has no response token to score")
    first = int(torch.argmax(scored.to(torch.int8), dim=1)[scored.any(dim=1)].min())
    return max(2, labels.shape[1] - first + 1)


def forward_takes(model: Any, name: str) -> bool:
    """Whether ``model``'s forward (a PEFT model's: its base model's, which it passes keywords on to) takes the
    keyword ``name``."""
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        return name in inspect.signature(base.forward).parameters
    except (TypeError, ValueError):
        return False


def keeps_logits(model: Any) -> bool:
    """Whether ``model``'s forward takes ``logits_to_keep`` (transformers' causal LMs do)."""
    return forward_takes(model, "logits_to_keep")


def scored_losses(model: Any, input_ids, attention_mask, labels, *, trim: bool | None = None):
    """``sequence_losses`` of ``model`` on a right-padded batch, the logits computed only over the scored window
    (`scored_window`) where the model takes ``logits_to_keep`` (``trim=None``: when it does; ``False``: every
    position). Returns (losses (B,), token counts (B,), the model's output)."""
    if trim is None:
        trim = keeps_logits(model)
    if not trim:
        out = model(input_ids=input_ids, attention_mask=attention_mask)
        losses, counts = sequence_losses(out.logits, labels.to(out.logits.device))
        return losses, counts, out
    keep = scored_window(labels)
    out = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=keep)
    losses, counts = sequence_losses(out.logits, labels[:, -keep:].to(out.logits.device))
    return losses, counts, out


def pair_losses(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    responses: Sequence[str],
    *,
    batch_size: int = 8,
    max_length: int | None = None,
    prompt_format: str = "auto",
    device: Any = None,
    progress: bool = False,
    sort_by_length: bool = True,
    return_counts: bool = False,
    callback: Any = None,
):
    """l_ij of every (prompt, response) pair under ``model`` (eval mode, no gradient); float64.

    Batches are right-padded with an attention mask (causal attention keeps the
    real tokens' logits independent of the padding) and, with
    ``sort_by_length``, formed in length order; results come back in input
    order. ``return_counts`` also returns each pair's number of scored tokens.
    ``callback(n)``, if given, is called as each batch of ``n`` pairs is done.
    """
    import torch
    from tqdm.auto import tqdm

    check_pairs(prompts, responses, batch_size)
    n = len(prompts)
    out = np.empty(n, dtype=np.float64)
    counts = np.empty(n, dtype=np.int64)
    if n:
        ex = [build_example(tokenizer, p, r, max_length, prompt_format) for p, r in zip(prompts, responses)]
        pad = tokenizer.pad_token_id
        if pad is None:
            pad = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
        on = next(model.parameters()).device
        if device is None:
            device = on
        elif torch.device(device).type != on.type or (torch.device(device).index or 0) != (on.index or 0):
            raise MrtInputError(f"the model is on {on} but device={str(device)!r} was asked: move the model "
                                f"there (model.to({str(device)!r})) or leave device unset")
        order = np.argsort([len(e["input_ids"]) for e in ex], kind="stable") if sort_by_length else np.arange(n)
        trim = keeps_logits(model)
        was_training = model.training
        model.eval()
        try:
            with torch.inference_mode():
                for b0 in tqdm(range(0, n, batch_size), disable=not progress, desc="response loss", unit="batch"):
                    idx = order[b0 : b0 + batch_size]
                    ids, mask, labels = collate([ex[i] for i in idx], pad)
                    loss, cnt, _ = scored_losses(model, ids.to(device), mask.to(device), labels, trim=trim)
                    out[idx] = loss.double().cpu().numpy()
                    counts[idx] = cnt.cpu().numpy()
                    if callback is not None:
                        callback(len(idx))
        finally:
            model.train(was_training)
        if not np.isfinite(out).all():
            bad = int(np.nonzero(~np.isfinite(out))[0][0])
            raise MrtInputError(f"the model gave a non-finite loss for pair {bad}", row=bad)
    return (out, counts) if return_counts else out


def check_pairs(prompts, responses, batch_size: int) -> None:
    """The arguments every per-pair loss takes: as many responses as prompts, a batch of at least one."""
    if len(prompts) != len(responses):
        raise MrtInputError(f"prompts and responses differ in length: {len(prompts)} vs {len(responses)}")
    if batch_size < 1:
        raise MrtInputError(f"batch_size must be >= 1, got {batch_size}")
