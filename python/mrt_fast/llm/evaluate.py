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
  table has a ``tests`` column (programs run in `mrt_fast.sandbox`, isolated by
  bubblewrap; without it `SandboxUnavailableError` is raised before any model
  work unless ``sandbox={"isolation": "none-i-understand"}`` opts out).

Each metric ``m`` comes with ``m_se``, its standard error over the evaluation
prompts (the spread of the per-prompt values / sqrt(prompts); for ``ref_loss``
that of a ratio of token sums), NaN with fewer than two prompts.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import polars as pl

from mrt_fast._util.device import resolve_device

from mrt_fast.llm.models import load_causal_lm, load_tokenizer, unit_rows
from mrt_fast.datasets.formats import as_polars
from mrt_fast.tables.arrays import require_columns
from mrt_fast.errors import MrtInputError

from mrt_fast.embeddings.embedders import Embedder, default_embedder, make_embedder, sentence_transformer_embedder  # noqa: F401

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


# ------------------------------------------------------------------ reference loss


def reference_loss(model, tokenizer, prompts: list[str], references: list[str], *, batch_size: int = 8,
                   max_length: int = 1024, prompt_format: str = "auto", device: str | None = None) -> dict:
    """Token-weighted mean CE over all reference tokens (prompt masked): sum of losses / number of tokens.

    Each reference's examples and losses are those of training (`mrt_fast.llm.loss`)."""
    from mrt_fast.llm.loss import pair_losses

    if len(prompts) != len(references):
        raise MrtInputError(f"{len(prompts)} prompts but {len(references)} references")
    if not prompts:
        raise MrtInputError("reference_loss needs at least one (prompt, reference) pair")
    per, ns = pair_losses(model, tokenizer, prompts, references, batch_size=batch_size, max_length=max_length,
                          prompt_format=prompt_format, device=device, sort_by_length=False, return_counts=True)
    count = int(ns.sum())
    return {"ref_loss": float(np.dot(per, ns) / count), "ref_tokens": count, "per_reference": per,
            "per_reference_tokens": ns}


# ------------------------------------------------------------------ intervals over prompts


def standard_error(values: Any) -> float:
    """The standard error of the mean of per-prompt values (NaN with fewer than two)."""
    v = np.asarray(values, dtype=np.float64)
    return float(v.std(ddof=1) / np.sqrt(len(v))) if len(v) >= 2 else float("nan")


