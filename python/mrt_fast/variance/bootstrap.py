"""The bootstrap of the variance report: which resampling runs, and the intervals it gives.

``exact`` resamples the prompts (time grows as prompts x resamples);
``normal`` draws each resample's means of the per-prompt statistics from their
large-sample normal law (time independent of the prompt count); ``auto`` is
exact up to :data:`EXACT_BOOTSTRAP_DRAWS` draws. How the resamples become
intervals is :mod:`mrt_fast.variance.intervals`.
"""

from __future__ import annotations

import numpy as np

from mrt_fast.errors import MrtInputError
from mrt_fast.variance.intervals import INTERVALS, bootstrap_intervals

BOOTSTRAP_METHODS = ("auto", "exact", "normal")
# `auto` resamples exactly up to this many draws (prompts x resamples; about
# a second of NumPy on 2 cores), and above it uses the normal approximation
EXACT_BOOTSTRAP_DRAWS = 50_000_000


def bootstrap_method(method: str, p: int, n_boot: int) -> str:
    if method not in BOOTSTRAP_METHODS:
        raise MrtInputError(f"bootstrap must be one of {BOOTSTRAP_METHODS}, got {method!r}")
    if method == "auto":
        return "exact" if p * n_boot <= EXACT_BOOTSTRAP_DRAWS else "normal"
    return method


def interval_method(interval: str) -> str:
    if not isinstance(interval, str) or interval not in INTERVALS:
        raise MrtInputError(f"interval must be one of {INTERVALS}, got {interval!r}")
    return interval


def accumulator_intervals(core_acc, p, gbar, *, n_boot, seed, cp, cr, k_max, level, method="auto", interval="auto"):
    """Intervals over the P prompts with two or more responses of a core accumulator (`gbar`: its
    summary's grand mean), resampled with replacement: `exact` draws the prompts (taken in key-hash
    order, so a seed gives the same intervals for any row order), `normal` draws the resample means
    from their large-sample law (no list of prompts at all). `interval="auto"` is the studentized
    (bootstrap-t) interval where prompts are resampled and the expanded percentile interval with
    the normal approximation (see `mrt_fast.variance.intervals`). Returns the intervals, the share
    of resamples with V_x = 0, the resampling and the interval method used."""
    method = bootstrap_method(method, p, n_boot)
    want = interval_method(interval)
    if want == "auto":
        want = "studentized" if method == "exact" else "expanded"
    rng = np.random.default_rng(seed)
    kw = dict(n_boot=n_boot, rng=rng, cp=cp, cr=cr, k_max=k_max, level=level, methods=(want,))
    if method == "exact":
        pp = core_acc.used_stats()
        ci, frac_zero, used = bootstrap_intervals(pp["count"], pp["mean"], pp["m2"], **kw)
    else:
        try:
            moments = core_acc.used_moments(gbar)
        except ValueError as e:
            raise MrtInputError(str(e)) from None
        ci, frac_zero, used = bootstrap_intervals(None, None, None, resample="normal", moments=moments, **kw)
    return ci[want], frac_zero, method, used[want]
