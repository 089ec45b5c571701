"""Stage A of the pre-registered test: does the pilot's ratio V_y|x / V_x order the gain of K = 4 over K = 1?

    python bench/experiments/llm_evidence/stage_a.py --threads 2    # the grid (resumable, cell by cell), then the report
    python bench/experiments/llm_evidence/stage_a.py --report       # the report from the cells present
    python bench/experiments/llm_evidence/stage_a.py --quick        # a miniature (CI)
    python bench/experiments/llm_evidence/stage_a.py --gpu-variant --device cuda   # AMENDMENT.md's larger variant
    python bench/experiments/llm_evidence/stage_a.py --threads 1 --part 0/2 & \
    python bench/experiments/llm_evidence/stage_a.py --threads 1 --part 1/2    # two processes share the grid

The tasks are the ones `predictions.json` chose for Stage A (``choice.stage_a``).
Cells, one JSON file each in ``RESULTS/`` (written atomically; a rerun skips a
cell written with the same settings and the same SHA-256 of predictions.json):

* ``<task>-base``: the untrained model on the held-out prompts (the valid rate
  training has to beat);
* ``<task>-k<K>-s<seed>``: seed ``seed``'s own training prompts
  (`families.training_prompts`), each with a balanced pool of its valid answers
  (`families.Item.pool`, the pilots' construction), K of them kept at random
  (`mrt_fast.select`), LoRA training in the chat template for the same number
  of optimizer steps at every K, then the held-out evaluation
  (`heldout.evaluate_heldout`: the loss of every valid answer, graded greedy
  answers and samples).

Cells run seed-major (every task x K of seed 0, then seed 1, ...) so that a
partial run is balanced. The statistics are `stage_a_report.py`'s.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from llm_evidence.cell_files import is_done, write_atomic  # noqa: E402
from llm_evidence.families import heldout_prompts, training_prompts  # noqa: E402
from llm_evidence.smollm2 import MODEL, MODEL_DIR, model_path  # noqa: E402

PREDICTIONS = HERE / "predictions.json"
RESULTS = HERE.parents[1] / "results" / "llm_evidence_v2"
FULL = dict(ks=[1, 4], seeds=[0, 1, 2, 3], n_train=48, pool_size=8, steps=24, batch_size=8, lr=1e-3, lora_r=8,
            prompt_format="chat", n_heldout=64, n_samples=4, max_new_tokens=8, n_tasks=None)
QUICK = dict(FULL, seeds=[0, 1], n_train=4, steps=2, batch_size=2, n_heldout=3, n_samples=2, max_new_tokens=4,
             n_tasks=3)
#: the larger variant run on one GPU (AMENDMENT.md): more seeds, K = 2, twice the steps; judged on the longest
#: complete seed prefix of at least ``min_seeds`` seeds
GPU_VARIANT = dict(FULL, ks=[1, 2, 4], seeds=[0, 1, 2, 3, 4, 5], steps=48, min_seeds=4,
                   design_flag="--gpu-variant")
#: the settings a training cell depends on (the base cells: the evaluation ones only)
EVAL_KEYS = ["prompt_format", "n_heldout", "n_samples", "max_new_tokens"]
TRAIN_KEYS = ["n_train", "pool_size", "steps", "batch_size", "lr", "lora_r", *EVAL_KEYS]


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def stage_a_tasks(predictions: Path, n_tasks: int | None = None) -> list[str]:
    """The tasks the predictions chose for Stage A (the first ``n_tasks`` of them when given)."""
    tasks = json.loads(Path(predictions).read_text())["choice"]["stage_a"]
    return tasks[:n_tasks] if n_tasks else tasks


def cells(cfg: dict, tasks: list[str]) -> list[tuple[str, dict]]:
    """Every cell in run order: the untrained model per task, then seed-major every task x K."""
    out = [(f"{t}-base", {"kind": "base", "task": t}) for t in tasks]
    for s in cfg["seeds"]:
        for t in tasks:
            for k in cfg["ks"]:
                out.append((f"{t}-k{k}-s{s}", {"kind": "train", "task": t, "k": k, "seed": s}))
    return out


def part_of(todo: list, i: int, n: int) -> list:
    """Part ``i`` of ``n`` of the cells (every n-th, from the i-th, so each part keeps the seed-major order): n
    processes with parts 0..n-1 run every cell once between them."""
    return todo[i::n]


def parse_part(text: str) -> tuple[int, int]:
    """``"I/N"`` -> (I, N), 0 <= I < N."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--part takes I/N (e.g. 0/2), got {text!r}") from None
    if not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"--part I/N needs 0 <= I < N, got {text!r}")
    return i, n


