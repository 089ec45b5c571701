"""Stage C of the pre-registered test: the selectors at K = 4 with the checker's reward (AMENDMENT.md, section 3).

    python bench/experiments/llm_evidence/stage_c.py --threads 2    # the grid (resumable, cell by cell), then the report
    python bench/experiments/llm_evidence/stage_c.py --report       # the report from the cells present
    python bench/experiments/llm_evidence/stage_c.py --quick        # a miniature (CI)
    python bench/experiments/llm_evidence/stage_c.py --threads 1 --part 0/2 & \\
    python bench/experiments/llm_evidence/stage_c.py --threads 1 --part 1/2    # two processes share the grid

The task is the one `predictions.json` chose (``choice.stage_c``). Per seed, each of the seed's own training
prompts (`families.training_prompts`) gets one pool of 16 responses (`pool_rows`): 6 distinct valid answers,
4 near misses, 3 wrong answers and 3 samples of the chat model (the warm pilot's model: the base model in the chat
template, temperature 1), each scored by the family's checker (reward 1 valid, 0.5 near miss, 0 wrong), embedded
with the bundled MiniLM, its mode the normalized answer (the number it states, else its lower-cased text). The
pools are written once per seed (``RESULTS/stage_c/pools-s<seed>.json``) and shared by every selector of the seed,
so cells pair by (seed, held-out prompt).

Cells ``<selector>-s<seed>``: `mrt_fast.select` keeps K = 4 of each pool with the selector (random, top, diverse,
GRADES with the ``clip`` and the ``shift`` kernel, stratified by mode), then Stage A's training (the same steps,
batch, learning rate and LoRA for every selector, chat template) and held-out evaluation. The statistics are
`stage_c_report.py`'s.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from llm_evidence import stage_a  # noqa: E402
from llm_evidence.cell_files import write_atomic  # noqa: E402
from llm_evidence.families import REWARD, number, training_prompts  # noqa: E402

PREDICTIONS = stage_a.PREDICTIONS
RESULTS = stage_a.RESULTS
#: selector name -> (method, kernel)
SELECTORS = {"random": ("random", "clip"), "top": ("top", "clip"), "diverse": ("diverse", "clip"),
             "grades-clip": ("grades", "clip"), "grades-shift": ("grades", "shift"),
             "stratified": ("stratified", "clip")}
#: a pool's make-up: valid answers, near misses, wrong answers, model samples
POOL = dict(valid=6, near_miss=4, wrong=3, samples=3)
FULL = dict(stage_a.FULL, ks=[4], seeds=[0, 1, 2], pool=POOL, embed_model=None)
QUICK = dict(stage_a.QUICK, ks=[4], seeds=[0, 1], pool=dict(valid=2, near_miss=1, wrong=1, samples=1), n_tasks=None,
             embed_model=None)
POOL_KEYS = ["n_train", "pool", "prompt_format", "max_new_tokens"]


def stage_c_task(predictions: Path) -> str:
    return json.loads(Path(predictions).read_text())["choice"]["stage_c"]


def mode_of(response: str) -> str:
    """The normalized answer: the number a response states, else its lower-cased, space-collapsed text."""
    x = number(response)
    return str(x) if x is not None else " ".join(response.lower().split())


def _cycle(xs, n: int, rng: random.Random) -> list[str]:
    xs = list(xs)
    rng.shuffle(xs)
    return (xs * (n // max(1, len(xs)) + 1))[:n] if xs else []


def pool_responses(item, cfg: dict, samples: list[str], seed: int) -> list[tuple[str, str]]:
    """(response, source) for one prompt: the pool's valid answers (distinct), near misses and wrong answers from
    a seeded rng, and the model's samples."""
    rng = random.Random(f"stage-c:{item.prompt_id}:{seed}")
    p = cfg["pool"]
    valid = rng.sample(list(item.valid), min(p["valid"], len(item.valid)))
    out = [(r, "valid") for r in valid] + [(r, "near_miss") for r in _cycle(item.near_miss, p["near_miss"], rng)]
    out += [(r, "wrong") for r in _cycle(item.wrong, p["wrong"], rng)] + [(r, "sample") for r in samples]
    return out


def embed_responses(texts: list[str], model=None):
    """The responses' unit embeddings (the bundled MiniLM unless ``model`` names another)."""
    from mrt_fast import embed_texts

    return embed_texts(texts, model, progress=False)


def pool_rows(task: str, seed: int, cfg: dict, net, tok, embed_model=None) -> list[dict]:
    """Seed ``seed``'s pools: one row per response with its grade, reward, mode and embedding."""
    import numpy as np

    from llm_evidence.heldout import generate_answers

    items = training_prompts(task, seed, cfg["n_train"])
    n_s = cfg["pool"]["samples"]
    if n_s:
        _, samples = generate_answers(net, tok, [it.prompt for it in items], n_samples=n_s,
                                      max_new_tokens=cfg["max_new_tokens"], seed=seed,
                                      prompt_format=cfg["prompt_format"])
    else:
        samples = [[] for _ in items]
    rows = []
    for it, ss in zip(items, samples):
        for j, (r, src) in enumerate(pool_responses(it, cfg, ss, seed)):
            g = it.grade(r)
            rows.append({"prompt_id": it.prompt_id, "prompt": it.prompt, "response": r, "candidate_index": j,
                         "source": src, "grade": g, "reward": REWARD[g], "mode_text": mode_of(r)})
    emb = embed_responses([r["response"] for r in rows], embed_model)
    for r, e in zip(rows, np.asarray(emb, dtype=np.float32)):
        r["embedding"] = [float(v) for v in e]
    return rows


