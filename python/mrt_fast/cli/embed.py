"""`mrt embed` and `mrt embed-quality`: embeddings of a text column, and what a fast tier costs."""

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
    print_report,
    RESPONSE_HELP,
    response_column,
    user_errors,
    warn_notes,
)


@app.command("embed")
def embed_cmd(
    inp: str = typer.Argument(..., metavar="INPUT", help="Input: a file (.parquet, .jsonl/.ndjson, .csv), a directory of Parquet/JSONL "
                              "files (hive partitions included) or a quoted glob such as 'data/*.parquet'."),
    out: str = typer.Argument(..., metavar="OUTPUT", help="Output: a directory (no suffix: part-00000.parquet ... + the .mrt/ manifest, "
                               "resumable) or a file (.parquet, .jsonl, .csv)."),
    text: Optional[str] = typer.Option(None, "--text", "--response-column",
                                       help="Column holding the text to embed. " + RESPONSE_HELP),
    column: str = typer.Option("embedding", help="Name of the embedding column written."),
    overwrite_column: bool = typer.Option(False, "--overwrite-column",
                                          help="Allow the embedding to replace an existing column of that name."),
    model: Optional[str] = typer.Option(None, help="static (fast CPU tier distilled from MiniLM on first use), "
                                        "int8 (MiniLM quantized, on onnxruntime), a sentence-transformers model name or local directory "
                                        "(default: bundled all-MiniLM-L6-v2, offline)."),
    device: str = typer.Option("auto", help="auto (CUDA when present) | cpu | cuda."),
    processes: int = typer.Option(1, help="CPU worker processes for a transformer model."),
    batch_size: int = typer.Option(64, help="Texts per model batch."),
    cache_dir: Optional[Path] = typer.Option(None, help="Embedding cache directory (default: $MRT_CACHE_DIR or ~/.cache/mrt_fast)."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Do not read or write the embedding cache."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an output directory of another job "
                                   "(deletes only the files a job wrote)."),
    chunk_rows: int = typer.Option(100_000, "--chunk-rows", help="Rows read and embedded per part."),
    engine: str = typer.Option("local", "--engine", help="local (this machine) or ray (a Ray cluster: each "
                               "worker loads the model once and embeds whole parts)."),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="--engine ray: the cluster to join "
                                              "(default: start or join a local one)."),
    workers: Optional[int] = typer.Option(None, "--workers", help="--engine ray: model workers (default: the "
                                          "cluster's CPUs)."),
    allow_partial: bool = ALLOW_PARTIAL,
    empty_text: str = typer.Option("refuse", "--empty-text", help="What an empty, whitespace-only or null text "
                                   "gets: refuse (stop before the model loads, naming its row and candidate), "
                                   "skip (leave its candidate out, counted) or keep (a null embedding that "
                                   "mrt select leaves out, counted)."),
) -> None:
    """Add unit-norm sentence embeddings of a text column to a table or dataset (resumable to a directory)."""
    import shlex
    import sys

    from mrt_fast.embeddings.dataset import embed_dataset

    with user_errors(resumable=True):
        if chunk_rows < 1:
            raise typer.BadParameter("--chunk-rows must be >= 1")
        if processes < 1:
            raise typer.BadParameter("--processes must be >= 1")
        check_engine(engine, ray_address, local_only={"--processes": processes if processes != 1 else None},
                     ray_only={"--workers": workers})
        command = " ".join(["mrt", *(shlex.quote(a) for a in sys.argv[1:])])
        text = response_column(inp, text, "--text", allow_partial)
        from mrt_fast.datasets.overlap import check_apart

        check_apart([("--model", model)], [("output", out)])
        rep = embed_dataset(
            inp, out, text=text, column=column, model=model, batch_size=batch_size,
            cache_dir=False if no_cache else cache_dir, device=device, processes=processes,
            overwrite_column=overwrite_column, overwrite=overwrite, rows_per_part=chunk_rows,
            progress=True, command=command, engine=engine, ray_address=ray_address, workers=workers,
            allow_partial=allow_partial,
            empty_text=empty_text,
        )
    warn_notes(rep.notes)
    print_report(rep, "mrt embed", f"wrote {rep.rows_done_now} {rep.unit} to {out}")


