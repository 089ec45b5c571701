"""The pre-registered Stage A statistics from the Stage A cells present (`stage_a.py`).

For each pilot (``base`` and ``chat``) and each predictor of a task's gain 1 - L(K=4) / L(K=1) — the log
ratio V_y|x / V_x (the law), and the two baselines, the mean log number of valid answers and V_y|x alone —
Spearman's rho and Kendall's tau over the tasks, each with its one-sided exact permutation p-value and a
two-level bootstrap interval (`stats.two_level_bootstrap`). A task's gain uses the seeds that have both of
its K cells; the pass criterion (rho's lower bound above 0, and the ratio's rho at least the baselines') is
judged only when every cell of the design is present.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from llm_evidence.cell_files import write_atomic
from llm_evidence.families import pilot_prompts
from llm_evidence.stats import (GainCells, PilotSummary, exact_p, gain, mean_value, percentile_interval,
                                pilot_ratio, two_level_bootstrap, STATS)

PILOTS = ("base", "chat")
COMMAND = "python bench/experiments/llm_evidence/stage_a.py"


def _v_y_given_x(s: PilotSummary, idx=None) -> float:
    return float((s.var if idx is None else s.var[idx]).mean())


#: the predictors of a task's gain: the law's and the two baselines'
PREDICTORS = {
    "log ratio": "log V_y|x / V_x of the pilot (the law)",
    "log #valid": "mean log number of valid answers of the pilot prompts (baseline)",
    "V_y|x": "V_y|x of the pilot alone (baseline)",
}


def load_cells(cell_dir: Path, predictions_sha: str) -> tuple[dict[str, dict], list[str]]:
    """The cells written for these predictions (by name), and the names of cells written for others."""
    cells, stale = {}, []
    for p in sorted(Path(cell_dir).glob("*.json")):
        d = json.loads(p.read_text())
        if "cell" not in d:
            continue
        if d["settings"].get("predictions_sha256") != predictions_sha:
            stale.append(d["cell"])
        else:
            cells[d["cell"]] = d
    return cells, stale


def pilot_inputs(pilots_dir: Path, task: str, pilot: str) -> dict:
    """The pilot's per-prompt summary (for the ratio and V_y|x) and its prompts' log numbers of valid answers."""
    d = json.loads((Path(pilots_dir) / f"{task}-{pilot}.json").read_text())
    losses = d["result"]["losses"]
    s = PilotSummary.from_losses([r["prompt_id"] for r in losses], [r["loss"] for r in losses])
    n = int(d["settings"]["n_pilot"])
    log_valid = np.array([math.log(len(it.valid)) for it in pilot_prompts(task, n)])
    return {"summary": s, "log_valid": log_valid}


def _predictor(name: str, inp: dict):
    if name == "log ratio":
        return inp["summary"], pilot_ratio, math.log
    if name == "log #valid":
        return inp["log_valid"], mean_value, None
    return inp["summary"], _v_y_given_x, None


def _value(v: float, transform) -> float:
    """A predictor's value as `two_level_bootstrap` uses it (-inf for a log of <= 0)."""
    if transform is None:
        return v
    return transform(v) if v > 0 else -math.inf


def paired_cells(cells: dict, task: str, ks: list[int], seeds: list[int]) -> tuple[GainCells | None, list[int]]:
    """The held-out losses (seeds x prompts) of the task's K = ks[0] and K = ks[-1] cells, over the seeds that
    have both."""
    lo_k, hi_k = ks[0], ks[-1]
    both = [s for s in seeds if f"{task}-k{lo_k}-s{s}" in cells and f"{task}-k{hi_k}-s{s}" in cells]
    if not both:
        return None, []
    lo = [cells[f"{task}-k{lo_k}-s{s}"]["result"]["loss"] for s in both]
    hi = [cells[f"{task}-k{hi_k}-s{s}"]["result"]["loss"] for s in both]
    return GainCells(np.array(lo), np.array(hi)), both


def gain_interval(c: GainCells, n_boot: int, seed: int = 0) -> list[float]:
    """A 95% interval of the task's gain, resampling its seeds and held-out prompts (the same draws for both K)."""
    rng = np.random.default_rng(seed)
    s, p = c.lo.shape
    reps = np.array([gain(c, rng.integers(0, s, s), rng.integers(0, p, p)) for _ in range(n_boot)])
    return list(percentile_interval(reps, 0.95, gain(c)))