def kept_rows(pool: list[dict], selector: str, seed: int, k: int = 4):
    """The K rows of each pool the selector keeps (polars frame), modes as ids per prompt."""
    import polars as pl

    import mrt_fast

    method, kernel = SELECTORS[selector]
    cands = pl.DataFrame(pool).with_columns(
        pl.col("mode_text").rank("dense").over("prompt_id").cast(pl.Int64).alias("mode"),
        pl.col("embedding").cast(pl.List(pl.Float32)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mrt_fast.SmallPoolWarning)
        return mrt_fast.select(cands, k, method, kernel=kernel, seed=seed)


class Runner(stage_a.Runner):
    """Stage A's runner on Stage C's grid: every selector of a seed trains on its own K = 4 rows of the seed's
    pools."""

    def cell_list(self) -> list[tuple[str, dict]]:
        return [(f"{sel}-s{s}", {"kind": "train", "task": self.tasks[0], "k": 4, "seed": s, "selector": sel})
                for s in self.cfg["seeds"] for sel in SELECTORS]

    def settings(self, spec: dict) -> dict:
        return {**stage_a.cell_settings(self.cfg, spec, self.sha, self.model_label), "pool": self.cfg["pool"],
                "selector": SELECTORS[spec["selector"]]}

    def pools(self, task: str, seed: int) -> list[dict]:
        """The seed's pools, made once and kept beside the cells (the same for every selector)."""
        from mrt_fast.llm.models import load_causal_lm

        import fcntl

        path = self.results / f"pools-s{seed}.json"
        want = {"task": task, "seed": seed, **{k: self.cfg[k] for k in POOL_KEYS}, "model": self.model_label,
                "eos_token": self.tok.eos_token}
        self.results.mkdir(parents=True, exist_ok=True)
        # one process builds a seed's pools; the others sharing the grid wait and read them, so that every
        # selector of the seed keeps rows of the same pools
        with open(self.results / f".pools-s{seed}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if path.exists():
                d = json.loads(path.read_text())
                if d.get("settings") == json.loads(json.dumps(want)):
                    return d["rows"]
            net = load_causal_lm(self.model, device=self.device)
            rows = pool_rows(task, seed, self.cfg, net, self.tok, self.cfg.get("embed_model"))
            write_atomic(path, {"settings": want, "rows": rows})
        return rows

    def train_cell(self, spec: dict) -> dict:
        import polars as pl

        from llm_evidence.lora_train import train_adapter

        pool = self.pools(spec["task"], spec["seed"])
        kept = kept_rows(pool, spec["selector"], spec["seed"])
        out = self.work / f"run-{os.getpid()}"
        res = train_adapter(kept.select("prompt_id", "prompt", "response"), self.model, out,
                            steps=self.cfg["steps"], batch_size=self.cfg["batch_size"], lr=self.cfg["lr"],
                            lora_r=self.cfg["lora_r"], seed=spec["seed"], prompt_format=self.cfg["prompt_format"],
                            device=self.device)
        ev = self.evaluate(spec["task"], str(res.adapter_dir), spec["seed"])
        valid = pl.col("grade") == "valid"
        per_prompt = (kept.group_by("prompt_id", maintain_order=True)
                      .agg(kept_reward=pl.col("reward").mean(), kept_valid=valid.mean(),
                           kept_distinct_valid=pl.col("mode_text").filter(valid).n_unique()))
        return {**ev, "train_seconds": res.seconds, "train_loss": [r["loss"] for r in res.log],
                "kept": kept.select("prompt_id", "response", "source", "grade", "reward").to_dicts(),
                "kept_per_prompt": per_prompt.to_dicts(),
                "kept_reward": float(per_prompt["kept_reward"].mean()),
                "kept_valid": float(per_prompt["kept_valid"].mean()),
                "kept_distinct_valid": float(per_prompt["kept_distinct_valid"].mean())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a miniature (CI): 2 seeds, 2 steps, 3 held-out prompts")
    stage_a.runner_arguments(ap, "stage_c")
    ap.add_argument("--n-boot", type=int, default=None, help="bootstrap replicates (default 2000, 200 for --quick)")
    a = ap.parse_args(argv)
    cfg = dict(QUICK if a.quick else FULL)
    results = a.results or HERE.parents[1] / "results" / ("llm_evidence_v2_quick" if a.quick else "llm_evidence_v2")
    task = stage_c_task(a.predictions)
    if not a.report:
        stage_a.run_cells(a, Runner, cfg, [task], results / "stage_c")
    if not a.no_report:
        from llm_evidence.stage_c_report import write_report

        summary = write_report(results / "stage_c", results / "stage_c.md", cfg, task, a.predictions,
                               n_boot=a.n_boot or (200 if a.quick else 2000))
        print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