def ratio_standard_error(num: Any, den: Any) -> float:
    """The standard error of sum(num) / sum(den) over prompts (the delta method of a ratio estimator):
    the reference loss is token-weighted, so a prompt weighs by its reference tokens."""
    x, n = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    if len(x) < 2:
        return float("nan")
    r = x.sum() / n.sum()
    return float(np.sqrt(np.sum((x - r * n) ** 2) / (len(x) * (len(x) - 1))) / n.mean())


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
    reward_fn: Any = None,
    samples_out: str | os.PathLike | None = None,
    reference: str = "reference",
    tests: str = "tests",
    progress: bool = True,
    **overrides,
) -> dict:
    """All metrics of the module docstring on ``data`` (prompt_id, prompt, reference[, tests]).

    ``reference`` may hold one string or a list per prompt. ``embedder``: a callable
    list[str] -> (n, d) array (default: offline all-MiniLM-L6-v2). ``reward_model``:
    a path or a `mrt_fast.llm.reward.RewardModel`; ``reward_fn``: a reward hook
    (`mrt_fast.llm.reward.load_reward_fn`) called on the generations' rows (prompt_id,
    prompt, response and the evaluation table's other columns) when there is no
    reward model. The generations are written to
    ``samples_out`` when given.
    """
    from tqdm.auto import tqdm

    from mrt_fast.llm.generate import GenerationConfig, _TransformersSampler
    from mrt_fast.llm.reward import RewardModel

    cfg = config or EvalConfig()
    if overrides:
        cfg = EvalConfig(**{**asdict(cfg), **overrides})
    if cfg.n_samples < 1:
        raise MrtInputError(f"n_samples must be >= 1, got {cfg.n_samples}")
    df = as_polars(data)
    require_columns(df, ["prompt_id", "prompt", reference], "evaluation data")
    if df.height == 0:
        raise MrtInputError("evaluation data is empty")
    if tests in df.columns:  # refuse before any model work when generated code cannot run isolated
        from mrt_fast.sandbox.run import require_isolation

        require_isolation(cfg.sandbox.get("isolation"), cfg.sandbox.get("python"))
    device = resolve_device(cfg.device)
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
    owner = np.repeat(np.arange(df.height), [len(rs) for rs in refs])  # each reference's prompt
    res["ref_loss_se"] = ratio_standard_error(np.bincount(owner, rl["per_reference"] * rl["per_reference_tokens"]),
                                              np.bincount(owner, rl["per_reference_tokens"]))

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
    res["coverage_se"], res["diversity_se"] = standard_error(covs), standard_error(divs)

    rewards = None
    if reward_model is not None:
        rm = reward_model if isinstance(reward_model, RewardModel) else RewardModel(reward_model, device=device)
        flat = rm([p for p, ss in zip(prompts, samples) for _ in ss], [s for ss in samples for s in ss])
        rewards = np.split(flat, np.cumsum([len(ss) for ss in samples])[:-1])
        res["reward"] = float(np.mean([r.max() for r in rewards]))
        res["reward_se"] = standard_error([r.max() for r in rewards])
    elif reward_fn is not None:
        from mrt_fast.llm.reward import load_reward_fn, score_with

        rows = pl.DataFrame({"prompt_id": [pid for pid, ss in zip(pids, samples) for _ in ss],
                             "prompt": [p for p, ss in zip(prompts, samples) for _ in ss],
                             "response": [s for ss in samples for s in ss]})
        other = [c for c in df.columns if c not in ("prompt", reference, tests)]
        if len(other) > 1:
            rows = rows.join(df.select(other).with_columns(pl.col("prompt_id").cast(pl.Utf8)), on="prompt_id",
                             how="left", maintain_order="left")
        flat = score_with(rows, load_reward_fn(reward_fn, emb))["reward"].to_numpy()
        rewards = np.split(flat, np.cumsum([len(ss) for ss in samples])[:-1])
        res["reward"] = float(np.mean([r.max() for r in rewards]))
        res["reward_se"] = standard_error([r.max() for r in rewards])

    passed = None
    if tests in df.columns:
        from mrt_fast.sandbox.run import extract_code, passes_tests

        passed = []
        for ss, ts in tqdm(list(zip(samples, df[tests].to_list())), desc="running programs",
                           disable=not progress, leave=False):
            ts = json.loads(ts) if isinstance(ts, str) else ts
            passed.append([passes_tests(extract_code(s) if cfg.extract_code else s, ts, **cfg.sandbox) for s in ss])
        n = cfg.n_samples
        c = np.array([sum(p) for p in passed])
        for k in cfg.pass_ks:
            if k <= n:
                per = np.atleast_1d(pass_at_k(n, c, k))
                res[f"pass@{k}"] = float(np.mean(per))
                res[f"pass@{k}_se"] = standard_error(per)

    if samples_out is not None:
        rows = {"prompt_id": [pid for pid, ss in zip(pids, samples) for _ in ss],
                "sample_index": [j for ss in samples for j in range(len(ss))],
                "response": [s for ss in samples for s in ss]}
        if rewards is not None:
            rows["reward"] = np.concatenate(rewards).tolist()
        if passed is not None:
            rows["passed"] = [b for p in passed for b in p]
        from mrt_fast.datasets.formats import write_table

        write_table(pl.DataFrame(rows), samples_out)
    return res
