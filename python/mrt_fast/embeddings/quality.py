"""What choosing with one embedding costs the selectors, scored by another.

For each K, every selector keeps K responses per prompt twice: once choosing
with the reference embeddings (MiniLM by default), once with the tier's (the
stratified selector's modes are k-means on the same embeddings, K modes per
pool, as in ``mrt demo``; ``random`` and ``top`` do not depend on the
embedding). Both kept sets are then scored with the reference, as the demo
scores them: coverage = mean over a pool's candidates of the max cosine to a
kept one, diversity = 1 - mean pairwise cosine of the kept ones, averaged over
pools. The gap is (coverage with the tier - coverage with the reference) /
coverage with the reference. ``diverse`` and ``grades`` choose with
``kernel="shift"``: its similarity (1 + c)/2 is an affine map of the cosine,
so ``diverse`` maximises this coverage itself (its first pick with the
reference embeddings is the coverage optimum) and ``grades`` its
quality-weighted form; a gap then measures the embedding alone.

Each gap comes with a 95% interval from a paired bootstrap over pools (pools
resampled with replacement, the same draw for both picks). The strict ranking
orders the selectors by their coverage point estimates, so two selectors whose
coverages differ by less than the noise of the pools swap on a hair; the
*resolved* comparison keeps only the pairs of selectors that the reference's
own picks separate (the paired bootstrap interval of their coverage
difference excludes 0) and counts how many of those the tier reverses.

:func:`compare_embeddings` does all of it on a seeded sample of a user's own
pools (``mrt embed-quality``); :func:`quality_rows` on embeddings in hand.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Callable, Sequence

import numpy as np
import polars as pl

from mrt_fast.errors import MrtInputError

METHODS = ("random", "top", "diverse", "grades", "stratified")
#: the selectors that need a reward column; without one they are left out
REWARD_METHODS = ("top", "grades")
BOOTSTRAP = 2000
_ROW = "__mrt_row"
_EMB = "__mrt_embedding"
_MODE = "__mrt_mode"
#: the kernel the facility-location selectors choose with: the one whose objective is the coverage scored
KERNEL = "shift"


def _kept_scores(df: pl.DataFrame, kept: pl.DataFrame, x_ref: np.ndarray, by: str) -> tuple[np.ndarray, np.ndarray]:
    """Per pool (coverage, diversity) under the reference embeddings ``x_ref``, pools in ``df``'s order."""
    from mrt_fast.selection.metrics import kept_metrics

    covs, divs = [], []
    rows = df.select(_ROW, by).group_by(by, maintain_order=True).agg(pl.col(_ROW))
    kept_by = dict(kept.select(by, _ROW).group_by(by).agg(pl.col(_ROW)).iter_rows())
    for pid, prow in rows.iter_rows():
        prow = np.asarray(prow)
        pos = np.searchsorted(prow, np.sort(np.asarray(kept_by[pid])))
        div, cov = kept_metrics(x_ref[prow], pos)
        covs.append(cov)
        divs.append(div)
    return np.asarray(covs, dtype=np.float64), np.asarray(divs, dtype=np.float64)


def _draws(n_pools: int, seed: int = 0) -> np.ndarray:
    """(BOOTSTRAP, n_pools) pool indices, the same for every comparison of a data set."""
    return np.random.default_rng(seed).integers(0, n_pools, size=(BOOTSTRAP, n_pools))


def gap_interval(c_ref: np.ndarray, c_tier: np.ndarray, draws: np.ndarray) -> tuple[float, float]:
    """95% paired-bootstrap interval of (mean c_tier - mean c_ref) / mean c_ref over pools."""
    r, f = c_ref[draws].mean(axis=1), c_tier[draws].mean(axis=1)
    lo, hi = np.percentile((f - r) / r, [2.5, 97.5])
    return float(lo), float(hi)


def separated(c_a: np.ndarray, c_b: np.ndarray, draws: np.ndarray) -> int:
    """+1 if a's coverage is above b's with 95% paired-bootstrap confidence, -1 if below, 0 if not separated."""
    d = (c_a - c_b)[draws].mean(axis=1)
    lo, hi = np.percentile(d, [2.5, 97.5])
    return 1 if lo > 0 else -1 if hi < 0 else 0


