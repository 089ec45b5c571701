"""`VarianceReport`: the variance-budget diagnosis of a set of losses, as numbers, text and a plot.

Built by :func:`mrt_fast.variance.variance_budget` (or
:func:`~mrt_fast.variance.diagnosis.report_from_accumulator`); ``to_dict``
is JSON-safe, ``repr`` is the text ``mrt diagnose`` prints, ``plot`` draws the
predicted variance against K, ``allocate`` gives per-prompt K.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from mrt_fast.errors import MrtInputError
from mrt_fast.variance.law import budget_prompts, predicted_variance

#: image formats `VarianceReport.plot` writes (by the file's suffix)
PLOT_FORMATS = ("png", "pdf", "svg", "svgz", "eps", "ps", "jpg", "jpeg", "tif", "tiff", "webp")


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
