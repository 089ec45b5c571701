"""The pre-registered Stage C statistics from the Stage C cells present (`stage_c.py`; AMENDMENT.md, section 3).

Per selector, over the seeds with every selector: the held-out reference loss L, the valid rate of the samples,
the distinct valid answers among a prompt's samples (each per held-out prompt), and the kept rows' reward, valid
share and distinct valid answers (each per training prompt; a seed's selectors share its pools). Every
comparison is a paired difference over seeds x prompts with its 95% percentile bootstrap interval
(`stats.paired_difference`). The predictions:

* P1: top has the highest sample valid rate: valid(top) - valid(s) > 0 for every other selector s;
* P2: top has the fewest distinct valid answers: distinct(top) - distinct(s) < 0 for every other s;
* P3: among the high-validity selectors (those whose valid rate is not clearly below top's: the interval of
  valid(s) - valid(top) reaches 0), a GRADES selector has the most distinct valid answers:
  distinct(g) - distinct(s) > 0 for every other high-validity s, for g = grades-clip or grades-shift;
* the kernel: ``shift`` wins when, against ``clip``, it is clearly better (interval excluding 0) on L or on the
  valid rate and clearly worse on neither; ``clip`` wins the other way round; else neither.

A prediction is *supported* when every difference it names excludes 0 in its direction, *contradicted* when one
excludes 0 the other way, else *unresolved*. Verdicts only on the full grid.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np

from llm_evidence.cell_files import write_atomic
from llm_evidence.families import VALID
from llm_evidence.stage_a_report import _ci, _f, load_cells
from llm_evidence.stats import paired_difference

COMMAND = "python bench/experiments/llm_evidence/stage_c.py"
#: held-out measures (per held-out prompt) and kept measures (per training prompt): name -> (label, source)
HELDOUT = {"loss": "held-out L", "valid": "sample valid rate", "distinct": "distinct valid (samples)"}
KEPT = {"kept_reward": "kept reward", "kept_valid": "kept valid share", "kept_distinct_valid": "kept distinct valid"}


def per_prompt(cell: dict) -> dict[str, list[float]]:
    """A cell's measures, one value per prompt (held-out prompts, then training prompts for the kept ones)."""
    r = cell["result"]
    distinct = [len({a.strip() for a, g in zip(rs, gs) if g == VALID})
                for rs, gs in zip(r["samples"], r["sample_grade"])]
    out = {"loss": r["loss"], "valid": r["sample_valid_per_prompt"], "distinct": distinct}
    for k in KEPT:
        out[k] = [row[k] for row in r["kept_per_prompt"]]
    return out


def matrices(cells: dict, selectors: list[str], seeds: list[int]) -> tuple[dict, list[int]]:
    """measure -> selector -> array (seeds x prompts), over the seeds that have every selector."""
    both = [s for s in seeds if all(f"{sel}-s{s}" in cells for sel in selectors)]
    out: dict = {m: {} for m in (*HELDOUT, *KEPT)}
    if not both:
        return out, both
    for sel in selectors:
        vals = [per_prompt(cells[f"{sel}-s{s}"]) for s in both]
        for m in out:
            out[m][sel] = np.array([v[m] for v in vals], dtype=np.float64)
    return out, both


def direction(d: dict) -> int:
    """+1 / -1 when the interval excludes 0 above / below, else 0."""
    lo, hi = d["interval"]
    return 1 if lo > 0 else -1 if hi < 0 else 0


def judge(dirs: list[int], want: int) -> str:
    if any(x == -want for x in dirs):
        return "contradicted"
    return "supported" if all(x == want for x in dirs) else "unresolved"


def predictions(mx: dict, selectors: list[str], n_boot: int) -> dict:
    diff = lambda m, a, b: paired_difference(mx[m][a], mx[m][b], n_boot=n_boot)  # noqa: E731
    others = [s for s in selectors if s != "top"]
    p1 = {s: diff("valid", "top", s) for s in others}
    p2 = {s: diff("distinct", "top", s) for s in others}
    high = ["top"] + [s for s in others if diff("valid", s, "top")["interval"][1] >= 0]
    p3 = {}
    for g in ("grades-clip", "grades-shift"):
        if g in high:
            p3[g] = {s: diff("distinct", g, s) for s in high if s != g}
    p3_verdict = ("not testable (no GRADES selector is high-validity)" if not p3 else
                  max((judge([direction(d) for d in ds.values()], +1) for ds in p3.values()),
                      key=["contradicted", "unresolved", "supported"].index))
    kern = {m: diff(m, "grades-shift", "grades-clip") for m in ("loss", "valid", "distinct")}
    better = {"loss": -1, "valid": +1}  # the direction in which shift is better than clip
    shift_better = [m for m, w in better.items() if direction(kern[m]) == w]
    shift_worse = [m for m, w in better.items() if direction(kern[m]) == -w]
    kernel = ("shift" if shift_better and not shift_worse else "clip" if shift_worse and not shift_better
              else "neither")
    return {"P1": {"differences": p1, "verdict": judge([direction(d) for d in p1.values()], +1)},
            "P2": {"differences": p2, "verdict": judge([direction(d) for d in p2.values()], -1)},
            "P3": {"high_validity": high, "differences": p3, "verdict": p3_verdict},
            "kernel": {"differences": kern, "wins": kernel}}


