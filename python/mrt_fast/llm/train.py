"""LoRA fine-tuning on the multi-response objective.

The objective (paper §2, "MRT"): prompts i = 1..N_p, each with K_i kept
responses y_ij, and

    L(theta) = (1 / N_p) * sum_i (1 / K_i) * sum_j l_ij,
    l_ij     = (1 / T_ij) * sum_{t in response tokens of y_ij} -log p_theta(y_ij,t | x_i, y_ij,<t)

i.e. a token-mean per response (prompt tokens masked with label -100, the
response's EOS scored), averaged over the prompt's responses, then over prompts:
a prompt with 4 kept responses weighs exactly as much as one with 1.

Optimisation (transformers' `Trainer` with a loss of our own; TRL's
`SFTTrainer` has no per-example weights): the N = sum_i K_i (prompt, response)
pairs are shuffled (seeded)
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
incomplete one. On several processes (DDP, FSDP) each optimizer step draws
M x world_size pairs from the same stream and the gradients are averaged, the
same objective over larger steps.
"""

from __future__ import annotations

import functools
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from mrt_fast._util.device import resolve_device

from mrt_fast.llm.models import load_causal_lm, load_tokenizer
from mrt_fast.llm.loss import build_example, collate, keeps_logits, scored_losses, sequence_losses  # noqa: F401  (the one definition of l_ij)
from mrt_fast.datasets.formats import as_polars
from mrt_fast.tables.arrays import require_columns
from mrt_fast.tables.layouts import GROUPED, detect, explode
from mrt_fast.errors import MrtInputError

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
    save_steps: int | None = None  # write a checkpoint every save_steps optimizer steps (None: only the adapter)
    save_total_limit: int | None = 2  # checkpoints kept
    resume: Any = "auto"  # "auto": continue from the last checkpoint in output_dir/checkpoints if any; True; False
    report_to: list[str] = field(default_factory=list)  # transformers loggers: "tensorboard", "wandb", ...

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
        if self.save_steps is not None and self.save_steps < 1:
            raise MrtInputError(f"save_steps must be >= 1 or None, got {self.save_steps}")
        if self.resume not in ("auto", True, False):
            raise MrtInputError(f"resume must be 'auto', true or false, got {self.resume!r}")

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


def pair_stream(n_pairs: int, need: int, seed: int) -> np.ndarray:
    """The first ``need`` pair indices of concatenated seeded epoch permutations."""
    if n_pairs < 1:
        raise MrtInputError("no training pairs")
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.permutation(n_pairs) for _ in range(math.ceil(need / n_pairs))])[:need]


def step_schedule(n_pairs: int, batch_size: int, grad_accum: int, max_steps: int, seed: int) -> list[list[list[int]]]:
    """Pair indices of each micro-batch of each optimizer step: max_steps x grad_accum x <=batch_size.

    Epochs of a seeded shuffle are concatenated until max_steps * batch_size * grad_accum pairs are drawn.
    """
    per_step = batch_size * grad_accum
    stream = pair_stream(n_pairs, max_steps * per_step, seed)
    return [
        [stream[s * per_step + a * batch_size : s * per_step + (a + 1) * batch_size].tolist() for a in range(grad_accum)]
        for s in range(max_steps)
    ]


# ------------------------------------------------------------------ training


