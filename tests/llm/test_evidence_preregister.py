"""The pre-registration script (bench/experiments/llm_evidence/preregister.py) in miniature on the tiny offline model: every
pilot file written (base, chat, lora), the LoRA warm-up disjoint from the scored prompts, the predictions written,
and a rerun that skips the finished pilots."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.train

ROOT = Path(__file__).resolve().parents[2]


def test_quick_preregistration(chat_lm, tmp_path):
    sys.path.insert(0, str(ROOT / "bench" / "experiments"))
    from llm_evidence import preregister

    out = tmp_path / "v2"
    args = ["--quick", "--model", str(chat_lm), "--results", str(out), "--threads", "1"]
    assert preregister.main(args) == 0
    cfg = preregister.QUICK
    files = sorted(p.name for p in (out / "pilots").glob("*.json"))
    assert files == sorted(f"{f}-{p}.json" for f in cfg["families"] for p in cfg["pilots"])
    for f in cfg["families"]:
        lora = json.loads((out / "pilots" / f"{f}-lora.json").read_text())["result"]
        scored = {r["prompt_id"] for r in lora["losses"]}
        assert len(scored) == cfg["n_pilot"] and len(lora["losses"]) == cfg["n_pilot"] * cfg["pool_size"]
        assert lora["warm_prompt_ids"] and scored.isdisjoint(lora["warm_prompt_ids"])
        assert lora["prompt_format"] == "chat" and lora["warm"].startswith("lora:")
        base = json.loads((out / "pilots" / f"{f}-base.json").read_text())["result"]
        assert base["prompt_format"] == "plain" and {r["prompt_id"] for r in base["losses"]} == scored
        assert "identified" in base["report"]
    pred = json.loads((out / "predictions.json").read_text())
    assert pred["n_pilot_files"] == len(files) and pred["choice"]["warm_pilot"] == "lora"
    text = (out / "PREDICTIONS.md").read_text()
    assert "Stage A, ratio -> gain" in text and "## The rule used to choose" in text
    for f in cfg["families"]:
        assert f"| {f} | lora |" in text
    before = {p.name: p.stat().st_mtime_ns for p in (out / "pilots").glob("*.json")}
    assert preregister.main(args) == 0  # a rerun skips every finished pilot
    assert before == {p.name: p.stat().st_mtime_ns for p in (out / "pilots").glob("*.json")}
