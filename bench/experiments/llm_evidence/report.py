"""Tables, figures and the paper's checks from the cell results of `run.py`.

    python bench/experiments/llm_evidence/report.py          # docs/results/llm_evidence.md + docs/results/llm_evidence_*.png

Intervals are 95% percentile bootstraps over seeds and held-out prompts (the
seeds of a cell resampled with replacement, the held-out prompts resampled
with replacement and shared across the cells compared, so a gain is paired
over prompts). Cells not yet run are listed as pending.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(HERE.parent))

from llm_evidence.run import FULL, HIGH, QUICK, budget_prompts, cells  # noqa: E402

COMMAND = "python bench/experiments/llm_evidence/run.py"
PAPER = [  # Table 2 of the paper: dataset, V_y|x / V_x, K*_10, R1oN -> R2oN, gain %
    ("CodeContests", 1.102, 3.32, "0.792 → 0.712", 10.1),
    ("Gold", 0.751, 2.74, "1.556 → 1.515", 2.6),
    ("UltraFeedback", 0.136, 1.17, "1.052 → 1.038", 1.3),
    ("Nectar", 0.122, 1.10, "0.909 → 0.893", 1.8),
]
N_BOOT = 2000


def load(results: Path) -> dict[str, dict]:
    out = {}
    for p in sorted(results.glob("*.json")):
        d = json.loads(p.read_text())
        if "cell" in d:
            out[d["cell"]] = d
    return out


def prompt_sums(res: dict) -> tuple[np.ndarray, np.ndarray]:
    """Per held-out prompt: the sum of reference-token losses and the number of reference tokens."""
    per, ns, r = np.asarray(res["per_reference"]), np.asarray(res["ref_tokens"], float), res["n_refs_per_prompt"]
    return (per * ns).reshape(-1, r).sum(1), ns.reshape(-1, r).sum(1)


def group(cellmap: dict, names: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
    return [prompt_sums(cellmap[n]["result"]) for n in names if n in cellmap]


def _boot_means(g, rng, pidx) -> np.ndarray:
    """Bootstrap replicates of the seed-mean token-weighted loss, prompts resampled by ``pidx`` (B x P)."""
    ls = np.stack([x[0] for x in g])  # S x P
    ts = np.stack([x[1] for x in g])
    sidx = rng.integers(0, len(g), size=(pidx.shape[0], len(g)))
    num = ls[:, pidx].sum(-1)  # S x B
    den = ts[:, pidx].sum(-1)
    per_seed = num / den
    return np.take_along_axis(per_seed.T, sidx, 1).mean(1)


def point(g) -> float:
    return float(np.mean([x[0].sum() / x[1].sum() for x in g]))


def interval(g, seed: int = 0) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    pidx = rng.integers(0, len(g[0][0]), size=(N_BOOT, len(g[0][0])))
    b = _boot_means(g, rng, pidx)
    return float(np.quantile(b, 0.025)), float(np.quantile(b, 0.975))


def gain(g1, g2, seed: int = 0) -> tuple[float, float, float]:
    """Relative gain (L1 - L2) / L1 in %, with its interval (prompts paired)."""
    rng = np.random.default_rng(seed)
    pidx = rng.integers(0, len(g1[0][0]), size=(N_BOOT, len(g1[0][0])))
    b1, b2 = _boot_means(g1, rng, pidx), _boot_means(g2, rng, pidx)
    l1, l2 = point(g1), point(g2)
    r = 100 * (b1 - b2) / b1
    return 100 * (l1 - l2) / l1, float(np.quantile(r, 0.025)), float(np.quantile(r, 0.975))


def paired_delta(ga, gb, seed: int = 0) -> tuple[float, float, float]:
    """point(ga) - point(gb) of two cells with the same seeds and held-out prompts, and its 95% interval: seeds
    and prompts resampled with the same draws for both."""
    if len(ga) != len(gb):  # a partial grid: the seeds done differ, and the cells cannot be paired yet
        return point(ga) - point(gb), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    la, ta = np.stack([x[0] for x in ga]), np.stack([x[1] for x in ga])
    lb, tb = np.stack([x[0] for x in gb]), np.stack([x[1] for x in gb])
    s, p = la.shape
    reps = np.empty(N_BOOT)
    for b in range(N_BOOT):
        si, pi = rng.integers(0, s, s), rng.integers(0, p, p)
        ra = la[si][:, pi].sum(1) / ta[si][:, pi].sum(1)
        rb = lb[si][:, pi].sum(1) / tb[si][:, pi].sum(1)
        reps[b] = ra.mean() - rb.mean()
    return point(ga) - point(gb), float(np.quantile(reps, 0.025)), float(np.quantile(reps, 0.975))


def gain_difference(g1a, g2a, g1b, g2b, seed: int = 0) -> tuple[float, float, float]:
    """Gain of task a minus gain of task b (percentage points) and its 95% interval; the tasks have their own
    prompts and seeds, so each is resampled on its own (its K cells paired as in `gain`)."""
    rng = np.random.default_rng(seed)

    def reps(g1, g2):
        pidx = rng.integers(0, len(g1[0][0]), size=(N_BOOT, len(g1[0][0])))
        b1, b2 = _boot_means(g1, rng, pidx), _boot_means(g2, rng, pidx)
        return 100 * (b1 - b2) / b1

    d = reps(g1a, g2a) - reps(g1b, g2b)
    pt = 100 * ((point(g1a) - point(g2a)) / point(g1a) - (point(g1b) - point(g2b)) / point(g1b))
    return pt, float(np.quantile(d, 0.025)), float(np.quantile(d, 0.975))


def holds_zero(lo: float, hi: float) -> bool:
    """Whether a difference's interval holds 0 (also when it could not be computed: nothing is shown then)."""
    return not (lo > 0 or hi < 0)


