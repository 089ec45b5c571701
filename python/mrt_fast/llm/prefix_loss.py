"""Per-response losses with the prompt computed once per prompt (a shared key-value prefix).

A pilot scores many responses of the same prompt; when responses are short
the forward pass is mostly the prompt, repeated once per response.
`prefix_pair_losses` runs each distinct prompt once, keeps its key-value cache,
and scores all of that prompt's responses as one batch that continues from it.
The loss is the one of `mrt_fast.llm.loss` (same examples from `build_example`:
token mean of the response and its EOS, prompt masked), equal to
`pair_losses` up to float rounding; it does not truncate (no ``max_length``).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from mrt_fast.errors import MrtInputError
from mrt_fast.llm.loss import IGNORE, build_example, check_pairs, forward_takes

__all__ = ["prefix_pair_losses"]


def prefix_pair_losses(model: Any, tokenizer: Any, prompts: Sequence[str], responses: Sequence[str], *,
                       prompt_format: str = "auto", batch_size: int = 8, return_counts: bool = False):
    """l_ij of every (prompt, response) pair (float64, input order), each distinct prompt run once.

    ``batch_size`` distinct prompts (left-padded, in length order) run together; their responses then run
    as one batch continuing from the prompts' key-value cache."""
    import torch

    check_pairs(prompts, responses, batch_size)
    n = len(prompts)
    out = np.empty(n, dtype=np.float64)
    counts = np.empty(n, dtype=np.int64)
    groups: dict[str, list[int]] = {}
    for i, p in enumerate(prompts):
        groups.setdefault(p, []).append(i)
    examples = {p: [build_example(tokenizer, p, responses[i], None, prompt_format) for i in idx]
                for p, idx in groups.items()}
    order = sorted(groups, key=lambda p: examples[p][0]["labels"].count(IGNORE))
    cache_arg = _cache_argument(model)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    dev = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for b0 in range(0, len(order), batch_size):
                _score_batch(model, order[b0:b0 + batch_size], groups, examples, out, counts, pad, dev, cache_arg)
    finally:
        model.train(was_training)
    if n and not np.isfinite(out).all():
        bad = int(np.nonzero(~np.isfinite(out))[0][0])
        raise MrtInputError(f"the model gave a non-finite loss for pair {bad}", row=bad)
    return (out, counts) if return_counts else out


def _score_batch(model, batch, groups, examples, out, counts, pad, dev, cache_arg) -> None:
    """Score every response of the prompts in ``batch``: one left-padded pass over the prompts (only the last
    position's logits kept), then one pass over all their responses on the expanded cache."""
    import torch
    from transformers import DynamicCache

    p_ids = []
    for p in batch:
        e = examples[p][0]
        p_ids.append(e["input_ids"][: e["labels"].count(IGNORE)])
    width = max(len(x) for x in p_ids)
    ids = torch.full((len(batch), width), pad, dtype=torch.long)
    pmask = torch.zeros((len(batch), width), dtype=torch.long)
    for j, x in enumerate(p_ids):
        ids[j, width - len(x):] = torch.tensor(x)
        pmask[j, width - len(x):] = 1
    pos = (pmask.cumsum(-1) - 1).clamp_min(0)
    first = model(input_ids=ids.to(dev), attention_mask=pmask.to(dev), position_ids=pos.to(dev), use_cache=True,
                  logits_to_keep=1)
    last = torch.log_softmax(first.logits[:, -1].float(), dim=-1)  # predicts each response's first token
    kv = _layers(getattr(first, "cache", None) or first.past_key_values)
    rows = [(j, i, examples[p][k]["input_ids"][len(p_ids[j]):])
            for j, p in enumerate(batch) for k, i in enumerate(groups[p])]
    r_width = max(len(r) for _, _, r in rows)
    which = torch.tensor([j for j, _, _ in rows], device=dev)
    r_ids = torch.full((len(rows), r_width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width + r_width), dtype=torch.long)
    mask[:, :width] = pmask[which.cpu()]
    r_pos = torch.zeros((len(rows), r_width), dtype=torch.long)
    for m, (j, _, r) in enumerate(rows):
        r_ids[m, : len(r)] = torch.tensor(r)
        mask[m, width : width + len(r)] = 1
        r_pos[m] = len(p_ids[j]) + torch.arange(r_width)
    cache = DynamicCache()
    for layer, (k, v) in enumerate(kv):
        cache.update(k.index_select(0, which).contiguous(), v.index_select(0, which).contiguous(), layer)
    logp = torch.log_softmax(model(input_ids=r_ids.to(dev), attention_mask=mask.to(dev), position_ids=r_pos.to(dev),
                                   use_cache=True, **{cache_arg: cache}).logits.float(), dim=-1)
    for m, (j, i, r) in enumerate(rows):
        t = torch.tensor(r, device=dev)
        nll = -last[j, t[0]]
        if len(r) > 1:
            nll = nll - logp[m, : len(r) - 1].gather(1, t[1:, None]).sum()
        out[i] = float(nll) / len(r)
        counts[i] = len(r)


def _layers(cache) -> list[tuple[Any, Any]]:
    """(keys, values) of every layer of a key-value cache (the legacy tuple form or a Cache object)."""
    if isinstance(cache, (tuple, list)):
        return [(k, v) for k, v in cache]
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return [(cache.key_cache[i], cache.value_cache[i]) for i in range(len(cache.key_cache))]


def _cache_argument(model) -> str:
    """The keyword a model's forward takes its key-value cache by (``cache``, formerly ``past_key_values``)."""
    return "cache" if forward_takes(model, "cache") else "past_key_values"
