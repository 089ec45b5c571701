"""What the command line prints to a pipe or a log: whole lines (no folding at 80 columns)."""

from __future__ import annotations

import numpy as np
import polars as pl
from typer.testing import CliRunner

from mrt_fast.cli import app


def test_piped_output_keeps_paths_and_the_report_whole(tmp_path):
    rng = np.random.default_rng(0)
    ids = np.repeat(np.arange(30), 4)
    losses = pl.DataFrame({"prompt_id": ids, "loss": 2.0 + rng.normal(size=30)[ids] + rng.normal(size=ids.size)})
    deep = tmp_path / ("a_folder_with_a_long_name_" * 3) / ("and_another_one_below_it_" * 3)
    deep.mkdir(parents=True)
    losses.write_parquet(deep / "losses.parquet")
    report = deep / "report.json"
    r = CliRunner().invoke(app, ["diagnose", str(deep / "losses.parquet"), "--json", str(report), "--n-boot", "0"])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert f"wrote {report}" in lines, lines[-3:]
    assert len(f"wrote {report}") > 80
    from mrt_fast.datasets.diagnose import variance_budget

    want = repr(variance_budget(deep / "losses.parquet", n_boot=0)).splitlines()
    assert any(len(line) > 80 for line in want)  # else the check below proves nothing
    assert [line for line in want if line not in lines] == []  # each line of the report whole
