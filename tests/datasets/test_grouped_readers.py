"""Every path reader takes the grouped layout (one row per prompt, list columns), as the table
readers do: `variance_budget` on a path and `mrt diagnose` read the list `loss` column `mrt nll`
writes, and say a bad value by its file, row and candidate."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from mrt_fast.cli import app
from mrt_fast.errors import MrtInputError

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def grouped_losses(sizes: list[int], seed: int) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    return pl.DataFrame({
        "prompt_id": [f"p{i}" for i in range(len(sizes))],
        "prompt": [f"prompt {i}" for i in range(len(sizes))],
        "loss": [list(rng.gamma(2.0, 1.0 + i % 3, n)) for i, n in enumerate(sizes)],
    }, schema_overrides={"loss": pl.List(pl.Float64)})


@settings(max_examples=20, **SETTINGS)
@given(sizes=st.lists(st.integers(2, 6), min_size=3, max_size=12), seed=st.integers(0, 99),
       batch=st.integers(1, 5), n_files=st.integers(1, 3))
def test_streamed_grouped_equals_table(tmp_path_factory, sizes, seed, batch, n_files):
    from mrt_fast import variance_budget

    tmp = tmp_path_factory.mktemp("g")
    df = grouped_losses(sizes, seed)
    cuts = np.linspace(0, df.height, n_files + 1).astype(int)
    for j in range(n_files):
        df.slice(cuts[j], cuts[j + 1] - cuts[j]).write_parquet(tmp / f"{j}.parquet")
    on_path = variance_budget(str(tmp), batch_rows=batch, n_boot=0)
    on_table = variance_budget(df, n_boot=0)
    assert on_path.n_prompts == on_table.n_prompts == len(sizes)
    assert on_path.v_x == pytest.approx(on_table.v_x, rel=1e-9, abs=1e-12)
    assert on_path.v_y_given_x == pytest.approx(on_table.v_y_given_x, rel=1e-9, abs=1e-12)


def test_diagnose_reads_grouped_nll_output(tmp_path):
    p = tmp_path / "pilot_nll.parquet"
    grouped_losses([4] * 10, 0).write_parquet(p)
    r = CliRunner().invoke(app, ["diagnose", str(p), "--n-boot", "0"])
    assert r.exit_code == 0, r.output
    assert "V_x" in r.output or "v_x" in r.output


def test_grouped_null_loss_names_row_and_candidate(tmp_path):
    from mrt_fast import variance_budget

    df = grouped_losses([3, 3, 3], 1).with_columns(
        pl.when(pl.int_range(pl.len()) == 2).then(pl.lit([0.5, None, 1.0], dtype=pl.List(pl.Float64)))
        .otherwise(pl.col("loss")).alias("loss"))
    p = tmp_path / "l.parquet"
    df.write_parquet(p)
    with pytest.raises(MrtInputError, match=r"row 2, candidate 1"):
        variance_budget(str(p), n_boot=0)


def test_grouped_loss_of_text_is_refused(tmp_path):
    from mrt_fast import variance_budget

    p = tmp_path / "l.parquet"
    pl.DataFrame({"prompt_id": [1, 2], "loss": [["a", "b"], ["c", "d"]]}).write_parquet(p)
    with pytest.raises(MrtInputError, match="list of numbers"):
        variance_budget(str(p), n_boot=0)
