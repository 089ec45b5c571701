"""Stage B (bench/experiments/llm_evidence/stage_b.py): the fixed budget's arithmetic, the best-K bootstrap on
synthetic cells whose answer is known, the pre-registered verdict, and the runner in miniature on the tiny
offline model (every cell written, a rerun skips them all, the report)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.train

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def stage_b():
    sys.path.insert(0, str(ROOT / "bench" / "experiments"))
    from llm_evidence import stage_b

    return stage_b


@pytest.fixture(scope="module")
def report(stage_b):
    from llm_evidence import stage_b_report

    return stage_b_report


# ------------------------------------------------------------------ the budget


def test_the_full_budget_keeps_stage_a_prompts_at_k4(stage_b):
    from llm_evidence.stage_a import FULL as A

    pred = json.loads(stage_b.PREDICTIONS.read_text())
    cfg = stage_b.with_budget(stage_b.FULL, stage_b.PREDICTIONS)
    assert cfg["cost_ratio"] == pred["cost_ratio"]
    assert cfg["budget"] == A["n_train"] * (pred["cost_ratio"] + 4)
    n = {k: stage_b.prompts_for(cfg["budget"], k, cfg["cost_ratio"]) for k in cfg["ks"]}
    assert n[4] == A["n_train"]
    assert all(n[a] > n[b] for a, b in zip(cfg["ks"], cfg["ks"][1:]))  # more responses, fewer prompts
    # the rest of Stage A's training settings are kept
    assert all(cfg[k] == A[k] for k in ("pool_size", "steps", "batch_size", "lr", "lora_r", "prompt_format",
                                        "n_heldout", "n_samples", "max_new_tokens"))


@settings(max_examples=300, deadline=None)
@given(budget=st.integers(1, 10**6), k=st.integers(1, 64), cost=st.integers(1, 1000))
def test_prompts_for_is_the_most_the_budget_pays_for(stage_b, budget, k, cost):
    from mrt_fast import MrtInputError

    if budget < cost + k:
        with pytest.raises(MrtInputError, match="pays for no prompt"):
            stage_b.prompts_for(budget, k, cost)
        return
    n = stage_b.prompts_for(budget, k, cost)
    assert n * (cost + k) <= budget < (n + 1) * (cost + k)


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 500), k=st.integers(1, 64), cost=st.integers(1, 100))
def test_the_reference_k_keeps_its_prompts(stage_b, n, k, cost):
    assert stage_b.prompts_for(stage_b.budget_for(n, k, cost), k, cost) == n


@pytest.mark.parametrize("args", [(0, 1, 10), (672, 0, 10), (672, 1, -1), (672.0, 1, 10), (True, 1, 10)])
def test_bad_budget_inputs_are_named(stage_b, args):
    from mrt_fast import MrtInputError

    with pytest.raises(MrtInputError, match="must be a positive whole number"):
        stage_b.prompts_for(*args)


def test_cells_are_seed_major_with_their_own_prompt_counts(stage_b):
    pred = json.loads(stage_b.PREDICTIONS.read_text())
    tasks = stage_b.stage_b_tasks(stage_b.PREDICTIONS)
    assert tasks == pred["choice"]["stage_b"] and len(tasks) == 2
    cfg = stage_b.with_budget(stage_b.FULL, stage_b.PREDICTIONS)
    todo = stage_b.cells(cfg, tasks)
    assert len(todo) == 2 * 4 * len(cfg["seeds"]) and len(cfg["seeds"]) >= 3 and cfg["ks"] == [1, 2, 4, 8]
    seeds = [s["seed"] for _, s in todo]
    assert seeds == sorted(seeds)
    for name, s in todo:
        assert name == f"{s['task']}-k{s['k']}-s{s['seed']}"
        assert s["n_train"] * (cfg["cost_ratio"] + s["k"]) <= cfg["budget"] < (s["n_train"] + 1) * (
            cfg["cost_ratio"] + s["k"])


def test_training_rows_spend_the_budget(stage_b):
    from llm_evidence.families import training_prompts
    from llm_evidence.stage_a import training_rows

    cfg = stage_b.with_budget(stage_b.FULL, stage_b.PREDICTIONS)
    runner = stage_b.Runner.__new__(stage_b.Runner)  # the hooks only, no model
    runner.cfg, runner.sha, runner.model_label = cfg, "0" * 64, "m"
    for name, spec in stage_b.cells(cfg, ["range40"])[:4]:
        tc = runner.train_cfg(spec)
        rows = training_rows("range40", spec["k"], spec["seed"], tc)
        items = {it.prompt_id: it for it in training_prompts("range40", spec["seed"], spec["n_train"])}
        assert rows.height == spec["n_train"] * spec["k"] and set(rows["prompt_id"]) == set(items)
        assert all(items[p].check(r) for p, r in zip(rows["prompt_id"], rows["response"]))
        assert rows.height + cfg["cost_ratio"] * len(items) <= cfg["budget"]
        st_ = runner.settings(spec)
        assert st_["n_train"] == spec["n_train"] and st_["budget"] == cfg["budget"] and st_["steps"] == cfg["steps"]


# ------------------------------------------------------------------ the statistics on synthetic cells


def _losses(curve, n_seeds=3, n_prompts=64, noise=0.05, seed=0):
    """L[k, s, p] = curve[k] + a prompt effect shared by every K + a seed effect + noise."""
    rng = np.random.default_rng(seed)
    prompt = rng.normal(0, 0.5, n_prompts)
    seed_eff = rng.normal(0, 0.02, (len(curve), n_seeds, 1))
    return (np.asarray(curve)[:, None, None] + prompt[None, None, :] + seed_eff
            + rng.normal(0, noise, (len(curve), n_seeds, n_prompts)))


KS = [1, 2, 4, 8]


def test_best_k_is_found_where_the_curve_has_its_minimum(report):
    lo = _losses([1.30, 1.20, 1.25, 1.35])  # minimum at K = 2
    hi = _losses([1.40, 1.30, 1.20, 1.10], seed=1)  # minimum at K = 8
    assert report.best_k(lo, KS) == 2 and report.best_k(hi, KS) == 8
    boot = report.bootstrap_best_k({"lo": lo, "hi": hi}, KS, n_boot=300)
    d_lo, d_hi = report.distribution(boot["best"]["lo"], KS), report.distribution(boot["best"]["hi"], KS)
    assert d_lo[2] > 0.95 and d_hi[8] > 0.95 and sum(d_lo.values()) == pytest.approx(1.0)
    assert report.most_frequent(d_lo) == 2 and report.most_frequent(d_hi) == 8
    assert report.share_below(boot["best"]["lo"], boot["best"]["hi"]) > 0.95
    assert report.share_below(boot["best"]["hi"], boot["best"]["lo"]) < 0.05


def test_the_bootstrap_pairs_k_on_the_same_draws(report):
    # a prompt effect 100x the K differences: unpaired draws would scatter the best K, paired ones do not
    rng = np.random.default_rng(3)
    prompt = rng.normal(0, 5.0, 64)
    x = np.array([[c + prompt] * 3 for c in (1.3, 1.2, 1.25, 1.35)])
    boot = report.bootstrap_best_k({"t": x}, KS, n_boot=200)
    assert report.distribution(boot["best"]["t"], KS)[2] == 1.0


def test_a_flat_curve_spreads_the_best_k(report):
    flat = _losses([1.2, 1.2, 1.2, 1.2], noise=0.3)
    boot = report.bootstrap_best_k({"t": flat}, KS, n_boot=300)
    d = report.distribution(boot["best"]["t"], KS)
    assert max(d.values()) < 0.9 and sum(v > 0 for v in d.values()) >= 3


def test_ties_go_to_the_smallest_k(report):
    x = np.ones((4, 2, 5))
    assert report.best_k(x, KS) == 1 and report.most_frequent({1: 0.4, 2: 0.4, 4: 0.2, 8: 0.0}) == 1


def _pred(ci_lo, ci_hi):
    return {"by_family": {"lo": {"chat": {"k_star": 1.5, "k_star_ci": ci_lo}, "base": {"k_star": 6.0,
                                                                                   "k_star_ci": ci_lo}},
                          "hi": {"chat": {"k_star": 5.0, "k_star_ci": ci_hi}, "base": {"k_star": 2.0,
                                                                                   "k_star_ci": ci_hi}}}}


def test_the_verdict(report):
    best = {"lo": np.array([2] * 95 + [8] * 5), "hi": np.array([8] * 100)}
    ok = report.pilot_check(_pred([1.0, 2.5], [6.0, 9.0]), "chat", ["lo", "hi"], best, KS)
    assert ok["low"] == "lo" and ok["share_below"] == pytest.approx(0.95) and ok["mode"] == {"lo": 2, "hi": 8}
    assert report.verdict(ok, complete=True).startswith("PASS")
    assert report.verdict(ok, complete=False).startswith("not judged")
    # the share is below 90%
    few = report.pilot_check(_pred([1.0, 2.5], [6.0, 9.0]), "chat", ["lo", "hi"],
                             {"lo": np.array([2] * 85 + [8] * 15), "hi": best["hi"]}, KS)
    assert few["share_below"] == pytest.approx(0.85) and report.verdict(few, True).startswith("FAIL")
    # no grid K inside [4.07, 6.04]: read at the grid's resolution (AMENDMENT.md) it is {4, 8}, which holds 8
    wide = report.pilot_check(_pred([1.0, 2.5], [4.07, 6.04]), "chat", ["lo", "hi"], best, KS)
    assert wide["grid_in_interval"]["hi"] == [] and not wide["mode_in_interval"]["hi"]
    assert wide["grid_interval"]["hi"] == [4, 8] and wide["mode_in_grid_interval"]["hi"]
    assert report.verdict(wide, True).startswith("PASS")
    # a mode outside its grid reading: [4.07, 5.5] reads as {4}
    out = report.pilot_check(_pred([1.0, 2.5], [4.07, 5.5]), "chat", ["lo", "hi"], best, KS)
    assert out["grid_interval"]["hi"] == [4] and not out["mode_in_grid_interval"]["hi"]
    assert report.verdict(out, True).startswith("FAIL")
    # the base pilot orders the tasks the other way: its low-K* task is "hi"
    base = report.pilot_check(_pred([1.0, 2.5], [6.0, 9.0]), "base", ["lo", "hi"], best, KS)
    assert base["low"] == "hi" and base["share_below"] == 0.0 and report.verdict(base, True).startswith("FAIL")
    assert report.verdict(report.pilot_check(_pred([1, 2], [6, 9]), "chat", ["lo", "hi"], {}, KS),
                          True).startswith("not computed")


def _write_cells(stage_b, d, cfg, tasks, sha, curves, seeds=None, rng_seed=0):
    from llm_evidence.cell_files import write_atomic

    for ti, t in enumerate(tasks):
        x = _losses(curves[t], n_seeds=len(cfg["seeds"]), n_prompts=cfg["n_heldout"], seed=rng_seed + ti)
        for ki, k in enumerate(cfg["ks"]):
            for si, s in enumerate(cfg["seeds"]):
                if seeds is not None and s not in seeds:
                    continue
                write_atomic(d / f"{t}-k{k}-s{s}.json", {
                    "cell": f"{t}-k{k}-s{s}", "spec": {"kind": "train", "task": t, "k": k, "seed": s},
                    "settings": {"predictions_sha256": sha},
                    "result": {"loss": x[ki, si].tolist(), "mean_loss": float(x[ki, si].mean()), "n_prompts": 1, "greedy_valid_rate": 0.5,
                               "sample_valid_rate": 0.5}})


def _synthetic(stage_b, base):
    """The design ``base`` with the predictions' budget, its tasks, the predictions' SHA-256, the low- and
    high-K* task, and loss curves whose best K are 1 (low) and 4 (high)."""
    cfg = stage_b.with_budget(base, stage_b.PREDICTIONS)
    tasks = stage_b.stage_b_tasks(stage_b.PREDICTIONS)
    pred = json.loads(stage_b.PREDICTIONS.read_text())
    sha = stage_b.stage_a.sha256(stage_b.PREDICTIONS)
    lo, hi = sorted(tasks, key=lambda t: pred["by_family"][t]["chat"]["k_star"])
    return cfg, tasks, sha, lo, hi, {lo: [1.20, 1.25, 1.30, 1.40], hi: [1.40, 1.30, 1.20, 1.25]}


def test_report_on_synthetic_cells(stage_b, report, tmp_path):
    cfg, tasks, sha, lo, hi, curves = _synthetic(stage_b, stage_b.FULL)  # best K 1 and 4
    part = tmp_path / "part"
    _write_cells(stage_b, part, cfg, tasks, sha, curves, seeds=[0])
    s = report.write_report(part, tmp_path / "part.md", cfg, tasks, stage_b.PREDICTIONS, n_boot=100)
    text = (tmp_path / "part.md").read_text()
    assert s["cells_done"] == 8 and not s["complete"]
    assert "PASS" not in text and "FAIL" not in text and "not judged" in text
    one = tmp_path / "one"  # a single cell: no seed with every K, its loss shown unpaired, no best K
    _write_cells(stage_b, one, dict(cfg, ks=[1], seeds=[0]), tasks[:1], sha, {tasks[0]: [1.2]})
    s = report.write_report(one, tmp_path / "one.md", cfg, tasks, stage_b.PREDICTIONS, n_boot=50)
    rep = json.loads((tmp_path / "one.json").read_text())
    assert s["cells_done"] == 1 and "best_k" not in rep["tasks"][tasks[0]]
    assert "(unpaired)" in (tmp_path / "one.md").read_text() and s["verdict"]["chat"].startswith("not computed")
    full = tmp_path / "full"
    _write_cells(stage_b, full, cfg, tasks, sha, curves)
    s = report.write_report(full, tmp_path / "full.md", cfg, tasks, stage_b.PREDICTIONS, n_boot=200)
    rep = json.loads((tmp_path / "full.json").read_text())
    assert s["complete"] and rep["cells_done"] == 24
    c = rep["checks"]["chat"]
    assert c["low"] == lo and c["share_below"] > 0.95 and c["mode"] == {lo: 1, hi: 4}
    expected = all(c["mode"][t] in report.grid_interval(c["k_star_ci"][t], KS) for t in tasks)
    assert s["verdict"]["chat"].startswith("PASS" if expected else "FAIL")
    assert rep["tasks"][lo]["best_k"] == 1 and rep["n_train"] == {"1": 61, "2": 56, "4": 48, "8": 37}
    text = (tmp_path / "full.md").read_text()
    assert "Cells complete: 24 of 24" in text and "(the predictions’ choice)" in text


def test_the_amendment_s_grid_readings_of_the_predictions(stage_b, report):
    """AMENDMENT.md names the grid readings of both pilots' intervals; the code gives the same."""
    pred = json.loads(stage_b.PREDICTIONS.read_text())
    got = {(p, t): report.grid_interval(pred["by_family"][t][p]["k_star_ci"], KS)
           for p in ("chat", "base") for t in ("mixture", "range40")}
    assert got == {("chat", "mixture"): [1], ("chat", "range40"): [4, 8], ("base", "mixture"): [1, 2],
                   ("base", "range40"): [4]}


