"""The Ray engine against the local engine on one machine, in one run.

Data: the batch benchmark's (``bench_batch.make_dataset``: 64-d float32
embeddings, or ``--dim`` / ``--dtype``, float64 rewards, int64 prompt ids, pools of 8 to 128 candidates,
rows shuffled across ``--files`` Parquet files, or with ``--order consecutive`` every pool's rows
together, as generation writes them, which both engines read in place), at each size of ``--rows``.
Job: GRADES, K = 4, to a dataset directory. Each run is its own process, and
the job's own time is measured inside it, apart from imports and Ray's start:

* ``local``: ``select_dataset`` with the default memory limit (in memory when
  the input fits);
* ``local-spill``: the same with the spill forced, into as many buckets as the
  Ray job's parts (``parts=``): both engines then write and read every row once;
* ``ray-1`` / ``ray-2``: ``ray_engine.select_dataset`` on a local Ray instance
  started with 1 or 2 CPUs (``ray.init(num_cpus=N)``), with Ray Data's
  per-stage wall and CPU times (the read tasks that spill, the bucket tasks);
* ``ray-2-nodes`` (``--nodes``): the same on the multi-node test's layout, a
  cluster of two nodes started as separate processes with ``ray start`` (a head
  and a worker, 1 CPU each: two raylets and two object stores on one machine),
  the job's driver joining it by address.

Ratios: a Ray job's time over ``local-spill``'s, and its rows/s per worker
over the local engine's rows/s per core (targets: <= 1.5 and >= 2/3).

A second, small case compares the coarse-bucket shuffle with Ray Data's
per-prompt ``groupby(prompt_id).map_groups`` on the same rows (same output).

Results: ``bench/results/ray_bench.json``.

    python bench/perf/bench_ray.py                       # 4M and 16M candidates
    python bench/perf/bench_ray.py --rows 1e6 --groupby-rows 1e5
    # the scale curve's data (32-d float16) from 1M to 30M, for docs/results/scale.md
    python bench/perf/bench_ray.py --rows 1e6,3e6,10e6,30e6 --dim 32 --dtype float16 --groupby-rows 0 \
        --out bench/results/ray_curve.json
    # the same with every pool's rows together (read in place, no exchange)
    python bench/perf/bench_ray.py --rows 1e6,3e6,10e6,30e6 --dim 32 --dtype float16 --groupby-rows 0 \
        --order consecutive --out bench/results/ray_curve_consecutive.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

from bench_batch import make_dataset, measure, parse_size  # noqa: E402

LOCAL_JOB = r"""
import json, sys, time
from mrt_fast.datasets.local import select_dataset
data, out, parts = sys.argv[1], sys.argv[2], int(sys.argv[3])
t1 = time.perf_counter()
rep = select_dataset(data, out, 4, "grades", parts=parts or None)
t2 = time.perf_counter()
open(sys.argv[-1], "w").write(json.dumps({"job_s": t2 - t1, "parts": rep.n_parts, "spilled": rep.spilled,
                                         "in_place": rep.in_place, "kept": rep.n_kept, "rows": rep.n_input_rows}))
"""

RAY_JOB = r"""
import json, logging, sys, time
t0 = time.perf_counter()
import ray
n, data, out, shuffle, address = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
if address:
    ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