def select_all(df: pl.DataFrame, x: np.ndarray, k: int, *, by: str = "prompt_id", reward: str = "reward",
               methods: Sequence[str] = METHODS) -> dict[str, pl.DataFrame]:
    """Each selector's kept rows at K = k, choosing with embeddings ``x`` (rows of ``df``)."""
    from mrt_fast.selection.modes import pool_modes
    from mrt_fast.selection.select import select
    from mrt_fast.errors import SmallPoolWarning

    t = df.with_columns(pl.Series(_EMB, x, dtype=pl.Array(pl.Float32, x.shape[1])))
    if "stratified" in methods:
        t = pool_modes(t, by=by, embedding=_EMB, out=_MODE, n_modes=k, seed=0)
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SmallPoolWarning)
        for m in methods:
            out[m] = select(t, k, m, by=by, embedding=_EMB, reward=reward, mode=_MODE, seed=0, kernel=KERNEL)
    return out


def quality_rows(name: str, df: pl.DataFrame, x_ref: np.ndarray, x_tier: np.ndarray, ks: Sequence[int] = (2, 4),
                 *, tier: str = "tier", by: str = "prompt_id", reward: str = "reward",
                 methods: Sequence[str] | None = None) -> list[dict]:
    """One row per (K, selector): coverage and diversity of the reference's and the tier's picks, under the reference.

    ``df`` holds the pools (column ``by``; ``reward`` for ``top`` and
    ``grades``), ``x_ref`` and ``x_tier`` their unit embeddings, row for row.
    ``methods`` defaults to every selector the columns allow.
    """
    if methods is None:
        methods = tuple(m for m in METHODS if m not in REWARD_METHODS or reward in df.columns)
    if len(x_ref) != df.height or len(x_tier) != df.height:
        raise MrtInputError(f"{df.height} rows but {len(x_ref)} reference and {len(x_tier)} tier embeddings")
    # pools contiguous, each pool's rows in input order; _ROW then numbers the sorted rows
    df = df.drop(_ROW, strict=False).with_row_index(_ROW).sort(by, maintain_order=True)
    order = df[_ROW].to_numpy()
    df = df.drop(_ROW).with_row_index(_ROW)
    x_ref, x_tier = np.asarray(x_ref)[order], np.asarray(x_tier)[order]
    n_pools = int(df[by].n_unique())
    draws = _draws(n_pools)
    rows = []
    per_pool: dict[tuple[int, str], np.ndarray] = {}
    for k in ks:
        ref = select_all(df, x_ref, k, by=by, reward=reward, methods=methods)
        fast = select_all(df, x_tier, k, by=by, reward=reward, methods=methods)
        for m in methods:
            c_ref, d_ref = _kept_scores(df, ref[m], x_ref, by)
            c_tier, d_tier = _kept_scores(df, fast[m], x_ref, by)
            per_pool[(k, m)] = c_ref
            lo, hi = gap_interval(c_ref, c_tier, draws)
            cr, cf = float(c_ref.mean()), float(c_tier.mean())
            rows.append({
                "tier": tier, "dataset": name, "pools": n_pools, "texts": df.height, "k": int(k), "selector": m,
                "coverage_reference": cr, "coverage_tier": cf, "coverage_gap": (cf - cr) / cr,
                "coverage_gap_ci95": [lo, hi], "diversity_reference": float(d_ref.mean()),
                "diversity_tier": float(d_tier.mean()),
                "same_picks": set(ref[m][_ROW].to_list()) == set(fast[m][_ROW].to_list()),
            })
    for k in ks:
        sub = [r for r in rows if r["k"] == k]
        r_ref = _ranking(sub, "coverage_reference")
        r_tier = _ranking(sub, "coverage_tier")
        tier_cov = {r["selector"]: r["coverage_tier"] for r in sub}
        separated_pairs, reversed_pairs = [], []
        for i, a in enumerate(methods):
            for b in methods[i + 1:]:
                sign = separated(per_pool[(k, a)], per_pool[(k, b)], draws)
                if sign:
                    hi_, lo_ = (a, b) if sign > 0 else (b, a)
                    separated_pairs.append(f"{hi_} > {lo_}")
                    if tier_cov[hi_] < tier_cov[lo_]:
                        reversed_pairs.append(f"{hi_} > {lo_}")
        for r in sub:
            r["ranking_reference"] = " > ".join(r_ref)
            r["ranking_tier"] = " > ".join(r_tier)
            r["same_ranking"] = r_ref == r_tier
            r["pairs_separated_by_reference"] = separated_pairs
            r["separated_pairs_reversed"] = reversed_pairs
    return rows