def _rate(cells: dict, names: list[str], key: str) -> float:
    vals = [cells[n]["result"][key] for n in names if n in cells]
    return float(np.mean(vals)) if vals else math.nan


def stage_a_statistics(cells: dict, cfg: dict, tasks: list[str], pilots_dir: Path, n_boot: int) -> dict:
    ks, seeds = cfg["ks"], cfg["seeds"]
    per_task, gains = {}, {}
    for t in tasks:
        c, both = paired_cells(cells, t, ks, seeds)
        row: dict = {"seeds": both}
        for k in ks:
            names = [f"{t}-k{k}-s{s}" for s in seeds]
            row[f"loss_k{k}"] = _rate(cells, names, "mean_loss")
            row[f"greedy_valid_k{k}"] = _rate(cells, names, "greedy_valid_rate")
            row[f"sample_valid_k{k}"] = _rate(cells, names, "sample_valid_rate")
        row["greedy_valid_base"] = _rate(cells, [f"{t}-base"], "greedy_valid_rate")
        row["sample_valid_base"] = _rate(cells, [f"{t}-base"], "sample_valid_rate")
        row["loss_base"] = _rate(cells, [f"{t}-base"], "mean_loss")
        if c is not None:
            row["gain"] = gain(c)
            row["gain_ci"] = gain_interval(c, n_boot)
            gains[t] = c
        for p in PILOTS:
            inp = pilot_inputs(pilots_dir, t, p)
            row[f"ratio_{p}"] = pilot_ratio(inp["summary"])
            row[f"v_y_given_x_{p}"] = _v_y_given_x(inp["summary"])
            row["log_valid"] = mean_value(inp["log_valid"])
        per_task[t] = row
    used = [t for t in tasks if t in gains]
    corr: dict = {}
    if len(used) >= 3:
        for p in PILOTS:
            inputs = {t: pilot_inputs(pilots_dir, t, p) for t in used}
            for name in PREDICTORS:
                objs = [_predictor(name, inputs[t])[0] for t in used]
                _, fn, tr = _predictor(name, inputs[used[0]])
                x = [_value(fn(o, None), tr) for o in objs]
                g = [gain(gains[t]) for t in used]
                entry = {}
                for stat, f in STATS.items():
                    bs = two_level_bootstrap(objs, [gains[t] for t in used], f, n_boot=n_boot, seed=0,
                                             transform=tr, predictor=fn)
                    entry[stat] = {"value": f(x, g), "p_exact": exact_p(x, g, stat), "interval": bs["interval"]}
                corr[f"{p}:{name}"] = entry
    return {"tasks": per_task, "used": used, "correlations": corr}


def verdicts(corr: dict, complete: bool) -> dict:
    """Per pilot: pass when rho's lower bound > 0 and the ratio's rho >= each baseline's rho (full grid only)."""
    out = {}
    for p in PILOTS:
        if f"{p}:log ratio" not in corr:
            out[p] = "not computed (fewer than 3 tasks with both K cells)"
            continue
        rho = corr[f"{p}:log ratio"]["spearman"]
        lower_ok = rho["interval"][0] > 0
        beats = all(rho["value"] >= corr[f"{p}:{b}"]["spearman"]["value"] for b in PREDICTORS if b != "log ratio")
        what = (f"rho {rho['value']:.3f}, lower bound {rho['interval'][0]:.3f} "
                f"({'above' if lower_ok else 'not above'} 0); the ratio's rho is "
                f"{'at least' if beats else 'below'} " + ("both baselines'" if beats else "a baseline's"))
        if not complete:
            out[p] = f"not judged: the grid is incomplete ({what} on the cells present)"
        else:
            out[p] = ("PASS: " if lower_ok and beats else "FAIL: ") + what
    return out


def _f(v, d=3) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if isinstance(v, float) and math.isinf(v):
        return "∞" if v > 0 else "−∞"
    return f"{v:.{d}f}" if abs(v) >= 10 ** -d or v == 0 else f"{v:.{d}g}"


def _ci(ci) -> str:
    return f"[{_f(ci[0])}, {_f(ci[1])}]"


