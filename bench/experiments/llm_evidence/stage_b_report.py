"""The pre-registered Stage B statistics from the Stage B cells present (`stage_b.py`).

Per task, the held-out losses of its cells (seeds x prompts per K) over the seeds that have every K. Each
bootstrap replicate resamples, per task, its seeds and its held-out prompts, the same draws for every K
(paired), and takes the task's best K: the argmin over K of the mean held-out reference loss (ties: the
smallest K). The report gives each task's distribution of the best K, the share of replicates in which the
low-K* task's best K is below the high-K* task's, and whether each task's most frequent best K lies in its
K* interval read at the grid's resolution (AMENDMENT.md: the grid K nearest each end of the interval in log K,
and those between), for the chat pilot (the warm pilot the predictions chose) and the base pilot. The pass
criterion is judged when every cell of the design is present or, for a design with ``min_seeds``, on the
longest complete prefix of its seeds holding at least that many.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np

from llm_evidence.cell_files import write_atomic
from llm_evidence.fixed_budget import prompts_for
from llm_evidence.stage_a_report import _ci, _f, _flag, judged_seeds, judging_rule, load_cells
from llm_evidence.stats import percentile_interval

PILOTS = ("chat", "base")
COMMAND = "python bench/experiments/llm_evidence/stage_b.py"
#: the share of replicates the low-K* task's best K must be below the high-K* task's in (pre-registered)
SHARE_NEEDED = 0.9


def loss_matrix(cells: dict, task: str, ks: list[int], seeds: list[int]) -> tuple[np.ndarray | None, list[int]]:
    """The task's held-out losses ``L[k, s, p]`` (K x seeds x prompts) over the seeds that have a cell at every K."""
    both = [s for s in seeds if all(f"{task}-k{k}-s{s}" in cells for k in ks)]
    if not both:
        return None, []
    return np.array([[cells[f"{task}-k{k}-s{s}"]["result"]["loss"] for s in both] for k in ks], dtype=np.float64), both


def best_k(losses: np.ndarray, ks: list[int], seeds: np.ndarray | None = None,
           prompts: np.ndarray | None = None) -> int:
    """The K of least mean held-out loss over the given seeds x prompts (all by default; repeats allowed; ties:
    the smallest K)."""
    x = losses
    if seeds is not None:
        x = x[:, seeds]
    if prompts is not None:
        x = x[:, :, prompts]
    return ks[int(np.argmin(x.reshape(len(ks), -1).mean(axis=1)))]


def bootstrap_best_k(losses: dict[str, np.ndarray], ks: list[int], n_boot: int, seed: int = 0) -> dict:
    """Per task, the best K of each replicate (its seeds and prompts resampled, the same draws for every K) and
    the replicates' mean loss per K. Tasks draw independently."""
    rng = np.random.default_rng(seed)
    best = {t: np.empty(n_boot, dtype=np.int64) for t in losses}
    means = {t: np.empty((n_boot, len(ks))) for t in losses}
    for b in range(n_boot):
        for t, x in losses.items():
            s = rng.integers(0, x.shape[1], x.shape[1])
            p = rng.integers(0, x.shape[2], x.shape[2])
            m = x[:, s][:, :, p].reshape(len(ks), -1).mean(axis=1)
            means[t][b] = m
            best[t][b] = ks[int(np.argmin(m))]
    return {"best": best, "means": means}


def distribution(best: np.ndarray, ks: list[int]) -> dict[int, float]:
    """The share of replicates whose best K is each K of the grid."""
    return {k: float(np.mean(best == k)) for k in ks}


def most_frequent(dist: dict[int, float]) -> int:
    """The most frequent best K (ties: the smallest K)."""
    top = max(dist.values())
    return min(k for k, v in dist.items() if v == top)


def share_below(best_lo: np.ndarray, best_hi: np.ndarray) -> float:
    """The share of replicates in which the low-K* task's best K is below the high-K* task's."""
    return float(np.mean(np.asarray(best_lo) < np.asarray(best_hi)))


def in_interval(k: int, interval) -> bool:
    lo, hi = (float(v) for v in interval)
    return lo <= k <= hi


