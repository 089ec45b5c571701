"""The statistics of the pairing-rule experiment (`dpo_rules.py`) from the cells present, and its page.

Every comparison is paired: two cells of one seed were evaluated on the same held-out prompts (and sampled with
the same seed), so a comparison is the mean over seeds x prompts of the per-prompt difference, with a bootstrap
interval that resamples seeds and prompts (`stats.paired_difference`). A prediction of dpo_predictions.json is
judged on its difference's interval: **supported** when the interval lies on the predicted side of 0,
**contradicted** when it lies on the other side, **not resolved** when it contains 0; and only when every cell of
the design is present (otherwise **incomplete**).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from llm_evidence.cell_files import write_atomic
from llm_evidence.families import number
from llm_evidence.stage_a_report import load_cells
from llm_evidence.stats import paired_difference

COMMAND = "python bench/experiments/llm_evidence/dpo_rules.py"
RULES = ("best-worst", "sweet-spot", "all")
#: the per-prompt values of a cell, by metric name: (result key, what it is)
METRICS = {
    "greedy_valid": ("greedy_valid", "greedy valid rate: the share of held-out prompts whose greedy answer is valid"),
    "sample_valid": ("sample_valid_per_prompt", "sampled valid rate: the share of valid samples (temperature 1)"),
    "reference_loss": ("loss", "reference loss: the mean loss (nats per token) of a prompt's valid answers"),
    "greedy_reward": ("greedy_reward", "greedy reward: the partial-credit reward of the greedy answer"),
    "greedy_number": ("greedy", "greedy number rate: the share of greedy answers that are a bare number (valid or "
                      "not; the checker's spelling)"),
}
#: the comparisons reported (a - b), the rule comparisons first
COMPARISONS = [("sweet-spot", "best-worst"), ("all", "best-worst"), ("sweet-spot", "all"),
               *[(r, "sft") for r in RULES]]


def per_prompt(cell: dict, metric: str) -> np.ndarray:
    """A cell's per-held-out-prompt values of ``metric``."""
    values = cell["result"][METRICS[metric][0]]
    if metric == "greedy_number":
        values = [number(a) is not None for a in values]
    return np.asarray(values, dtype=np.float64)


def compare(cells: dict, a: str, b: str, metric: str, seeds: list[int], n_boot: int) -> dict | None:
    """The paired difference a - b of ``metric`` over the seeds that have both cells (None when none has)."""
    both = [s for s in seeds if f"{a}-s{s}" in cells and f"{b}-s{s}" in cells]
    if not both:
        return None
    x = np.stack([per_prompt(cells[f"{a}-s{s}"], metric) for s in both])
    y = np.stack([per_prompt(cells[f"{b}-s{s}"], metric) for s in both])
    d = paired_difference(x, y, n_boot=n_boot, seed=0)
    return {"a": a, "b": b, "metric": metric, "seeds": both, "difference": d["difference"],
            "interval": d["interval"], "level": d["level"], "n_boot": n_boot,
            "per_seed": [float((x[i] - y[i]).mean()) for i in range(len(both))]}


def verdict(diff: dict | None, direction: str, complete: bool) -> str:
    """``direction`` ">" (a above b predicted) or "<": supported / contradicted / not resolved / incomplete."""
    if diff is None or not complete:
        return "incomplete"
    lo, hi = diff["interval"]
    above, below = lo > 0, hi < 0
    if (above and direction == ">") or (below and direction == "<"):
        return "supported"
    if above or below:
        return "contradicted"
    return "not resolved"


def _mean(cells: dict, names: list[str], metric: str) -> float:
    vals = [float(per_prompt(cells[n], metric).mean()) for n in names if n in cells]
    return float(np.mean(vals)) if vals else math.nan