def _ranking(rows: list[dict], key: str, tol: float = 1e-9) -> list[str]:
    """Selectors by decreasing coverage; ties (within ``tol``) are written ``a = b`` in selector order."""
    order = sorted(rows, key=lambda r: (-round(r[key] / tol) * tol, METHODS.index(r["selector"])))
    out: list[str] = []
    prev = None
    for r in order:
        if prev is not None and abs(prev - r[key]) <= tol:
            out[-1] = out[-1] + " = " + r["selector"]
        else:
            out.append(r["selector"])
        prev = r[key]
    return out


def summarize(rows: Sequence[dict], tolerance: float = 0.02) -> dict:
    """The verdict of :func:`quality_rows`' rows: worst gaps, rankings and reversed pairs over every cell."""
    rows = list(rows)
    if not rows:
        raise MrtInputError("no quality rows to summarize")
    # the pairs are repeated on each row of a (data set, K) cell: count them once per cell
    cells = {(r["dataset"], r["k"]): r for r in rows}.values()
    return {
        "worst_coverage_gap": min(r["coverage_gap"] for r in rows),
        "worst_gap_by_selector": {s: min(r["coverage_gap"] for r in rows if r["selector"] == s)
                                  for s in METHODS if any(r["selector"] == s for r in rows)},
        "same_ranking_everywhere": all(r["same_ranking"] for r in rows),
        "separated_pairs_reversed": sum(len(r["separated_pairs_reversed"]) for r in cells),
        "separated_pairs": sum(len(r["pairs_separated_by_reference"]) for r in cells),
        "tolerance": tolerance,
        "within_tolerance_everywhere": all(r["coverage_gap"] >= -tolerance for r in rows),
    }


def markdown(rows: Sequence[dict], reference: str = "MiniLM") -> str:
    """The quality table of one tier's rows."""
    tier = rows[0]["tier"] if rows else "tier"
    head = (f"| data (pools, texts) | K | selector | coverage, {reference} picks | coverage, {tier} picks | gap | "
            f"gap 95% CI | diversity, {reference} picks | diversity, {tier} picks | same ranking | "
            "separated pairs reversed |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|\n")
    body = "".join(
        f"| {r['dataset']} ({r['pools']}, {r['texts']}) | {r['k']} | {r['selector']} | {r['coverage_reference']:.4f} | "
        f"{r['coverage_tier']:.4f} | {100 * r['coverage_gap']:+.2f}% | "
        f"[{100 * r['coverage_gap_ci95'][0]:+.2f}, {100 * r['coverage_gap_ci95'][1]:+.2f}] | "
        f"{r['diversity_reference']:.4f} | {r['diversity_tier']:.4f} | {'yes' if r['same_ranking'] else 'no'} | "
        f"{len(r['separated_pairs_reversed'])} of {len(r['pairs_separated_by_reference'])} |\n"
        for r in rows
    )
    return head + body


def _scan(data: Any, allow_partial: bool = False) -> tuple[pl.LazyFrame, str]:
    """A lazy frame over a table or a dataset path, and how to name it in errors."""
    if isinstance(data, (str, os.PathLike)):
        from mrt_fast.datasets.sources import discover

        return discover(data, allow_partial=allow_partial).scan(), repr(str(data))
    from mrt_fast.datasets.formats import as_polars

    return as_polars(data).lazy(), "the table"


def sample_pools(data: Any, *, by: str = "prompt_id", pools: int = 200, seed: int = 0,
                 columns: Sequence[str] = (), allow_partial: bool = False) -> pl.DataFrame:
    """Every row of ``pools`` pools of ``data``, chosen by a seeded hash of their ``by`` value.

    ``data``: a table (polars, pyarrow, pandas) or a path (file, directory or
    glob, as ``mrt select`` reads). The choice depends only on the prompt ids
    and the seed, not on the order of rows or files; a dataset is scanned, not
    loaded. Rows come back grouped by pool, in their input order, with the
    columns ``by`` and ``columns``. An unfinished ``mrt`` output is refused unless
    ``allow_partial`` (its finished parts are read, with a warning).
    """
    if not isinstance(pools, int) or isinstance(pools, bool) or pools < 2:
        raise MrtInputError(f"pools must be an integer >= 2 (the bootstrap resamples pools), got {pools!r}")
    lf, where = _scan(data, allow_partial)
    names = lf.collect_schema().names()
    want = [by, *(c for c in columns if c != by)]
    missing = [c for c in want if c not in names]
    if missing:
        raise MrtInputError(f"column {missing[0]!r} is not in {where} (columns: {', '.join(names)})")
    h = pl.col(by).hash(seed=seed).alias("__mrt_h")
    lf = lf.select(want).with_row_index(_ROW)
    try:
        # two streamed passes: the smallest hashes, then the rows holding them
        chosen = lf.select(h).unique().select(pl.col("__mrt_h").bottom_k(pools)).collect(engine="streaming")
        out = (lf.filter(h.is_in(chosen["__mrt_h"].implode())).collect(engine="streaming")
               .sort([by, _ROW]).drop(_ROW))
    except pl.exceptions.PolarsError as e:
        raise MrtInputError(f"cannot read {where}: {type(e).__name__}: {str(e).splitlines()[0]}") from None
    if out[by].null_count():
        raise MrtInputError(f"column {by!r} of {where} has null prompt ids")
    if out[by].n_unique() < 2:
        raise MrtInputError(f"{where} has {out[by].n_unique()} pool(s) by {by!r}: a comparison needs at least 2")
    return out