def render(stats: dict, cfg: dict, task: str, n_done: int, n_cells: int, complete: bool) -> str:
    sels = stats["selectors"]
    lines = ["# Stage C: the selectors at K = 4 with the checker's reward", "",
             f"From the cells present (`{COMMAND} --report`). Task `{task}` (chosen in `predictions.json`); pools of "
             f"{sum(cfg['pool'].values())} per training prompt ({cfg['pool']['valid']} valid, "
             f"{cfg['pool']['near_miss']} near misses, {cfg['pool']['wrong']} wrong, {cfg['pool']['samples']} chat-model "
             f"samples; reward 1 / 0.5 / 0), K = 4, seeds {', '.join(map(str, cfg['seeds']))}, {cfg['steps']} steps of "
             f"{cfg['batch_size']} pairs for every selector (AMENDMENT.md, section 3).", "",
             f"**Cells complete: {n_done} of {n_cells}.** "
             + ("The grid is complete and the predictions are judged." if complete else
                "The predictions are judged only on the full grid; the numbers below describe the seeds with every "
                "selector.")]
    if not stats["seeds"]:
        return "\n".join(lines + ["", "No seed has a cell for every selector yet.", ""])
    lines += ["", "## Per selector", "",
              f"Means over seeds {', '.join(map(str, stats['seeds']))} x prompts; held-out measures over the "
              f"{cfg['n_heldout']} held-out prompts, kept measures over the training prompts.", "",
              "| selector | " + " | ".join(list(HELDOUT.values()) + list(KEPT.values())) + " |",
              "|---|" + "---|" * (len(HELDOUT) + len(KEPT))]
    for s in sels:
        lines.append(f"| {s} | " + " | ".join(_f(stats["means"][m][s]) for m in (*HELDOUT, *KEPT)) + " |")
    p = stats["predictions"]

    def block(title, d):
        out = ["", title, "", "| comparison | difference | 95% CI |", "|---|---|---|"]
        out += [f"| {name} | {_f(x['difference'])} | {_ci(x['interval'])} |" for name, x in d.items()]
        return out

    lines += block("## P1: top has the highest sample valid rate (valid(top) − valid(s))",
                   {f"top − {s}": d for s, d in p["P1"]["differences"].items()})
    lines += ["", f"P1: **{p['P1']['verdict']}**."]
    lines += block("## P2: top has the fewest distinct valid answers (distinct(top) − distinct(s))",
                   {f"top − {s}": d for s, d in p["P2"]["differences"].items()})
    lines += ["", f"P2: **{p['P2']['verdict']}**."]
    lines += ["", "## P3: GRADES has the most distinct valid answers among the high-validity selectors", "",
              f"High-validity (valid rate not clearly below top's): {', '.join(p['P3']['high_validity'])}."]
    for g, ds in p["P3"]["differences"].items():
        lines += block(f"### {g}", {f"{g} − {s}": d for s, d in ds.items()})
    lines += ["", f"P3: **{p['P3']['verdict']}**."]
    lines += block("## The kernel: grades-shift − grades-clip", p["kernel"]["differences"])
    lines += ["", f"Kernel: **{p['kernel']['wins']}** wins on training outcomes (lower L or higher valid rate, "
              "interval excluding 0, and clearly worse on neither)."]
    if not complete:
        lines += ["", "Not judged: the grid is incomplete."]
    lines.append("")
    return "\n".join(lines)


def write_report(cell_dir: Path, out_md: Path, cfg: dict, task: str, predictions_path: Path,
                 n_boot: int = 2000) -> dict:
    from llm_evidence.stage_c import SELECTORS

    sha = hashlib.sha256(Path(predictions_path).read_bytes()).hexdigest()
    cells, stale = load_cells(cell_dir, sha)
    sels = list(SELECTORS)
    names = [f"{s}-s{seed}" for seed in cfg["seeds"] for s in sels]
    n_done = sum(n in cells for n in names)
    complete = n_done == len(names)
    mx, seeds = matrices(cells, sels, cfg["seeds"])
    stats: dict = {"selectors": sels, "seeds": seeds, "stale": stale}
    if seeds:
        stats["means"] = {m: {s: float(mx[m][s].mean()) for s in sels} for m in mx}
        stats["predictions"] = predictions(mx, sels, n_boot)
        if not complete:
            for k in ("P1", "P2", "P3"):
                stats["predictions"][k]["verdict"] = f"not judged ({stats['predictions'][k]['verdict']} on the cells present)"
            stats["predictions"]["kernel"]["wins"] = f"not judged ({stats['predictions']['kernel']['wins']} on the cells present)"
    write_atomic(out_md, render(stats, cfg, task, n_done, len(names), complete))
    write_atomic(out_md.with_suffix(".json"), json.loads(json.dumps(
        {**stats, "cells_done": n_done, "cells": len(names), "complete": complete, "predictions_sha256": sha},
        default=lambda o: None if isinstance(o, float) and math.isnan(o) else str(o))))
    verdicts = {k: stats["predictions"][k]["verdict"] for k in ("P1", "P2", "P3")} if seeds else {}
    if seeds:
        verdicts["kernel"] = stats["predictions"]["kernel"]["wins"]
    return {"cells_done": n_done, "cells": len(names), "complete": complete, "verdicts": verdicts}