def same_pairs(cells: dict, seeds: list[int]) -> dict:
    """Per seed, how often sweet-spot's pair is best-worst's first pair (the best with the worst): the same two texts,
    and the same rejected reward (equal margins; the texts may differ among responses of equal reward)."""
    out = {}
    for s in seeds:
        bw, ss = cells.get(f"best-worst-s{s}"), cells.get(f"sweet-spot-s{s}")
        if bw is None or ss is None:
            continue
        first: dict = {}
        for p in bw["result"]["pairs"]:
            first.setdefault(p["prompt_id"], p)  # the rows of a prompt come largest margin first
        pairs = ss["result"]["pairs"]
        same_text = sum(first.get(p["prompt_id"], {}).get("rejected") == p["rejected"] for p in pairs)
        same_reward = sum(abs(first[p["prompt_id"]]["margin"] - p["margin"]) <= 1e-9 for p in pairs
                          if p["prompt_id"] in first)
        gaps = [first[p["prompt_id"]]["margin"] - p["margin"] for p in pairs if p["prompt_id"] in first]
        out[s] = {"prompts": len(pairs), "same_pair": same_text, "same_rejected_reward": same_reward,
                  "mean_margin_gap": float(np.mean(gaps)) if gaps else math.nan}
    return out


def statistics(cells: dict, cfg: dict, predictions: dict, n_boot: int) -> dict:
    seeds = cfg["seeds"]
    expected = [f"sft-s{s}" for s in seeds] + [f"{r}-s{s}" for s in seeds for r in RULES]
    missing = [n for n in expected if n not in cells]
    complete = not missing
    levels = {}
    for kind in ("sft", *RULES):
        names = [f"{kind}-s{s}" for s in seeds]
        levels[kind] = {"seeds": [s for s in seeds if f"{kind}-s{s}" in cells],
                        **{m: _mean(cells, names, m) for m in METRICS},
                        "per_seed": {m: {s: float(per_prompt(cells[n], m).mean()) for s, n in zip(seeds, names)
                                         if n in cells} for m in METRICS}}
    diffs = [d for a, b in COMPARISONS for m in METRICS
             if (d := compare(cells, a, b, m, seeds, n_boot)) is not None]
    preds = []
    for p in predictions["predictions"]:
        d = next((x for x in diffs if (x["a"], x["b"], x["metric"]) == (p["a"], p["b"], p["metric"])), None)
        preds.append({**p, "difference": d["difference"] if d else None, "interval": d["interval"] if d else None,
                      "verdict": verdict(d, p["direction"], complete)})
    pairs = {}
    for r in RULES:
        got = [cells[f"{r}-s{s}"]["result"] for s in seeds if f"{r}-s{s}" in cells]
        if got:
            pairs[r] = {"pairs": [g["n_pairs"] for g in got], "epochs": [g["epochs"] for g in got],
                        "pairs_per_prompt": [g["export_report"]["pairs_per_prompt"] for g in got],
                        "margins": [g["export_report"]["margins"] for g in got],
                        "final_loss": [g["train_log"][-1].get("loss") for g in got if g["train_log"]],
                        "final_accuracy": [g["train_log"][-1].get("rewards/accuracies") for g in got
                                           if g["train_log"]]}
    timing = {n: {"seconds": c["seconds"], "train_seconds": c["result"].get("train_seconds"),
                  "start_seconds": c["result"].get("start_seconds"), "eval_seconds": c["result"].get("eval_seconds"),
                  "threads": c.get("threads")} for n, c in sorted(cells.items())}
    starts = {s: {cells[n]["result"]["start"]["adapter_sha256"] if n.startswith("sft") else
                  cells[n]["result"]["start_adapter_sha256"] for n in [f"sft-s{s}", *[f"{r}-s{s}" for r in RULES]]
                  if n in cells} for s in seeds}
    return {"complete": complete, "missing": missing, "levels": levels, "differences": diffs,
            "predictions": preds, "same_pairs": same_pairs(cells, seeds), "pairs": pairs, "timing": timing,
            "one_start_per_seed": all(len(v) <= 1 for v in starts.values())}


# ------------------------------------------------------------------ the page

