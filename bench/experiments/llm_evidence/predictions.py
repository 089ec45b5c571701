"""Pre-registered predictions from the pilots: which tasks each stage uses, the ratios and K* the law
predicts for them, and the stages' designs and pass criteria, written before any training.

`write_predictions(pilots_dir, out_dir)` reads ``<family>-<pilot>.json`` files (from `preregister.py`) and
writes ``PREDICTIONS.md`` and ``predictions.json`` (which also records the SHA-256 of every pilot file it read).
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

from llm_evidence.cell_files import write_atomic
from llm_evidence.families import FAMILIES, STUDY, pilot_prompts

#: C_p / C_r of the predictions (the paper's K*_10)
COST_RATIO = 10
#: Stage A runs on at least this many tasks, and at most MAX_STAGE_A (the exact permutation test enumerates n!)
MIN_STAGE_A, MAX_STAGE_A = 6, 10
#: the K* Stage B's two tasks should sit near
STAGE_B_TARGETS = (1.5, 5.0)
#: Stage C's task offers at least this many valid answers on every prompt (pools of >= 16 hold valid answers,
#: near misses, wrong answers and samples)
STAGE_C_MIN_VALID = 8

RULE = f"""\
1. A family is **eligible** when its ratio V_y|x / V_x is identified (the variance report's `identified`)
   in the base pilot and in the warm pilot (`lora` when every study family has one, else `chat`); the
   control `product` (V_y|x = 0) is never chosen.
2. **Stage A** takes every eligible family if there are at most {MAX_STAGE_A}; with more, the {MAX_STAGE_A} at evenly
   spaced ranks of the warm pilot's log ratio (lowest and highest included). With fewer than {MIN_STAGE_A}
   eligible families Stage A cannot run as designed: the pilots need more prompts first (the report's
   `identification` says how many).
3. **Stage B** takes the eligible family whose warm K* (C_p / C_r = {COST_RATIO}) is nearest {STAGE_B_TARGETS[0]} and,
   among the others, the one nearest {STAGE_B_TARGETS[1]} (distance in log K*).
4. **Stage C** takes, among the eligible families whose every pilot prompt has at least {STAGE_C_MIN_VALID} valid
   answers, the one with the largest warm ratio.
5. The prediction of Stage A is the order of the gains R1oN -> R4oN: the order of the log ratios (for the base
   and for the warm pilot separately)."""

STAGES = """\
**Stage A, ratio -> gain.** K in {1, 4}, at least 4 seeds, each seed draws its own training prompts;
enough steps that the model learns (report valid rates; on low-entropy tasks the valid rate at K=4 must
clearly beat chance; if it does not, change the task or steps before the grid and say so); Spearman rho
and Kendall tau between log ratio and gain, each with an exact permutation p and a two-level bootstrap
interval; baselines: log(number of valid answers), and V_y|x alone; for both base and warm pilot.
*Pass:* rho's lower bound > 0, and the ratio predicts at least as well as the baselines. A fail is
reported as a fail.

**Stage B, fixed budget vs K\\*.** Two tasks with K* (C_p/C_r = 10) near 1.5 and near 5; K in {1,2,4,8}
x >= 3 seeds at a fixed budget; bootstrap distribution of the best K. *Pass:* the low-K* task's best K is
below the high-K* task's in >= 90% of replicates, and each task's most frequent best K lies in its K*
interval.

**Stage C, selectors with a real reward.** A task whose checker gives the reward (valid 1, near-miss
partial, wrong 0); pools of >= 16 with valid answers, near misses, wrong answers and warm-model samples;
modes from the normalized answer; at K=4 compare random, top, diverse, GRADES (clip and shift),
stratified on reference loss, valid rate of samples, distinct valid answers, kept reward; paired
bootstrap tests: top has the highest validity and fewest distinct answers; GRADES has the most distinct
answers among high-validity selectors. The kernel default follows this result."""

STATISTICS = """\
`bench/llm_evidence/stats.py`: Spearman rho and Kendall tau-b (equal to scipy's); a one-sided exact
permutation p-value of a positive association that enumerates all n! orderings (n <= 10 tasks); a
two-level bootstrap (level 1 resamples each task's pilot prompts and recomputes its ratio; level 2
resamples each task's held-out prompts and its seeds, the same draws for K = 1 and K = 4, and recomputes
its gain 1 - L(K=4) / L(K=1)), 95% percentile intervals; paired differences of cells with a bootstrap
interval over prompts x seeds. Training formats prompts with the chat template, the format of the warm
pilots."""


def _num(v):
    if isinstance(v, str):
        return {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}.get(v, v)
    return v


def _fmt(v, digits=3):
    v = _num(v)
    if v is None:
        return "–"
    if isinstance(v, float) and math.isinf(v):
        return "∞" if v > 0 else "−∞"
    if isinstance(v, float) and math.isnan(v):
        return "nan"
    return f"{v:.{digits}g}"


def _ci(rep, name):
    lo, hi = rep.get("ci", {}).get(name, [None, None])
    return f"[{_fmt(lo)}, {_fmt(hi)}]"


def load_pilots(pilots_dir: Path) -> dict[tuple[str, str], dict]:
    out = {}
    for p in sorted(Path(pilots_dir).glob("*.json")):
        d = json.loads(p.read_text())
        d["sha256"] = hashlib.sha256(p.read_bytes()).hexdigest()
        d["file"] = p.name
        out[(d["family"], d["pilot"])] = d
    return out


def _log_k(rep) -> float:
    k = _num(rep["k_star"])
    return math.log(k) if isinstance(k, (int, float)) and 0 < k < math.inf else math.inf


def choose(pilots: dict[tuple[str, str], dict]) -> dict:
    """Apply the rule (RULE) to the pilots: the warm pilot used, the eligible families, and each stage's tasks."""
    fams = [f for f in STUDY if (f, "base") in pilots]
    warm = "lora" if fams and all((f, "lora") in pilots for f in fams) else "chat"
    rep = {f: {p: pilots[(f, p)]["result"]["report"] for p in ("base", "chat", "lora") if (f, p) in pilots}
           for f in fams}
    eligible = [f for f in fams if warm in rep[f] and rep[f]["base"]["identified"] and rep[f][warm]["identified"]]
    by_ratio = sorted(eligible, key=lambda f: _num(rep[f][warm]["ratio"]))
    if len(by_ratio) <= MAX_STAGE_A:
        stage_a = by_ratio
    else:
        n = len(by_ratio)
        stage_a = [by_ratio[round(i * (n - 1) / (MAX_STAGE_A - 1))] for i in range(MAX_STAGE_A)]
    stage_b: list[str] = []
    for target in STAGE_B_TARGETS:
        left = [f for f in eligible if f not in stage_b and math.isfinite(_log_k(rep[f][warm]))]
        if left:
            stage_b.append(min(left, key=lambda f: abs(_log_k(rep[f][warm]) - math.log(target))))
    rich = [f for f in eligible
            if min(len(it.valid) for it in pilot_prompts(f, _n_pilot(pilots, f))) >= STAGE_C_MIN_VALID]
    stage_c = max(rich, key=lambda f: _num(rep[f][warm]["ratio"])) if rich else None
    return {"warm_pilot": warm, "families": fams, "eligible": eligible, "stage_a": stage_a,
            "stage_a_runs": len(stage_a) >= MIN_STAGE_A, "stage_b": stage_b, "stage_c": stage_c}


def _n_pilot(pilots: dict, f: str) -> int:
    return int(pilots[(f, "base")]["settings"]["n_pilot"])


def _mean_log_valid(f: str, n: int) -> float:
    """The baseline predictor: mean over the pilot prompts of log(number of valid answers)."""
    return sum(math.log(len(it.valid)) for it in pilot_prompts(f, n)) / n


def _family_row(f: str, pilots: dict) -> dict:
    row: dict = {"family": f, "description": FAMILIES[f].description, "control": FAMILIES[f].control,
                 "mean_log_valid": _mean_log_valid(f, _n_pilot(pilots, f))}
    for p in ("base", "chat", "lora"):
        if (f, p) not in pilots:
            continue
        d = pilots[(f, p)]
        r = d["result"]["report"]
        losses = [x["loss"] for x in d["result"]["losses"]]
        row[p] = {"v_x": r["v_x"], "v_y_given_x": r["v_y_given_x"], "ratio": r["ratio"],
                  "ratio_ci": r["ci"].get("ratio"), "k_star": r["k_star"], "k_star_ci": r["ci"].get("k_star"),
                  "k_best": r["k_best"], "identified": r["identified"], "identification": r["identification"],
                  "k_at_least": r["k_at_least"], "mean_loss": sum(losses) / len(losses),
                  "n_prompts": r["n_prompts"], "n_rows": r["n_rows"], "seconds": d["seconds"],
                  "file": d["file"], "sha256": d["sha256"]}
    return row


def render(pred: dict) -> str:
    ch = pred["choice"]
    warm = ch["warm_pilot"]
    lines = ["# Pre-registered predictions: the variance law on SmolLM2-135M-Instruct", "",
             "Written from the pilots alone, before any training of the grid it predicts "
             "(`python bench/llm_evidence/preregister.py --predict-only`). "
             "`predictions.json` holds the same numbers and the SHA-256 of every pilot file.", "",
             f"Pilots: {pred['n_pilot_files']} files; {len(ch['families'])} study families have a base pilot. "
             f"Warm pilot used for the choice: `{warm}`. C_p / C_r = {COST_RATIO}; 95% bootstrap intervals "
             "over pilot prompts.", ""]
    lines += ["## Pilots", "", "| family | pilot | mean loss | V_x | V_y\\|x | ratio | ratio 95% CI | K* | K* 95% CI "
              "| identified | mean log #valid |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in pred["families"]:
        for p in ("base", "chat", "lora"):
            if p in row:
                r = row[p]
                lines.append(f"| {row['family']} | {p} | {_fmt(r['mean_loss'])} | {_fmt(r['v_x'])} | "
                             f"{_fmt(r['v_y_given_x'])} | {_fmt(r['ratio'])} | {_ci({'ci': {'r': r['ratio_ci']}}, 'r')}"
                             f" | {_fmt(r['k_star'])} | {_ci({'ci': {'k': r['k_star_ci']}}, 'k')} | "
                             f"{'yes' if r['identified'] else 'no (K >= %d)' % r['k_at_least']} | "
                             f"{_fmt(row['mean_log_valid'])} |")
    lines += ["", "## The rule used to choose", "", RULE, "", "## The choice", ""]
    lines.append(f"* Eligible (identified in base and `{warm}`): "
                 f"{', '.join(ch['eligible']) or 'none'}.")
    a = ", ".join(ch["stage_a"]) or "none"
    lines.append(f"* Stage A ({len(ch['stage_a'])} tasks): {a}." + (
        "" if ch["stage_a_runs"] else f" **Fewer than {MIN_STAGE_A}: Stage A cannot run as designed; the pilots "
                                      "need more prompts (see the identification notes below).**"))
    lines.append(f"* Stage B: {', '.join(ch['stage_b']) or 'none'}.")
    lines.append(f"* Stage C: {ch['stage_c'] or 'none'}.")
    lines += ["", "## Predictions", ""]
    for p in ("base", warm):
        order = [f for f in sorted(ch["stage_a"], key=lambda f: _num(pred["by_family"][f][p]["ratio"]))]
        lines.append(f"* Stage A, {p} pilot: the gain R1oN -> R4oN rises in this order (log ratio): "
                     + (" < ".join(f"{f} ({_fmt(pred['by_family'][f][p]['ratio'])})" for f in order) or "–") + ".")
    for f in ch["stage_b"]:
        r = pred["by_family"][f][warm]
        lines.append(f"* Stage B, {f}: K* = {_fmt(r['k_star'])} {_ci({'ci': {'k': r['k_star_ci']}}, 'k')} "
                     f"({warm} pilot); the most frequent best K lies in this interval.")
    notes = [(row["family"], p, row[p]["identification"]) for row in pred["families"] for p in ("base", "chat", "lora")
             if p in row and row[p]["identification"]]
    if notes:
        lines += ["", "## Not identified", ""]
        lines += [f"* {f} ({p}): {n}" for f, p, n in notes]
    lines += ["", "## Pre-registered design and pass criteria", "", STAGES, "", "## Statistics", "", STATISTICS, ""]
    return "\n".join(lines)


def write_predictions(pilots_dir: Path, out_dir: Path, quick: bool = False) -> dict:
    pilots = load_pilots(pilots_dir)
    fams = [f for f in [*STUDY, *[n for n, fm in FAMILIES.items() if fm.control]] if (f, "base") in pilots]
    rows = [_family_row(f, pilots) for f in fams]
    pred = {"choice": choose(pilots), "cost_ratio": COST_RATIO, "n_pilot_files": len(pilots), "quick": quick,
            "families": rows, "by_family": {r["family"]: r for r in rows}, "rule": RULE, "stages": STAGES,
            "statistics": STATISTICS}
    out_dir = Path(out_dir)
    write_atomic(out_dir / "predictions.json", json.dumps(pred, indent=1, default=str))
    write_atomic(out_dir / "PREDICTIONS.md", render(pred))
    return {"pilot_files": len(pilots), **{k: pred["choice"][k] for k in ("stage_a", "stage_b", "stage_c")}}
