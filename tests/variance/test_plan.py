"""mrt plan: per-prompt n for the next generation round from a pilot (Neyman allocation, starved
prompts, Good-Turing unseen mass), and a simulated check that it beats uniform n."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings, strategies as st
from typer.testing import CliRunner

from mrt_fast import MrtInputError
from mrt_fast.cli import app
from mrt_fast.variance.plan import plan_generation


def _pilot(sd: np.ndarray, per: int, seed: int) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    ids = np.repeat(np.arange(len(sd)), per)
    return pl.DataFrame({"prompt_id": ids, "prompt": [f"p{i}" for i in ids],
                         "reward": rng.normal(0.0, 1.0, len(ids)) * sd[ids]})


def test_budget_floor_cap_and_starved_prompts():
    sd = np.array([0.0, 0.0, 0.1, 1.0, 3.0])
    p = plan_generation(_pilot(sd, 4, 0), 40, n_min=2, n_max=20)
    t = p.table
    assert t["n"].sum() == 40 and t["n"].to_list()[:2] == [0, 0]
    assert t["n"][2:].min() >= 2 and t["n"].max() <= 20 and t["n"][4] >= t["n"][3] >= t["n"][2]
    assert t["no_variance"].to_list() == [True, True, False, False, False] and p.starved == 2
    assert t["prompt"].to_list() == [f"p{i}" for i in range(5)]
    few = plan_generation(_pilot(sd, 4, 0), 40, n_zero=1)
    assert few.table["n"].to_list()[:2] == [1, 1] and few.table["n"].sum() == 40


def test_kept_prompts_and_unseen_answers_are_not_starved():
    df = _pilot(np.array([0.0, 0.0, 0.0, 1.0]), 4, 1)
    df = df.with_columns((pl.col("prompt_id") == 0).alias("must"),
                         pl.when(pl.col("prompt_id") == 1).then(pl.format("a{}", pl.int_range(pl.len())))
                         .otherwise(pl.lit("same")).alias("mode"))
    p = plan_generation(df, 20, keep="must")
    n = p.table["n"].to_list()
    assert n[0] >= 1 and n[1] >= 1 and n[2] == 0 and sum(n) == 20
    assert p.table["unseen"].to_list() == [0.0, 1.0, 0.0, 0.0]  # prompt 1: every answer seen once
    assert p.starved == 1


def test_bad_input_is_one_line():
    df = _pilot(np.array([1.0, 2.0]), 3, 0)
    with pytest.raises(MrtInputError, match="is NaN at row 1"):
        plan_generation(df.with_columns(pl.when(pl.int_range(pl.len()) == 1).then(math.nan)
                                        .otherwise(pl.col("reward")).alias("reward")), 10)
    with pytest.raises(MrtInputError, match="less than n_min"):
        plan_generation(df, 3, n_min=2)
    with pytest.raises(MrtInputError, match="n_max"):
        plan_generation(df, 100, n_max=10)
    with pytest.raises(MrtInputError, match="'loss'"):
        plan_generation(df, 10, value="loss")


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0]), min_size=1, max_size=12), st.integers(1, 5),
       st.integers(0, 10_000), st.integers(0, 2**31 - 1))
def test_the_plan_spends_the_budget_and_ignores_row_order(sds, per, extra, seed):
    sd = np.array(sds)
    df = _pilot(sd, per, seed)
    live = len(sd)  # at most every prompt sampled
    total = live + extra
    p = plan_generation(df, total)
    q = plan_generation(df.sample(fraction=1.0, shuffle=True, seed=seed), total)
    starved = p.table.filter(pl.col("no_variance"))["n"]
    # the whole budget is spent unless no prompt varies (then nothing is worth sampling)
    assert p.table.equals(q.table) and p.table["n"].sum() == (0 if len(starved) == len(sd) else total)
    assert (starved == 0).all() and (p.table.filter(~pl.col("no_variance"))["n"] >= 1).all()


@settings(max_examples=30, deadline=None)
@given(st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0]), min_size=1, max_size=10), st.integers(2, 5),
       st.integers(0, 50), st.integers(0, 2**31 - 1))
def test_a_grouped_pilot_plans_as_its_flat_rows(sds, per, extra, seed):
    """vLLM's layout (a row a prompt, reward and answer lists) gives the plan of its rows."""
    flat = _pilot(np.array(sds), per, seed).with_columns(
        (pl.col("reward") > 0).cast(pl.String).alias("mode"), (pl.col("prompt_id") == 0).alias("must"))
    grouped = flat.group_by("prompt_id", maintain_order=True).agg(pl.col("prompt", "must").first(),
                                                                  pl.col("reward", "mode"))
    want = plan_generation(flat, len(sds) + extra, keep="must")
    got = plan_generation(grouped, len(sds) + extra, keep="must")
    assert got.table.equals(want.table) and got.lines() == want.lines()


