"""One huge pool through `mrt select`: on demand under a small limit, against the dense path and apricot.

Each dataset is one prompt's pool of ``n`` candidates (a Gaussian mixture of ``n / --per-cluster`` centres,
``--dim``-d float32 embeddings, a float64 reward) in one Parquet file. For every size, in the same run, each
in its own process, ``--repeats`` interleaved rounds (``--big-repeats`` for a pool only the on-demand path runs) of:

* `mrt select --method diverse --k K --memory-limit 512MB`: the pool's n x n matrix does not fit, so the
  similarity columns are computed on demand; the plain-line progress (``MRT_PROGRESS_INTERVAL``) is kept,
  so the record shows whether the picks were reported while the rows stood still;
* `mrt select` with ``--dense-limit`` (default 8GB): the dense path, where its matrix fits;
* apricot's ``FacilityLocationSelection`` (lazy greedy) on the same clipped-cosine matrix in float64,
  where it fits: a script that reads the file with polars, builds the matrix with NumPy in blocks, fits
  and writes the kept rows, which is what a user writes by hand today. Its time leaves out its
  start: importing apricot (which loads torch) and numba's compilation of its loops on a first small
  fit, timed apart and recorded. `mrt select`'s times are whole processes, its start included.

The three keep the same set (recorded). Medians, ranges, peak RSS and the ratios go
to ``bench/results/huge_pool_bench.json``; ``benchmarks_doc.py`` puts them in ``docs/results/benchmarks.md``.

    python bench/perf/bench_huge_pool.py                   # 20,000 (all three) and 100,000 (on demand)
    python bench/perf/bench_huge_pool.py --sizes 5000 --repeats 1 --out /tmp/h.json
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_batch import compile_package, measure  # noqa: E402
from one_dataset import finish, work_area  # noqa: E402

#: apricot on the same objective: clipped cosine similarity, float64 (apricot's own dtype), lazy greedy
APRICOT = """
import sys, time, warnings
t0 = time.perf_counter()
warnings.simplefilter("ignore")
import numpy as np, polars as pl
from apricot import FacilityLocationSelection
# apricot's import (it loads torch) and numba's compilation of its loops on a first small fit, timed apart
w = np.random.default_rng(0).random((64, 64)); FacilityLocationSelection(4, metric="precomputed").fit(w @ w.T)
print(f"start_seconds {time.perf_counter() - t0:.4f}", flush=True)
df = pl.read_parquet(sys.argv[1]); k = int(sys.argv[3])
x = np.array(df["embedding"].to_numpy(), dtype=np.float32)
x /= np.linalg.norm(x, axis=1, keepdims=True)
n = len(x); s = np.empty((n, n), dtype=np.float64)
for lo in range(0, n, 2048):
    s[lo:lo + 2048] = np.maximum(x[lo:lo + 2048] @ x.T, 0.0)
np.fill_diagonal(s, 1.0)
sel = FacilityLocationSelection(k, metric="precomputed", optimizer="lazy").fit(s)
df[[int(i) for i in sel.ranking]].write_parquet(sys.argv[2])
"""


def make_pool(path: Path, n: int, dim: int, per_cluster: int, seed: int) -> None:
    """One prompt's pool: n candidates around ``n / per_cluster`` centres, in one Parquet file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    clusters = max(2, n // per_cluster)
    centres = rng.standard_normal((clusters, dim), dtype=np.float32)
    x = centres[rng.integers(0, clusters, size=n)] + 0.7 * rng.standard_normal((n, dim), dtype=np.float32)
    emb = pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1), type=pa.float32()), dim)
    t = pa.table({"prompt_id": pa.array(np.zeros(n, dtype=np.int64)), "candidate": pa.array(np.arange(n)),
                  "reward": pa.array(rng.random(n)), "embedding": emb})
    pq.write_table(t, path)


def picks(path: Path) -> list[int]:
    """The kept candidates, in the order they were kept."""
    import pyarrow.parquet as pq

    files = sorted(path.glob("*.parquet")) if path.is_dir() else [path]
    return [int(c) for f in files for c in pq.read_table(f, columns=["candidate"])["candidate"].to_pylist()]


