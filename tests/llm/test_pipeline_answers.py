"""`mrt run` with an answers section: the answer is the mode, the checker's verdict the reward."""

from __future__ import annotations

import polars as pl
import pytest

from mrt_fast import MrtInputError


@pytest.mark.train
@pytest.mark.usefixtures("torch_one_thread")
def test_mrt_run_takes_an_answers_section(tiny_paths, tmp_path):
    from mrt_fast.llm.pipeline import run
    from mrt_fast.llm.testing import tiny_prompt_table

    tiny_prompt_table(3, with_reference=False).with_columns(pl.lit("7").alias("gold")).write_ndjson(
        tmp_path / "train.jsonl")
    tiny_prompt_table(3, offset=5).write_ndjson(tmp_path / "eval.jsonl")
    cfg = {"out_dir": str(tmp_path / "out"), "model": str(tiny_paths["lm"]), "embedder": "hashing",
           "data": {"train_prompts": str(tmp_path / "train.jsonl"), "eval": str(tmp_path / "eval.jsonl")},
           "generate": {"n": 3, "max_new_tokens": 4}, "select": {"methods": ["stratified"], "ks": [1]},
           "answers": {"extract": "last_number", "reference": "gold"},
           "train": {"max_steps": 1}, "evaluate": {"n_samples": 2, "max_new_tokens": 4}, "threads": 1,
           "baseline": False}
    run(cfg, progress=False)
    scored = pl.read_parquet(tmp_path / "out" / "scored.parquet")
    assert {"answer", "mode", "reward", "correct"} <= set(scored.columns)
    assert scored["reward"].to_list() == [1.0 if a == "7" else 0.0 for a in scored["answer"].to_list()]
    again = run(cfg, progress=False)  # the same settings: reused, not refused
    assert again["cell"].to_list() == ["reused"]
    cfg["answers"]["check"] = "numeric"
    with pytest.raises(MrtInputError, match="score"):
        run(cfg, progress=False)