def test_cli_plans_from_a_grouped_pilot(tmp_path):
    flat = _pilot(np.array([0.0, 1.0, 2.0]), 4, 0)
    flat.group_by("prompt_id", maintain_order=True).agg(pl.col("prompt").first(), pl.col("reward")) \
        .write_parquet(tmp_path / "pilot.parquet")
    r = CliRunner().invoke(app, ["plan", str(tmp_path / "pilot.parquet"), str(tmp_path / "plan.parquet"),
                                 "--budget", "12"])
    assert r.exit_code == 0, r.output
    assert pl.read_parquet(tmp_path / "plan.parquet").equals(plan_generation(flat, 12).table)


def test_simulated_rounds_the_plan_beats_uniform_n():
    """Prompts whose true reward sd differs a lot (a third with none): over simulated pilots the plan's
    per-prompt-mean estimate has a smaller true variance than uniform n with the same budget."""
    rng = np.random.default_rng(7)
    np_, per, budget = 60, 4, 60 * 8
    true_sd = np.where(rng.random(np_) < 1 / 3, 0.0, rng.lognormal(0.0, 1.0, np_))
    gains = []
    for seed in range(20):
        plan = plan_generation(_pilot(true_sd, per, seed), budget).table["n"].to_numpy()
        assert plan.sum() == budget
        sampled = plan > 0
        # a prompt given no responses only loses something if it truly varies
        assert not (true_sd[~sampled] > 0).any()
        v_plan = np.sum(true_sd[sampled] ** 2 / plan[sampled]) / np_**2
        v_uni = np.sum(true_sd**2 / (budget / np_)) / np_**2
        gains.append(v_uni / v_plan)
    assert np.median(gains) > 1.3 and min(gains) > 1.0


def test_cli_writes_a_plan_generate_reads(tmp_path):
    _pilot(np.array([0.0, 1.0, 2.0]), 4, 0).write_parquet(tmp_path / "pilot.parquet")
    r = CliRunner().invoke(app, ["plan", str(tmp_path / "pilot.parquet"), str(tmp_path / "plan.parquet"),
                                 "--budget", "12"])
    assert r.exit_code == 0, r.output
    t = pl.read_parquet(tmp_path / "plan.parquet")
    assert t.columns[:3] == ["prompt_id", "prompt", "n"] and t["n"].sum() == 12 and t["n"][0] == 0
    assert "at the uniform n of the same variance" in r.output and "prompts with no variance in the pilot: 1, 1 of them starved" in r.output
    r = CliRunner().invoke(app, ["plan", str(tmp_path / "pilot.parquet"), str(tmp_path / "plan.parquet"),
                                 "--budget", "12", "--cost-prompt", "10"])
    assert r.exit_code == 0 and "expected cost 32 (C_p 10 x 2 prompts + C_r 1 x 12 responses) vs 42 at" in r.output
    for args, msg in ((["missing.parquet", "p.parquet"], "does not exist"),
                      ([str(tmp_path / "pilot.parquet"), str(tmp_path / "p.xlsx")], "unsupported format"),
                      ([str(tmp_path / "pilot.parquet"), str(tmp_path / "p.parquet"), "--value", "loss"], "loss"),
                      ([str(tmp_path / "pilot.parquet"), str(tmp_path / "p.parquet"), "--cost-prompt", "-1"],
                       "cost_prompt")):
        r = CliRunner().invoke(app, ["plan", *args, "--budget", "12"])
        assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1 and msg in r.output, r.output
    r = CliRunner().invoke(app, ["plan", str(tmp_path / "pilot.parquet"), str(tmp_path / "p.parquet"),
                                 "--budget", "1", "--n-min", "2"])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1 and "less than n_min" in r.output


@pytest.mark.train
def test_generate_samples_each_prompts_n(tmp_path):
    from mrt_fast.llm.generate import generate
    from mrt_fast.llm.testing import save_tiny_models, tiny_prompt_table

    lm = save_tiny_models(tmp_path / "m")["lm"]
    prompts = tiny_prompt_table(3, with_reference=False).with_columns(pl.Series("n", [0, 1, 3]))
    got = generate(prompts, tmp_path / "g.parquet", str(lm), n=2, max_new_tokens=3, progress=False)
    counts = dict(got.group_by("prompt_id").len().rows())
    ids = prompts["prompt_id"].to_list()
    assert ids[0] not in counts and counts[ids[1]] == 1 and counts[ids[2]] == 3
    with pytest.raises(MrtInputError, match="'n' .* at row 1: an integer >= 0"):
        generate(prompts.with_columns(pl.Series("n", [1, -1, 2])), tmp_path / "h.parquet", str(lm), n=2,
                 progress=False)