def mean_of(cellmap, names, key) -> float:
    v = [cellmap[n]["result"][key] for n in names if n in cellmap]
    return float(np.mean(v)) if v else float("nan")


def kept(cm, names) -> float:
    """Mean responses kept per prompt (K, or the pool size where a prompt has fewer valid answers)."""
    v = [cm[n]["result"]["n_pairs"] / cm[n]["result"]["n_prompts"] for n in names if n in cm]
    return float(np.mean(v)) if v else float("nan")


def f(x, nd=3) -> str:
    if isinstance(x, str):
        return x
    if x is None or (isinstance(x, float) and not np.isfinite(x)):
        return "∞" if x == float("inf") else "n/a"
    return f"{x:.{nd}f}"


def ci(lo_hi, nd=3) -> str:
    lo, hi = lo_hi
    return f"[{f(lo, nd)}, {f(hi, nd)}]"


def _num(x) -> float:
    if x is None:
        return float("nan")
    if isinstance(x, str):
        return float(x)
    return float(x)


def step_differences(m: dict, task: str, cfg: dict) -> list[str]:
    """Each step of K (K to the next K) at matched steps: L(next) − L(K), paired over seeds × prompts, with its
    95% interval, and "falls" / "rises" only where the interval excludes 0."""
    out = []
    for a, b in zip(cfg["ks"], cfg["ks"][1:]):
        seeds = [s for s in cfg["seeds"] if f"matched-{task}-k{a}-s{s}" in m and f"matched-{task}-k{b}-s{s}" in m]
        if not seeds:
            continue
        ga = group(m, [f"matched-{task}-k{a}-s{s}" for s in seeds])
        gb = group(m, [f"matched-{task}-k{b}-s{s}" for s in seeds])
        d, lo, hi = paired_delta(gb, ga)
        verdict = "interval holds 0" if holds_zero(lo, hi) else "falls" if hi < 0 else "rises"
        note = "" if len(seeds) == len(cfg["seeds"]) else f" (seeds {seeds})"
        out.append(f"L(K={b}) − L(K={a}) = {f(d)} {ci((lo, hi))}{note}, {verdict}")
    return out


def seed_matched(ma: dict, mb: dict, names: list[str]) -> tuple[list, list]:
    """The cells of ``names`` present in both maps, as two groups in the same seed order (for pairing)."""
    both = [n for n in names if n in ma and n in mb]
    return group(ma, both), group(mb, both)


