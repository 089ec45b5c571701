"""Every stage of the job, run on grouped input, equals the stage run on the flat equivalent and
regrouped: select, embed, nll, score (files or directories out, any part count) and export."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from mrt_fast.cli import app

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
WORDS = ["alpha", "beta", "gamma", "delta", "four", "five", "the sea", "a cat"]


def flat_table(sizes: list[int], seed: int) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    n = sum(sizes)
    ids = np.repeat(np.arange(len(sizes)) * 5 + 2, sizes)
    return pl.DataFrame({
        "prompt_id": ids,
        "prompt": [f"say {WORDS[i % len(WORDS)]}" for i in ids],
        "response": [" ".join(rng.choice(WORDS, 1 + j % 3)) + f" {j}" for j in range(n)],
        "reward": rng.integers(0, 4, n).astype(np.float64),  # ties on purpose
        "embedding": rng.standard_normal((n, 3)).astype(np.float32),
    }).with_columns(pl.col("embedding").cast(pl.List(pl.Float32)))


def regroup(flat: pl.DataFrame, lists: list[str]) -> pl.DataFrame:
    """The grouped equivalent, written independently of the library: polars' group_by."""
    scalars = [c for c in flat.columns if c not in lists and c != "prompt_id"]
    return flat.group_by("prompt_id", maintain_order=True).agg(
        [pl.col(c).first() for c in scalars] + [pl.col(c) for c in lists])


def write_both(tmp, flat: pl.DataFrame, lists: list[str], n_files: int) -> tuple[str, str]:
    """The flat table and its grouped equivalent, each cut into ``n_files`` files of a directory."""
    out = []
    for name, df in (("flat", flat), ("grouped", regroup(flat, lists))):
        d = tmp / name
        d.mkdir()
        cuts = np.linspace(0, df.height, n_files + 1).astype(int)
        for j in range(n_files):
            df.slice(cuts[j], cuts[j + 1] - cuts[j]).write_parquet(d / f"{j}.parquet")
        out.append(str(d))
    return out[0], out[1]


def read_out(path) -> pl.DataFrame:
    return pl.read_parquet(path)


def same_as_regrouped(grouped_out: pl.DataFrame, flat_out: pl.DataFrame, new: list[str], lists: list[str],
                      close: list[str] = ()) -> None:
    want = regroup(flat_out, lists + new).select(grouped_out.columns)
    exact = [c for c in grouped_out.columns if c not in close]
    assert grouped_out.select(exact).equals(want.select(exact))
    for c in close:
        a = grouped_out.select(pl.col(c).explode())[c].to_list()
        b = want.select(pl.col(c).explode())[c].to_list()
        np.testing.assert_allclose(np.array(a, dtype=np.float64), np.array(b, dtype=np.float64),
                                   rtol=1e-5, atol=1e-6)


sizes_st = st.lists(st.integers(1, 6), min_size=1, max_size=7)
out_st = st.sampled_from(["out.parquet", "out"])


@settings(max_examples=25, **SETTINGS)
@given(sizes=sizes_st, seed=st.integers(0, 999), k=st.integers(1, 4), method=st.sampled_from(
    ["random", "top", "diverse", "grades", "stratified"]), parts=st.integers(1, 3), n_files=st.integers(1, 3),
       out=out_st)
def test_select_on_grouped_equals_flat_regrouped(tmp_path_factory, sizes, seed, k, method, parts, n_files, out):
    from mrt_fast.datasets.local import select_dataset

    tmp = tmp_path_factory.mktemp("select")
    lists = ["response", "reward", "embedding"]
    f, g = write_both(tmp, flat_table(sizes, seed), lists, n_files)
    select_dataset(f, tmp / f"f-{out}", k, method, seed=seed, parts=parts)
    select_dataset(g, tmp / f"g-{out}", k, method, seed=seed, parts=min(parts, len(sizes)))
    flat_out = read_out(tmp / f"f-{out}")
    if out == "out":  # the parts of a directory hold the pools bucket by bucket: the file order is the input's
        flat_out = flat_out.sort("prompt_id", "pick_rank", maintain_order=True)
    grouped_out = read_out(tmp / f"g-{out}")
    new = [c for c in ("mode", "pick_rank", "gain", "weight") if c in flat_out.columns]  # mode: modes found
    got = grouped_out.sort("prompt_id") if out == "out" else grouped_out
    same_as_regrouped(got, flat_out, new, lists)


@settings(max_examples=15, **SETTINGS)
@given(sizes=sizes_st, seed=st.integers(0, 999), k=st.integers(1, 3), fmt=st.sampled_from(["trl", "openrlhf", "kto"]),
       parts=st.integers(1, 3))
