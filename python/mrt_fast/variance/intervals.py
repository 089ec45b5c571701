"""Bootstrap intervals for V_x, V_y|x, their ratio and K*, resampling prompts.

Every interval starts from the P prompts with two or more responses, each
reduced to its count K_i, mean g_i and unbiased variance s_i^2. A resample
draws P prompts with replacement and recomputes

* ``V_y|x = mean s_i^2``, the within-prompt noise in the prompt means
  ``leak = mean s_i^2 / K_i`` and ``vm = var(g_i)`` (ddof 1);
* ``V_x = max(0, vm - leak)``, ``phi = (vm - leak) / V_y|x`` (the inverse of the
  ratio before the clip), ratio ``1 / phi`` and ``K* = sqrt(ratio C_p / C_r)``.

The ratio, K* and the best integer K are monotone functions of phi (given the
costs), so their intervals are phi's interval mapped through those functions.

Interval methods (``INTERVALS``):

* ``percentile``: the resamples' quantiles at (1 - level) / 2 and (1 + level) / 2;
* ``expanded``: the percentile interval at the wider tail of `expanded_tail`
  (Hesterberg 2015);
* ``bca``: bias-corrected and accelerated (Efron 1987), the acceleration from
  the leave-one-prompt-out jackknife;
* ``studentized``: bootstrap-t on variance-stabilising scales: log V_y|x and
  ``psi = log(vm / leak)``, the log of the one-way ANOVA F statistic (defined
  also where the estimate of V_x is 0 or below; for normal losses with equal K,
  F / (1 + K V_x / V_y|x) is exactly F-distributed, so psi is pivotal). Its
  interval maps onto phi's by ``phi = expm1(psi) / c``, ``c = V_y|x_hat / leak_hat``.
  V_x: below ``VX_SHIFTED_LOG_PROMPTS`` prompts, ``V_y|x_hat`` times phi's interval
  (which covers better over few prompts); from there on, bootstrap-t on
  ``log(V_x + leak_hat)`` (which is right asymptotically; ``V_y|x_hat`` times phi's
  interval is too wide for normal losses and too narrow for skewed ones). Each resample is studentized
  by its own leave-one-prompt-out jackknife standard error, in closed form from
  the resample's sums (O(P) per resample, no refit), and the interval is
  ``theta_hat - q_{1-a} se_hat, theta_hat - q_a se_hat`` with q the quantiles of
  the resamples' t = (theta* - theta_hat) / se*.

Resampling: ``exact`` draws the prompts (in the order given: callers pass them
in key-hash order, so a seed gives the same intervals for any row order);
``normal`` draws each resample's means of the per-prompt vector (s^2, s^2/K,
g - gbar, (g - gbar)^2) from their large-sample normal law (time independent of
P). Without the prompts there is no jackknife: with ``normal`` resampling the
studentized and BCa methods are not available and `intervals` falls back to
``expanded``.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

__all__ = ["INTERVALS", "bootstrap_intervals", "expanded_tail", "k_best_of_ratio"]

INTERVALS = ("auto", "studentized", "calibrated", "bca", "expanded", "percentile")
#: the quantities every method reports
NAMES = ("v_x", "v_y_given_x", "ratio", "k_star", "k_best")
_ND = NormalDist()
#: from this many prompts on, the studentized V_x interval is its own (on log(V_x + leak_hat)); below,
#: V_y|x_hat times phi's interval (measured in docs/results/interval_coverage.md)
VX_SHIFTED_LOG_PROMPTS = 100


# --------------------------------------------------------------------------- expanded tail


def _t_abs_prob(t: float, df: int) -> float:
    """P(|T| < t) for Student's t with integer df, by the finite series of Abramowitz & Stegun 26.7.3-4."""
    th = math.atan(t / math.sqrt(df))
    c2, term, acc = math.cos(th) ** 2, 1.0, 1.0
    if df % 2 == 0:
        for k in range(2, df, 2):
            term *= c2 * (k - 1) / k
            acc += term
        return math.sin(th) * acc
    if df == 1:
        return 2 * th / math.pi
    term = acc = math.cos(th)
    for k in range(3, df, 2):
        term *= c2 * (k - 1) / k
        acc += term
    return 2 / math.pi * (th + math.sin(th) * acc)


