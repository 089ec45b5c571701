"""mrt diagnose: the budget curve always plotted with K* and its interval, a table never cut,
generation log-probabilities as the pilot loss, and real pool sizes as the caps of --allocate."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from mrt_fast import MrtInputError
from mrt_fast.cli import app
from mrt_fast import variance_budget


def _losses(n_prompts: int = 40, k: int = 4, seed: int = 0) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    ids = np.repeat(np.arange(n_prompts), k)
    nll = 2.0 + 0.5 * rng.normal(size=n_prompts)[ids] + rng.normal(size=ids.size)
    n_tok = rng.integers(3, 40, size=ids.size)
    return pl.DataFrame({"prompt_id": ids, "loss": nll, "logprob": -np.abs(nll) * n_tok, "n_tokens": n_tok})


def diagnose(*args):
    return CliRunner().invoke(app, ["diagnose", *map(str, args)])


@pytest.mark.parametrize("budget", [None, 400.0])
def test_the_budget_curve_shows_k_star_and_its_interval_with_or_without_a_budget(budget):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rep = variance_budget(_losses(), n_boot=50, budget=budget)
    fig = rep.plot()
    try:
        assert len(fig.axes) == 2
        ax = fig.axes[1]
        labels = [h.get_label() for h in ax.get_legend().legend_handles]
        assert any(lab.startswith("K* =") for lab in labels) and any("interval" in lab for lab in labels)
        vlines = [ln for ln in ax.get_lines() if ln.get_label().startswith("K* =")]
        assert vlines[0].get_xdata()[0] == pytest.approx(rep.k_star)
        span = [p for p in ax.patches if "interval" in p.get_label()][0]
        lo, hi = rep.ci["k_star"]
        assert span.get_x() == pytest.approx(max(lo, 1.0))
        assert span.get_x() + span.get_width() == pytest.approx(hi)
        curve = ax.get_lines()[0]
        k_min = curve.get_xdata()[int(np.argmin(curve.get_ydata()))]
        assert abs(k_min - rep.k_star) < 0.2  # the curve's least is at K*
    finally:
        plt.close(fig)


def test_cli_plot_without_a_budget_has_the_budget_panel(tmp_path):
    _losses().write_parquet(tmp_path / "l.parquet")
    r = diagnose(tmp_path / "l.parquet", "--n-boot", "30", "--plot", tmp_path / "v.png")
    assert r.exit_code == 0, r.output
    from PIL import Image

    w, h = Image.open(tmp_path / "v.png").size
    assert w > 1.8 * h  # two panels side by side


def test_the_table_is_never_cut(tmp_path, monkeypatch):
    _losses().write_parquet(tmp_path / "l.parquet")
    r = diagnose(tmp_path / "l.parquet", "--n-boot", "0")
    assert r.exit_code == 0, r.output
    rep = variance_budget(_losses(), n_boot=0)
    for c in rep.predicted.columns:  # not a terminal: every header whole on its line
        assert c in r.output
    assert "…" not in r.output
    from rich.console import Console

    import mrt_fast.cli.variance as cv

    term = Console(force_terminal=True, width=60, record=True)
    monkeypatch.setattr(cv, "console", term)
    cv.print_table(rep.predicted, "predicted variance by K")
    text = term.export_text()
    assert max(len(line) for line in text.splitlines()) <= 60 and "…" not in text
    lines = text.splitlines()
    head = lines[[i for i, ln in enumerate(lines) if ln.startswith("┏")][0] + 1:
                 [i for i, ln in enumerate(lines) if ln.startswith("┡")][0]]
    cells = [[c.strip() for c in ln.strip("┃").split("┃")] for ln in head]
    assert ["".join(col) for col in zip(*cells)] == rep.predicted.columns  # headers folded, nothing dropped


def test_loss_from_logprob_is_the_apis_pilot_loss(tmp_path):
    df = _losses()
    df.write_parquet(tmp_path / "c.parquet")
    r = diagnose(tmp_path / "c.parquet", "--loss-from", "logprob", "--n-boot", "40", "--json", tmp_path / "r.json")
    assert r.exit_code == 0, r.output
    got = json.loads((tmp_path / "r.json").read_text())
    ref = variance_budget(df, loss="logprob", tokens="n_tokens", n_boot=40)
    assert got["v_x"] == pytest.approx(ref.v_x) and got["k_star"] == pytest.approx(ref.k_star)
    assert got["ci"]["k_star"][0] == pytest.approx(ref.ci["k_star"][0])
    nll = variance_budget(df.with_columns((-pl.col("logprob") / pl.col("n_tokens")).alias("x")), loss="x",
                          n_boot=0)
    assert got["v_y_given_x"] == pytest.approx(nll.v_y_given_x)
    df.rename({"n_tokens": "len"}).write_parquet(tmp_path / "d.parquet")
    r = diagnose(tmp_path / "d.parquet", "--loss-from", "logprob", "--tokens", "len", "--n-boot", "0",
                 "--allocate", "100")
    assert r.exit_code == 0, r.output


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(2, 12), st.integers(2, 5), st.integers(0, 10_000), st.integers(1, 3))
def test_streamed_logprob_loss_equals_the_in_memory_one(tmp_path, n_prompts, k, seed, n_files):
    df = _losses(n_prompts, k, seed).sample(fraction=1.0, shuffle=True, seed=seed)
    d = tmp_path / f"s{seed}_{n_prompts}_{k}_{n_files}"
    d.mkdir()
    for i, part in enumerate(np.array_split(np.arange(df.height), n_files)):
        df[part.tolist()].write_parquet(d / f"part{i}.parquet")
    a = variance_budget(str(d), loss="logprob", tokens="n_tokens", n_boot=0, batch_rows=3)
    b = variance_budget(df, loss="logprob", tokens="n_tokens", n_boot=0)
    assert a.v_x == pytest.approx(b.v_x, rel=1e-9, abs=1e-12)
    assert a.v_y_given_x == pytest.approx(b.v_y_given_x, rel=1e-9, abs=1e-12)


def test_bad_token_counts_and_flags_are_one_line(tmp_path):
    df = _losses()
    df.with_columns(pl.when(pl.int_range(pl.len()) == 7).then(0).otherwise(pl.col("n_tokens"))
                    .alias("n_tokens")).write_parquet(tmp_path / "z.parquet")
    r = diagnose(tmp_path / "z.parquet", "--loss-from", "logprob")
    assert r.exit_code == 2 and "'n_tokens' (token count) must be >= 1" in r.output and "row 7" in r.output
    assert "z.parquet" in r.output
    df.drop("n_tokens").write_parquet(tmp_path / "n.parquet")
    r = diagnose(tmp_path / "n.parquet", "--loss-from", "logprob")
    assert r.exit_code == 2 and "'n_tokens'" in r.output and "not found" in r.output
    r = diagnose(tmp_path / "n.parquet", "--loss-from", "reward")
    assert r.exit_code == 2 and "--loss-from" in r.output
    r = diagnose(tmp_path / "n.parquet", "--loss-from", "logprob", "--engine", "ray")
    assert r.exit_code == 2 and "local" in r.output
    with pytest.raises(MrtInputError, match="local engine"):
        variance_budget(str(tmp_path / "z.parquet"), loss="logprob", tokens="n_tokens", engine="ray")


def test_pool_sizes_are_the_caps_of_the_allocation(tmp_path):
    df = _losses(20, 4)
    df.write_parquet(tmp_path / "l.parquet")
    sizes = pl.DataFrame({"prompt_id": np.arange(20), "n": [4] * 10 + [32] * 10})
    sizes.write_csv(tmp_path / "sizes.csv")
    # 200 responses: more than the 80 pilot losses hold, fewer than the real pools
    r = diagnose(tmp_path / "l.parquet", "--n-boot", "0", "--allocate", "200")
    assert r.exit_code == 2 and "more than the 80 candidates" in r.output
    r = diagnose(tmp_path / "l.parquet", "--n-boot", "0", "--allocate", "200", "--pool-sizes", tmp_path / "sizes.csv",
                 "--allocation", tmp_path / "a.parquet")
    assert r.exit_code == 0, r.output
    al = pl.read_parquet(tmp_path / "a.parquet").join(sizes, on="prompt_id")
    assert al["k"].sum() == 200 and (al["k"] <= al["n"]).all() and al["k"].max() > 4
    assert al["pool_size"].to_list() == al["n"].to_list()
    # the same from the API, the pool sizes as a dict
    rep = variance_budget(df, n_boot=0)
    api = rep.allocate(200, pool_sizes=dict(zip(range(20), [4] * 10 + [32] * 10))).table
    assert api["k"].to_list() == pl.read_parquet(tmp_path / "a.parquet")["k"].to_list()


@pytest.mark.parametrize("sizes, msg", [
    ({"prompt_id": [0, 0], "pool_size": [5, 6]}, "more than one pool size (row 1)"),
    ({"prompt_id": [0, 1], "pool_size": [5, 0]}, "integer >= 1, got 0 at row 1"),
    ({"prompt_id": [0, 1], "pool_size": [5.5, 6.0]}, "integer >= 1, got 5.5 at row 0"),
    ({"prompt_id": [0, 1], "pool_size": ["a", "b"]}, "must hold integers"),
    ({"prompt_id": ["x", "y"], "pool_size": [5, 6]}, "not of the losses' id type"),
    ({"prompt_id": [0, 1], "size": [5, 6]}, "no pool_size (or n) column"),
    ({"prompt_id": [0, 1], "pool_size": [5, 6]}, "no entry for prompt 2"),
])
def test_bad_pool_sizes_are_one_line(tmp_path, sizes, msg):
    _losses(3, 4).write_parquet(tmp_path / "l.parquet")
    pl.DataFrame(sizes).write_parquet(tmp_path / "s.parquet")
    r = diagnose(tmp_path / "l.parquet", "--n-boot", "0", "--allocate", "10", "--pool-sizes", tmp_path / "s.parquet")
    assert r.exit_code == 2 and msg in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1 or "Traceback" not in r.output


def test_pool_sizes_need_allocate(tmp_path):
    _losses(3, 4).write_parquet(tmp_path / "l.parquet")
    r = diagnose(tmp_path / "l.parquet", "--pool-sizes", tmp_path / "l.parquet")
    assert r.exit_code == 2 and "--pool-sizes needs --allocate" in r.output
