"""How the number of buckets a spilled `mrt select` cuts changes its time and peak memory, under one limit.

Builds one dataset as ``bench_limits.py`` does (pools of 8 to 128, rows shuffled over ``--files`` Parquet
files, int64 prompt ids, a float64 reward, ``--dim``-d embeddings of ``--dtype``), then runs in the same
run, each in its own process, ``--repeats`` interleaved rounds of `mrt select` (GRADES, K = 4) under
``--limit`` with ``--parts`` set to each of ``--parts-list`` (``plan``: the count the job plans itself),
and for a forced count ``--workers`` set to what the job plans on this machine (one more than the cores, at
most 4), fewer where the buckets do not fit that many at once. Records each count's median wall and CPU seconds, peak RSS against the
limit, and the ratio of its time to the planned count's, in ``bench/results/buckets_bench.json``;
``python bench/perf/limits_doc.py`` puts it in ``docs/results/limits.md``.

    python bench/perf/bench_buckets.py                                  # 10M candidates, 32-d float16, 2GB
    python bench/perf/bench_buckets.py --size 2e6 --out /tmp/b.json     # a quick one
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_batch import compile_package, folder_bytes, package_env, parse_size, warm  # noqa: E402
from bench_scale import make_dataset  # noqa: E402
from one_dataset import dataset_arguments, finish, median_of, select_once, work_area  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    dataset_arguments(ap, name="buckets", out=ROOT / "bench" / "results" / "buckets_bench.json", repeats=3)
    ap.add_argument("--limit", default="2GB")
    ap.add_argument("--parts-list", default="plan,3,6,20,40", help="bucket counts; 'plan' is the job's own")
    a = ap.parse_args(argv)
    compile_package()
    sys.path.insert(0, str(ROOT / "python"))
    from mrt_fast.datasets.local import parse_memory

    env = package_env()
    size, limit = parse_size(a.size), parse_memory(a.limit)
    counts = [x.strip() for x in a.parts_list.split(",") if x.strip()]
    cpus = os.cpu_count() or 1
    workers = max(1, min(cpus + (cpus > 1), 4))  # the local executor's own count (plan_buckets)
    with work_area(a.workdir, ROOT / "bench" / ".buckets_data") as work:
        d = work / f"in_{size}_{a.files}_{a.dim}_{a.dtype}"
        if not d.exists():
            make_dataset(d, size, a.files, a.dim, a.dtype)
        warm(d)
        print(f"== {size:,} candidates, {folder_bytes(d) / 1e9:.2f} GB, limit {a.limit}", flush=True)
        runs: dict[str, list] = {c: [] for c in counts}
        for _ in range(a.repeats):
            for c in counts:
                r = select_once(d, work / "out", env, a.k, limit,
                                ["--parts", c, "--workers", str(workers)] if c != "plan" else [])
                runs[c].append(r)
                print(f"   {c} -> {r['parts']} bucket(s): {r['seconds']:.1f} s ({r['cpu_seconds']:.1f} s CPU), "
                      f"peak RSS {r['peak_rss_bytes'] / limit:.2f} of the limit", flush=True)
        planned = median_of(runs["plan"], "seconds") if "plan" in runs else None
        rows = []
        for c in counts:
            rs = runs[c]
            s = {"asked": c, "parts": rs[0]["parts"], "seconds": median_of(rs, "seconds"),
                 "cpu_seconds": median_of(rs, "cpu_seconds"), "runs_seconds": [x["seconds"] for x in rs],
                 "peak_rss_bytes": max(x["peak_rss_bytes"] for x in rs), "profile": rs[-1]["profile"]}
            s["peak_rss_over_limit"] = s["peak_rss_bytes"] / limit
            # each round's pair against the planned count's run of the same round, then their median
            if planned is not None:
                s["ratio_to_planned"] = float(np.median([x["seconds"] / p["seconds"]
                                                         for x, p in zip(rs, runs["plan"])]))
            rows.append(s)
        doc = {"what": "mrt select (GRADES) under one memory limit with the spill cut into several bucket counts, "
                       "in one run",
               "candidates": size, "files": a.files, "dim": a.dim, "dtype": a.dtype, "k": a.k,
               "limit_bytes": limit, "input_bytes": folder_bytes(d), "repeats": a.repeats, "forced_workers": workers,
               "results": rows, "date": time.strftime("%Y-%m-%d")}
        finish(a.out, doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
