"""The Stage A runner (bench/experiments/llm_evidence/stage_a.py) in miniature on the tiny offline model: one cell file per
(task, K, seed) and untrained model, each seed on its own training prompts, K responses per prompt from the valid
answers, the same steps for every K, the held-out evaluation, the report, and a rerun that skips every cell."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.train

ROOT = Path(__file__).resolve().parents[2]
@pytest.fixture(scope="module")
def stage_a():
    sys.path.insert(0, str(ROOT / "bench" / "experiments"))
    from llm_evidence import stage_a

    return stage_a


def test_cells_are_seed_major_and_tasks_come_from_the_predictions(stage_a):
    pred = json.loads(stage_a.PREDICTIONS.read_text())
    tasks = stage_a.stage_a_tasks(stage_a.PREDICTIONS)
    assert tasks == pred["choice"]["stage_a"]
    names = [n for n, s in stage_a.cells(stage_a.FULL, tasks) if s["kind"] == "train"]
    assert len(names) == len(tasks) * len(stage_a.FULL["ks"]) * len(stage_a.FULL["seeds"])
    seeds = [int(n.rsplit("-s", 1)[1]) for n in names]
    assert seeds == sorted(seeds)  # every cell of seed 0 before any of seed 1, ...
    assert set(stage_a.FULL["ks"]) == {1, 4} and len(stage_a.FULL["seeds"]) >= 4


def test_parts_share_the_grid_once(stage_a):
    import argparse

    todo = stage_a.cells(stage_a.FULL, stage_a.stage_a_tasks(stage_a.PREDICTIONS))
    for n in (1, 2, 3):
        parts = [stage_a.part_of(todo, i, n) for i in range(n)]
        assert sorted(c for p in parts for c in p) == sorted(todo)  # every cell in exactly one part
        for p in parts:
            assert p == [c for c in todo if c in p]  # each part keeps the run order
    assert stage_a.parse_part("1/2") == (1, 2)
    for bad in ("2/2", "x", "1/0", "-1/2"):
        with pytest.raises(argparse.ArgumentTypeError):
            stage_a.parse_part(bad)


def test_the_gpu_variant_is_the_amendment_s_design(stage_a):
    """AMENDMENT.md: K in {1, 2, 4}, seeds 0-5, 48 steps, judged on a prefix of at least 4 seeds; the rest as Stage A."""
    g, f = stage_a.GPU_VARIANT, stage_a.FULL
    assert g["ks"] == [1, 2, 4] and g["seeds"] == list(range(6)) and g["steps"] == 48 and g["min_seeds"] == 4
    assert {k: v for k, v in g.items() if k not in ("ks", "seeds", "steps", "min_seeds", "design_flag")} == \
        {k: v for k, v in f.items() if k not in ("ks", "seeds", "steps")}
    assert stage_a.design(False, True) == (g, "llm_evidence_v2_gpu")
    assert stage_a.design(False, False) == (f, "llm_evidence_v2")
    with pytest.raises(SystemExit, match="choose one"):
        stage_a.design(True, True)


def test_seeds_choose_the_training_cells_and_keep_the_untrained_ones(stage_a, tmp_path, monkeypatch):
    import argparse

    assert stage_a.parse_seeds("0, 2,5") == [0, 2, 5]
    for bad in ("", "a", "1;2"):
        with pytest.raises(argparse.ArgumentTypeError):
            stage_a.parse_seeds(bad)
    runner = stage_a.Runner.__new__(stage_a.Runner)  # the cell loop alone: no model
    runner.cfg, runner.tasks, runner.results, runner.sha = dict(stage_a.FULL), ["range3", "sum"], tmp_path, "x"
    runner.model_label = "m"
    runner.tok = type("Tok", (), {"eos_token": "</s>"})()
    ran = []
    monkeypatch.setattr(runner, "train_cell", lambda spec: ran.append(spec) or {"mean_loss": 1.0,
                        "greedy_valid_rate": 0.0, "sample_valid_rate": 0.0})
    monkeypatch.setattr(runner, "evaluate", lambda task, adapter, seed: ran.append({"kind": "base", "task": task})
                        or {"mean_loss": 1.0, "greedy_valid_rate": 0.0, "sample_valid_rate": 0.0})
    monkeypatch.setattr(runner, "device", "cpu", raising=False)
    monkeypatch.setattr(stage_a, "_threads", lambda: 1)
    out = runner.run(seeds=[1, 3])
    assert out["ran"] == 2 + 2 * 2 * 2  # both untrained cells, then seeds 1 and 3 of each task x K
    assert sorted({s["seed"] for s in ran if s["kind"] == "train"}) == [1, 3]
    assert runner.run(seeds=[1, 3])["ran"] == 0  # written cells are skipped
    # a tokenizer that ends answers with another token gives other cells: every one is redone
    runner.tok.eos_token = "<|im_start|>"
    assert runner.run(seeds=[1, 3])["ran"] == 2 + 2 * 2 * 2
    assert json.loads((tmp_path / "sum-k4-s3.json").read_text())["settings"]["eos_token"] == "<|im_start|>"


def test_training_rows_keep_k_valid_answers_of_the_seeds_own_prompts(stage_a):
    from llm_evidence.families import heldout_prompts, training_prompts

    cfg = dict(stage_a.FULL, n_train=12)
    for k in (1, 4):
        rows = stage_a.training_rows("range3", k, 0, cfg)
        items = {it.prompt_id: it for it in training_prompts("range3", 0, 12)}
        assert rows.height == 12 * k and set(rows["prompt_id"]) == set(items)
        assert all(items[p].check(r) for p, r in zip(rows["prompt_id"], rows["response"]))
        assert set(rows["prompt_id"]).isdisjoint(it.prompt_id for it in heldout_prompts("range3"))
    other = stage_a.training_rows("range3", 1, 1, cfg)
    assert set(other["prompt_id"]) != set(stage_a.training_rows("range3", 1, 0, cfg)["prompt_id"])


def test_quick_stage_a_writes_every_cell_and_reruns_skip(stage_a, chat_lm, tmp_path):
    out = tmp_path / "v2"
    args = ["--quick", "--model", str(chat_lm), "--results", str(out), "--threads", "1"]
    assert stage_a.main(args) == 0
    cfg = stage_a.QUICK
    tasks = stage_a.stage_a_tasks(stage_a.PREDICTIONS, cfg["n_tasks"])
    cell_dir = out / "stage_a"
    assert sorted(p.stem for p in cell_dir.glob("*.json")) == sorted(n for n, _ in stage_a.cells(cfg, tasks))
    sha = stage_a.sha256(stage_a.PREDICTIONS)
    prompts = {}
    for t in tasks:
        base = json.loads((cell_dir / f"{t}-base.json").read_text())
        assert len(base["result"]["loss"]) == cfg["n_heldout"] and "n_train" not in base["settings"]
        for s in cfg["seeds"]:
            for k in cfg["ks"]:
                d = json.loads((cell_dir / f"{t}-k{k}-s{s}.json").read_text())
                r = d["result"]
                assert d["settings"]["predictions_sha256"] == sha and d["settings"]["steps"] == cfg["steps"]
                assert len(r["train_loss"]) == cfg["steps"]  # matched steps: the same for every K
                assert r["n_pairs"] == k * cfg["n_train"] and r["n_prompts"] == cfg["n_train"]
                assert len(r["loss"]) == cfg["n_heldout"] and all(v > 0 for v in r["loss"])
                assert sum(r["n_answers"]) == len(r["answer_loss"])
                assert len(r["samples"]) == cfg["n_heldout"] and len(r["samples"][0]) == cfg["n_samples"]
                assert 0 <= r["greedy_valid_rate"] <= 1 and 0 <= r["sample_valid_rate"] <= 1
                assert set(r["train_prompt_ids"]).isdisjoint(base["result"]["prompt_ids"])
                prompts.setdefault((t, s), set()).update(r["train_prompt_ids"])
        assert prompts[(t, 0)] != prompts[(t, 1)]  # each seed draws its own training prompts
    text = (out / "stage_a.md").read_text()
    n = len(stage_a.cells(cfg, tasks))
    assert f"Cells complete: {n} of {n}" in text and "Spearman" in text
    rep = json.loads((out / "stage_a.json").read_text())
    assert rep["complete"] and set(rep["used"]) == set(tasks)
    assert set(rep["correlations"]) == {f"{p}:{x}" for p in ("base", "chat")
                                        for x in ("log ratio", "log #valid", "V_y|x")}
    for e in rep["correlations"].values():
        lo, hi = e["spearman"]["interval"]
        assert lo <= e["spearman"]["value"] <= hi and 0 < e["spearman"]["p_exact"] <= 1
    before = {p.name: p.stat().st_mtime_ns for p in cell_dir.glob("*.json")}
    assert stage_a.main(args) == 0  # a rerun skips every finished cell
    assert before == {p.name: p.stat().st_mtime_ns for p in cell_dir.glob("*.json")}


def test_report_of_a_partial_grid_gives_no_verdict(stage_a, tmp_path):
    from llm_evidence.stage_a_report import write_report

    cfg = stage_a.QUICK
    tasks = stage_a.stage_a_tasks(stage_a.PREDICTIONS, cfg["n_tasks"])
    out = tmp_path / "stage_a.md"
    summary = write_report(tmp_path / "none", out, cfg, tasks, stage_a.PREDICTIONS,
                           ROOT / "bench" / "results" / "llm_evidence_v2" / "pilots", n_boot=20)
    assert summary["cells_done"] == 0 and summary["complete_seeds"] == []
    text = out.read_text()
    n = len(stage_a.cells(cfg, tasks))
    assert f"Cells complete: 0 of {n}" in text and "judged only on the full grid" in text
    assert "PASS" not in text and "FAIL" not in text


def test_cached_greedy_answers_equal_generate(stage_a, chat_lm):
    import torch

    from llm_evidence.heldout import generate_answers
    from mrt_fast.llm.models import load_causal_lm, load_tokenizer, prompt_ids

    tok = load_tokenizer(str(chat_lm))
    net = load_causal_lm(str(chat_lm))
    prompts = ["Name a number.", "Name a whole number strictly between 10 and 14. Reply with the number only.", "x"]
    greedy, samples = generate_answers(net, tok, prompts, n_samples=3, max_new_tokens=5, seed=0,
                                       prompt_format="chat", batch_size=2)
    assert len(greedy) == 3 and [len(s) for s in samples] == [3, 3, 3]
    for p, g in zip(prompts, greedy):  # one prompt at a time, no padding, transformers' own greedy search
        x = torch.tensor([prompt_ids(tok, p, "chat")])
        out = net.generate(input_ids=x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=5,
                           pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)[0, x.shape[1]:].tolist()
        out = out[: out.index(tok.eos_token_id)] if tok.eos_token_id in out else out
        assert g == tok.decode(out, skip_special_tokens=True)
    again = generate_answers(net, tok, prompts, n_samples=3, max_new_tokens=5, seed=0, prompt_format="chat",
                             batch_size=2)
    assert again == (greedy, samples)  # seeded
    other = generate_answers(net, tok, prompts, n_samples=3, max_new_tokens=5, seed=1, prompt_format="chat",
                             batch_size=2)
    assert other[0] == greedy and other[1] != samples
