"""CLI round trips, error paths and k-means modes (no embedding model needed)."""

import json
import os

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import mrt_fast._grades_core as core
from mrt_fast.cli import app
from mrt_fast.selection.modes import pool_modes

runner = CliRunner()


def planted(n_pools=4, per=12, m=3, d=8, noise=0.05, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for p in range(n_pools):
        c = rng.normal(size=(m, d))
        for j in range(per):
            rows.append({"prompt_id": f"p{p}", "cand": j, "truth": j % m, "reward": float(rng.normal()),
                         "embedding": (c[j % m] + noise * rng.normal(size=d)).astype(np.float32).tolist()})
    return pl.DataFrame(rows)


def write(df, path):
    s = path.suffix
    if s == ".parquet":
        df.write_parquet(path)
    elif s == ".jsonl":
        df.write_ndjson(path)
    else:
        df.with_columns(pl.Series("embedding", [json.dumps(v) for v in df["embedding"].to_list()])).write_csv(path)


def read(path):
    s = path.suffix
    if s == ".parquet":
        return pl.read_parquet(path)
    if s == ".jsonl":
        return pl.read_ndjson(path)
    return pl.read_csv(path)


def same_partition(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return np.array_equal(a[:, None] == a[None, :], b[:, None] == b[None, :])


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl", ".csv"])
@pytest.mark.parametrize("method", ["random", "top", "grades", "diverse", "stratified"])
def test_select_round_trip(tmp_path, suffix, method):
    from mrt_fast import select

    df = planted()
    inp, out = tmp_path / f"in{suffix}", tmp_path / f"out{suffix}"
    write(df, inp)
    r = runner.invoke(app, ["select", str(inp), str(out), "--k", "3", "--method", method, "--n-modes", "3"])
    assert r.exit_code == 0, r.output
    got = read(out)
    assert got.height == 4 * 3
    assert set(got["prompt_id"]) == set(df["prompt_id"])
    assert "pick_rank" in got.columns
    # the same rows the library keeps
    want = select(df, 3, method, n_modes=3)
    assert got["cand"].to_list() == want["cand"].to_list()
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_select_chunked_equals_whole(tmp_path):
    df = planted(n_pools=7, per=5)
    inp = tmp_path / "in.parquet"
    df.write_parquet(inp)
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    for out, chunk in ((a, "1000000"), (b, "6")):
        r = runner.invoke(app, ["select", str(inp), str(out), "--k", "2", "--method", "grades", "--chunk-rows", chunk])
        assert r.exit_code == 0, r.output
    assert pl.read_parquet(a).equals(pl.read_parquet(b))


def test_select_stratified_computes_modes(tmp_path):
    df = planted(n_pools=3, per=12, m=3)
    inp, out = tmp_path / "in.parquet", tmp_path / "out.parquet"
    df.write_parquet(inp)
    r = runner.invoke(app, ["select", str(inp), str(out), "--k", "3", "--method", "stratified"])
    assert r.exit_code == 0, r.output
    got = pl.read_parquet(out)
    # three well separated modes, K = 3: one pick from each planted mode per pool
    assert got.group_by("prompt_id").agg(pl.col("truth").n_unique())["truth"].to_list() == [3, 3, 3]


def test_summary_table(tmp_path):
    df = planted(n_pools=2, per=2)
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    df.write_ndjson(inp)
    r = runner.invoke(app, ["select", str(inp), str(out), "--k", "3", "--method", "grades"])
    assert r.exit_code == 0, r.output
    assert "pools <= K" in r.output and "certified" in r.output


def test_help_complete():
    r = runner.invoke(app, ["--help"])
    assert r.exit_code == 0 and "select" in r.output and "embed" in r.output and "demo" in r.output
    for cmd in ("select", "embed", "demo"):
        r = runner.invoke(app, [cmd, "--help"])
        assert r.exit_code == 0, r.output


@pytest.mark.parametrize("case", ["missing", "suffix", "garbage", "no_column", "bad_method", "bad_k", "null_id", "empty"])
def test_select_errors(tmp_path, case):
    out = tmp_path / "out.parquet"
    inp = tmp_path / "in.parquet"
    args = ["--k", "2", "--method", "grades"]
    if case == "missing":
        inp = tmp_path / "nope.parquet"
    elif case == "suffix":
        inp = tmp_path / "in.txt"
        inp.write_text("x")
    elif case == "garbage":
        inp.write_bytes(b"this is not parquet")
    elif case == "no_column":
        planted().drop("embedding").write_parquet(inp)
    elif case == "bad_method":
        planted().write_parquet(inp)
        args = ["--k", "2", "--method", "best"]
    elif case == "bad_k":
        planted().write_parquet(inp)
        args = ["--k", "0"]
    elif case == "null_id":
        planted().with_columns(pl.when(pl.col("cand") == 3).then(None).otherwise(pl.col("prompt_id"))
                               .alias("prompt_id")).write_parquet(inp)
    elif case == "empty":
        planted().clear().write_parquet(inp)
    r = runner.invoke(app, ["select", str(inp), str(out), *args])
    assert r.exit_code != 0
    err = r.stderr if hasattr(r, "stderr") else r.output
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), err
    assert not out.exists()
    assert not [p for p in os.listdir(tmp_path) if ".tmp" in p]


def test_select_error_names_column(tmp_path):
    inp, out = tmp_path / "in.parquet", tmp_path / "out.parquet"
    planted().drop("reward").write_parquet(inp)
    r = runner.invoke(app, ["select", str(inp), str(out), "--k", "2", "--method", "top"])
    assert r.exit_code == 2 and "'reward'" in r.stderr


def test_unreadable_file(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root reads any file")
    inp, out = tmp_path / "in.parquet", tmp_path / "out.parquet"
    planted().write_parquet(inp)
    inp.chmod(0)
    r = runner.invoke(app, ["select", str(inp), str(out), "--k", "2"])
    assert r.exit_code == 2 and "not readable" in r.stderr


# ------------------------------------------------------------- modes


def test_modes_recover_planted_rust_path():
    df = planted(n_pools=5, per=15, m=3, noise=0.05, seed=3)
    out, info = pool_modes(df, return_info=True)
    assert info["n_modes"].to_list() == [3] * 5
    for pid in df["prompt_id"].unique():
        sub = out.filter(pl.col("prompt_id") == pid)
        assert same_partition(sub["mode"], sub["truth"])
        assert sub["mode"][0] == 0


@pytest.mark.embed
def test_modes_recover_planted_faiss_path():
    df = planted(n_pools=2, per=30, m=4, noise=0.05, seed=4)
    out, info = pool_modes(df, large_pool=10, return_info=True)  # every pool goes to FAISS
    assert info["n_modes"].to_list() == [4, 4]
    for pid in df["prompt_id"].unique():
        sub = out.filter(pl.col("prompt_id") == pid)
        assert same_partition(sub["mode"], sub["truth"])
    fixed = pool_modes(df, large_pool=10, n_modes=4)
    assert same_partition(fixed["mode"] + 10 * (fixed["prompt_id"] == "p0").cast(pl.Int64),
                          df["truth"] + 10 * (df["prompt_id"] == "p0").cast(pl.Int64))


def test_modes_one_mode_without_structure():
    rng = np.random.default_rng(0)
    df = pl.DataFrame({"prompt_id": [0] * 40, "embedding": rng.normal(size=(40, 32)).astype(np.float32).tolist()})
    assert pool_modes(df)["mode"].max() == 0


def test_modes_bad_input():
    from mrt_fast import MrtInputError

    df = pl.DataFrame({"prompt_id": [0, 0], "embedding": [[0.0, 0.0], [1.0, 0.0]]})
    with pytest.raises(MrtInputError, match="prompt_id=0"):
        pool_modes(df)
    with pytest.raises(MrtInputError, match="n_modes"):
        pool_modes(df, n_modes=0)
    with pytest.raises(MrtInputError, match="'emb'"):
        pool_modes(df, embedding="emb")


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 25), st.integers(1, 6), st.integers(0, 2**32), st.booleans())
def test_modes_properties(n, m, seed, auto):
    """Labels are canonical (first seen = 0, all of 0..M-1 used, M <= min(m, n)),
    deterministic for a seed, and a pool's labels do not depend on other pools."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    y = rng.normal(size=(7, 4)).astype(np.float32)
    kw = dict(n_modes=None if auto else m, m_max=m)
    a = core.kmeans_modes(np.vstack([x, y]), np.array([0, n, n + 7], np.uint64), np.array([1, 2], np.uint64), seed, **kw)
    b = core.kmeans_modes(x, np.array([0, n], np.uint64), np.array([1], np.uint64), seed, **kw)
    la = a["labels"][:n]
    assert np.array_equal(la, b["labels"])
    M = int(a["n_modes"][0])
    assert 1 <= M <= min(m, n)
    assert la[0] == 0 and set(la.tolist()) == set(range(M))
    # first appearances are in increasing order
    firsts = [int(np.argmax(la == c)) for c in range(M)]
    assert firsts == sorted(firsts)


@settings(max_examples=20, deadline=None)
@given(st.integers(2, 5), st.integers(4, 10), st.integers(0, 1000))
def test_modes_planted_property(m, per, seed):
    """Well separated planted clusters (orthogonal directions) are recovered exactly."""
    rng = np.random.default_rng(seed)
    d = 8
    centres = np.eye(d)[:m] * 5
    truth = np.arange(m * per) % m
    x = (centres[truth] + 0.05 * rng.normal(size=(m * per, d))).astype(np.float32)
    r = core.kmeans_modes(x, np.array([0, len(x)], np.uint64), np.array([seed], np.uint64), 0, m_max=6)
    assert int(r["n_modes"][0]) == m
    assert same_partition(r["labels"], truth)
