"""Selection quality on ground truth: pools with known modes and rewards.

Five kinds of pools, all built offline:

* ``docstrings``: text pools whose modes are different sources (docstring
  paragraphs of different installed packages), 1 to 4 sources per pool, each
  source with its own quality level (reward = source level + noise), and a few
  exact repeats per pool; embedded with the bundled MiniLM (or the static
  tier with ``--static``);
* ``answers``: 1 to 4 distinct answers per pool (docstring paragraphs), each
  given several times reworded (a share of its words dropped, 10% to 70% by
  pool, and its ends cut), each answer with its own quality level: modes that
  are variations of the same answer, separated or not by the rewording;
* ``approaches``: 1 to 4 distinct approaches to one prompt (the MOSAIC
  examples, 4 approaches to each of 8 prompts), each given several times
  lightly reworded (10% to 30% of its words dropped, ends cut): modes as
  close to each other as real approaches to one prompt are;
* ``controlled``: the paper's controlled setup (experiment c): responses
  y = f(x) + offset_m + noise with three modes, reward -(y - f(x))^2,
  embedded as Gaussian bumps (as ``mrt simulate`` does);
* ``mosaic``: the bundled MOSAIC examples (8 prompts x 4 responses, each a
  different approach, i.e. its own mode).

For every selector at K = 2, 4, 8 (each with the library's defaults: kernel
"clip" for diverse and GRADES; ``grades_shift`` is GRADES with kernel
"shift", the paper's code): mode coverage (distinct modes kept over
min(K, modes in the pool)), mean reward kept (pool-normalised to [0, 1]),
duplicates kept while distinct candidates remained, picks decided by the tie
rule, zero-gain picks, and pools whose kept rows change when the rows are
shuffled. GRADES' alpha sweep (0, 0.25, 0.5, 0.75, 1, 2, top) at K = 4 gives
the reward-versus-coverage figure. The mode rule is measured against the
planted modes: adjusted Rand index, and one-mode false positives/negatives,
overall and on the pools whose planted modes are separated: the planted
partition's own mean silhouette (the statistic of the rule, on the truth) is
at least SEPARATED = 0.25, the level Kaufman and Rousseeuw read as the
least structure worth the name. Alongside: k-means given the planted number of
modes (how recoverable the modes are at all), the rule at other silhouette
thresholds and merge cosines (``max_mode_cosine``), the pair cosines within a
planted mode and across two, and a Gaussian reference (split only where the
best silhouette beats that of every one of NULL_DRAWS Gaussian sets with the
pool's mean and covariance).

    python bench/experiments/bench_selection_quality.py            # writes bench/results/selection_quality.json
    python bench/experiments/bench_selection_quality.py --static   # the static embedding tier
"""

from __future__ import annotations

import argparse
import inspect
import json
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import polars as pl

import mrt_fast
from mrt_fast.errors import SmallPoolWarning
from mrt_fast.selection.knn import unit_rows
from mrt_fast.selection.modes import pool_modes, silhouette_score
from mrt_fast.selection.options import DEFAULT_KERNEL, KERNELS

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
KS = (2, 4, 8)
ALPHAS = (0.0, 0.25, 0.5, 0.75, 1.0, 2.0)
SELECTORS = {
    "random": dict(method="random"),
    "top": dict(method="top"),
    "diverse": dict(method="diverse"),
    "grades": dict(method="grades"),
    "grades_shift": dict(method="grades", kernel="shift"),
    "stratified": dict(method="stratified"),
}
#: planted modes whose own mean silhouette reaches this are "separated"
SEPARATED = 0.25
#: thresholds of the silhouette rule measured besides the default
THRESHOLDS = (0.15, 0.2, 0.25, 0.3, 0.4, 0.5)
#: merge thresholds of the mode rule (max_mode_cosine) measured besides the default; 1 merges nothing
MAX_COSINES = (0.6, 0.7, 0.8, 0.9, 1.0)
#: quantiles of the pair cosines reported (within a planted mode, across two)
COS_QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)
#: Gaussian reference sets per pool
NULL_DRAWS = 19
PACKAGES = ("numpy", "polars", "pyarrow", "matplotlib", "rich", "typer", "scipy", "pandas", "hypothesis", "click")


