"""How many responses per prompt are worth keeping: the variance-budget law.

The empirical loss over Np prompts with K responses each has variance
``V_x / Np + V_y|x / (Np K)``: ``V_x`` is the spread of the prompts' expected
losses (a floor no K removes) and ``V_y|x`` the average spread of responses
within a prompt. This module estimates both from per-response losses in one
streaming pass (`VarianceAccumulator`, Rust core, mergeable across shards),
turns them into a budget decision (`variance_budget` -> `VarianceReport`), and
estimates the implicit multi-response effect of redundant prompts
(`implicit_mrt`).

Estimators (prompts with K_i >= 2 responses; g_i their mean, s_i^2 their
unbiased variance):

* ``V_y|x = mean_i s_i^2``;
* ``V_x = max(0, var_i(g_i) - mean_i(s_i^2 / K_i))`` with the ddof = 1
  variance of the means, which keeps the estimate unbiased (before the clip)
  also when the K_i differ; prompts with one response are counted and left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import polars as pl

from mrt_fast import _grades_core as core
from mrt_fast.errors import MrtInputError
from mrt_fast.tables.hf import hf_to_arrow, is_hf
from mrt_fast.tables.layouts import GROUPED, detect, explode
from mrt_fast.tables.arrays import pandas_column, columns_of, pool_keys, require, table_kind, to_polars
from mrt_fast.tables.key_values import refuse_nan
from mrt_fast.variance.intervals import INTERVALS, _t_quantile, bootstrap_intervals, expanded_tail  # noqa: F401

__all__ = [
    "VarianceAccumulator",
    "VarianceReport",
    "RedundancyReport",
    "variance_budget",
    "report_from_accumulator",
    "k_star",
    "best_integer_k",
    "predicted_variance",
    "budget_prompts",
    "bernstein_bound",
    "tightening_factor",
    "mrt_pays",
    "k2_beats_k1",
    "implicit_mrt",
]

DEFAULT_K_GRID = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)
#: image formats `VarianceReport.plot` writes (by the file's suffix)
PLOT_FORMATS = ("png", "pdf", "svg", "svgz", "eps", "ps", "jpg", "jpeg", "tif", "tiff", "webp")


# --------------------------------------------------------------------------- inputs


def _to_numpy_1d(x: Any, name: str) -> np.ndarray:
    """A 1-d NumPy view/copy of a NumPy/Arrow/polars/pandas/list column."""
    if isinstance(x, pl.Series):
        if x.null_count():
            first = int(x.is_null().arg_true()[0])
            raise MrtInputError(f"{name} has {x.null_count()} null value(s), the first at row {first}")
        return x.to_numpy()
    mod = type(x).__module__
    if mod.startswith("pyarrow"):
        return _to_numpy_1d(pl.Series(name, x), name)
    if mod.startswith("pandas"):
        return _to_numpy_1d(pl.Series(name, x.to_numpy()), name)
    arr = np.asarray(x)
    if arr.ndim != 1:
        raise MrtInputError(f"{name} must be one-dimensional, got shape {arr.shape}")
    return arr


def _losses(x: Any, name: str = "losses") -> np.ndarray:
    arr = _to_numpy_1d(x, name)
    if arr.dtype == object or np.iscomplexobj(arr) or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
        raise MrtInputError(f"{name} must be numeric, got dtype {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=np.float64)


def _id_series(ids: Any, name: str = "prompt ids") -> pl.Series:
    """Prompt ids of any type as a polars Series without nulls."""
    if isinstance(ids, pl.Series):
        s = ids
    else:
        mod = type(ids).__module__
        if mod.startswith("pyarrow") or mod.startswith("pandas"):
            s = pl.Series("id", ids) if mod.startswith("pyarrow") else pandas_column(ids, "id")
        else:
            arr = np.asarray(ids)
            if arr.ndim != 1:
                raise MrtInputError(f"{name} must be one-dimensional, got shape {arr.shape}")
            try:
                s = pl.Series("id", arr) if arr.dtype != object else pl.Series("id", arr.tolist())
            except (TypeError, ValueError, OverflowError, pl.exceptions.PolarsError) as e:
                raise MrtInputError(f"{name} cannot be read (values of mixed types?): {e}") from None
    if s.null_count():
        first = int(s.is_null().arg_true()[0])
        raise MrtInputError(f"{name} have {s.null_count()} null value(s), the first at row {first}")
    refuse_nan(s, s.name, "prompt id")
    return s


def _int_arg(value: Any, name: str, lo: int, hi: int | None = None) -> int:
    """An integer argument in [lo, hi] (bools and floats refused)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo or (hi is not None and value > hi):
        raise MrtInputError(f"{name} must be an integer in [{lo}, {hi if hi is not None else 'inf'}], got {value!r}")
    return int(value)