def gpu_section(cfg: dict, cm: dict, gpu_dir: Path) -> str:
    """The matched-step cells run again on a GPU (``run.py --device cuda --results <dir>_gpu``),
    beside the same cells on the CPU."""
    gm = {k: v for k, v in load(gpu_dir).items() if v.get("config") == cfg}
    if not gm:
        return ""
    devices = sorted({v.get("device", "?") for v in gm.values()})
    L = ["\n### The same cells on a GPU\n",
         f"The matched-step cells of `multiple` and `expression` run again with `run.py --device "
         f"{'/'.join(devices)}` (`bench/results/llm_evidence_gpu/`) on one NVIDIA H200: the same data, "
         "seeds and steps; training in float32 and evaluation in bfloat16 (the `auto` dtype on CUDA). "
         "Mean over the seeds done, 95% percentile-bootstrap interval over seeds and prompts; GPU − CPU: the "
         "difference of the seed means over the seeds done on both, paired over seeds × held-out prompts (the "
         "same resampled seeds and prompts for both devices), with its 95% percentile-bootstrap interval. "
         "s / cell: the cells' recorded run times, mean over seeds; the CPU cells ran on 2 shared cores.\n",
         "| task | K | ref loss, GPU | 95% CI | seeds | ref loss, CPU | GPU − CPU, paired [95% CI] "
         "| s / cell, GPU | s / cell, CPU |",
         "|---|---|---|---|---|---|---|---|---|"]
    for t in cfg["tasks"]:
        for k in cfg["ks"]:
            nm = [f"matched-{t}-k{k}-s{s}" for s in cfg["seeds"]]
            g = group(gm, nm)
            if not g:
                continue
            c = group(cm, nm)
            sec = lambda m: f(float(np.mean([m[n]["seconds"] for n in nm if n in m])), 1)  # noqa: E731
            gg, gc = seed_matched(gm, cm, nm)
            if gg:
                d, lo, hi = paired_delta(gg, gc)
                diff = f"{f(d)} {ci((lo, hi))}"
            else:
                diff = ""
            L.append(f"| {t} | {k} | {f(point(g))} | {ci(interval(g))} | {len(g)}/{len(cfg['seeds'])} "
                     f"| {f(point(c)) if c else 'pending'} | {diff} | {sec(gm)} | {sec(cm) if c else ''} |")
    steps = []
    for t in cfg["tasks"]:
        if t not in {n.split("-")[1] for n in gm}:
            continue
        for where, m in (("GPU", gm), ("CPU", cm)):
            d = step_differences(m, t, cfg)
            if len(d) == len(cfg["ks"]) - 1:
                steps.append(f"  - {t} on the {where}: " + "; ".join(d) + ".")
    if steps:
        L.append("\nReference loss from each K to the next, paired over seeds × held-out prompts (95% "
                 "percentile-bootstrap interval; \"falls\" or \"rises\" only where the interval excludes 0):\n")
        L.extend(steps)
    return "\n".join(L) + "\n"