#: the metrics the outcome states, with their names in a sentence
OUTCOME = {"greedy_valid": "greedy valid rate", "sample_valid": "sampled valid rate",
           "reference_loss": "reference loss"}


def outcome_lines(stats: dict) -> list[str]:
    """One line per comparison: each outcome metric's difference, said as no difference when its interval
    contains 0, else as higher or lower, with the interval."""
    by = {(d["a"], d["b"], d["metric"]): d for d in stats["differences"]}
    out = []
    for a, b in COMPARISONS:
        parts = []
        for m, name in OUTCOME.items():
            d = by.get((a, b, m))
            if d is None:
                continue
            lo, hi = d["interval"]
            how = "no difference" if lo <= 0 <= hi else ("higher" if lo > 0 else "lower")
            parts.append(f"{name} {how} ({d['difference']:+.3f}, {_iv(d['interval'])})")
        if parts:
            out.append(f"* `{a}` against `{b}`: " + "; ".join(parts) + ".")
    return out or ["No comparison has both of its cells yet."]



def _f(x, nd=3) -> str:
    return "–" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{nd}f}"


def _iv(iv, nd=3) -> str:
    return "–" if iv is None else f"[{iv[0]:+.{nd}f}, {iv[1]:+.{nd}f}]"


def render(stats: dict, cfg: dict, predictions: dict, stale: list[str]) -> str:
    reward = predictions["reward"]
    pool = predictions["pools"]
    lines = [
        "# Pairing rules on a real model: DPO on SmolLM2-135M",
        "",
        f"<!-- generated by `{COMMAND} --report`; edit dpo_report.py, not this page -->",
        "",
        "Which pairs should `mrt export --format dpo` build from a prompt's scored responses? This page trains",
        "DPO on pairs from three of its rules (`best-worst`, `sweet-spot`, `all`; see",
        "[preference.md](../guides/preference.md#pairing-rules---pairs)) and measures the trained models on",
        "held-out prompts. The predictions and the decision rule were committed before the grid ran",
        "(`bench/experiments/llm_evidence/DPO_PREDICTIONS.md`, `dpo_predictions.json`, whose SHA-256 every cell",
        "records).",
        "",
        "## Design",
        "",
        "* **Task**: `multiple` of the [task families](llm_evidence_v2.md#task-families): \"Name one multiple of d",
        "  between lo and hi\", 6 to 12 valid answers. Model: SmolLM2-135M-Instruct on a CPU.",
        f"* **Seeds**: {len(cfg['seeds'])} ({', '.join(map(str, cfg['seeds']))}); each seed trains on its own "
        f"{cfg['n_train']} training prompts",
        f"  and every cell is evaluated on the same {cfg['n_heldout']} held-out prompts (never trained on).",
        "* **Start policy** (`sft`): the instruct model answers in sentences (no valid bare number), so each seed first",
        f"  trains a LoRA adapter (r {cfg['lora_r']}, {cfg['sft_steps']} steps of {cfg['sft_batch_size']}, "
        f"learning rate {cfg['sft_lr']:g}, chat template) on one",
        "  valid answer per training prompt, and merges it into the model. Every rule of a seed starts from that",
        "  policy, and it is DPO's reference model.",
        f"* **Candidate pools**: {cfg['n_candidates']} responses per training prompt, drawn with a seeded rng: "
        f"{pool['valid']}; the rest {pool['invalid']}.",
        f"* **Reward** (a checker with partial credit): {reward}.",
        "* **Pairs**: the pools go through `mrt_fast.llm.export.export(pools, path, \"dpo\", pairs=RULE,",
        "  tokenizer=tok)`, the library's defaults otherwise (conversational rows in the model's chat template).",
        f"* **DPO**: TRL's `DPOTrainer`, sigmoid loss, beta {cfg['beta']:g}, a fresh LoRA adapter (r "
        f"{cfg['dpo_lora_r']}, alpha {2 * cfg['dpo_lora_r']}, no dropout, the",
        f"  attention and MLP projections), learning rate {cfg['dpo_lr']:g} (linear decay), {cfg['dpo_steps']} "
        f"optimizer steps of {cfg['dpo_batch_size']} pairs for",
        "  every rule (matched steps: a rule with fewer pairs sees each pair more often), the seed's own seed.",
        "* **Evaluation** (`heldout.evaluate_heldout`): per held-out prompt, the *reference loss* (the mean loss,",
        "  nats per token, of its valid answers), whether the *greedy* answer is valid, the share of "
        f"{cfg['n_samples']} *samples*",
        "  (temperature 1) that are valid, and the greedy answer's reward.",
        "* **Statistics**: every comparison is a paired difference (a - b) over seeds x held-out prompts with a",
        "  95% bootstrap interval resampling seeds and prompts (2,000 draws). A prediction is *supported* when the",
        "  interval lies on its side of 0, *contradicted* when it lies on the other side, *not resolved* when it",
        "  contains 0.",
        "",
        f"**Why {cfg['n_candidates']} responses a pool.** With rewards bounded by the checker, mu - 2 sigma of a small pool lies at or",
        "below its lowest reward, and sweet-spot then pairs the best response with the worst, as best-worst's first",
        "pair does (certain at five responses or fewer by Samuelson's inequality). With 8 responses a pool the two",
        "rules' rejected rewards differed by more than 0.05 on none of the 144 training prompts of seeds 0-2, under",
        f"each of 18 pool generators (valid share, non-number rate, largest distance varied); with "
        f"{cfg['n_candidates']} they differ on the",
        "share of the prompts (measured below).",
        "",
    ]
    if not stats["complete"]:
        lines += [f"**Incomplete**: {len(stats['missing'])} cells of the design are missing "
                  f"({', '.join(stats['missing'])}); the predictions are not judged.", ""]
    if stale:
        lines += [f"Cells written for other predictions or settings (ignored): {', '.join(stale)}.", ""]
    lines += ["## The pairs", "",
              "| rule | pairs (per seed) | pairs per prompt min / median / max | epochs over the pairs | "
              "final DPO loss | final reward accuracy |", "|---|---|---|---|---|---|"]
    for r, p in stats["pairs"].items():
        ppp = "; ".join("{:g} / {:g} / {:g}".format(*x) for x in p["pairs_per_prompt"] if x)
        lines.append(f"| `{r}` | {', '.join(map(str, p['pairs']))} | {ppp} | "
                     f"{', '.join(_f(e, 2) for e in p['epochs'])} | "
                     f"{', '.join(_f(x) for x in p['final_loss'])} | "
                     f"{', '.join(_f(x, 2) for x in p['final_accuracy'] if x is not None)} |")
    sp = stats["same_pairs"]
    if sp:
        tot = sum(v["prompts"] for v in sp.values())
        same = sum(v["same_pair"] for v in sp.values())
        same_r = sum(v["same_rejected_reward"] for v in sp.values())
        lines += ["", f"Sweet-spot's pair is best-worst's first pair (the best with the worst) on {same} of {tot} "
                  f"training prompts ({same / tot:.0%}); its rejected response has the worst response's reward on "
                  f"{same_r} ({same_r / tot:.0%}). Per seed: "
                  + "; ".join(f"seed {s}: {v['same_pair']} / {v['same_rejected_reward']} of {v['prompts']}"
                              for s, v in sp.items()) + "."]
    lines += ["", "## Outcome", "", *outcome_lines(stats)]
    lines += ["", "## Held-out results", "",
              "Means over seeds (each seed: the mean over the held-out prompts).", "",
              "| policy | greedy valid | sampled valid | reference loss | greedy reward | greedy is a number | seeds |",
              "|---|---|---|---|---|---|---|"]
    for kind, lv in stats["levels"].items():
        lines.append(f"| `{kind}` | {_f(lv['greedy_valid'])} | {_f(lv['sample_valid'])} | "
                     f"{_f(lv['reference_loss'])} | {_f(lv['greedy_reward'])} | {_f(lv['greedy_number'])} | "
                     f"{len(lv['seeds'])} |")
    seeds = sorted({s for lv in stats["levels"].values() for s in lv["per_seed"]["greedy_valid"]})
    if seeds:
        lines += ["", "Per seed, greedy valid rate / reference loss:", "",
                  "| policy | " + " | ".join(f"seed {s}" for s in seeds) + " |", "|---|" + "---|" * len(seeds)]
        for kind, lv in stats["levels"].items():
            ps = lv["per_seed"]
            lines.append(f"| `{kind}` | " + " | ".join(
                f"{_f(ps['greedy_valid'][s])} / {_f(ps['reference_loss'][s])}" if s in ps["greedy_valid"] else "–"
                for s in seeds) + " |")
    lines += ["", "## Paired differences", "",
              "a - b, mean over seeds x held-out prompts, with the 95% bootstrap interval. Intervals that contain 0 "
              "show no difference at this sample size.", "",
              "| a - b | greedy valid | sampled valid | reference loss | greedy reward | greedy is a number |",
              "|---|---|---|---|---|---|"]
    by = {(d["a"], d["b"], d["metric"]): d for d in stats["differences"]}
    for a, b in COMPARISONS:
        row = [f"`{a}` - `{b}`"]
        for m in METRICS:
            d = by.get((a, b, m))
            row.append("–" if d is None else f"{d['difference']:+.3f} {_iv(d['interval'])}")
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "## The predictions", "",
              "| | prediction | source | difference | 95% interval | verdict |", "|---|---|---|---|---|---|"]
    for p in stats["predictions"]:
        diff = "–" if p["difference"] is None else f"{p['difference']:+.3f}"
        lines.append(f"| {p['id']} | {p['text']} | {p['source']} | {diff} | {_iv(p['interval'])} | {p['verdict']} |")
    no_diff = [f"`{d['a']}` - `{d['b']}` ({d['metric'].replace('_', ' ')})" for d in stats["differences"]
               if d["interval"][0] <= 0 <= d["interval"][1]]
    if no_diff:
        lines += ["", "No difference (the interval contains 0): " + ", ".join(no_diff) + "."]
    lines += ["", "## Cost", "",
              "Seconds per cell (one CPU thread of a 2-core machine shared with other work; the start adapter is "
              "trained once per seed and shared by the cells of that seed, so SFT start is 0 where the adapter was "
              "already on disk):", "", "| cell | total | SFT start | DPO training | evaluation |", "|---|---|---|---|---|"]
    for n, t in stats["timing"].items():
        lines.append(f"| {n} | {_f(t['seconds'], 0)} | {_f(t['start_seconds'], 0)} | {_f(t['train_seconds'], 0)} | "
                     f"{_f(t['eval_seconds'], 0)} |")
    lines += ["", "## Reproduce", "", "```bash", f"{COMMAND} --part 0/2 &", f"{COMMAND} --part 1/2",
              f"{COMMAND} --report", "```", "",
              "Cells: `bench/results/llm_evidence_v2/dpo_rules/`; statistics: "
              "`bench/results/llm_evidence_v2/dpo_rules.json`.", ""]
    return "\n".join(lines)


def write_report(cell_dir: Path, json_out: Path, doc_out: Path, cfg: dict, predictions_path: Path,
                 n_boot: int = 2000) -> dict:
    from llm_evidence.stage_a import sha256

    predictions = json.loads(Path(predictions_path).read_text())
    cells, stale = load_cells(cell_dir, sha256(predictions_path))
    stats = statistics(cells, cfg, predictions, n_boot)
    stats["predictions_sha256"] = sha256(predictions_path)
    stats["stale"] = stale
    write_atomic(json_out, json.loads(json.dumps(stats, default=float)))
    write_atomic(doc_out, render(stats, cfg, predictions, stale))
    return {"cells": len(cells), "complete": stats["complete"], "stale": len(stale),
            "verdicts": {p["id"]: p["verdict"] for p in stats["predictions"]}}
