"""LoRA fine-tuning on the multi-response objective.

The objective (paper §2, "MRT"): prompts i = 1..N_p, each with K_i kept
responses y_ij, and

    L(theta) = (1 / N_p) * sum_i (1 / K_i) * sum_j l_ij,
    l_ij     = (1 / T_ij) * sum_{t in response tokens of y_ij} -log p_theta(y_ij,t | x_i, y_ij,<t)

i.e. a token-mean per response (prompt tokens masked with label -100, the
response's EOS scored), averaged over the prompt's responses, then over prompts:
a prompt with 4 kept responses weighs exactly as much as one with 1.

Optimisation: the N = sum_i K_i (prompt, response) pairs are shuffled (seeded)
each epoch and cut into micro-batches of ``batch_size``; ``grad_accum``
micro-batches make one optimizer step over M = batch_size * grad_accum pairs.
Each pair carries the weight w_ij = N / (N_p * K_i) (mean weight 1), and an
optimizer step minimises

    (1 / M) * sum_{pairs m in the step} w_m * l_m ,

whose average over an epoch is exactly L(theta) above (with equal K_i every
w_ij = 1 and this is the plain mean of response losses). Training runs a fixed
number of optimizer steps ``max_steps`` whatever the data size (the paper's
matched-step design: small-K runs see their data for more epochs); the data
iterator cycles through epochs, and the last, partial epoch is the only
incomplete one.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from ._llm import load_causal_lm, load_tokenizer, pick_device
from .loss import build_example, collate, sequence_losses  # noqa: F401  (the one definition of l_ij)
from .io import as_polars, require_columns
from .errors import MrtInputError

PAPER_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj", "gate_proj"]


@dataclass
class TrainConfig:
    """Every knob of `train`; defaults are the paper's recipe (LoRA r 16, alpha 32, lr 1.2e-4, batch 1 x 16)."""

    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    target_modules: list[str] = field(default_factory=lambda: list(PAPER_TARGETS))
    learning_rate: float = 1.2e-4
    batch_size: int = 1
    grad_accum: int = 16
    max_steps: int = 200  # optimizer steps, the same for every K
    lr_scheduler: str = "linear"  # any transformers scheduler name: linear, cosine, constant, ...
    warmup_ratio: float = 0.03
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    max_length: int = 1024  # prompt + response tokens; longer pairs keep the response end, prompt cut from the left
    seed: int = 0
    per_prompt_weighting: bool = True  # False: every pair weighs 1 (the pair-mean objective)
    prompt_format: str = "auto"
    device: str = "auto"
    dtype: str = "float32"
    log_every: int = 1
    gradient_checkpointing: bool = False
    log_pair_losses: bool = False  # also log each pair's loss l_ij (row index -> loss) at every logged step

    def validate(self) -> None:
        for name in ("lora_r", "batch_size", "grad_accum", "max_steps", "max_length", "log_every"):
            if getattr(self, name) < 1:
                raise MrtInputError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.learning_rate > 0:
            raise MrtInputError(f"learning_rate must be > 0, got {self.learning_rate}")
        if not 0 <= self.warmup_ratio < 1:
            raise MrtInputError(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if not self.target_modules:
            raise MrtInputError("target_modules is empty")

    @classmethod
    def from_dict(cls, d: dict | None) -> "TrainConfig":
        d = dict(d or {})
        known = set(cls.__dataclass_fields__)
        bad = sorted(set(d) - known)
        if bad:
            raise MrtInputError(f"unknown train option(s) {bad}; known: {sorted(known)}")
        return cls(**d)


@dataclass
class TrainResult:
    output_dir: Path
    adapter_dir: Path
    steps: int
    n_pairs: int
    n_prompts: int
    epochs: float
    log: list[dict]
    seconds: float


# ------------------------------------------------------------------ data


def pair_weights(prompt_ids_: Any, per_prompt: bool = True, weight: Any = None) -> np.ndarray:
    """w_ij = N / (N_p K_i) for each pair (mean 1; all ones when ``per_prompt`` is False),
    times ``weight`` (e.g. the stratified selector's per-row weight) when given."""
    ids = prompt_ids_ if isinstance(prompt_ids_, pl.Series) else pl.Series("p", list(prompt_ids_), strict=False)
    if ids.dtype == pl.Object:
        ids = pl.Series("p", [str(x) for x in ids.to_list()])
    n = len(ids)
    if per_prompt and n:
        f = ids.alias("p").to_frame().select(pl.len().over("p").alias("k"), pl.col("p").n_unique().alias("np"))
        w = n / (f["np"].cast(pl.Float64) * f["k"].cast(pl.Float64)).to_numpy()
    else:
        w = np.ones(n)
    if weight is not None:
        wt = np.asarray(weight, dtype=np.float64)
        if wt.shape != (n,):
            raise MrtInputError(f"weight has shape {wt.shape}, expected ({n},)")
        if not np.all(np.isfinite(wt)) or np.any(wt < 0):
            bad = int(np.nonzero(~(np.isfinite(wt) & (wt >= 0)))[0][0])
            raise MrtInputError(f"weight must be finite and >= 0; row {bad} is {wt[bad]}", column="weight", row=bad)
        w = w * wt
    return w


def mrt_objective(losses: np.ndarray, prompt_ids_: list[Any]) -> float:
    """(1/N_p) sum_i (1/K_i) sum_j l_ij, the exact full-data objective."""
    losses = np.asarray(losses, dtype=np.float64)
    return float(np.mean(losses * pair_weights(prompt_ids_)))


def step_schedule(n_pairs: int, batch_size: int, grad_accum: int, max_steps: int, seed: int) -> list[list[list[int]]]:
    """Pair indices of each micro-batch of each optimizer step: max_steps x grad_accum x <=batch_size.

    Epochs of a seeded shuffle are concatenated until max_steps * batch_size * grad_accum pairs are drawn.
    """
    if n_pairs < 1:
        raise MrtInputError("no training pairs")
    per_step = batch_size * grad_accum
    need = max_steps * per_step
    rng = np.random.default_rng(seed)
    stream = np.concatenate([rng.permutation(n_pairs) for _ in range(math.ceil(need / n_pairs))])[:need]
    return [
        [stream[s * per_step + a * batch_size : s * per_step + (a + 1) * batch_size].tolist() for a in range(grad_accum)]
        for s in range(max_steps)
    ]


# ------------------------------------------------------------------ training


def _load_pairs(data: Any, prompt: str, response: str, by: str) -> pl.DataFrame:
    df = as_polars(data)
    require_columns(df, [by, prompt, response], "training data")
    for c in (prompt, response):
        if df[c].null_count():
            raise MrtInputError(f"training data: column {c!r} has nulls")
    if df.height == 0:
        raise MrtInputError("training data is empty")
    return df


def train(
    data: Any,
    model: Any,
    output_dir: str | os.PathLike,
    config: TrainConfig | None = None,
    *,
    tokenizer: Any = None,
    by: str = "prompt_id",
    prompt: str = "prompt",
    response: str = "response",
    weight: str | None = "weight",
    progress: bool = True,
    **overrides,
) -> TrainResult:
    """Fine-tune a LoRA adapter on the kept (prompt, response) pairs of ``data``.

    Writes ``output_dir/adapter`` (peft adapter + tokenizer), ``train_log.jsonl``
    (step, loss, lr, epoch) and ``train_config.json``. Keyword overrides set
    `TrainConfig` fields. A ``weight`` column (the stratified selector's
    unbiasing weights), when present, multiplies each pair's weight.
    """
    import torch
    from peft import LoraConfig, get_peft_model
    from tqdm.auto import tqdm
    from transformers import get_scheduler

    cfg = config or TrainConfig()
    if overrides:
        cfg = TrainConfig(**{**asdict(cfg), **overrides})
    cfg.validate()
    df = _load_pairs(data, prompt, response, by)
    if tokenizer is None and not isinstance(model, (str, os.PathLike)):
        raise MrtInputError("pass tokenizer= when model is a loaded object")
    tok = load_tokenizer(tokenizer if tokenizer is not None else model)
    device = pick_device(cfg.device)
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()

    torch.manual_seed(cfg.seed)
    base = load_causal_lm(model, device=device, dtype=cfg.dtype)
    present = {name.rsplit(".", 1)[-1] for name, _ in base.named_modules()}
    targets = [t for t in cfg.target_modules if t in present]
    if not targets:
        raise MrtInputError(f"none of target_modules {cfg.target_modules} is a module of this model")
    lora = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules=targets, task_type="CAUSAL_LM")
    net = get_peft_model(base, lora)
    if cfg.gradient_checkpointing:
        net.gradient_checkpointing_enable()
        net.enable_input_require_grads()
    net.train()

    examples = [build_example(tok, p, r, cfg.max_length, cfg.prompt_format)
                for p, r in zip(df[prompt].to_list(), df[response].to_list())]
    wcol = df[weight].cast(pl.Float64).to_numpy() if weight is not None and weight in df.columns else None
    weights = torch.tensor(pair_weights(df[by], cfg.per_prompt_weighting, wcol), dtype=torch.float32)
    schedule = step_schedule(len(examples), cfg.batch_size, cfg.grad_accum, cfg.max_steps, cfg.seed)
    m = cfg.batch_size * cfg.grad_accum

    params = [p for p in net.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    sched = get_scheduler(cfg.lr_scheduler, opt, num_warmup_steps=int(cfg.warmup_ratio * cfg.max_steps),
                          num_training_steps=cfg.max_steps)
    log: list[dict] = []
    logf = open(out / "train_log.jsonl", "w")
    seen = 0
    try:
        for step, micro in enumerate(tqdm(schedule, desc="training", disable=not progress, leave=False), start=1):
            opt.zero_grad(set_to_none=True)
            step_loss = 0.0
            pair_log: dict[int, float] = {}
            for idx in micro:
                ids, mask, labels = collate([examples[i] for i in idx], tok.pad_token_id)
                ids, mask, labels = ids.to(device), mask.to(device), labels.to(device)
                logits = net(input_ids=ids, attention_mask=mask).logits
                losses, _ = sequence_losses(logits, labels)
                if cfg.log_pair_losses:
                    pair_log.update(zip(idx, losses.detach().double().cpu().tolist()))
                loss = (losses * weights[idx].to(device)).sum() / m
                loss.backward()
                step_loss += float(loss.detach())
                seen += len(idx)
            grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm) if cfg.max_grad_norm else None
            lr = sched.get_last_lr()[0]
            opt.step()
            sched.step()
            if step % cfg.log_every == 0 or step == cfg.max_steps:
                rec = {"step": step, "loss": step_loss, "lr": lr, "epoch": seen / len(examples)}
                if grad_norm is not None:
                    rec["grad_norm"] = float(grad_norm)
                if cfg.log_pair_losses:
                    rec["pair_losses"] = {str(i): v for i, v in sorted(pair_log.items())}
                log.append(rec)
                logf.write(json.dumps(rec) + "\n")
                logf.flush()
    finally:
        logf.close()

    adapter = out / "adapter"
    net.save_pretrained(adapter)
    tok.save_pretrained(adapter)
    meta = {**asdict(cfg), "target_modules_used": targets, "n_pairs": len(examples),
            "n_prompts": int(df[by].n_unique()), "epochs": seen / len(examples),
            "base_model": str(model) if isinstance(model, (str, os.PathLike)) else type(model).__name__}
    (out / "train_config.json").write_text(json.dumps(meta, indent=2, default=str))
    return TrainResult(out, adapter, cfg.max_steps, len(examples), meta["n_prompts"], seen / len(examples), log,
                       time.time() - t0)
