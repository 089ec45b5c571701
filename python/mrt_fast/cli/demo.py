"""`mrt demo`: every selector on the bundled MOSAIC examples.

The data are the eight MOSAIC-1K items quoted in the paper's appendix (see
``data/mosaic_examples.jsonl``): four responses per item, pooled by item. The
``reward`` column is a heuristic (cosine, under all-MiniLM-L6-v2, between the
response and the item's base theme), standing in for a reward model.
"""

from __future__ import annotations

import json
import time
import warnings
from importlib import resources
from pathlib import Path

import numpy as np
import polars as pl

from mrt_fast.errors import MissingDependencyError
from mrt_fast.selection.metrics import kept_metrics

METHODS = ("random", "top", "diverse", "grades", "stratified")


def example_path() -> Path:
    """Path of the bundled MOSAIC examples (JSONL)."""
    return Path(str(resources.files("mrt_fast") / "data" / "mosaic_examples.jsonl"))


def load_examples(max_prompts: int | None = None) -> pl.DataFrame:
    df = pl.read_ndjson(example_path())
    if max_prompts is not None:
        if max_prompts < 1:
            from mrt_fast.errors import MrtInputError

            raise MrtInputError(f"max_prompts must be >= 1, got {max_prompts}")
        keep = df["prompt_id"].unique(maintain_order=True).head(max_prompts)
        df = df.filter(pl.col("prompt_id").is_in(keep.implode()))
    return df


