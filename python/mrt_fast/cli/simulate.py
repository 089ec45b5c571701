"""`mrt simulate`: the paper's controlled experiments."""

from __future__ import annotations

from pathlib import Path

import typer

from mrt_fast.cli.common import (
    table,
    app,
    console,
    needs,
    user_errors,
)


@app.command()
def simulate(
    quick: bool = typer.Option(False, "--quick", help="Small sizes (seconds to a minute); same qualitative checks."),
    out: Path = typer.Option(Path("simulate_out"), "--out", help="Folder for the PNGs and results.json."),
    seed: int = typer.Option(0, help="Seed of every draw and initialisation."),
    threads: int = typer.Option(2, help="torch CPU threads."),
) -> None:
    """Reproduce the paper's controlled experiments (needs the torch extra)."""
    from mrt_fast._util.files import check_output_dir
    from mrt_fast.errors import MrtInputError

    with user_errors():
        if threads < 1:
            raise MrtInputError(f"--threads must be >= 1, got {threads}")
        if seed < 0:
            raise MrtInputError(f"--seed must be >= 0, got {seed}")
        check_output_dir(out, "--out")
        with needs("torch"):
            from mrt_fast.simulate import run
        with console.status("simulating...") as status:
            res = run(quick=quick, out=out, seed=seed, threads=threads,
                      progress=lambda name: status.update(f"simulating: {name}"))
    tab = table(title=f"measured vs paper ({'quick' if quick else 'full'} run, {res['total_seconds']:.0f} s)")
    for c in ("quantity", "paper", "measured", "agrees", "note"):
        tab.add_column(c, overflow="fold")
    for r in res["comparison"]:
        tab.add_row(r["quantity"], r["paper"], r["measured"],
                    "[green]yes[/green]" if r["agrees"] else "[red]no[/red]", r["note"])
    console.print(tab)
    console.print(f"figures and results.json in {out}")
