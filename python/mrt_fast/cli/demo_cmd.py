"""`mrt demo`: every selector on the bundled MOSAIC examples."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from mrt_fast.cli.common import (
    app,
    console,
    user_errors,
)


@app.command()
def demo(
    out_dir: Path = typer.Option(Path("mrt_demo_out"), "--out-dir", help="Where the plot and kept rows are written."),
    k: int = typer.Option(2, "--k", help="Responses kept per prompt."),
    model: Optional[str] = typer.Option(None, help="Embedding model (default: bundled all-MiniLM-L6-v2)."),
    max_prompts: Optional[int] = typer.Option(None, help="Use only the first N example prompts."),
    cache_dir: Optional[Path] = typer.Option(None, help="Embedding cache directory (default: the user cache)."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Do not read or write the embedding cache."),
) -> None:
    """Embed the bundled MOSAIC examples, run every selector, show what each kept and why."""
    from mrt_fast.cli.demo import run_demo

    with user_errors():
        run_demo(out_dir, k=k, model=model, max_prompts=max_prompts,
                 cache_dir=False if no_cache else cache_dir, console=console)
