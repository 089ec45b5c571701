"""The scale curve: `mrt select` from 1M to 100M candidates on one machine under one memory limit.

For each size, builds a dataset of Parquet files (pools of 8 to 128 candidates, rows shuffled across the
files, int64 prompt ids, a float64 reward, and ``--dim``-d embeddings of ``--dtype``), then measures in the
same run, each in its own process (wall and CPU seconds and peak RSS from ``os.wait4``; the disk the job's
output folder reaches, polled every 0.2 s):

* ``mrt select`` (GRADES, K = 4) under ``--memory-limit`` (default 2GB), which spills every size that
  does not fit;
* the spilling floor: polars reading the files and spilling them to Arrow IPC with ``sink_ipc``, then
  scanning the IPC back and writing as many rows as the selection keeps with ``sink_parquet``: what any
  out-of-core job over the same bytes pays;
* with ``--order consecutive`` (every pool's rows together, as generation writes them; `mrt select` reads
  them in place, spilling nothing), also the read+write floor: polars' streaming engine reading the files
  and writing as many rows.

Sizes up to ``--repeat-below`` (10M) run ``--repeats`` (2) interleaved rounds; larger ones run once, the
job and its floor back to back. Results (seconds, CPU seconds, rows/s, peak RSS against the limit, peak
disk, ratios to the floor, and seconds per million rows against the smallest size) go to
``bench/results/scale_bench.json``; ``docs/results/scale.md`` is built from it by
``bench/perf/scale_doc.py``.

    python bench/perf/bench_scale.py                                   # 1M, 3M, 10M, 30M, 100M; 32-d float16
    python bench/perf/bench_scale.py --sizes 1e6,3e6 --out /tmp/s.json # a quick one
    python bench/perf/bench_scale.py --order consecutive --out bench/results/scale_consecutive.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_batch import (FLOORS, available, compile_package, folder_bytes, machine,  # noqa: E402
                         measure, package_env, parse_size, warm)
from bench_batch import make_dataset as batch_dataset  # noqa: E402

FLOOR = """
import sys, glob, polars as pl
src, spill, out, stride = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
pl.scan_parquet(sorted(glob.glob(src + "/*.parquet"))).sink_ipc(spill)
(pl.scan_ipc(spill).with_row_index("__i").filter(pl.col("__i") % stride == 0).drop("__i").sink_parquet(out))
"""


def make_dataset(d: Path, n_rows: int, n_files: int, dim: int, dtype: str, **kw) -> None:
    """`bench_batch.make_dataset`'s pools of 8..128, without the candidate index column (``kw``: its seed, block)."""
    batch_dataset(d, n_rows, n_files, dim, dtype=dtype, candidate_column=False, **kw)


