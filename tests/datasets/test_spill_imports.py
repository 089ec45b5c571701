"""What a select job imports is held before it plans its memory: a spilled job loads the exchange's
modules (Arrow's compute functions, 14 MiB resident) before its buckets are planned, so the plan counts
them, and nothing heavy arrives afterwards (a job selected in memory loads none of them:
tests/cli/test_cli_start.py)."""

from __future__ import annotations

import subprocess
import sys

_JOB = r"""
import sys
import numpy as np, polars as pl
import mrt_fast.datasets.executors.local as local
from mrt_fast.datasets.local import select_dataset

d, parts = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(0)
n = 6000
pl.DataFrame({"prompt_id": rng.integers(0, 400, n), "reward": rng.random(n),
              "embedding": rng.normal(size=(n, 16)).astype(np.float16)}).write_parquet(d + "/in.parquet")
at_plan = []
plan = local.plan_memory
def recording(*a, **k):
    at_plan.append(set(sys.modules))
    return plan(*a, **k)
local.plan_memory = recording
select_dataset(d + "/in.parquet", d + "/out", 2, "grades", memory_limit="2GB", parts=parts if parts > 1 else None)
after = sorted(m for m in set(sys.modules) - at_plan[0] if m.split(".")[0] in ("pyarrow", "numpy", "polars"))
print("compute at plan:", "pyarrow.compute" in at_plan[0])
print("heavy after plan:", ",".join(after))
"""


def _run(tmp_path, parts: int) -> dict[str, str]:
    r = subprocess.run([sys.executable, "-c", _JOB, str(tmp_path), str(parts)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    return dict(line.split(": ", 1) if ": " in line else (line.rstrip(":"), "")
                for line in r.stdout.splitlines() if ":" in line)


def test_a_spilled_job_holds_the_exchange_modules_before_it_plans(tmp_path):
    got = _run(tmp_path, parts=3)
    assert got["compute at plan"] == "True", got
    assert got["heavy after plan"] == "", f"imported after the plan, so not counted: {got['heavy after plan']}"

