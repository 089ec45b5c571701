"""Start-up cost of the code-execution sandbox, side by side with its floor.

Per run of a one-line program (``print(1)``), median wall time over ``--repeats`` runs of
(the variants take turns, so that they share whatever load the machine has):

* ``python -I -c``: a bare interpreter start (the floor);
* ``none-i-understand``: `run_program` without isolation (supervisor, pipes, limits);
* ``bwrap``: `run_program` under bubblewrap (namespaces, mounts, supervisor).

Also the median for a short CPU-bound program (sum of 10**6 ints) under both modes.
Results go to ``bench/results/sandbox_overhead.json`` as seconds and ratios to the floor.

    python bench/perf/sandbox_overhead.py --repeats 30
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from mrt_fast.sandbox import run as sandbox


def interleaved_medians(fns: dict, repeats: int) -> dict:
    """Median wall time of each callable, the variants taking turns so that they share the machine's load."""
    for fn in fns.values():
        fn()  # warm-up (and the one-off bwrap check)
    times: dict = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "results" / "sandbox_overhead.json"))
    args = ap.parse_args()
    why = sandbox.bwrap_problem()
    fns = {"python -I -c (floor)": lambda: subprocess.run([sys.executable, "-I", "-c", "print(1)"],
                                                          capture_output=True, check=True)}
    for name, code in (("print(1)", "print(1)"), ("sum(range(10**6))", "print(sum(range(10**6)))")):
        for mode in ("none-i-understand", "bwrap"):
            if mode == "bwrap" and why is not None:
                continue

            def go(code=code, mode=mode):
                r = sandbox.run_program(code, isolation=mode)
                assert r.status == "passed", (r.status, r.stderr)

            fns[f"{mode}: {name}"] = go
    load0 = os.getloadavg()[0]
    rows = interleaved_medians(fns, args.repeats)
    load1 = os.getloadavg()[0]
    floor = rows["python -I -c (floor)"]
    out = {"what": "median wall seconds per run; ratio to a bare `python -I -c` start",
           "repeats": args.repeats, "python": platform.python_version(), "machine": platform.machine(),
           "cpus": os.cpu_count(), "load_average_1min": [round(load0, 1), round(load1, 1)], "bwrap_problem": why,
           "rows": {k: {"seconds": round(v, 4), "ratio_to_floor": round(v / floor, 2)} for k, v in rows.items()}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    for k, v in out["rows"].items():
        print(f"{k:40s} {v['seconds']:8.4f} s  x{v['ratio_to_floor']}")


if __name__ == "__main__":
    main()
