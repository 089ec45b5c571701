"""Batch selection over datasets: `mrt select` against the I/O floor, in one run.

For each size (candidates), builds a dataset of Parquet files (64-d float32
embeddings, a float64 reward, int64 prompt ids, pools of 8 to 128 candidates,
rows shuffled across the files), then measures, each in its own process
(wall time and peak RSS from ``os.wait4``), after one untimed read of its
files so that every run finds them in the page cache:

* floor: polars reading the same files and writing as many rows as the
  selection keeps, of every column (the output of ``mrt select`` holds every
  column too), two ways, the faster one the floor: into memory
  (``read_parquet(...).gather_every(...).write_parquet(...)``) and streaming
  (``scan_parquet(...).filter(...).sink_parquet(...)``);
* ``mrt select`` (GRADES, K = 4) to a dataset directory with a memory limit
  the input fits in (when the machine has that much memory), and with the
  spill limit (``--memory-limit``, default 2GB) that forces buckets on disk.

Every case and the floor run ``--repeats`` (5) rounds, interleaved; medians
are reported, and each case's ratio to the floor is the median of its rounds'
ratios to the floor of the same round (with their range). Results (ratios to the floor, seconds per million rows, peak RSS against the
limit) go to ``bench/results/batch_bench.json``. The datasets are deleted
afterwards unless ``--keep``.

    python bench/perf/bench_batch.py --sizes 4e6,16e6,40e6   # the documented run (17 GB of data)
    python bench/perf/bench_batch.py --sizes 4e6              # a quick one
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from mrt_fast.datasets import Manifest

ROOT = Path(__file__).resolve().parents[2]


def make_dataset(d: Path, n_rows: int, n_files: int, dim: int = 64, seed: int = 0, block: int = 1_000_000,
                 dtype: str = "float32", candidate_column: bool = True, pool_sizes: tuple[int, int] = (8, 128),
                 ids: str = "int", order: str = "shuffled") -> None:
    """Pools of ``pool_sizes`` (8..128) candidates, blocks of rows shuffled and scattered over n_files files
    (``order="consecutive"``: every pool's rows together, pools in id order, the files consecutive runs of
    rows, as generation writes them):
    prompt ids (int64, or ``ids="string"``: ``prompt-000000000042``), an int32 candidate index
    (``candidate_column``), a float64 reward and ``dim``-d embeddings of ``dtype`` (float32 or float16; the
    same draws either way)."""
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    np_dt, pa_dt = {"float16": (np.float16, pa.float16()), "float32": (np.float32, pa.float32())}[dtype]
    lo, hi = pool_sizes
    ids_kind = ids
    if ids_kind not in ("int", "string"):
        raise ValueError(f"ids must be int or string, got {ids!r}")
    if order not in ("shuffled", "consecutive"):
        raise ValueError(f"order must be shuffled or consecutive, got {order!r}")
    writers: list = [None] * n_files
    made = pid = 0
    while made < n_rows:
        m = min(block, n_rows - made)
        sizes = rng.integers(lo, hi + 1, size=m // lo + 2)
        cs = np.cumsum(sizes)
        n_p = int(np.searchsorted(cs, m)) + 1
        sizes = sizes[:n_p]
        sizes[-1] -= cs[n_p - 1] - m
        sizes = sizes[sizes > 0]
        ids = np.repeat(np.arange(pid, pid + len(sizes), dtype=np.int64), sizes)
        pid += len(sizes)
        cand = (np.arange(m) - np.repeat(np.cumsum(sizes) - sizes, sizes)).astype(np.int32)
        rew = rng.standard_normal(m)
        emb = rng.standard_normal((m, dim), dtype=np.float32).astype(np_dt, copy=False)
        if order == "shuffled":
            perm = rng.permutation(m)
            f = rng.integers(0, n_files, size=m)
            ids, cand, rew, emb, f = ids[perm], cand[perm], rew[perm], emb[perm], f[perm]
        else:
            f = (np.arange(made, made + m, dtype=np.int64) * n_files) // n_rows
        for j in range(n_files):
            s = f == j
            if order == "consecutive" and not s.any():
                continue
            pids = ids[s] if ids_kind == "int" else pa.array(np.char.add("prompt-", np.char.zfill(
                ids[s].astype(str), 12)).astype(object), pa.string())
            cols = {"prompt_id": pids, "cand": cand[s]} if candidate_column else {"prompt_id": pids}
            t = pa.table({**cols, "reward": rew[s],
                          "embedding": pa.FixedSizeListArray.from_arrays(pa.array(emb[s].ravel(), pa_dt), dim)
                          .cast(pa.list_(pa_dt))})
            if writers[j] is None:
                writers[j] = pq.ParquetWriter(d / f"part-{j:03d}.parquet", t.schema, compression="snappy")
            # consecutive rows: row groups of a block's share of a file, as the shuffled rows get them
            writers[j].write_table(t, row_group_size=-(-m // n_files) if order == "consecutive" else None)
        made += m
    for w in writers:
        w.close()


def warm(d: Path) -> float:
    """Read every file of a dataset once, untimed, so that every measured run
    (selection and floor alike) finds it in the page cache; returns seconds."""
    t0 = time.perf_counter()
    for f in sorted(d.glob("*.parquet")):
        with open(f, "rb") as fh:
            while fh.read(1 << 24):
                pass
    return time.perf_counter() - t0


def compile_package() -> None:
    """Byte-compile the package, as installing a wheel does: a run from the source tree with
    ``PYTHONDONTWRITEBYTECODE`` set would otherwise compile every module it imports, every run."""
    import compileall

    compileall.compile_dir(str(ROOT / "python" / "mrt_fast"), quiet=1)


def package_env() -> dict[str, str]:
    """This process's environment with this checkout's package first on ``PYTHONPATH``: what each
    timed command runs under."""
    return {**os.environ, "PYTHONPATH": str(ROOT / "python") + os.pathsep + os.environ.get("PYTHONPATH", "")}


def write_result(out: str | Path, doc: dict) -> None:
    """Write a benchmark's results as indented JSON to ``out`` (its folder made) and say where."""
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}")


