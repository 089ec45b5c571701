"""Empty responses (vLLM returns them routinely): found before any model loads, named by their row
and candidate in the user's layout, and a policy for them (--empty-text refuse|skip|keep), counted."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from mrt_fast.cli import app
from mrt_fast.errors import MrtInputError


def grouped(n_rows: int = 20, n: int = 3) -> pl.DataFrame:
    rng = np.random.default_rng(0)
    resp = [[f"answer {i} {j}" for j in range(n)] for i in range(n_rows)]
    resp[3][0] = ""      # the case: row 3, candidate 0
    resp[7][2] = "   "   # whitespace only
    resp[11] = ["", " "]  # a prompt with nothing to embed (and fewer candidates)
    return pl.DataFrame({"prompt_id": np.arange(n_rows), "prompt": [f"q {i}" for i in range(n_rows)],
                         "responses": resp,
                         "reward": [list(rng.normal(size=len(r))) for r in resp]})


@pytest.fixture()
def no_model(monkeypatch):
    """Loading a model fails the test: the checks must come first."""
    import importlib

    emb = importlib.import_module("mrt_fast.embeddings.embed")

    def boom(*a, **k):
        raise AssertionError("a model was loaded before the input was checked")

    monkeypatch.setattr(emb, "load_model", boom)
    monkeypatch.setattr(emb, "load_static", boom)
    monkeypatch.setattr(emb, "load_int8", boom)


def test_empty_text_refused_before_the_model_naming_row_and_candidate(tmp_path, no_model):
    src = tmp_path / "g.parquet"
    grouped().write_parquet(src)
    r = CliRunner().invoke(app, ["embed", str(src), str(tmp_path / "out.parquet"), "--text", "responses"])
    assert r.exit_code == 2, r.output
    assert "row 3, candidate 0" in r.output and "g.parquet" in r.output and "--empty-text" in r.output
    assert not (tmp_path / "out.parquet").exists()


def test_empty_text_flat_refused_before_the_model(tmp_path, no_model):
    from mrt_fast.embeddings.dataset import embed_dataset

    src = tmp_path / "f.parquet"
    pl.DataFrame({"prompt_id": [1, 1, 2], "response": ["a", "b", " \n"]}).write_parquet(src)
    with pytest.raises(MrtInputError, match=r"whitespace only\) at row 2 of"):
        embed_dataset(src, tmp_path / "out.parquet")


@pytest.mark.embed
def test_skip_and_keep_are_counted_and_selection_leaves_nulls_out(tmp_path):
    from mrt_fast.datasets.local import select_dataset
    from mrt_fast.embeddings.dataset import embed_dataset

    src = tmp_path / "g.parquet"
    df = grouped()
    df.write_parquet(src)
    cache = tmp_path / "cache"
    skip = embed_dataset(src, tmp_path / "skip.parquet", text="responses", empty_text="skip", cache_dir=cache,
                         rows_per_part=6)
    out = pl.read_parquet(tmp_path / "skip.parquet")
    assert skip.empty_skipped == 4 and skip.prompts_skipped == 1
    assert out.height == df.height - 1 and 11 not in out["prompt_id"].to_list()
    row3 = out.filter(pl.col("prompt_id") == 3)
    assert row3["responses"][0].to_list() == ["answer 3 1", "answer 3 2"]
    assert row3["reward"][0].to_list() == df["reward"][3].to_list()[1:]  # the candidate left every list
    keep = embed_dataset(src, tmp_path / "keep", text="responses", empty_text="keep", cache_dir=cache,
                         rows_per_part=6)
    assert keep.empty_kept == 4
    kept = pl.read_parquet(tmp_path / "keep")
    assert kept.height == df.height
    assert kept["embedding"][3][0] is None and kept["embedding"][3][1] is not None
    rep = select_dataset(tmp_path / "keep", tmp_path / "sel.parquet", 1, "grades", embedding="embedding")
    assert rep.n_no_embedding == 4
    sel = pl.read_parquet(tmp_path / "sel.parquet")
    picked = sel.select(pl.col("responses").explode())["responses"].to_list()
    assert "" not in picked and "   " not in picked and " " not in picked


def test_in_memory_grouped_refusal_names_the_candidate():
    from mrt_fast.embeddings.embed import embed

    with pytest.raises(MrtInputError, match=r"row 3, candidate 0"):
        embed(grouped(), text="responses", progress=False, cache_dir=False)
