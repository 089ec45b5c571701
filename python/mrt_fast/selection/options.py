"""The options of selection: method names, kernels and the checks every entry point applies."""

from __future__ import annotations

from typing import Any
import numpy as np
from mrt_fast.errors import MrtInputError


#: method name -> canonical name (the paper's aliases included)
METHODS = {
    "random": "random",
    "rkon": "random",
    "top": "top",
    "bkon": "top",
    "diverse": "diverse",
    "dkon": "diverse",
    "grades": "grades",
    "dbkon": "grades",
    "stratified": "stratified",
}


FACILITY_METHODS = ("diverse", "grades")


KERNELS = ("clip", "shift")


#: k, k_max and seed are unsigned 64-bit integers in the core
U64_END = 2**64


def check_k(k: Any) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise MrtInputError(f"k must be an integer >= 1, got {k!r}")
    if k < 1:
        raise MrtInputError(f"k must be >= 1, got {k}")
    if k >= U64_END:
        raise MrtInputError(f"k must be < 2**64, got {k}")
    return int(k)


def check_seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0 or seed >= U64_END:
        raise MrtInputError(f"seed must be an integer in [0, 2**64), got {seed!r}")
    return int(seed)


def number(v: Any, name: str) -> float:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise MrtInputError(f"{name} must be a number, got {v!r}")
    try:
        return float(v)
    except OverflowError:
        raise MrtInputError(f"{name} must be a finite number, got {v!r}") from None


def check_common(alpha: Any, eps: Any, k: int, k_max: Any, kernel: Any) -> tuple[float, float]:
    a, e = number(alpha, "alpha"), number(eps, "eps")
    if not np.isfinite(a) or a < 0:
        raise MrtInputError(f"alpha must be a finite number >= 0, got {alpha}")
    if not np.isfinite(e) or e <= 0:
        raise MrtInputError(f"eps must be a finite number > 0, got {eps}")
    if k_max is not None:
        if isinstance(k_max, bool) or not isinstance(k_max, (int, np.integer)) or k_max >= U64_END:
            raise MrtInputError(f"k_max must be None or an integer < 2**64, got {k_max!r}")
        if k_max < k:
            raise MrtInputError(f"k_max must be >= k, got k_max = {k_max} < k = {k}")
    if not isinstance(kernel, str) or kernel not in KERNELS:
        raise MrtInputError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    return a, e


def check_optimizer(optimizer: Any) -> str:
    if not isinstance(optimizer, str) or optimizer not in ("lazy", "naive"):
        raise MrtInputError(f"optimizer must be 'lazy' or 'naive', got {optimizer!r}")
    return optimizer
