"""Overgeneration: n candidate responses per prompt.

On a GPU with vLLM installed, one request per prompt with
``SamplingParams(n=..., temperature, top_p, seed, max_tokens)``; elsewhere a
transformers fallback (``generate`` with ``num_return_sequences=n``, sampling,
seeded). Both write one row per candidate:

``prompt_id, prompt, response, candidate_index, logprob, n_tokens, finish_reason``

``logprob`` is the sum of the generated tokens' log-probabilities under the
model's raw distribution (temperature 1, no top-p), EOS included when it was
generated; ``n_tokens`` counts the generated tokens the same way;
``finish_reason`` is ``"stop"`` (EOS) or ``"length"`` (hit ``max_new_tokens``).

Resumable: results go to shard files under ``<out>.parts/``, each written
atomically and holding whole prompts only (all n candidates of each). A killed
run restarted with the same arguments skips the prompts already in a shard, so
nothing is duplicated or lost. Each prompt's sampling seed is derived from
(seed, prompt_id), so on the transformers path an interrupted-and-resumed run
writes exactly what an uninterrupted one would.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from mrt_fast._util.device import resolve_device

from mrt_fast.llm.models import format_prompt, load_causal_lm, load_tokenizer, prompt_ids, resolve_model_path, stable_seed
from mrt_fast.datasets.formats import as_polars, write_table
from mrt_fast.tables.arrays import require_columns
from mrt_fast._util.files import write_text
from mrt_fast.errors import MissingDependencyError, MrtInputError

SCHEMA = {
    "prompt_id": pl.Utf8,
    "prompt": pl.Utf8,
    "response": pl.Utf8,
    "candidate_index": pl.Int64,
    "logprob": pl.Float64,
    "n_tokens": pl.Int64,
    "finish_reason": pl.Utf8,
}


@dataclass
class GenerationConfig:
    """Sampling settings. ``backend``: auto (vLLM if importable and a GPU is there, else transformers)."""

    n: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    seed: int = 0
    backend: str = "auto"  # auto | vllm | transformers
    prompt_format: str = "auto"  # auto | chat | plain
    shard_prompts: int = 64  # prompts per shard file (the unit of resumption)
    max_batch: int = 64  # transformers: most sequences per generate call
    device: str = "auto"
    dtype: str = "auto"
    vllm_kwargs: dict | None = None  # extra arguments of vllm.LLM(...)

    def validate(self) -> None:
        if self.n < 1:
            raise MrtInputError(f"n must be >= 1, got {self.n}")
        if not self.temperature > 0:
            raise MrtInputError(f"temperature must be > 0 (sampling), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise MrtInputError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise MrtInputError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.backend not in ("auto", "vllm", "transformers"):
            raise MrtInputError(f"backend must be auto, vllm or transformers, got {self.backend!r}")
        if self.shard_prompts < 1 or self.max_batch < 1:
            raise MrtInputError("shard_prompts and max_batch must be >= 1")


def parts_dir(out: str | os.PathLike) -> Path:
    out = Path(out)
    return out.with_name(out.name + ".parts")


def load_shards(out: str | os.PathLike) -> pl.DataFrame:
    """Every candidate written so far (deduplicated on prompt_id, candidate_index)."""
    d = parts_dir(out)
    files = sorted(d.glob("shard-*.parquet")) if d.exists() else []
    if not files:
        return pl.DataFrame(schema=SCHEMA)
    df = pl.concat([pl.read_parquet(f) for f in files], how="diagonal_relaxed")
    return df.unique(subset=["prompt_id", "candidate_index"], keep="first", maintain_order=True)


def _vllm_usable(cfg: GenerationConfig) -> bool:
    import importlib.util

    if cfg.backend == "transformers":
        return False
    has = importlib.util.find_spec("vllm") is not None
    gpu = False
    if has:
        import torch

        gpu = torch.cuda.is_available()
    if cfg.backend == "vllm" and not (has and gpu):
        raise MissingDependencyError("backend='vllm' needs vllm installed (pip install 'mrt_fast[vllm]') and a CUDA GPU")
    return has and gpu


class _TransformersSampler:
    def __init__(self, model, tokenizer, cfg: GenerationConfig):
        self.cfg = cfg
        self.device = resolve_device(cfg.device)
        if tokenizer is None and not isinstance(model, (str, os.PathLike)):
            raise MrtInputError("pass tokenizer= when model is a loaded object")
        self.tok = load_tokenizer(tokenizer if tokenizer is not None else model)
        self.model = load_causal_lm(model, device=self.device, dtype=cfg.dtype)

    def __call__(self, pid: Any, prompt: str, n: int | None = None) -> list[dict]:
        import torch

        cfg, tok = self.cfg, self.tok
        n = cfg.n if n is None else n
        ids = prompt_ids(tok, prompt, cfg.prompt_format)
        if not ids:
            raise MrtInputError(f"prompt {pid!r} tokenizes to nothing")
        x = torch.tensor([ids], device=self.device)
        eos = tok.eos_token_id
        rows: list[dict] = []
        gen = torch.Generator(device="cpu")
        gen.manual_seed(stable_seed(cfg.seed, pid))
        n_done = 0
        while n_done < n:
            m = min(cfg.max_batch, n - n_done)
            torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=gen)))
            with torch.no_grad():
                out = self.model.generate(
                    input_ids=x,
                    attention_mask=torch.ones_like(x),
                    do_sample=True,
                    temperature=cfg.temperature,
                    top_p=cfg.top_p,
                    top_k=0,
                    max_new_tokens=cfg.max_new_tokens,
                    num_return_sequences=m,
                    pad_token_id=tok.pad_token_id,
                    eos_token_id=eos,
                    output_logits=True,
                    return_dict_in_generate=True,
                )
            new = out.sequences[:, x.shape[1] :].cpu()
            logits = torch.stack(out.logits, dim=1).float().cpu()  # (m, T, V), raw
            lp = torch.log_softmax(logits, dim=-1).gather(-1, new[:, : logits.shape[1], None])[..., 0]
            for r in range(m):
                toks = new[r].tolist()
                stop = toks.index(eos) + 1 if eos in toks else None
                length = stop if stop is not None else len(toks)
                rows.append(
                    {
                        "prompt_id": str(pid),
                        "prompt": prompt,
                        "response": tok.decode(toks[: (stop - 1 if stop else length)], skip_special_tokens=True),
                        "candidate_index": n_done + r,
                        "logprob": float(lp[r, :length].sum()),
                        "n_tokens": int(length),
                        "finish_reason": "stop" if stop is not None else "length",
                    }
                )
            n_done += m
        return rows


class _VllmSampler:  # pragma: no cover - needs a GPU and vllm
    def __init__(self, model, tokenizer, cfg: GenerationConfig):
        import vllm

        self.vllm = vllm
        self.cfg = cfg
        if not isinstance(model, (str, os.PathLike)):
            raise MrtInputError("the vLLM backend needs a model path or hub id, not a model object")
        self.llm = vllm.LLM(model=resolve_model_path(str(model)), seed=cfg.seed, **(cfg.vllm_kwargs or {}))
        self.tok = load_tokenizer(tokenizer) if tokenizer is not None else self.llm.get_tokenizer()

    def batch(self, items: list[tuple[Any, str]], ns: list[int] | None = None) -> list[dict]:
        cfg = self.cfg
        texts = [format_prompt(self.tok, p, cfg.prompt_format) for _, p in items]
        ns = ns or [cfg.n] * len(items)
        params = [
            self.vllm.SamplingParams(
                n=n_i, temperature=cfg.temperature, top_p=cfg.top_p, max_tokens=cfg.max_new_tokens,
                seed=stable_seed(cfg.seed, pid) % (2**31), logprobs=0,
            )
            for (pid, _), n_i in zip(items, ns)
        ]
        outs = self.llm.generate(texts, sampling_params=params, use_tqdm=False)
        rows = []
        for (pid, prompt), req in zip(items, outs):
            for j, o in enumerate(req.outputs):
                lp = o.cumulative_logprob
                if lp is None and o.logprobs:
                    lp = float(sum(d[t].logprob for d, t in zip(o.logprobs, o.token_ids)))
                rows.append(
                    {
                        "prompt_id": str(pid), "prompt": prompt, "response": o.text, "candidate_index": j,
                        "logprob": float(lp) if lp is not None else math.nan, "n_tokens": len(o.token_ids),
                        "finish_reason": str(o.finish_reason),
                    }
                )
        return rows


def generate(
    prompts: Any,
    out: str | os.PathLike,
    model: Any,
    config: GenerationConfig | None = None,
    *,
    tokenizer: Any = None,
    prompt_column: str = "prompt",
    id_column: str = "prompt_id",
    n_column: str = "n",
    progress: bool = True,
    _stop_after_shards: int | None = None,
    **overrides,
) -> pl.DataFrame:
    """Sample ``config.n`` responses per prompt and write them to ``out`` (.parquet/.jsonl/.csv).

    ``prompts``: a table (or path) with ``prompt_id`` and ``prompt`` columns; a ``n_column`` column
    (``n``, as `mrt plan` writes it), when present, is each prompt's number of responses instead
    (0: none).
    ``model``: a path, hub id, .gguf file or a loaded causal LM (transformers path only).
    Keyword overrides set fields of ``GenerationConfig`` (``n=8, seed=1, ...``).
    Returns the full candidate table; re-running after an interruption resumes.
    """
    cfg = config or GenerationConfig()
    if overrides:
        cfg = GenerationConfig(**{**asdict(cfg), **overrides})
    cfg.validate()
    df = as_polars(prompts)
    require_columns(df, [id_column, prompt_column], "prompts")
    if df[id_column].null_count():
        row = int(df[id_column].is_null().arg_true()[0])
        raise MrtInputError(f"column {id_column!r} has a null prompt id at row {row}", column=id_column, row=row)
    # shards key prompts by the id's text; the output keeps the ids as given (value and type)
    ids = df[id_column]
    df = df.with_columns(pl.col(id_column).cast(pl.Utf8))
    dup = df[id_column].is_duplicated()
    if dup.any():
        raise MrtInputError(f"prompt ids must be unique; repeated: {df.filter(dup)[id_column].unique().to_list()[:5]}")
    if df[prompt_column].null_count():
        raise MrtInputError(f"column {prompt_column!r} has null prompts")
    per_n = _per_prompt_n(df, n_column, cfg.n)
    n_of = dict(zip(df[id_column].to_list(), per_n))
    out = Path(out)
    parts = parts_dir(out)
    parts.mkdir(parents=True, exist_ok=True)
    _check_meta(parts, cfg)
    done = load_shards(out)
    counts = done.group_by("prompt_id").len() if done.height else None
    complete = set()
    if counts is not None:
        complete = {pid for pid, c in counts.iter_rows() if c >= n_of.get(pid, cfg.n)}
    todo = [(pid, p) for pid, p in zip(df[id_column].to_list(), df[prompt_column].to_list())
            if pid not in complete and n_of[pid] > 0]

    if todo:
        use_vllm = _vllm_usable(cfg)
        sampler = (_VllmSampler if use_vllm else _TransformersSampler)(model, tokenizer, cfg)
        next_shard = 1 + max((int(f.stem.split("-")[1]) for f in parts.glob("shard-*.parquet")), default=-1)
        bar = _progress(len(todo), "generating", progress)
        written = 0
        for s in range(0, len(todo), cfg.shard_prompts):
            chunk = todo[s : s + cfg.shard_prompts]
            if use_vllm:
                rows = sampler.batch(chunk, [n_of[pid] for pid, _ in chunk])
            else:
                rows = []
                for pid, p in chunk:
                    rows.extend(sampler(pid, p, n_of[pid]))
                    bar.update(1)
            shard = pl.DataFrame(rows, schema=SCHEMA)
            write_table(shard, parts / f"shard-{next_shard:06d}.parquet")
            next_shard += 1
            written += 1
            if use_vllm:
                bar.update(len(chunk))
            if _stop_after_shards is not None and written >= _stop_after_shards:
                bar.close()
                raise KeyboardInterrupt("stopped after shard (test hook)")
        bar.close()

    allc = load_shards(out)
    order = pl.DataFrame({"prompt_id": df[id_column], "_order": np.arange(df.height), "_id": ids})
    allc = (
        allc.join(order, on="prompt_id", how="inner")
        .sort(["_order", "candidate_index"])
        .with_columns(pl.col("_id").alias("prompt_id"))
        .drop("_order", "_id")
    )
    df = df.with_columns(ids.alias(id_column))
    extra = [c for c in df.columns if c not in (id_column, prompt_column) and c not in allc.columns]
    if extra:
        allc = allc.join(df.select([id_column, *extra]).rename({id_column: "prompt_id"}), on="prompt_id", how="left")
    if id_column != "prompt_id":
        allc = allc.rename({"prompt_id": id_column})
    write_table(allc, out)
    return allc


_SAMPLING_KEYS = ("n", "temperature", "top_p", "max_new_tokens", "seed", "prompt_format")


def _per_prompt_n(df: pl.DataFrame, column: str, default: int) -> list[int]:
    """Each prompt's number of responses: the ``column`` (integers >= 0) when present, else ``default``."""
    if column not in df.columns:
        return [default] * df.height
    s = df[column]
    if not s.dtype.is_integer():
        raise MrtInputError(f"column {column!r} (responses per prompt) must hold integers, got {s.dtype}",
                            column=column)
    bad = (s.is_null() | (s < 0)).fill_null(True)
    if bad.any():
        r = int(bad.arg_true()[0])
        raise MrtInputError(f"column {column!r} (responses per prompt) is {s[r]!r} at row {r}: an integer >= 0",
                            column=column, row=r)
    return s.cast(pl.Int64).to_list()