def compare_embeddings(
    data: Any,
    model: str | os.PathLike | None = "static",
    reference: str | os.PathLike | None = None,
    *,
    text: str = "response",
    by: str = "prompt_id",
    reward: str | None = "reward",
    ks: Sequence[int] = (2, 4),
    pools: int = 200,
    seed: int = 0,
    cache_dir: str | os.PathLike | None | bool = None,
    device: str | None = None,
    progress: bool = True,
    callback: Callable[[int], None] | None = None,
    allow_partial: bool = False,
) -> pl.DataFrame:
    """What selecting with ``model`` instead of ``reference`` costs, on a sample of your own pools.

    Embeds the texts of ``pools`` pools of ``data`` (a table or a dataset path;
    a seeded sample, :func:`sample_pools`) with both models and returns
    :func:`quality_rows`' table: one row per (K, selector) with the coverage of
    each model's picks scored by the reference, the gap and its 95% interval,
    and whether the strict ranking and the pairs the reference separates
    hold; ``model_id`` and ``reference_id`` name the two models.
    ``reference=None`` is the bundled MiniLM. ``data`` is flat (a row a response) or grouped (a row a
    prompt, ``text`` and ``reward`` lists). Where ``data`` has no column
    ``reward`` (or ``reward=None``), ``top`` and ``grades`` are left out.
    :func:`summarize` of ``.to_dicts()`` gives the verdict. ``allow_partial`` as in
    :func:`sample_pools`.
    """
    from mrt_fast.embeddings.embed import embed_texts

    ks = list(ks)
    if not ks or any(not isinstance(k, int) or isinstance(k, bool) or k < 1 for k in ks):
        raise MrtInputError(f"ks must be integers >= 1, got {ks!r}")
    if model == reference:
        raise MrtInputError(f"model and reference are both {model!r}: nothing to compare")
    if reward and reward not in _scan(data, allow_partial)[0].collect_schema().names():
        reward = None
    df = sample_pools(data, by=by, pools=pools, seed=seed, columns=[text] + ([reward] if reward else []),
                      allow_partial=allow_partial)
    from mrt_fast.tables.layouts import GROUPED, detect, explode

    if detect(df.schema, {text: 0}) == GROUPED:  # one row a prompt: one row a candidate
        lists = [text] + ([reward] if reward and isinstance(df.schema[reward], (pl.List, pl.Array)) else [])
        df = explode(df, by, lists)
    if reward and not df[reward].dtype.is_numeric():
        raise MrtInputError(f"reward column {reward!r} must be numeric, got {df[reward].dtype}")
    if df[text].dtype != pl.String:
        raise MrtInputError(f"text column {text!r} must hold strings, got {df[text].dtype}")
    texts = df[text].to_list()
    tier_stats: dict = {}
    ref_stats: dict = {}
    kw = dict(cache_dir=cache_dir, device=device, progress=progress, callback=callback)
    x_tier = embed_texts(texts, model, stats=tier_stats, **kw)
    x_ref = embed_texts(texts, reference, stats=ref_stats, **kw)
    methods = tuple(m for m in METHODS if reward or m not in REWARD_METHODS)
    rows = quality_rows("sample", df, x_ref, x_tier, ks, tier="MiniLM" if model is None else str(model), by=by,
                        reward=reward or "", methods=methods)
    return pl.DataFrame(rows).with_columns(pl.lit(str(tier_stats.get("model_id"))).alias("model_id"),
                                           pl.lit(str(ref_stats.get("model_id"))).alias("reference_id"))