def _load_pairs(data: Any, prompt: str, response: str, by: str, weight: str | None) -> pl.DataFrame:
    df = as_polars(data)
    require_columns(df, [by, prompt, response], "training data")
    if detect(df.schema, {response: 0}) == GROUPED:  # a row a prompt (mrt select's grouped output): a row a pair
        df = explode(df, by, [c for c in (response, weight) if c is not None and c in df.columns
                              and isinstance(df.schema[c], (pl.List, pl.Array))])
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
    callbacks: list | None = None,
    **overrides,
) -> TrainResult:
    """Fine-tune a LoRA adapter on the kept (prompt, response) pairs of ``data`` (a row a pair, or
    grouped: a row a prompt with ``response`` and ``weight`` lists).

    Runs on transformers' `Trainer` (accelerate underneath: multi-GPU with
    ``accelerate launch``/``torchrun``, gradient checkpointing, the usual
    loggers through ``report_to``) with a loss that keeps the objective of
    the module docstring exactly. Writes ``output_dir/adapter`` (peft adapter
    + tokenizer), ``train_log.jsonl`` (step, loss, lr, epoch, grad_norm),
    ``train_config.json`` and, with ``save_steps``, checkpoints under
    ``output_dir/checkpoints`` from which a stopped run resumes
    (``resume="auto"``) to the same adapter. Keyword overrides set
    `TrainConfig` fields. A ``weight`` column (the stratified selector's
    unbiasing weights), when present, multiplies each pair's weight.
    ``callbacks``: extra transformers `TrainerCallback` objects.
    """
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import TrainingArguments
    from transformers.trainer_utils import get_last_checkpoint

    cfg = config or TrainConfig()
    if overrides:
        cfg = TrainConfig(**{**asdict(cfg), **overrides})
    cfg.validate()
    df = _load_pairs(data, prompt, response, by, weight)
    if tokenizer is None and not isinstance(model, (str, os.PathLike)):
        raise MrtInputError("pass tokenizer= when model is a loaded object")
    tok = load_tokenizer(tokenizer if tokenizer is not None else model)
    device = resolve_device(cfg.device)
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    ckpt_dir = out / "checkpoints"
    t0 = time.time()

    # resume: the last checkpoint, when its run had the same settings and data
    fingerprint = {k: v for k, v in asdict(cfg).items() if k not in ("resume", "report_to", "log_every", "device")}
    fingerprint.update(n_pairs=df.height, data_hash=int(df.select(by, prompt, response).hash_rows().sum()))
    last = get_last_checkpoint(str(ckpt_dir)) if ckpt_dir.is_dir() and cfg.resume else None
    if cfg.resume is True and last is None:
        raise MrtInputError(f"resume=True but there is no checkpoint in {ckpt_dir}")
    fp_file = ckpt_dir / "run.json"
    if last is not None:
        old = json.loads(fp_file.read_text()) if fp_file.exists() else None
        if old != json.loads(json.dumps(fingerprint, default=str)):
            raise MrtInputError(f"{ckpt_dir} holds checkpoints of a run with other settings or data: "
                                "remove it or use another output directory")

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

    examples = [build_example(tok, p, r, cfg.max_length, cfg.prompt_format)
                for p, r in zip(df[prompt].to_list(), df[response].to_list())]
    wcol = df[weight].cast(pl.Float64).to_numpy() if weight is not None and weight in df.columns else None
    weights = pair_weights(df[by], cfg.per_prompt_weighting, wcol)
    dataset = _Pairs(examples, weights)

    args = TrainingArguments(
        output_dir=str(ckpt_dir), per_device_train_batch_size=cfg.batch_size,
        gradient_accumulation_steps=cfg.grad_accum, max_steps=cfg.max_steps, learning_rate=cfg.learning_rate,
        lr_scheduler_type=cfg.lr_scheduler, warmup_steps=int(cfg.warmup_ratio * cfg.max_steps),
        weight_decay=cfg.weight_decay, max_grad_norm=cfg.max_grad_norm or 0.0, logging_steps=cfg.log_every,
        save_strategy="steps" if cfg.save_steps else "no", save_steps=cfg.save_steps or 500,
        save_total_limit=cfg.save_total_limit, seed=cfg.seed, report_to=list(cfg.report_to),
        remove_unused_columns=False, use_cpu=device == "cpu", disable_tqdm=not progress,
        dataloader_pin_memory=False, optim="adamw_torch",
    )
    if cfg.save_steps:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        fp_file.write_text(json.dumps(fingerprint, default=str))
    log_f = out / "train_log.jsonl"
    resumed_at = int(Path(last).name.rsplit("-", 1)[-1]) if last else 0
    kept_log = []
    if last and log_f.exists():  # records written after the checkpoint are redone
        kept_log = [json.loads(x) for x in log_f.read_text().splitlines() if x.strip()]
        kept_log = [r for r in kept_log if r["step"] <= resumed_at]
    log_f.write_text("".join(json.dumps(r) + "\n" for r in kept_log))

    trainer = _trainer_class()(model=net, args=args, train_dataset=dataset, data_collator=_Collator(tok.pad_token_id),
                          callbacks=list(callbacks or []))
    trainer.mrt_setup(cfg, len(examples), log_f)
    trainer.train(resume_from_checkpoint=last)

    adapter = out / "adapter"
    net.save_pretrained(adapter)
    tok.save_pretrained(adapter)
    log = [json.loads(x) for x in log_f.read_text().splitlines() if x.strip()]
    epochs = trainer.pairs_seen(cfg.max_steps) / len(examples)
    meta = {**asdict(cfg), "target_modules_used": targets, "n_pairs": len(examples),
            "n_prompts": int(df[by].n_unique()), "epochs": epochs, "resumed_from_step": resumed_at,
            "base_model": str(model) if isinstance(model, (str, os.PathLike)) else type(model).__name__}
    (out / "train_config.json").write_text(json.dumps(meta, indent=2, default=str))
    return TrainResult(out, adapter, cfg.max_steps, len(examples), meta["n_prompts"], epochs, log, time.time() - t0)