# ---------------------------------------------------------------- pools


def paragraphs(package: str, limit: int = 400) -> list[str]:
    """Docstring paragraphs (80-400 characters of prose) of an installed package."""
    import importlib
    import pkgutil

    try:
        mod = importlib.import_module(package)
    except Exception:  # noqa: BLE001 - a package that is not installed gives nothing
        return []
    mods = [mod]
    for info in pkgutil.iter_modules(getattr(mod, "__path__", []), package + "."):
        if len(mods) > 12 or "test" in info.name or info.name.endswith(("__main__", "cli", "main")):
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                mods.append(importlib.import_module(info.name))
        except Exception:  # noqa: BLE001
            continue
    out, seen = [], set()
    for m in mods:
        for _, obj in sorted(vars(m).items()):
            doc = inspect.getdoc(obj) if callable(obj) or inspect.isclass(obj) else None
            for par in (doc or "").split("\n\n"):
                par = " ".join(par.split())
                if 80 <= len(par) <= 400 and par[0].isupper() and ">>>" not in par and "---" not in par \
                        and par not in seen:
                    seen.add(par)
                    out.append(par)
                    if len(out) >= limit:
                        return out
    return out


def docstring_pools(n_pools: int, n: int, static: bool, seed: int = 0) -> pl.DataFrame:
    from mrt_fast.embeddings.embed import embed_texts

    rng = np.random.default_rng(seed)
    sources = {p: paragraphs(p) for p in PACKAGES}
    sources = {p: v for p, v in sources.items() if len(v) >= 60}
    names = sorted(sources)
    rows = []
    for pid in range(n_pools):
        m = 1 + pid % 4  # 1, 2, 3 or 4 sources
        picked = rng.choice(len(names), size=m, replace=False)
        level = rng.uniform(0, 1, size=m)  # each source's quality
        share = rng.dirichlet(np.full(m, 4.0))
        counts = np.maximum(1, np.round(share * (n - 3)).astype(int))
        for s, c in zip(picked, counts):
            texts = rng.choice(sources[names[s]], size=c, replace=False)
            for t in texts:
                rows.append((pid, str(t), int(s), float(level[list(picked).index(s)] + 0.15 * rng.normal())))
        for _ in range(3):  # exact repeats of candidates already in the pool
            rows.append(rows[-1 - int(rng.integers(0, int(counts.sum())))])
    df = pl.DataFrame(rows, schema=["prompt_id", "response", "mode_true", "reward"], orient="row")
    t0 = time.perf_counter()
    emb = embed_texts(df["response"].to_list(), "static" if static else None, progress=False, cache_dir=False)
    print(f"  embedded {df.height} texts in {time.perf_counter() - t0:.1f} s", flush=True)
    return df.with_columns(pl.Series("embedding", emb.astype(np.float32)))