def _nearest_in_log(v: float, ks: list[int]) -> int:
    """The grid K nearest ``v`` in log K (ties: the smaller K; v <= 0 -> the smallest K, v = inf -> the largest)."""
    if not v > 0:
        return min(ks)
    if math.isinf(v):
        return max(ks)
    return min(sorted(ks), key=lambda k: abs(math.log(k) - math.log(v)))


def grid_interval(interval, ks: list[int]) -> list[int]:
    """The K* interval read at the grid's resolution (AMENDMENT.md): the grid K nearest each end in log K and every
    grid K between them."""
    lo, hi = (_nearest_in_log(float(v), ks) for v in interval)
    return [k for k in sorted(ks) if lo <= k <= hi]


def pilot_check(pred: dict, pilot: str, tasks: list[str], best: dict[str, np.ndarray], ks: list[int]) -> dict:
    """The criterion's parts for one pilot's K*: which task is the low-K* one, the share, each task's mode in its
    interval (and which grid K lie in the interval at all)."""
    kstar = {t: float(pred["by_family"][t][pilot]["k_star"]) for t in tasks}
    ci = {t: [float(v) for v in pred["by_family"][t][pilot]["k_star_ci"]] for t in tasks}
    lo_t, hi_t = sorted(tasks, key=lambda t: kstar[t])
    out = {"k_star": kstar, "k_star_ci": ci, "low": lo_t, "high": hi_t,
           "grid_in_interval": {t: [k for k in ks if in_interval(k, ci[t])] for t in tasks},
           "grid_interval": {t: grid_interval(ci[t], ks) for t in tasks}}
    if all(t in best for t in tasks):
        out["share_below"] = share_below(best[lo_t], best[hi_t])
        modes = {t: most_frequent(distribution(best[t], ks)) for t in tasks}
        out["mode"] = modes
        out["mode_in_interval"] = {t: in_interval(modes[t], ci[t]) for t in tasks}
        out["mode_in_grid_interval"] = {t: modes[t] in out["grid_interval"][t] for t in tasks}
    return out


def verdict(check: dict, complete: bool) -> str:
    """PASS when the share reaches SHARE_NEEDED and each task's most frequent best K lies in its K* interval read at
    the grid's resolution (AMENDMENT.md); judged only when ``complete`` (the cells judged are all present)."""
    if "share_below" not in check:
        return "not computed (a task has no seed with every K)"
    share_ok = check["share_below"] >= SHARE_NEEDED
    modes_ok = all(check["mode_in_grid_interval"].values())
    what = (f"{check['low']}'s best K is below {check['high']}'s in {check['share_below']:.1%} of replicates "
            f"({'at least' if share_ok else 'below'} {SHARE_NEEDED:.0%}); most frequent best K "
            + ", ".join(f"{t} {check['mode'][t]} ({'in' if check['mode_in_grid_interval'][t] else 'outside'} "
                        f"{{{', '.join(map(str, check['grid_interval'][t]))}}}, the grid reading of "
                        f"[{_f(check['k_star_ci'][t][0], 2)}, {_f(check['k_star_ci'][t][1], 2)}])"
                        for t in (check["low"], check["high"])))
    if not complete:
        return f"not judged: the grid is incomplete ({what} on the cells present)"
    return ("PASS: " if share_ok and modes_ok else "FAIL: ") + what


def _rate(cells: dict, names: list[str], key: str) -> float:
    vals = [cells[n]["result"][key] for n in names if n in cells]
    return float(np.mean(vals)) if vals else math.nan


