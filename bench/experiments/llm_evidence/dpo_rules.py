"""Pairing rules measured on a real model: DPO on pairs from best-worst, sweet-spot and all.

    python bench/experiments/llm_evidence/dpo_rules.py                  # the grid (resumable), then the report
    python bench/experiments/llm_evidence/dpo_rules.py --report         # the report from the cells present
    python bench/experiments/llm_evidence/dpo_rules.py --quick          # a miniature (CI)
    python bench/experiments/llm_evidence/dpo_rules.py --part 0/2 & \
    python bench/experiments/llm_evidence/dpo_rules.py --part 1/2       # two processes share the grid

Task ``multiple`` (families.py: "Name one multiple of d between lo and hi", 6 to 12 valid answers). Per seed:

* **SFT start**: one LoRA adapter trained on seed ``seed``'s own 48 training prompts, one valid answer each
  (Stage A's K = 1 rows and settings, `stage_a.training_rows`, `lora_train.train_adapter`, chat template), merged
  into the base model. It is the policy every rule starts from and DPO's reference. Cell ``sft-s<seed>``: that
  start on the held-out prompts (the baseline every rule is compared with).
* **Candidate pools**: 8 responses per training prompt (`candidate_pool`): 1 to 4 valid answers and numbers at
  spread distances from the nearest valid answer, sometimes a non-number, scored by `reward` (partial credit).
* **DPO per rule**: the pools through `mrt_fast.llm.export.export(..., "dpo", pairs=RULE)` with the model's
  tokenizer (conversational rows, the library's defaults otherwise), then TRL's DPOTrainer (`dpo_train`), a
  fresh LoRA adapter, the same optimizer steps, batch, learning rate, beta and seed for every rule. Cell
  ``<rule>-s<seed>``: the trained policy on the held-out prompts.

Every cell is evaluated on the same 64 held-out prompts (`heldout.evaluate_heldout`: the mean loss of the
valid answers, greedy and sampled answers graded by the checker), so cells pair by (seed, prompt). Cells are
JSON files in ``RESULTS/`` (written atomically; a rerun skips a cell written with the same settings and the
same SHA-256 of dpo_predictions.json). The statistics are `dpo_report.py`'s.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from llm_evidence.cell_files import is_done, write_atomic  # noqa: E402
from llm_evidence.families import VALID, Item, heldout_prompts, number, training_prompts  # noqa: E402
from llm_evidence.smollm2 import MODEL, MODEL_DIR, model_path  # noqa: E402
from llm_evidence.stage_a import _threads, parse_part, part_of, sha256  # noqa: E402

PREDICTIONS = HERE / "dpo_predictions.json"
RESULTS = HERE.parents[1] / "results" / "llm_evidence_v2"
#: where the seeds' SFT start adapters are kept between cells (ignored by git)
WORK = MODEL_DIR.parent / "dpo_rules_sft"
TASK = "multiple"
RULES = ("best-worst", "sweet-spot", "all")
#: the rules whose pairs a cell keeps (the report compares them); ``all`` keeps its export report only
KEEP_PAIRS = ("best-worst", "sweet-spot")
FULL = dict(seeds=[0, 1, 2], n_train=48, pool_size=8, sft_steps=24, sft_batch_size=8, sft_lr=1e-3, lora_r=8,
            n_candidates=32, dpo_steps=16, dpo_batch_size=4, dpo_lr=1e-3, beta=0.1, dpo_lora_r=8,
            prompt_format="chat", n_heldout=64, n_samples=2, max_new_tokens=8)
QUICK = dict(FULL, seeds=[0, 1], n_train=4, sft_steps=2, sft_batch_size=2, n_candidates=12, dpo_steps=2,
             dpo_batch_size=2, n_heldout=3, n_samples=2, max_new_tokens=4)
SFT_KEYS = ["n_train", "pool_size", "sft_steps", "sft_batch_size", "sft_lr", "lora_r", "prompt_format"]
EVAL_KEYS = ["prompt_format", "n_heldout", "n_samples", "max_new_tokens"]
DPO_KEYS = [*SFT_KEYS, "n_candidates", "dpo_steps", "dpo_batch_size", "dpo_lr", "beta", "dpo_lora_r", *EVAL_KEYS]

# ------------------------------------------------------------------ reward and candidate pools

#: the reward of a number that is not a valid answer: NEAR_SCALE * exp(-d / DISTANCE_SCALE), d = the distance to
#: the nearest valid answer
NEAR_SCALE = 0.9
DISTANCE_SCALE = 5.0
#: non-numbers a pool may hold (reward 0)
NON_NUMBERS = ("none", "I don't know", "Sure! Here is one.")
#: the share of a pool's invalid responses that are non-numbers, and the largest distance of an invalid number
NON_NUMBER_P = 0.02
MAX_DISTANCE = 15


def reward(item: Item, response: str) -> float:
    """1 for a valid answer (the family's checker); for any other number x, 0.9 exp(-d / 5) with d = min |x - v|
    over the valid answers v; 0 for a response that is not a number."""
    if item.check(response):
        return 1.0
    x = number(response)
    if x is None:
        return 0.0
    d = min(abs(x - int(v)) for v in item.valid)
    return NEAR_SCALE * math.exp(-d / DISTANCE_SCALE)


def candidate_pool(item: Item, size: int, seed: int) -> list[str]:
    """``size`` responses to ``item`` from a seeded rng: k valid answers (k uniform in 1..max(1, size // 4), drawn
    with replacement), the rest invalid: a non-number with probability NON_NUMBER_P, else a number at distance
    round(exp(U(0, log MAX_DISTANCE))) (1 to 15, log-uniform) above or below a random valid answer, redrawn while it
    is valid or negative. Shuffled."""
    rng = random.Random(f"dpo-pool:{item.prompt_id}:{seed}")
    k = rng.randint(1, max(1, size // 4))
    out = [rng.choice(item.valid) for _ in range(k)]
    valid = {int(v) for v in item.valid}
    while len(out) < size:
        if rng.random() < NON_NUMBER_P:
            out.append(rng.choice(NON_NUMBERS))
            continue
        x = int(rng.choice(item.valid)) + rng.choice((-1, 1)) * round(math.exp(rng.uniform(0, math.log(MAX_DISTANCE))))
        if x >= 0 and x not in valid:
            out.append(str(x))
    rng.shuffle(out)
    return out


def candidates_table(task: str, seed: int, cfg: dict):
    """Seed ``seed``'s training prompts, each with its pool of ``n_candidates`` scored responses."""
    import polars as pl

    rows = [(it.prompt_id, it.prompt, r, j, reward(it, r)) for it in training_prompts(task, seed, cfg["n_train"])
            for j, r in enumerate(candidate_pool(it, cfg["n_candidates"], seed))]
    return pl.DataFrame(rows, schema=["prompt_id", "prompt", "response", "candidate_index", "reward"], orient="row")


def export_pairs(cands, rule: str, path: Path, tok) -> tuple[list[dict], dict]:
    """The pools' DPO pairs under ``rule``, written to ``path`` by the library's export (as a user would: the
    model's tokenizer decides the prompt format, every other option its default); returns the pairs (prompt id,
    chosen, rejected, margin as text) and the export report."""
    from mrt_fast.llm.export import export

    rows, rep = export(cands, path, "dpo", pairs=rule, tokenizer=tok, return_report=True)
    pairs = [{"prompt_id": p, "chosen": _content(c), "rejected": _content(r), "margin": m}
             for p, c, r, m in rows.select("prompt_id", "chosen", "rejected", "margin").iter_rows()]
    report = {"rows_out": rep.rows_out, "rows_in": rep.rows_in, "prompts_in": rep.prompts_in,
              "duplicates_merged": rep.duplicates_merged, "ties": rep.ties, "prompts_dropped": rep.prompts_dropped,
              "margins": rep.margins, "pairs_per_prompt": rep.pairs_per_prompt, "lines": rep.lines()}
    return pairs, report


def pool_statistics(cfg: dict, tok=None) -> dict:
    """Per seed, before any training: the pools' rewards and how often sweet-spot's pair is best-worst's first pair
    (the same rejected text; the same rejected reward), from the library's export (``tok``: the tokenizer that
    decides the prompt format; the pairs do not depend on it)."""
    import numpy as np

    out = {}
    with tempfile.TemporaryDirectory(prefix="dpo_pools_") as tmp:
        for s in cfg["seeds"]:
            cands = candidates_table(TASK, s, cfg)
            got = {r: export_pairs(cands, r, Path(tmp) / f"{r}.jsonl", tok)[0] for r in ("best-worst", "sweet-spot")}
            first: dict = {}
            for p in got["best-worst"]:
                first.setdefault(p["prompt_id"], p)
            ss = got["sweet-spot"]
            r = cands["reward"].to_numpy()
            out[s] = {"prompts": len(ss), "mean_reward": float(r.mean()), "valid_share": float((r == 1.0).mean()),
                      "same_pair": sum(first[p["prompt_id"]]["rejected"] == p["rejected"] for p in ss),
                      "same_rejected_reward": sum(abs(first[p["prompt_id"]]["margin"] - p["margin"]) <= 1e-9
                                                  for p in ss),
                      "mean_margin": {k: float(np.mean([p["margin"] for p in v])) for k, v in got.items()}}
    return out


def _content(m):
    """A message list's text ([{"role", "content"}]) or a plain string."""
    if isinstance(m, str):
        return m
    return m[0]["content"]


# ------------------------------------------------------------------ the grid


def cells(cfg: dict) -> list[tuple[str, dict]]:
    """Every cell in run order: the SFT start of every seed first (each DPO cell of a seed needs it), then seed-major
    every rule, so that two processes (`part_of`) both train a start adapter first and a partial run is balanced."""
    out = [(f"sft-s{s}", {"kind": "sft", "task": TASK, "seed": s}) for s in cfg["seeds"]]
    for s in cfg["seeds"]:
        for rule in RULES:
            out.append((f"{rule}-s{s}", {"kind": "dpo", "task": TASK, "rule": rule, "seed": s}))
    return out


def cell_settings(cfg: dict, spec: dict, predictions_sha: str, model: str) -> dict:
    keys = DPO_KEYS if spec["kind"] == "dpo" else [*SFT_KEYS, *EVAL_KEYS]
    return {**{k: cfg[k] for k in dict.fromkeys(keys)}, "predictions_sha256": predictions_sha, "model": model}


def greedy_rewards(items: list[Item], greedy: list[str]) -> list[float]:
    return [reward(it, a) for it, a in zip(items, greedy)]


def _dir_sha256(d: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(Path(d).glob("*.safetensors")):
        h.update(p.read_bytes())
    return h.hexdigest()


@contextlib.contextmanager
def _locked(path: Path):
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class Runner:
    def __init__(self, cfg: dict, results: Path, model: str, model_label: str, predictions_sha: str, work: Path,
                 device: str = "cpu"):
        from mrt_fast.llm.models import load_tokenizer

        self.cfg, self.results, self.model, self.model_label = cfg, results, model, model_label
        self.sha, self.work, self.device = predictions_sha, work, device
        self.tok = load_tokenizer(model)
        self.items = heldout_prompts(TASK, cfg["n_heldout"])

    # the SFT start, trained once per seed and shared by the processes (a lock: the second waits for the first)
    def start_adapter(self, seed: int) -> tuple[Path, dict]:
        from llm_evidence.lora_train import train_adapter
        from llm_evidence.stage_a import training_rows

        cfg = self.cfg
        settings = {**{k: cfg[k] for k in SFT_KEYS}, "seed": seed, "model": self.model_label}
        d = self.work / f"sft-s{seed}"
        with _locked(self.work / f"sft-s{seed}.lock"):
            if is_done(d / "start.json", "settings", settings):
                return d / "adapter", json.loads((d / "start.json").read_text())["train"]
            shutil.rmtree(d, ignore_errors=True)
            kept = training_rows(TASK, 1, seed, dict(cfg, steps=cfg["sft_steps"]))
            res = train_adapter(kept, self.model, d / "run", steps=cfg["sft_steps"], batch_size=cfg["sft_batch_size"],
                                lr=cfg["sft_lr"], lora_r=cfg["lora_r"], seed=seed, prompt_format=cfg["prompt_format"],
                                device=self.device)
            shutil.copytree(res.adapter_dir, d / "adapter")
            shutil.rmtree(d / "run", ignore_errors=True)
            train = {"adapter_sha256": _dir_sha256(d / "adapter"), "seconds": res.seconds, "n_pairs": res.n_pairs,
                     "train_loss": [r["loss"] for r in res.log], "kept": kept.to_dicts()}
            write_atomic(d / "start.json", {"settings": settings, "train": train})
            return d / "adapter", train

    def evaluate(self, net, seed: int) -> dict:
        from llm_evidence.heldout import evaluate_heldout

        cfg = self.cfg
        t0 = time.time()
        ev = evaluate_heldout(net, self.tok, self.items, prompt_format=cfg["prompt_format"],
                              n_samples=cfg["n_samples"], max_new_tokens=cfg["max_new_tokens"], seed=seed)
        ev["greedy_reward"] = greedy_rewards(self.items, ev["greedy"])
        ev["mean_greedy_reward"] = float(sum(ev["greedy_reward"]) / len(ev["greedy_reward"]))
        ev["greedy_valid"] = [float(g == VALID) for g in ev["greedy_grade"]]
        ev["eval_seconds"] = time.time() - t0
        return ev

    def sft_cell(self, spec: dict) -> dict:
        from llm_evidence.dpo_train import merged_start

        t0 = time.time()
        adapter, train = self.start_adapter(spec["seed"])
        start_seconds = time.time() - t0
        net = merged_start(self.model, adapter, self.device)
        return {**self.evaluate(net, spec["seed"]), "start": train, "start_seconds": start_seconds}

    def dpo_cell(self, spec: dict) -> dict:
        from llm_evidence.dpo_train import merged_start, train_dpo
        from mrt_fast.llm.train import PAPER_TARGETS

        cfg, seed = self.cfg, spec["seed"]
        t0 = time.time()
        adapter, train = self.start_adapter(seed)
        start_seconds = time.time() - t0
        out = self.work / f"run-{os.getpid()}"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        pairs, report = export_pairs(candidates_table(TASK, seed, cfg), spec["rule"], out / "pairs.jsonl", self.tok)
        start = merged_start(self.model, adapter, self.device)
        present = {n.rsplit(".", 1)[-1] for n, _ in start.named_modules()}
        run = train_dpo(start, self.tok, out / "pairs.jsonl", out / "trainer", steps=cfg["dpo_steps"],
                        batch_size=cfg["dpo_batch_size"], lr=cfg["dpo_lr"], beta=cfg["beta"],
                        lora_r=cfg["dpo_lora_r"], seed=seed, targets=[t for t in PAPER_TARGETS if t in present])
        ev = self.evaluate(run.model, seed)
        shutil.rmtree(out, ignore_errors=True)
        return {**ev, "start_adapter_sha256": train["adapter_sha256"], "start_seconds": start_seconds,
                "train_seconds": run.seconds, "n_pairs": run.n_pairs,
                "epochs": cfg["dpo_steps"] * cfg["dpo_batch_size"] / run.n_pairs, "train_log": run.log,
                "export_report": report, "pairs": pairs if spec["rule"] in KEEP_PAIRS else None}

    def run(self, only: str | None = None, limit: int | None = None, part: tuple[int, int] = (0, 1)) -> dict:
        todo = part_of(cells(self.cfg), *part)
        skipped = ran = 0
        for name, spec in todo:
            if only and only not in name:
                continue
            if limit is not None and ran >= limit:
                break
            path = self.results / f"{name}.json"
            settings = cell_settings(self.cfg, spec, self.sha, self.model_label)
            if is_done(path, "settings", settings):
                skipped += 1
                continue
            t0, c0 = time.time(), time.process_time()
            result = self.dpo_cell(spec) if spec["kind"] == "dpo" else self.sft_cell(spec)
            write_atomic(path, {"cell": name, "spec": spec, "settings": settings, "device": self.device,
                                "threads": _threads(), "seconds": time.time() - t0,
                                "cpu_seconds": time.process_time() - c0, "result": result})
            ran += 1
            print(f"{name}: {time.time() - t0:.1f} s; held-out loss {result['mean_loss']:.3f}, valid "
                  f"{result['greedy_valid_rate']:.2f} greedy / {result['sample_valid_rate']:.2f} sampled, "
                  f"greedy reward {result['mean_greedy_reward']:.3f}", flush=True)
        return {"cells": len(todo), "skipped": skipped, "ran": ran}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a miniature (CI): 2 seeds, 2 steps, 4 prompts, 3 held out")
    ap.add_argument("--report", action="store_true", help="only write the report from the cells present")
    ap.add_argument("--no-report", action="store_true", help="run the cells, skip the report")
    ap.add_argument("--results", type=Path, default=None, help="where dpo_rules/, dpo_rules.json and the page go")
    ap.add_argument("--doc", type=Path, default=None, help="the generated page (default: docs/results/dpo_rules.md "
                    "for the full grid, RESULTS/dpo_rules.md for --quick or --results)")
    ap.add_argument("--predictions", type=Path, default=PREDICTIONS, help="the pre-registered dpo_predictions.json")
    ap.add_argument("--model", default=None, help="a local causal LM directory (default: the bundled SmolLM2-135M)")
    ap.add_argument("--model-dir", type=Path, default=MODEL_DIR)
    ap.add_argument("--work", type=Path, default=None, help="where the SFT start adapters are kept (default: "
                    "next to the model checkpoint; --quick: a temporary folder)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--only", default=None, help="run only the cells whose name contains this")
    ap.add_argument("--limit", type=int, default=None, help="run at most this many cells (then stop)")
    ap.add_argument("--part", type=parse_part, default=(0, 1), metavar="I/N",
                    help="run only part I of N of the cells (N processes, parts 0..N-1, share the grid)")
    a = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    cfg = dict(QUICK if a.quick else FULL)
    results = a.results or HERE.parents[1] / "results" / ("llm_evidence_v2_quick" if a.quick else "llm_evidence_v2")
    default_doc = a.quick or a.results is not None
    doc = a.doc or (results / "dpo_rules.md" if default_doc else HERE.parents[2] / "docs" / "results" / "dpo_rules.md")
    if not a.report:
        import torch

        torch.set_num_threads(a.threads)
        model = model_path(a.model, a.model_dir)
        with tempfile.TemporaryDirectory(prefix="dpo_rules_") as tmp:
            work = a.work or (Path(tmp) if a.quick else WORK)
            runner = Runner(cfg, results / "dpo_rules", model, a.model or MODEL, sha256(a.predictions), work,
                            a.device)
            print(json.dumps(runner.run(a.only, a.limit, a.part)), flush=True)
    if not a.no_report:
        from llm_evidence.dpo_report import write_report

        summary = write_report(results / "dpo_rules", results / "dpo_rules.json", doc, cfg, a.predictions)
        print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