def profile(output: str) -> dict[str, str]:
    """`mrt select --profile`'s breakdown (step -> its seconds) from the end of the job's output: each line of a
    step's name, two or more spaces and its seconds (a line cut at the start of the kept output is left out)."""
    out = {}
    for line in output.splitlines()[1:]:
        m = re.match(r"\s*([a-z][a-z (),]*?)\s{2,}(\d[\d.]* s\b.*?)\s*$", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def run_size(size: int, a, work: Path, env: dict, limit: int) -> dict:
    from mrt_fast.datasets import Manifest

    d = work / f"in_{size}_{a.order}"
    t0 = time.perf_counter()
    if not d.exists():  # in its own process, so that the benchmark process stays small
        subprocess.run([sys.executable, __file__, "--make", str(d), str(size), str(a.files), str(a.dim), a.dtype,
                        a.order], check=True)
    gen = time.perf_counter() - t0
    row = {"candidates": size, "files": a.files, "input_bytes": folder_bytes(d), "generate_seconds": gen,
           "warm_read_seconds": warm(d)}
    print(f"== {size:,} candidates, {row['input_bytes'] / 1e9:.2f} GB on disk (made in {gen:.0f} s)", flush=True)
    rounds = a.repeats if size <= a.repeat_below else 1
    sel, floors, rw_floors = [], [], []
    for _ in range(rounds):
        out = work / f"out_{size}"
        shutil.rmtree(out, ignore_errors=True)
        r = measure([sys.executable, "-m", "mrt_fast.cli", "select", str(d), str(out), "--k", str(a.k), "--method",
                     a.method, "--memory-limit", str(limit), "--profile"], env, [out])
        man = json.loads(Manifest.read(out).to_json())
        r.update(parts=man["n_parts"], layout=man.get("layout", "flat"), kept=sum(man["parts"].values()),
                 output_bytes=folder_bytes(out))
        sel.append(r)
        shutil.rmtree(out, ignore_errors=True)
        print(f"   mrt select: {r['seconds']:.1f} s ({r['cpu_seconds']:.1f} s CPU), peak RSS "
              f"{r['peak_rss_bytes'] / 1e9:.2f} GB of {limit / 1e9:.2f}, peak disk {r['peak_disk_bytes'] / 1e9:.2f} GB, "
              f"{r['parts']} part(s)", flush=True)
        stride = max(1, round(size / r["kept"]))
        spill, fo = work / f"floor_{size}.ipc", work / f"floor_{size}.parquet"
        f = measure([sys.executable, "-c", FLOOR, str(d), str(spill), str(fo), str(stride)], env, [spill, fo])
        spill.unlink(missing_ok=True)
        fo.unlink(missing_ok=True)
        floors.append(f)
        print(f"   floor (parquet -> sink_ipc -> scan -> sink_parquet): {f['seconds']:.1f} s "
              f"({f['cpu_seconds']:.1f} s CPU), peak disk {f['peak_disk_bytes'] / 1e9:.2f} GB", flush=True)
        if a.order == "consecutive":
            f = measure([sys.executable, "-c", FLOORS["streaming"], str(d), str(fo), str(stride)], env, [fo])
            fo.unlink(missing_ok=True)
            rw_floors.append(f)
            print(f"   read+write floor: {f['seconds']:.1f} s ({f['cpu_seconds']:.1f} s CPU)", flush=True)
    med = lambda rs, k: float(np.median([x[k] for x in rs]))  # noqa: E731
    s = {"runs_seconds": [x["seconds"] for x in sel], "seconds": med(sel, "seconds"),
         "cpu_seconds": med(sel, "cpu_seconds"), "peak_rss_bytes": max(x["peak_rss_bytes"] for x in sel),
         "peak_disk_bytes": max(x["peak_disk_bytes"] for x in sel), "parts": sel[0]["parts"],
         "layout": sel[0]["layout"],
         "kept": sel[0]["kept"], "output_bytes": sel[0]["output_bytes"], "profile": profile(sel[-1]["output_tail"])}
    fl = {"runs_seconds": [x["seconds"] for x in floors], "seconds": med(floors, "seconds"),
          "cpu_seconds": med(floors, "cpu_seconds"), "peak_rss_bytes": max(x["peak_rss_bytes"] for x in floors),
          "peak_disk_bytes": max(x["peak_disk_bytes"] for x in floors)}
    s["rows_per_second"] = size / s["seconds"]
    s["ratio_to_floor"] = s["seconds"] / fl["seconds"]
    s["cpu_ratio_to_floor"] = s["cpu_seconds"] / fl["cpu_seconds"]
    s["seconds_per_million_rows"] = s["seconds"] / size * 1e6
    s["peak_rss_over_limit"] = s["peak_rss_bytes"] / limit
    if rw_floors:
        row["read_write_floor"] = {"runs_seconds": [x["seconds"] for x in rw_floors],
                                   "seconds": med(rw_floors, "seconds"), "cpu_seconds": med(rw_floors, "cpu_seconds"),
                                   "peak_rss_bytes": max(x["peak_rss_bytes"] for x in rw_floors)}
        s["ratio_to_read_write_floor"] = s["seconds"] / row["read_write_floor"]["seconds"]  # as ratio_to_floor
    row.update(rounds=rounds, select=s, floor=fl)
    if not a.keep:
        shutil.rmtree(d, ignore_errors=True)
    return row


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--make"]:
        d, size, files, dim, dtype, order = argv[1:7]
        make_dataset(Path(d), int(size), int(files), int(dim), dtype, order=order)
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1e6,3e6,10e6,30e6,100e6", help="candidates per dataset, comma separated")
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--dtype", choices=["float16", "float32"], default="float16")
    ap.add_argument("--memory-limit", default="2GB")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--method", default="grades")
    ap.add_argument("--order", choices=["shuffled", "consecutive"], default="shuffled",
                    help="rows shuffled over the files, or every pool's rows together")
    ap.add_argument("--repeats", type=int, default=2, help="rounds of the job and its floor for sizes up to "
                    "--repeat-below (medians reported)")
    ap.add_argument("--repeat-below", type=float, default=10e6)
    ap.add_argument("--workdir", default=None, help="where the datasets go (default bench/.scale_data, removed)")
    ap.add_argument("--keep", action="store_true", help="keep the datasets")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "scale_bench.json"))
    a = ap.parse_args(argv)
    compile_package()
    sys.path.insert(0, str(ROOT / "python"))
    from mrt_fast.datasets.local import parse_memory

    env = package_env()
    limit = parse_memory(a.memory_limit)
    work = Path(a.workdir) if a.workdir else ROOT / "bench" / ".scale_data"
    work.mkdir(parents=True, exist_ok=True)
    doc = {"what": "mrt select (GRADES) from 1M to 100M candidates under one memory limit, against the polars "
                   "spilling floor (parquet -> sink_ipc -> scan -> sink_parquet), in one run",
           "k": a.k, "method": a.method, "dim": a.dim, "dtype": a.dtype, "order": a.order, "limit_bytes": limit,
           "machine": machine(mem_available_bytes_at_start=available(), load_avg_at_start=os.getloadavg()),
           "results": []}
    t_all = time.perf_counter()
    try:
        for size in [parse_size(s) for s in a.sizes.split(",")]:
            doc["results"].append(run_size(size, a, work, env, limit))
            base = doc["results"][0]["select"]["seconds_per_million_rows"]
            for r in doc["results"]:
                r["select"]["per_row_vs_smallest"] = r["select"]["seconds_per_million_rows"] / base
            doc["machine"]["load_avg_at_end"] = os.getloadavg()
            doc["seconds_total"] = time.perf_counter() - t_all
            Path(a.out).parent.mkdir(parents=True, exist_ok=True)
            Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")  # after every size: a stopped run keeps its rows
    finally:
        if not a.keep and not a.workdir:
            shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {a.out}")
    print(f"{'candidates':>12} {'s':>8} {'floor s':>8} {'x floor':>8} {'cpu x':>6} {'rows/s':>10} {'s/M':>6} "
          f"{'RSS/limit':>9} {'disk GB':>8}")
    for r in doc["results"]:
        s = r["select"]
        print(f"{r['candidates']:>12,} {s['seconds']:>8.1f} {r['floor']['seconds']:>8.1f} {s['ratio_to_floor']:>8.2f} "
              f"{s['cpu_ratio_to_floor']:>6.2f} {s['rows_per_second']:>10,.0f} {s['seconds_per_million_rows']:>6.2f} "
              f"{s['peak_rss_over_limit']:>9.2f} {s['peak_disk_bytes'] / 1e9:>8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
