"""`mrt diagnose`: the variance budget of per-response losses."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from mrt_fast.cli.common import (
    table,
    ALLOW_PARTIAL,
    app,
    check_engine,
    console,
    user_errors,
)


@app.command("diagnose")
def diagnose_cmd(
    inp: str = typer.Argument(..., metavar="INPUT", help="Per-response losses: a file (.parquet, .jsonl, .csv), a directory of "
                              "Parquet/JSONL files or a quoted glob; streamed, never read whole."),
    loss: Optional[str] = typer.Option(None, help="Loss column (default: loss; with --loss-from logprob: logprob)."),
    loss_from: str = typer.Option("loss", "--loss-from", help="loss (a per-response loss column, e.g. mrt nll's) "
                                  "or logprob (mrt generate's summed token log-probabilities: the pilot loss is "
                                  "-logprob / n_tokens, no forward pass needed)."),
    tokens: str = typer.Option("n_tokens", "--tokens", help="--loss-from logprob: the token count column."),
    by: str = typer.Option("prompt_id", help="Prompt id column."),
    cost_prompt: float = typer.Option(1.0, help="Cost C_p of one prompt."),
    cost_response: float = typer.Option(1.0, help="Cost C_r of one response."),
    budget: float = typer.Option(None, help="Total budget B = Np (C_p + K C_r), for the budget table and plot."),
    k_max: int = typer.Option(1024, help="Largest K considered."),
    loss_bound: float = typer.Option(None, help="Loss range B_loss for the Bernstein bound (default: observed range)."),
    delta: float = typer.Option(0.05, help="Failure probability of the Bernstein bound."),
    n_boot: int = typer.Option(1000, help="Bootstrap resamples for the intervals (0: none)."),
    seed: int = typer.Option(0, help="Bootstrap seed."),
    bootstrap: str = typer.Option(
        "auto", help="exact (resample prompts), normal (large-sample law of the resample means) or auto."
    ),
    interval: str = typer.Option(
        "auto", help="Interval method: studentized, bca, calibrated, expanded, percentile or auto "
        "(studentized; expanded with the normal approximation)."
    ),
    json_out: Path = typer.Option(None, "--json", help="Write the report as JSON here (inf as the string \"inf\")."),
    plot: Path = typer.Option(None, "--plot", help="Write the variance-vs-K plot here (.png)."),
    allocate: int = typer.Option(None, "--allocate", help="Per-prompt K for this total of responses (Neyman "
                                 "allocation, capped by each prompt's pool size and --k-max)."),
    pool_sizes: Path = typer.Option(None, "--pool-sizes", help="--allocate: a table of each prompt's pool size "
                                    "(the --by column and pool_size or n), the cap of its K; default: its number "
                                    "of pilot losses."),
    allocation: Path = typer.Option(None, "--allocation", help="Write the allocation (prompt_id, k, ...) here; "
                                    "feed it to mrt select --k k after a join."),
    engine: str = typer.Option("local", "--engine", help="local (streamed on this machine) or ray (Ray Data)."),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="Ray cluster to join; --engine ray only."),
    allow_partial: bool = ALLOW_PARTIAL,
) -> None:
    """How many responses per prompt are worth keeping: V_x, V_y|x, K* and the budget law."""
    import json

    from mrt_fast.variance import variance_budget
    from mrt_fast.errors import MrtInputError

    with user_errors():
        check_engine(engine, ray_address)
        if loss_from not in ("loss", "logprob"):
            raise MrtInputError(f"--loss-from must be 'loss' or 'logprob', got {loss_from!r}")
        if loss_from == "logprob" and engine == "ray":
            raise MrtInputError("--loss-from logprob runs on --engine local only")
        loss = loss or loss_from
        tok_col = tokens if loss_from == "logprob" else None
        if allocation is not None and allocate is None:
            raise MrtInputError("--allocation needs --allocate TOTAL")
        if pool_sizes is not None and allocate is None:
            raise MrtInputError("--pool-sizes needs --allocate TOTAL")
        _check_report_outputs(json_out, plot, allocation)
        from mrt_fast.datasets.overlap import check_apart

        check_apart([("input", inp), ("--pool-sizes", pool_sizes)],
                    [("--json", json_out), ("--plot", plot), ("--allocation", allocation)])
        sizes = read_pool_sizes(pool_sizes, by, allow_partial) if pool_sizes is not None else None
        opts = dict(by=by, loss=loss, tokens=tok_col, cost_prompt=cost_prompt, cost_response=cost_response,
                    budget=budget, k_max=k_max, loss_bound=loss_bound, delta=delta, n_boot=n_boot, seed=seed,
                    bootstrap=bootstrap, interval=interval)
        if allocate is not None:
            # per-prompt K names each prompt: the (id, loss) columns are read into memory
            import polars as pl

            from mrt_fast.datasets.sources import discover

            ds = discover(inp, allow_partial=allow_partial)
            cols = [(by, "prompt id"), (loss, "loss")] + ([(tok_col, "token count")] if tok_col else [])
            ds.check_columns(cols)
            names = [c for c, _ in cols]
            frames = list(ds.frames(names, 1 << 20))  # Parquet objects: every page checked
            rep = variance_budget(pl.concat(frames) if frames else ds.scan().select(names).head(0).collect(), **opts)
        else:
            rep = variance_budget(inp, engine=engine, address=ray_address, allow_partial=allow_partial, **opts)
        # every option is checked before any output is written: the allocation too
        al = None
        if allocate is not None:
            try:
                al = rep.allocate(allocate, k_max=k_max, pool_sizes=sizes)
            except MrtInputError as e:
                if sizes is not None or "more than" not in str(e):
                    raise
                raise MrtInputError(f"{e} (the allocation covers the {rep.n_prompts:,} prompts of the pilot, each "
                                    "capped by its number of losses there: give their real pool sizes with "
                                    "--pool-sizes, or a total for these prompts; see docs/guides/variance.md for the "
                                    "prompts outside the pilot)") from None
    console.print(repr(rep), highlight=False)
    print_table(rep.predicted, "predicted variance by K")
    from mrt_fast._util.disk_space import reporting_full_disk
    from mrt_fast._util.files import write_text
    from mrt_fast.datasets.formats import write_table

    with user_errors():
        if json_out is not None:
            with reporting_full_disk("writing --json", json_out):
                write_text(json_out, json.dumps(rep.to_dict(), indent=2))
            console.print(f"wrote {json_out}")
        if plot is not None:
            with reporting_full_disk("writing --plot", plot):
                rep.plot(plot)
            console.print(f"wrote {plot}")
        if al is not None:
            console.print(repr(al), highlight=False)
            if allocation is not None:
                with reporting_full_disk("writing --allocation", allocation):
                    write_table(al.table, allocation)
                console.print(f"wrote {allocation}")


def print_table(df, title: str) -> None:
    """``df`` as a rich table that is never cut: on a terminal its headers fold to the terminal's
    width; elsewhere (a log, a pipe) the lines are as wide as the table needs."""
    from rich.console import Console
    from rich.measure import Measurement

    tab = table(console, title=title)
    for c in df.columns:
        tab.add_column(c, justify="right", overflow="fold")
    for row in df.iter_rows():
        tab.add_row(*[f"{v:.4g}" if isinstance(v, float) else str(v) for v in row])
    out = console
    if not console.is_terminal:
        need = Measurement.get(console, console.options.update(width=10_000), tab).maximum
        out = Console(file=console.file, width=max(console.width, need), force_terminal=False)
    out.print(tab)


def read_pool_sizes(path: Path, by: str, allow_partial: bool = False):
    """--pool-sizes: the table of each prompt's pool size (``by`` and ``pool_size`` or ``n``), as
    ``prompt_id``/``pool_size`` for `VarianceReport.allocate`."""
    import polars as pl

    from mrt_fast.cli.common import check_input_table
    from mrt_fast.datasets import formats as _formats
    from mrt_fast.errors import MrtInputError
    from mrt_fast.variance.allocate import check_pool_sizes

    lf = check_input_table(path, (by,), "--pool-sizes", dataset=True, allow_partial=allow_partial)
    names = lf.collect_schema().names()
    size = "pool_size" if "pool_size" in names else "n" if "n" in names else None
    if size is None:
        raise MrtInputError(f"--pool-sizes {str(path)!r}: no pool_size (or n) column; it has columns {names}")
    df = _formats.collect(lf.select(pl.col(by).alias("prompt_id"), pl.col(size).alias("pool_size")), path)
    return check_pool_sizes(df)


def _check_report_outputs(json_out: Optional[Path], plot: Optional[Path], allocation: Optional[Path]) -> None:
    """diagnose's outputs, checked before any work: a place a file can be written,
    an image format matplotlib writes for --plot, a table format for --allocation."""
    from mrt_fast.datasets.formats import check_output
    from mrt_fast.errors import MrtInputError

    if json_out is not None:
        check_output(json_out, "--json", table=False)
    if plot is not None:
        from mrt_fast.variance.report import PLOT_FORMATS

        if plot.suffix.lower().lstrip(".") not in PLOT_FORMATS:
            raise MrtInputError(f"--plot {str(plot)!r}: unsupported image format {plot.suffix!r} "
                                "(use .png, .pdf or .svg)")
        check_output(plot, "--plot", table=False)
    if allocation is not None:
        check_output(allocation, "--allocation")
