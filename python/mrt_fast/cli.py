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


# ---- simulate commands ----
@app.command()
def simulate(
    quick: bool = typer.Option(False, "--quick", help="Small sizes (seconds to a minute); same qualitative checks."),
    out: Path = typer.Option(Path("simulate_out"), "--out", help="Folder for the PNGs and results.json."),
    seed: int = typer.Option(0, help="Seed of every draw and initialisation."),
    threads: int = typer.Option(2, help="torch CPU threads."),
) -> None:
    """Reproduce the paper's controlled experiments (needs the torch extra)."""
    try:
        from .simulate import run
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise typer.BadParameter(f"`mrt simulate` needs the torch extra: pip install 'mrt_fast[torch]' ({e})")

    with console.status("simulating...") as status:
        res = run(quick=quick, out=out, seed=seed, threads=threads,
                  progress=lambda name: status.update(f"simulating: {name}"))
    tab = Table(title=f"measured vs paper ({'quick' if quick else 'full'} run, {res['total_seconds']:.0f} s)")
    for c in ("quantity", "paper", "measured", "agrees", "note"):
        tab.add_column(c, overflow="fold")
    for r in res["comparison"]:
        tab.add_row(r["quantity"], r["paper"], r["measured"],
                    "[green]yes[/green]" if r["agrees"] else "[red]no[/red]", r["note"])
    console.print(tab)
    console.print(f"figures and results.json in {out}")


if __name__ == "__main__":
    app()
