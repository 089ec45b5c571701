"""A job with a memory limit fixes the C allocator's mmap threshold, so freed large blocks leave the process."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                                reason="glibc's allocator")

# large blocks freed one after another, each a little larger than the last, each followed by a small block
# that stays: glibc's dynamic threshold puts them on its heap after the first large block is freed
_CHURN = r"""
import sys
import numpy as np
from mrt_fast._util.memory import hold_to_limit, rss
if sys.argv[1] == "hold":
    assert hold_to_limit() and hold_to_limit()
MiB = 1 << 20
a = np.ones(8 * MiB // 8)
del a
base = rss()
keep = []
for i in range(24):
    big = np.ones((4 * MiB + i * 64 * 1024) // 8)
    keep.append(np.ones(2048))
    del big
print((rss() - base) / MiB)
"""


def _kept_mib(mode: str) -> float:
    r = subprocess.run([sys.executable, "-c", _CHURN, mode], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return float(r.stdout.strip().splitlines()[-1])


def test_freed_large_blocks_go_back_to_the_system_under_the_hold():
    held, free_running = _kept_mib("hold"), _kept_mib("default")
    assert held < 1.0, f"{held:.1f} MiB of freed blocks still resident under the hold"
    # the same churn without it keeps freed blocks resident (what took a spilled job over its limit)
    assert free_running > 4.0, f"only {free_running:.1f} MiB kept without the hold"


def test_a_select_job_with_a_limit_sets_the_hold(tmp_path):
    script = r"""
import sys
import numpy as np, polars as pl
import mrt_fast._util.memory as m
from mrt_fast.datasets.local import select_dataset
pl.DataFrame({"prompt_id": np.repeat(np.arange(50), 4), "embedding": np.random.default_rng(0).normal(size=(200, 8)).astype(np.float32)}).write_parquet(sys.argv[1] + "/in.parquet")
assert not m._pinned[0]
select_dataset(sys.argv[1] + "/in.parquet", sys.argv[1] + "/out.parquet", 2, "diverse", memory_limit="2GB")
print(m._pinned[0])
"""
    r = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "True"
