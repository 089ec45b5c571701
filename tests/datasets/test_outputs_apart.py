"""No command writes over what it reads: every output (side outputs included) is checked against
every input before any work, by resolved path, through symbolic links, and as a directory
holding an input; refused in one line, nothing written, the input intact."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from mrt_fast.cli import app
from mrt_fast.errors import MrtInputError

runner = CliRunner()


def kept(path):
    rng = np.random.default_rng(0)
    ids = np.repeat(np.arange(20), 3)
    pl.DataFrame({"prompt_id": ids, "prompt": [f"p{i}" for i in ids], "response": [f"r{i}" for i in range(60)],
                  "loss": rng.gamma(2.0, 1.0, 60), "reward": rng.normal(size=60),
                  "reference": [f"a{i}" for i in ids]}).write_parquet(path)
    return path


def snapshot(d):
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(d.rglob("*"))}


CASES = {
    # command args; {i}: the input file, {d}: its directory, {l}: a link to the input, {ld}: a link to {d}
    "export onto its input": ["export", "{i}", "{i}"],
    "export onto a link to its input": ["export", "{i}", "{l}"],
    "export through a linked directory": ["export", "{i}", "{ld}/kept.parquet"],
    "export through ..": ["export", "{i}", "{d}/sub/../kept.parquet"],
    "diagnose --json onto its input": ["diagnose", "{i}", "--n-boot", "0", "--json", "{i}"],
    "diagnose --allocation onto its input": ["diagnose", "{i}", "--n-boot", "0", "--allocate", "50",
                                             "--allocation", "{i}"],
    "diagnose --allocation onto --pool-sizes": ["diagnose", "{d}/other.parquet", "--n-boot", "0", "--allocate", "50",
                                                "--pool-sizes", "{i}", "--allocation", "{l}"],
    "diagnose --json inside its input directory": ["diagnose", "{d}", "--n-boot", "0", "--json", "{d}/r.json"],
    "diagnose --json and --plot the same file": ["diagnose", "{i}", "--n-boot", "0", "--json", "{d}/../r.svg",
                                                 "--plot", "{d}/../r.svg"],
    "embed-quality --json onto its input": ["embed-quality", "{i}", "--json", "{l}"],
    "evaluate --out onto its data": ["evaluate", "{i}", "--model", "m", "--out", "{i}"],
    "train into a directory holding its data": ["train", "{i}", "{d}", "--model", "m"],
    "select into a directory holding its input": ["select", "{i}", "{d}", "--k", "2", "--method", "top"],
    "plan onto its pilot": ["plan", "{i}", "{l}", "--budget", "100"],
    "generate onto its prompts": ["generate", "{i}", "{d}/sub/../kept.parquet", "--model", "m"],
    # a model, tokenizer or adapter folder is an input too; so is a warm-up table
    "nll onto its --warm-data": ["nll", "{i}", "{w}", "--loss", "l2", "--warm-pilot", "lora", "--warm-data", "{w}",
                                 "--model", "{m}"],
    "nll into its model folder": ["nll", "{i}", "{m}/x.parquet", "--loss", "l2", "--model", "{m}"],
    "score into its model folder": ["score", "{i}", "{m}/scored", "--column", "r2", "--model", "{m}"],
    "train into its model folder": ["train", "{i}", "{m}", "--model", "{m}"],
    "train into a folder holding its model": ["train", "{i}", "{m}/..", "--model", "{m}"],
    "evaluate --out into its adapter": ["evaluate", "{i}", "--model", "{m}", "--adapter", "{a}", "--out",
                                        "{a}/adapter_config.json"],
    "evaluate --out onto a link to its model": ["evaluate", "{i}", "--model", "{lm}", "--out", "{m}/config.json"],
    "export into its tokenizer's folder": ["export", "{i}", "{m}/train.jsonl", "--model", "{m}"],
    "generate into its model folder": ["generate", "{p}", "{m}/cands.parquet", "--model", "{m}"],
    "embed into its model folder": ["embed", "{i}", "{m}/emb", "--text", "response", "--model", "{m}"],
    "embed-quality --json into its model folder": ["embed-quality", "{i}", "--model", "{m}", "--json",
                                                   "{m}/q.json"],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_output_over_an_input_is_refused_before_any_work(tmp_path, case):
    d = tmp_path / "data"
    d.mkdir()
    (d / "sub").mkdir()
    inp = kept(d / "kept.parquet")
    kept(d / "other.parquet")
    os.symlink(inp, tmp_path / "link.parquet")
    os.symlink(d, tmp_path / "linkdir")
    model, adapter = tmp_path / "models" / "base", tmp_path / "adapter"
    for f in (model / "config.json", model / "tokenizer.json", adapter / "adapter_config.json"):
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("{}")
    os.symlink(model, tmp_path / "linkmodel")
    kept(tmp_path / "warm.parquet")
    pl.DataFrame({"prompt_id": [1, 2], "prompt": ["a", "b"]}).write_parquet(tmp_path / "prompts.parquet")
    before = snapshot(tmp_path)
    args = [a.format(i=inp, d=d, l=tmp_path / "link.parquet", ld=tmp_path / "linkdir", m=model, a=adapter,
                     lm=tmp_path / "linkmodel", w=tmp_path / "warm.parquet", p=tmp_path / "prompts.parquet")
            for a in CASES[case]]
    r = runner.invoke(app, args)
    assert r.exit_code == 2, (r.exit_code, r.output)
    err = r.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    assert "would write over" in err or "inside it" in err or "own path" in err, err
    assert snapshot(tmp_path) == before


def test_check_apart_on_paths(tmp_path):
    from mrt_fast.datasets.overlap import check_apart

    inp = kept(tmp_path / "a.parquet")
    os.link(inp, tmp_path / "hard.parquet")
    for out in (inp, tmp_path / "hard.parquet", tmp_path, tmp_path / "x" / ".." / "a.parquet"):
        with pytest.raises(MrtInputError, match="would write over the input"):
            check_apart([("input", inp)], [("--json", out)])
    check_apart([("input", inp)], [("--json", tmp_path / "r.json"), ("--plot", None)])  # apart: no error
    check_apart([("input", tmp_path / "missing.parquet")], [("--json", tmp_path / "r.json")])  # left to the reader
    with pytest.raises(MrtInputError, match="own path"):
        check_apart([], [("--json", tmp_path / "r.json"), ("--plot", tmp_path / "." / "r.json")])
    model = tmp_path / "model"
    model.mkdir()
    (model / "weights.bin").write_bytes(b"")
    for out in (model, model / "x.json", tmp_path, model / ".." / "model" / "weights.bin"):
        with pytest.raises(MrtInputError, match="would write over the --model"):
            check_apart([("--model", model)], [("output", out)])
    check_apart([("--model", model), ("--model", "org/hub-id"), ("--model", None)], [("output", tmp_path / "o.jsonl")])