def _t_quantile(q: float, df: float) -> float:
    """Student-t quantile for 0.5 <= q < 1: exact (bisection on the t distribution) below 30 degrees of
    freedom, the Cornish-Fisher expansion around the normal quantile above (relative error below 1e-5)."""
    z = _ND.inv_cdf(q)
    if df < 30 and float(df).is_integer():
        lo, hi, target = 0.0, max(1.0, z), 2 * q - 1
        while _t_abs_prob(hi, int(df)) < target:
            hi *= 2
        for _ in range(100):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if _t_abs_prob(mid, int(df)) < target else (lo, mid)
        return 0.5 * (lo + hi)
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    return z + g1 / df + g2 / df**2 + g3 / df**3 + g4 / df**4


def expanded_tail(level: float, p: int) -> float:
    """Tail probability of the expanded percentile interval (Hesterberg 2015) over p resampled prompts:
    Phi(-sqrt(p / (p - 1)) t_{p-1, (1 + level)/2}) instead of (1 - level) / 2. A plain percentile
    bootstrap over few prompts is too narrow (about 90% coverage at p = 20 for a nominal 95%);
    the expansion widens it and vanishes as p grows."""
    if p < 3:
        return (1.0 - level) / 2.0
    t = _t_quantile((1.0 + level) / 2.0, p - 1.0)
    return 0.5 * math.erfc(math.sqrt(p / (p - 1.0)) * t / math.sqrt(2.0))  # Phi(-x) without cancellation


# --------------------------------------------------------------------------- the statistics


def k_best_of_ratio(ratio, cp: float, cr: float, k_max: int) -> np.ndarray:
    """The best integer K in [1, k_max] for each ratio V_y|x / V_x (k_max where the ratio is infinite,
    1 where it is undefined): the better of floor and ceil of K*, ties to the smaller. Non-decreasing
    in the ratio, so it maps a ratio interval onto a k_best interval."""
    r = np.asarray(ratio, dtype=np.float64)
    ks = np.sqrt(r * (cp / cr))
    ks = np.where(np.isnan(ks), 1.0, ks)
    fin = np.isfinite(ks)
    kk = np.where(fin, ks, 1.0)
    lo = np.clip(np.floor(kk), 1, k_max)
    hi = np.clip(np.ceil(kk), 1, k_max)
    rr = np.where(fin, np.where(np.isnan(r), 0.0, r), 0.0)
    # (V_x + V_y|x / k)(C_p + k C_r) / V_x
    f_lo = (1.0 + rr / lo) * (cp + lo * cr)
    f_hi = (1.0 + rr / hi) * (cp + hi * cr)
    best = np.where(f_lo <= f_hi, lo, hi)
    return np.where(fin, best, float(k_max))


def _derived(vy, leak, vm):
    """V_x (clipped), V_y|x, phi (unclipped V_x / V_y|x) of arrays of the three sums."""
    raw = vm - leak
    with np.errstate(divide="ignore", invalid="ignore"):
        phi = np.where(vy > 0, raw / vy, np.where(raw > 0, np.inf, np.where(raw < 0, -np.inf, np.nan)))
    return np.maximum(raw, 0.0), vy, phi


def _ratio_of_phi(phi):
    """V_y|x / V_x from phi: inf where phi <= 0 (V_x clipped to 0), nan where phi is nan (all equal)."""
    with np.errstate(divide="ignore"):
        return np.where(phi > 0, 1.0 / np.where(phi > 0, phi, 1.0), np.where(np.isnan(phi), np.nan, np.inf))


