"""select(table, k="column"): a K per pool, each pool as if selected alone at its K."""

from __future__ import annotations

import warnings

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mrt_fast import MrtInputError, select


def _table(sizes, ks, seed):
    rng = np.random.default_rng(seed)
    rows = []
    for p, (n, k) in enumerate(zip(sizes, ks)):
        for j in range(n):
            rows.append({"prompt_id": f"p{p}", "cand": j, "k_i": k, "reward": float(rng.normal()),
                         "mode": int(rng.integers(0, 3)), "embedding": rng.normal(size=4).tolist()})
    df = pl.DataFrame(rows)
    return df.sample(fraction=1.0, shuffle=True, seed=seed)  # pools interleaved


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 9), st.integers(1, 5)), min_size=1, max_size=7), st.integers(0, 1000),
       st.sampled_from(["random", "top", "diverse", "grades", "stratified"]))
def test_each_pool_as_if_selected_alone(pools, seed, method):
    sizes, ks = zip(*pools)
    df = _table(sizes, ks, seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got, rep = select(df, "k_i", method, seed=seed, return_report=True)
        assert got.columns == df.columns + [c for c in got.columns if c not in df.columns]
        order = df["prompt_id"].unique(maintain_order=True).to_list()
        assert got["prompt_id"].unique(maintain_order=True).to_list() == order
        for p in order:
            pool = df.filter(pl.col("prompt_id") == p)
            alone = select(pool, int(pool["k_i"][0]), method, seed=seed)
            mine = got.filter(pl.col("prompt_id") == p)
            assert mine["cand"].to_list() == alone["cand"].to_list()
            assert mine["pick_rank"].to_list() == list(range(mine.height))
            if "weight" in alone.columns:
                assert mine["weight"].to_list() == alone["weight"].to_list()
    assert rep.n_kept == got.height and rep.n_pools == len(order) and rep.k == "k_i"
    assert got.height == sum(min(n, k) for n, k in zip(sizes, ks))
    if method in ("diverse", "grades"):
        assert rep.objective is not None and len(rep.objective) == len(order)


def test_other_table_kinds():
    df = _table([5, 3, 6], [2, 1, 3], 0)
    want = select(df, "k_i", "random", seed=1)
    arrow = select(df.to_arrow(), "k_i", "random", seed=1)
    assert pl.from_arrow(arrow).equals(want)
    pd = select(df.to_pandas(), "k_i", "random", seed=1)
    assert pd["cand"].tolist() == want["cand"].to_list()


def test_bad_k_column():
    df = _table([4, 4], [2, 3], 0)
    with pytest.raises(MrtInputError, match="not constant within pool") as e:
        select(df.with_columns(pl.when(pl.col("cand") == 0).then(1).otherwise(pl.col("k_i")).alias("k_i")),
               "k_i", "random")
    assert e.value.column == "k_i" and e.value.pool in ("p0", "p1")
    with pytest.raises(MrtInputError, match="integers"):
        select(df.with_columns(pl.col("k_i").cast(pl.Float64)), "k_i", "random")
    with pytest.raises(MrtInputError, match=">= 1") as e:
        select(df.with_columns(pl.lit(0).alias("k_i")), "k_i", "random")
    assert e.value.row is not None
    with pytest.raises(MrtInputError, match="null"):
        select(df.with_columns(pl.when(pl.col("cand") == 1).then(None).otherwise(pl.col("k_i")).alias("k_i")),
               "k_i", "random")
    with pytest.raises(MrtInputError, match="nope"):
        select(df, "nope", "random")


def test_allocation_feeds_select():
    from mrt_fast import variance_budget

    rng = np.random.default_rng(3)
    sd = np.repeat([0.2, 2.0], 10)
    loss = rng.normal(0, sd[:, None], (20, 8))
    ids = np.repeat([f"p{i}" for i in range(20)], 8)
    al = variance_budget(pl.DataFrame({"prompt_id": ids, "loss": loss.ravel()}), n_boot=0).allocate(60)
    cands = pl.DataFrame({"prompt_id": ids, "cand": np.tile(np.arange(8), 20)}).join(
        al.table.select("prompt_id", "k"), on="prompt_id")
    kept = select(cands, "k", "random")
    per = kept.group_by("prompt_id", maintain_order=True).len()
    assert per["len"].to_list() == al.table["k"].to_list() and kept.height == 60


def test_cli_diagnose_allocate_then_select(tmp_path):
    from typer.testing import CliRunner

    from mrt_fast.cli import app

    rng = np.random.default_rng(5)
    sd = np.repeat([0.2, 2.0], 10)
    ids = np.repeat([f"p{i}" for i in range(20)], 8)
    cands = pl.DataFrame({"prompt_id": ids, "cand": np.tile(np.arange(8), 20),
                          "loss": rng.normal(0, sd[:, None], (20, 8)).ravel()})
    cands.write_parquet(tmp_path / "c.parquet")
    r = CliRunner().invoke(app, ["diagnose", str(tmp_path / "c.parquet"), "--n-boot", "0", "--allocate", "60",
                                 "--allocation", str(tmp_path / "alloc.parquet")])
    assert r.exit_code == 0, r.output
    assert "Allocation(20 prompts, 60 responses" in r.output
    alloc = pl.read_parquet(tmp_path / "alloc.parquet")
    assert alloc["k"].sum() == 60 and alloc.filter(pl.col("prompt_id") == "p19")["k"][0] > 3
    cands.join(alloc.select("prompt_id", "k"), on="prompt_id").write_parquet(tmp_path / "ck.parquet")
    r = CliRunner().invoke(app, ["select", str(tmp_path / "ck.parquet"), str(tmp_path / "kept.parquet"),
                                 "--k", "k", "--method", "random"])
    assert r.exit_code == 0, r.output
    kept = pl.read_parquet(tmp_path / "kept.parquet")
    got = kept.group_by("prompt_id", maintain_order=True).len()
    assert got["len"].to_list() == alloc["k"].to_list()
    r = CliRunner().invoke(app, ["select", str(tmp_path / "ck.parquet"), str(tmp_path / "x.parquet"),
                                 "--k", "nope", "--method", "random"])
    assert r.exit_code == 2 and "nope" in r.output
    r = CliRunner().invoke(app, ["diagnose", str(tmp_path / "c.parquet"), "--n-boot", "0", "--allocate", "5"])
    assert r.exit_code == 2 and "less than" in r.output