def summary(rs: list[dict]) -> dict:
    sec = [r["seconds"] for r in rs]
    extra = {"start_seconds": float(np.median([r["start_seconds"] for r in rs]))} if "start_seconds" in rs[0] else {}
    return {**extra, "seconds": float(np.median(sec)), "runs_seconds": sec, "cpu_seconds": float(np.median(
        [r["cpu_seconds"] for r in rs])), "peak_rss_bytes": max(r["peak_rss_bytes"] for r in rs)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="20000,100000", help="pool sizes (candidates)")
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--per-cluster", type=int, default=200, help="candidates per mixture centre")
    ap.add_argument("--k", type=int, default=50)
    ap.add_argument("--limit", default="512MB", help="the small limit the on-demand run is held to")
    ap.add_argument("--dense-limit", default="8GB", help="the limit the dense run is given")
    ap.add_argument("--dense-up-to", type=int, default=30_000,
                    help="largest pool the dense path and apricot run on (their matrices must fit)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--big-repeats", type=int, default=1, help="rounds of the pools only the on-demand path runs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", default=None, help="where the data go (default bench/.huge_pool_data, removed)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "huge_pool_bench.json"))
    a = ap.parse_args(argv)
    compile_package()
    sys.path.insert(0, str(ROOT / "python"))
    from mrt_fast.datasets.local import parse_memory

    env = {**os.environ, "PYTHONPATH": str(ROOT / "python") + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "MRT_PROGRESS_INTERVAL": "5", "OMP_NUM_THREADS": str(os.cpu_count() or 1)}
    limit, dense_limit = parse_memory(a.limit), parse_memory(a.dense_limit)
    rows = []
    with work_area(a.workdir, ROOT / "bench" / ".huge_pool_data") as work:
        for n in (int(float(s)) for s in a.sizes.split(",")):
            src = work / f"pool_{n}.parquet"
            make_pool(src, n, a.dim, a.per_cluster, a.seed)
            print(f"== one pool of {n:,} x {a.dim}, K = {a.k}", flush=True)
            methods = {"on_demand": ["--memory-limit", str(limit)]}
            if n <= a.dense_up_to:
                methods["dense"] = ["--memory-limit", str(dense_limit)]
                methods["apricot"] = None
            runs: dict[str, list] = {m: [] for m in methods}
            chosen: dict[str, list[int]] = {}
            for _ in range(a.repeats if n <= a.dense_up_to else a.big_repeats):
                for m, extra in methods.items():
                    out = work / "out"
                    shutil.rmtree(out, ignore_errors=True)
                    if extra is None:
                        out = work / "out.parquet"
                        r = measure([sys.executable, "-c", APRICOT, str(src), str(out), str(a.k)], env)
                        r["start_seconds"] = float(r["output_tail"].split("start_seconds ")[1].split()[0])
                        r["seconds"] -= r["start_seconds"]
                    else:
                        r = measure([sys.executable, "-m", "mrt_fast.cli", "select", str(src), str(out), "--k",
                                     str(a.k), "--method", "diverse", "--profile", *extra], env)
                        r["progress_lines"] = sum("picks made" in ln for ln in r["output_tail"].splitlines())
                    chosen[m] = picks(out)
                    runs[m].append(r)
                    if out.is_dir():
                        shutil.rmtree(out)
                    else:
                        out.unlink()
                    print(f"   {m}: {r['seconds']:.1f} s ({r['cpu_seconds']:.1f} s CPU), peak RSS "
                          f"{r['peak_rss_bytes'] / 2**20:,.0f} MiB", flush=True)
            row = {"candidates": n, "dim": a.dim, "k": a.k, "clusters": max(2, n // a.per_cluster),
                   "methods": {m: summary(rs) for m, rs in runs.items()}}
            od = row["methods"]["on_demand"]
            od.update(limit_bytes=limit, peak_rss_over_limit=od["peak_rss_bytes"] / limit,
                      progress_lines=max(r["progress_lines"] for r in runs["on_demand"]),
                      last_output=runs["on_demand"][-1]["output_tail"][-1200:])
            for m in methods:
                if m != "on_demand":
                    row["methods"][m]["on_demand_over_this"] = od["seconds"] / row["methods"][m]["seconds"]
                    row["methods"][m]["same_set_as_on_demand"] = sorted(chosen[m]) == sorted(chosen["on_demand"])
            if "dense" in methods:
                row["methods"]["dense"]["limit_bytes"] = dense_limit
            rows.append(row)
            src.unlink()
        doc = {"what": "one pool through mrt select --method diverse: on demand under a small limit, the dense "
                       "path and apricot (lazy greedy on the same float64 clipped-cosine matrix), in one run",
               "repeats": a.repeats, "big_repeats": a.big_repeats, "results": rows, "date": time.strftime("%Y-%m-%d")}
        finish(a.out, doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