def stage_b_statistics(cells: dict, cfg: dict, tasks: list[str], pred: dict, n_boot: int) -> dict:
    ks, seeds = cfg["ks"], cfg["seeds"]
    per_task, losses = {}, {}
    for t in tasks:
        x, both = loss_matrix(cells, t, ks, seeds)
        row: dict = {"seeds": both}
        for k in ks:
            names = [f"{t}-k{k}-s{s}" for s in seeds]
            row[f"n_train_k{k}"] = next((cells[n]["result"]["n_prompts"] for n in names if n in cells), None)
            row[f"greedy_valid_k{k}"] = _rate(cells, names, "greedy_valid_rate")
            row[f"sample_valid_k{k}"] = _rate(cells, names, "sample_valid_rate")
            row[f"loss_present_k{k}"] = _rate(cells, names, "mean_loss")
        if x is not None:
            losses[t] = x
            row["loss"] = {k: float(x[i].mean()) for i, k in enumerate(ks)}
            row["best_k"] = best_k(x, ks)
        per_task[t] = row
    boot = bootstrap_best_k(losses, ks, n_boot) if losses else {"best": {}, "means": {}}
    for t, best in boot["best"].items():
        row = per_task[t]
        row["best_k_distribution"] = distribution(best, ks)
        row["most_frequent_best_k"] = most_frequent(row["best_k_distribution"])
        row["loss_ci"] = {k: list(percentile_interval(boot["means"][t][:, i], 0.95, row["loss"][k]))
                          for i, k in enumerate(ks)}
    checks = {p: pilot_check(pred, p, tasks, boot["best"], ks) for p in PILOTS}
    return {"tasks": per_task, "checks": checks, "n_boot": n_boot}


def render(stats: dict, cfg: dict, tasks: list[str], n_done: int, n_cells: int, stale: list[str],
           verdicts: dict, warm: str, judged_on: list[int] | None = None) -> str:
    ks = cfg["ks"]
    lines = ["# Stage B: at a fixed budget, is the low-K* task's best K below the high-K* task's?", "",
             f"From the cells present (`{COMMAND}{_flag(cfg)} --report`). Design: the tasks {', '.join(tasks)} (chosen in "
             f"`predictions.json`), K in {{{', '.join(map(str, ks))}}}, seeds {', '.join(map(str, cfg['seeds']))}, "
             f"a fixed budget B = N_p (C_p + K C_r) = {cfg['budget']} with C_p / C_r = {cfg['cost_ratio']}: K "
             "trains on N_p(K) = floor(B / (C_p + K)) prompts ("
             + ", ".join(f"{cfg_np(cfg, k)} at K = {k}" for k in ks) + f"), {cfg['steps']} optimizer steps of "
             f"{cfg['batch_size']} pairs at every K.", "",
             f"**Cells complete: {n_done} of {n_cells}.** " + judging_rule(cfg, judged_on)]
    if stale:
        lines += ["", f"Cells written for another predictions.json (left out): {', '.join(stale)}."]
    lines += ["", "## Per task", "",
              f"L: mean over the {cfg['n_heldout']} held-out prompts of the mean per-token loss of each prompt's "
              "valid answers, over the seeds with every K (a task without such a seed: the mean over its cells "
              "present, marked unpaired, without an interval); 95% percentile interval of the bootstrap (seeds x "
              f"held-out prompts resampled, the same draws for every K; {stats['n_boot']} replicates). Best K: the "
              "K of least L (ties: the smallest). Valid rates: greedy answer / samples, graded by the family's "
              "checker.", "",
              "| task | seeds | " + " | ".join(f"L K={k} [95% CI]" for k in ks) + " | best K | "
              + " | ".join(f"valid K={k}" for k in ks) + " |",
              "|---|---|" + "---|" * (2 * len(ks) + 1)]
    for t in tasks:
        r = stats["tasks"][t]
        loss = r.get("loss")
        lines.append(f"| {t} | {len(r['seeds'])} | "
                     + " | ".join(f"{_f(loss[k])} {_ci(r['loss_ci'][k])}" if loss
                                  else _unpaired(r[f"loss_present_k{k}"]) for k in ks)
                     + f" | {r.get('best_k', '–')} | "
                     + " | ".join(f"{_f(r[f'greedy_valid_k{k}'], 2)} / {_f(r[f'sample_valid_k{k}'], 2)}"
                                  for k in ks) + " |")
    lines += ["", "## The distribution of the best K", "",
              "Share of bootstrap replicates in which each K is the task's best K.", "",
              "| task | " + " | ".join(f"K={k}" for k in ks) + " | most frequent |",
              "|---|" + "---|" * (len(ks) + 1)]
    for t in tasks:
        r = stats["tasks"][t]
        if "best_k_distribution" not in r:
            lines.append(f"| {t} | " + " | ".join("–" for _ in ks) + " | – |")
            continue
        d = r["best_k_distribution"]
        lines.append(f"| {t} | " + " | ".join(f"{d[k]:.1%}" for k in ks) + f" | {r['most_frequent_best_k']} |")
    lines += ["", "## Pass criterion", "",
              f"Pre-registered: the low-K* task's best K is below the high-K* task's in at least {SHARE_NEEDED:.0%} "
              "of replicates, and each task's most frequent best K lies in its K* interval (95%, C_p / C_r = "
              f"{cfg['cost_ratio']}), read at the grid's resolution (AMENDMENT.md: the grid K nearest each end of "
              "the interval in log K, and those between; the literal reading is shown beside it). The predictions "
              f"chose the `{warm}` pilot; the other pilot is reported too.", "",
              "| pilot | task | K* | K* 95% CI | grid reading | most frequent best K | in the grid reading | "
              "grid K inside the literal interval | in the literal interval |",
              "|---|---|---|---|---|---|---|---|---|"]
    yes_no = {True: "yes", False: "no"}
    for p in PILOTS:
        c = stats["checks"][p]
        for t in (c["low"], c["high"]):
            grid = c["grid_in_interval"][t]
            lines.append(f"| {p} | {t} ({'low' if t == c['low'] else 'high'} K*) | {_f(c['k_star'][t], 2)} | "
                         f"{_ci(c['k_star_ci'][t])} | {', '.join(map(str, c['grid_interval'][t]))} | "
                         f"{c.get('mode', {}).get(t, '–')} | "
                         + (yes_no[c["mode_in_grid_interval"][t]] if "mode" in c else "–")
                         + f" | {', '.join(map(str, grid)) or 'none'} | "
                         + (yes_no[c["mode_in_interval"][t]] if "mode" in c else "–") + " |")
    lines.append("")
    for p in PILOTS:
        c = stats["checks"][p]
        empty = [t for t in (c["low"], c["high"]) if not c["grid_in_interval"][t]]
        if empty:
            lines.append(f"* {p} pilot: no K of the grid lies in the literal K* interval of {', '.join(empty)}, so "
                         "its most frequent best K cannot lie in it; the criterion reads the interval at the grid's "
                         "resolution.")
    lines += [f"* {p} pilot{' (the predictions’ choice)' if p == warm else ''}: {verdicts[p]}." for p in PILOTS]
    lines.append("")
    return "\n".join(lines)


