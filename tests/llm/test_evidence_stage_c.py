"""Stage C (bench/experiments/llm_evidence/stage_c.py): the pools' make-up, the modes, every selector keeping K of
each pool, the report's paired predictions on synthetic cells, and the runner in miniature on the tiny model."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def stage_c():
    sys.path.insert(0, str(ROOT / "bench" / "experiments"))
    from llm_evidence import stage_c

    return stage_c


def _fake_embed(texts, model=None):
    """Deterministic unit vectors from the texts (no model): equal texts, equal vectors."""
    out = []
    for t in texts:
        rng = np.random.default_rng(abs(hash(("stage-c", t))) % 2**32)
        v = rng.standard_normal(8)
        out.append(v / np.linalg.norm(v))
    return np.array(out, dtype=np.float32)


def test_modes_are_the_normalized_answer(stage_c):
    assert stage_c.mode_of(" 17. ") == stage_c.mode_of("17") == "17"
    assert stage_c.mode_of("The  Number") == stage_c.mode_of("the number") == "the number"


def test_a_pool_holds_distinct_valid_answers_near_misses_wrong_answers_and_samples(stage_c):
    from llm_evidence.families import NEAR_MISS, VALID, WRONG, training_prompts

    cfg = dict(stage_c.FULL, n_train=6)
    for it in training_prompts("range40", 0, 6):
        pool = stage_c.pool_responses(it, cfg, ["a sample", "12"], 0)
        src = [s for _, s in pool]
        assert len(pool) == 6 + 4 + 3 + 2 and src.count("sample") == 2
        valid = [r for r, s in pool if s == "valid"]
        assert len(set(valid)) == 6 and all(it.grade(r) == VALID for r in valid)
        assert all(it.grade(r) == NEAR_MISS for r, s in pool if s == "near_miss")
        assert all(it.grade(r) == WRONG for r, s in pool if s == "wrong")
        assert pool == stage_c.pool_responses(it, cfg, ["a sample", "12"], 0)  # seeded
    assert stage_c.stage_c_task(stage_c.PREDICTIONS) == "range40"


def _pool(n_prompts=5, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    grades = ["valid"] * 6 + ["near_miss"] * 4 + ["wrong"] * 6
    for p in range(n_prompts):
        for j, g in enumerate(grades):
            text = f"{p}-{j % 3 if g == 'valid' else j}"
            rows.append({"prompt_id": f"p{p}", "prompt": f"q{p}", "response": text, "candidate_index": j,
                         "source": g, "grade": g, "reward": {"valid": 1.0, "near_miss": 0.5, "wrong": 0.0}[g],
                         "mode_text": text, "embedding": rng.standard_normal(8).tolist()})
    return rows


@pytest.mark.parametrize("selector", ["random", "top", "diverse", "grades-clip", "grades-shift", "stratified"])
def test_every_selector_keeps_k_of_each_pool(stage_c, selector):
    kept = stage_c.kept_rows(_pool(), selector, seed=0)
    assert kept.group_by("prompt_id").len()["len"].to_list() == [4] * 5
    if selector == "top":
        assert kept["reward"].min() == 1.0  # the 6 valid answers of each pool outrank the rest
    if selector == "stratified":  # one per mode first: no mode twice while the pool has unused modes
        assert all(len(set(g)) == 4 for g in kept.group_by("prompt_id").agg("mode_text")["mode_text"].to_list())


def _cell(sel, seed, rng, valid_p, distinct, loss):
    n = 12
    samples = [[str(i % distinct + 100 * p) for i in range(4)] for p in range(n)]
    grades = [["valid" if rng.random() < valid_p else "wrong" for _ in range(4)] for _ in range(n)]
    return {"cell": f"{sel}-s{seed}", "spec": {"kind": "train", "selector": sel, "seed": seed},
            "settings": {"predictions_sha256": "x"},
            "result": {"loss": (loss + 0.01 * rng.standard_normal(n)).tolist(),
                       "sample_valid_per_prompt": [float(np.mean([g == "valid" for g in gs])) for gs in grades],
                       "samples": samples, "sample_grade": grades, "mean_loss": loss,
                       "kept_per_prompt": [{"kept_reward": valid_p, "kept_valid": valid_p, "kept_distinct_valid": 1}
                                           for _ in range(n)]}}


def test_the_report_judges_paired_predictions(stage_c, tmp_path, monkeypatch):
    from llm_evidence import stage_c_report
    from llm_evidence.cell_files import write_atomic

    rng = np.random.default_rng(0)
    shape = {"random": (0.5, 4, 1.2), "top": (1.0, 1, 1.1), "diverse": (0.5, 4, 1.2), "grades-clip": (0.97, 4, 1.0),
             "grades-shift": (0.97, 3, 1.05), "stratified": (0.6, 3, 1.2)}
    for seed in (0, 1):
        for sel, (v, d, loss) in shape.items():
            write_atomic(tmp_path / "c" / f"{sel}-s{seed}.json", _cell(sel, seed, rng, v, d, loss))
    pred = tmp_path / "p.json"
    pred.write_text("x")
    monkeypatch.setattr(stage_c_report.hashlib, "sha256", lambda b: type("H", (), {"hexdigest": lambda s: "x"})())
    cfg = dict(stage_c.QUICK, seeds=[0, 1], n_heldout=12)
    s = stage_c_report.write_report(tmp_path / "c", tmp_path / "c.md", cfg, "range40", pred, n_boot=300)
    assert s["complete"]
    v = s["verdicts"]
    assert v["P2"] == "supported"  # top keeps one distinct answer, every other selector more
    assert v["P3"] == "supported" and v["kernel"] == "clip"  # clip: lower loss than shift, same valid rate
    rep = json.loads((tmp_path / "c.json").read_text())
    assert "grades-clip" in rep["predictions"]["P3"]["high_validity"]
    assert "random" not in rep["predictions"]["P3"]["high_validity"]
    text = (tmp_path / "c.md").read_text()
    assert "Cells complete: 12 of 12" in text and "P1: **" in text
    # a missing cell: no verdicts
    (tmp_path / "c" / "top-s1.json").unlink()
    s = stage_c_report.write_report(tmp_path / "c", tmp_path / "c.md", cfg, "range40", pred, n_boot=100)
    assert not s["complete"] and all(x.startswith("not judged") for x in s["verdicts"].values())


@pytest.mark.train
def test_quick_stage_c_writes_every_cell_and_reruns_skip(stage_c, chat_lm, tmp_path, monkeypatch):
    monkeypatch.setattr(stage_c, "embed_responses", _fake_embed)
    args = ["--quick", "--model", str(chat_lm), "--results", str(tmp_path), "--threads", "1", "--n-boot", "50"]
    assert stage_c.main(args) == 0
    cells = sorted(p.stem for p in (tmp_path / "stage_c").glob("*-s*.json") if not p.stem.startswith("pools"))
    assert cells == sorted(f"{s}-s{seed}" for s in stage_c.SELECTORS for seed in stage_c.QUICK["seeds"])
    pools = json.loads((tmp_path / "stage_c" / "pools-s0.json").read_text())["rows"]
    assert {r["source"] for r in pools} == {"valid", "near_miss", "wrong", "sample"}
    cell = json.loads((tmp_path / "stage_c" / "top-s0.json").read_text())
    assert len(cell["result"]["kept"]) == 4 * stage_c.QUICK["n_train"]
    assert (tmp_path / "stage_c.md").exists()
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "stage_c").glob("*.json")}
    assert stage_c.main(args + ["--no-report"]) == 0  # a rerun skips every cell and reuses the pools
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "stage_c").glob("*.json")} == before