def test_export_of_a_grouped_directory_equals_the_flat_one(tmp_path_factory, sizes, seed, k, fmt, parts):
    """`mrt export` reads an `mrt select` directory of either layout and writes one training row per kept
    response with its weight: the grouped kept rows give the flat kept rows' file."""
    from mrt_fast.datasets.local import select_dataset

    tmp = tmp_path_factory.mktemp("export")
    lists = ["response", "reward", "embedding"]
    f, g = write_both(tmp, flat_table(sizes, seed), lists, 1)
    select_dataset(f, tmp / "kf.parquet", k, "grades", seed=seed)
    select_dataset(g, tmp / "kg", k, "grades", seed=seed, parts=min(parts, len(sizes)))
    files = {}
    for name, kept in (("f", tmp / "kf.parquet"), ("g", tmp / "kg")):
        files[name] = tmp / f"{name}.jsonl"
        r = CliRunner().invoke(app, ["export", str(kept), str(files[name]), "--format", fmt, "--plain"])
        if fmt == "kto" and r.exit_code == 2 and "no kto row" in r.output:
            return  # every kept reward equal to its pool's mean: no row either way (checked on both)
        assert r.exit_code == 0, r.output
    a, b = pl.read_ndjson(files["f"]), pl.read_ndjson(files["g"])
    assert a.equals(b) and a.height == (sum(min(k, s) for s in sizes) if fmt != "kto" else a.height)
    if fmt == "trl":
        assert b["completion"].dtype == pl.Utf8


def test_export_refuses_the_ray_engine_in_one_line(tmp_path):
    flat_table([2, 2], 0).write_parquet(tmp_path / "k.parquet")
    r = CliRunner().invoke(app, ["export", str(tmp_path / "k.parquet"), str(tmp_path / "t.jsonl"), "--engine", "ray"])
    assert r.exit_code == 2 and "local engine only" in r.output and len(r.output.strip().splitlines()) == 1
    assert not (tmp_path / "t.jsonl").exists()


@pytest.mark.embed
@settings(max_examples=4, **SETTINGS)
@given(sizes=sizes_st, seed=st.integers(0, 999), per=st.integers(1, 4), out=out_st)
def test_embed_on_grouped_equals_flat_regrouped(tmp_path_factory, sizes, seed, per, out):
    from mrt_fast.embeddings.dataset import embed_dataset

    tmp = tmp_path_factory.mktemp("embed")
    flat = flat_table(sizes, seed).drop("embedding")
    f, g = write_both(tmp, flat, ["response", "reward"], 2)
    embed_dataset(f, tmp / f"f-{out}", cache_dir=False, rows_per_part=per * 2)
    embed_dataset(g, tmp / f"g-{out}", cache_dir=False, rows_per_part=per)
    same_as_regrouped(read_out(tmp / f"g-{out}"), read_out(tmp / f"f-{out}"), ["embedding"], ["response", "reward"],
                      close=["embedding"])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    pytest.importorskip("transformers")
    from mrt_fast.llm.testing import save_tiny_models

    return save_tiny_models(tmp_path_factory.mktemp("models"))


@pytest.mark.train
@settings(max_examples=4, **SETTINGS)
@given(sizes=sizes_st, seed=st.integers(0, 999), per=st.integers(1, 4), out=out_st)
def test_nll_and_score_on_grouped_equal_flat_regrouped(tmp_path_factory, tiny, sizes, seed, per, out):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mrt_fast.llm.dataset_stages import nll_dataset, score_dataset

    tmp = tmp_path_factory.mktemp("nll")
    flat = flat_table(sizes, seed).drop("embedding", "reward")
    f, g = write_both(tmp, flat, ["response"], 2)
    tok = AutoTokenizer.from_pretrained(tiny["lm"])
    lm = AutoModelForCausalLM.from_pretrained(tiny["lm"])
    nll_dataset(f, tmp / f"f-{out}", lm, tok, rows_per_part=per * 2)
    nll_dataset(g, tmp / f"g-{out}", lm, tok, rows_per_part=per)
    same_as_regrouped(read_out(tmp / f"g-{out}"), read_out(tmp / f"f-{out}"), ["loss"], ["response"], close=["loss"])
    score_dataset(f, tmp / f"sf-{out}", str(tiny["reward"]), device="cpu", rows_per_part=per * 2)
    score_dataset(g, tmp / f"sg-{out}", str(tiny["reward"]), device="cpu", rows_per_part=per)
    same_as_regrouped(read_out(tmp / f"sg-{out}"), read_out(tmp / f"sf-{out}"), ["reward"], ["response"],
                      close=["reward"])
