"""End-to-end `variance_budget` against polars' group-by on the same frame.

For each layout of N (prompt id, loss) rows in a polars frame (int64 ids,
K responses per prompt):

* `shuffled`: rows in random order;
* `grouped`: a prompt's rows together, prompts in random order;
* `sorted`: ids in increasing order (a generated data set in prompt order);

it times, best of `--repeat`, in one process:

* `mrt_fast.variance_budget(df)` with the default bootstrap and with
  `n_boot=0` (validation, keying, accumulation, summary, report);
* polars `df.group_by("prompt_id").agg(len, mean, var)`: the per-prompt
  statistics alone, which is where a polars implementation would start;

and reports the ratios polars / mrt_fast (above 1: mrt_fast is faster).
The estimates of the two are checked to agree.

    python bench/perf/bench_variance.py                 # 1e7 rows, all layouts
    python bench/perf/bench_variance.py --rows 1e6 --layouts shuffled

Writes one JSON line per layout to bench/results/variance_bench.jsonl
(replaced on each run) and prints them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from pathlib import Path

import numpy as np
import polars as pl

import mrt_fast

RESULTS = Path(__file__).resolve().parent.parent / "results" / "variance_bench.jsonl"


def frame(rows: int, k: int, layout: str, seed: int) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    n_prompts = max(1, rows // k)
    prompt = np.arange(rows, dtype=np.int64) // k
    if layout == "shuffled":
        rng.shuffle(prompt)
    elif layout == "grouped":
        prompt = rng.permutation(n_prompts)[prompt]
    losses = rng.normal(size=n_prompts)[prompt] + rng.normal(scale=2.0, size=rows)
    return pl.DataFrame({"prompt_id": prompt, "loss": losses})


def best_of(f, repeat: int):
    best, out = math.inf, None
    for _ in range(repeat):
        t = time.perf_counter()
        out = f()
        best = min(best, time.perf_counter() - t)
    return best, out


def run(rows: int, k: int, layout: str, repeat: int, seed: int) -> dict:
    df = frame(rows, k, layout, seed)

    def polars_stats():
        return df.group_by("prompt_id").agg(
            pl.len().alias("n"), pl.col("loss").mean().alias("mean"), pl.col("loss").var(ddof=1).alias("s2")
        )

    t_pl, g = best_of(polars_stats, repeat)
    t_0, rep0 = best_of(lambda: mrt_fast.variance_budget(df, n_boot=0), repeat)
    t_b, rep = best_of(lambda: mrt_fast.variance_budget(df), repeat)
    u = g.filter(pl.col("n") >= 2)
    v_y = float(u["s2"].mean())
    v_x_raw = float(u["mean"].var(ddof=1) - (u["s2"] / u["n"]).mean())
    assert abs(v_y - rep.v_y_given_x) <= 1e-9 * abs(v_y), (v_y, rep.v_y_given_x)
    assert abs(v_x_raw - rep.v_x_raw) <= 1e-7 * (1 + abs(v_x_raw)), (v_x_raw, rep.v_x_raw)
    assert rep0.v_x == rep.v_x
    return {
        "rows": rows,
        "k": k,
        "prompts": int(rep.n_prompts),
        "layout": layout,
        "polars_group_by_s": round(t_pl, 4),
        "variance_budget_s": round(t_b, 4),
        "variance_budget_bootstrap": rep.bootstrap,
        "variance_budget_n_boot_0_s": round(t_0, 4),
        "speedup_vs_polars": round(t_pl / t_b, 2),
        "speedup_vs_polars_n_boot_0": round(t_pl / t_0, 2),
        "v_x": rep.v_x,
        "v_y_given_x": rep.v_y_given_x,
        "repeat": repeat,
        "machine": f"{platform.machine()}, {os.cpu_count()} logical cpus, "
        f"{platform.python_implementation()} {platform.python_version()}",
        "threads": {"polars": pl.thread_pool_size(), "mrt_fast": int(os.environ.get("RAYON_NUM_THREADS") or os.cpu_count())},
        "versions": {"polars": pl.__version__, "numpy": np.__version__},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=float, default=1e7)
    ap.add_argument("--k", type=int, default=16, help="responses per prompt")
    ap.add_argument("--layouts", nargs="+", choices=["shuffled", "grouped", "sorted"], default=["shuffled", "grouped", "sorted"])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=RESULTS, help="JSON lines written here (replaced)")
    a = ap.parse_args()
    lines = [run(int(a.rows), a.k, layout, a.repeat, a.seed) for layout in a.layouts]
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text("".join(json.dumps(r) + "\n" for r in lines))
    for r in lines:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
