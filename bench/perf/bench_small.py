"""Small jobs: `mrt select` on 1M candidates of each shape against polars reading and writing them, in one run.

The shapes are ``bench_shapes.py``'s, each differing in one thing from 32-d float16 embeddings, int ids,
pools of 8-128 candidates, rows shuffled over 8 Parquet files: 384-d float32, string ids, pools of
1,000-10,000, 1 file, 100 files, every pool's rows together (as generation writes them), and the batch
benchmark's 64-d float32 with a candidate index column. For each, in its own process (wall time, CPU time
and peak RSS from ``os.wait4``), after one untimed read of the files:

* ``mrt select`` (GRADES, K = 4, the default memory limit: in memory) to a dataset directory, with
  ``--profile``, whose breakdown (the interpreter's start and imports, reading, selecting, writing) goes
  with each round;
* the read+write floor (``bench_batch.FLOORS``): polars reading the files and writing as many rows as the
  selection keeps, into memory and streaming, the faster by its median the floor.

``--repeats`` (5) interleaved rounds; medians; each ratio is the median of each round's ratio to the floor
of the same round, with its range. The selection's own share (the ``select`` step of the profile, the
GRADES work itself, which the floor does not do) is reported beside it. Results:
``bench/results/small_bench.json``, tabled in ``docs/results/benchmarks.md`` by ``benchmarks_doc.py``.

    python bench/perf/bench_small.py                    # 1M candidates a shape
    python bench/perf/bench_small.py --size 2e5 --repeats 2 --out /tmp/s.json
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

from bench_batch import (FLOORS, compile_package, machine, make_dataset, measure, package_env,  # noqa: E402
                         parse_size, warm, write_result)
from bench_scale import profile  # noqa: E402

#: name -> how bench_batch.make_dataset builds it (n_files, dim, dtype and the rest)
BASE = {"n_files": 8, "dim": 32, "dtype": "float16", "candidate_column": False}
SHAPES = {
    "32-d float16, int ids, pools 8-128, 8 files": {},
    "384-d float32": {"dim": 384, "dtype": "float32"},
    "string ids": {"ids": "string"},
    "pools 1,000-10,000": {"pool_sizes": (1000, 10000)},
    "1 file": {"n_files": 1},
    "100 files": {"n_files": 100},
    "pools in consecutive rows": {"order": "consecutive"},
    "64-d float32, candidate column (the batch benchmark's)": {"dim": 64, "dtype": "float32",
                                                               "candidate_column": True},
}


def seconds(text: str) -> float:
    """The first number of seconds in a profile value (``0.238 s wall, 0.414 s CPU``)."""
    m = re.match(r"\s*([\d.]+) s", text)
    return float(m.group(1)) if m else float("nan")


def one_shape(name: str, size: int, repeats: int, work: Path, env: dict) -> dict:
    d = work / "data"
    shutil.rmtree(d, ignore_errors=True)
    t0 = time.perf_counter()
    make_dataset(d, size, **{**BASE, **SHAPES[name]})
    gen = time.perf_counter() - t0
    warm(d)
    jobs, floors = [], []
    stride = None
    for _ in range(repeats):
        out = work / "out"
        shutil.rmtree(out, ignore_errors=True)
        r = measure([sys.executable, "-m", "mrt_fast.cli", "select", str(d), str(out), "--k", "4", "--profile"], env)
        kept = int(re.search(r"wrote (\d+) rows", r["output_tail"]).group(1))
        r["profile"] = {k: seconds(v) for k, v in profile(r.pop("output_tail")).items()}
        jobs.append(r)
        shutil.rmtree(out, ignore_errors=True)
        stride = max(1, round(size / kept))
        fo = work / "floor.parquet"
        for kind, code in FLOORS.items():
            f = measure([sys.executable, "-c", code, str(d), str(fo), str(stride)], env)
            f.pop("output_tail", None)
            floors.append({**f, "kind": kind})
            fo.unlink(missing_ok=True)
        print(f"   {r['seconds']:.2f} s (select step {r['profile'].get('select', float('nan')):.2f} s), floors "
              + ", ".join(f"{f['kind']} {f['seconds']:.2f} s" for f in floors[-len(FLOORS):]), flush=True)
    by_kind = {k: [f for f in floors if f["kind"] == k] for k in FLOORS}
    medians = {k: float(np.median([f["seconds"] for f in fs])) for k, fs in by_kind.items()}
    kind = min(medians, key=medians.get)
    fl = by_kind[kind]
    paired = [j["seconds"] / f["seconds"] for j, f in zip(jobs, fl)]
    steps = sorted({s for j in jobs for s in j["profile"]})
    row = {
        "shape": name, "candidates": size, "input_bytes": sum(f.stat().st_size for f in d.glob("*.parquet")),
        "generate_seconds": gen, "rounds": repeats,
        "seconds": float(np.median([j["seconds"] for j in jobs])), "runs_seconds": [j["seconds"] for j in jobs],
        "cpu_seconds": float(np.median([j["cpu_seconds"] for j in jobs])),
        "peak_rss_bytes": max(j["peak_rss_bytes"] for j in jobs),
        "steps_seconds": {s: float(np.median([j["profile"].get(s, np.nan) for j in jobs])) for s in steps},
        "floor_kind": kind, "floor_kinds_seconds": medians, "floor_seconds": medians[kind],
        "floor_runs": [f["seconds"] for f in fl], "floor_cpu_seconds": float(np.median([f["cpu_seconds"] for f in fl])),
        "floor_peak_rss_bytes": max(f["peak_rss_bytes"] for f in fl),
        "ratio_runs": paired, "ratio_to_floor": float(np.median(paired)),
        "ratio_range": [float(min(paired)), float(max(paired))],
    }
    shutil.rmtree(d, ignore_errors=True)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1e6", help="candidates a shape")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--shapes", default=None, help="a comma list of shape numbers (0-7) to run")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "small_bench.json"))
    a = ap.parse_args(argv)
    compile_package()
    env = package_env()
    names = list(SHAPES)
    chosen = names if a.shapes is None else [names[int(i)] for i in a.shapes.split(",")]
    size = parse_size(a.size)
    rows = []
    with tempfile.TemporaryDirectory(prefix="mrt-small-") as tmp:
        for name in chosen:
            print(f"=== {name}: {size:,} candidates", flush=True)
            rows.append(one_shape(name, size, a.repeats, Path(tmp), env))
    write_result(a.out, {"method": "grades", "k": 4, "machine": machine(), "date": time.strftime("%Y-%m-%d"),
                         "results": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
