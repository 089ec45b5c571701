"""`mrt nll` and `mrt score` as stages of the job: files, directories and globs in, either layout,
a file or a resumable directory out, equal to the in-memory functions."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from mrt_fast.cli import app
from mrt_fast.datasets.job import StoppedForTest, stopping_after

pytestmark = pytest.mark.train


def pairs(n_prompts: int = 6) -> pl.DataFrame:
    rng = np.random.default_rng(0)
    ids = np.repeat(np.arange(n_prompts), 3)
    words = ["alpha", "beta", "gamma", "delta", "four", "five"]
    return pl.DataFrame({"prompt_id": ids, "prompt": [f"say {words[i % 6]}" for i in ids],
                         "response": [" ".join(rng.choice(words, 1 + j % 3)) for j in range(len(ids))]})


def test_nll_to_a_directory_resumes_and_equals_one_file(tmp_path, tiny_paths):
    df = pairs()
    (tmp_path / "in").mkdir()
    df.head(8).write_parquet(tmp_path / "in" / "a.parquet")
    df.tail(df.height - 8).write_parquet(tmp_path / "in" / "b.parquet")
    glob = str(tmp_path / "in" / "*.parquet")
    base = ["nll", glob, "--model", str(tiny_paths["lm"]), "--device", "cpu", "--rows-per-part", "5"]
    r = CliRunner().invoke(app, [*base[:2], str(tmp_path / "whole.parquet"), *base[2:]])
    assert r.exit_code == 0, r.output
    with stopping_after(2), pytest.raises(StoppedForTest):
        CliRunner().invoke(app, [*base[:2], str(tmp_path / "out"), *base[2:]], catch_exceptions=False)
    r = CliRunner().invoke(app, [*base[:2], str(tmp_path / "out"), *base[2:]])
    assert r.exit_code == 0 and "resumed" in r.output, r.output
    whole = pl.read_parquet(tmp_path / "whole.parquet")
    assert pl.read_parquet(tmp_path / "out").equals(whole)  # the directory reads as it stands
    r = CliRunner().invoke(app, [*base[:2], str(tmp_path / "out"), *base[2:]])
    assert "already complete" in " ".join(r.output.split())
    assert whole["loss"].is_finite().all() and whole.height == df.height


def test_nll_and_score_take_the_grouped_layout(tmp_path, tiny_paths):
    from mrt_fast.llm.dataset_stages import nll_dataset, score_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    df = pairs()
    grouped = df.group_by("prompt_id", maintain_order=True).agg(pl.col("prompt").first(), pl.col("response"))
    df.write_parquet(tmp_path / "flat.parquet")
    grouped.write_parquet(tmp_path / "grouped.parquet")
    tok = AutoTokenizer.from_pretrained(tiny_paths["lm"])
    lm = AutoModelForCausalLM.from_pretrained(tiny_paths["lm"])
    nll_dataset(tmp_path / "flat.parquet", tmp_path / "f.parquet", lm, tok)
    nll_dataset(tmp_path / "grouped.parquet", tmp_path / "g", lm, tok, rows_per_part=2)
    f, g = pl.read_parquet(tmp_path / "f.parquet"), pl.read_parquet(tmp_path / "g")
    assert g["loss"].list.len().to_list() == [3] * 6
    np.testing.assert_allclose(g.explode("response", "loss")["loss"].to_numpy(), f["loss"].to_numpy(), rtol=1e-5)
    score_dataset(tmp_path / "grouped.parquet", tmp_path / "s.parquet", str(tiny_paths["reward"]), device="cpu")
    s = pl.read_parquet(tmp_path / "s.parquet")
    assert s["reward"].list.len().to_list() == [3] * 6
    r = CliRunner().invoke(app, ["score", str(tmp_path / "s.parquet"), str(tmp_path / "t.parquet"),
                                 "--model", str(tiny_paths["reward"])])
    assert r.exit_code == 2 and "already has a 'reward' column" in r.output


def test_nll_and_score_tick_candidates_inside_one_part(tmp_path, tiny_paths, monkeypatch, capsys):
    """The model stages count candidates as their batches finish, not only when a part is written."""
    import re

    from mrt_fast.datasets.progress import INTERVAL_ENV
    from mrt_fast.llm.dataset_stages import nll_dataset, score_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    grouped = pairs().group_by("prompt_id", maintain_order=True).agg(pl.col("prompt").first(), pl.col("response"))
    grouped.write_parquet(tmp_path / "g.parquet")
    monkeypatch.setenv(INTERVAL_ENV, "0")
    lm = AutoModelForCausalLM.from_pretrained(tiny_paths["lm"])
    tok = AutoTokenizer.from_pretrained(tiny_paths["lm"])
    nll_dataset(tmp_path / "g.parquet", tmp_path / "n.parquet", lm, tok, batch_size=2, progress="lines")
    score_dataset(tmp_path / "g.parquet", tmp_path / "s.parquet", str(tiny_paths["reward"]), device="cpu",
                  batch_size=2, progress="lines")
    lines = capsys.readouterr().err.splitlines()
    for name in ("nll", "score"):
        got = [re.search(r"([\d,]+) of 18 candidates .*?(\d+) of 6 prompts", x) for x in lines if f"mrt {name}" in x]
        counts = [(int(m.group(1)), int(m.group(2))) for m in got if m]
        # one part of all 6 prompts: the candidates moved by batches of 2 while no prompt was done yet
        assert [c for c, p in counts if p == 0][:3] == [2, 4, 6], (name, lines)
