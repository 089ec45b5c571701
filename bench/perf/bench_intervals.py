"""Cost of the advisor's interval methods against the accumulation they follow.

For Np prompts with K = 4 responses each (a polars frame, normal losses), it
times, best of `--repeat`, in one process:

* `variance_budget(df, n_boot=0)`: the estimates alone (the floor);
* `variance_budget(df, n_boot=B, interval=m)` for each interval method m
  (`studentized`, the default; `expanded`, the former default), with the
  bootstrap `auto` picks (exact resampling up to 5e7 prompt draws, the normal
  approximation above: there every method is the expanded percentile one);

and reports each time and its ratio to the expanded interval's.

    python bench/perf/bench_intervals.py                      # Np = 1e3 .. 1e6
    python bench/perf/bench_intervals.py --prompts 1000 10000

Writes bench/results/interval_bench.json (replaced on each run) and prints it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
from pathlib import Path

import numpy as np
import polars as pl

from bench_variance import best_of  # the same timing rule as the variance bench

from mrt_fast import variance_budget

RESULTS = Path(__file__).resolve().parent.parent / "results" / "interval_bench.json"


def frame(n_prompts: int, k: int, seed: int) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    ids = np.repeat(np.arange(n_prompts, dtype=np.int64), k)
    x = rng.normal(0.0, math.sqrt(0.05), n_prompts)[ids] + rng.normal(0.0, math.sqrt(0.2), len(ids))
    return pl.DataFrame({"prompt_id": ids, "loss": x})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, nargs="+", default=[1000, 10000, 50000, 1000000])
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--methods", nargs="+", default=["studentized", "expanded"])
    args = ap.parse_args()
    rows = []
    for n in args.prompts:
        df = frame(n, args.k, 0)
        t0, _ = best_of(lambda: variance_budget(df, n_boot=0), args.repeat)
        row = {"n_prompts": n, "k": args.k, "n_boot": args.n_boot, "estimates_s": t0}
        for m in args.methods:
            t, rep = best_of(lambda: variance_budget(df, n_boot=args.n_boot, interval=m), args.repeat)
            row[f"{m}_s"] = t
            row[f"{m}_used"] = f"{rep.interval} ({rep.bootstrap})"
        for m in args.methods:
            row[f"{m}_over_expanded"] = row[f"{m}_s"] / row["expanded_s"] if "expanded_s" in row else None
        rows.append(row)
        print(json.dumps(row))
    out = {"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
           "threads": os.environ.get("OMP_NUM_THREADS"), "rows": rows}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