class _Scales:
    """The studentized method's three scales: log V_y|x; psi = log(vm / leak), the log of the one-way
    ANOVA F statistic, whose parameter log(1 + V_x / E leak) maps onto phi = V_x / V_y|x as
    phi = expm1(psi) / c with c = V_y|x_hat / leak_hat (c = K with equal K); and log(V_x + leak_hat)
    (V_x shifted by the observed leak, so defined where the estimate of V_x is 0 or below)."""

    def __init__(self, vy0: float, leak0: float):
        self.c = vy0 / leak0
        self.leak0 = leak0
        self.floor = 1e-12 * vy0
        self.leak_floor = 1e-12 * leak0

    def of(self, vy, leak, vm):
        """(log V_y|x, log(vm / leak), log(vm - leak + leak_hat)), their arguments clipped just above 0."""
        lk = np.maximum(leak, self.leak_floor)
        return (np.log(np.maximum(vy, self.floor)), np.log(np.maximum(vm, 1e-12 * lk) / lk),
                np.log(np.maximum(vm - leak + self.leak0, self.leak_floor)))

    def back(self, t_vy, t_phi, t_vx):
        """V_y|x (clipped at the floor `of` clips it to, so the bound stays above 0 where a huge t
        quantile would underflow exp), phi and V_x (clipped at 0) from the three scales."""
        with np.errstate(over="ignore"):
            return (np.maximum(np.exp(t_vy), self.floor), np.expm1(t_phi) / self.c,
                    np.maximum(np.exp(t_vx) - self.leak0, 0.0))


# --------------------------------------------------------------------------- resampling


def _prompt_vectors(count, mean, m2):
    n = np.asarray(count, dtype=np.float64)
    s2 = np.asarray(m2, dtype=np.float64) / (n - 1.0)
    g = np.asarray(mean, dtype=np.float64)
    return s2, s2 / n, g - g.mean()


def _sums(a, b, g, p):
    """V_y|x, leak, vm of rows of resampled prompt vectors (the last axis is the prompts)."""
    s1 = g.sum(axis=-1)
    vm = np.maximum((np.square(g).sum(axis=-1) - s1 * s1 / p) / (p - 1.0), 0.0)
    return a.sum(axis=-1) / p, b.sum(axis=-1) / p, vm


def _loo(a, b, g):
    """Leave-one-prompt-out V_y|x, leak and vm for rows of resampled prompt vectors (the last axis is
    the prompts), in closed form from the rows' sums."""
    p = a.shape[-1]
    n = p - 1.0
    sa, sb, s1, s2 = (x.sum(axis=-1, keepdims=True) for x in (a, b, g, np.square(g)))
    s1j = s1 - g
    vm = np.maximum((s2 - np.square(g) - s1j * s1j / n) / (n - 1.0), 0.0)
    return (sa - a) / n, (sb - b) / n, vm


def _jackknife_se(a, b, g, scales):
    """Jackknife standard errors of the studentized scales, one per row of resampled prompts."""
    p = a.shape[-1]
    out = []
    for t in scales.of(*_loo(a, b, g)):
        d = t - t.mean(axis=-1, keepdims=True)
        out.append(np.sqrt(np.square(d).sum(axis=-1) * ((p - 1.0) / p)))
    return out


