"""The options of selection: method names, kernels and the checks every entry point applies."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from mrt_fast.errors import MrtInputError
from mrt_fast._util.kernels import DEFAULT_KERNEL, KERNELS
from mrt_fast.selection.mode_merge import DEFAULT_MAX_MODE_COSINE, check_max_mode_cosine
from mrt_fast.tables.layouts import check_layout


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


#: the layouts of a table of candidates: one row per candidate, or one row per prompt with list columns
LAYOUTS = ("auto", "flat", "grouped")


@dataclass(frozen=True)
class SelectOptions:
    """Every knob of selection, validated once; shared by :func:`mrt_fast.select`,
    the dataset jobs (local and Ray) and ``mrt select``.

    ``k`` is an int or the name of an integer column holding each pool's K;
    ``method`` is canonical after construction (``"dbkon"`` becomes ``"grades"``).
    ``n_modes`` is the number of k-means modes per pool when stratified
    selection computes them (the ``mode`` column absent; default: silhouette
    rule), and ``max_mode_cosine`` the cosine above which the rule merges two
    modes (:mod:`mrt_fast.selection.mode_merge`). ``layout`` is ``"flat"`` (one row per candidate; ``"rows"`` is read
    as ``"flat"``), ``"grouped"`` (one row per prompt, list columns) or
    ``"auto"``; ``candidate_columns`` names the grouped layout's per-candidate
    list columns (default: every list column). A bad value is one
    `MrtInputError` line naming the knob.
    """

    k: int | str
    method: str = "grades"
    by: str = "prompt_id"
    embedding: str = "embedding"
    reward: str = "reward"
    mode: str = "mode"
    alpha: float = 0.75
    eps: float = 1e-6
    k_max: int | None = None
    kernel: str = DEFAULT_KERNEL
    seed: int = 0
    candidate_key: str | None = None
    optimizer: str = "lazy"
    n_modes: int | None = None
    max_mode_cosine: float = DEFAULT_MAX_MODE_COSINE
    layout: str = "auto"
    candidate_columns: tuple[str, ...] | None = None
    text: str | None = None
    dedup: float | None = None

    def __post_init__(self) -> None:
        k = self.k
        if isinstance(k, str):
            if not k:
                raise MrtInputError("k must be an integer >= 1 or the name of a column holding each pool's K")
        else:
            k = check_k(k)
        if not isinstance(self.method, str) or self.method.lower() not in METHODS:
            raise MrtInputError(f"method must be one of {sorted(METHODS)}, got {self.method!r}")
        method = METHODS[self.method.lower()]
        alpha, eps = check_common(0.0 if method == "diverse" else self.alpha, self.eps, k if isinstance(k, int) else 1,
                                  self.k_max, self.kernel)
        if method != "diverse":
            object.__setattr__(self, "alpha", alpha)
        object.__setattr__(self, "eps", eps)
        object.__setattr__(self, "seed", check_seed(self.seed))
        check_optimizer(self.optimizer)
        if self.n_modes is not None and (isinstance(self.n_modes, bool) or not isinstance(self.n_modes, (int, np.integer))
                                         or self.n_modes < 1):
            raise MrtInputError(f"n_modes must be None or an integer >= 1, got {self.n_modes!r}")
        object.__setattr__(self, "max_mode_cosine", check_max_mode_cosine(self.max_mode_cosine))
        layout = check_layout(self.layout)
        cc = self.candidate_columns
        if cc is not None:
            if isinstance(cc, str) or not all(isinstance(c, str) and c for c in cc):
                raise MrtInputError(f"candidate_columns must be a list of column names, got {cc!r}")
            object.__setattr__(self, "candidate_columns", tuple(cc))
        if self.text is not None and (not isinstance(self.text, str) or not self.text):
            raise MrtInputError(f"text must be None or a column name, got {self.text!r}")
        from mrt_fast.selection.dedup import check_dedup

        object.__setattr__(self, "dedup", check_dedup(self.dedup))
        object.__setattr__(self, "k", k)
        object.__setattr__(self, "method", method)
        object.__setattr__(self, "layout", layout)

    @classmethod
    def of(cls, k: Any = None, method: str | None = None, options: "SelectOptions | None" = None,
           **knobs: Any) -> "SelectOptions":
        """The options of a call: ``options`` as given, or built from ``k``, ``method``
        and keyword knobs (an unknown keyword is one `MrtInputError` line)."""
        if options is not None:
            if not isinstance(options, SelectOptions):
                raise MrtInputError(f"options must be a SelectOptions, got {type(options).__name__}")
            if k is not None or method is not None or knobs:
                raise MrtInputError("give either options=SelectOptions(...) or k, method and the keywords, not both")
            return options
        if k is None:
            raise MrtInputError("k is required: an integer >= 1 or the name of a column holding each pool's K")
        unknown = sorted(set(knobs) - set(cls.__dataclass_fields__))
        if unknown:
            raise MrtInputError(f"unknown selection option(s) {unknown}; the options are "
                                f"{sorted(set(cls.__dataclass_fields__) - {'k', 'method'})}")
        return cls(k=k, method="grades" if method is None else method, **knobs)

    def replace(self, **changes: Any) -> "SelectOptions":
        return dataclasses.replace(self, **changes)

    def parameters(self) -> dict[str, Any]:
        """Everything a result depends on, as plain values (a job's manifest records them)."""
        d = dataclasses.asdict(self)
        d["alpha"] = float(d["alpha"])
        d["candidate_columns"] = None if self.candidate_columns is None else list(self.candidate_columns)
        return d

    # ---- what a table must hold
    def uses_embedding(self, names: list[str]) -> bool:
        """Whether selection reads the embedding column (facility location, or modes to compute)."""
        return self.method in FACILITY_METHODS or (self.method == "stratified" and self.mode not in names)

    def needed(self, names: list[str]) -> list[tuple[str, str]]:
        """(column, role) pairs a table must have."""
        m = self.method
        out = [(self.by, "prompt id")]
        if isinstance(self.k, str):
            out.append((self.k, "per-prompt K"))
        if self.uses_embedding(names):
            out.append((self.embedding, "embedding"))
        if m == "top" or (m == "grades" and (self.alpha > 0 or self.k_max is not None)):
            out.append((self.reward, "reward"))
        if self.candidate_key is not None:
            out.append((self.candidate_key, "candidate key"))
        for c in self.candidate_columns or ():
            out.append((c, "candidate column"))
        return out
