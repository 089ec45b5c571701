"""The `mrt` command."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(
    name="mrt",
    help="Multi-response training: how many responses per prompt to keep, which ones, and training on them.",
    no_args_is_help=True,
    add_completion=False,
)
console = Console()


def _example_pools(seed: int = 0):
    """A small synthetic pool set: 4 prompts x 12 candidates in 3 modes."""
    import numpy as np
    import polars as pl

    rng = np.random.default_rng(seed)
    rows = []
    for p in range(4):
        centres = rng.normal(size=(3, 16))
        for j in range(12):
            m = j % 3
            e = centres[m] + 0.15 * rng.normal(size=16)
            rows.append(
                {"prompt_id": f"prompt_{p}", "candidate": j, "mode": m,
                 "reward": float(1.0 - 0.3 * abs(m - 1) + 0.05 * rng.normal()),
                 "embedding": e.astype(np.float32).tolist()}
            )
    return pl.DataFrame(rows).with_columns(pl.col("embedding").cast(pl.Array(pl.Float32, 16)))


@app.command()
def demo(k: int = typer.Option(2, help="Responses kept per prompt.")) -> None:
    """Run every selector on a bundled example pool set and show what each kept."""
    import warnings

    from .select import select

    df = _example_pools()
    tab = Table(title=f"kept per prompt (K = {k})")
    tab.add_column("prompt")
    methods = ["random", "top", "diverse", "grades", "stratified"]
    for m in methods:
        tab.add_column(m)
    kept = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for m in methods:
            kept[m] = select(df, k, m, seed=0)
    for pid in df["prompt_id"].unique(maintain_order=True):
        cells = []
        for m in methods:
            sub = kept[m].filter(kept[m]["prompt_id"] == pid)
            cells.append(", ".join(f"#{c}(m{md})" for c, md in zip(sub["candidate"], sub["mode"])))
        tab.add_row(pid, *cells)
    console.print(tab)


@app.command("select")
def select_cmd(
    inp: Path = typer.Argument(..., help="Input table (.parquet, .jsonl, .csv)."),
    out: Path = typer.Argument(..., help="Output table; format from the suffix."),
    k: int = typer.Option(..., "--k", help="Responses kept per prompt."),
    method: str = typer.Option("grades", help="random | top | diverse | grades | stratified (or rkon/bkon/dkon/dbkon)."),
    by: str = typer.Option("prompt_id", help="Prompt id column."),
    alpha: float = typer.Option(0.75, help="Quality exponent (grades)."),
    kernel: str = typer.Option("shift", help="shift: (1+c)/2, clip: max(0, c)."),
    seed: int = typer.Option(0, help="Seed of random draws."),
) -> None:
    """Keep K responses per prompt of a table."""
    import polars as pl

    from .select import select

    readers = {".parquet": pl.read_parquet, ".jsonl": pl.read_ndjson, ".csv": pl.read_csv}
    if inp.suffix not in readers:
        raise typer.BadParameter(f"unsupported input format {inp.suffix!r}")
    df = readers[inp.suffix](inp)
    kept, rep = select(df, k, method, by=by, alpha=alpha, kernel=kernel, seed=seed, return_report=True)
    writers = {".parquet": kept.write_parquet, ".jsonl": kept.write_ndjson, ".csv": kept.write_csv}
    writers[out.suffix](out)
    console.print(rep.to_dict())


# ---- variance diagnostics commands ----


def _read_table(path: Path):
    import polars as pl

    readers = {".parquet": pl.read_parquet, ".jsonl": pl.read_ndjson, ".ndjson": pl.read_ndjson, ".csv": pl.read_csv}
    if path.suffix not in readers:
        raise typer.BadParameter(f"unsupported input format {path.suffix!r} (use .parquet, .jsonl or .csv)")
    if not path.exists():
        raise typer.BadParameter(f"no such file: {path}")
    return readers[path.suffix](path)


@app.command("diagnose")
def diagnose_cmd(
    inp: Path = typer.Argument(..., help="Table of per-response losses (.parquet, .jsonl, .csv)."),
    loss: str = typer.Option("loss", help="Loss column."),
    by: str = typer.Option("prompt_id", help="Prompt id column."),
    cost_prompt: float = typer.Option(1.0, help="Cost C_p of one prompt."),
    cost_response: float = typer.Option(1.0, help="Cost C_r of one response."),
    budget: float = typer.Option(None, help="Total budget B = Np (C_p + K C_r), for the budget table and plot."),
    k_max: int = typer.Option(1024, help="Largest K considered."),
    loss_bound: float = typer.Option(None, help="Loss range B_loss for the Bernstein bound (default: observed range)."),
    delta: float = typer.Option(0.05, help="Failure probability of the Bernstein bound."),
    n_boot: int = typer.Option(1000, help="Bootstrap resamples for the intervals (0: none)."),
    seed: int = typer.Option(0, help="Bootstrap seed."),
    json_out: Path = typer.Option(None, "--json", help="Write the report as JSON here (inf as the string \"inf\")."),
    plot: Path = typer.Option(None, "--plot", help="Write the variance-vs-K plot here (.png)."),
) -> None:
    """How many responses per prompt are worth keeping: V_x, V_y|x, K* and the budget law."""
    import json

    from ._tables import MrtInputError
    from .variance import variance_budget

    df = _read_table(inp)
    try:
        rep = variance_budget(
            df, by=by, loss=loss, cost_prompt=cost_prompt, cost_response=cost_response, budget=budget,
            k_max=k_max, loss_bound=loss_bound, delta=delta, n_boot=n_boot, seed=seed,
        )
    except MrtInputError as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from None
    console.print(repr(rep), highlight=False)
    tab = Table(title="predicted variance by K")
    cols = rep.predicted.columns
    for c in cols:
        tab.add_column(c, justify="right")
    for row in rep.predicted.iter_rows():
        tab.add_row(*[f"{v:.4g}" if isinstance(v, float) else str(v) for v in row])
    console.print(tab)
    if json_out is not None:
        json_out.write_text(json.dumps(rep.to_dict(), indent=2))
        console.print(f"wrote {json_out}")
    if plot is not None:
        rep.plot(plot)
        console.print(f"wrote {plot}")


@app.command("nll")
def nll_cmd(
    inp: Path = typer.Argument(..., help="Table with prompt and response text columns."),
    out: Path = typer.Argument(..., help="Output table with the loss column added; format from the suffix."),
    model: str = typer.Option("smollm2", help="'smollm2' (bundled GGUF) or a local Hugging Face model directory."),
    prompt: str = typer.Option("prompt", help="Prompt text column."),
    response: str = typer.Option("response", help="Response text column."),
    loss: str = typer.Option("loss", help="Name of the loss column written."),
    batch_size: int = typer.Option(8, help="Pairs per forward pass."),
    max_length: int = typer.Option(None, help="Trim the start of prompts beyond this many tokens."),
) -> None:
    """Add each response's mean token NLL (prompt masked) under a causal LM."""
    import polars as pl

    from .nll import load_smollm2, response_nll

    df = _read_table(inp)
    for c in (prompt, response):
        if c not in df.columns:
            raise typer.BadParameter(f"column {c!r} not found; the table has {df.columns}")
    if loss in df.columns:
        raise typer.BadParameter(f"the table already has a {loss!r} column")
    if model == "smollm2":
        m, tok = load_smollm2()
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model)
        m = AutoModelForCausalLM.from_pretrained(model)
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token
    vals = response_nll(m, tok, df[prompt].to_list(), df[response].to_list(), batch_size=batch_size, max_length=max_length)
    res = df.with_columns(pl.Series(loss, vals))
    writers = {".parquet": res.write_parquet, ".jsonl": res.write_ndjson, ".csv": res.write_csv}
    if out.suffix not in writers:
        raise typer.BadParameter(f"unsupported output format {out.suffix!r}")
    writers[out.suffix](out)
    console.print(f"wrote {len(res)} rows with {loss!r} to {out}")


if __name__ == "__main__":
    app()
