"""`mrt select` on one dataset under memory limits from the refused minimum up to in-memory.

Builds one dataset as ``bench_scale.py`` does (pools of 8 to 128, rows shuffled over ``--files`` Parquet files,
int64 prompt ids, a float64 reward, ``--dim``-d embeddings of ``--dtype``), asks `mrt select` for the smallest
limit it accepts (its refusal names it), then runs in the same run, each in its own process, ``--repeats``
interleaved rounds of:

* `mrt select` (GRADES, K = 4, ``--profile``) under each limit: the minimum, 1.5x it, and ``--limits``;
* the spilling floor of ``bench_scale.py`` (polars reads the files, spills them to Arrow IPC with
  ``sink_ipc``, scans them back and writes as many rows as the selection keeps), which no limit changes;
* with ``--order consecutive`` (every pool's rows together, as generation writes them, which `mrt select`
  reads in place without spilling) also the read+write floor: polars' streaming engine reading the files and
  writing as many rows.

Each limit's median wall and CPU seconds, peak RSS against the limit, buckets, and ratio to the floor (the
median over the rounds of each round's wall over the floor's in the same round) go
to ``bench/results/limits_bench.json``; ``python bench/perf/limits_doc.py`` draws the plot and the table
of ``docs/results/limits.md``.

    python bench/perf/bench_limits.py                          # 10M candidates, 32-d float16
    python bench/perf/bench_limits.py --size 1e6 --out /tmp/l.json
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_batch import FLOORS, compile_package, folder_bytes, measure, package_env, parse_size, warm  # noqa: E402
from bench_scale import FLOOR, make_dataset  # noqa: E402
from one_dataset import dataset_arguments, finish, median_of, select_once, work_area  # noqa: E402


def least_limit(d: Path, env: dict) -> int:
    """The smallest limit `mrt select` accepts for ``d``: what its refusal of a 64 MiB limit names."""
    out = d.parent / "least_out"
    r = subprocess.run([sys.executable, "-m", "mrt_fast.cli", "select", str(d), str(out), "--k", "4",
                        "--memory-limit", "64MiB"], env=env, capture_output=True, text=True)
    shutil.rmtree(out, ignore_errors=True)
    m = re.search(r"use a limit of at least ([\d.]+) (MiB|GiB)", r.stdout + r.stderr)
    if m is None:
        raise RuntimeError(f"no minimum limit in the refusal:\n{(r.stdout + r.stderr)[-2000:]}")
    return int(float(m.group(1)) * (2**20 if m.group(2) == "MiB" else 2**30))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    dataset_arguments(ap, name="limits", out=ROOT / "bench" / "results" / "limits_bench.json", repeats=3)
    ap.add_argument("--pool-sizes", default="8-128", help="smallest-largest pool, e.g. 1000-10000")
    ap.add_argument("--ids", choices=["int", "string"], default="int", help="prompt ids: int64 or strings")
    ap.add_argument("--limits", default="1GB,2GB,4GB,8GB", help="limits beside the minimum and 1.5x it")
    ap.add_argument("--order", choices=["shuffled", "consecutive"], default="shuffled",
                    help="rows shuffled over the files, or every pool's rows together")
    a = ap.parse_args(argv)
    compile_package()
    sys.path.insert(0, str(ROOT / "python"))
    from mrt_fast.datasets.local import parse_memory

    env = package_env()
    size = parse_size(a.size)
    lo, hi = (int(x) for x in a.pool_sizes.split("-"))
    with work_area(a.workdir, ROOT / "bench" / ".limits_data") as work:
        d = work / f"in_{size}_{a.files}_{a.dim}_{a.dtype}_{lo}-{hi}_{a.ids}_{a.order}"
        if not d.exists():
            make_dataset(d, size, a.files, a.dim, a.dtype, pool_sizes=(lo, hi), ids=a.ids, order=a.order)
        warm(d)
        least = least_limit(d, env)
        limits = sorted({least, int(least * 1.5), *(parse_memory(x) for x in a.limits.split(","))})
        print(f"== {size:,} candidates, {folder_bytes(d) / 1e9:.2f} GB; least limit {least / 2**20:.0f} MiB", flush=True)
        runs: dict[int, list] = {lim: [] for lim in limits}
        floors, rw_floors = [], []
        for _ in range(a.repeats):
            for lim in limits:
                r = select_once(d, work / "out", env, a.k, lim)
                runs[lim].append(r)
                print(f"   limit {lim / 2**20:,.0f} MiB: {r['seconds']:.1f} s ({r['cpu_seconds']:.1f} s CPU), peak RSS "
                      f"{r['peak_rss_bytes'] / lim:.2f} of the limit, {r['parts']} bucket(s)", flush=True)
            kept = runs[limits[0]][-1]["kept"]
            spill, fo = work / "floor.ipc", work / "floor.parquet"
            f = measure([sys.executable, "-c", FLOOR, str(d), str(spill), str(fo), str(max(1, round(size / kept)))],
                        env, [spill, fo])
            spill.unlink(missing_ok=True)
            fo.unlink(missing_ok=True)
            floors.append(f)
            print(f"   floor: {f['seconds']:.1f} s ({f['cpu_seconds']:.1f} s CPU)", flush=True)
            if a.order == "consecutive":
                f = measure([sys.executable, "-c", FLOORS["streaming"], str(d), str(fo),
                             str(max(1, round(size / kept)))], env, [fo])
                fo.unlink(missing_ok=True)
                rw_floors.append(f)
                print(f"   read+write floor: {f['seconds']:.1f} s ({f['cpu_seconds']:.1f} s CPU)", flush=True)
        floor = {"seconds": median_of(floors, "seconds"), "cpu_seconds": median_of(floors, "cpu_seconds"),
                 "runs_seconds": [x["seconds"] for x in floors],
                 "peak_rss_bytes": max(x["peak_rss_bytes"] for x in floors)}
        rows = []
        for lim in limits:
            rs = runs[lim]
            s = {"limit_bytes": lim, "seconds": median_of(rs, "seconds"), "cpu_seconds": median_of(rs, "cpu_seconds"),
                 "runs_seconds": [x["seconds"] for x in rs], "peak_rss_bytes": max(x["peak_rss_bytes"] for x in rs),
                 "peak_disk_bytes": max(x["peak_disk_bytes"] for x in rs), "parts": rs[0]["parts"],
                 "layout": rs[0].get("layout", "flat"),
                 "profile": rs[-1]["profile"]}
            # paired: each round's wall over the floor's in the same round, the median of those
            s["ratio_runs"] = [x["seconds"] / f["seconds"] for x, f in zip(rs, floors)]
            s["ratio_to_floor"] = float(statistics.median(s["ratio_runs"]))
            s["peak_rss_over_limit"] = s["peak_rss_bytes"] / lim
            if rw_floors:
                s["ratio_to_read_write_floor"] = float(statistics.median(
                    [x["seconds"] / f["seconds"] for x, f in zip(rs, rw_floors)]))
            rows.append(s)
        doc = {"what": "mrt select (GRADES) on one dataset under memory limits from the refused minimum up, "
                       "against the polars spilling floor, in one run",
               "candidates": size, "files": a.files, "dim": a.dim, "dtype": a.dtype, "k": a.k,
               "pool_sizes": [lo, hi], "ids": a.ids, "order": a.order,
               "input_bytes": folder_bytes(d), "least_limit_bytes": least, "repeats": a.repeats,
               "floor": floor, "results": rows, "date": time.strftime("%Y-%m-%d")}
        if rw_floors:
            doc["read_write_floor"] = {"seconds": median_of(rw_floors, "seconds"),
                                       "cpu_seconds": median_of(rw_floors, "cpu_seconds"),
                                       "runs_seconds": [x["seconds"] for x in rw_floors],
                                       "peak_rss_bytes": max(x["peak_rss_bytes"] for x in rw_floors)}
        finish(a.out, doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
