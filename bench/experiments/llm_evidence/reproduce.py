"""Stages B, A and C of the pre-registered test in one command: resumable, in parallel worker processes.

    python bench/experiments/llm_evidence/reproduce.py                 # the CPU grids, a one-thread worker per core
    python bench/experiments/llm_evidence/reproduce.py --device cuda   # AMENDMENT.md's GPU variant, and Stage C
    python bench/experiments/llm_evidence/reproduce.py --minutes 90    # stop starting cells after 90 minutes
    python bench/experiments/llm_evidence/reproduce.py --quick         # the miniature (CI)

The phases run in the order the evidence needs them: Stage B (the fixed budget, seeds 0-2), Stage A (the
ratio against the gain), Stage C (the selectors); on a GPU, with the variant's extra seeds last. Each phase
splits its cells over ``--workers`` processes (``stage_x.py --part i/N --no-report``); every finished cell
is a file, so a stopped run loses only the cells in progress and a rerun goes on from there. At the end
(or at the deadline) each stage's report is written from the cells present; a report of an incomplete grid
says so and judges nothing. The predictions and pilots must already be committed (``preregister.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parents[1] / "results"

#: (script, seeds or None for all) in order; the GPU variant's extra seeds come after every stage's first ones
PHASES = {"cpu": [("stage_b.py", None), ("stage_a.py", None), ("stage_c.py", None)],
          "gpu": [("stage_b.py", "0,1,2"), ("stage_a.py", "0,1,2,3"), ("stage_c.py", "0,1,2"),
                  ("stage_b.py", "3,4,5"), ("stage_a.py", "4,5")]}


def design_flags(script: str, quick: bool, gpu: bool) -> list[str]:
    """The design flag a stage takes: ``--quick``, the GPU variant (Stage C has one design), or none."""
    if quick:
        return ["--quick"]
    return ["--gpu-variant"] if gpu and script != "stage_c.py" else []


def results_dir(quick: bool, gpu: bool) -> Path:
    """Where the stages write: the GPU variant's folder holds its Stage C cells too."""
    return RESULTS / ("llm_evidence_v2_quick" if quick else "llm_evidence_v2_gpu" if gpu else "llm_evidence_v2")


def phase(script: str, seeds: str | None, a, gpu: bool, results: Path, deadline: float) -> bool:
    """Run one phase in ``a.workers`` processes; False when the deadline stopped it."""
    cmd = [sys.executable, str(HERE / script), *design_flags(script, a.quick, gpu), "--device", a.device,
           "--threads", str(a.threads), "--results", str(results), "--no-report", *a.passthrough]
    if seeds:
        cmd += ["--seeds", seeds]
    print(f"== {script}{' seeds ' + seeds if seeds else ''}: {a.workers} worker(s)", flush=True)
    procs = [subprocess.Popen([*cmd, "--part", f"{i}/{a.workers}"]) for i in range(a.workers)]
    stopped = False
    for p in procs:
        left = deadline - time.monotonic()
        try:
            p.wait(timeout=max(left, 0.01))
        except subprocess.TimeoutExpired:
            stopped = True
            break
    if stopped:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()
        print(f"== the deadline stopped {script}: the cells written are kept, a rerun goes on", flush=True)
        return False
    bad = [p.returncode for p in procs if p.returncode != 0]
    if bad:
        raise SystemExit(f"{script}: a worker exited with {bad[0]}")
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", help="cpu, or cuda for AMENDMENT.md's GPU variant")
    ap.add_argument("--workers", type=int, default=None,
                    help="worker processes (default: one per core on the CPU, 14 on a GPU)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    ap.add_argument("--minutes", type=float, default=None, help="start no cell after this many minutes")
    ap.add_argument("--stages", default="b,a,c", help="which stages to run, of b, a and c (default: all three)")
    ap.add_argument("--quick", action="store_true", help="every stage's miniature (CI)")
    ap.add_argument("--results", type=Path, default=None, help="where the stages' folders and reports go")
    ap.add_argument("--model", default=None, help="a local causal LM directory (default: the bundled SmolLM2-135M)")
    a = ap.parse_args(argv)
    gpu = a.device.startswith("cuda")
    if a.quick and gpu:
        raise SystemExit("--quick and --device cuda are two designs: choose one")
    if a.workers is None:
        a.workers = 14 if gpu else os.cpu_count() or 1
    if a.workers < 1 or a.threads < 1:
        raise SystemExit("--workers and --threads must be at least 1")
    stages = {f"stage_{x.strip()}.py" for x in a.stages.split(",") if x.strip()}
    if not stages or not stages <= {"stage_a.py", "stage_b.py", "stage_c.py"}:
        raise SystemExit(f"--stages takes a comma list of a, b and c, got {a.stages!r}")
    a.passthrough = ["--model", a.model] if a.model else []
    results = a.results or results_dir(a.quick, gpu)
    t0 = time.monotonic()
    deadline = t0 + (a.minutes * 60 if a.minutes is not None else float("inf"))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    done = all(phase(s, seeds, a, gpu, results, deadline) for s, seeds in PHASES["gpu" if gpu else "cpu"]
               if s in stages)
    summary = {"complete_run": done, "minutes": round((time.monotonic() - t0) / 60, 1), "reports": {}}
    for script in sorted(stages):
        r = subprocess.run([sys.executable, str(HERE / script), *design_flags(script, a.quick, gpu), "--report",
                            "--results", str(results), *a.passthrough], capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"{script} --report failed:\n{r.stderr[-2000:]}")
        summary["reports"][script.removesuffix(".py")] = json.loads(r.stdout.strip().splitlines()[-1])
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
