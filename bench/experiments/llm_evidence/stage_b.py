"""Stage B of the pre-registered test: at a fixed budget, is the best K of the low-K* task below the high-K* task's?

    python bench/experiments/llm_evidence/stage_b.py --threads 2    # the grid (resumable, cell by cell), then the report
    python bench/experiments/llm_evidence/stage_b.py --report       # the report from the cells present
    python bench/experiments/llm_evidence/stage_b.py --quick        # a miniature (CI)
    python bench/experiments/llm_evidence/stage_b.py --gpu-variant --device cuda   # seeds 0-5 (AMENDMENT.md)
    python bench/experiments/llm_evidence/stage_b.py --threads 1 --part 0/2 & \\
    python bench/experiments/llm_evidence/stage_b.py --threads 1 --part 1/2    # two processes share the grid

The tasks are the two `predictions.json` chose for Stage B (``choice.stage_b``), the cost ratio
C_p / C_r its ``cost_ratio``. Every K of the grid spends the same budget
B = N_p (C_p + K C_r), with C_r = 1 and C_p = cost_ratio: B is set so that K = 4 keeps Stage A's
48 training prompts, B = 48 (10 + 4) = 672, and K trains on N_p(K) = floor(B / (C_p + K)) prompts
(61, 56, 48, 37 for K = 1, 2, 4, 8).

Cells ``<task>-k<K>-s<seed>``, one JSON file each in ``RESULTS/stage_b/`` (written atomically; a rerun skips a
cell written with the same settings and the same SHA-256 of predictions.json), run seed-major. A cell is
Stage A's training cell (`stage_a.Runner`) with N_p(K) prompts: seed ``seed``'s own training prompts
(`families.training_prompts`), a balanced pool of 8 valid answers per prompt, K kept at random, LoRA training
in the chat template for the same number of optimizer steps at every K, then the held-out evaluation
(`heldout.evaluate_heldout`). The statistics are `stage_b_report.py`'s.

Run time: one cell (``mixture-k1-s0``: 61 prompts, 24 steps of 8 pairs, then the 64 held-out prompts) took
497 s wall and 223 s of CPU time (305 s training, 189 s evaluation) on one thread of a 2-core CPU shared with
Stage A's grid (load 5-6). Stage A's training cells, the same training and evaluation with 48 prompts, took
190-300 s of CPU time each, so the 24 cells of the grid take about 1.5-2 hours of one-thread CPU time, and
about 3.3 hours of wall time in one process at this cell's load (the K = 8 cells train on the same 8 pairs a
step as the others; the tasks differ in prompt length and in valid answers per held-out prompt, range40
scoring 40 per prompt, mixture 1 or 40).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from llm_evidence import stage_a  # noqa: E402
from llm_evidence.fixed_budget import budget_for, prompts_for  # noqa: E402

PREDICTIONS = stage_a.PREDICTIONS
RESULTS = stage_a.RESULTS
#: Stage A's training settings; ``ref_k`` and ``n_train`` set the budget: K = ref_k keeps n_train prompts
FULL = dict(stage_a.FULL, ks=[1, 2, 4, 8], seeds=[0, 1, 2], ref_k=4)
QUICK = dict(stage_a.QUICK, ks=[1, 2, 4, 8], seeds=[0, 1], ref_k=4, n_tasks=None)
#: the GPU variant (AMENDMENT.md): the same design with seeds 0-5, judged on the longest complete seed prefix of
#: at least 3 seeds
GPU_VARIANT = dict(FULL, seeds=[0, 1, 2, 3, 4, 5], min_seeds=3, design_flag="--gpu-variant")
#: the settings of a Stage B training cell: Stage A's (with this cell's n_train) and the budget's
BUDGET_KEYS = ["budget", "cost_ratio", "ref_k"]
def stage_b_tasks(predictions: Path) -> list[str]:
    """The two tasks the predictions chose for Stage B."""
    return list(json.loads(Path(predictions).read_text())["choice"]["stage_b"])


def with_budget(cfg: dict, predictions: Path) -> dict:
    """``cfg`` with the predictions' cost ratio and the budget it implies."""
    cost_ratio = json.loads(Path(predictions).read_text())["cost_ratio"]
    if isinstance(cost_ratio, float) and cost_ratio.is_integer():
        cost_ratio = int(cost_ratio)
    return dict(cfg, cost_ratio=cost_ratio, budget=budget_for(cfg["n_train"], cfg["ref_k"], cost_ratio))


def cells(cfg: dict, tasks: list[str]) -> list[tuple[str, dict]]:
    """Every training cell, seed-major (every task x K of seed 0, then seed 1, ...), with its N_p(K)."""
    return [(f"{t}-k{k}-s{s}", {"kind": "train", "task": t, "k": k, "seed": s,
                                "n_train": prompts_for(cfg["budget"], k, cfg["cost_ratio"])})
            for s in cfg["seeds"] for t in tasks for k in cfg["ks"]]


class Runner(stage_a.Runner):
    """Stage A's runner on Stage B's grid: each cell trains on its own N_p(K) prompts."""

    def cell_list(self) -> list[tuple[str, dict]]:
        return cells(self.cfg, self.tasks)

    def train_cfg(self, spec: dict) -> dict:
        return dict(self.cfg, n_train=spec["n_train"])

    def settings(self, spec: dict) -> dict:
        return {**stage_a.cell_settings(self.train_cfg(spec), spec, self.sha, self.model_label),
                **{k: self.cfg[k] for k in BUDGET_KEYS}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a miniature (CI): 2 seeds, 2 steps, 3 held-out prompts")
    ap.add_argument("--gpu-variant", action="store_true", help="AMENDMENT.md's GPU variant (seeds 0-5), results "
                    "under llm_evidence_v2_gpu/")
    stage_a.runner_arguments(ap, "stage_b")
    ap.add_argument("--n-boot", type=int, default=None, help="bootstrap replicates of the report "
                    "(default 2000, 200 for --quick)")
    a = ap.parse_args(argv)
    if a.quick and a.gpu_variant:
        raise SystemExit("--quick and --gpu-variant are two designs: choose one")
    base, folder = ((GPU_VARIANT, "llm_evidence_v2_gpu") if a.gpu_variant
                    else (QUICK, "llm_evidence_v2_quick") if a.quick else (FULL, "llm_evidence_v2"))
    cfg = with_budget(base, a.predictions)
    results = a.results or HERE.parents[1] / "results" / folder
    tasks = stage_b_tasks(a.predictions)
    if not a.report:
        stage_a.run_cells(a, Runner, cfg, tasks, results / "stage_b")
    if not a.no_report:
        from llm_evidence.stage_b_report import write_report

        summary = write_report(results / "stage_b", results / "stage_b.md", cfg, tasks, a.predictions,
                               n_boot=a.n_boot or (200 if a.quick else 2000))
        print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