else:
    ray.init(num_cpus=n, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
ctx = ray.data.DataContext.get_current()
ctx.enable_progress_bars = False
ctx.print_on_execution_start = False
from mrt_fast.datasets import ray_engine as D
t1 = time.perf_counter()
rep = D.select_dataset(data, out, 4, "grades", shuffle=shuffle)
t2 = time.perf_counter()
open(sys.argv[-1], "w").write(json.dumps({"ray_init_s": t1 - t0, "job_s": t2 - t1, "parts": rep.n_parts,
                                         "in_place": rep.in_place, "kept": rep.n_kept, "rows": rep.n_input_rows,
                                         "stats": D.last_job_stats()}))
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


def ray_parts(n_rows: int, workers: int) -> int:
    """The Ray job's part count (``ray_engine.select_dataset``'s default)."""
    return max(workers, -(-n_rows // 1_000_000))


class TwoNodes:
    """A head and a worker node, 1 CPU each, started with ``ray start`` as separate processes (the multi-node
    test's layout) and killed, with everything they started, on leaving."""

    def __init__(self, env: dict):
        self.env = {**env, "RAY_AUTH_MODE": "disabled"}
        self.procs: list[subprocess.Popen] = []
        self.dirs: list[str] = []

    def _node(self, args: list[str]) -> None:
        d = tempfile.mkdtemp(prefix="rn")
        self.dirs.append(d)
        self.procs.append(subprocess.Popen(
            [shutil.which("ray") or "ray", "start", "--block", "--node-ip-address=127.0.0.1", f"--temp-dir={d}",
             "--disable-usage-stats", "--num-cpus=1", *args], env=self.env, start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    def _wait(self, cpus: int, timeout: float = 180) -> None:
        code = ("import ray, sys, time\nray.init(address=sys.argv[1], log_to_driver=False)\n"
                "while ray.cluster_resources().get('CPU', 0) < int(sys.argv[2]):\n    time.sleep(0.2)\n")
        t = time.time()
        while time.time() - t < timeout:
            r = subprocess.run([sys.executable, "-c", code, self.address, str(cpus)], env=self.env,
                               capture_output=True, timeout=timeout)
            if r.returncode == 0:
                return
            time.sleep(1)  # the head is not listening yet
        raise RuntimeError(f"the Ray cluster at {self.address} did not reach {cpus} CPUs")

    def __enter__(self) -> "TwoNodes":
        with socket.socket() as sk:
            sk.bind(("127.0.0.1", 0))
            port = sk.getsockname()[1]
        self.address = f"127.0.0.1:{port}"
        self._node(["--head", f"--port={port}", "--include-dashboard=false"])
        self._wait(1)
        self._node([f"--address={self.address}"])
        self._wait(2)
        return self

    def __exit__(self, *exc) -> None:
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=30)
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)


def one_size(n_rows: int, data: Path, work: Path, workers: list[int], shuffle: str, env: dict,
             nodes: str = "") -> list[dict]:
    """Every engine on one dataset: one record per run."""
    import polars as pl

    runs: list[dict] = []
    cpus = os.cpu_count() or 1
    local_kept = None
    spill = None
    for name, parts in (("local", 0), ("local-spill", ray_parts(n_rows, max([*workers, 2 if nodes else 1])))):
        out = work / f"out-{name}"
        r = run_python(LOCAL_JOB, [str(data), str(out), str(parts)], env)
        kept = pl.read_parquet(sorted(out.glob("part-*.parquet"))).sort(["prompt_id", "pick_rank"])
        local_kept = kept if local_kept is None else local_kept
        rec = {"rows": n_rows, "engine": name, "workers": cpus, "parts": r["parts"], "job_s": r["job_s"],
               "in_place": r["in_place"], "process_s": r["process_s"], "rows_per_s_per_worker": n_rows / r["job_s"] / cpus,
               "same_kept_rows": bool(kept.equals(local_kept)), "driver_peak_rss_bytes": r["driver_peak_rss_bytes"]}
        if name == "local-spill":
            spill = rec
        runs.append(rec)
        print(json.dumps(rec), flush=True)
        shutil.rmtree(out)
    configs = [(f"ray-{n}", n, "") for n in workers] + ([("ray-2-nodes", 2, nodes)] if nodes else [])
    for name, n, address in configs:
        out = work / f"out-{name}"
        r = run_python(RAY_JOB, [str(n), str(data), str(out), shuffle, address], env)
        got = pl.read_parquet(sorted(out.glob("part-*.parquet"))).sort(["prompt_id", "pick_rank"])
        rec = {"rows": n_rows, "engine": name, "workers": n, "parts": r["parts"], "job_s": r["job_s"],
               "in_place": r["in_place"], "ray_start_s": r["ray_init_s"], "process_s": r["process_s"],
               "job_vs_local_spill": r["job_s"] / spill["job_s"],
               "rows_per_s_per_worker": n_rows / r["job_s"] / n,
               "per_worker_vs_local_per_core": (n_rows / r["job_s"] / n) / spill["rows_per_s_per_worker"],
               "same_kept_rows": bool(got.select(local_kept.columns).equals(local_kept)),
               "driver_peak_rss_bytes": r["driver_peak_rss_bytes"], "stages": stages(r.pop("stats"))}
        runs.append(rec)
        print(json.dumps({k: v for k, v in rec.items() if k != "stages"}), flush=True)
        shutil.rmtree(out)
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="4e6,16e6", help="candidates per dataset, comma separated")
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--dim", type=int, default=64, help="embedding dimensions")
    ap.add_argument("--dtype", choices=["float32", "float16"], default="float32", help="embedding values")
    ap.add_argument("--data", default=None, help="reuse (or create) the datasets under this directory")
    ap.add_argument("--workers", default="1,2", help="Ray CPUs per configuration (0: none)")
    ap.add_argument("--nodes", action="store_true", help="also run on two nodes started with `ray start` "
                    "(the multi-node test's layout, 1 CPU each)")
    ap.add_argument("--shuffle", default="files", help="how rows reach their bucket: files (the default: the "
                    "read tasks spill into bucket files), or Ray Data's sort, hash or v2 shuffle")
    ap.add_argument("--order", choices=["shuffled", "consecutive"], default="shuffled",
                    help="rows shuffled over the files, or every pool's rows together (as generation writes them: "
                    "both engines read them in place)")
    ap.add_argument("--groupby-rows", default="2e5", help="rows of the coarse-bucket vs per-prompt groupby case (0: skip)")
    ap.add_argument("--out", default=str(HERE.parent / "results" / "ray_bench.json"))
    args = ap.parse_args()
    sizes = [parse_size(x) for x in args.rows.split(",")]
    workers = [int(x) for x in args.workers.split(",") if int(x) > 0]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python") + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1", "RAY_DATA_DISABLE_PROGRESS_BARS": "1"}
    work = Path(tempfile.mkdtemp(prefix="mrt-ray-bench-"))
    res: dict = {"method": "grades", "k": 4, "files": args.files, "dim": args.dim, "dtype": args.dtype,
                 "order": args.order, "machine": {
        "cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "load_average_before": os.getloadavg()[0], "runs": []}
    try:
        for n_rows in sizes:
            tag = f"rows-{n_rows}" + ("-consecutive" if args.order == "consecutive" else "")
            data = (Path(args.data) / tag) if args.data else work / f"data-{n_rows}"
            if not (data.exists() and any(data.glob("*.parquet"))):
                t = time.perf_counter()
                make_dataset(data, n_rows, args.files, args.dim, dtype=args.dtype, order=args.order)
                print(f"built {n_rows:,} rows in {time.perf_counter() - t:.1f} s", flush=True)
            if args.nodes:
                with TwoNodes(env) as cluster:
                    res["runs"] += one_size(n_rows, data, work, workers, args.shuffle, env, cluster.address)
            else:
                res["runs"] += one_size(n_rows, data, work, workers, args.shuffle, env)
            if not args.data:
                shutil.rmtree(data, ignore_errors=True)
        if parse_size(args.groupby_rows) > 0:
            g = run_python(GROUPBY, [str(parse_size(args.groupby_rows)), "2"], env)
            g["groupby_vs_buckets"] = g["groupby_map_groups_s"] / g["coarse_buckets_s"]
            res["groupby_case"] = g
            print("groupby", json.dumps(g), flush=True)
        res["load_average_after"] = os.getloadavg()[0]
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
        print(f"wrote {args.out}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