def report(results: Path, quick: bool = False, docs: Path | None = None) -> str:
    cfg = QUICK if quick else FULL
    cm = load(results)
    # only cells of this configuration count
    cm = {k: v for k, v in cm.items() if v.get("config") == cfg}
    all_cells = [n for n, _ in cells(cfg)]
    pending = [n for n in all_cells if n not in cm]
    ks, seeds, tasks = cfg["ks"], cfg["seeds"], cfg["tasks"]
    c = cfg["cost_prompt"] / cfg["cost_response"]
    L = []
    w = L.append

    def names(design, task, k):
        if design == "budget" and k == 1:
            design = "matched"
        return [f"{design}-{task}-k{k}-s{s}" for s in seeds]

    # ---------------------------------------------------------------- prediction
    pred = {}
    w("## 1. Prediction from the base model (before any training)\n")
    w(f"`variance_budget` on the base model's per-response losses (`nll_table`) over the {cfg['n_train']} "
      f"training prompts × {cfg['pool_size']} candidates (fewer where a prompt has fewer valid answers); "
      f"C_p / C_r = {c:g} (the paper's K*₁₀); 95% bootstrap intervals over prompts, the prompts resampled with "
      "replacement; the column interval names the method each row's report used (`variance_budget`'s `interval` "
      "field: `studentized` is bootstrap-t, `expanded` the percentile interval at the t-expanded tail; see "
      "[the variance guide](../guides/variance.md)); with V_y|x = 0 or V_x = 0 the interval of the ratio is "
      "degenerate at that end.\n")
    w("| task | V_x | V_y\\|x | V_y\\|x / V_x | K* (c = 10) | k_best | interval |")
    w("|---|---|---|---|---|---|---|")
    for t in tasks:
        p = cm.get(f"pilot-{t}")
        if not p:
            w(f"| {t} | pending | | | | | |")
            continue
        r = p["result"]["report"]
        ci_ = r.get("ci", {})
        ratio = _num(r["ratio"])
        pred[t] = dict(ratio=ratio, k_star=_num(r["k_star"]), ci=[_num(x) for x in ci_.get("k_star", [None, None])],
                       k_best=r["k_best"])
        w(f"| {t} | {f(_num(r['v_x']), 4)} {ci([_num(x) for x in ci_.get('v_x', [None, None])], 4)} "
          f"| {f(_num(r['v_y_given_x']), 4)} {ci([_num(x) for x in ci_.get('v_y_given_x', [None, None])], 4)} "
          f"| {f(ratio, 2)} {ci([_num(x) for x in ci_.get('ratio', [None, None])], 2)} "
          f"| {f(pred[t]['k_star'], 2)} {ci(pred[t]['ci'], 2)} | {r['k_best']} "
          f"| {r.get('interval', 'not recorded')}, {r.get('n_boot', '?')} resamples |")
    w("\nThe paper's Table 2 (Llama-3.1-8B-Instruct, for comparison):\n")
    w("| dataset | V_y\\|x / V_x | K*₁₀ | R1oN → R2oN | gain |")
    w("|---|---|---|---|---|")
    for d, ra, k, tr, gpc in PAPER:
        w(f"| {d} | {ra:.3f} | {k:.2f} | {tr} | {gpc}% |")

    # ---------------------------------------------------------------- matched steps
    w("\n## 2. Matched optimizer steps: held-out reference loss by K (random-K)\n")
    w(f"LoRA r {cfg['lora_r']}, {cfg['steps']} optimizer steps of {cfg['batch_size']} pairs, lr {cfg['lr']:g}, "
      f"{cfg['n_train']} training prompts, {cfg['n_heldout']} held-out prompts × {cfg['n_refs']} held-out "
      f"references; mean over seeds {seeds} with a 95% interval over seeds and prompts. "
      f"Coverage: the product's embedding coverage of the {cfg['n_samples']} samples per prompt (hashing "
      "embedder); valid: share of samples the task's checker accepts; distinct: distinct valid samples / samples.\n")
    w("| task | K | kept / prompt | ref loss | 95% CI | coverage | valid | distinct | seeds done |")
    w("|---|---|---|---|---|---|---|---|---|")
    matched = {}
    for t in tasks:
        b = cm.get(f"base-{t}")
        if b:
            g = [prompt_sums(b["result"])]
            w(f"| {t} | base | | {f(point(g))} | | {f(b['result']['coverage'])} | {f(b['result']['valid_rate'], 2)} "
              f"| {f(b['result']['distinct_valid'], 2)} | |")
        for k in ks:
            nm = names("matched", t, k)
            g = group(cm, nm)
            if not g:
                w(f"| {t} | {k} | | pending | | | | | 0/{len(seeds)} |")
                continue
            matched[(t, k)] = g
            w(f"| {t} | {k} | {f(kept(cm, nm), 1)} | {f(point(g))} | {ci(interval(g))} | {f(mean_of(cm, nm, 'coverage'))} "
              f"| {f(mean_of(cm, nm, 'valid_rate'), 2)} | {f(mean_of(cm, nm, 'distinct_valid'), 2)} "
              f"| {len(g)}/{len(seeds)} |")

    gpu_dir = results.parent / (results.name + "_gpu")
    if not quick and gpu_dir.is_dir():
        w(gpu_section(cfg, cm, gpu_dir))

    # ---------------------------------------------------------------- R1oN -> R2oN
    w("\n## 3. R1oN → R2oN gain against the predicted ratio\n")
    w("| task | V_y\\|x / V_x (pilot) | K* (c = 10) | R1oN → R2oN | gain | 95% CI |")
    w("|---|---|---|---|---|---|")
    gains = {}
    for t in tasks:
        if (t, 1) in matched and (t, 2) in matched and t in pred:
            g1, g2 = matched[(t, 1)], matched[(t, 2)]
            gains[t] = gain(g1, g2)
            w(f"| {t} | {f(pred[t]['ratio'], 2)} | {f(pred[t]['k_star'], 2)} | {f(point(g1))} → {f(point(g2))} "
              f"| {f(gains[t][0], 1)}% | [{f(gains[t][1], 1)}%, {f(gains[t][2], 1)}%] |")
        else:
            w(f"| {t} | {f(pred.get(t, {}).get('ratio', float('nan')), 2)} | | pending | | |")

    # ---------------------------------------------------------------- budget
    w("\n## 4. Fixed budget: N_p × (C_p + K C_r) = "
      f"{cfg['n_train'] * (cfg['cost_prompt'] + cfg['cost_response']):g}, C_p = {cfg['cost_prompt']:g}, "
      f"C_r = {cfg['cost_response']:g}\n")
    w(f"N_p(K) = floor(B / (C_p + K C_r)) prompts with K random responses each, {cfg['steps']} optimizer "
      "steps for every K (K = 1 is the matched K = 1 cell).\n")
    w("| task | K | N_p | kept / prompt | ref loss | 95% CI | seeds done |")
    w("|---|---|---|---|---|---|---|")
    budget = {}
    for t in tasks:
        for k in ks:
            g = group(cm, names("budget", t, k))
            if not g:
                w(f"| {t} | {k} | {budget_prompts(cfg, k)} | | pending | | 0/{len(seeds)} |")
                continue
            budget[(t, k)] = g
            w(f"| {t} | {k} | {budget_prompts(cfg, k)} | {f(kept(cm, names('budget', t, k)), 1)} | {f(point(g))} | {ci(interval(g))} | {len(g)}/{len(seeds)} |")

    # ---------------------------------------------------------------- selectors
    kk = cfg["select_k"]
    w(f"\n## 5. Selectors at K = {kk} on the high-variance task ({HIGH})\n")
    w("random = random-K (the matched cell); top = the K candidates the base model finds most likely "
      "(reward = −pilot loss, standing in for a reward model); diverse = facility location on the "
      "(hashing) embeddings; grades = quality-weighted facility location (α 0.75); both with "
      "kernel=\"shift\", (1 + c)/2, as in the paper's code.\n")
    w("| selector | ref loss | 95% CI | coverage | diversity | valid | distinct | seeds done |")
    w("|---|---|---|---|---|---|---|---|")
    sel = {}
    for m in ["random"] + cfg["methods"]:
        nm = names("matched", HIGH, kk) if m == "random" else [f"select-{m}-k{kk}-s{s}" for s in seeds]
        g = group(cm, nm)
        if not g:
            w(f"| {m} | pending | | | | | | 0/{len(seeds)} |")
            continue
        sel[m] = dict(loss=point(g), ci=interval(g), g=g, coverage=mean_of(cm, nm, "coverage"),
                      diversity=mean_of(cm, nm, "diversity"))
        w(f"| {m} | {f(point(g))} | {ci(sel[m]['ci'])} | {f(sel[m]['coverage'])} | {f(sel[m]['diversity'])} "
          f"| {f(mean_of(cm, nm, 'valid_rate'), 2)} | {f(mean_of(cm, nm, 'distinct_valid'), 2)} | {len(g)}/{len(seeds)} |")

    # ---------------------------------------------------------------- checks
    w("\n## 6. The paper's checks\n")
    w(checks(cfg, pred, matched, gains, budget, sel))

    w("\n## Pending cells\n")
    w(f"{len(all_cells) - len(pending)} of {len(all_cells)} cells are done."
      + (" Not yet run: " + ", ".join(f"`{p}`" for p in pending) + "." if pending else ""))
    body = "\n".join(L) + "\n"
    figs = figures(cfg, matched, budget, gains, pred, (docs or ROOT / "docs" / "results") if not quick else results)
    if figs:
        body += "\n## Figures\n\n" + "\n".join(f"![{n}]({p})" for n, p in figs) + "\n"
    out = (docs or ROOT / "docs" / "results") / "llm_evidence.md" if not quick else results / "report.md"
    text = (HEADER.format(command=COMMAND, cost=cost_text(cm)) if not quick else "# llm_evidence --quick\n\n") + body
    out.write_text(text)
    return text