def run_demo(out_dir: Path, *, k: int = 2, model=None, max_prompts: int | None = None, cache_dir=None,
             console=None, plot: bool = True) -> dict:
    """Run the demo; return per-method mean metrics. Writes a plot, kept rows and metrics to ``out_dir``."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from mrt_fast._util.files import check_output_dir
    from mrt_fast.errors import MrtInputError, SmallPoolWarning
    from mrt_fast.selection.modes import pool_modes
    from mrt_fast.selection.select import select

    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise MrtInputError(f"k must be an integer >= 1, got {k!r}")
    if max_prompts is not None and (isinstance(max_prompts, bool) or not isinstance(max_prompts, int) or max_prompts < 1):
        raise MrtInputError(f"max_prompts must be an integer >= 1, got {max_prompts!r}")
    check_output_dir(out_dir, "output directory")
    try:
        from mrt_fast.embeddings.embed import embed
    except ImportError as e:
        raise MissingDependencyError(f"the demo needs the embed extra: pip install 'mrt_fast[embed]' ({e})") from None

    con = console or Console()
    boxed = {} if con.is_terminal else {"box": None}  # plain columns in a pipe or a log
    t0 = time.perf_counter()
    out_dir = Path(out_dir)
    df = load_examples(max_prompts)
    con.print(f"[bold]{df['prompt_id'].n_unique()} example prompts, {df.height} responses[/] (MOSAIC items from the paper; "
              "reward = heuristic: MiniLM cosine of response to theme)")
    with con.status("embedding responses (all-MiniLM-L6-v2, offline)..."):
        df = embed(df, text="response", model=model, cache_dir=cache_dir, progress=False)
        # four candidates per pool are too few for the silhouette rule: the demo asks for K modes
        df = pool_modes(df, by="prompt_id", embedding="embedding", n_modes=k, seed=0)
    x_all = df["embedding"].to_numpy().astype(np.float32)
    df = df.with_row_index("__row")
    kept = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SmallPoolWarning)
        for m in METHODS:
            kept[m] = select(df, k, m, seed=0, return_report=True)
    metrics: dict[str, dict] = {m: {"diversity": [], "coverage": [], "reward": []} for m in METHODS}
    rows_out = []
    for pid in df["prompt_id"].unique(maintain_order=True):
        pool = df.filter(pl.col("prompt_id") == pid)
        prow = pool["__row"].to_numpy()
        xp = x_all[prow]
        first = pool.row(0, named=True)
        tab = Table(**boxed, title=escape(f"{pid} [{first['domain']}, {first['axis']} axis]: {first['theme']}"), title_justify="left",
                    show_lines=False)
        for c in ("selector", "kept (response: approach)", "why", "reward", "diversity"):
            tab.add_column(c, overflow="fold")
        for m in METHODS:
            t, rep = kept[m]
            sub = t.filter(pl.col("prompt_id") == pid)
            pos = np.searchsorted(prow, sub["__row"].to_numpy())
            div, cov = kept_metrics(xp, pos)
            metrics[m]["diversity"].append(div)
            metrics[m]["coverage"].append(cov)
            metrics[m]["reward"].append(float(sub["reward"].mean()))
            why = []
            for r in sub.iter_rows(named=True):
                if m == "random":
                    why.append("uniform draw")
                elif m == "top":
                    rank = int((pool["reward"] > r["reward"]).sum()) + 1
                    why.append(f"reward #{rank}")
                elif m == "stratified":
                    why.append(f"mode {r['mode']} of {int(pool['mode'].max()) + 1}")
                else:
                    why.append(f"gain {r['gain']:.3f}")
                rows_out.append({"selector": m, **{c: r[c] for c in ("prompt_id", "response_id", "approach", "reward")},
                                 "pick_rank": r["pick_rank"], "why": why[-1]})
            tab.add_row(m, "; ".join(f"{a}: {b}" for a, b in zip(sub["response_id"], sub["approach"])),
                        "; ".join(why), " ".join(f"{v:.3f}" for v in sub["reward"]), f"{div:.3f}")
        con.print(tab)
    summary = {m: {kk: float(np.mean(v)) for kk, v in d.items()} for m, d in metrics.items()}
    for m in ("diverse", "grades"):
        summary[m]["mean_certified_ratio"] = kept[m][1].mean_ratio
    tab = Table(**boxed, title=f"selectors at K = {k}, mean over prompts")
    for c in ("selector", "coverage", "diversity", "reward"):
        tab.add_column(c, justify="right")
    for m in METHODS:
        s = summary[m]
        tab.add_row(m, f"{s['coverage']:.3f}", f"{s['diversity']:.3f}", f"{s['reward']:.3f}")
    con.print(tab)
    out_dir.mkdir(parents=True, exist_ok=True)
    _atomic_text(out_dir / "kept.jsonl", "".join(json.dumps(r) + "\n" for r in rows_out))
    _atomic_text(out_dir / "metrics.json", json.dumps(summary, indent=2))
    if plot:
        se = {m: {kk: float(np.std(v, ddof=1) / np.sqrt(len(v))) if len(v) > 1 else 0.0 for kk, v in d.items()}
              for m, d in metrics.items()}
        _plot(summary, se, k, out_dir / "selectors.png")
        con.print(f"plot: {out_dir / 'selectors.png'}")
    con.print(f"kept rows: {out_dir / 'kept.jsonl'}; metrics: {out_dir / 'metrics.json'} "
              f"({time.perf_counter() - t0:.1f} s)")
    return summary


def _atomic_text(path: Path, text: str) -> None:
    from mrt_fast._util.files import write_text

    write_text(path, text)


def _plot(summary: dict, se: dict, k: int, path: Path) -> None:
    """One bar chart per metric: bars from 0 (a bar's length is its value) with 95% intervals over
    the prompts (mean +- 1.96 standard errors)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(summary)
    keys = ("coverage", "diversity", "reward")
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.4))
    for ax, key in zip(axes, keys):
        vals = [summary[n][key] for n in names]
        ax.bar(names, vals, yerr=[1.96 * se[n][key] for n in names], capsize=3,
               color=["#999999", "#B25E1C", "#1F5FA8", "#0F7A6B", "#6E3FA0"][: len(names)])
        ax.axhline(0.0, color="black", lw=0.6)
        ax.set_title({"coverage": "coverage (mean max cos to kept)", "diversity": "diversity (1 - mean pairwise cos)",
                      "reward": "reward of kept (heuristic)"}[key], fontsize=9)
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    fig.suptitle(f"MOSAIC examples: what each selector keeps at K = {k} (95% intervals over prompts)", fontsize=10)
    fig.tight_layout()
    from mrt_fast._util.files import atomic_path

    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=120, format="png")
    finally:
        plt.close(fig)
