"""The Ray engine against the local engine on one machine, in one run.

Data: the batch benchmark's (``bench_batch.make_dataset``: 64-d float32
embeddings, float64 rewards, int64 prompt ids, pools of 8 to 128 candidates,
rows shuffled across ``--files`` Parquet files). Job: GRADES, K = 4, to a
dataset directory. Each configuration runs in its own process:

* ``local``: ``mrt select DATA OUT --k 4`` (the local engine, default memory limit);
* ``ray-1`` / ``ray-2``: ``distributed.select_dataset`` on a local Ray
  instance started with 1 or 2 CPUs (``ray.init(num_cpus=N)``): the time to
  start Ray and the job's own time are reported apart, with Ray Data's
  per-stage wall times (read + tag, the shuffle by bucket, the bucket tasks).

A second, small case compares the coarse-bucket shuffle with Ray Data's
per-prompt ``groupby(prompt_id).map_groups`` on the same rows (same output).

Results: ``bench/results/ray_bench.json`` (ratios to the local engine,
rows/s per worker, stages).

    python bench/bench_ray.py                      # 4M candidates
    python bench/bench_ray.py --rows 1e6 --groupby-rows 1e5
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from bench_batch import make_dataset, measure, parse_size  # noqa: E402

RAY_JOB = r"""
import json, logging, sys, time
t0 = time.perf_counter()
import ray
n, data, out, shuffle = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
ray.init(num_cpus=n, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
ctx = ray.data.DataContext.get_current()
ctx.enable_progress_bars = False
ctx.print_on_execution_start = False
from mrt_fast.datasets import ray_engine as D
t1 = time.perf_counter()
rep = D.select_dataset(data, out, 4, "grades", shuffle=shuffle)
t2 = time.perf_counter()
open(sys.argv[-1], "w").write(json.dumps({"ray_init_s": t1 - t0, "job_s": t2 - t1, "parts": rep.n_parts,
                                         "kept": rep.n_kept, "rows": rep.n_input_rows, "stats": D.last_job_stats()}))
"""

GROUPBY = r"""
import json, logging, sys, time, warnings
import numpy as np, polars as pl, pyarrow as pa, ray
n_rows, n = int(sys.argv[1]), int(sys.argv[2])
ray.init(num_cpus=n, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
ctx = ray.data.DataContext.get_current()
ctx.enable_progress_bars = False
ctx.print_on_execution_start = False
import mrt_fast
from mrt_fast.datasets import ray_engine as D
rng = np.random.default_rng(0)
sizes = rng.integers(8, 129, size=n_rows // 8)
sizes = sizes[: int(np.searchsorted(np.cumsum(sizes), n_rows))]
m = int(sizes.sum())
df = pl.DataFrame({"prompt_id": np.repeat(np.arange(len(sizes)), sizes), "reward": rng.standard_normal(m),
                   "embedding": rng.standard_normal((m, 64), dtype=np.float32)}).sample(fraction=1.0, shuffle=True, seed=1)
blocks = 8

def run(f):
    t = time.perf_counter()
    out = D.collect(f())
    return time.perf_counter() - t, out

def per_prompt(g: pa.Table) -> pa.Table:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return mrt_fast.select(pl.from_arrow(g).drop("__order").sort("__i"), 4, "grades").drop("__i").to_arrow()

def groupby_job():
    ds = ray.data.from_arrow(df.with_row_index("__i").to_arrow(), override_num_blocks=blocks)
    from ray.data.expressions import monotonically_increasing_id
    ds = ds.with_column("__order", monotonically_increasing_id())
    ds.context.shuffle_strategy = "sort_shuffle_pull_based"
    return ds.groupby("prompt_id").map_groups(per_prompt, batch_format="pyarrow")

bucket_job = lambda: D.select(ray.data.from_arrow(df.to_arrow(), override_num_blocks=blocks), 4, "grades")
run(bucket_job)  # warm the workers
tb, ob = run(bucket_job)
tg, og = run(groupby_job)
same = ob.sort(["prompt_id", "pick_rank"]).equals(og.select(ob.columns).sort(["prompt_id", "pick_rank"]))
open(sys.argv[-1], "w").write(json.dumps({"rows": m, "pools": len(sizes), "blocks": blocks, "coarse_buckets_s": tb,
                                         "groupby_map_groups_s": tg, "same_output": bool(same)}))
"""


def _secs(v: str, unit: str) -> float:
    return float(v) / {"us": 1e6, "ms": 1e3, "s": 1.0}[unit]


def stages(stats: str | None) -> list[dict]:
    """Per operator of Ray Data's stats text: its wall time, and the summed
    wall and CPU time of its tasks (wall >> CPU: tasks waiting for a core or
    for I/O)."""
    out: list[dict] = []
    for line in (stats or "").splitlines():
        m = re.match(r"^Operator \d+ (.+?): .*?(?:executed|produced) in ([0-9.]+)(us|ms|s)$", line)
        if m:
            out.append({"operator": m.group(1), "wall_s": round(_secs(m.group(2), m.group(3)), 3)})
            continue
        m = re.match(r"^\s*\* Remote (wall|cpu) time: .*, ([0-9.]+)(us|ms|s) total$", line)
        if m and out and f"task_{m.group(1)}_s" not in out[-1]:
            out[-1][f"task_{m.group(1)}_s"] = round(_secs(m.group(2), m.group(3)), 3)
    return out


def run_python(code: str, args: list[str], env: dict) -> dict:
    """Run `code` in its own process; its result is the JSON it writes to the file named last."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    try:
        r = measure([sys.executable, "-c", code, *args, path], env)
        # the driver's peak memory only (Ray's workers are other processes)
        return {**json.loads(Path(path).read_text()), "process_s": r["seconds"],
                "driver_peak_rss_bytes": r["peak_rss_bytes"]}
    finally:
        os.unlink(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="4e6", help="candidates in the dataset")
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--data", default=None, help="reuse (or create) the dataset in this directory")
    ap.add_argument("--workers", default="1,2", help="Ray CPUs per configuration")
    ap.add_argument("--shuffle", default="files", help="how rows reach their bucket: files (the default: Arrow IPC "
                    "pieces), or Ray Data's sort, hash or v2 shuffle")
    ap.add_argument("--groupby-rows", default="2e5", help="rows of the coarse-bucket vs per-prompt groupby case (0: skip)")
    ap.add_argument("--out", default=str(HERE / "results" / "ray_bench.json"))
    args = ap.parse_args()
    n_rows = parse_size(args.rows)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python") + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1", "RAY_DATA_DISABLE_PROGRESS_BARS": "1"}
    work = Path(tempfile.mkdtemp(prefix="mrt-ray-bench-"))
    data = Path(args.data) if args.data else work / "data"
    try:
        if not (data.exists() and any(data.glob("*.parquet"))):
            t = time.perf_counter()
            make_dataset(data, n_rows, args.files)
            print(f"built {n_rows:,} rows in {time.perf_counter() - t:.1f} s", flush=True)
        res: dict = {"rows": n_rows, "files": args.files, "method": "grades", "k": 4, "machine": {
            "cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
            "load_average_before": os.getloadavg()}
        out = work / "out-local"
        r = measure([sys.executable, "-m", "mrt_fast.cli", "select", str(data), str(out), "--k", "4"], env)
        res["local"] = {"seconds": r["seconds"], "peak_rss_bytes": r["peak_rss_bytes"]}
        print("local", json.dumps(res["local"]), flush=True)
        local_parts = sorted(out.glob("part-*.parquet"))
        import polars as pl

        local_kept = pl.read_parquet(local_parts).sort(["prompt_id", "pick_rank"])
        shutil.rmtree(out)
        for n in [int(x) for x in args.workers.split(",")]:
            out = work / f"out-ray{n}"
            r = run_python(RAY_JOB, [str(n), str(data), str(out), args.shuffle], env)
            got = pl.read_parquet(sorted(out.glob("part-*.parquet"))).sort(["prompt_id", "pick_rank"])
            r["same_kept_rows_as_local"] = bool(got.select(local_kept.columns).equals(local_kept))
            r["stages"] = stages(r.pop("stats"))
            r["job_outside_stages_s"] = r["job_s"] - sum(x["wall_s"] for x in r["stages"])
            r["job_vs_local"] = r["job_s"] / res["local"]["seconds"]
            r["process_vs_local"] = r["process_s"] / res["local"]["seconds"]
            r["rows_per_s_per_worker"] = n_rows / r["job_s"] / n
            res[f"ray-{n}"] = r
            print(f"ray-{n}", json.dumps(r), flush=True)
            shutil.rmtree(out)
        if parse_size(args.groupby_rows) > 0:
            g = run_python(GROUPBY, [str(parse_size(args.groupby_rows)), "2"], env)
            g["groupby_vs_buckets"] = g["groupby_map_groups_s"] / g["coarse_buckets_s"]
            res["groupby_case"] = g
            print("groupby", json.dumps(g), flush=True)
        res["load_average_after"] = os.getloadavg()
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
        print(f"wrote {args.out}")
    finally:
        if not args.data:
            shutil.rmtree(work, ignore_errors=True)
        else:
            shutil.rmtree(work / "out-local", ignore_errors=True)


if __name__ == "__main__":
    main()