@app.command("embed-quality")
def embed_quality_cmd(
    inp: str = typer.Argument(..., metavar="INPUT", help="Your pools: a file (.parquet, .jsonl/.ndjson, .csv), a directory of "
                              "Parquet/JSONL files or a quoted glob; scanned, a sample of pools is read."),
    model: str = typer.Option("static", help="The embedding to judge: static, int8, a sentence-transformers "
                              "model name or local directory."),
    reference: Optional[str] = typer.Option(None, help="The embedding that chooses and scores as the reference "
                                            "(default: bundled all-MiniLM-L6-v2)."),
    text: Optional[str] = typer.Option(None, "--text", "--response-column", help=RESPONSE_HELP),
    by: str = typer.Option("prompt_id", help="Prompt id column: one pool per value."),
    reward: str = typer.Option("reward", help="Reward column, for top and grades (left out when absent)."),
    k: str = typer.Option("2,4", "--k", help="K values to compare at, comma separated."),
    pools: int = typer.Option(200, help="Pools in the sample (chosen by a seeded hash of the prompt id)."),
    seed: int = typer.Option(0, help="Seed of the sample."),
    tolerance: float = typer.Option(0.02, help="Coverage loss accepted, as a fraction of the reference's."),
    device: str = typer.Option("auto", help="auto (CUDA when present) | cpu | cuda."),
    cache_dir: Optional[Path] = typer.Option(None, help="Embedding cache directory (default: $MRT_CACHE_DIR or ~/.cache/mrt_fast)."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Do not read or write the embedding cache."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write the rows and the verdict as JSON here."),
    allow_partial: bool = ALLOW_PARTIAL,
) -> None:
    """What choosing with a fast embedding costs each selector, on a sample of your own pools."""
    import json

    from mrt_fast._util.files import write_text
    from mrt_fast.datasets.formats import check_output
    from mrt_fast.datasets.overlap import check_apart
    from mrt_fast.embeddings.quality import compare_embeddings, summarize
    from mrt_fast.errors import MrtInputError

    with user_errors():
        try:
            ks = [int(v) for v in k.split(",") if v.strip()]
        except ValueError:
            raise MrtInputError(f"--k must be integers separated by commas, got {k!r}") from None
        if not 0 <= tolerance < 1:
            raise MrtInputError(f"--tolerance must be in [0, 1), got {tolerance}")
        if json_out is not None:
            check_output(json_out, "--json", table=False)
        check_apart([("input", inp), ("--model", model), ("--reference", reference)], [("--json", json_out)])
        text = response_column(inp, text, "--text", allow_partial)
        df = compare_embeddings(inp, model, reference, text=text, by=by, reward=reward, ks=ks, pools=pools,
                                seed=seed, cache_dir=False if no_cache else cache_dir, device=device,
                                allow_partial=allow_partial)
        rows = df.to_dicts()
        verdict = summarize(rows, tolerance)
    ref_name = reference or "MiniLM"
    tab = table(title=f"{model} vs {ref_name}: {rows[0]['pools']} pools, {rows[0]['texts']} texts, "
                f"coverage scored by {ref_name}")
    for c in ("K", "selector", f"coverage, {ref_name} picks", f"coverage, {model} picks", "gap", "gap 95% CI"):
        tab.add_column(c, justify="left" if c == "selector" else "right")
    for r in rows:
        lo, hi = r["coverage_gap_ci95"]
        tab.add_row(str(r["k"]), r["selector"], f"{r['coverage_reference']:.4f}", f"{r['coverage_tier']:.4f}",
                    f"{100 * r['coverage_gap']:+.2f}%", f"[{100 * lo:+.2f}, {100 * hi:+.2f}]")
    console.print(tab)
    for kk in ks:
        r = next(x for x in rows if x["k"] == kk)
        rev = r["separated_pairs_reversed"]
        console.print(f"K = {kk}: ranking {r['ranking_reference']} ({ref_name}), {r['ranking_tier']} ({model}); "
                      f"{len(rev)} of {len(r['pairs_separated_by_reference'])} pairs that {ref_name} separates "
                      f"reversed" + (f": {', '.join(rev)}" if rev else ""), soft_wrap=True, highlight=False)
    worst = min(rows, key=lambda x: x["coverage_gap"])
    console.print(f"worst gap {100 * worst['coverage_gap']:+.2f}% ({worst['selector']}, K = {worst['k']}); "
                  f"every gap within {100 * tolerance:g}%: {'yes' if verdict['within_tolerance_everywhere'] else 'no'}",
                  soft_wrap=True, highlight=False)
    if json_out is not None:
        write_text(json_out, json.dumps({"rows": rows, "verdict": verdict}, indent=1) + "\n")
        console.print(f"wrote {json_out}", soft_wrap=True, highlight=False)
