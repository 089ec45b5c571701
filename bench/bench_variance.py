"""Throughput of the streaming variance accumulator.

One streaming pass over N (prompt key, loss) rows fed from NumPy in chunks,
compared with
  * the floor: one plain pass that only reads the same chunks (np.sum of both arrays),
  * polars group_by/agg computing the same per-prompt statistics on the whole table.

    python bench/bench_variance.py --rows 10_000_000 --k 16 --layout grouped
    python bench/bench_variance.py --rows 10_000_000 --layout shuffled
    python bench/bench_variance.py --rows 1e8 --source arrow   # pyarrow chunks, public API
    python bench/bench_variance.py --rows 1e8 --budget         # variance_budget end to end
    python bench/bench_variance.py --rows 1e8 --layout sorted  # integer ids in increasing order

Layouts: `grouped` (a prompt's rows together, prompts in no order: well-mixed
64-bit keys), `shuffled` (rows in random order), `sorted` (int64 prompt ids
0, 0, ..., 1, 1, ...: the rows of a generated data set in prompt order; the
accumulator keeps such a stream as a log, without a hash index).

`--source numpy` (default) feeds NumPy chunks to the core accumulator;
`--source arrow` feeds pyarrow arrays to `mrt_fast.VarianceAccumulator.update`
(`hashed=True` for the 64-bit keys, so they go in as they are; integer ids
for `sorted`), which is what a user's Arrow/Parquet batches cost, validation
and conversion included.

Prints one JSON line of results.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time

# idle BLAS worker threads would otherwise add spinning time to the CPU clock
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import polars as pl  # noqa: E402

import mrt_fast  # noqa: E402
from mrt_fast import _grades_core as core  # noqa: E402


def mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: well-mixed u64 keys, as mrt_fast's id hashing gives."""
    z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def make(rows: int, k: int, layout: str, seed: int):
    rng = np.random.default_rng(seed)
    n_prompts = max(1, rows // k)
    idx = np.arange(rows, dtype=np.int64) // k
    if layout == "shuffled":
        rng.shuffle(idx)
    keys = idx % n_prompts if layout == "sorted" else mix(idx % n_prompts)
    mu = rng.normal(size=n_prompts)
    losses = mu[idx % n_prompts] + rng.normal(scale=2.0, size=rows)
    return keys, losses, n_prompts


CPU = {}


def best_of(f, repeat):
    """Best wall time over `repeat` runs; the process CPU time of that run is kept in CPU[f]."""
    best = (math.inf, math.inf)
    for _ in range(repeat):
        t, c = time.perf_counter(), time.process_time()
        out = f()
        best = min(best, (time.perf_counter() - t, time.process_time() - c))
    CPU[f.__name__] = best[1]
    return best[0], out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=float, default=1e8)
    ap.add_argument("--k", type=int, default=16, help="responses per prompt")
    ap.add_argument("--chunk", type=int, default=1 << 20, help="rows per update call")
    ap.add_argument("--layout", choices=["grouped", "shuffled", "sorted"], default="grouped")
    ap.add_argument("--source", choices=["numpy", "arrow"], default="numpy")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-polars", action="store_true")
    ap.add_argument(
        "--reserve", action="store_true", help="size the accumulator for the number of prompts up front (expected_prompts)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--budget",
        action="store_true",
        help="time mrt_fast.variance_budget end to end instead (a polars table with integer ids, default bootstrap)",
    )
    a = ap.parse_args()
    rows = int(a.rows)
    if a.budget:
        return budget(a, rows)
    keys, losses, n_prompts = make(rows, a.k, a.layout, a.seed)
    chunks = [(keys[s : s + a.chunk], losses[s : s + a.chunk]) for s in range(0, rows, a.chunk)]

    def floor():
        t = 0.0
        for kc, xc in chunks:
            t += float(np.sum(xc)) + float(np.sum(kc))
        return t

    if a.source == "arrow":
        import pyarrow as pa

        batches = [(pa.array(kc), pa.array(xc)) for kc, xc in chunks]

        hashed = keys.dtype == np.uint64

        def stream():
            acc = mrt_fast.VarianceAccumulator(expected_prompts=n_prompts if a.reserve else 0)
            for kc, xc in batches:
                acc.update(kc, xc, hashed=hashed)
            return acc._core

    else:

        def stream():
            acc = core.VarianceAccumulator(n_prompts if a.reserve else 0)
            up = acc.update if keys.dtype == np.uint64 else acc.update_int_ids
            for kc, xc in chunks:
                up(kc, xc)
            return acc

    t_floor, _ = best_of(floor, a.repeat)
    t_acc, acc = best_of(stream, a.repeat)
    t_sum, summ = best_of(acc.summary, 1)
    res = {
        "rows": rows,
        "k": a.k,
        "prompts": n_prompts,
        "layout": a.layout,
        "source": a.source,
        "chunk": a.chunk,
        "reserved": a.reserve,
        "read_floor_s": round(t_floor, 4),
        "accumulate_s": round(t_acc, 4),
        "rows_per_s": round(rows / t_acc),
        "ratio_to_read_floor": round(t_acc / t_floor, 2),
        "read_floor_cpu_s": round(CPU["floor"], 4),
        "accumulate_cpu_s": round(CPU["stream"], 4),
        "summary_s": round(t_sum, 4),
        "accumulate_and_summary_s": round(t_acc + t_sum, 4),
        "indexed": getattr(acc, "is_indexed", True),
        "v_x": summ["v_x"],
        "v_y_given_x": summ["v_y_given_x"],
    }
    if not a.no_polars:
        df = pl.DataFrame({"k": keys, "x": losses})

        def polars_stats():
            g = df.group_by("k").agg(
                pl.len().alias("n"), pl.col("x").mean().alias("mean"), pl.col("x").var(ddof=1).alias("s2")
            )
            u = g.filter(pl.col("n") >= 2)
            return u.select(
                pl.col("s2").mean().alias("v_y"),
                (pl.col("mean").var(ddof=1) - (pl.col("s2") / pl.col("n")).mean()).alias("v_x_raw"),
            )

        t_pl, st = best_of(polars_stats, a.repeat)
        res["polars_groupby_s"] = round(t_pl, 4)
        res["speedup_vs_polars"] = round(t_pl / t_acc, 2)
        res["polars_groupby_cpu_s"] = round(CPU["polars_stats"], 4)
        assert abs(st["v_y"][0] - summ["v_y_given_x"]) <= 1e-8 * abs(summ["v_y_given_x"])
        assert abs(st["v_x_raw"][0] - summ["v_x_raw"]) <= 1e-6 * (1 + abs(summ["v_x_raw"]))
    res["machine"] = f"{platform.machine()} {os.cpu_count()} logical cpus, {platform.python_implementation()} {platform.python_version()}"
    res["polars_threads"] = pl.thread_pool_size()
    print(json.dumps(res))


