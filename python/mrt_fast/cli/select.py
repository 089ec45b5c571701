"""`mrt select`: keep K responses per prompt of a file, directory or glob."""

from __future__ import annotations

from typing import Optional

import typer

from mrt_fast.cli.common import (
    ALLOW_PARTIAL,
    app,
    check_engine,
    k_or_column,
    print_lines,
    print_report,
    seconds_since_start,
    user_errors,
    warn_notes,
)
from mrt_fast._util.kernels import DEFAULT_KERNEL


@app.command("select")
def select_cmd(
    inp: str = typer.Argument(..., metavar="INPUT", help="Input: a file, a directory of Parquet/JSONL files (hive partitions "
                              "included) or a quoted glob such as 'data/*.parquet'."),
    out: str = typer.Argument(..., metavar="OUTPUT", help="Output: a directory (no suffix: part-00000.parquet ... + the .mrt/ manifest, "
                               "resumable) or a file (.parquet, .jsonl, .csv)."),
    k: str = typer.Option(..., "--k", help="Responses kept per prompt, or the name of an integer column holding "
                          "each prompt's K (e.g. from mrt diagnose --allocate)."),
    method: str = typer.Option("grades", help="random | top | diverse | grades | stratified (or rkon/bkon/dkon/dbkon)."),
    by: str = typer.Option("prompt_id", help="Prompt id column."),
    embedding: str = typer.Option("embedding", help="Embedding column (diverse, grades; stratified without modes)."),
    reward: str = typer.Option("reward", help="Reward column (top, grades)."),
    mode: str = typer.Option("mode", help="Mode column (stratified); computed by k-means when absent."),
    alpha: float = typer.Option(0.75, help="Quality exponent (grades)."),
    k_max: Optional[int] = typer.Option(None, help="Prefilter: keep only the best K_MAX by reward as ground set (grades)."),
    kernel: str = typer.Option(DEFAULT_KERNEL, help="How a cosine c becomes a similarity (diverse, grades): "
                               "clip: max(0, c); shift: (1+c)/2, the paper's code."),
    n_modes: Optional[int] = typer.Option(None, help="Modes per pool when they are computed (default: silhouette rule)."),
    max_mode_cosine: Optional[float] = typer.Option(
        None, "--max-mode-cosine", help="Computed modes whose directions are at a cosine above this are merged "
        "(default 0.8; 1: none)."),
    seed: int = typer.Option(0, help="Seed of random draws and k-means."),
    layout: str = typer.Option("auto", help="rows (one row per candidate), grouped (one row per prompt, list "
                               "columns) or auto (grouped when the embedding/reward columns hold lists)."),
    candidate_columns: Optional[str] = typer.Option(
        None, "--candidate-columns", help="Grouped layout: the list columns holding one value per candidate, "
        "comma separated (default: every list column)."),
    memory_limit: Optional[str] = typer.Option(None, "--memory-limit",
                                               help="Peak memory, e.g. 2GB or 512MiB (default: half the available)."),
    workers: Optional[int] = typer.Option(None, help="Buckets selected at once (default: as memory and cores allow)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an output directory of another job "
                                   "(deletes only the files a job wrote)."),
    chunk_rows: Optional[int] = typer.Option(None, "--chunk-rows", help="Input rows per part, instead of parts "
                                             "planned from the memory limit (both engines)."),
    engine: str = typer.Option("local", "--engine", help="local (this machine) or ray (Ray Data: a local "
                               "instance, or the cluster at --ray-address)."),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="Ray cluster to join (e.g. auto, "
                                              "host:6379, ray://host:10001); --engine ray only."),
    parts: Optional[int] = typer.Option(None, "--parts", help="Number of parts (buckets of pools, or runs of "
                                        "consecutive pools read in place), both engines "
                                        "(default: local from --memory-limit, ray from the data and the CPUs)."),
    eps: float = typer.Option(1e-6, help="Quality floor eps of GRADES weights."),
    candidate_key: Optional[str] = typer.Option(None, "--candidate-key", help="Column ordering each pool's "
                                                "candidates (results then independent of row order)."),
    optimizer: str = typer.Option("lazy", help="lazy | naive greedy (same picks)."),
    text: Optional[str] = typer.Option(None, "--text", help="Text column: rows with the same text are duplicates; "
                                       "the text joins the content key."),
    dedup: Optional[float] = typer.Option(None, "--dedup", help="Remove near-duplicates (cosine >= DEDUP with a "
                                          "better candidate) inside each pool before selection."),
    allow_partial: bool = ALLOW_PARTIAL,
    profile: bool = typer.Option(False, "--profile", help="Also print where the time went: the process's start, "
                                 "then each step's wall and CPU seconds (plan, read or spill, select, write)."),
) -> None:
    """Keep K responses per prompt of a table or dataset, in bounded memory (resumable to a directory)."""
    import shlex
    import sys

    from mrt_fast.datasets.select_job import select_dataset
    from mrt_fast.selection.options import SelectOptions

    with user_errors(resumable=True):
        check_engine(engine, ray_address, {"--memory-limit": memory_limit, "--workers": workers},
                     parts={"--parts": parts, "--chunk-rows": chunk_rows})
        command = " ".join(["mrt", *(shlex.quote(a) for a in sys.argv[1:])])
        cand_cols = None if candidate_columns is None else [c.strip() for c in candidate_columns.split(",")
                                                            if c.strip()]
        opts = SelectOptions(k=k_or_column(k), method=method, by=by, embedding=embedding, reward=reward, mode=mode,
                             alpha=alpha, eps=eps, k_max=k_max, kernel=kernel, seed=seed,
                             candidate_key=candidate_key, optimizer=optimizer, n_modes=n_modes, layout=layout,
                             candidate_columns=cand_cols, text=text, dedup=dedup,
                             **({} if max_mode_cosine is None else {"max_mode_cosine": max_mode_cosine}))
        started = seconds_since_start()
        rep = select_dataset(inp, out, options=opts, engine=engine, memory_limit=memory_limit, workers=workers,
                             parts=parts, rows_per_part=chunk_rows, overwrite=overwrite, ray_address=ray_address,
                             progress=True, command=command, allow_partial=allow_partial)
    warn_notes(rep.notes)
    print_report(rep, f"mrt select: {rep.method}, K = {k}" + (" (this run)" if rep.resumed else ""),
                 f"wrote {rep.rows_out} {rep.unit} to {out}", rep.lines()[1:])  # the title names the method
    if profile:
        start = [] if started is None else [("start (interpreter, imports, arguments)", f"{started:.3f} s wall")]
        print_lines("where the time went", start + rep.profile_lines())