def folder_bytes(d: Path) -> int:
    total = 0
    for root, _, files in os.walk(d):
        for f in files:
            try:
                total += os.stat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def high_water(pid: int) -> int:
    """The process's peak resident memory since it started its program (VmHWM, bytes; 0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def measure(cmd: list[str], env: dict, watch: list[Path] | tuple = ()) -> dict:
    """Run a command; wall and CPU seconds, peak RSS, and the most bytes the ``watch`` paths held at once.

    The peak RSS is the program's own high-water mark (VmHWM, polled every 0.2 s): `wait4`'s ru_maxrss also
    counts the memory of the benchmark process the command was started from."""
    peak, hwm = [0], [0]
    done = threading.Event()
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def poll():
        while not done.wait(0.2):
            hwm[0] = max(hwm[0], high_water(p.pid))
            peak[0] = max(peak[0], sum(folder_bytes(w) if w.is_dir() else (w.stat().st_size if w.exists() else 0)
                                       for w in watch))

    th = threading.Thread(target=poll, daemon=True)
    th.start()
    out = p.stdout.read()
    hwm[0] = max(hwm[0], high_water(p.pid))  # the output closed: the program is ending, not yet reaped
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    done.set()
    th.join()
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{cmd} failed:\n{out[-3000:]}")
    return {"seconds": wall, "cpu_seconds": ru.ru_utime + ru.ru_stime, "peak_rss_bytes": hwm[0],
            "peak_disk_bytes": peak[0], "output_tail": out[-2000:]}



#: polars reading the files and writing every stride-th row, two ways; the floor is the faster
FLOORS = {
    "eager": """
import sys, polars as pl, glob
files = sorted(glob.glob(sys.argv[1] + "/*.parquet")); stride = int(sys.argv[3])
pl.read_parquet(files).gather_every(stride).write_parquet(sys.argv[2])
""",
    "streaming": """
import sys, polars as pl, glob
files = sorted(glob.glob(sys.argv[1] + "/*.parquet")); stride = int(sys.argv[3])
(pl.scan_parquet(files, row_index_name="__i").filter(pl.col("__i") % stride == 0).drop("__i")
   .sink_parquet(sys.argv[2]))