def cell_settings(cfg: dict, spec: dict, predictions_sha: str, model: str) -> dict:
    keys = TRAIN_KEYS if spec["kind"] == "train" else EVAL_KEYS
    return {**{k: cfg[k] for k in keys}, "predictions_sha256": predictions_sha, "model": model}


def training_rows(task: str, k: int, seed: int, cfg: dict):
    """Seed ``seed``'s training prompts, each with a balanced pool of valid answers, K kept at random."""
    import polars as pl

    import mrt_fast

    rows = [(it.prompt_id, it.prompt, r, j) for it in training_prompts(task, seed, cfg["n_train"])
            for j, r in enumerate(it.pool(cfg["pool_size"], seed=seed))]
    cands = pl.DataFrame(rows, schema=["prompt_id", "prompt", "response", "candidate_index"], orient="row")
    with warnings.catch_warnings():  # a prompt with fewer distinct answers than K keeps repeats of its pool
        warnings.simplefilter("ignore", mrt_fast.SmallPoolWarning)
        kept = mrt_fast.select(cands, k, "random", seed=seed)
    return kept.select("prompt_id", "prompt", "response")


class Runner:
    def __init__(self, cfg: dict, tasks: list[str], results: Path, model: str, model_label: str,
                 predictions_sha: str, work: Path, device: str = "cpu"):
        from mrt_fast.llm.models import load_tokenizer

        self.cfg, self.tasks, self.results, self.model = cfg, tasks, results, model
        self.model_label, self.sha, self.work, self.device = model_label, predictions_sha, work, device
        self.tok = load_tokenizer(model)

    def evaluate(self, task: str, adapter: str | None, seed: int) -> dict:
        from llm_evidence.heldout import evaluate_heldout
        from mrt_fast.llm.models import load_causal_lm

        cfg = self.cfg
        net = load_causal_lm(self.model, device=self.device, adapter=adapter)
        return evaluate_heldout(net, self.tok, heldout_prompts(task, cfg["n_heldout"]),
                                prompt_format=cfg["prompt_format"], n_samples=cfg["n_samples"],
                                max_new_tokens=cfg["max_new_tokens"], seed=seed)

    def cell_list(self) -> list[tuple[str, dict]]:
        """Every cell of the grid in run order (a later stage's runner overrides it)."""
        return cells(self.cfg, self.tasks)

    def settings(self, spec: dict) -> dict:
        """The settings recorded in a cell and compared on a rerun."""
        return cell_settings(self.cfg, spec, self.sha, self.model_label)

    def train_cfg(self, spec: dict) -> dict:
        """The settings a training cell trains with (Stage A: the same for every cell)."""
        return self.cfg

    def train_cell(self, spec: dict) -> dict:
        from llm_evidence.lora_train import train_adapter

        cfg = self.train_cfg(spec)
        kept = training_rows(spec["task"], spec["k"], spec["seed"], cfg)
        out = self.work / f"run-{os.getpid()}"
        shutil.rmtree(out, ignore_errors=True)
        res = train_adapter(kept, self.model, out, steps=cfg["steps"], batch_size=cfg["batch_size"], lr=cfg["lr"],
                            lora_r=cfg["lora_r"], seed=spec["seed"], prompt_format=cfg["prompt_format"],
                            device=self.device)
        t0 = time.time()
        ev = self.evaluate(spec["task"], str(res.adapter_dir), spec["seed"])
        shutil.rmtree(out, ignore_errors=True)
        return {**ev, "eval_seconds": time.time() - t0, "n_pairs": res.n_pairs, "n_prompts": res.n_prompts,
                "epochs": res.epochs, "train_seconds": res.seconds, "train_loss": [r["loss"] for r in res.log],
                "train_prompt_ids": sorted(set(kept["prompt_id"].to_list())), "kept": kept.to_dicts()}

    def run(self, only: str | None = None, limit: int | None = None, part: tuple[int, int] = (0, 1),
            seeds: list[int] | None = None) -> dict:
        """Run the cells not yet written: part ``part`` of the grid, only names containing ``only``, only the
        training cells of ``seeds`` (the untrained cells always), at most ``limit`` of them."""
        todo = [(n, s) for n, s in self.cell_list() if seeds is None or s.get("seed", seeds[0]) in seeds]
        todo = part_of(todo, *part)
        skipped = ran = 0
        for name, spec in todo:
            if only and only not in name:
                continue
            if limit is not None and ran >= limit:
                break
            path = self.results / f"{name}.json"
            # the token every answer is trained and scored to end with: a tokenizer that ends them otherwise
            # (another transformers release, another model) gives other cells, never a skipped one
            settings = {**self.settings(spec), "eos_token": self.tok.eos_token}
            if is_done(path, "settings", settings):
                skipped += 1
                continue
            t0, c0 = time.time(), time.process_time()
            result = self.train_cell(spec) if spec["kind"] == "train" else self.evaluate(spec["task"], None, 0)
            write_atomic(path, {"cell": name, "spec": spec, "settings": settings, "device": self.device,
                                "threads": _threads(), "seconds": time.time() - t0,
                                "cpu_seconds": time.process_time() - c0, "result": result})
            ran += 1
            print(f"{name}: {time.time() - t0:.1f} s; held-out loss {result['mean_loss']:.3f}, valid "
                  f"{result['greedy_valid_rate']:.2f} greedy / {result['sample_valid_rate']:.2f} sampled", flush=True)
        return {"cells": len(todo), "skipped": skipped, "ran": ran}


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def parse_seeds(text: str) -> list[int]:
    """``"0,1,2"`` -> [0, 1, 2]."""
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seeds takes whole numbers separated by commas, got {text!r}") from None
    if not out:
        raise argparse.ArgumentTypeError("--seeds needs at least one seed")
    return out