def eos_tokens(stats: dict) -> list[str]:
    """The eos tokens the cells recorded (cells from before the setting was recorded: none)."""
    return stats.get("eos_tokens", [])


def judged_seeds(cells: dict, cfg: dict, tasks: list[str], complete: bool) -> tuple[list[int], bool]:
    """The seeds the statistics use, and whether the pass criterion is judged on them: every seed when the grid
    is complete; else, for a design with ``min_seeds`` (AMENDMENT.md), the longest complete prefix of its seeds
    when that holds at least ``min_seeds``; else every seed's cells present, not judged."""
    if complete:
        return list(cfg["seeds"]), True
    need = cfg.get("min_seeds")
    prefix: list[int] = []
    for s in cfg["seeds"]:
        if not all(f"{t}-k{k}-s{s}" in cells for t in tasks for k in cfg["ks"]):
            break
        prefix.append(s)
    if need is not None and len(prefix) >= need:
        return prefix, True
    return list(cfg["seeds"]), False


def judging_rule(cfg: dict, judged_on: list[int] | None) -> str:
    """The sentence that says on which cells the pass criterion is judged."""
    if judged_on is not None and judged_on != list(cfg["seeds"]):
        return (f"The pass criterion is judged on seeds {', '.join(map(str, judged_on))}, the longest complete "
                f"prefix of the seeds (at least {cfg['min_seeds']}, AMENDMENT.md); the statistics below use "
                "those seeds' cells alone.")
    if judged_on is not None:
        return "The grid is complete and the pass criterion is judged on it."
    if cfg.get("min_seeds"):
        return (f"The pass criterion is judged on the longest complete prefix of the seeds once it holds "
                f"{cfg['min_seeds']} (AMENDMENT.md); until then the numbers below describe the cells present "
                "and no verdict is given.")
    return ("The pass criterion is judged only on the full grid; on a partial grid the numbers below describe "
            "the cells present and no verdict is given.")


def render(stats: dict, cfg: dict, tasks: list[str], n_done: int, n_cells: int, complete_seeds: list[int],
           stale: list[str], verdict: dict, settings: dict | None, judged_on: list[int] | None = None) -> str:
    ks = cfg["ks"]
    lines = ["# Stage A: does the pilot's ratio order the gain of K = 4 over K = 1?", "",
             f"From the cells present (`{COMMAND}{_flag(cfg)} --report`). Design: {len(tasks)} tasks ({', '.join(tasks)}, "
             f"chosen in `predictions.json`), K in {{{', '.join(map(str, ks))}}}, seeds "
             f"{', '.join(map(str, cfg['seeds']))}.", "",
             f"**Cells complete: {n_done} of {n_cells}** (the untrained model per task and every task x K x seed). "
             f"Seeds complete for every task and K: {', '.join(map(str, complete_seeds)) or 'none'}. "
             + judging_rule(cfg, judged_on)]
    if stale:
        lines += ["", f"Cells written for another predictions.json (left out): {', '.join(stale)}."]
    if settings:
        lines += ["", "Settings: " + ", ".join(f"{k} {v}" for k, v in settings.items() if k != "predictions_sha256")
                  + "."]
    if len(eos_tokens(stats)) > 1:
        lines += ["", "**The cells do not share one eos token** (the token answers are trained and scored to end "
                  f"with): {', '.join(eos_tokens(stats))}; their losses are not comparable."]
    lines += ["", "## Per task", "",
              f"Held-out loss L: mean over the {cfg['n_heldout']} held-out prompts of the mean per-token loss of each prompt's valid "
              "answers. Gain 1 − L(K=4) / L(K=1) over the seeds with both cells, 95% interval over seeds x prompts "
              "(paired). Valid rates: greedy answer / samples, graded by the family's checker; `untrained` is the "
              "model before training (the rate training has to beat).", "",
              "| task | ratio base | ratio chat | V_y\\|x chat | mean log #valid | seeds | L untrained | "
              + " | ".join(f"L K={k}" for k in ks) + " | gain | gain 95% CI | valid untrained | "
              + " | ".join(f"valid K={k}" for k in ks) + " |",
              "|---|" + "---|" * (9 + 2 * len(ks))]
    for t in tasks:
        r = stats["tasks"][t]
        lines.append(
            f"| {t} | {_f(r['ratio_base'])} | {_f(r['ratio_chat'])} | {_f(r['v_y_given_x_chat'])} | "
            f"{_f(r['log_valid'])} | {len(r['seeds'])} | {_f(r['loss_base'])} | "
            + " | ".join(_f(r[f"loss_k{k}"]) for k in ks) + f" | {_f(r.get('gain'))} | "
            + (_ci(r["gain_ci"]) if "gain_ci" in r else "–")
            + f" | {_f(r['greedy_valid_base'], 2)} / {_f(r['sample_valid_base'], 2)} | "
            + " | ".join(f"{_f(r[f'greedy_valid_k{k}'], 2)} / {_f(r[f'sample_valid_k{k}'], 2)}" for k in ks) + " |")
    lines += ["", "## Rank correlations with the gain", "",
              f"Over the {len(stats['used'])} tasks with both K cells. p: one-sided exact permutation p-value "
              "(all n! orderings); intervals: 95% two-level bootstrap (pilot prompts; held-out prompts x seeds).", "",
              "| pilot | predictor | Spearman ρ | ρ 95% CI | p | Kendall τ | τ 95% CI | p |",
              "|---|---|---|---|---|---|---|---|"]
    for key, e in stats["correlations"].items():
        p, name = key.split(":", 1)
        s, k = e["spearman"], e["kendall"]
        lines.append(f"| {p} | {name.replace('|', chr(92) + '|')} | {_f(s['value'])} | {_ci(s['interval'])} | {_f(s['p_exact'])} | "
                     f"{_f(k['value'])} | {_ci(k['interval'])} | {_f(k['p_exact'])} |")
    if not stats["correlations"]:
        lines.append("| – | – | fewer than 3 tasks with both K cells | | | | | |")
    lines += ["", "## Pass criterion", "",
              "Pre-registered: rho's lower bound above 0, and the ratio predicts at least as well as the baselines "
              "(its rho at least theirs).", ""]
    lines += [f"* {p} pilot: {verdict[p]}." for p in PILOTS]
    lines.append("")
    return "\n".join(lines)


