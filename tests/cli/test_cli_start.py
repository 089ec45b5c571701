"""What `mrt select` loads: only what moving Arrow buffers to the core needs."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import polars as pl
import pytest


@pytest.mark.parametrize("dtype", [pl.Float32, pl.Float16])
def test_select_loads_no_compute_kernels_validators_or_pandas(tmp_path, dtype):
    """A whole `mrt select` (a Parquet file in memory, GRADES, a Parquet file out) runs without
    loading `pyarrow.compute`, pydantic or pandas, which it does not need."""
    rng = np.random.default_rng(0)
    n = 400
    pl.DataFrame({"prompt_id": np.arange(n) // 8, "reward": rng.random(n),
                  "embedding": pl.Series(rng.standard_normal((n, 6)).astype(np.float32)).cast(pl.List(dtype))}
                 ).write_parquet(tmp_path / "in.parquet")
    code = ("import sys\nfrom mrt_fast.cli import app\n"
            "try:\n    app(['select', sys.argv[1], sys.argv[2], '--k', '2'])\nexcept SystemExit as e:\n"
            "    assert not e.code, e.code\n"
            "print(sorted(m for m in ('pyarrow.compute', 'pydantic', 'pandas') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "in.parquet"), str(tmp_path / "out.parquet")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "[]"
    assert pl.read_parquet(tmp_path / "out.parquet").height == 2 * (n // 8)