def _real(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def _check_costs(cost_prompt: float, cost_response: float) -> tuple[float, float]:
    for name, v in (("cost_prompt", cost_prompt), ("cost_response", cost_response)):
        if not isinstance(v, (int, float, np.integer, np.floating)) or not math.isfinite(v) or v <= 0:
            raise MrtInputError(f"{name} must be a positive finite number, got {v!r}")
    return float(cost_prompt), float(cost_response)


# --------------------------------------------------------------------------- accumulator


class VarianceAccumulator:
    """Streaming, mergeable per-prompt loss statistics (count, mean, M2).

    Rows may come in any order and in any number of `update` calls; shards
    built by different workers `merge` into the same statistics as one pass
    (to floating-point rounding; for a given row order, the same bits however
    the rows are cut into updates). `to_bytes`/`from_bytes` (and pickling)
    move partial results between processes; the bytes carry a checksum, so a
    corrupted or truncated file is refused. Losses whose statistics would
    overflow float64 are refused with the row, and nothing is added.
    """

    __slots__ = ("_core",)

    def __init__(self, _core: Any = None) -> None:
        self._core = _core if _core is not None else core.VarianceAccumulator()

    def update(self, prompt_ids: Any, losses: Any, *, hashed: bool = False) -> "VarianceAccumulator":
        """Add rows. `prompt_ids` of any type (hashed to stable 64-bit keys)
        unless `hashed=True`, in which case they must already be uint64 keys.
        A NaN/inf loss raises `MrtInputError` naming the row; nothing is added."""
        x = _losses(losses)
        if hashed:
            k = _to_numpy_1d(prompt_ids, "keys")
            if k.dtype != np.uint64:
                raise MrtInputError(f"hashed keys must be uint64, got {k.dtype}")
            k = np.ascontiguousarray(k)
        else:
            ids = _id_series(prompt_ids)
            if ids.dtype.is_integer() and not (ids.dtype == pl.UInt64 and (ids.max() or 0) > np.iinfo(np.int64).max):
                # keyed inside the accumulator's scan, once per run of equal ids
                # (ids beyond int64 are keyed by `pool_keys`, by value, below)
                k = np.ascontiguousarray(ids.cast(pl.Int64).to_numpy())
            else:
                k = np.ascontiguousarray(pool_keys(ids), dtype=np.uint64)
        if len(k) != len(x):
            raise MrtInputError(f"prompt ids and losses differ in length: {len(k)} vs {len(x)}")
        try:
            if k.dtype == np.int64:
                self._core.update_int_ids(k, x)
            else:
                self._core.update(k, x)
        except ValueError as e:
            raise MrtInputError(str(e)) from None
        return self

    def update_table(self, table: Any, *, by: str = "prompt_id", loss: str = "loss") -> "VarianceAccumulator":
        """Add the rows of a polars/Arrow/pandas table."""
        df = _frame(table, by, loss)
        return self.update(df[by], loss_column(df, loss))

    def merge(self, other: "VarianceAccumulator") -> "VarianceAccumulator":
        """Fold `other` into this accumulator (exact Chan merge); returns self.
        `acc.merge(acc)` counts every row twice. Statistics that would
        overflow float64 raise `MrtInputError`, with this accumulator unchanged."""
        if not isinstance(other, VarianceAccumulator):
            raise MrtInputError(f"can only merge a VarianceAccumulator, got {type(other).__name__}")
        try:
            self._core.merge(other._core)
        except ValueError as e:
            raise MrtInputError(str(e)) from None
        return self

    def copy(self) -> "VarianceAccumulator":
        return VarianceAccumulator(self._core.copy())

    def to_bytes(self) -> bytes:
        """Stable little-endian serialisation: magic, version, the per-prompt
        statistics in key order and a checksum."""
        return self._core.to_bytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> "VarianceAccumulator":
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise MrtInputError(f"expected the bytes of a serialised accumulator, got {type(data).__name__}")
        try:
            return cls(core.VarianceAccumulator.from_bytes(bytes(data)))
        except ValueError as e:
            raise MrtInputError(str(e)) from None

    def __reduce__(self):
        return (VarianceAccumulator.from_bytes, (self.to_bytes(),))

    def __len__(self) -> int:
        return len(self._core)

    @property
    def n_rows(self) -> int:
        return int(self._core.n_rows)

    def per_prompt(self) -> pl.DataFrame:
        """One row per prompt (sorted by key): key, count, mean, m2."""
        d = self._core.per_prompt()
        return pl.DataFrame({"key": d["key"], "count": d["count"], "mean": d["mean"], "m2": d["m2"]})

    def summary(self) -> dict[str, float]:
        """The estimators: v_x, v_x_raw (before the clip), v_y_given_x, ...
        Raises `MrtInputError` when fewer than two prompts have >= 2 responses."""
        try:
            return dict(self._core.summary())
        except ValueError as e:
            raise MrtInputError(str(e)) from None

    def report(self, **kwargs: Any) -> "VarianceReport":
        """`VarianceReport` from this accumulator (same keywords as `variance_budget`)."""
        return report_from_accumulator(self, **kwargs)

    def __repr__(self) -> str:
        return f"VarianceAccumulator(prompts={len(self)}, rows={self.n_rows})"


# --------------------------------------------------------------------------- the law


def k_star(v_x: float, v_y_given_x: float, cost_prompt: float = 1.0, cost_response: float = 1.0) -> float:
    """Continuous optimum sqrt((V_y|x / V_x)(C_p / C_r)); inf when V_x = 0 < V_y|x,
    0 when V_y|x = 0 < V_x, nan when both are 0 (every K is equally good)."""
    cp, cr = _check_costs(cost_prompt, cost_response)
    if v_x < 0 or v_y_given_x < 0:
        raise MrtInputError(f"variances must be >= 0, got V_x={v_x}, V_y|x={v_y_given_x}")
    if v_x == 0:
        return math.inf if v_y_given_x > 0 else math.nan
    return math.sqrt(v_y_given_x / v_x * cp / cr)


def _objective(v_x, v_y, cp, cr, k):
    return (v_x + v_y / k) * (cp + k * cr)


def best_integer_k(
    v_x: float, v_y_given_x: float, cost_prompt: float = 1.0, cost_response: float = 1.0, *, k_max: int = 1024
) -> int:
    """The integer K in [1, k_max] minimising (V_x + V_y|x / K)(C_p + K C_r)
    (ties to the smaller K). The objective is convex in K, so the answer is
    the better of floor(K*) and ceil(K*), clipped; with V_x = 0 it is k_max."""
    if int(k_max) < 1:
        raise MrtInputError(f"k_max must be >= 1, got {k_max}")
    ks = k_star(v_x, v_y_given_x, cost_prompt, cost_response)
    if math.isnan(ks):
        return 1
    if math.isinf(ks):
        return int(k_max)
    lo = min(max(1, math.floor(ks)), k_max)
    hi = min(max(1, math.ceil(ks)), k_max)
    f = lambda k: _objective(v_x, v_y_given_x, cost_prompt, cost_response, k)  # noqa: E731
    return lo if f(lo) <= f(hi) else hi


def mrt_pays(v_x: float, v_y_given_x: float, cost_prompt: float = 1.0, cost_response: float = 1.0) -> bool:
    """Continuous criterion V_y|x / V_x > C_r / C_p (K* > 1)."""
    cp, cr = _check_costs(cost_prompt, cost_response)
    return bool(v_y_given_x * cp > v_x * cr)


def k2_beats_k1(v_x: float, v_y_given_x: float, cost_prompt: float = 1.0, cost_response: float = 1.0) -> bool:
    """Integer criterion V(2) < V(1) iff V_y|x / V_x > 2 C_r / C_p (sharp: equal at the boundary)."""
    cp, cr = _check_costs(cost_prompt, cost_response)
    return bool(v_y_given_x * cp > 2.0 * v_x * cr)


def predicted_variance(v_x: float, v_y_given_x: float, k: Any, n_prompts: Any) -> np.ndarray:
    """V_x / Np + V_y|x / (Np K), elementwise; inf where Np = 0."""
    k = np.asarray(k, dtype=np.float64)
    n = np.asarray(n_prompts, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = (v_x + v_y_given_x / k) / n
    return np.where(n > 0, out, np.inf)


def budget_prompts(budget: float, k: Any, cost_prompt: float = 1.0, cost_response: float = 1.0) -> np.ndarray:
    """Np = floor(B / (C_p + K C_r))."""
    cp, cr = _check_costs(cost_prompt, cost_response)
    if not math.isfinite(budget) or budget <= 0:
        raise MrtInputError(f"budget must be a positive finite number, got {budget!r}")
    k = np.asarray(k, dtype=np.float64)
    # tiny slack so that exact multiples are not lost to rounding
    return np.floor(budget / (cp + k * cr) * (1 + 1e-12)).astype(np.int64)


def bernstein_bound(
    v_x: float, v_y_given_x: float, k: Any, n_prompts: Any, *, delta: float = 0.05, loss_bound: float
) -> np.ndarray:
    """sqrt(2 (V_x + V_y|x/K) log(2/delta) / Np) + 2 B log(2/delta) / (3 Np), for losses in [0, B]."""
    if not 0 < delta < 1:
        raise MrtInputError(f"delta must be in (0, 1), got {delta}")
    if not math.isfinite(loss_bound) or loss_bound < 0:
        raise MrtInputError(f"loss_bound must be a finite number >= 0, got {loss_bound}")
    k = np.asarray(k, dtype=np.float64)
    n = np.asarray(n_prompts, dtype=np.float64)
    lg = math.log(2.0 / delta)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.sqrt(2.0 * (v_x + v_y_given_x / k) * lg / n) + 2.0 * loss_bound * lg / (3.0 * n)
    return np.where(n > 0, out, np.inf)


def tightening_factor(v_x: float, v_y_given_x: float, k: Any) -> np.ndarray:
    """sqrt((V_x + V_y|x) / (V_x + V_y|x / K)): how much K tightens the bound's leading term over K = 1."""
    k = np.asarray(k, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.sqrt((v_x + v_y_given_x) / (v_x + v_y_given_x / k))


def _saturation(v_x: float, v_y: float) -> float:
    if v_x == 0:
        return math.inf if v_y > 0 else math.nan
    return math.sqrt(1.0 + v_y / v_x)


# --------------------------------------------------------------------------- bootstrap


BOOTSTRAP_METHODS = ("auto", "exact", "normal")
# `auto` resamples exactly up to this many draws (prompts x resamples; about
# a second of NumPy on 2 cores), and above it uses the normal approximation
EXACT_BOOTSTRAP_DRAWS = 50_000_000


def _bootstrap_method(method: str, p: int, n_boot: int) -> str:
    if method not in BOOTSTRAP_METHODS:
        raise MrtInputError(f"bootstrap must be one of {BOOTSTRAP_METHODS}, got {method!r}")
    if method == "auto":
        return "exact" if p * n_boot <= EXACT_BOOTSTRAP_DRAWS else "normal"
    return method


def _interval_method(interval: str) -> str:
    if not isinstance(interval, str) or interval not in INTERVALS:
        raise MrtInputError(f"interval must be one of {INTERVALS}, got {interval!r}")
    return interval


def _bootstrap(core_acc, p, gbar, *, n_boot, seed, cp, cr, k_max, level, method="auto", interval="auto"):
    """Intervals over the P prompts with two or more responses of a core accumulator (`gbar`: its
    summary's grand mean), resampled with replacement: `exact` draws the prompts (taken in key-hash
    order, so a seed gives the same intervals for any row order), `normal` draws the resample means
    from their large-sample law (no list of prompts at all). `interval="auto"` is the studentized
    (bootstrap-t) interval where prompts are resampled and the expanded percentile interval with
    the normal approximation (see `mrt_fast.variance.intervals`). Returns the intervals, the share
    of resamples with V_x = 0, the resampling and the interval method used."""
    method = _bootstrap_method(method, p, n_boot)
    want = _interval_method(interval)
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


# --------------------------------------------------------------------------- report


def json_num(v: Any) -> Any:
    """JSON-safe number: +/-inf -> "inf"/"-inf" strings, nan -> None."""
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        v = float(v)
        if math.isnan(v):
            return None
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return v
    return v


@dataclass
class VarianceReport:
    """The variance-budget diagnosis of a set of per-response losses.

    `to_dict()` is JSON-safe: infinities become the strings "inf"/"-inf" and
    NaN (undefined) becomes None.
    """

    n_rows: int
    n_prompts: int
    n_single_response_prompts: int
    n_used_prompts: int
    mean_k: float
    v_x: float
    v_x_raw: float
    v_y_given_x: float
    var_of_means: float
    ratio: float
    cost_prompt: float
    cost_response: float
    k_star: float
    k_best: int
    k_max: int
    mrt_pays: bool
    k2_beats_k1: bool
    tightening_saturation: float
    delta: float
    loss_bound: float | None
    budget: float | None
    ci_level: float
    n_boot: int
    seed: int
    bootstrap: str = "none"
    interval: str = "none"
    pilot_k_max: int | None = None  # the most responses a prompt of the pilot had (K measured, not extrapolated)
    ci: dict[str, tuple[float, float]] = field(default_factory=dict)
    predicted: pl.DataFrame = field(default_factory=pl.DataFrame)
    notes: list[str] = field(default_factory=list)
    #: False when the pilot cannot bound the ratio V_y|x / V_x (V_x estimated <= 0, or the ratio's
    #: interval unbounded above): K* is then not a recommendation; `k_at_least` is what the data support
    identified: bool = True
    #: why the ratio is not identified and what more data would fix it (None when identified)
    identification: str | None = None
    #: the smallest K the pilot's interval supports (the lower end of k_best's interval; k_best without one)
    k_at_least: int = 1
    _pilot: Any = field(default=None, repr=False, compare=False)  # (prompt ids, losses) for `allocate`

    def _k_axis(self, ax, top: int) -> None:
        """A log axis of K with plain integer labels, and the K beyond the pilot's shaded: there the
        law is extrapolated, not measured."""
        import matplotlib.ticker as mticker

        ax.set_xscale("log", base=2)
        ax.set_xlim(1, top)
        ax.xaxis.set_major_locator(mticker.LogLocator(base=2))
        ax.xaxis.set_major_formatter(mticker.FuncFormatter(lambda v, _: f"{v:.0f}" if v >= 1 else f"{v:g}"))
        ax.xaxis.set_minor_formatter(mticker.NullFormatter())
        if self.pilot_k_max is not None and self.pilot_k_max < top:
            ax.axvspan(self.pilot_k_max, top, color="0.85", alpha=0.5, zorder=0,
                       label=f"K > {self.pilot_k_max}: beyond the pilot, extrapolated")

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {}
        for k, v in self.__dict__.items():
            if k.startswith("_"):
                continue
            if k == "predicted":
                d[k] = [{c: json_num(x) for c, x in row.items()} for row in v.iter_rows(named=True)]
            elif k == "ci":
                d[k] = {n: [json_num(a), json_num(b)] for n, (a, b) in v.items()}
            elif k == "notes":
                d[k] = list(v)
            else:
                d[k] = json_num(v)
        return d

    def __repr__(self) -> str:
        def f(x):
            return "inf" if isinstance(x, float) and math.isinf(x) else f"{x:.4g}"

        def ci(name):
            if name not in self.ci:
                return ""
            lo, hi = self.ci[name]
            return f"  [{f(lo)}, {f(hi)}] ({self.ci_level:.0%} {self.interval} bootstrap, {self.bootstrap})"

        lines = [
            "VarianceReport(",
            f"  prompts: {self.n_prompts} ({self.n_used_prompts} with >= 2 responses, "
            f"{self.n_single_response_prompts} single-response left out), rows: {self.n_rows}, mean K: {self.mean_k:.3g}",
            f"  V_x (prompt floor):        {f(self.v_x)}{ci('v_x')}",
            f"  V_y|x (within prompt):     {f(self.v_y_given_x)}{ci('v_y_given_x')}",
            f"  ratio V_y|x / V_x:         {f(self.ratio)}{ci('ratio')}",
            f"  costs C_p, C_r:            {self.cost_prompt:g}, {self.cost_response:g}",
            f"  K* (continuous):           {f(self.k_star)}{ci('k_star')}",
            f"  best integer K:            {self.k_best}{ci('k_best')}",
            *([] if self.identified else [
                f"  ratio NOT identified:      K* is no recommendation; the pilot supports K >= {self.k_at_least}"]),
            f"  MRT pays (K* > 1):         {self.mrt_pays}",
            f"  K=2 beats K=1:             {self.k2_beats_k1}",
            f"  bound tightening (K->inf): {f(self.tightening_saturation)}",
        ]
        lines += [f"  note: {n}" for n in self.notes]
        lines.append(")")
        return "\n".join(lines)

    def per_prompt_stats(self) -> pl.DataFrame:
        """prompt_id, count, mean, var (ddof 1; null with one loss) of the diagnosed losses."""
        if self._pilot is None:
            raise MrtInputError("this report does not hold the prompt ids (it was built from an accumulator): "
                                "use variance_budget(table) for per-prompt K")
        ids, x = self._pilot
        return (pl.DataFrame({"prompt_id": ids, "loss": x})
                .group_by("prompt_id", maintain_order=True)
                .agg(pl.len().alias("count"), pl.col("loss").mean().alias("mean"), pl.col("loss").var().alias("var")))

    def allocate(self, total_responses: int, k_min: int = 1, k_max: int | None = None, *,
                 pool_sizes: Any = None, shrink: Any = "auto"):
        """Per-prompt K for a total of `total_responses` (Neyman allocation, `mrt_fast.variance.allocate`).

        K_i is proportional to prompt i's within-prompt standard deviation, shrunk toward V_y|x,
        an integer in [k_min, min(pool size, k_max)] (pool size: its number of losses here, or
        `pool_sizes`: a dict or a table with prompt_id and pool_size). Returns an `Allocation`:
        `.table` (prompt_id, k, ...) and the predicted variance against uniform K at the same total.
        """
        from mrt_fast.variance.allocate import allocate_k

        return allocate_k(self.per_prompt_stats(), self.v_x, self.v_y_given_x, total_responses, k_min=k_min,
                          k_max=k_max, pool_sizes=pool_sizes, shrink=shrink)

    def plot(self, path: Any = None, *, k_max_plot: int | None = None):
        """Predicted variance vs K with the prompt floor, and the budget curve:
        the variance at a fixed budget against K (at ``budget`` when given, else
        relative to its least value), with K* and its bootstrap interval marked.
        Saves to `path` when given; returns the figure."""
        import matplotlib

        if path is not None:
            matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
        import matplotlib.ticker as mticker

        top = k_max_plot or int(max(64, min(self.k_max, 4 * (self.k_best or 1))))
        ks = np.arange(1, top + 1, dtype=np.float64)
        n_ref = max(self.n_prompts, 1)
        fig, axes = plt.subplots(1, 2, figsize=(10.4, 4.0), squeeze=False)
        ax = axes[0, 0]
        ax.plot(ks, predicted_variance(self.v_x, self.v_y_given_x, ks, n_ref), label="V_x/Np + V_y|x/(Np K)")
        ax.axhline(self.v_x / n_ref, ls="--", c="gray", label="prompt floor V_x/Np")
        ax.set_xlabel("responses per prompt K")
        ax.set_ylabel(f"variance of empirical loss (Np = {n_ref})")
        self._k_axis(ax, top)
        ax.legend(fontsize=8)
        ax = axes[0, 1]
        kc = np.linspace(1, top, 400)
        cont = (self.v_x + self.v_y_given_x / kc) * (self.cost_prompt + kc * self.cost_response)
        if self.budget is not None:
            ax.plot(kc, cont / self.budget, label="continuous Np")
            npk = budget_prompts(self.budget, ks, self.cost_prompt, self.cost_response)
            ax.plot(ks, predicted_variance(self.v_x, self.v_y_given_x, ks, npk), ".", ms=3, label="integer Np")
            ax.set_ylabel(f"variance at budget B = {self.budget:g}")
        else:
            ax.plot(kc, cont / cont.min() if cont.min() > 0 else cont, label="(V_x + V_y|x/K)(C_p + K C_r)")
            ax.set_ylabel("variance at a fixed budget / its least")
        if math.isfinite(self.k_star) and 1 <= self.k_star <= top:
            ax.axvline(self.k_star, c="C3", ls=":", label=f"K* = {self.k_star:.2f}")
        if "k_star" in self.ci:
            lo, hi = self.ci["k_star"]
            lo, hi = max(float(lo), 1.0), min(float(hi), float(top))
            if lo <= hi:
                ax.axvspan(lo, hi, color="C3", alpha=0.12,
                           label=f"K* {self.ci_level:.0%} interval [{self.ci['k_star'][0]:.3g}, {self.ci['k_star'][1]:.3g}]")
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(mticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(mticker.FuncFormatter(  # plain numbers, 2 and 5 of each decade
            lambda v, _: f"{v:g}" if v > 0 and round(v / 10 ** math.floor(math.log10(v))) in (2, 5) else ""))
        ax.set_xlabel("responses per prompt K")
        self._k_axis(ax, top)
        ax.legend(fontsize=8)
        budget = "" if self.budget is None else f", budget B = {self.budget:g}"
        fig.suptitle(f"costs C_p = {self.cost_prompt:g} a prompt, C_r = {self.cost_response:g} a response{budget}; "
                     f"{self.n_prompts} pilot prompts" + (f" with K <= {self.pilot_k_max}" if self.pilot_k_max else ""),
                     fontsize=9)
        fig.tight_layout()
        if path is not None:
            from mrt_fast._util.files import atomic_path

            fmt = Path(path).suffix.lower().lstrip(".") or "png"
            if fmt not in PLOT_FORMATS:
                plt.close(fig)
                raise MrtInputError(f"plot {str(path)!r}: unsupported image format {Path(path).suffix!r} "
                                    "(use .png, .pdf or .svg)")
            try:
                with atomic_path(path) as tmp:
                    fig.savefig(tmp, dpi=120, format=fmt)
            finally:
                plt.close(fig)
        return fig


def _frame(table: Any, by: str, loss: str, layout: str = "auto", tokens: str | None = None) -> pl.DataFrame:
    """The prompt id and loss columns as one flat polars frame (a grouped table's lists exploded).

    With ``tokens``, ``loss`` is a sum of token log-probabilities (``mrt generate``'s ``logprob``)
    and the loss used is its mean token negative log-likelihood, ``-loss / tokens``."""
    if is_hf(table):
        table = hf_to_arrow(table)
    kind = table_kind(table)
    cols = columns_of(table, kind)
    require(cols, by, "prompt id")
    require(cols, loss, "loss")
    if by == loss:
        raise MrtInputError(f"the prompt id and loss columns are both {by!r}", column=by)
    if tokens is not None:
        require(cols, tokens, "token count")
    df = to_polars(table, kind, [by, loss] + ([tokens] if tokens is not None else []))
    if detect(df.schema, {loss: 0}, layout) == GROUPED:
        df = explode(df, by, [loss] + ([tokens] if tokens is not None else []))
    if tokens is not None:
        n = df[tokens]
        if not n.dtype.is_numeric():
            raise MrtInputError(f"column {tokens!r} (token count) must be numeric, got {n.dtype}", column=tokens)
        bad = (n.cast(pl.Float64) < 1).fill_null(True)
        if bad.any():
            r = int(bad.arg_true()[0])
            raise MrtInputError(f"column {tokens!r} (token count) must be >= 1, got {n[r]!r} at row {r}",
                                column=tokens, row=r)
        lp = loss_column(df, loss)
        df = df.select(by).with_columns(pl.Series(loss, -lp / n.cast(pl.Float64).to_numpy()))
    return df


def loss_column(df: pl.DataFrame, loss: str) -> np.ndarray:
    s = df[loss]
    if not s.dtype.is_numeric():
        raise MrtInputError(f"column {loss!r} (loss) must be numeric, got {s.dtype}")
    if s.null_count():
        first = int(s.is_null().arg_true()[0])
        raise MrtInputError(f"column {loss!r} (loss) has {s.null_count()} null value(s), the first at row {first}")
    return np.ascontiguousarray(s.cast(pl.Float64).to_numpy())


def report_from_accumulator(
    acc: VarianceAccumulator,
    *,
    cost_prompt: float = 1.0,
    cost_response: float = 1.0,
    k_grid: Sequence[int] = DEFAULT_K_GRID,
    k_max: int = 1024,
    budget: float | None = None,
    n_prompts: int | None = None,
    delta: float = 0.05,
    loss_bound: float | None = None,
    n_boot: int = 1000,
    seed: int = 0,
    ci_level: float = 0.95,
    bootstrap: str = "auto",
    interval: str = "auto",
) -> VarianceReport:
    """The diagnosis from per-prompt statistics (see `variance_budget`)."""
    cp, cr = _check_costs(cost_prompt, cost_response)
    k_max = _int_arg(k_max, "k_max", 1)
    if not isinstance(k_grid, (Sequence, np.ndarray)) or isinstance(k_grid, str):
        raise MrtInputError(f"k_grid must be a sequence of integers >= 1, got {k_grid!r}")
    grid = np.asarray(sorted({_int_arg(k, "every k_grid entry", 1, 2**62) for k in k_grid}), dtype=np.int64)
    if len(grid) == 0 or grid[0] < 1:
        raise MrtInputError(f"k_grid must hold integers >= 1, got {list(k_grid)}")
    if not _real(delta) or not 0 < delta < 1:
        raise MrtInputError(f"delta must be in (0, 1), got {delta}")
    if not _real(ci_level) or not 0 < ci_level < 1:
        raise MrtInputError(f"ci_level must be in (0, 1), got {ci_level}")
    n_boot = _int_arg(n_boot, "n_boot", 0, 2**31 - 1)
    seed = _int_arg(seed, "seed", 0)
    _bootstrap_method(bootstrap, 0, 0)
    _interval_method(interval)
    if budget is not None and (not _real(budget) or not math.isfinite(budget) or budget <= 0):
        raise MrtInputError(f"budget must be a positive finite number, got {budget!r}")
    if loss_bound is not None and (not _real(loss_bound) or not math.isfinite(loss_bound) or loss_bound < 0):
        raise MrtInputError(f"loss_bound must be a finite number >= 0, got {loss_bound!r}")

    s = acc.summary()
    vx, vy = float(s["v_x"]), float(s["v_y_given_x"])
    notes: list[str] = []
    if s["n_single_response_prompts"]:
        notes.append(
            f"{s['n_single_response_prompts']} prompt(s) with a single response carry no within-prompt "
            "information and were left out of V_x and V_y|x"
        )
    if vx == 0 and vy > 0:
        ratio = math.inf
        notes.append(
            f"V_x estimate is 0 (raw {s['v_x_raw']:.4g}: the spread of prompt means is within the response noise), "
            f"so K* is infinite and k_best is the cap k_max = {k_max}; measure more prompts to resolve the prompt floor"
        )
    elif vx == 0:
        ratio = math.nan
        notes.append("every loss is the same: V_x = V_y|x = 0, every K is equally good; k_best = 1")
    else:
        ratio = vy / vx
    ks = k_star(vx, vy, cp, cr)
    kb = best_integer_k(vx, vy, cp, cr, k_max=k_max)
    if math.isfinite(ks) and ks > k_max:
        notes.append(f"K* = {ks:.4g} is above k_max = {k_max}; k_best is capped")

    n_ref = int(n_prompts) if n_prompts is not None else int(s["n_prompts"])
    cols: dict[str, Any] = {"k": grid}
    kf = grid.astype(np.float64)
    cols["var_per_prompt"] = vx + vy / kf
    cols["n_prompts"] = np.full(len(grid), n_ref, dtype=np.int64)
    cols["predicted_variance"] = predicted_variance(vx, vy, kf, n_ref)
    cols["tightening_factor"] = tightening_factor(vx, vy, kf)
    if loss_bound is not None:
        cols["bernstein_bound"] = bernstein_bound(vx, vy, kf, n_ref, delta=delta, loss_bound=loss_bound)
    if budget is not None:
        npb = budget_prompts(budget, kf, cp, cr)
        cols["budget_n_prompts"] = npb
        cols["budget_variance"] = predicted_variance(vx, vy, kf, npb)
        if loss_bound is not None:
            cols["budget_bernstein_bound"] = bernstein_bound(vx, vy, kf, npb, delta=delta, loss_bound=loss_bound)
        if np.any(npb == 0):
            notes.append(f"the budget {budget:g} buys no prompt at K >= {int(grid[npb == 0][0])}")
    else:
        notes.append("no budget given: predicted variance is at the observed number of prompts")
    if loss_bound is None:
        notes.append("no loss_bound given: Bernstein bounds omitted")

    ci: dict[str, tuple[float, float]] = {}
    method = used = "none"
    if n_boot > 0:
        p_used = int(s["n_used_prompts"])
        ci, frac0, method, used = _bootstrap(
            acc._core,
            p_used,
            float(s["grand_mean"]),
            n_boot=int(n_boot),
            seed=int(seed),
            cp=cp,
            cr=cr,
            k_max=k_max,
            level=ci_level,
            method=bootstrap,
            interval=interval,
        )
        if method == "normal":
            why = (
                f"{p_used} prompts x {n_boot} resamples is above {EXACT_BOOTSTRAP_DRAWS:.0e} draws"
                if bootstrap == "auto"
                else "as asked"
            )
            notes.append(
                f"intervals from the normal approximation of the bootstrap ({why}; bootstrap='exact' resamples the prompts)"
            )
        if interval not in ("auto", used):
            notes.append(f"interval={interval!r} needs the prompts resampled and at least 4 of them with "
                         f"V_y|x > 0: {used} intervals instead")
        if frac0 > 0:
            notes.append(f"V_x was 0 in {frac0:.1%} of bootstrap resamples (K* infinite there)")
    identified, identification = _identification(s, vx, vy, ci, ci_level)
    k_at_least = kb
    if "k_best" in ci and math.isfinite(ci["k_best"][0]):
        k_at_least = int(min(kb, max(1, math.ceil(ci["k_best"][0]))))
    elif not identified:
        k_at_least = 1
    if not identified:
        notes.insert(0, identification)

    return VarianceReport(
        n_rows=int(s["n_rows"]),
        n_prompts=int(s["n_prompts"]),
        n_single_response_prompts=int(s["n_single_response_prompts"]),
        n_used_prompts=int(s["n_used_prompts"]),
        mean_k=float(s["mean_k"]),
        v_x=vx,
        v_x_raw=float(s["v_x_raw"]),
        v_y_given_x=vy,
        var_of_means=float(s["var_of_means"]),
        ratio=ratio,
        cost_prompt=cp,
        cost_response=cr,
        k_star=ks,
        k_best=kb,
        k_max=k_max,
        mrt_pays=mrt_pays(vx, vy, cp, cr),
        k2_beats_k1=k2_beats_k1(vx, vy, cp, cr),
        tightening_saturation=_saturation(vx, vy),
        delta=float(delta),
        loss_bound=None if loss_bound is None else float(loss_bound),
        budget=None if budget is None else float(budget),
        ci_level=float(ci_level),
        n_boot=int(n_boot),
        seed=int(seed),
        bootstrap=method,
        interval=used,
        pilot_k_max=int(np.max(acc._core.per_prompt()["count"])) if len(acc) else None,
        ci=ci,
        predicted=pl.DataFrame(cols),
        notes=notes,
        identified=identified,
        identification=identification,
        k_at_least=k_at_least,
    )


def _identification(s: dict, vx: float, vy: float, ci: dict, level: float) -> tuple[bool, str | None]:
    """Whether the pilot bounds the ratio V_y|x / V_x, and if not, why and what more data would fix it."""
    if vy == 0:
        return True, None  # no within-prompt spread: K = 1, whatever V_x is
    raw = float(s["v_x_raw"])
    if vx <= 0:
        why = (f"the V_x estimate is {raw:.4g} <= 0 (the spread of the prompt means is within their "
               "response noise)")
    elif "ratio" in ci and not math.isfinite(ci["ratio"][1]):
        why = f"the ratio's {level:.0%} interval is unbounded above (V_x's interval reaches 0)"
    else:
        return True, None
    p = int(s["n_used_prompts"])
    vm = float(s["var_of_means"])
    noise = max(vm - raw, 0.0)  # mean s_i^2 / K_i: the response noise in the spread of the means
    # the spread of P prompt means has a standard error of about vm * sqrt(2 / (P - 1)); a prompt
    # floor below about twice that cannot be told from 0
    floor = 2.0 * max(vm, noise) * math.sqrt(2.0 / max(p - 1, 1))
    return False, (
        f"ratio not identified: {why}, so K* is not a recommendation. With {p} prompts this pilot cannot "
        f"tell a prompt floor V_x below about {floor:.3g} from 0; that limit shrinks as 1/sqrt(prompts) "
        f"(4x the prompts halves it), and more responses per prompt shrink the response noise ({noise:.3g}) "
        "it must be told apart from"
    )


def variance_budget(
    table: Any,
    *,
    by: str = "prompt_id",
    loss: str = "loss",
    cost_prompt: float = 1.0,
    cost_response: float = 1.0,
    k_grid: Sequence[int] = DEFAULT_K_GRID,
    k_max: int = 1024,
    budget: float | None = None,
    n_prompts: int | None = None,
    delta: float = 0.05,
    loss_bound: float | None = None,
    n_boot: int = 1000,
    seed: int = 0,
    ci_level: float = 0.95,
    bootstrap: str = "auto",
    interval: str = "auto",
    layout: str = "auto",
    tokens: str | None = None,
) -> VarianceReport:
    """Estimate V_x and V_y|x from a table of per-response losses and say how
    many responses per prompt the budget law recommends.

    `table`: polars/Arrow/pandas, one row per response with a prompt id column
    `by` (any type) and a numeric `loss` column, or one row per prompt with a
    list of losses (the grouped layout; `layout` "auto" tells them apart by the
    loss column, "flat" or "grouped" says which). `tokens`: a column of token
    counts; then `loss` is a sum of token log-probabilities (the `logprob` that
    `mrt generate` writes) and the loss is the mean token NLL `-loss / tokens`,
    a pilot loss that costs no extra forward pass. `cost_prompt`/`cost_response`
    are C_p, C_r (only their ratio matters for K*). `k_grid`: the K values of the
    predicted-variance table; `k_max`: the largest K considered for `k_best`.
    `budget`: B, to tabulate Np = floor(B / (C_p + K C_r)) and the variance it
    buys. `loss_bound`: B_loss of the Bernstein bound (losses in [0, B_loss]);
    None uses the observed range max - min of the loss column (noted).
    `n_boot`, `seed`, `ci_level`: seeded bootstrap over prompts.
    `bootstrap`: "exact" resamples the prompts (time grows as prompts x
    n_boot); "normal" draws each resample's means of the per-prompt
    statistics from their large-sample normal law (time independent of the
    prompt count); "auto" (default) is exact up to 5e7 draws.
    `interval`: how the resamples become intervals (`mrt_fast.variance.intervals`):
    "studentized" (bootstrap-t on log V_y|x and on the log of the ANOVA F = vm / leak, with
    leave-one-prompt-out jackknife standard errors; the ratio, K* and k_best
    follow from V_x / V_y|x's interval), "bca", "calibrated" (double
    bootstrap; n_boot x 200 resamples), "expanded" or "percentile". "auto"
    (default): studentized where prompts are resampled, expanded with the
    normal approximation. Measured coverage: docs/interval_coverage.md.
    """
    df = _frame(table, by, loss, layout, tokens)
    x = loss_column(df, loss)
    acc = VarianceAccumulator().update(df[by], x)
    notes_extra = []
    if loss_bound is None and len(x):
        # both ends in one polars pass (the update checked that every loss is finite)
        loss_bound = float(pl.DataFrame({"x": x}).select(pl.col("x").max() - pl.col("x").min()).item())
        notes_extra.append(f"loss_bound not given: using the observed loss range {loss_bound:.4g}")
    rep = report_from_accumulator(
        acc,
        cost_prompt=cost_prompt,
        cost_response=cost_response,
        k_grid=k_grid,
        k_max=k_max,
        budget=budget,
        n_prompts=n_prompts,
        delta=delta,
        loss_bound=loss_bound,
        n_boot=n_boot,
        seed=seed,
        ci_level=ci_level,
        bootstrap=bootstrap,
        interval=interval,
    )
    rep.notes.extend(notes_extra)
    rep._pilot = (df[by], x)
    return rep


# --------------------------------------------------------------------------- implicit MRT


@dataclass
class RedundancyReport:
    """Prompt redundancy: C clusters of near-equivalent prompts among Np.

    Single-response data over Np prompts in C clusters behaves like C prompts
    with K_eff ~ Np / C responses each; its variance is about
    V_x* / C + V_y|x* / Np with the cluster-level components (estimated from
    per-prompt losses grouped by cluster when given).
    """

    n_prompts: int
    n_clusters: int
    k_eff: float
    method: str
    threshold: float | None
    labels: np.ndarray
    cluster_sizes: np.ndarray
    v_x_star: float | None = None
    v_y_given_x_star: float | None = None
    implied_variance: float | None = None
    naive_variance: float | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "n_prompts": self.n_prompts,
            "n_clusters": self.n_clusters,
            "k_eff": json_num(self.k_eff),
            "method": self.method,
            "threshold": self.threshold,
            "largest_cluster": int(self.cluster_sizes.max()) if len(self.cluster_sizes) else 0,
            "v_x_star": json_num(self.v_x_star),
            "v_y_given_x_star": json_num(self.v_y_given_x_star),
            "implied_variance": json_num(self.implied_variance),
            "naive_variance": json_num(self.naive_variance),
            "notes": list(self.notes),
        }


def _threshold_components(x: np.ndarray, threshold: float, block: int = 4096) -> np.ndarray:
    """Connected components of the graph cos(x_i, x_j) >= threshold."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    n = len(x)
    rows, cols = [], []
    try:
        import faiss

        index = faiss.IndexFlatIP(x.shape[1])
        index.add(x)
        for s in range(0, n, block):
            lims, _, nbr = index.range_search(x[s : s + block], float(threshold) - 1e-6)
            counts = np.diff(lims.astype(np.int64))
            rows.append(np.repeat(np.arange(s, s + len(counts)), counts))
            cols.append(nbr.astype(np.int64))
    except ImportError:  # pragma: no cover - faiss is in the embed extra
        for s in range(0, n, block):
            sim = x[s : s + block] @ x.T
            r, c = np.nonzero(sim >= threshold - 1e-6)
            rows.append(r + s)
            cols.append(c)
    r = np.concatenate(rows) if rows else np.zeros(0, np.int64)
    c = np.concatenate(cols) if cols else np.zeros(0, np.int64)
    g = coo_matrix((np.ones(len(r), dtype=np.int8), (r, c)), shape=(n, n)).tocsr()
    _, labels = connected_components(g, directed=False)
    return labels.astype(np.int64)


def implicit_mrt(
    embeddings: Any,
    *,
    losses: Any = None,
    threshold: float = 0.9,
    method: str = "threshold",
    n_clusters: int | None = None,
    v_x_star: float | None = None,
    v_y_given_x_star: float | None = None,
    seed: int = 0,
) -> RedundancyReport:
    """Estimate prompt redundancy from prompt embeddings (one row per prompt).

    `method="threshold"`: prompts i, j are near-equivalent when their cosine
    similarity is >= `threshold`; clusters are the connected components of that
    graph (exact range search with FAISS, scipy connected components).
    `method="kmeans"`: `n_clusters` modes by the k-means policy of `mrt_fast.selection.modes`.

    With `losses` (one single-response loss per prompt), the cluster-level
    components V_x*, V_y|x* are estimated by treating each cluster as a prompt
    and its members as responses; or pass them directly. Then
    `implied_variance = V_x*/C + V_y|x*/Np` and `naive_variance` (every prompt
    its own cluster) = (V_x* + V_y|x*)/Np.
    """
    x = np.asarray(embeddings, dtype=np.float32)
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] == 0:
        raise MrtInputError(f"embeddings must be a non-empty (n_prompts, dim) matrix, got shape {x.shape}")
    if not np.isfinite(x).all():
        bad = int(np.nonzero(~np.isfinite(x).all(axis=1))[0][0])
        raise MrtInputError(f"embedding of prompt {bad} has NaN/inf values")
    norms = np.linalg.norm(x, axis=1)
    if np.any(norms == 0):
        raise MrtInputError(f"embedding of prompt {int(np.nonzero(norms == 0)[0][0])} is the zero vector")
    x = np.ascontiguousarray(x / norms[:, None], dtype=np.float32)
    n = len(x)
    notes: list[str] = []
    if method == "threshold":
        if not -1 <= threshold <= 1:
            raise MrtInputError(f"threshold must be a cosine in [-1, 1], got {threshold}")
        labels = _threshold_components(x, threshold)
    elif method == "kmeans":
        if n_clusters is None or not 1 <= int(n_clusters) <= n:
            raise MrtInputError(f"method='kmeans' needs 1 <= n_clusters <= {n}, got {n_clusters}")
        from mrt_fast.selection.modes import kmeans

        labels = kmeans(x, int(n_clusters), seed=seed)
    else:
        raise MrtInputError(f"method must be 'threshold' or 'kmeans', got {method!r}")
    sizes = np.bincount(labels)
    sizes = sizes[sizes > 0]
    c = int(len(sizes))
    rep = RedundancyReport(
        n_prompts=n,
        n_clusters=c,
        k_eff=n / c,
        method=method,
        threshold=float(threshold) if method == "threshold" else None,
        labels=labels,
        cluster_sizes=sizes,
        notes=notes,
    )
    if losses is not None:
        lv = _losses(losses)
        if len(lv) != n:
            raise MrtInputError(f"losses must have one value per prompt: {len(lv)} losses for {n} prompts")
        acc = VarianceAccumulator().update(labels.astype(np.int64), lv)
        try:
            s = acc.summary()
            v_x_star = v_x_star if v_x_star is not None else float(s["v_x"])
            v_y_given_x_star = v_y_given_x_star if v_y_given_x_star is not None else float(s["v_y_given_x"])
        except MrtInputError:
            notes.append("fewer than 2 clusters with >= 2 prompts: cluster-level variances cannot be estimated")
    if v_x_star is not None and v_y_given_x_star is not None:
        rep.v_x_star, rep.v_y_given_x_star = float(v_x_star), float(v_y_given_x_star)
        rep.implied_variance = v_x_star / c + v_y_given_x_star / n
        rep.naive_variance = (v_x_star + v_y_given_x_star) / n
    return rep