def _check_meta(parts: Path, cfg: GenerationConfig) -> None:
    """Refuse to resume shards written with other sampling settings (they would mix)."""
    import json

    meta = {k: getattr(cfg, k) for k in _SAMPLING_KEYS}
    f = parts / "meta.json"
    if f.exists():
        try:
            old = json.loads(f.read_text())
            assert isinstance(old, dict)
        except (ValueError, AssertionError, OSError):
            raise MrtInputError(f"{f} is not a settings file of an earlier run; delete {parts} to start over") from None
        diff = {k: (old.get(k), v) for k, v in meta.items() if old.get(k) != v}
        if diff:
            raise MrtInputError(
                f"{parts} holds candidates sampled with other settings {diff} (old, new); "
                "use another output path or delete it"
            )
    else:
        write_text(f, json.dumps(meta))


def _progress(total: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, disable=not enabled, leave=False)


def sample_responses(
    model: Any,
    tokenizer: Any,
    prompts: list[str],
    n: int,
    *,
    seed: int = 0,
    config: GenerationConfig | None = None,
    ids: list[Any] | None = None,
) -> list[list[str]]:
    """In-memory sampling (no files): ``n`` responses for each prompt, transformers path."""
    cfg = config or GenerationConfig()
    cfg = GenerationConfig(**{**asdict(cfg), "n": n, "seed": seed, "backend": "transformers"})
    cfg.validate()
    sampler = _TransformersSampler(model, tokenizer, cfg)
    ids = ids if ids is not None else list(range(len(prompts)))
    return [[r["response"] for r in sampler(pid, p)] for pid, p in zip(ids, prompts)]
