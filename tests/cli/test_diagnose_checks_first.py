"""`mrt diagnose` checks every option, the allocation included, before it writes any output."""

from __future__ import annotations

import numpy as np
import polars as pl
from typer.testing import CliRunner

from mrt_fast.cli import app


def test_allocation_refused_before_json_and_plot_are_written(tmp_path):
    rng = np.random.default_rng(0)
    n_prompts, n = 20, 4
    pl.DataFrame({"prompt_id": np.repeat(np.arange(n_prompts), n),
                  "loss": rng.gamma(2.0, 1.0, n_prompts * n)}).write_parquet(tmp_path / "pilot.parquet")
    js, png = tmp_path / "rep.json", tmp_path / "rep.png"
    # 20 prompts of 4 pilot losses hold 80 responses at most: 7200 cannot be allocated
    r = CliRunner().invoke(app, ["diagnose", str(tmp_path / "pilot.parquet"), "--n-boot", "0", "--json", str(js),
                                 "--plot", str(png), "--allocate", "7200"])
    assert r.exit_code == 2, r.output
    assert "7200" in r.output and "--pool-sizes" in r.output
    assert not js.exists() and not png.exists()