def write_report(cell_dir: Path, out_md: Path, cfg: dict, tasks: list[str], predictions: Path, pilots_dir: Path,
                 n_boot: int | None = None) -> dict:
    import hashlib

    sha = hashlib.sha256(Path(predictions).read_bytes()).hexdigest()
    cells, stale = load_cells(cell_dir, sha)
    names = [f"{t}-base" for t in tasks] + [f"{t}-k{k}-s{s}" for s in cfg["seeds"] for t in tasks
                                            for k in cfg["ks"]]
    n_done = sum(n in cells for n in names)
    complete_seeds = [s for s in cfg["seeds"] if all(f"{t}-k{k}-s{s}" in cells for t in tasks for k in cfg["ks"])]
    complete = n_done == len(names)
    seeds, judged = judged_seeds(cells, cfg, tasks, complete)
    stats = stage_a_statistics(cells, dict(cfg, seeds=seeds), tasks, pilots_dir,
                               n_boot or (200 if len(cfg["seeds"]) < 4 else 2000))
    verdict = verdicts(stats["correlations"], judged)
    stats["eos_tokens"] = sorted({d["settings"].get("eos_token") for d in cells.values()} - {None})
    train = [d for d in cells.values() if d["spec"]["kind"] == "train"]
    settings = train[0]["settings"] if train else None
    judged_on = seeds if judged else None
    write_atomic(out_md, render(stats, cfg, tasks, n_done, len(names), complete_seeds, stale, verdict, settings,
                                judged_on))
    write_atomic(out_md.with_suffix(".json"), json.loads(json.dumps(
        {**stats, "cells_done": n_done, "cells": len(names), "complete_seeds": complete_seeds, "complete": complete,
         "judged_on_seeds": judged_on, "verdict": verdict, "predictions_sha256": sha}, default=str)))
    return {"cells_done": n_done, "cells": len(names), "complete_seeds": complete_seeds, "judged_on_seeds": judged_on,
            "verdict": verdict}


def _flag(cfg: dict) -> str:
    """The design's flag on the report's command line (the GPU variant's ``--gpu-variant``)."""
    return f" {cfg['design_flag']}" if cfg.get("design_flag") else ""