def cost_text(cm: dict) -> str:
    """The run times the cells recorded, summed: the measured cost of the grid."""
    secs = {n: float(c["seconds"]) for n, c in cm.items() if "seconds" in c}
    if not secs:
        return "The cells present record no run times."
    train = [v for n, v in secs.items() if not n.startswith(("pilot-", "base-"))]
    other = sum(v for n, v in secs.items() if n.startswith(("pilot-", "base-")))
    txt = (f"The {len(secs)} cells present record their run times (`seconds`, wall clock of the cell on 2 "
           f"shared CPU cores): {sum(secs.values()) / 3600:.2f} hours in all")
    if train:
        txt += (f", of which {sum(train) / 3600:.2f} hours for the {len(train)} training cells (median "
                f"{np.median(train):.0f} s, range {min(train):.0f} to {max(train):.0f} s per cell) and "
                f"{other / 60:.1f} minutes for the pilots and base-model evaluations")
    return txt + "."


def checks(cfg, pred, matched, gains, budget, sel) -> str:
    ks, tasks = cfg["ks"], cfg["tasks"]
    out = []
    # 1. loss falls with K at matched steps
    lines = []
    for t in tasks:
        pts = [(k, point(matched[(t, k)]), interval(matched[(t, k)])) for k in ks if (t, k) in matched]
        if len(pts) < 2:
            continue
        steps = []
        for a, b in zip(pts, pts[1:]):
            d, dlo, dhi = paired_delta(matched[(t, b[0])], matched[(t, a[0])])
            steps.append(f"L(K={b[0]}) − L(K={a[0]}) = {f(d)} [{f(dlo)}, {f(dhi)}] "
                         + ("(holds 0)" if holds_zero(dlo, dhi) else "(falls)" if dhi < 0 else "(rises)"))
        lo, hi = pts[0], pts[-1]
        d, dlo, dhi = paired_delta(matched[(t, hi[0])], matched[(t, lo[0])])
        lines.append(f"  - {t}: " + ", ".join(f"K={k}: {f(v)}" for k, v, _ in pts)
                     + ". Each step of K, paired over seeds × prompts: " + "; ".join(steps) + ". End to end: "
                     f"L(K={hi[0]}) − L(K={lo[0]}) = {f(d)} [{f(dlo)}, {f(dhi)}] (paired over seeds × prompts): "
                     + ("the interval holds 0, so these cells do not tell K=%d from K=%d." % (hi[0], lo[0])
                        if holds_zero(dlo, dhi) else ("lower at K=%d." % hi[0] if dhi < 0 else
                                                      "higher at K=%d." % hi[0])))
    out.append("**Does reference loss fall with K at matched steps?**\n" + ("\n".join(lines) or "  - pending"))
    # 2. gain ordered as ratios
    done = [t for t in cfg["tasks"] if t in gains and t in pred]
    if len(done) >= 2:
        by_ratio = sorted(done, key=lambda t: pred[t]["ratio"])
        by_gain = sorted(done, key=lambda t: gains[t][0])
        same = by_ratio == by_gain
        r_txt = " < ".join(t + " (" + f(pred[t]["ratio"], 2) + ")" for t in by_ratio)
        g_txt = " < ".join(t + " (" + f(gains[t][0], 1) + "%)" for t in by_gain)
        txt = (f"By pilot ratio: {r_txt}. By R1oN → R2oN gain: {g_txt}. "
               + ("The orders agree" if same else "The orders differ"))
        # neighbours in ratio order: the difference of their gains and its interval
        diffs = []
        for a, b in zip(by_ratio, by_ratio[1:]):
            d, dlo, dhi = gain_difference(matched[(b, 1)], matched[(b, 2)], matched[(a, 1)], matched[(a, 2)])
            diffs.append(f"{b} − {a}: {f(d, 1)} points [{f(dlo, 1)}, {f(dhi, 1)}]"
                         + (" (holds 0)" if holds_zero(dlo, dhi) else ""))
        undecided = [x for x in diffs if x.endswith("(holds 0)")]
        txt += ". Gain differences of neighbours in ratio order: " + "; ".join(diffs) + (
            ". Where an interval holds 0 these cells do not order the two tasks." if undecided else ".")
    else:
        txt = "pending"
    out.append("**Is the R1oN → R2oN gain ordered as the tasks' ratios are?**\n  - " + txt)
    # 3. budget best K inside K*'s interval
    lines = []
    for t in tasks:
        pts = [(k, point(budget[(t, k)])) for k in ks if (t, k) in budget]
        if len(pts) < len(ks) or t not in pred:
            continue
        kb = min(pts, key=lambda x: x[1])[0]  # the K of the lowest mean loss
        lo, hi = pred[t]["ci"]
        # the grid doubles: the interval is clipped to the grid's range and widened by half a step (a factor sqrt 2)
        clo, chi = min(max(lo, ks[0]), ks[-1]), min(max(hi, ks[0]), ks[-1])

        def inside(k):
            return bool(clo / np.sqrt(2) <= k <= chi * np.sqrt(2))

        # every other K against the lowest mean: the K its paired interval does not separate from it are tied
        near, tied = [], [kb]
        for k2 in [k for k, _ in pts if k != kb]:
            d, dlo, dhi = paired_delta(budget[(t, kb)], budget[(t, k2)])
            near.append(f"L(K={kb}) − L(K={k2}) = {f(d)} [{f(dlo)}, {f(dhi)}]" + (" (holds 0)" if holds_zero(dlo, dhi)
                                                                                  else ""))
            if holds_zero(dlo, dhi):
                tied.append(k2)
        tied.sort()
        ins = [k for k in tied if inside(k)]
        if len(tied) == 1:
            verdict = f"K = {kb} is {'inside' if ins else 'outside'} the interval"
        elif len(ins) == len(tied):
            verdict = "every K these cells do not separate from it (" + ", ".join(map(str, tied)) + ") is inside the interval"
        elif not ins:
            verdict = "every K these cells do not separate from it (" + ", ".join(map(str, tied)) + ") is outside the interval"
        else:
            verdict = ("not resolved: these cells do not separate K = " + ", ".join(map(str, tied))
                       + ", of which K = " + ", ".join(map(str, ins)) + " is inside the interval and K = "
                       + ", ".join(str(k) for k in tied if k not in ins) + " outside")
        lines.append(f"  - {t}: lowest mean loss on the budget curve at K = {kb} ("
                     + ", ".join(f"K={k}: {f(v)}" for k, v in pts) + "). Against every other K, paired over "
                     "seeds × held-out prompts (95% percentile bootstrap): " + "; ".join(near)
                     + f". K* = {f(pred[t]['k_star'], 2)} [{f(lo, 2)}, {f(hi, 2)}] (clipped to the K tried and "
                     f"widened by half a grid step): {verdict}.")
    out.append("**Does the K of the budget curve's lowest mean loss sit inside K*'s interval?**\n"
               + ("\n".join(lines) or "  - pending"))
    # 4. selectors
    if len(sel) >= 2:
        rank = sorted(sel, key=lambda m: sel[m]["loss"])
        l_txt = ", ".join(m + " " + f(sel[m]["loss"]) for m in rank)
        txt = (f"By mean reference loss (lower first): {l_txt}. "
               f"Highest mean diversity: {max(sel, key=lambda m: sel[m]['diversity'])}; highest mean coverage: "
               f"{max(sel, key=lambda m: sel[m]['coverage'])} (means over seeds, no interval). The paper (Gold, "
               "Table 5): random best reference loss, top worst diversity, diverse best diversity, GRADES best "
               "coverage.")
        if rank[0] == "random":
            txt += " Random has the lowest mean loss."
        else:
            d, dlo, dhi = paired_delta(sel["random"]["g"], sel[rank[0]]["g"])
            txt += (f" L(random) − L({rank[0]}) = {f(d)} [{f(dlo)}, {f(dhi)}] (paired over seeds × prompts): "
                    + ("the interval holds 0, so these cells do not tell random from "
                       f"{rank[0]}." if holds_zero(dlo, dhi) else f"random is worse than {rank[0]}."))
    else:
        txt = "pending"
    out.append("**Do the selectors rank as the paper reports?**\n  - " + txt)
    return "\n\n".join(out) + "\n"


