"""Both layouts everywhere: every stage run on the grouped layout equals the stage run on the
flat equivalent, regrouped (checked by exploding the grouped result back into rows)."""

from __future__ import annotations

import warnings

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mrt_fast
from mrt_fast import MrtInputError
from mrt_fast.tables import detect, explode

LISTS = ["response", "reward", "embedding", "mode"]


def flat_table(sizes: list[int], dim: int, seed: int) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    n = sum(sizes)
    ids = np.repeat(np.arange(len(sizes)) * 7 + 3, sizes)  # pools contiguous, ids not in row order
    return pl.DataFrame({
        "prompt_id": ids,
        "prompt": [f"p{i}" for i in ids],
        "response": [f"r{j}" for j in range(n)],
        "reward": rng.integers(0, 4, n).astype(np.float64),  # ties on purpose
        "embedding": rng.standard_normal((n, dim)).astype(np.float32),
        "mode": rng.integers(0, 3, n),
    }).with_columns(pl.col("embedding").cast(pl.List(pl.Float32)))


def group(flat: pl.DataFrame, lists: list[str]) -> pl.DataFrame:
    """The grouped equivalent, written independently of the library: polars' group_by."""
    scalars = [c for c in flat.columns if c not in lists and c != "prompt_id"]
    return flat.group_by("prompt_id", maintain_order=True).agg(
        [pl.col(c).first() for c in scalars] + [pl.col(c) for c in lists])


def rows_of(grouped: pl.DataFrame, lists: list[str]) -> pl.DataFrame:
    return grouped.explode(lists)


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(1, 9), min_size=1, max_size=8), dim=st.integers(2, 6), seed=st.integers(0, 999),
       method=st.sampled_from(["random", "top", "diverse", "grades", "stratified"]), k=st.integers(1, 5),
       kind=st.sampled_from(["polars", "arrow", "pandas"]))
def test_select_on_grouped_equals_flat_regrouped(sizes, dim, seed, method, k, kind):
    flat = flat_table(sizes, dim, seed)
    grouped = group(flat, LISTS)
    g_in = {"polars": grouped, "arrow": grouped.to_arrow(), "pandas": grouped.to_pandas()}[kind]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = mrt_fast.select(flat, k, method)
        got = mrt_fast.select(g_in, k, method)
    got = got if kind == "polars" else pl.from_arrow(got) if kind == "arrow" else pl.from_pandas(got)
    assert got["prompt_id"].to_list() == grouped["prompt_id"].to_list()  # one row per prompt, input order
    added = [c for c in want.columns if c not in flat.columns]
    back = rows_of(got, LISTS + added).select(want.columns)
    for c in want.columns:
        a, b = back[c].to_list(), want[c].to_list()
        if c == "embedding":
            np.testing.assert_allclose(np.array(a, dtype=np.float32), np.array(b, dtype=np.float32))
        elif c in ("gain", "weight"):
            np.testing.assert_allclose(np.array(a, dtype=float), np.array(b, dtype=float))
        else:
            assert a == b, c


def test_select_grouped_with_a_per_prompt_k_column():
    flat = flat_table([5, 3, 6], 4, 1).with_columns(pl.col("prompt_id").replace_strict({3: 1, 10: 2, 17: 3}).alias("k"))
    grouped = group(flat, LISTS)
    want = mrt_fast.select(flat, "k", "grades")
    got = mrt_fast.select(grouped, "k", "grades")
    assert got["response"].list.len().to_list() == [1, 2, 3]
    assert rows_of(got, LISTS + ["pick_rank", "gain"])["response"].to_list() == want["response"].to_list()


def test_grouped_errors_name_the_prompts_row():
    grouped = group(flat_table([3, 4], 4, 2), LISTS)
    bad = grouped.with_columns(pl.Series("reward", [[1.0, 2.0, 3.0], [1.0, 2.0]]))
    with pytest.raises(MrtInputError, match="row 1") as e:
        mrt_fast.select(bad, 2, "top")
    assert e.value.row == 1 and e.value.column == "reward"
    dup = pl.concat([grouped, grouped.head(1)])
    with pytest.raises(MrtInputError, match="more than one row"):
        mrt_fast.select(dup, 2, "grades")
    nan = grouped.with_columns(pl.Series("reward", [[1.0, float("nan"), 3.0], [1.0, 2.0, 3.0, 4.0]]))
    with pytest.raises(MrtInputError) as e:
        mrt_fast.select(nan, 2, "top")
    assert e.value.row == 0


