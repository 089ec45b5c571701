"""What a user waits for before any work: `mrt --help` and a one-line input error, whole processes.

Each command runs ``--repeats`` times (after one untimed run), interleaved with a bare
``python -c pass`` (the interpreter's own start, the floor); medians are reported, and the
modules each command loaded beyond the interpreter's own (counted in a separate run).

    python bench/perf/bench_startup.py            # results in bench/results/startup_bench.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

COUNT = ("import atexit, sys, runpy\nsys.argv = ['mrt'] + sys.argv[1:]\n"
         "heavy = ['pandas', 'polars', 'numpy', 'pyarrow', 'pyarrow.compute', 'pydantic', 'torch', 'ray', 'scipy', 'matplotlib']\n"
         "atexit.register(lambda: print(json.dumps({'modules': len(sys.modules), 'heavy': [m for m in heavy if m in sys.modules]}), "
         "file=sys.__stderr__))\n"  # the process's end runs its exit handlers, then skips the teardown
         "runpy.run_module('mrt_fast.cli', run_name='__main__')\n")


def wall(cmd: list[str], env: dict) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--out", default=str(HERE.parent / "results" / "startup_bench.json"))
    args = ap.parse_args()
    sys.path.insert(0, str(HERE))
    from bench_batch import compile_package, package_env

    compile_package()
    env = package_env()
    missing = Path(tempfile.gettempdir()) / "mrt-startup-missing.parquet"
    cases = {"mrt --help": ["--help"],
             "mrt select (input error)": ["select", str(missing), str(missing.with_name("o.parquet")), "--k", "2"]}
    py = [sys.executable, "-c", "pass"]
    res: dict = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                             "platform": platform.platform()}, "load_average_before": os.getloadavg()[0],
                 "repeats": args.repeats, "cases": []}
    for name, argv in cases.items():
        cmd = [sys.executable, "-m", "mrt_fast.cli", *argv]
        wall(cmd, env), wall(py, env)  # untimed: the page cache and the byte-code cache
        times, base = [], []
        for _ in range(args.repeats):
            times.append(wall(cmd, env))
            base.append(wall(py, env))
        r = subprocess.run([sys.executable, "-c", "import json\n" + COUNT, *argv], env=env, capture_output=True,
                           text=True)
        loaded = json.loads(r.stderr.strip().splitlines()[-1])
        rec = {"command": name, "median_s": statistics.median(times), "min_s": min(times), "max_s": max(times),
               "python_alone_s": statistics.median(base), "modules_loaded": loaded["modules"],
               "heavy_modules": ",".join(loaded["heavy"]) or "-"}
        res["cases"].append(rec)
        print(json.dumps(rec), flush=True)
    res["load_average_after"] = os.getloadavg()[0]
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
