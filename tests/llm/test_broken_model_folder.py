"""A local model folder transformers cannot load is one line naming it, for every command that loads one."""

from __future__ import annotations

import json

import polars as pl
import pytest
from typer.testing import CliRunner

from mrt_fast.cli import app

pytestmark = [pytest.mark.train]


@pytest.fixture()
def broken(tmp_path):
    d = tmp_path / "broken-model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"hidden_size": 8}))  # no model_type, no weights
    return d


def _pairs(tmp_path):
    f = tmp_path / "pairs.parquet"
    pl.DataFrame({"prompt_id": [1, 1, 2, 2], "prompt": ["a", "a", "b", "b"], "response": ["x", "y", "z", "w"],
                  "reward": [1.0, 0.0, 1.0, 0.0]}).write_parquet(f)
    return f


@pytest.mark.parametrize("command", ["nll", "train", "export"])
def test_a_broken_model_folder_is_one_line(tmp_path, broken, command):
    data = _pairs(tmp_path)
    args = {"nll": ["nll", str(data), str(tmp_path / "out.parquet"), "--model", str(broken)],
            "train": ["train", str(data), str(tmp_path / "run"), "--model", str(broken), "--max-steps", "1"],
            "export": ["export", str(data), str(tmp_path / "sft.jsonl"), "--format", "sft", "--model", str(broken)]}
    r = CliRunner().invoke(app, args[command])
    assert r.exit_code == 2, r.output
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and "cannot load the" in err[0] and str(broken) in err[0], r.stderr
    assert "Traceback" not in r.output


def test_the_python_loaders_name_the_folder(broken):
    from mrt_fast.errors import MrtInputError
    from mrt_fast.llm.models import load_causal_lm, load_tokenizer

    for load in (load_causal_lm, load_tokenizer):
        with pytest.raises(MrtInputError, match="cannot load the (model|tokenizer) from"):
            load(str(broken))
