"""The committed selector cells of the LLM evidence experiment (bench/results/llm_evidence) stay reproducible:
their training rows are selected again, row for row, from the committed pilot losses."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results" / "llm_evidence"
sys.path.insert(0, str(ROOT / "bench" / "experiments"))

from llm_evidence import run  # noqa: E402
from llm_evidence.tasks import build_task, split_task  # noqa: E402

CELLS = [(name, spec) for name, spec in run.cells(run.FULL) if name.startswith("select-")]


@pytest.fixture(scope="module")
def split():
    cfg = run.FULL
    return split_task(build_task(run.HIGH, cfg["n_train"] + cfg["n_heldout"]), cfg["n_train"], cfg["n_heldout"],
                      cfg["pool_size"], cfg["n_refs"])


@pytest.mark.parametrize("name,spec", CELLS, ids=[n for n, _ in CELLS])
def test_a_committed_selector_cell_keeps_the_same_rows(split, name, spec):
    path = RESULTS / f"{name}.json"
    if not path.exists():
        pytest.skip(f"{name} is not committed")
    want = json.loads(path.read_text())["result"]["kept"]
    assert run.kept_rows(split, spec, RESULTS).to_dicts() == want
