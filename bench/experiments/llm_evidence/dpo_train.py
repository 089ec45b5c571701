"""One DPO run of the pairing-rule experiment: TRL's `DPOTrainer` with a fresh LoRA adapter on a start policy.

The start policy is the base model with the seed's SFT adapter merged into its weights; DPO trains a new LoRA
adapter on top of it, and the reference model is that same start (TRL disables the adapter to compute the
reference log-probabilities), so every rule starts from, and is regularised towards, the same policy.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class DPORun:
    """The trained policy (the start with its DPO adapter, eval mode), the trainer's log, its pairs and time."""

    model: Any
    log: list[dict]
    n_pairs: int
    seconds: float


def merged_start(model: str, adapter: str | Path, device: str = "cpu"):
    """The base model with the SFT adapter merged in: the start policy and DPO's reference."""
    from mrt_fast.llm.models import load_causal_lm

    return load_causal_lm(model, device=device, dtype="float32", adapter=str(adapter)).merge_and_unload().eval()


def train_dpo(start: Any, tok: Any, pairs_file: Path, out: Path, *, steps: int, batch_size: int, lr: float,
              beta: float, lora_r: int, seed: int, targets: list[str], warmup_steps: int = 0) -> DPORun:
    """``steps`` optimizer steps of DPO (sigmoid loss, ``beta``) on the pairs of ``pairs_file`` (TRL's preference
    format as `mrt_fast.llm.export.export` writes it, one micro-batch of ``batch_size`` pairs a step, cycling
    through the pairs as often as the steps need) with a fresh LoRA adapter (r ``lora_r``, alpha 2 r, no
    dropout) on ``start``."""
    import datasets
    import torch
    from datasets import load_dataset
    from peft import LoraConfig
    from trl import DPOConfig, DPOTrainer

    datasets.disable_progress_bars()
    ds = load_dataset("json", data_files=str(pairs_file), split="train")
    ds = ds.remove_columns([c for c in ds.column_names if c not in ("prompt", "chosen", "rejected")])
    args = DPOConfig(output_dir=str(out), max_steps=steps, per_device_train_batch_size=batch_size,
                     gradient_accumulation_steps=1, learning_rate=lr, lr_scheduler_type="linear",
                     warmup_steps=warmup_steps, beta=beta, loss_type=["sigmoid"], seed=seed, data_seed=seed,
                     max_length=None, gradient_checkpointing=False, bf16=False, fp16=False, use_cpu=True,
                     report_to=[], save_strategy="no", logging_steps=1, disable_tqdm=True, dataloader_num_workers=0,
                     dataset_num_proc=None)
    lora = LoraConfig(r=lora_r, lora_alpha=2 * lora_r, lora_dropout=0.0, target_modules=targets,
                      task_type="CAUSAL_LM")
    torch.manual_seed(seed)
    t0 = time.time()
    trainer = DPOTrainer(model=start, args=args, train_dataset=ds, processing_class=tok, peft_config=lora)
    trainer.train()
    log = [{k: float(v) for k, v in r.items() if isinstance(v, (int, float))} for r in trainer.state.log_history
           if "loss" in r]
    net = trainer.model.eval()
    return DPORun(net, log, len(ds), time.time() - t0)