def _exact_draws(a, b, g, n_boot, rng, scales, calib=None):
    """Per resample: V_y|x, leak, vm, and with `scales` the jackknife standard errors of the three
    studentized scales; in batches of resamples (the same draws with or without `scales`). With
    `calib` = (n_inner, rng_inner, observed (V_y|x, V_x_raw, phi)), also each resample's share of
    second-level resamples at or below the observed values (ties half)."""
    p = len(a)
    step = max(1, min(n_boot, 4_000_000 // max(p, 1)))
    sub = max(1, 1_000_000 // max(p, 1))
    for b0 in range(0, n_boot, step):
        idx = rng.integers(0, p, size=(min(n_boot, b0 + step) - b0, p))
        for r0 in range(0, len(idx), sub):
            ix = idx[r0 : r0 + sub]
            ra, rb, rg = a[ix], b[ix], g[ix]
            sums = _sums(ra, rb, rg, p)
            ses = _jackknife_se(ra, rb, rg, scales) if scales is not None else None
            if calib is not None:
                ses = (ses, _inner_shares(ix, a, b, g, *calib))
            yield sums, ses


def _inner_shares(ix, a, b, g, n_inner, rng, obs):
    """For each first-level resample (a row of prompt indices), the share of its own resamples whose
    V_y|x, V_x_raw and phi fall below the observed ones (ties count half): (3, rows)."""
    rows, p = ix.shape
    out = np.empty((3, rows))
    step = max(1, 2_000_000 // (n_inner * p))
    for r0 in range(0, rows, step):
        sub = ix[r0 : r0 + step]
        pos = rng.integers(0, p, size=(len(sub), n_inner, p))
        jj = np.take_along_axis(sub[:, None, :], pos, axis=2)
        vy, leak, vm = _sums(a[jj], b[jj], g[jj], p)
        raw = vm - leak
        phi = _derived(vy, leak, vm)[2]
        for i, (v, o) in enumerate(zip((vy, raw, phi), obs)):
            out[i, r0 : r0 + len(sub)] = (np.sum(v < o, axis=1) + 0.5 * np.sum(v == o, axis=1)) / n_inner
    return out


def _normal_draws(p, mu, cov, n_boot, rng):
    """The three sums per resample, from the resample's mean of the per-prompt vector (s^2, s^2/K,
    g - gbar, (g - gbar)^2) drawn from the normal law with the vector's mean `mu` and covariance
    `cov` / P, which is what the exact resample mean tends to as P grows (central limit theorem);
    the statistics are then the same functions of it, so their intervals keep the skew that the
    ratio and K* add."""
    cov = np.asarray(cov, dtype=np.float64) / p  # of the resample means
    w, q = np.linalg.eigh(cov)
    root = q * np.sqrt(np.clip(w, 0.0, None))  # cov = root @ root.T, also when singular
    m = np.asarray(mu, dtype=np.float64) + rng.standard_normal((n_boot, 4)) @ root.T
    # means of non-negative values stay non-negative (a far tail draw at few prompts)
    m[:, [0, 1, 3]] = np.maximum(m[:, [0, 1, 3]], 0.0)
    yield (m[:, 0], m[:, 1], np.maximum(m[:, 3] - m[:, 2] ** 2, 0.0) * (p / (p - 1.0))), None


# --------------------------------------------------------------------------- the methods


def _quantiles(v, lo_q, hi_q):
    lo, hi = np.quantile(v, [lo_q, hi_q], method="inverted_cdf")
    return float(lo), float(hi)


def _mapped(vx_iv, vy_iv, phi_iv, cp, cr, k_max):
    """The five intervals from those of V_x, V_y|x and phi (ratio, K*, k_best decrease in phi)."""
    r_lo, r_hi = (float(_ratio_of_phi(np.float64(phi_iv[1]))), float(_ratio_of_phi(np.float64(phi_iv[0]))))
    ks = lambda r: float(math.sqrt(r * cp / cr)) if not math.isnan(r) else math.inf  # noqa: E731
    kb = lambda r: float(k_best_of_ratio(r, cp, cr, k_max))  # noqa: E731
    return {"v_x": vx_iv, "v_y_given_x": vy_iv, "ratio": (r_lo, r_hi), "k_star": (ks(r_lo), ks(r_hi)),
            "k_best": (kb(r_lo), kb(r_hi))}


def with_point(iv, point):
    """The interval widened to hold the point estimate (nan points leave it as is)."""
    lo, hi = iv
    if math.isnan(point):
        return iv
    return (min(lo, point), max(hi, point))


def bootstrap_intervals(count, mean, m2, *, n_boot: int, rng, cp: float, cr: float, k_max: int,
                        level: float, methods=("studentized",), resample: str = "exact", moments=None,
                        n_inner: int = 200):
    """Intervals of every method in `methods` from the same resamples of the prompts given by their
    per-prompt `count` (>= 2), `mean`, `m2` (with ``resample="normal"``: `moments` = (P, mu, cov) of
    the per-prompt vectors instead, and only percentile/expanded).

    Returns ({method: {name: (lo, hi)}}, the share of resamples with V_x = 0, {method: the method
    that produced it, e.g. "expanded" where "studentized" cannot be computed}).
    """
    if resample == "exact":
        a, b, g = _prompt_vectors(count, mean, m2)
        p = len(a)
        vy0, leak0, vm0 = _sums(a, b, g, p)
    else:
        p, mu, cov = moments
        vy0, leak0 = float(mu[0]), float(mu[1])
        vm0 = max(float(mu[3]) - float(mu[2]) ** 2, 0.0) * p / (p - 1.0)
    vx0, _, phi0 = (float(x) for x in _derived(np.float64(vy0), np.float64(leak0), np.float64(vm0)))
    can_jack = resample == "exact" and p >= 4
    scales = None
    if "studentized" in methods and can_jack and vy0 > 0 and leak0 > 0 and math.isfinite(vy0 / leak0):
        scales = _Scales(float(vy0), float(leak0))
        theta0 = np.array([float(t) for t in scales.of(np.float64(vy0), np.float64(leak0), np.float64(vm0))])
        se0 = np.array([float(s[0]) for s in _jackknife_se(a[None, :], b[None, :], g[None, :], scales)])
        if not (np.all(np.isfinite(theta0)) and np.all(np.isfinite(se0)) and np.all(se0 > 0)):
            scales = None

    calib = None
    if "calibrated" in methods and resample == "exact" and p >= 3:
        # a child stream: the first-level draws stay those of the other methods
        calib = (n_inner, rng.spawn(1)[0], (float(vy0), float(vm0 - leak0), phi0))
    draws = _exact_draws(a, b, g, n_boot, rng, scales, calib) if resample == "exact" else _normal_draws(
        p, mu, cov, n_boot, rng)
    vx_b, vy_b, phi_b = (np.empty(n_boot) for _ in range(3))
    t_b = np.empty((3, n_boot)) if scales is not None else None
    raw_b = np.empty(n_boot)
    u_b = np.empty((3, n_boot)) if calib is not None else None
    b0 = 0
    for (vy, leak, vm), ses in draws:
        b1 = b0 + len(vy)
        if calib is not None:
            ses, u_b[:, b0:b1] = ses
        vx_b[b0:b1], vy_b[b0:b1], phi_b[b0:b1] = _derived(vy, leak, vm)
        raw_b[b0:b1] = vm - leak
        if scales is not None:
            for i, (t, s) in enumerate(zip(scales.of(vy, leak, vm), ses)):
                d = t - theta0[i]
                with np.errstate(divide="ignore", invalid="ignore"):
                    t_b[i, b0:b1] = np.where(s > 0, d / np.where(s > 0, s, 1.0),
                                             np.where(d == 0, 0.0, np.sign(d) * np.inf))
        b0 = b1
    frac_zero = float(np.mean(vx_b == 0.0))
    points = {"v_x": vx0, "v_y_given_x": float(vy0), "ratio": float(_ratio_of_phi(np.float64(phi0)))}
    points["k_star"] = math.sqrt(points["ratio"] * cp / cr) if not math.isnan(points["ratio"]) else math.inf
    points["k_best"] = float(k_best_of_ratio(points["ratio"], cp, cr, k_max))

    out, used = {}, {}
    for m in methods:
        if m in ("percentile", "expanded") or (m == "studentized" and scales is None) or (
                m == "bca" and not can_jack) or (m == "calibrated" and calib is None):
            mm = m if m in ("percentile", "expanded") else "expanded"
            tail = (1.0 - level) / 2.0 if mm == "percentile" else expanded_tail(level, p)
            # phi = -inf/nan only in degenerate data; quantiles of phi map onto the ratio's
            phi_q = np.where(np.isnan(phi_b), -np.inf, phi_b)
            ci = _mapped(_quantiles(vx_b, tail, 1 - tail), _quantiles(vy_b, tail, 1 - tail),
                         _quantiles(phi_q, tail, 1 - tail), cp, cr, k_max)
        elif m == "studentized":
            a_ = (1.0 - level) / 2.0
            ivs = []
            for i in range(3):
                q_lo, q_hi = np.quantile(t_b[i], [a_, 1.0 - a_], method="inverted_cdf")
                ivs.append((theta0[i] - q_hi * se0[i], theta0[i] - q_lo * se0[i]))
            (vy_lo, phi_lo, vx_lo), (vy_hi, phi_hi, vx_hi) = (
                tuple(float(x) for x in scales.back(*(np.float64(iv[j]) for iv in ivs))) for j in (0, 1))
            if p < VX_SHIFTED_LOG_PROMPTS:
                # V_x = V_y|x phi: phi's interval at the observed V_y|x (covers better over few prompts)
                vx_lo, vx_hi = max(float(vy0) * phi_lo, 0.0), max(float(vy0) * phi_hi, 0.0)
            ci = _mapped((vx_lo, vx_hi), (vy_lo, vy_hi), (phi_lo, phi_hi), cp, cr, k_max)
            mm = m
        elif m == "calibrated":
            a_ = (1.0 - level) / 2.0
            ivs = []
            for i, stat_b in enumerate((vy_b, raw_b, np.where(np.isnan(phi_b), -np.inf, phi_b))):
                lam_lo, lam_hi = np.quantile(u_b[i], [a_, 1.0 - a_], method="inverted_cdf")
                ivs.append(_quantiles(stat_b, max(lam_lo, 0.0), min(lam_hi, 1.0)))
            ci = _mapped((max(ivs[1][0], 0.0), max(ivs[1][1], 0.0)), ivs[0], ivs[2], cp, cr, k_max)
            mm = m
        elif m == "bca":
            a_ = (1.0 - level) / 2.0
            vy_j, leak_j, vm_j = (x[0] for x in _loo(a[None, :], b[None, :], g[None, :]))
            raw_j = vm_j - leak_j
            phi_j = _derived(vy_j, leak_j, vm_j)[2]
            ivs = [_bca(vy_b, float(vy0), vy_j, a_), _bca(raw_b, float(vm0 - leak0), raw_j, a_),
                   _bca(phi_b, phi0, phi_j, a_)]
            vx_iv = (max(ivs[1][0], 0.0), max(ivs[1][1], 0.0))
            ci = _mapped(vx_iv, ivs[0], ivs[2], cp, cr, k_max)
            mm = m
        else:
            raise ValueError(f"unknown interval method {m!r}")
        out[m] = {name: with_point(ci[name], points[name]) for name in NAMES}
        used[m] = mm
    return out, frac_zero, used


def _bca(stat_b, stat0, loo, tail):
    """BCa interval of a statistic from its resamples, its observed value and its leave-one-out values."""
    v = np.where(np.isnan(stat_b), -np.inf, stat_b)
    fin = v[np.isfinite(v)]
    # resamples equal to the observed value up to rounding are ties (a rescaled loss gives the same share)
    tol = 1e-10 * max(abs(stat0) if math.isfinite(stat0) else 0.0, float(np.max(np.abs(fin))) if len(fin) else 0.0)
    share = (np.sum(v < stat0 - tol) + 0.5 * np.sum(np.abs(v - stat0) <= tol)) / len(v)
    share = min(max(share, 0.5 / len(v)), 1.0 - 0.5 / len(v))
    z0 = _ND.inv_cdf(share)
    loo = loo[np.isfinite(loo)]
    d = loo.mean() - loo if len(loo) else np.zeros(1)
    den = 6.0 * float(np.sum(d * d)) ** 1.5
    acc = float(np.sum(d**3)) / den if den > 0 else 0.0
    qs = []
    for z in (_ND.inv_cdf(tail), _ND.inv_cdf(1.0 - tail)):
        w = z0 + (z0 + z) / (1.0 - acc * (z0 + z))
        qs.append(min(max(_ND.cdf(w), 0.0), 1.0))
    lo, hi = np.quantile(v, qs, method="inverted_cdf")
    return float(lo), float(hi)