@settings(max_examples=200, deadline=None)
@given(st.floats(0.01, 100), st.floats(0, 10), st.sampled_from([[1, 2, 4, 8], [1, 2, 3, 5, 8, 13], [2, 16]]))
def test_the_grid_reading_is_the_grid_run_between_the_ends_nearest_neighbours(report, lo, width, ks):
    hi = lo + width
    got = report.grid_interval([lo, hi], ks)
    logk = np.log(ks)
    near = [ks[int(np.argmin(np.abs(logk - np.log(v))))] for v in (lo, hi)]
    # a contiguous, non-empty run of the grid from the K nearest lo to the K nearest hi (in log K)
    assert got and got == [k for k in ks if near[0] <= k <= near[1]]
    # every grid K inside the literal interval is in it, and no K is further out than a grid step
    assert all(k in got for k in ks if lo <= k <= hi)
    inside = [k for k in ks if lo <= k <= hi]
    if inside:
        assert len(got) <= len(inside) + 2


def test_judged_seeds_take_the_longest_complete_prefix_of_at_least_min_seeds(report):
    from llm_evidence.stage_a_report import judged_seeds

    cfg = {"ks": [1, 4], "seeds": [0, 1, 2, 3, 4], "min_seeds": 3}
    names = lambda seeds: {f"t-k{k}-s{s}": {} for s in seeds for k in (1, 4)}  # noqa: E731
    assert judged_seeds(names([0, 1, 2, 4]), cfg, ["t"], complete=False) == ([0, 1, 2], True)
    # seed 1 missing: the prefix is [0] however many later seeds are done
    assert judged_seeds(names([0, 2, 3, 4]), cfg, ["t"], complete=False) == ([0, 1, 2, 3, 4], False)
    # one K of seed 2 missing
    cells = names([0, 1, 2, 3])
    del cells["t-k4-s2"]
    assert judged_seeds(cells, cfg, ["t"], complete=False) == ([0, 1, 2, 3, 4], False)
    # without min_seeds only the complete grid is judged
    no_min = {k: v for k, v in cfg.items() if k != "min_seeds"}
    assert judged_seeds(names([0, 1, 2, 3]), no_min, ["t"], complete=False)[1] is False
    assert judged_seeds(names([0, 1, 2, 3, 4]), no_min, ["t"], complete=True) == ([0, 1, 2, 3, 4], True)