def _unpaired(v: float) -> str:
    return "–" if math.isnan(v) else f"{_f(v)} (unpaired)"


def cfg_np(cfg: dict, k: int) -> int:
    return prompts_for(cfg["budget"], k, cfg["cost_ratio"])


def write_report(cell_dir: Path, out_md: Path, cfg: dict, tasks: list[str], predictions: Path,
                 n_boot: int = 2000) -> dict:
    sha = hashlib.sha256(Path(predictions).read_bytes()).hexdigest()
    pred = json.loads(Path(predictions).read_text())
    cells, stale = load_cells(cell_dir, sha)
    names = [f"{t}-k{k}-s{s}" for s in cfg["seeds"] for t in tasks for k in cfg["ks"]]
    n_done = sum(n in cells for n in names)
    complete = n_done == len(names)
    cells = {n: cells[n] for n in names if n in cells}
    seeds, judged = judged_seeds(cells, cfg, tasks, complete)
    stats = stage_b_statistics(cells, dict(cfg, seeds=seeds), tasks, pred, n_boot)
    verdicts = {p: verdict(stats["checks"][p], judged) for p in PILOTS}
    warm = pred["choice"].get("warm_pilot", "chat")
    judged_on = seeds if judged else None
    write_atomic(out_md, render(stats, cfg, tasks, n_done, len(names), stale, verdicts, warm, judged_on))
    write_atomic(out_md.with_suffix(".json"), json.loads(json.dumps(
        {**stats, "cells_done": n_done, "cells": len(names), "complete": complete, "judged_on_seeds": judged_on,
         "verdict": verdicts,
         "warm_pilot": warm, "budget": cfg["budget"], "cost_ratio": cfg["cost_ratio"],
         "n_train": {k: cfg_np(cfg, k) for k in cfg["ks"]}, "predictions_sha256": sha}, default=str)))
    return {"cells_done": n_done, "cells": len(names), "complete": complete, "judged_on_seeds": judged_on,
            "verdict": verdicts}
