"""Per-prompt K: spend a total response budget where the losses are noisy (Neyman allocation).

The paper's law picks one K for every prompt. With a total of R responses over
Np prompts, the per-prompt-averaged empirical risk

    R_hat = (1/Np) sum_i (1/K_i) sum_j l_ij

has variance V_x / Np + (1/Np^2) sum_i sigma_i^2 / K_i (sigma_i^2: prompt i's
within-prompt loss variance). Minimising it under sum_i K_i = R gives
K_i proportional to sigma_i (Neyman allocation); with equal sigma_i it is the
uniform K = R / Np, and the gain over uniform K on the within-prompt part is
mean(sigma^2) / mean(sigma)^2 = 1 + CV(sigma)^2.

The sigma_i come from a pilot (a few losses per prompt), so they are noisy: a
prompt whose two pilot losses happen to agree would get K_i = k_min. Each s_i^2
is therefore shrunk toward the pooled V_y|x before allocating (empirical
Bayes with the normal-theory sampling variance 2 V^2 / (n_i - 1) of a sample
variance; see `shrink_variances`).

`allocate_k` turns per-prompt statistics into an integer allocation:
continuous water-filling between ``k_min`` and each prompt's cap (its pool
size, and ``k_max``), floors plus largest remainders, then single-response
exchanges until none lowers the predicted variance (for this separable convex
objective, that is the integer optimum). `VarianceReport.allocate` calls it
with the prompts' statistics of `variance_budget`; `mrt_fast.select` accepts
the resulting per-prompt K as a column.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from mrt_fast.errors import MrtInputError

__all__ = ["Allocation", "allocate_k", "check_pool_sizes", "neyman_allocation", "shrink_variances", "within_variance"]


def shrink_variances(s2: np.ndarray, n: np.ndarray, v_pooled: float, shrink: Any = "auto") -> np.ndarray:
    """Per-prompt variances pulled toward ``v_pooled``.

    ``s2``: unbiased sample variances (any value where ``n < 2``), ``n``: losses per prompt.
    ``shrink``:

    * ``"auto"``: s~_i^2 = V + w_i (s_i^2 - V), w_i = tau^2 / (tau^2 + 2 V^2 / (n_i - 1)), where
      tau^2 = max(0, var_i(s_i^2) - mean_i(2 V^2 / (n_i - 1))) is the spread of the true
      variances left after the sampling noise (method of moments, normal losses);
    * a number nu >= 0: s~_i^2 = ((n_i - 1) s_i^2 + nu V) / (n_i - 1 + nu), V counted as nu
      pseudo-observations (0: no shrinkage);

    prompts with fewer than two losses get V.
    """
    s2 = np.asarray(s2, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    v = float(v_pooled)
    ok = n >= 2
    out = np.full(len(s2), v)
    if not ok.any():
        return out
    if isinstance(shrink, str):
        if shrink != "auto":
            raise MrtInputError(f"shrink must be 'auto' or a number >= 0, got {shrink!r}")
        noise = 2.0 * v * v / (n[ok] - 1.0)
        tau2 = max(0.0, float(np.var(s2[ok], ddof=1)) - float(noise.mean())) if ok.sum() >= 2 else 0.0
        with np.errstate(invalid="ignore", divide="ignore"):
            w = np.where(tau2 + noise > 0, tau2 / (tau2 + noise), 1.0)
        out[ok] = v + w * (s2[ok] - v)
    else:
        if isinstance(shrink, bool) or not isinstance(shrink, (int, float, np.integer, np.floating)) \
                or not math.isfinite(shrink) or shrink < 0:
            raise MrtInputError(f"shrink must be 'auto' or a finite number >= 0, got {shrink!r}")
        d = n[ok] - 1.0
        out[ok] = (d * s2[ok] + float(shrink) * v) / (d + float(shrink))
    return np.maximum(out, 0.0)


def within_variance(var: np.ndarray, k: np.ndarray) -> float:
    """sum_i var_i / K_i / Np^2: the within-prompt part of Var(R_hat)."""
    var = np.asarray(var, dtype=np.float64)
    return float(np.sum(var / np.asarray(k, dtype=np.float64)) / len(var) ** 2)


def _water_fill(a: np.ndarray, total: float, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Continuous minimiser of sum a_i / K_i with sum K_i = total, lo <= K <= hi: K_i = clip(c sqrt(a_i))."""
    sd = np.sqrt(a)
    if not (sd > 0).any():
        sd = np.ones_like(sd)
    lo_c, hi_c = 0.0, 1.0
    f = lambda c: float(np.clip(c * sd, lo, hi).sum())  # noqa: E731
    while f(hi_c) < total and hi_c < 1e300:
        hi_c *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo_c + hi_c)
        if f(mid) < total:
            lo_c = mid
        else:
            hi_c = mid
    return np.clip(hi_c * sd, lo, hi)