def reworded(text: str, drop: float, rng: np.random.Generator) -> str:
    """`text` with a share `drop` of its words dropped and up to a fifth cut at each end."""
    words = text.split()
    kept = [w for w in words if rng.random() >= drop] or words[:1]
    n = len(kept)
    a = int(rng.integers(0, max(1, n // 5)))
    b = n - int(rng.integers(0, max(1, n // 5)))
    return " ".join(kept[a:b])


def reworded_pools(n_pools: int, n: int, static: bool, rng: np.random.Generator,
                   pick: Callable[[int], list[str]], drop: Callable[[int], float]) -> pl.DataFrame:
    """Pool ``pid`` holds the distinct answers ``pick(pid)`` (each a mode, drawn from ``rng`` when
    the pool is built), about ``n`` copies in all, at least 2 of each, reworded with ``drop(pid)``
    (`reworded`); each answer with its own quality level (reward = level + noise); embedded
    (MiniLM, or the static tier)."""
    from mrt_fast.embeddings.embed import embed_texts

    rows = []
    for pid in range(n_pools):
        answers, share = pick(pid), drop(pid)
        m = len(answers)
        level = rng.uniform(0, 1, size=m)
        counts = np.maximum(2, np.round(rng.dirichlet(np.full(m, 4.0)) * n).astype(int))
        for j, (text, c) in enumerate(zip(answers, counts)):
            for _ in range(c):
                rows.append((pid, reworded(text, share, rng), j, float(level[j] + 0.15 * rng.normal()), share))
    df = pl.DataFrame(rows, schema=["prompt_id", "response", "mode_true", "reward", "rewording"], orient="row")
    emb = embed_texts(df["response"].to_list(), "static" if static else None, progress=False, cache_dir=False)
    return df.with_columns(pl.Series("embedding", emb.astype(np.float32)))


def answer_pools(n_pools: int, n: int, static: bool, seed: int = 0) -> pl.DataFrame:
    rng = np.random.default_rng(seed + 1)
    source = [par for p in PACKAGES for par in paragraphs(p)]
    def pick(pid: int) -> list[str]:  # 1, 2, 3 or 4 answers
        return [source[s] for s in rng.choice(len(source), size=1 + pid % 4, replace=False)]

    return reworded_pools(n_pools, n, static, rng, pick, lambda pid: (0.1, 0.3, 0.5, 0.7)[(pid // 4) % 4])


def approach_pools(n_pools: int, n: int, static: bool, seed: int = 0) -> pl.DataFrame:
    """Pools of 1 to 4 distinct approaches to one prompt (the MOSAIC examples: 8 prompts, 4
    approaches each), each approach given several times lightly reworded (10% to 30% of its words
    dropped, ends cut): modes as close as real approaches to one prompt are."""
    rng = np.random.default_rng(seed + 2)
    by: dict[str, list[str]] = {}
    for line in (ROOT / "python" / "mrt_fast" / "data" / "mosaic_examples.jsonl").read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            by.setdefault(r["prompt_id"], []).append(r["response"])
    prompts = sorted(by)
    p = len(prompts)

    def pick(pid: int) -> list[str]:
        answers = by[prompts[pid % p]]
        return [answers[s] for s in rng.choice(len(answers), size=1 + (pid // p) % 4, replace=False)]

    return reworded_pools(n_pools, n, static, rng, pick, lambda pid: (0.1, 0.2, 0.3)[(pid // (4 * p)) % 3])


def controlled_pools(n_pools: int, n: int, seed: int = 0) -> pl.DataFrame:
    """The paper's controlled setup: three modes around f(x), reward -(y - f(x))^2."""
    from mrt_fast.simulate._data import NOISE_STD, OFFSETS
    from mrt_fast.simulate._selectors import response_features

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n_pools, 5))
    f = np.sin(2 * x[:, 0]) + 0.5 * x[:, 1]
    mode = rng.integers(0, len(OFFSETS), size=(n_pools, n))
    y = f[:, None] + np.asarray(OFFSETS)[mode] + NOISE_STD * rng.normal(size=(n_pools, n))
    # one grid for every pool (the features depend on the range of their input)
    emb = response_features(y.ravel())
    return pl.DataFrame({
        "prompt_id": np.repeat(np.arange(n_pools), n), "mode_true": mode.ravel(),
        "reward": -((y - f[:, None]) ** 2).ravel(),
        "embedding": emb,
    })


def mosaic_pools(static: bool) -> pl.DataFrame:
    from mrt_fast.embeddings.embed import embed_texts

    path = ROOT / "python" / "mrt_fast" / "data" / "mosaic_examples.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    df = pl.DataFrame({"prompt_id": [r["prompt_id"] for r in rows], "response": [r["response"] for r in rows],
                       "mode_true": [r["approach"] for r in rows], "reward": [float(r["reward"]) for r in rows]})
    emb = embed_texts(df["response"].to_list(), "static" if static else None, progress=False, cache_dir=False)
    return df.with_columns(pl.Series("embedding", emb.astype(np.float32)))


# ---------------------------------------------------------------- measures


def ari(a: np.ndarray, b: np.ndarray) -> float:
    """Adjusted Rand index of two labelings."""
    _, ia = np.unique(a, return_inverse=True)
    _, ib = np.unique(b, return_inverse=True)
    c = np.zeros((ia.max() + 1, ib.max() + 1))
    np.add.at(c, (ia, ib), 1)
    comb = lambda v: (v * (v - 1) / 2).sum()  # noqa: E731
    n = len(a)
    sc, sa, sb = comb(c), comb(c.sum(1)), comb(c.sum(0))
    exp = sa * sb / (n * (n - 1) / 2) if n > 1 else 0.0
    den = 0.5 * (sa + sb) - exp
    return 1.0 if den == 0 else float((sc - exp) / den)


def quality(df: pl.DataFrame, kept: pl.DataFrame, k: int) -> dict:
    pools = df.group_by("prompt_id").agg(
        pl.col("mode_true").n_unique().alias("modes"), pl.col("reward").min().alias("lo"),
        pl.col("reward").max().alias("hi"),
        pl.col("embedding").cast(pl.List(pl.Float32)).n_unique().alias("distinct"))
    kp = kept.with_columns(pl.col("embedding").cast(pl.List(pl.Float32))).group_by("prompt_id").agg(
        pl.col("mode_true").n_unique().alias("kept_modes"), pl.col("reward").mean().alias("r"),
        pl.len().alias("n_kept"), pl.col("embedding").n_unique().alias("kept_distinct"))
    j = pools.join(kp, on="prompt_id")
    cov = j["kept_modes"].to_numpy() / np.minimum(k, j["modes"].to_numpy())
    rng = (j["hi"] - j["lo"]).to_numpy()
    rnorm = np.where(rng > 0, (j["r"] - j["lo"]).to_numpy() / np.where(rng > 0, rng, 1), 1.0)
    dup = np.where(j["distinct"].to_numpy() >= j["n_kept"].to_numpy(),
                   j["n_kept"].to_numpy() - j["kept_distinct"].to_numpy(), 0)
    return {"mode_coverage": float(np.mean(np.minimum(cov, 1.0))), "reward_norm": float(np.mean(rnorm)),
            "duplicates_kept": int(dup.sum())}


def run_selector(df: pl.DataFrame, k: int, opts: dict, seed: int) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SmallPoolWarning)
        kept, rep = mrt_fast.select(df, k, return_report=True, mode="mode_true_unused", **opts)
        shuffled = df.sample(fraction=1.0, shuffle=True, seed=seed)
        kept2 = mrt_fast.select(shuffled, k, mode="mode_true_unused", **opts)

    def sets(t):
        return t.select("prompt_id", pl.col("embedding").cast(pl.List(pl.Float32)).alias("e"), "reward") \
            .group_by("prompt_id").agg(pl.struct("e", "reward").sort_by("reward")).sort("prompt_id")

    changed = int((sets(kept)["e"] != sets(kept2)["e"]).sum())
    out = quality(df, kept, k)
    out.update(tie_picks=rep.n_tie_picks, zero_gain_picks=rep.n_zero_gain_picks,
               duplicates_skipped=rep.n_duplicates_skipped, pools_changed_by_row_order=changed,
               one_mode_pools=rep.n_one_mode_pools if opts["method"] == "stratified" else None)
    return out


def separation(df: pl.DataFrame) -> pl.DataFrame:
    """Per pool: planted modes, their separation (the planted partition's
    mean silhouette on unit rows; NaN for one planted mode) and the mean
    cosine of two candidates of one planted mode and of two different ones."""
    out = []
    for (pid,), g in df.group_by("prompt_id"):
        t = g["mode_true"].to_numpy()
        nt = len(np.unique(t))
        x = unit_rows(np.stack(g["embedding"].to_numpy()))
        sep = silhouette_score(x, t) if nt > 1 else float("nan")
        iu = np.triu_indices(len(x), 1)
        cos, same = (x @ x.T)[iu], (t[:, None] == t[None, :])[iu]
        out.append((pid, nt, sep, float(cos[same].mean()) if same.any() else float("nan"),
                    float(cos[~same].mean()) if (~same).any() else float("nan"), cos[same].tolist(),
                    cos[~same].tolist()))
    return pl.DataFrame(out, schema=["prompt_id", "planted", "separation", "cos_within", "cos_across", "pairs_within",
                                     "pairs_across"], orient="row")


def recovery(df: pl.DataFrame, found: pl.DataFrame, sep: pl.DataFrame) -> dict:
    """Found modes (`found`: prompt_id, found) against the planted ones."""
    d = df.select("prompt_id", "mode_true").with_columns(found["found"])
    per = []
    for (pid,), g in d.group_by("prompt_id"):
        t, f = g["mode_true"].to_numpy(), g["found"].to_numpy()
        per.append((pid, len(np.unique(f)), ari(t, f)))
    j = sep.join(pl.DataFrame(per, schema=["prompt_id", "n_found", "ari"], orient="row"), on="prompt_id")
    one, multi = j.filter(pl.col("planted") == 1), j.filter(pl.col("planted") > 1)
    apart = multi.filter(pl.col("separation") >= SEPARATED)
    close = multi.filter(pl.col("separation") < SEPARATED)

    def mean(t: pl.DataFrame):
        return float(t["ari"].mean()) if t.height else None

    return {"ari_multi_mode_pools": mean(multi), "one_mode_pools": one.height,
            "one_mode_false_positives": int((one["n_found"] > 1).sum()), "multi_mode_pools": multi.height,
            "one_mode_false_negatives": int((multi["n_found"] == 1).sum()),
            "separated_pools": apart.height, "ari_separated": mean(apart),
            "separated_called_one_mode": int((apart["n_found"] == 1).sum()),
            "ari_not_separated": mean(close)}


def gaussian_reference(df: pl.DataFrame, seed: int) -> pl.DataFrame:
    """NULL_DRAWS sets per pool drawn from a Gaussian with the pool's mean and
    covariance (random combinations of its centred unit rows), as pools
    keyed (prompt_id, draw)."""
    rng = np.random.default_rng(seed)
    out = []
    for (pid,), g in df.sort("prompt_id").group_by("prompt_id", maintain_order=True):
        x = unit_rows(np.stack(g["embedding"].to_numpy())).astype(np.float64)
        mu, n = x.mean(axis=0), len(x)
        for b in range(NULL_DRAWS):
            z = mu + rng.normal(size=(n, n)) @ (x - mu) / np.sqrt(max(n - 1, 1))
            out.append(pl.DataFrame({"prompt_id": [pid] * n, "draw": [b] * n,
                                     "embedding": z.astype(np.float32)}))
    return pl.concat(out)


def one_word_split(texts: list[str], found: np.ndarray) -> bool:
    """Whether one found mode is exactly the rows that hold some word (or
    exactly those that lack it): the rewording kept or dropped that word,
    and the split follows it."""
    words = [set(t.split()) for t in texts]
    vocab = set().union(*words)
    for v in np.unique(found):
        y = found == v
        for w in vocab:
            has = np.fromiter((w in t for t in words), dtype=bool, count=len(words))
            if (has == y).all() or (has != y).all():
                return True
    return False


def mode_recovery(df: pl.DataFrame, seed: int) -> dict:
    sep = separation(df)
    base = df.select("prompt_id", "embedding")
    res = recovery(df, pool_modes(base, out="found"), sep)
    s = sep["separation"].drop_nans()
    res["separation_quartiles"] = [float(q) for q in np.quantile(s, [0.25, 0.5, 0.75])] if len(s) else None
    for c in ("cos_within", "cos_across"):
        v = sep[c].drop_nans()
        res[c] = float(v.mean()) if len(v) else None
    for c in ("pairs_within", "pairs_across"):  # pair cosines: what the merge threshold is set against
        v = sep[c].explode().drop_nulls().to_numpy()
        res[f"{c}_quantiles"] = [float(q) for q in np.quantile(v, COS_QUANTILES)] if len(v) else None
    if "rewording" in df.columns:  # one-mode pools split, by how strongly their answer was reworded
        found = pool_modes(base, out="found").select("prompt_id", "found")
        n = found.group_by("prompt_id").agg(pl.col("found").n_unique().alias("n_found"))
        by = sep.join(n, on="prompt_id").join(df.group_by("prompt_id").agg(pl.col("rewording").first()),
                                              on="prompt_id").filter(pl.col("planted") == 1)
        res["one_mode_split_by_rewording"] = {
            f"{r['rewording']:g}": f"{r['split']} of {r['pools']} (median pair cosine {r['cos']:.2f})"
            for r in by.group_by("rewording").agg((pl.col("n_found") > 1).sum().alias("split"),
                                                  pl.len().alias("pools"),
                                                  pl.col("pairs_within").explode().median().alias("cos"))
            .sort("rewording").to_dicts()}
        # splits of one-mode pools that follow one word: the copies that kept it against those that dropped it
        split = by.filter(pl.col("n_found") > 1)["prompt_id"]
        lab = df.select("prompt_id", "response").with_columns(found["found"])
        res["one_mode_splits_by_one_word"] = sum(
            one_word_split(g["response"].to_list(), g["found"].to_numpy())
            for (pid,), g in lab.filter(pl.col("prompt_id").is_in(split.implode())).group_by("prompt_id"))
    # how recoverable the planted modes are: k-means told their number
    given = []
    for (pid,), g in df.group_by("prompt_id"):
        t = g["mode_true"].to_numpy()
        if len(np.unique(t)) > 1:
            f = pool_modes(g.select("prompt_id", "embedding"), out="found", n_modes=len(np.unique(t)))
            given.append(ari(t, f["found"].to_numpy()))
    res["ari_given_planted_number"] = float(np.mean(given)) if given else None
    res["thresholds"] = [{"min_silhouette": th, **recovery(df, pool_modes(base, out="found", min_silhouette=th), sep)}
                         for th in THRESHOLDS]
    res["max_cosines"] = [{"max_mode_cosine": c, **recovery(df, pool_modes(base, out="found", max_mode_cosine=c), sep)}
                          for c in MAX_COSINES]
    # the Gaussian reference: best silhouettes of the data and of the reference sets (no merge)
    _, info = pool_modes(base, out="found", min_silhouette=-1.0, max_mode_cosine=1.0, return_info=True)
    ref = gaussian_reference(df, seed)
    ref = ref.with_columns(pl.struct("prompt_id", "draw").hash(seed).alias("ref_id"))
    _, rinfo = pool_modes(ref.select("ref_id", "embedding"), by="ref_id", out="found", min_silhouette=-1.0,
                          max_mode_cosine=1.0, return_info=True)
    ids = ref.select("ref_id", "prompt_id").unique()
    top = rinfo.join(ids, on="ref_id").group_by("prompt_id").agg(pl.col("silhouette").max().alias("ref_max"))
    j = info.join(top, on="prompt_id").join(sep, on="prompt_id")
    beats = j.with_columns((pl.col("silhouette") > pl.col("ref_max")).alias("split"))
    res["gaussian_reference"] = {
        "one_mode_false_positives": int(beats.filter(pl.col("planted") == 1)["split"].sum()),
        "separated_called_one_mode": int(beats.filter((pl.col("planted") > 1)
                                                      & (pl.col("separation") >= SEPARATED))["split"].not_().sum()),
        "mean_best_silhouette": float(j["silhouette"].mean()), "mean_reference_max": float(j["ref_max"].mean())}
    return res


def evaluate(name: str, df: pl.DataFrame, seed: int) -> dict:
    print(f"[{name}] {df['prompt_id'].n_unique()} pools, {df.height} candidates", flush=True)
    res = {"pools": int(df["prompt_id"].n_unique()), "candidates": df.height, "selectors": [], "alpha_sweep": []}
    for k in KS:
        for sel, opts in SELECTORS.items():
            r = run_selector(df, k, opts, seed)
            res["selectors"].append({"selector": sel, "k": k, **r})
    for kernel in KERNELS:
        for a in ALPHAS:
            r = run_selector(df, 4, dict(method="grades", alpha=a, kernel=kernel), seed)
            res["alpha_sweep"].append({"kernel": kernel, "alpha": a, "mode_coverage": r["mode_coverage"],
                                       "reward_norm": r["reward_norm"]})
    r = run_selector(df, 4, dict(method="top"), seed)
    res["alpha_sweep"].append({"kernel": "-", "alpha": "top", "mode_coverage": r["mode_coverage"],
                               "reward_norm": r["reward_norm"]})
    res["modes"] = mode_recovery(df, seed)
    return res


def kernel_note(kernel: str) -> str:
    """What a kernel is, for the legend and the tables: the default, or the paper's code."""
    return " (default)" if kernel == DEFAULT_KERNEL else " (paper's code)" if kernel == "shift" else ""


def figure(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(4.2 * len(results), 3.6))
    for ax, (name, res) in zip(np.atleast_1d(axes), results.items()):
        for kernel, style in (("clip", "o-"), ("shift", "s--")):
            pts = [r for r in res["alpha_sweep"] if r["kernel"] == kernel]
            ax.plot([r["mode_coverage"] for r in pts], [r["reward_norm"] for r in pts], style,
                    label=f"GRADES, kernel={kernel}" + kernel_note(kernel))
            for r in pts:
                ax.annotate(f"{r['alpha']:g}", (r["mode_coverage"], r["reward_norm"]), fontsize=7,
                            xytext=(3, 3), textcoords="offset points")
        top = [r for r in res["alpha_sweep"] if r["alpha"] == "top"][0]
        ax.plot(top["mode_coverage"], top["reward_norm"], "k*", markersize=10, label="top-K")
        for sel, mk in (("random", "x"), ("stratified", "^")):
            r = [s for s in res["selectors"] if s["selector"] == sel and s["k"] == 4][0]
            ax.plot(r["mode_coverage"], r["reward_norm"], mk, color="gray", label=sel)
        ax.set_title(f"{name} (K = 4)")
        ax.set_xlabel("mode coverage")
        ax.set_ylabel("mean reward kept (pool-normalised)")
        ax.grid(alpha=0.3)
    np.atleast_1d(axes)[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def mode_lines(m: dict) -> list[str]:
    def f(v):
        return "n/a" if v is None else f"{v:.3f}"

    q = m["separation_quartiles"]
    g = m["gaussian_reference"]
    out = ["", f"Mode rule (silhouette >= 0.25, modes at cosine > 0.8 merged): adjusted Rand index {f(m['ari_multi_mode_pools'])} on "
               f"{m['multi_mode_pools']} multi-mode pools; {m['one_mode_false_negatives']} of them called one mode; "
               f"{m['one_mode_false_positives']} of {m['one_mode_pools']} one-mode pools split.",
           "", "Separation of the planted modes (their mean silhouette), quartiles: "
               + ("n/a" if q is None else " / ".join(f"{v:.3f}" for v in q))
               + f". Separated (>= {SEPARATED}): {m['separated_pools']} pools, adjusted Rand index "
               f"{f(m['ari_separated'])}, {m['separated_called_one_mode']} called one mode; not separated: "
               f"{f(m['ari_not_separated'])}. K-means told the planted number of modes: "
               f"{f(m['ari_given_planted_number'])}. Mean cosine within a planted mode "
               f"{f(m['cos_within'])}, across two {f(m['cos_across'])}.",
           *(["", "One-mode pools split, by the share of words dropped: " + ", ".join(
               f"{k}: {v}" for k, v in m["one_mode_split_by_rewording"].items())
               + f"; in {m['one_mode_splits_by_one_word']} of them one found mode is exactly the copies that kept "
               "(or dropped) one word."]
             if "one_mode_split_by_rewording" in m else []),
           "", "| min_silhouette | one-mode pools split | separated: ARI | separated: called one mode |",
           "|---|---|---|---|"]
    out += [f"| {t['min_silhouette']:g} | {t['one_mode_false_positives']} of {t['one_mode_pools']} | "
            f"{f(t['ari_separated'])} | {t['separated_called_one_mode']} of {t['separated_pools']} |"
            for t in m["thresholds"]]
    qs = " / ".join(f"{q:g}" for q in COS_QUANTILES)
    for c, what in (("pairs_within", "within a planted mode"), ("pairs_across", "across two planted modes")):
        v = m.get(f"{c}_quantiles")
        if v is not None:
            out += ["", f"Pair cosines {what}, quantiles {qs}: " + " / ".join(f"{q:.3f}" for q in v) + "."]
    out += ["", "| max_mode_cosine | one-mode pools split | separated: ARI | separated: called one mode |",
            "|---|---|---|---|"]
    out += [f"| {t['max_mode_cosine']:g} | {t['one_mode_false_positives']} of {t['one_mode_pools']} | "
            f"{f(t['ari_separated'])} | {t['separated_called_one_mode']} of {t['separated_pools']} |"
            for t in m["max_cosines"]]
    out += ["", f"Gaussian reference ({NULL_DRAWS} sets per pool with its mean and covariance; split where the best "
                f"silhouette beats them all): {g['one_mode_false_positives']} of {m['one_mode_pools']} one-mode pools "
                f"split, {g['separated_called_one_mode']} of {m['separated_pools']} separated pools called one mode "
                f"(mean best silhouette {g['mean_best_silhouette']:.3f}, reference {g['mean_reference_max']:.3f}).",
            ""]
    return out


def markdown(doc: dict) -> str:
    out = ["# Selection quality on pools with known modes", "",
           f"Embeddings: {doc['embeddings']}. Reward is pool-normalised to [0, 1]; mode coverage is distinct "
           "modes kept over min(K, modes in the pool); duplicates kept count only pools that had K distinct "
           "candidates; 'row order' counts pools whose kept rows change when the rows are shuffled. Selectors run "
           f"with the defaults (kernel {DEFAULT_KERNEL!r}); grades_shift is GRADES with kernel 'shift' (the paper's "
           "code).", ""]
    for name, res in doc["datasets"].items():
        out += [f"## {name}: {res['pools']} pools, {res['candidates']} candidates", "",
                "| selector | K | mode coverage | reward | duplicates kept | tie picks | zero-gain picks | "
                "row order |", "|---|---|---|---|---|---|---|---|"]
        for r in res["selectors"]:
            out.append(f"| {r['selector']} | {r['k']} | {r['mode_coverage']:.3f} | {r['reward_norm']:.3f} | "
                       f"{r['duplicates_kept']} | {r['tie_picks']} | {r['zero_gain_picks']} | "
                       f"{r['pools_changed_by_row_order']} |")
        out += ["", "GRADES alpha sweep at K = 4 (coverage / reward):", "",
                "| kernel | " + " | ".join(f"alpha {a:g}" for a in ALPHAS) + " | top |",
                "|---|" + "---|" * (len(ALPHAS) + 1)]
        top = [r for r in res["alpha_sweep"] if r["alpha"] == "top"][0]
        for kernel in KERNELS:
            pts = [r for r in res["alpha_sweep"] if r["kernel"] == kernel]
            out.append(f"| {kernel}{kernel_note(kernel)} | "
                       + " | ".join(f"{r['mode_coverage']:.2f} / {r['reward_norm']:.2f}" for r in pts)
                       + f" | {top['mode_coverage']:.2f} / {top['reward_norm']:.2f} |")
        out += mode_lines(res["modes"])
    return "\n".join(out).rstrip() + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--static", action="store_true", help="the static embedding tier instead of MiniLM")
    ap.add_argument("--pools", type=int, default=200, help="docstring and controlled pools")
    ap.add_argument("--n", type=int, default=24, help="candidates per docstring pool (controlled: 32)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out-dir", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--figure", default=str(ROOT / "docs" / "guides" / "selection_tradeoff.png"))
    args = ap.parse_args()
    t0 = time.perf_counter()
    data = {
        "docstrings": docstring_pools(args.pools, args.n, args.static, args.seed),
        "answers": answer_pools(args.pools, args.n, args.static, args.seed),
        "approaches": approach_pools(args.pools, args.n, args.static, args.seed),
        "controlled": controlled_pools(args.pools, 32, args.seed),
        "mosaic": mosaic_pools(args.static),
    }
    doc = {"command": "python bench/experiments/bench_selection_quality.py", "embeddings":
           "static tier" if args.static else "MiniLM (all-MiniLM-L6-v2); controlled: Gaussian-bump features",
           "datasets": {name: evaluate(name, df, args.seed) for name, df in data.items()}}
    doc["seconds"] = time.perf_counter() - t0
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "selection_quality.json").write_text(json.dumps(doc, indent=1))
    (out / "selection_quality.md").write_text(markdown(doc))
    figure(doc["datasets"], Path(args.figure))
    print(markdown(doc))


if __name__ == "__main__":
    main()
