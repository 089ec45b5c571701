"""The statistics of the pre-registered test: rank correlations with exact permutation p-values, a two-level
bootstrap over pilot prompts and held-out prompts x seeds, and paired differences of cells.

* `spearman`, `kendall`: Spearman's rho (Pearson correlation of average ranks) and Kendall's tau-b, the
  same numbers as ``scipy.stats.spearmanr`` / ``kendalltau``.
* `exact_p`: the one-sided permutation p-value P(stat(x, pi(y)) >= stat(x, y)) over **all** n!
  permutations pi of y (exact, no sampling; n <= 10, i.e. at most 3,628,800 permutations).
* `pilot_ratio`: V_y|x / V_x of a pilot from per-prompt summaries, the estimators of
  `mrt_fast.variance_budget` (V_y|x = mean s_i^2; V_x = max(0, var of prompt means - mean s_i^2 / K_i)).
* `gain`: the relative gain 1 - L(K_hi) / L(K_lo) of paired cells (held-out prompts x seeds).
* `two_level_bootstrap`: an interval for a statistic of (ratios, gains) over families; level 1 resamples
  each family's pilot prompts and recomputes its ratio, level 2 resamples each family's held-out prompts
  and its seeds (the same draws for both K: paired) and recomputes its gain. Intervals are percentile
  intervals, widened to contain the point estimate when the percentiles leave it out.
* `paired_difference`: the mean difference of two paired cells (same prompts, same seeds) with a bootstrap
  interval over prompts x seeds.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

#: the largest n whose permutations `exact_p` enumerates
MAX_EXACT_N = 10


# ------------------------------------------------------------------ rank correlations


def _ranks(x) -> np.ndarray:
    from scipy.stats import rankdata

    return rankdata(np.asarray(x, dtype=np.float64), method="average")


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rho: the Pearson correlation of the average ranks (nan when either is constant)."""
    rx, ry = _ranks(x), _ranks(y)
    return _pearson(rx, ry)


def _pearson(a: np.ndarray, b: np.ndarray) -> float:
    a = a - a.mean()
    b = b - b.mean()
    den = math.sqrt(float(a @ a) * float(b @ b))
    return float(a @ b) / den if den > 0 else math.nan


def _signs(x: np.ndarray) -> np.ndarray:
    """sign(x_i - x_j) over the pairs i < j."""
    i, j = np.triu_indices(x.shape[-1], 1)
    a, b = x[..., i], x[..., j]
    return (a > b).astype(np.float64) - (a < b)  # infinite values compare (a difference of two infs would not)