def budget(a, rows: int) -> None:
    """`variance_budget` on a polars table (integer prompt ids, grouped or
    shuffled), with n_boot=0 and n_boot=1000, next to the read floor."""
    rng = np.random.default_rng(a.seed)
    n_prompts = max(1, rows // a.k)
    ids = np.arange(rows, dtype=np.int64) // a.k
    if a.layout == "shuffled":
        rng.shuffle(ids)
    losses = rng.normal(size=n_prompts)[ids] + rng.normal(scale=2.0, size=rows)
    df = pl.DataFrame({"prompt_id": ids, "loss": losses})
    del ids, losses

    def floor():
        return float(df["loss"].to_numpy().sum()) + float(df["prompt_id"].to_numpy().sum())

    res = {"mode": "variance_budget", "rows": rows, "k": a.k, "prompts": n_prompts, "layout": a.layout}
    res["read_floor_s"] = round(best_of(floor, a.repeat)[0], 4)
    for n_boot in (0, 1000):

        def call(n_boot=n_boot):
            return mrt_fast.variance_budget(df, cost_prompt=4.0, cost_response=1.0, n_boot=n_boot)

        t, rep = best_of(call, a.repeat)
        res[f"n_boot_{n_boot}_s"] = round(t, 4)
        res[f"n_boot_{n_boot}_bootstrap"] = rep.bootstrap
    res["machine"] = f"{platform.machine()} {os.cpu_count()} logical cpus, {platform.python_implementation()} {platform.python_version()}"
    print(json.dumps(res))


if __name__ == "__main__":
    main()
