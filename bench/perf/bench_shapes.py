"""`bench_limits.py` over several shapes of data: each shape under its refused minimum, 1.5x it and the
``--limits``, against the same spilling floor, in one run per shape.

The shapes vary one thing at a time from the limits page's data (32-d float16, int ids, pools of 8-128,
8 files): 384-d float32 vectors, string prompt ids, pools of 1,000-10,000 candidates, 1 file and 100
files, and every pool's rows together (as generation writes them; read in place, with the read+write
floor beside the spilling one). Every shape's rows go to ``bench/results/limits_shapes.json``; ``limits_doc.py`` tables them in
``docs/results/limits.md``.

    python bench/perf/bench_shapes.py                       # 2M candidates a shape (384-d: 500k)
    python bench/perf/bench_shapes.py --size 2e5 --out /tmp/s.json
    python bench/perf/bench_shapes.py --shapes 3             # rerun one shape into the existing results
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

import bench_limits  # noqa: E402
from bench_batch import parse_size  # noqa: E402

#: name -> the flags that make it differ from the limits page's data
SHAPES = {
    "32-d float16, int ids, pools 8-128, 8 files": [],
    "384-d float32": ["--dim", "384", "--dtype", "float32"],
    "string ids": ["--ids", "string"],
    "pools 1,000-10,000": ["--pool-sizes", "1000-10000"],
    "1 file": ["--files", "1"],
    "100 files": ["--files", "100"],
    "pools in consecutive rows": ["--order", "consecutive"],
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="2e6", help="candidates a shape")
    ap.add_argument("--size-384", default="5e5", help="candidates of the 384-d shape (12x the bytes a row)")
    ap.add_argument("--limits", default="1GB,2GB", help="limits beside the minimum and 1.5x it")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--shapes", default=None, help="a comma list of shape numbers (0-6) to run")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "limits_shapes.json"))
    a = ap.parse_args(argv)
    names = list(SHAPES)
    chosen = names if a.shapes is None else [names[int(i)] for i in a.shapes.split(",")]
    rows = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mrt-shapes-") as tmp:
        for name in chosen:
            size = a.size_384 if "384" in name else a.size
            out = Path(tmp) / "one.json"
            print(f"=== {name}: {parse_size(size):,} candidates", flush=True)
            bench_limits.main(["--size", str(size), "--limits", a.limits, "--repeats", str(a.repeats),
                               "--workdir", str(Path(tmp) / "data"), "--out", str(out), *SHAPES[name]])
            doc = json.loads(out.read_text())
            rows.append({"shape": name, **{k: doc[k] for k in ("candidates", "files", "dim", "dtype", "pool_sizes",
                                                              "ids", "input_bytes", "least_limit_bytes")},
                         "order": doc.get("order", "shuffled"), "repeats": a.repeats, "read_write_floor": doc.get("read_write_floor"),
                         "floor": doc["floor"], "results": doc["results"], "machine": doc["machine"],
                         "date": doc["date"]})
            shutil.rmtree(Path(tmp) / "data", ignore_errors=True)  # one shape's data on disk at a time
    out_path = Path(a.out)
    if a.shapes is not None and out_path.exists():
        # some shapes rerun: they replace their rows of the existing results, the others are kept (each row
        # records its own date and machine)
        new = {r["shape"]: r for r in rows}
        old = json.loads(out_path.read_text())
        old_rows = [{"repeats": old["repeats"], **r} for r in old["shapes"]]  # each row keeps its own rounds
        rows = [new.pop(r["shape"], r) for r in old_rows] + list(new.values())
    out_path.parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"what": "mrt select (GRADES, K = 4) under memory limits, shape by shape, "
                                               "against the polars spilling floor in the same run",
                                       "repeats": a.repeats, "seconds_total": time.perf_counter() - t0,
                                       "date": time.strftime("%Y-%m-%d"), "shapes": rows}, indent=1) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
