"""The one command over the stages (bench/experiments/llm_evidence/reproduce.py): its workers share a grid
cell by cell, a rerun writes nothing new, and a deadline keeps what was written and judges nothing."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.train

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def reproduce():
    sys.path.insert(0, str(ROOT / "bench" / "experiments"))
    from llm_evidence import reproduce, stage_b

    return reproduce, stage_b


def run(reproduce, capsys, *args) -> dict:
    assert reproduce.main(list(args)) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_two_workers_write_the_whole_stage_b_grid_and_a_rerun_writes_nothing(reproduce, chat_lm, tmp_path, capsys):
    rp, stage_b = reproduce
    args = ["--quick", "--stages", "b", "--workers", "2", "--model", str(chat_lm), "--results", str(tmp_path)]
    s = run(rp, capsys, *args)
    cfg = stage_b.with_budget(stage_b.QUICK, stage_b.PREDICTIONS)
    want = sorted(n for n, _ in stage_b.cells(cfg, stage_b.stage_b_tasks(stage_b.PREDICTIONS)))
    cell_dir = tmp_path / "stage_b"
    assert sorted(p.stem for p in cell_dir.glob("*.json")) == want
    assert s["complete_run"] and s["reports"]["stage_b"]["complete"]
    assert s["reports"]["stage_b"]["cells_done"] == len(want)
    before = {p.name: p.stat().st_mtime_ns for p in cell_dir.glob("*.json")}
    assert run(rp, capsys, *args)["complete_run"]
    assert before == {p.name: p.stat().st_mtime_ns for p in cell_dir.glob("*.json")}


def test_a_deadline_stops_the_run_and_the_reports_judge_nothing(reproduce, chat_lm, tmp_path, capsys):
    rp, _ = reproduce
    s = run(rp, capsys, "--quick", "--minutes", "0", "--model", str(chat_lm), "--results", str(tmp_path))
    assert not s["complete_run"]
    assert set(s["reports"]) == {"stage_a", "stage_b", "stage_c"}
    assert not s["reports"]["stage_b"]["complete"]
    assert "Cells complete: 0 of" in (tmp_path / "stage_b.md").read_text()


@pytest.mark.parametrize("bad", [["--stages", "d"], ["--workers", "0"], ["--quick", "--device", "cuda"]])
def test_bad_arguments_are_refused(reproduce, bad, tmp_path):
    rp, _ = reproduce
    with pytest.raises(SystemExit):
        rp.main([*bad, "--results", str(tmp_path)])
    assert not any(tmp_path.iterdir())  # refused before any work