def runner_arguments(ap: argparse.ArgumentParser, stage: str) -> None:
    """The options every stage's runner takes: which cells, where, on what."""
    ap.add_argument("--seeds", type=parse_seeds, default=None, metavar="S,S,...",
                    help="run only these seeds' training cells (the report still covers the whole design)")
    ap.add_argument("--report", action="store_true", help="only write the report from the cells present")
    ap.add_argument("--no-report", action="store_true", help="run the cells, skip the report")
    ap.add_argument("--results", type=Path, default=None, help=f"where {stage}/ and {stage}.md go")
    ap.add_argument("--predictions", type=Path, default=PREDICTIONS, help="the pre-registered predictions.json")
    ap.add_argument("--model", default=None, help="a local causal LM directory (default: the bundled SmolLM2-135M, "
                    "made into a checkpoint once under --model-dir)")
    ap.add_argument("--model-dir", type=Path, default=MODEL_DIR)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--only", default=None, help="run only the cells whose name contains this")
    ap.add_argument("--limit", type=int, default=None, help="run at most this many cells (then stop)")
    ap.add_argument("--part", type=parse_part, default=(0, 1), metavar="I/N",
                    help="run only part I of N of the cells (N processes, parts 0..N-1, share the grid)")


def run_cells(a: argparse.Namespace, runner_cls: type, cfg: dict, tasks: list[str], cell_dir: Path) -> None:
    """Run the cells ``runner_arguments`` chose with ``runner_cls`` (the model made once) and print the count."""
    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    torch.set_num_threads(a.threads)
    model = model_path(a.model, a.model_dir)
    with tempfile.TemporaryDirectory(prefix=f"{cell_dir.name}_") as work:
        runner = runner_cls(cfg, tasks, cell_dir, model, a.model or MODEL, sha256(a.predictions), Path(work),
                            a.device)
        print(json.dumps(runner.run(a.only, a.limit, a.part, a.seeds)), flush=True)


def design(quick: bool, gpu_variant: bool) -> tuple[dict, str]:
    """The settings and the results folder's name of the chosen design."""
    if quick and gpu_variant:
        raise SystemExit("--quick and --gpu-variant are two designs: choose one")
    if gpu_variant:
        return dict(GPU_VARIANT), "llm_evidence_v2_gpu"
    return (dict(QUICK), "llm_evidence_v2_quick") if quick else (dict(FULL), "llm_evidence_v2")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a miniature (CI): 3 tasks, 2 seeds, 2 steps, 3 prompts")
    ap.add_argument("--gpu-variant", action="store_true", help="the larger variant of AMENDMENT.md (K in {1, 2, 4}, "
                    "seeds 0-5, 48 steps), results under llm_evidence_v2_gpu/")
    runner_arguments(ap, "stage_a")
    ap.add_argument("--pilots", type=Path, default=RESULTS / "pilots", help="the pilot files the predictions read")
    a = ap.parse_args(argv)
    cfg, folder = design(a.quick, a.gpu_variant)
    results = a.results or HERE.parents[1] / "results" / folder
    tasks = stage_a_tasks(a.predictions, cfg["n_tasks"])
    if not a.report:
        run_cells(a, Runner, cfg, tasks, results / "stage_a")
    if not a.no_report:
        from llm_evidence.stage_a_report import write_report

        summary = write_report(results / "stage_a", results / "stage_a.md", cfg, tasks, a.predictions, a.pilots)
        print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