def test_a_gpu_variant_report_judges_its_seed_prefix(stage_b, report, tmp_path):
    cfg, tasks, sha, lo, hi, curves = _synthetic(stage_b, stage_b.GPU_VARIANT)
    _write_cells(stage_b, tmp_path / "two", cfg, tasks, sha, curves, seeds=[0, 1, 3])
    s = report.write_report(tmp_path / "two", tmp_path / "two.md", cfg, tasks, stage_b.PREDICTIONS, n_boot=50)
    assert s["judged_on_seeds"] is None and s["verdict"]["chat"].startswith("not judged")
    _write_cells(stage_b, tmp_path / "three", cfg, tasks, sha, curves, seeds=[0, 1, 2, 4])
    s = report.write_report(tmp_path / "three", tmp_path / "three.md", cfg, tasks, stage_b.PREDICTIONS, n_boot=50)
    rep = json.loads((tmp_path / "three.json").read_text())
    assert s["judged_on_seeds"] == [0, 1, 2] and s["verdict"]["chat"].startswith(("PASS", "FAIL"))
    assert rep["tasks"][lo]["seeds"] == [0, 1, 2]  # seed 4's cells are left out of the statistics
    assert "judged on seeds 0, 1, 2" in (tmp_path / "three.md").read_text()


# ------------------------------------------------------------------ the runner in miniature