class _Pairs:
    """The training examples as a map-style dataset: input_ids, labels, weight, index."""

    def __init__(self, examples: list[dict], weights: np.ndarray):
        self.examples, self.weights = examples, weights

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i: int) -> dict:
        return {**self.examples[i], "weight": float(self.weights[i]), "index": int(i)}


class _Collator:
    def __init__(self, pad_id: int):
        self.pad_id = pad_id

    def __call__(self, batch: list[dict]) -> dict:
        import torch

        ids, mask, labels = collate(batch, self.pad_id)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels,
                "weight": torch.tensor([b["weight"] for b in batch], dtype=torch.float32),
                "index": torch.tensor([b["index"] for b in batch], dtype=torch.long)}


@functools.lru_cache(maxsize=None)
def _trainer_class():
    from transformers import Trainer, TrainerCallback

    class _Log(TrainerCallback):
        """Writes train_log.jsonl with the exact weighted loss of each logged step."""

        def __init__(self, trainer):
            self.trainer = trainer

        def on_log(self, args, state, control, logs=None, **kw):
            t = self.trainer
            if logs is None or "loss" not in logs or t._step_of != state.global_step - 1:
                return
            rec = {"step": state.global_step, "loss": t._step_loss, "lr": t._step_lr,
                   "epoch": t.pairs_seen(state.global_step) / t._n_pairs}
            if logs.get("grad_norm") is not None:
                rec["grad_norm"] = float(logs["grad_norm"])
            if t._cfg.log_pair_losses:
                rec["pair_losses"] = {str(i): v for i, v in sorted(t._pair_log.items())}
            with open(t._log_f, "a") as f:
                f.write(json.dumps(rec) + "\n")

    class MrtTrainer(Trainer):
        """`Trainer` whose loss is the multi-response objective: per micro-batch sum_m w_m l_m / batch_size,
        divided by the accumulation steps by `Trainer` itself, so a step minimises (1/M) sum w_m l_m."""

        loss_is_scaled_for_ga = False

        def mrt_setup(self, cfg, n_pairs: int, log_f: Path) -> None:
            self._cfg, self._n_pairs, self._log_f = cfg, n_pairs, log_f
            self.model_accepts_loss_kwargs = False  # older transformers: divide by the accumulation steps too
            self._step_of, self._step_loss, self._step_lr, self._pair_log = -1, 0.0, 0.0, {}
            self._trim = keeps_logits(self.model)  # the vocabulary projection over the scored window only
            self.add_callback(_Log(self))

        def pairs_seen(self, steps: int) -> int:
            return steps * self._cfg.batch_size * self._cfg.grad_accum * self.args.world_size

        def _get_train_sampler(self, train_dataset=None):
            return _StreamSampler(pair_stream(len(self.train_dataset), self.pairs_seen(self.args.max_steps),
                                              self._cfg.seed))

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            w = inputs.pop("weight")
            idx = inputs.pop("index")
            labels = inputs.pop("labels")
            losses, _, outputs = scored_losses(model, inputs["input_ids"], inputs["attention_mask"], labels,
                                               trim=self._trim)
            loss = (losses * w.to(losses.device)).sum() / self._cfg.batch_size
            if self._step_of != self.state.global_step:  # first micro-batch of a new optimizer step
                self._step_of, self._step_loss, self._pair_log = self.state.global_step, 0.0, {}
                self._step_lr = float(self.lr_scheduler.get_last_lr()[0]) if self.lr_scheduler else 0.0
            self._step_loss += float(loss.detach()) / self._cfg.grad_accum
            if self._cfg.log_pair_losses:
                self._pair_log.update(zip(idx.tolist(), losses.detach().double().cpu().tolist()))
            return (loss, outputs) if return_outputs else loss

    return MrtTrainer


class _StreamSampler:
    """Yields a fixed index stream (seeded epoch permutations): the same pairs, in the same order, on a resume."""

    def __init__(self, stream: np.ndarray):
        self.stream = stream

    def __len__(self) -> int:
        return len(self.stream)

    def __iter__(self):
        return iter(self.stream.tolist())
