"""One LoRA fine-tuning run of an evidence cell: the kept (prompt, response) rows, a fixed number of optimizer
steps (the same for every K: the matched-step design), `mrt_fast.llm.train.train` underneath."""

from __future__ import annotations

from pathlib import Path


def train_adapter(rows, model: str, out: Path, *, steps: int, batch_size: int, lr: float, lora_r: int, seed: int,
                  prompt_format: str, device: str = "cpu"):
    """Train a LoRA adapter (alpha = 2 r, one micro-batch a step, no checkpoints) on ``rows`` (prompt_id, prompt,
    response) into ``out``; returns `mrt_fast.llm.train.TrainResult` (the adapter is ``adapter_dir``)."""
    from mrt_fast.llm.train import TrainConfig, train

    tc = TrainConfig(max_steps=steps, batch_size=batch_size, grad_accum=1, learning_rate=lr, lora_r=lora_r,
                     lora_alpha=2 * lora_r, seed=seed, prompt_format=prompt_format, device=device, log_every=1,
                     resume=False)
    return train(rows, model, out, tc, progress=False)
