"""The pairing-rule experiment (bench/experiments/llm_evidence/dpo_rules.py): the partial-credit reward is the
documented function, the candidate pools make sweet-spot and best-worst differ, the grid's parts share it once,
the decision rule, and the runner in miniature on the tiny chat model: every cell written, a rerun skips them all,
and the report computes the paired differences."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "experiments"))

from llm_evidence import dpo_report, dpo_rules  # noqa: E402
from llm_evidence.families import heldout_prompts, training_prompts  # noqa: E402

ITEMS = training_prompts("multiple", 0, 48)


@settings(max_examples=200, deadline=None)
@given(i=st.integers(0, len(ITEMS) - 1), x=st.integers(0, 400))
def test_reward_is_one_for_valid_and_decays_with_the_distance_to_the_nearest_valid_answer(i, x):
    it = ITEMS[i]
    valid = [int(v) for v in it.valid]
    r = dpo_rules.reward(it, str(x))
    if x in valid:
        assert r == 1.0
    else:
        d = min(abs(x - v) for v in valid)
        assert r == pytest.approx(0.9 * math.exp(-d / 5.0), rel=1e-12)
        assert 0 < r < 0.9
    assert dpo_rules.reward(it, f" {x}.") == r  # the checker's spelling rules: spaces and a final period


def test_reward_of_non_numbers_is_zero():
    it = ITEMS[0]
    for s in ("none", "I don't know", "", "twelve", f"{it.valid[0]} or so"):
        assert dpo_rules.reward(it, s) == 0.0


def test_pools_are_seeded_hold_valid_and_spread_rewards():
    it = ITEMS[0]
    a = dpo_rules.candidate_pool(it, 32, 0)
    assert a == dpo_rules.candidate_pool(it, 32, 0) and a != dpo_rules.candidate_pool(it, 32, 1)
    for it in ITEMS:
        pool = dpo_rules.candidate_pool(it, 32, 0)
        r = np.array([dpo_rules.reward(it, x) for x in pool])
        assert len(pool) == 32 and 1 <= (r == 1.0).sum() <= 8
        assert len(set(np.round(r, 9))) >= 3  # spread, not three levels


def test_pools_make_sweet_spot_differ_from_best_worst_on_some_prompts():
    stats = dpo_rules.pool_statistics(dpo_rules.FULL)
    assert set(stats) == set(dpo_rules.FULL["seeds"])
    for s in stats.values():
        # a different rejected reward than best-worst's first pair on some prompts, the same on others
        assert 0 < s["same_rejected_reward"] < s["prompts"] == dpo_rules.FULL["n_train"]
        assert s["same_pair"] <= s["same_rejected_reward"]
        assert s["mean_margin"]["sweet-spot"] > s["mean_margin"]["best-worst"]


def test_full_settings_are_the_registered_ones():
    pred = json.loads(dpo_rules.PREDICTIONS.read_text())
    assert pred["settings"] == json.loads(json.dumps(dpo_rules.FULL))
    assert pred["task"] == dpo_rules.TASK and tuple(pred["rules"]) == dpo_rules.RULES
    for p in pred["predictions"]:
        assert p["metric"] in dpo_report.METRICS and p["direction"] in (">", "<")
        assert (p["a"], p["b"]) in dpo_report.COMPARISONS
    assert len(dpo_rules.FULL["seeds"]) >= 3 and dpo_rules.FULL["n_heldout"] >= 48


def test_cells_start_with_every_seeds_sft_and_parts_share_the_grid_once():
    todo = dpo_rules.cells(dpo_rules.FULL)
    seeds = dpo_rules.FULL["seeds"]
    assert [n for n, _ in todo[:len(seeds)]] == [f"sft-s{s}" for s in seeds]
    assert len(todo) == len(seeds) * (1 + len(dpo_rules.RULES))
    for n in (1, 2, 3):
        parts = [dpo_rules.part_of(todo, i, n) for i in range(n)]
        assert sorted(c[0] for p in parts for c in p) == sorted(c[0] for c in todo)


def test_per_prompt_values_read_the_cell():
    cell = {"result": {"greedy": ["12", " 7.", "twelve", "12\n\n13"], "greedy_valid": [1.0, 0.0, 0.0, 0.0]}}
    assert dpo_report.per_prompt(cell, "greedy_number").tolist() == [1.0, 1.0, 0.0, 0.0]
    assert dpo_report.per_prompt(cell, "greedy_valid").tolist() == [1.0, 0.0, 0.0, 0.0]


def test_verdicts_follow_the_interval():
    d = lambda lo, hi: {"interval": [lo, hi]}  # noqa: E731
    assert dpo_report.verdict(d(0.01, 0.2), ">", True) == "supported"
    assert dpo_report.verdict(d(-0.2, -0.01), ">", True) == "contradicted"
    assert dpo_report.verdict(d(-0.1, 0.1), ">", True) == "not resolved"
    assert dpo_report.verdict(d(-0.2, -0.01), "<", True) == "supported"
    assert dpo_report.verdict(d(0.01, 0.2), ">", False) == "incomplete"
    assert dpo_report.verdict(None, ">", True) == "incomplete"


@pytest.mark.train
def test_quick_grid_writes_every_cell_reruns_skip_and_the_report_pairs_cells(chat_lm, tmp_path, capsys):
    pytest.importorskip("trl")  # DPO training is TRL's (with Hugging Face datasets), beyond the train extra's core
    out = tmp_path / "v2"
    args = ["--quick", "--model", str(chat_lm), "--results", str(out), "--work", str(tmp_path / "work"),
            "--threads", "1"]
    assert dpo_rules.main(args) == 0
    cfg = dpo_rules.QUICK
    cell_dir = out / "dpo_rules"
    names = [n for n, _ in dpo_rules.cells(cfg)]
    assert sorted(p.stem for p in cell_dir.glob("*.json")) == sorted(names)
    sha = dpo_rules.sha256(dpo_rules.PREDICTIONS)
    held = [it.prompt_id for it in heldout_prompts("multiple", cfg["n_heldout"])]
    for n in names:
        d = json.loads((cell_dir / f"{n}.json").read_text())
        r = d["result"]
        assert d["settings"]["predictions_sha256"] == sha and r["prompt_ids"] == held
        assert len(r["loss"]) == len(r["greedy_valid"]) == len(r["greedy_reward"]) == cfg["n_heldout"]
    for s in cfg["seeds"]:
        start = json.loads((cell_dir / f"sft-s{s}.json").read_text())["result"]["start"]["adapter_sha256"]
        for rule in dpo_rules.RULES:
            r = json.loads((cell_dir / f"{rule}-s{s}.json").read_text())["result"]
            assert r["start_adapter_sha256"] == start  # every rule of a seed starts from its SFT policy
            assert r["n_pairs"] == r["export_report"]["rows_out"] > 0 and len(r["train_log"]) == cfg["dpo_steps"]
    capsys.readouterr()
    mtimes = {p: p.stat().st_mtime_ns for p in cell_dir.glob("*.json")}
    assert dpo_rules.main(args) == 0  # a rerun finds every cell done
    assert '"skipped": %d, "ran": 0' % len(names) in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in cell_dir.glob("*.json")} == mtimes
    rep = json.loads((out / "dpo_rules.json").read_text())
    assert rep["complete"] and rep["one_start_per_seed"]
    for a, b in dpo_report.COMPARISONS:
        for m in dpo_report.METRICS:
            d = next(x for x in rep["differences"] if (x["a"], x["b"], x["metric"]) == (a, b, m))
            x = [json.loads((cell_dir / f"{a}-s{s}.json").read_text()) for s in cfg["seeds"]]
            y = [json.loads((cell_dir / f"{b}-s{s}.json").read_text()) for s in cfg["seeds"]]
            want = np.mean([dpo_report.per_prompt(u, m) - dpo_report.per_prompt(v, m) for u, v in zip(x, y)])
            assert d["difference"] == pytest.approx(want, abs=1e-12)
            assert d["interval"][0] <= d["difference"] <= d["interval"][1]
    assert {p["verdict"] for p in rep["predictions"]} <= {"supported", "contradicted", "not resolved"}
    page = (out / "dpo_rules.md").read_text()
    assert "## Paired differences" in page and "`sweet-spot` - `best-worst`" in page