def figures(cfg, matched, budget, gains, pred, where: Path) -> list[tuple[str, str]]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        return []
    figs = []
    if matched or budget:
        fig, axes = plt.subplots(1, len(cfg["tasks"]), figsize=(4 * len(cfg["tasks"]), 3.2))
        for ax, t in zip(np.atleast_1d(axes), cfg["tasks"]):
            for design, d, mk in (("matched steps", matched, "o-"), ("fixed budget", budget, "s--")):
                pts = [(k, point(d[(t, k)]), interval(d[(t, k)])) for k in cfg["ks"] if (t, k) in d]
                if pts:
                    x = np.array([p[0] for p in pts])
                    y = np.array([p[1] for p in pts])
                    e = np.array([[p[1] - p[2][0], p[2][1] - p[1]] for p in pts]).T
                    ax.errorbar(x, y, yerr=e, fmt=mk, capsize=3, label=design)
            if t in pred and np.isfinite(pred[t]["k_star"]):
                ax.axvline(pred[t]["k_star"], color="grey", ls=":", label="K* (pilot)")
            ax.set_xscale("log", base=2)
            ax.set_title(t)
            ax.set_xlabel("K")
        np.atleast_1d(axes)[0].set_ylabel("held-out reference loss")
        np.atleast_1d(axes)[0].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(where / "llm_evidence_k.png", dpi=110)
        plt.close(fig)
        figs.append(("reference loss by K", "llm_evidence_k.png"))
    if gains:
        fig, ax = plt.subplots(figsize=(5.2, 3.4))
        # a log axis holds neither 0 (V_y|x = 0) nor inf (V_x = 0): those tasks sit at its ends, labelled
        finite = [pred[t]["ratio"] for t in gains if 0 < pred[t]["ratio"] < np.inf] + [r[1] for r in PAPER]
        lo_x, hi_x = min(finite) / 4, max(finite) * 4
        for t, (gv, lo, hi) in gains.items():
            r = pred[t]["ratio"]
            x = lo_x if r <= 0 else hi_x if not np.isfinite(r) else r
            ax.errorbar([x], [gv], yerr=[[gv - lo], [hi - gv]], fmt="o", capsize=3)
            name = t + (" (ratio 0)" if r <= 0 else " (ratio ∞)" if not np.isfinite(r) else "")
            ax.annotate(name, (x, gv), fontsize=8, xytext=(4, 4), textcoords="offset points",
                        ha="right" if x == hi_x else "left")
        for d, ra, _, _, gpc in PAPER:
            ax.plot([ra], [gpc], "x", color="grey")
            ax.annotate(d, (ra, gpc), fontsize=6, color="grey", xytext=(3, -8), textcoords="offset points")
        ax.axhline(0, color="k", lw=0.5)
        ax.set_xscale("log")
        ax.set_xlim(lo_x / 1.5, hi_x * 1.5)
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("V_y|x / V_x (pilot)")
        ax.set_ylabel("R1oN → R2oN gain (%)")
        fig.tight_layout()
        fig.savefig(where / "llm_evidence_gain.png", dpi=110)
        plt.close(fig)
        figs.append(("R1oN to R2oN gain against the ratio (grey: the paper's datasets)", "llm_evidence_gain.png"))
    return figs


