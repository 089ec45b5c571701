"""docs/guides/huggingface.md's Python blocks run as written, in order, on a `save_to_disk` folder
named as they name it; the one change is `MODEL`, a tiny local model instead of a hub id
(the tests run offline)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import polars as pl
import pytest

DOC = Path(__file__).resolve().parent.parent / "docs" / "guides" / "huggingface.md"
MODEL_LINE = re.compile(r'^MODEL = "[^"]+"$', re.MULTILINE)


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), re.DOTALL)


def test_the_doc_has_its_blocks_and_one_model_line():
    blocks = _blocks()
    assert len(blocks) == 2
    assert len(MODEL_LINE.findall(blocks[0])) == 1 and not MODEL_LINE.findall(blocks[1])
    assert ".map(" not in DOC.read_text()


@pytest.mark.embed
@pytest.mark.train
def test_the_recipe_runs_as_written(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    pytest.importorskip("trl")
    pytest.importorskip("sentence_transformers")
    import torch
    from mrt_fast.llm.testing import save_tiny_models

    torch.set_num_threads(1)
    datasets.disable_progress_bars()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MRT_CACHE_DIR", str(tmp_path / "cache"))
    rng = np.random.default_rng(0)
    ids = np.repeat(np.arange(8), 6)
    words = ["red", "blue", "green", "fast", "slow", "tall"]
    pool = pl.DataFrame({"prompt_id": ids, "prompt": [f"Describe thing {i}." for i in ids],
                         "response": [f"It is {words[j % 6]} and {words[(j * 5) % 6]}." for j in range(len(ids))],
                         "reward": rng.normal(size=len(ids))})
    datasets.Dataset.from_polars(pool).save_to_disk("candidates_hf")
    model = save_tiny_models(tmp_path / "tiny")["lm"]
    ns: dict = {}
    for i, code in enumerate(_blocks()):
        code = MODEL_LINE.sub(f"MODEL = {str(model)!r}", code)
        try:
            exec(compile(code, f"docs/guides/huggingface.md python block {i}", "exec"), ns)
        except Exception as e:  # noqa: BLE001 - report which block broke
            pytest.fail(f"docs/guides/huggingface.md python block {i} failed: {type(e).__name__}: {e}\n{code}")
    assert isinstance(ns["kept"], datasets.Dataset) and ns["kept"].num_rows == 8 * 4
    assert pl.read_ndjson("sft.jsonl").height == 8 * 4
    assert pl.read_ndjson("dpo.jsonl")["prompt_id"].value_counts()["count"].max() <= 2
    assert Path("sft_out").is_dir() and Path("dpo_out").is_dir()