def kendall(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's tau-b (ties in either variable handled as scipy does; nan when either is constant)."""
    sx, sy = _signs(np.asarray(x, dtype=np.float64)), _signs(np.asarray(y, dtype=np.float64))
    den = math.sqrt(float(np.abs(sx).sum()) * float(np.abs(sy).sum()))
    return float((sx * sy).sum()) / den if den > 0 else math.nan


STATS: dict[str, Callable] = {"spearman": spearman, "kendall": kendall}


def exact_p(x: Sequence[float], y: Sequence[float], stat: str = "spearman", chunk: int = 200_000) -> float:
    """One-sided exact permutation p-value of a positive association: the share of all n! orderings of y whose
    statistic with x is >= the observed one (ties within 1e-12 count). Enumerates every permutation."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    n = len(x)
    if n != len(y):
        raise ValueError(f"x and y differ in length: {n} vs {len(y)}")
    if n < 2:
        raise ValueError("an exact permutation test needs at least 2 pairs")
    if n > MAX_EXACT_N:
        raise ValueError(f"exact enumeration is for n <= {MAX_EXACT_N} ({math.factorial(MAX_EXACT_N):,} "
                         f"permutations); got n = {n}")
    if stat == "spearman":
        rx, ry = _ranks(x), _ranks(y)
        rx = rx - rx.mean()
        ry = ry - ry.mean()
        den = math.sqrt(float(rx @ rx) * float(ry @ ry))
        if den == 0:
            return 1.0
        obs = float(rx @ ry) / den

        def values(perms):
            return (ry[perms] @ rx) / den
    elif stat == "kendall":
        sx, sy = _signs(x), _signs(y)
        den = math.sqrt(float(np.abs(sx).sum()) * float(np.abs(sy).sum()))
        if den == 0:
            return 1.0
        obs = float((sx * sy).sum()) / den

        def values(perms):
            return (_signs(y[perms]) @ sx) / den
    else:
        raise ValueError(f"stat must be one of {sorted(STATS)}, got {stat!r}")
    hits = total = 0
    it = itertools.permutations(range(n))
    while True:
        block = np.fromiter(itertools.chain.from_iterable(itertools.islice(it, chunk)), dtype=np.int64)
        if block.size == 0:
            break
        perms = block.reshape(-1, n)
        hits += int((values(perms) >= obs - 1e-12).sum())
        total += len(perms)
    return hits / total


# ------------------------------------------------------------------ ratios and gains


@dataclass
class PilotSummary:
    """Per-prompt mean, variance (ddof 1) and count of a pilot's losses (prompts with >= 2 losses)."""

    mean: np.ndarray
    var: np.ndarray
    count: np.ndarray

    @classmethod
    def from_losses(cls, prompt_ids: Sequence, losses: Sequence[float]) -> "PilotSummary":
        groups: dict = {}
        for p, v in zip(prompt_ids, losses):
            groups.setdefault(p, []).append(float(v))
        vals = [np.asarray(v) for v in groups.values() if len(v) >= 2]
        return cls(np.array([v.mean() for v in vals]), np.array([v.var(ddof=1) for v in vals]),
                   np.array([len(v) for v in vals], dtype=np.float64))

    def __len__(self) -> int:
        return len(self.mean)


def pilot_ratio(s: PilotSummary, idx: np.ndarray | None = None) -> float:
    """V_y|x / V_x over the prompts ``idx`` (all by default; repeats allowed): inf when V_x = 0 < V_y|x, 0 when
    V_y|x = 0."""
    m, v, k = (s.mean, s.var, s.count) if idx is None else (s.mean[idx], s.var[idx], s.count[idx])
    vy = float(v.mean())
    vx = max(0.0, float(m.var(ddof=1)) - float((v / k).mean()))
    if vy == 0:
        return 0.0
    return vy / vx if vx > 0 else math.inf


@dataclass
class GainCells:
    """Held-out losses of two paired cells of one family: ``lo[s, p]``, ``hi[s, p]`` (seed s, prompt p) at the
    small and the large K, the same prompts and seeds in both."""

    lo: np.ndarray
    hi: np.ndarray

    def __post_init__(self):
        self.lo = np.asarray(self.lo, dtype=np.float64)
        self.hi = np.asarray(self.hi, dtype=np.float64)
        if self.lo.shape != self.hi.shape or self.lo.ndim != 2:
            raise ValueError(f"paired cells need equal (seeds, prompts) shapes, got {self.lo.shape} and "
                             f"{self.hi.shape}")


def gain(c: GainCells, seeds: np.ndarray | None = None, prompts: np.ndarray | None = None) -> float:
    """1 - mean L(K_hi) / mean L(K_lo) over the given seeds x prompts (all by default; repeats allowed)."""
    lo, hi = c.lo, c.hi
    if seeds is not None:
        lo, hi = lo[seeds], hi[seeds]
    if prompts is not None:
        lo, hi = lo[:, prompts], hi[:, prompts]
    return 1.0 - float(hi.mean()) / float(lo.mean())


# ------------------------------------------------------------------ bootstrap


def percentile_interval(reps: np.ndarray, level: float = 0.95, point: float | None = None) -> tuple[float, float]:
    """The percentile interval of the finite replicates (nan when there are none), widened to contain
    ``point`` when given (a skewed bootstrap distribution can leave the point estimate outside its
    percentiles)."""
    r = np.asarray(reps, dtype=np.float64)
    r = r[np.isfinite(r)]
    if r.size == 0:
        return math.nan, math.nan
    a = (1 - level) / 2
    lo, hi = float(np.quantile(r, a)), float(np.quantile(r, 1 - a))
    if point is not None and math.isfinite(point):
        lo, hi = min(lo, point), max(hi, point)
    return lo, hi


def mean_value(values: np.ndarray, idx: np.ndarray | None = None) -> float:
    """The mean of per-prompt values over the prompts ``idx`` (all by default): a baseline predictor of
    `two_level_bootstrap` (e.g. the mean log number of valid answers of a pilot's prompts)."""
    v = np.asarray(values, dtype=np.float64)
    return float((v if idx is None else v[idx]).mean())


def two_level_bootstrap(pilots: Sequence, cells: Sequence[GainCells],
                        statistic: Callable[[np.ndarray, np.ndarray], float], *, n_boot: int = 2000, seed: int = 0,
                        level: float = 0.95, transform: Callable[[float], float] | None = math.log,
                        predictor: Callable = pilot_ratio) -> dict:
    """Point estimate, replicates and percentile interval of ``statistic(transform(ratios), gains)`` over
    families (``pilots[f]``, ``cells[f]``). Each replicate resamples, per family, the pilot's prompts
    (level 1: the ratio) and the held-out prompts and the seeds of the paired cells (level 2: the gain).

    ``predictor(pilot, idx)`` computes a family's predictor over the pilot prompts ``idx`` (None: all), and
    ``len(pilot)`` is its number of prompts: the ratio of a `PilotSummary` by default; a baseline passes its
    own (e.g. `mean_value` of per-prompt values, ``transform=None``: used as they are). A predictor <= 0
    becomes -inf under ``transform`` (log of a ratio of 0)."""
    if len(pilots) != len(cells):
        raise ValueError(f"{len(pilots)} pilots but {len(cells)} cell pairs")
    rng = np.random.default_rng(seed)

    def tr(r):
        if transform is None:
            return r
        return transform(r) if r > 0 else -math.inf

    x0 = np.array([tr(predictor(p, None)) for p in pilots])
    g0 = np.array([gain(c) for c in cells])
    point = float(statistic(x0, g0))
    reps = np.empty(n_boot)
    for b in range(n_boot):
        x = np.array([tr(predictor(p, rng.integers(0, len(p), len(p)))) for p in pilots])
        g = np.array([gain(c, rng.integers(0, c.lo.shape[0], c.lo.shape[0]),
                           rng.integers(0, c.lo.shape[1], c.lo.shape[1])) for c in cells])
        reps[b] = statistic(x, g)
    lo, hi = percentile_interval(reps, level, point)
    return {"point": point, "interval": [lo, hi], "level": level, "n_boot": n_boot, "replicates": reps}


def paired_difference(a: np.ndarray, b: np.ndarray, *, n_boot: int = 2000, seed: int = 0,
                      level: float = 0.95) -> dict:
    """mean(a - b) of two paired cells (arrays of the same (seeds, prompts) or (prompts,) shape: the same
    prompt and seed in both) and its bootstrap interval, resampling seeds and prompts (the same draws for a
    and b). Identical cells give exactly 0 with the interval [0, 0]."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"paired cells differ in shape: {a.shape} vs {b.shape}")
    d = (a - b).reshape(-1, a.shape[-1]) if a.ndim > 1 else (a - b)[None, :]
    rng = np.random.default_rng(seed)
    reps = np.empty(n_boot)
    for i in range(n_boot):
        s = rng.integers(0, d.shape[0], d.shape[0])
        p = rng.integers(0, d.shape[1], d.shape[1])
        reps[i] = d[s][:, p].mean()
    lo, hi = percentile_interval(reps, level, float(d.mean()))
    return {"difference": float(d.mean()), "interval": [lo, hi], "level": level, "n_boot": n_boot}