def test_quick_stage_b_writes_every_cell_and_reruns_skip(stage_b, chat_lm, tmp_path):
    out = tmp_path / "v2"
    args = ["--quick", "--model", str(chat_lm), "--results", str(out), "--threads", "1", "--n-boot", "50"]
    assert stage_b.main(args) == 0
    cfg = stage_b.with_budget(stage_b.QUICK, stage_b.PREDICTIONS)
    tasks = stage_b.stage_b_tasks(stage_b.PREDICTIONS)
    cell_dir = out / "stage_b"
    todo = stage_b.cells(cfg, tasks)
    assert sorted(p.stem for p in cell_dir.glob("*.json")) == sorted(n for n, _ in todo)
    sha = stage_b.stage_a.sha256(stage_b.PREDICTIONS)
    for name, spec in todo:
        d = json.loads((cell_dir / f"{name}.json").read_text())
        r = d["result"]
        assert d["settings"]["predictions_sha256"] == sha and d["settings"]["budget"] == cfg["budget"]
        assert len(r["train_loss"]) == cfg["steps"]  # matched steps at every K
        assert r["n_prompts"] == spec["n_train"] and r["n_pairs"] == spec["k"] * spec["n_train"]
        assert len(r["loss"]) == cfg["n_heldout"] and all(v > 0 for v in r["loss"])
    rep = json.loads((out / "stage_b.json").read_text())
    assert rep["complete"] and rep["cells_done"] == len(todo)
    for t in tasks:
        assert sum(rep["tasks"][t]["best_k_distribution"].values()) == pytest.approx(1.0)
    assert f"Cells complete: {len(todo)} of {len(todo)}" in (out / "stage_b.md").read_text()
    before = {p.name: p.stat().st_mtime_ns for p in cell_dir.glob("*.json")}
    assert stage_b.main(args) == 0  # a rerun skips every finished cell
    assert before == {p.name: p.stat().st_mtime_ns for p in cell_dir.glob("*.json")}