""",
}


def parse_size(s: str) -> int:
    units = {"g": 1e9, "m": 1e6, "k": 1e3}
    s = s.strip().lower().rstrip("b")
    if s and s[-1] in units:
        return int(float(s[:-1]) * units[s[-1]])
    return int(float(s))


def available() -> int:
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def machine(**extra) -> dict:
    """The machine a result was measured on (cores, platform, Python, memory), plus ``extra`` fields."""
    return {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "mem_total_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), **extra}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="4e6,16e6", help="candidates per dataset, comma separated (e.g. 4e6,16e6,40e6)")
    ap.add_argument("--files", type=int, default=8, help="files per dataset")
    ap.add_argument("--memory-limit", default="2GB", help="the spill limit (same for every size)")
    ap.add_argument("--fit", default="auto", help="measure the in-memory case too: auto (when it fits the "
                    "machine), yes, no")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--method", default="grades")
    ap.add_argument("--workdir", default=None, help="where datasets go (default: a temp dir under bench/)")
    ap.add_argument("--keep", action="store_true", help="keep the datasets")
    ap.add_argument("--repeats", type=int, default=5, help="rounds of every case and the floor (medians reported)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "batch_bench.json"))
    args = ap.parse_args()
    compile_package()

    env = package_env()
    work = Path(args.workdir) if args.workdir else ROOT / "bench" / ".batch_data"
    work.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(ROOT / "python"))
    from mrt_fast.datasets.local import WORK_FACTOR, parse_memory

    spill_limit = parse_memory(args.memory_limit)
    load0 = os.getloadavg()
    results = []
    try:
        for size in [parse_size(s) for s in args.sizes.split(",")]:
            d = work / f"in_{size}"
            t0 = time.perf_counter()
            if not d.exists():
                make_dataset(d, size, args.files)
            gen = time.perf_counter() - t0
            data_bytes = sum(f.stat().st_size for f in d.glob("*.parquet"))
            mem_bytes = sum(pq.ParquetFile(f).metadata.row_group(i).total_byte_size
                            for f in d.glob("*.parquet") for i in range(pq.ParquetFile(f).metadata.num_row_groups))
            row = {"candidates": size, "files": args.files, "input_bytes": data_bytes, "arrow_bytes": mem_bytes,
                   "generate_seconds": gen, "warm_read_seconds": warm(d)}
            print(f"== {size:,} candidates, {data_bytes / 1e9:.2f} GB on disk", flush=True)
            fit_limit = int(WORK_FACTOR * mem_bytes * 1.1 + 1e9)
            do_fit = args.fit == "yes" or (args.fit == "auto" and fit_limit < 0.5 * available())
            cases = ([("fit", fit_limit)] if do_fit else []) + [("spill", spill_limit)]
            n_kept = None
            per_case: dict[str, list] = {name: [] for name, _ in cases}
            floors = []
            # rounds of every case then the floor: each is measured as often, in the same conditions
            # (a VM hands out memory a process has not touched before slowly at first)
            for _ in range(args.repeats):
                for name, limit in cases:
                    out = work / f"out_{name}_{size}"
                    shutil.rmtree(out, ignore_errors=True)
                    cmd = [sys.executable, "-m", "mrt_fast.cli", "select", str(d), str(out), "--k", str(args.k),
                           "--method", args.method, "--memory-limit", str(limit)]
                    r = measure(cmd, env, [])
                    man = json.loads(Manifest.read(out).to_json())
                    n_kept = sum(man["parts"].values())
                    r.update(limit_bytes=limit, parts=man["n_parts"], kept=n_kept)
                    per_case[name].append(r)
                    shutil.rmtree(out, ignore_errors=True)
                    print(f"   mrt select ({name}, limit {limit / 1e9:.2f} GB): {r['seconds']:.1f} s, "
                          f"peak RSS {r['peak_rss_bytes'] / 1e9:.2f} GB, {man['n_parts']} part(s)", flush=True)
                stride = max(1, round(size / n_kept))
                fo = work / f"floor_{size}.parquet"
                for kind, code in FLOORS.items():
                    f = measure([sys.executable, "-c", code, str(d), str(fo), str(stride)], env, [])
                    floors.append({**f, "kind": kind})
                    fo.unlink(missing_ok=True)
                    print(f"   floor, {kind} (read -> write of {size // stride:,} rows): {f['seconds']:.1f} s", flush=True)
            runs = {}
            for name, rs in per_case.items():  # the median of the rounds; the peak RSS of all
                r = dict(rs[0])
                r["seconds"] = float(np.median([x["seconds"] for x in rs]))
                r["cpu_seconds"] = float(np.median([x["cpu_seconds"] for x in rs]))
                r["peak_rss_bytes"] = max(x["peak_rss_bytes"] for x in rs)
                r["runs_seconds"] = [x["seconds"] for x in rs]
                r["rss_over_limit_bytes"] = r["peak_rss_bytes"] - r["limit_bytes"]
                runs[name] = r
            # the faster way of the two, by its median over the rounds
            by_kind = {k: [f for f in floors if f["kind"] == k] for k in FLOORS}
            medians = {k: float(np.median([f["seconds"] for f in fs])) for k, fs in by_kind.items()}
            kind = min(medians, key=medians.get)
            row["floor_kinds_seconds"] = medians
            row["floor_kind"] = kind
            floors = by_kind[kind]
            floor = medians[kind]
            floor_cpu = float(np.median([f["cpu_seconds"] for f in floors]))
            print(f"   median: floor {floor:.1f} s; " + ", ".join(f"{n} {r['seconds']:.1f} s"
                                                              for n, r in runs.items()), flush=True)
            row["floor_seconds"] = floor
            row["floor_runs"] = [f["seconds"] for f in floors]
            row["floor_cpu_seconds"] = floor_cpu
            row["floor_peak_rss_bytes"] = max(f["peak_rss_bytes"] for f in floors)
            for name, r in runs.items():
                # paired: each round's wall over the floor's wall in the same round
                paired = [a / b["seconds"] for a, b in zip(r["runs_seconds"], floors)]
                r["ratio_runs"] = paired
                r["ratio_to_floor"] = float(np.median(paired))
                r["cpu_ratio_to_floor"] = r["cpu_seconds"] / floor_cpu
                r["seconds_per_million_rows"] = r["seconds"] / size * 1e6
                r.pop("output_tail", None)
            row["runs"] = runs
            results.append(row)
            if not args.keep:
                shutil.rmtree(d, ignore_errors=True)
    finally:
        if not args.keep and not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    base = results[0]["runs"]["spill"]["seconds_per_million_rows"] if results else None
    for row in results:
        row["runs"]["spill"]["per_row_vs_smallest"] = row["runs"]["spill"]["seconds_per_million_rows"] / base
    doc = {
        "what": "mrt select (GRADES) over a dataset vs the polars read+write floor",
        "k": args.k, "method": args.method, "spill_limit_bytes": spill_limit, "repeats": args.repeats,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "load_avg_at_start": load0, "load_avg_at_end": os.getloadavg(),
                    "mem_total_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")},
        "results": results,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1))
    print(f"wrote {args.out}")
    print(f"{'candidates':>12} {'case':>6} {'limit GB':>9} {'s':>7} {'x floor':>8} {'cpu s':>7} {'x floor':>8} "
          f"{'s/M rows':>9} {'RSS GB':>7}")
    for row in results:
        for name, r in row["runs"].items():
            print(f"{row['candidates']:>12,} {name:>6} {r['limit_bytes'] / 1e9:>9.2f} {r['seconds']:>7.1f} "
                  f"{r['ratio_to_floor']:>8.2f} {r['cpu_seconds']:>7.1f} {r['cpu_ratio_to_floor']:>8.2f} "
                  f"{r['seconds_per_million_rows']:>9.2f} {r['peak_rss_bytes'] / 1e9:>7.2f}")
        print(f"{row['candidates']:>12,} {'floor':>6} {'':>9} {row['floor_seconds']:>7.1f} {'':>8} "
              f"{row['floor_cpu_seconds']:>7.1f}")


if __name__ == "__main__":
    main()