def test_layout_is_read_from_the_columns_or_given():
    flat = flat_table([2, 3], 3, 0)
    grouped = group(flat, LISTS)
    probes = {"embedding": 1, "reward": 0}
    assert detect(flat.schema, probes) == "flat" and detect(grouped.schema, probes) == "grouped"
    assert detect(grouped.to_arrow().schema, probes) == "grouped"
    assert detect(grouped.schema, probes, "rows") == "flat"
    with pytest.raises(MrtInputError, match="layout must be one of"):
        mrt_fast.select(flat, 2, "top", layout="wide")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sizes=st.lists(st.integers(2, 6), min_size=3, max_size=12), seed=st.integers(0, 999))
def test_variance_budget_on_grouped_equals_flat(sizes, seed):
    rng = np.random.default_rng(seed)
    flat = pl.DataFrame({"prompt_id": np.repeat(np.arange(len(sizes)), sizes),
                         "loss": rng.gamma(2.0, 1.0, sum(sizes))})
    a = mrt_fast.variance_budget(flat, n_boot=50)
    b = mrt_fast.variance_budget(group(flat, ["loss"]), n_boot=50)
    assert (a.n_rows, a.n_prompts, a.k_best) == (b.n_rows, b.n_prompts, b.k_best)
    assert a.v_y_given_x == b.v_y_given_x and a.v_x == b.v_x and a.ci == b.ci


def test_export_writes_one_training_row_per_kept_response_of_a_grouped_table(tmp_path):
    from mrt_fast.llm.export import export

    flat = flat_table([4, 2, 5], 3, 3)
    grouped = group(flat, LISTS)
    kept_g = mrt_fast.select(grouped, 2, "grades")
    kept_f = mrt_fast.select(flat, 2, "grades")
    a = export(kept_f, tmp_path / "f.jsonl", conversational=False)
    b = export(kept_g, tmp_path / "g.jsonl", conversational=False)
    assert b["completion"].dtype == pl.Utf8  # never a list of responses in one row
    assert a.equals(b)
    c = export(kept_g, tmp_path / "c.jsonl")  # conversational by default: one assistant message a row
    assert c["completion"].list.len().to_list() == [1] * b.height
    assert c["completion"].list.first().struct.field("content").to_list() == b["completion"].to_list()
    w = b.group_by("prompt_id").agg(pl.col("weight").sum())["weight"]
    np.testing.assert_allclose(w.to_numpy(), np.full(3, b.height / 3))  # each prompt weighs the same


@pytest.mark.embed
def test_embed_on_grouped_equals_flat():
    flat = pl.DataFrame({"prompt_id": [1, 1, 2, 2, 2], "response": ["a cat", "a dog", "tea", "coffee", "water"]})
    grouped = group(flat, ["response"])
    a = mrt_fast.embed(flat, text="response", progress=False, cache_dir=False)
    b = mrt_fast.embed(grouped, text="response", progress=False, cache_dir=False)
    assert b["embedding"].list.len().to_list() == [2, 3]
    np.testing.assert_allclose(np.array(explode(b, "prompt_id", ["response", "embedding"])["embedding"].to_list()),
                               np.array(a["embedding"].to_list()), rtol=1e-5, atol=1e-6)


@pytest.mark.train
def test_nll_and_score_on_grouped_equal_flat(tmp_path):
    from mrt_fast.llm.nll import nll_table
    from mrt_fast.llm.reward import RewardModel, score
    from mrt_fast.llm.testing import save_tiny_models
    from transformers import AutoModelForCausalLM, AutoTokenizer

    models = save_tiny_models(tmp_path / "m")
    tok = AutoTokenizer.from_pretrained(models["lm"])
    lm = AutoModelForCausalLM.from_pretrained(models["lm"])
    flat = pl.DataFrame({"prompt_id": [5, 5, 9], "prompt": ["two plus two", "two plus two", "hello"],
                         "response": ["four", "4", "hi there"]})
    grouped = group(flat, ["response"])
    a = nll_table(flat, lm, tok, progress=False)
    b = nll_table(grouped, lm, tok, progress=False)
    np.testing.assert_allclose(explode(b, "prompt_id", ["response", "loss"])["loss"].to_numpy(),
                               a["loss"].to_numpy(), rtol=1e-5)
    rm = RewardModel(str(models["reward"]))
    c, d = score(flat, rm, progress=False), score(grouped, rm, progress=False)
    np.testing.assert_allclose(explode(d, "prompt_id", ["response", "reward"])["reward"].to_numpy(),
                               c["reward"].to_numpy(), rtol=1e-5)
