"""What the benchmarks of `mrt select` on one generated dataset share: their arguments, the
folder their data lives in, one measured run of the job, and the result file they end with."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Iterator

from bench_batch import available, machine, measure, write_result
from bench_scale import profile


def dataset_arguments(ap: argparse.ArgumentParser, *, name: str, out: Path, repeats: int) -> None:
    """The arguments of a one-dataset benchmark: the data's size and shape, K, rounds, where the data
    goes (default ``bench/.<name>_data``, removed at the end) and the result file ``out``."""
    ap.add_argument("--size", default="10e6", help="candidates")
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--dtype", choices=["float16", "float32"], default="float16")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=repeats)
    ap.add_argument("--workdir", default=None, help=f"where the dataset goes (default bench/.{name}_data, removed)")
    ap.add_argument("--out", default=str(out))


@contextlib.contextmanager
def work_area(workdir: str | None, default: Path) -> Iterator[Path]:
    """The benchmark's data folder: ``workdir`` (kept), else ``default`` (removed when the block ends)."""
    work = Path(workdir) if workdir else default
    work.mkdir(parents=True, exist_ok=True)
    try:
        yield work
    finally:
        if not workdir:
            shutil.rmtree(work, ignore_errors=True)


def select_once(d: Path, out: Path, env: dict, k: int, limit: int, extra: list[str] | tuple = ()) -> dict:
    """One measured `mrt select` (GRADES, ``--profile``) of ``d`` into ``out`` under ``limit``
    (``extra``: more options): `measure`'s record with the buckets (``parts``), the rows kept and
    the job's own breakdown (``profile``); ``out`` is removed after."""
    from mrt_fast.datasets import Manifest

    shutil.rmtree(out, ignore_errors=True)
    r = measure([sys.executable, "-m", "mrt_fast.cli", "select", str(d), str(out), "--k", str(k),
                 "--memory-limit", str(limit), "--profile", *extra], env, [out])
    man = json.loads(Manifest.read(out).to_json())
    r.update(parts=man["n_parts"], layout=man.get("layout", "flat"), kept=sum(man["parts"].values()),
             profile=profile(r["output_tail"]))
    shutil.rmtree(out, ignore_errors=True)
    return r


def median_of(runs: list[dict], key: str) -> float:
    """The median of ``key`` over measured runs."""
    import numpy as np

    return float(np.median([r[key] for r in runs]))


def finish(out: str | Path, doc: dict) -> None:
    """Write ``doc`` to ``out``, stamped with the machine it was measured on."""
    doc["machine"] = machine(mem_available_bytes=available(), load_avg_at_end=os.getloadavg())
    write_result(out, doc)
