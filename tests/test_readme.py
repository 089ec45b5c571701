"""The README's Python snippets run as written, in order, on files named as they name them."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import polars as pl
import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def _candidates(n_prompts: int, seed: int) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    n = rng.integers(5, 12, n_prompts)
    ids = np.repeat(np.arange(n_prompts), n)
    e = rng.standard_normal((len(ids), 16)).astype(np.float32)
    return pl.DataFrame({"prompt_id": ids, "response": [f"r{i}" for i in range(len(ids))],
                         "reward": rng.standard_normal(len(ids)),
                         "embedding": e}).with_columns(pl.col("embedding").cast(pl.List(pl.Float32)))


def test_the_readme_has_snippets():
    assert len(_blocks()) >= 3


def test_readme_snippets_run_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _candidates(30, 0).write_parquet("candidates.parquet")
    rng = np.random.default_rng(1)
    pl.DataFrame({"prompt_id": np.repeat(np.arange(200), 4),
                  "loss": rng.gamma(2.0, 1.0, 800) + np.repeat(rng.normal(0, 1, 200), 4) ** 2}
                 ).write_parquet("losses.parquet")
    Path("data").mkdir()
    for i in range(3):
        _candidates(20, 10 + i).with_columns(pl.col("prompt_id") + 100 * i).write_parquet(f"data/part-{i}.parquet")
    ns: dict = {}
    for i, code in enumerate(_blocks()):
        try:
            exec(compile(code, f"README.md python block {i}", "exec"), ns)
        except Exception as e:  # noqa: BLE001 - report which snippet broke
            pytest.fail(f"README python block {i} failed: {type(e).__name__}: {e}\n{code}")
    assert Path("budget.png").is_file() and Path("kept").is_dir()
