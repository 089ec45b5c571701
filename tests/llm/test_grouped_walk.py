"""The grouped walk as a newcomer meets it: vLLM-shaped data (one row per prompt, `responses` and
`reward` lists) in a Hugging Face `save_to_disk` folder, through `mrt embed` -> `mrt nll` ->
`mrt diagnose` -> `mrt select` -> `mrt export` (SFT and DPO) -> one TRL step on each file, every
command with its defaults; and the stages Ray runs, on Ray, giving what the local engine gives."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from mrt_fast.cli import app

pytestmark = [pytest.mark.train, pytest.mark.embed]

WORDS = ["red", "blue", "green", "fast", "slow", "tall", "round", "flat"]


def vllm_shaped(n_prompts: int = 6, n: int = 4, seed: int = 0) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    return pl.DataFrame({
        "prompt_id": [f"q{i}" for i in range(n_prompts)],
        "prompt": [f"Describe thing {i}." for i in range(n_prompts)],
        "responses": [[f"It is {WORDS[(i + j) % 8]} and {WORDS[(3 * j + i) % 8]}." for j in range(n)]
                      for i in range(n_prompts)],
        "reward": [rng.normal(size=n).tolist() for _ in range(n_prompts)],
    })


@pytest.fixture(scope="module")
def walk_input(tmp_path_factory):
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()
    d = tmp_path_factory.mktemp("walk")
    datasets.Dataset.from_polars(vllm_shaped()).save_to_disk(str(d / "gen_hf"))
    return d


def mrt(*args) -> str:
    r = CliRunner().invoke(app, [str(a) for a in args])
    assert r.exit_code == 0, f"mrt {' '.join(map(str, args))}\n{r.output}"
    return r.output


def test_the_grouped_walk_on_the_local_engine(walk_input, chat_lm, tmp_path, monkeypatch):
    pytest.importorskip("trl")
    import torch

    torch.set_num_threads(1)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MRT_CACHE_DIR", str(tmp_path / "cache"))
    lm = chat_lm  # a model with a chat template: the exports' default format is conversational
    out = mrt("embed", walk_input / "gen_hf", "emb")  # --text: 'responses' found by itself
    assert "candidates" in out and "24" in out
    mrt("nll", "emb", "nll.parquet", "--model", lm)
    nll = pl.read_parquet("nll.parquet")
    assert nll.schema["loss"] == pl.List(pl.Float64) and nll["loss"].list.len().to_list() == [4] * 6
    mrt("diagnose", "nll.parquet", "--n-boot", "0", "--json", "report.json")
    assert json.loads(open("report.json").read())["n_prompts"] == 6
    mrt("select", "nll.parquet", "kept", "--k", "2")
    kept = pl.read_parquet("kept")
    assert kept.height == 6 and kept["responses"].list.len().to_list() == [2] * 6
    mrt("export", "kept", "sft.jsonl", "--model", lm)
    mrt("export", "kept", "dpo.jsonl", "--format", "dpo", "--model", lm)
    sft_rows, dpo_rows = pl.read_ndjson("sft.jsonl"), pl.read_ndjson("dpo.jsonl")
    assert sft_rows.height == 12 and dpo_rows.height >= 1
    # one default for every format, from the model's tokenizer: chat messages in both files
    user = pl.List(pl.Struct({"role": pl.String, "content": pl.String}))
    assert sft_rows.schema["prompt"] == dpo_rows.schema["prompt"] == user

    import datasets
    from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer

    common = dict(max_steps=1, report_to="none", use_cpu=True, per_device_train_batch_size=2,
                  logging_steps=1, save_strategy="no")
    sft = datasets.load_dataset("json", data_files="sft.jsonl", split="train")
    s = SFTTrainer(model=str(lm), train_dataset=sft, args=SFTConfig(output_dir="sft_out", **common)).train()
    dpo = datasets.load_dataset("json", data_files="dpo.jsonl", split="train")
    d = DPOTrainer(model=str(lm), train_dataset=dpo, args=DPOConfig(output_dir="dpo_out", **common)).train()
    assert s.global_step == 1 and d.global_step == 1
    assert np.isfinite(s.training_loss) and np.isfinite(d.training_loss)


@pytest.mark.ray
def test_the_grouped_walk_on_ray_gives_the_local_results(walk_input, tiny_paths, tmp_path, monkeypatch):
    pytest.importorskip("ray")
    import torch

    torch.set_num_threads(1)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MRT_CACHE_DIR", str(tmp_path / "cache"))
    lm = tiny_paths["lm"]
    for eng in ("local", "ray"):
        mrt("embed", walk_input / "gen_hf", f"emb_{eng}", "--engine", eng, "--chunk-rows", "4")
        mrt("nll", f"emb_{eng}", f"nll_{eng}", "--model", lm, "--engine", eng, "--rows-per-part", "4")
        mrt("diagnose", f"nll_{eng}", "--n-boot", "0", "--engine", eng, "--json", f"rep_{eng}.json")
        mrt("select", f"nll_{eng}", f"kept_{eng}", "--k", "2", "--engine", eng, "--parts", "2")
    emb = [pl.read_parquet(f"emb_{e}") for e in ("local", "ray")]
    for a, b in zip(emb[0]["embedding"].to_list(), emb[1]["embedding"].to_list()):
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-5, atol=1e-6)
    nll = [pl.read_parquet(f"nll_{e}") for e in ("local", "ray")]
    np.testing.assert_allclose(np.concatenate(nll[0]["loss"].to_list()), np.concatenate(nll[1]["loss"].to_list()),
                               rtol=1e-5)
    reps = [json.loads(open(f"rep_{e}.json").read()) for e in ("local", "ray")]
    assert reps[0]["n_prompts"] == reps[1]["n_prompts"] == 6
    assert reps[0]["v_y_given_x"] == pytest.approx(reps[1]["v_y_given_x"], rel=1e-6)
    kept = [pl.read_parquet(f"kept_{e}").sort("prompt_id") for e in ("local", "ray")]
    assert kept[0]["responses"].to_list() == kept[1]["responses"].to_list()


def test_mrt_train_takes_grouped_kept_rows_as_their_flat_rows(tiny_paths, tmp_path):
    """mrt select's grouped output (a row a prompt, `responses` and `weight` lists) trains as its rows."""
    import torch

    from mrt_fast.llm.testing import tiny_causal_lm, tiny_tokenizer
    from mrt_fast.llm.train import train

    torch.set_num_threads(1)
    grouped = vllm_shaped(4, 3).with_columns(pl.col("reward").list.eval(pl.element().abs() + 0.5).alias("weight"))
    flat = grouped.explode("responses", "reward", "weight").rename({"responses": "response"})
    tok = tiny_tokenizer()
    kw = dict(tokenizer=tok, max_steps=2, batch_size=4, learning_rate=5e-3, progress=False)
    a = train(flat, tiny_causal_lm(tok, seed=3), tmp_path / "flat", **kw)
    b = train(grouped, tiny_causal_lm(tok, seed=3), tmp_path / "grouped", response="responses", **kw)
    assert b.n_pairs == a.n_pairs == 12
    assert [r["loss"] for r in b.log] == pytest.approx([r["loss"] for r in a.log], rel=1e-6)
    grouped.write_parquet(tmp_path / "kept.parquet")
    r = CliRunner().invoke(app, ["train", str(tmp_path / "kept.parquet"), str(tmp_path / "cli"), "--model",
                                 str(tiny_paths["lm"]), "--max-steps", "1"])
    assert r.exit_code == 0 and "12 pairs (4 prompts" in r.output, r.output