HEADER = """# The variance-budget law on a real language model

This page asks, on SmolLM2-135M-Instruct (the bundled GGUF model) fine-tuned
with LoRA on a CPU, the questions the paper answers with 8B models on GPUs:
does the pilot's V_y|x / V_x predict where more responses per prompt help,
and does K* predict the best K at a fixed budget? Everything runs on the
product's own stages: `nll_table` → `variance_budget` (predict), `select` →
`train` → held-out reference loss and `evaluate` (measure).

Its follow-up, a pre-registered test on twelve task families with warm
pilots (the pilot scored in the training format), is
[llm_evidence_v2.md](llm_evidence_v2.md).

Regenerate (resumable: each cell is written to
`bench/results/llm_evidence/<cell>.json`, and a rerun skips finished cells):

```bash
{command}            # the full grid; then this page and its figures
python bench/experiments/llm_evidence/report.py     # this page only, from the cells present
python bench/experiments/llm_evidence/run.py --quick  # a miniature (the CI test)
```

**Tasks** (`bench/experiments/llm_evidence/tasks.py`, generated in code):

* `product` (unique answer): "What is a * b?"; the one valid response is
  the product ("408"). Responses are draws from the answer set, so K responses
  are K copies of it: V_y|x = 0, the control where more responses buy nothing.
  (Letting two spellings such as "408" and "408." both count makes V_y|x
  large instead: the base model's loss on where the answer ends differs by
  several nats between them, far more than between prompts.)
* `multiple` (in between): "Name one multiple of d between lo and hi"; 6 to
  12 valid numbers.
* `expression` (many equally valid answers): "Write an arithmetic expression
  with two numbers whose value is n"; every `a + b`, `a - b`, `a * b` equal to n
  (over 100 per prompt).

Prompts end with a newline and are shown as plain text (no chat template,
which would triple the tokens per pair). Training prompts offer a candidate
pool of their first 8 valid responses (6 or more for `multiple`, so there K = 8
may keep fewer); held-out prompts are never trained on and carry 4 valid
references each. The reference loss is the training loss (mean token NLL of the
response and its EOS, prompt masked), token-weighted over all references.

**Grid and cost.** 3 pilots, 3 base-model evaluations and 72 training cells
(36 matched-step, 27 fixed-budget, 9 selector; 3 seeds each): 78 cells.
{cost} The run resumes where it stopped.

**Limits.** A 135M model, 32 LoRA steps and generated arithmetic tasks are far
from the paper's 8B models, 200 steps and natural data: the question here is
whether the law's predictions hold in direction, with intervals honest about
the noise. `top` ranks candidates by the base model's likelihood, not by a
reward model, and the embedding coverage uses a character-trigram hashing
embedder, which on short numeric strings measures surface overlap.

"""


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--results", type=Path, default=None)
    a = ap.parse_args()
    res = a.results or HERE.parents[1] / "results" / ("llm_evidence_quick" if a.quick else "llm_evidence")
    report(res, quick=a.quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