def neyman_allocation(var: np.ndarray, total: int, k_min: Any = 1, caps: Any = None) -> np.ndarray:
    """Integer K_i >= k_min, <= caps_i, summing to ``total``, minimising sum_i var_i / K_i.

    Water-filling, floors, largest remainders, then single-unit exchanges until
    none lowers the objective (the integer optimum of this separable convex
    problem). Equal variances give the uniform split (sizes differ by at most one).
    """
    a = np.asarray(var, dtype=np.float64)
    n = len(a)
    if n == 0:
        raise MrtInputError("no prompts to allocate responses to")
    if not np.all(np.isfinite(a)) or np.any(a < 0):
        raise MrtInputError("per-prompt variances must be finite and >= 0")
    lo = np.broadcast_to(np.asarray(k_min, dtype=np.int64), (n,)).copy()
    total = int(total)
    hi = np.full(n, max(total, 1), dtype=np.int64) if caps is None else \
        np.broadcast_to(np.asarray(caps, dtype=np.int64), (n,)).copy()
    if np.any(lo < 1):
        raise MrtInputError(f"k_min must be >= 1, got {int(lo.min())}")
    if np.any(hi < lo):
        i = int(np.argmax(hi < lo))
        raise MrtInputError(f"prompt {i} can hold at most {int(hi[i])} responses, fewer than k_min = {int(lo[i])}",
                            row=i)
    total = int(total)
    if total < lo.sum():
        raise MrtInputError(f"total_responses = {total} is less than k_min x prompts = {int(lo.sum())}")
    if total > hi.sum():
        raise MrtInputError(f"total_responses = {total} is more than the {int(hi.sum())} candidates the pools hold")
    cont = _water_fill(a, float(total), lo.astype(np.float64), hi.astype(np.float64))
    k = np.clip(np.floor(cont + 1e-9).astype(np.int64), lo, hi)
    # largest remainders (ties: larger variance, then earlier); repeated passes only when prompts with
    # zero variance must absorb what the others' caps leave over
    short = total - int(k.sum())
    while short > 0:
        rem = np.where(k < hi, cont - k, -np.inf)
        order = np.lexsort((np.arange(n), -a, -rem))[: min(short, int((k < hi).sum()))]
        k[order] += 1
        short -= len(order)
    while short < 0:
        rem = np.where(k > lo, cont - k, np.inf)
        order = np.lexsort((np.arange(n), a, rem))[: min(-short, int((k > lo).sum()))]
        k[order] -= 1
        short += len(order)
    # exchanges: move one response from where it helps least to where it helps most
    w = np.where(a > 0, a, 0.0)
    for _ in range(4 * n + 16):
        gain = np.where(k < hi, w / (k * (k + 1.0)), -np.inf)  # drop in var_i / K_i from K_i -> K_i + 1
        cost = np.where(k > lo, w / ((k - 1.0).clip(min=1) * k), np.inf)  # rise from K_i -> K_i - 1
        i = int(np.argmax(gain))
        cost[i] = np.inf
        j = int(np.argmin(cost))
        if not gain[i] > cost[j] * (1 + 1e-12):
            break
        k[i] += 1
        k[j] -= 1
    return k


@dataclass
class Allocation:
    """Per-prompt K for a total response budget, with its predicted variance against uniform K.

    ``table``: prompt_id, k (the allocation), sd (the shrunk within-prompt
    standard deviation it is proportional to), n_losses (losses measured),
    pool_size (its cap). Variances are those of the per-prompt-averaged risk
    over these prompts: ``predicted_variance = V_x/Np + sum sd_i^2/K_i/Np^2``;
    ``uniform_variance`` the same at uniform K (same total, same caps).
    """

    table: pl.DataFrame
    total_responses: int
    k_min: int
    k_max: int | None
    v_x: float
    v_y_given_x: float
    predicted_variance: float
    uniform_variance: float
    predicted_within: float
    uniform_within: float
    shrink: Any = "auto"
    notes: list[str] = field(default_factory=list)

    @property
    def gain(self) -> float:
        """uniform_variance / predicted_variance (> 1: the allocation is better)."""
        return self.uniform_variance / self.predicted_variance if self.predicted_variance > 0 else 1.0

    @property
    def within_gain(self) -> float:
        """The same ratio on the within-prompt part alone (1 + CV(sd)^2 for the continuous optimum)."""
        return self.uniform_within / self.predicted_within if self.predicted_within > 0 else 1.0

    def to_dict(self) -> dict:
        return {
            "total_responses": self.total_responses, "k_min": self.k_min, "k_max": self.k_max,
            "n_prompts": self.table.height, "v_x": self.v_x, "v_y_given_x": self.v_y_given_x,
            "predicted_variance": self.predicted_variance, "uniform_variance": self.uniform_variance,
            "gain": self.gain, "within_gain": self.within_gain, "shrink": self.shrink, "notes": list(self.notes),
            "k": dict(zip(map(str, self.table["prompt_id"].to_list()), self.table["k"].to_list())),
        }

    def __repr__(self) -> str:
        ks = self.table["k"]
        return (f"Allocation({self.table.height} prompts, {self.total_responses} responses, K_i in "
                f"[{ks.min()}, {ks.max()}]; predicted variance {self.predicted_variance:.4g} vs uniform K "
                f"{self.uniform_variance:.4g}: gain {self.gain:.3f}x)")


