"""The results of ``mrt run``: one row per cell (results.csv), the markdown table (results.md)
and the plot of each metric against K (results.png)."""

from __future__ import annotations

import math
import os

import polars as pl

__all__ = ["RESULT_METRICS", "plot_results", "results_markdown", "results_row"]


#: the metrics of a results row, each with its standard error over the evaluation prompts
RESULT_METRICS = ("ref_loss", "reward", "coverage", "diversity")


def results_row(method: str, k: int, metrics: dict, cell: str, same_as: str | None) -> dict:
    """One row of results.csv: the cell, its metrics (and their ``_se``), how it was obtained
    (``cell``: new, or reused from disk or from an identical cell) and the identical cell it shares
    its model with (``same_as``)."""
    row = {"method": method, "K": k, **{key: metrics.get(key) for key in RESULT_METRICS},
           **{key: v for key, v in metrics.items() if key.startswith("pass@") and not key.endswith("_se")}}
    row.update({f"{key}_se": metrics.get(f"{key}_se") for key in list(row)[2:]})
    row.update(cell=cell, same_as=same_as)
    return row


def results_markdown(results: pl.DataFrame) -> str:
    """The results as a markdown table in the shape of the paper's Table 4 (method shown once per block);
    a metric with a standard error is shown as mean ± 1.96 se (its 95% interval over prompts)."""
    cols = [c for c in results.columns if not (c.endswith("_se") and c[:-3] in results.columns)]
    head = {"method": "Strategy", "K": "K", "ref_loss": "Ref. loss ↓", "reward": "Reward ↑",
            "coverage": "Coverage ↑", "diversity": "Diversity ↑"}
    lines = ["| " + " | ".join(head.get(c, c) for c in cols) + " |", "|" + "---|" * len(cols)]
    prev = None
    for r in results.iter_rows(named=True):
        cells = []
        for c in cols:
            v = r[c]
            if c == "method":
                cells.append("" if v == prev else str(v))
            elif isinstance(v, float):
                se = r.get(f"{c}_se")
                ci = f" ± {1.96 * se:.3f}" if isinstance(se, float) and math.isfinite(se) else ""
                cells.append("—" if v != v else f"{v:.3f}{ci}")
            else:
                cells.append("—" if v is None else str(v))
        prev = r["method"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_results(results: pl.DataFrame, path: str | os.PathLike, n_prompts: int | None = None) -> None:
    """Each metric against K (plain integer labels), one line per method, with 95% intervals over
    the ``n_prompts`` evaluation prompts (mean +- 1.96 standard errors; the base model as a dashed
    line and a band). Methods are drawn side by side around each K so that equal values stay
    visible; a cell that shares its kept rows (and so its model) with another is drawn hollow and
    labelled with that cell."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker as mticker

    metrics = [m for m in RESULT_METRICS if m in results.columns and results[m].drop_nulls().len()]
    methods = [m for m in results["method"].unique(maintain_order=True).to_list() if m != "base"]
    fig, axes = plt.subplots(1, len(metrics), figsize=(4 * len(metrics), 3.2), squeeze=False)
    for ax, met in zip(axes[0], metrics):
        se_col = f"{met}_se"
        for i, method in enumerate(["base"] + methods):
            sub = results.filter(pl.col("method") == method).sort("K")
            if sub.height == 0:
                continue
            se = [(1.96 * v if v is not None and math.isfinite(v) else 0.0) for v in
                  (sub[se_col].to_list() if se_col in sub.columns else [None] * sub.height)]
            vals = sub[met].to_list()
            if method == "base":
                if vals[0] is not None:
                    ax.axhline(vals[0], ls="--", color="grey", label="base")
                    if se[0]:
                        ax.axhspan(vals[0] - se[0], vals[0] + se[0], color="grey", alpha=0.12)
                continue
            shift = 2.0 ** (0.05 * (i - 1 - (len(methods) - 1) / 2))  # side by side on the log-K axis
            x = [k * shift for k in sub["K"].to_list()]
            bars = ax.errorbar(x, vals, yerr=se, marker="o", capsize=3, label=method)
            if "same_as" in sub.columns:
                for xi, v, twin in zip(x, vals, sub["same_as"].to_list()):
                    if twin is not None and v is not None:
                        ax.plot([xi], [v], "o", mfc="white", mec=bars[0].get_color())
                        ax.annotate(f"= {twin}", (xi, v), fontsize=6, xytext=(3, 3), textcoords="offset points")
        if "k_star" in results.columns:  # the advisor's K* and its bootstrap interval
            r = results.row(0, named=True)
            if r["k_star"] is not None and math.isfinite(r["k_star"]):
                ax.axvline(r["k_star"], color="C3", ls=":", label=f"K* = {r['k_star']:.2f}")
            lo, hi = r["k_star_lo"], r["k_star_hi"]
            if lo is not None and math.isfinite(lo):
                ax.axvspan(max(lo, 0.5), hi if math.isfinite(hi) else ax.get_xlim()[1], color="C3", alpha=0.1)
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(mticker.LogLocator(base=2))
        ax.xaxis.set_major_formatter(mticker.FuncFormatter(lambda v, _: f"{v:.0f}" if v >= 1 else f"{v:g}"))
        ax.xaxis.set_minor_formatter(mticker.NullFormatter())
        ax.set_xlabel("K")
        ax.set_title(f"{met} (95% interval over prompts)", fontsize=9)
    axes[0][0].legend(fontsize=8)
    title = [] if n_prompts is None else [f"{n_prompts} evaluation prompts"]
    if "k_star" in results.columns and results["k_star"][0] is not None:
        r = results.row(0, named=True)
        title.append(f"V_x = {r['v_x']:.3g}, V_y|x = {r['v_y_given_x']:.3g}, K* = {r['k_star']:.3g} "
                     f"[{r['k_star_lo']:.3g}, {r['k_star_hi']:.3g}], trained K = "
                     f"{sorted(set(results.filter(pl.col('method') != 'base')['K'].to_list()))}")
    if title:
        fig.suptitle("; ".join(title), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