def check_pool_sizes(ps: pl.DataFrame, id_type: pl.DataType | None = None) -> pl.DataFrame:
    """prompt_id (as ``id_type`` when given) and pool_size: one integer >= 1 per prompt, else one line
    naming the row."""
    size = ps["pool_size"]
    if not size.dtype.is_numeric():
        raise MrtInputError(f"pool_sizes: column 'pool_size' must hold integers, got {size.dtype}", column="pool_size")
    x = size.cast(pl.Float64)
    bad = (x.is_null() | x.is_nan() | (x < 1) | (x != x.floor())).fill_null(True)
    if bad.any():
        r = int(bad.arg_true()[0])
        raise MrtInputError(f"pool_sizes: a pool size is an integer >= 1, got {size[r]!r} at row {r}",
                            column="pool_size", row=r)
    try:
        pid = ps["prompt_id"] if id_type is None else ps["prompt_id"].cast(id_type)
    except pl.exceptions.PolarsError:
        raise MrtInputError(f"pool_sizes: its prompt ids ({ps['prompt_id'].dtype}) are not of the losses' id type "
                            f"{id_type}", column="prompt_id") from None
    if pid.null_count():
        r = int(pid.is_null().arg_true()[0])
        raise MrtInputError(f"pool_sizes: the prompt id is null at row {r}", column="prompt_id", row=r)
    dup = ~pid.is_first_distinct()
    if dup.any():
        r = int(dup.arg_true()[0])
        raise MrtInputError(f"pool_sizes: prompt {pid[r]!r} has more than one pool size (row {r})",
                            column="prompt_id", row=r, pool=pid[r])
    return pl.DataFrame({"prompt_id": pid, "pool_size": x.cast(pl.Int64)})


def allocate_k(
    stats: pl.DataFrame,
    v_x: float,
    v_y_given_x: float,
    total_responses: int,
    *,
    k_min: int = 1,
    k_max: int | None = None,
    pool_sizes: Any = None,
    shrink: Any = "auto",
) -> Allocation:
    """Allocation from per-prompt statistics ``stats`` (prompt_id, count, var).

    ``pool_sizes``: candidates available per prompt (a dict or a table with
    prompt_id and pool_size); by default each prompt's ``count``. A prompt's
    cap is min(pool size, k_max).
    """
    for name, v in (("total_responses", total_responses), ("k_min", k_min)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise MrtInputError(f"{name} must be an integer, got {v!r}")
    if k_max is not None and (isinstance(k_max, bool) or not isinstance(k_max, (int, np.integer)) or k_max < k_min):
        raise MrtInputError(f"k_max must be an integer >= k_min = {k_min}, got {k_max!r}")
    if k_min < 1:
        raise MrtInputError(f"k_min must be >= 1, got {k_min}")
    ids = stats["prompt_id"]
    n = stats["count"].cast(pl.Int64).to_numpy()
    if pool_sizes is None:
        caps = n.copy()
    else:
        if isinstance(pool_sizes, dict):
            ps = pl.DataFrame({"prompt_id": list(pool_sizes), "pool_size": list(pool_sizes.values())},
                              schema_overrides={"prompt_id": ids.dtype})
        else:
            from mrt_fast.tables.arrays import as_frame, require_columns

            ps = as_frame(pool_sizes)
            require_columns(ps, ["prompt_id", "pool_size"], "pool_sizes")
            ps = ps.select("prompt_id", "pool_size")
        ps = check_pool_sizes(ps, ids.dtype)
        j = stats.select("prompt_id").join(ps, on="prompt_id", how="left", maintain_order="left")
        miss = j["pool_size"].is_null()
        if miss.any():
            raise MrtInputError(f"pool_sizes has no entry for prompt {ids.filter(miss)[0]!r}",
                                pool=ids.filter(miss)[0])
        caps = j["pool_size"].cast(pl.Int64).to_numpy()
    if k_max is not None:
        caps = np.minimum(caps, int(k_max))
    var = shrink_variances(stats["var"].fill_null(0.0).to_numpy(), n, v_y_given_x, shrink)
    k = neyman_allocation(var, total_responses, k_min, caps)
    uni = neyman_allocation(np.ones(len(var)), total_responses, k_min, caps)
    np_ = len(var)
    pw, uw = within_variance(var, k), within_variance(var, uni)
    notes = []
    if int((n < 2).sum()):
        notes.append(f"{int((n < 2).sum())} prompt(s) with fewer than 2 losses were given the pooled V_y|x")
    table = pl.DataFrame({"prompt_id": ids, "k": k, "sd": np.sqrt(var), "n_losses": n, "pool_size": caps})
    return Allocation(table, int(total_responses), int(k_min), None if k_max is None else int(k_max),
                      float(v_x), float(v_y_given_x), v_x / np_ + pw, v_x / np_ + uw, pw, uw, shrink, notes)
