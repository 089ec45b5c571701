"""The `mrt` command."""

from __future__ import annotations

from mrt_fast.errors import MissingDependencyError

import contextlib
from pathlib import Path
from typing import Optional

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


@contextlib.contextmanager
def _user_errors():
    """Bad input ends the command with one line on stderr and exit code 2."""
    from mrt_fast.errors import MissingDependencyError, MrtInputError

    try:
        yield
    except (MrtInputError, MissingDependencyError, OSError, TypeError) as e:
        msg = (str(e).strip().splitlines() or [type(e).__name__])[0]
        typer.echo(f"error: {msg}", err=True)
        raise typer.Exit(2) from None


def _k_or_column(k: str):
    """--k: an integer, or the name of a column with each pool's K."""
    try:
        return int(k)
    except ValueError:
        return k


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

    with _user_errors():
        run_demo(out_dir, k=k, model=model, max_prompts=max_prompts,
                 cache_dir=False if no_cache else cache_dir, console=console)


@app.command("embed")
def embed_cmd(
    inp: str = typer.Argument(..., help="Input: a file (.parquet, .jsonl/.ndjson, .csv), a directory of Parquet/JSONL "
                              "files (hive partitions included) or a quoted glob such as 'data/*.parquet'."),
    out: Path = typer.Argument(..., help="Output: a directory (no suffix: part-00000.parquet ... + _manifest.json, "
                               "resumable) or a file (.parquet, .jsonl, .csv)."),
    text: str = typer.Option("response", help="Column holding the text to embed."),
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
) -> None:
    """Add unit-norm sentence embeddings of a text column to a table or dataset (resumable to a directory)."""
    import shlex
    import sys

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TimeElapsedColumn
    from rich.text import Text

    from mrt_fast.embeddings.dataset import embed_dataset

    class _TextsPerSecond(ProgressColumn):
        def render(self, task):  # noqa: D401
            v = task.finished_speed or task.speed
            return Text("" if v is None else f"{v:,.0f} texts/s")

    with _user_errors():
        if chunk_rows < 1:
            raise typer.BadParameter("--chunk-rows must be >= 1")
        if processes < 1:
            raise typer.BadParameter("--processes must be >= 1")
        command = " ".join(["mrt", *(shlex.quote(a) for a in sys.argv[1:])])
        with Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                      _TextsPerSecond(), TimeElapsedColumn(), console=console, transient=True) as prog:
            task = prog.add_task("embedding", total=None)

            def on_total(total: int, done: int) -> None:
                prog.reset(task, total=total, completed=done)  # the rate counts this run's texts only

            rep = embed_dataset(
                inp, out, text=text, column=column, model=model, batch_size=batch_size,
                cache_dir=False if no_cache else cache_dir, device=device, processes=processes,
                overwrite_column=overwrite_column, overwrite=overwrite, rows_per_part=chunk_rows,
                progress=lambda k: prog.advance(task, k), on_total=on_total, command=command,
            )
    if rep.already_done:
        console.print(f"{out} is already complete ({rep.parts} part(s), {rep.rows} rows); nothing to do",
                      soft_wrap=True, highlight=False)
        return
    tab = Table(title="mrt embed", show_header=False)
    tab.add_column("")
    tab.add_column("", justify="right")
    for name, v in (("rows", f"{rep.rows:,}"), ("model", str(rep.model_id)), ("computed", f"{rep.computed:,}"),
                    ("from cache", f"{rep.from_cache:,}"), ("parts", f"{rep.parts} ({rep.parts_done_now} by this run)"),
                    ("texts/s", f"{rep.texts_per_second:,.0f}"), ("seconds", f"{rep.seconds:.1f}")):
        tab.add_row(name, v)
    console.print(tab)
    console.print(f"wrote {rep.rows_done_now} rows to {out}" + (" (resumed)" if rep.resumed else ""), soft_wrap=True,
                  highlight=False)


@app.command("embed-quality")
def embed_quality_cmd(
    inp: str = typer.Argument(..., help="Your pools: a file (.parquet, .jsonl/.ndjson, .csv), a directory of "
                              "Parquet/JSONL files or a quoted glob; scanned, a sample of pools is read."),
    model: str = typer.Option("static", help="The embedding to judge: static, int8, a sentence-transformers "
                              "model name or local directory."),
    reference: Optional[str] = typer.Option(None, help="The embedding that chooses and scores as the reference "
                                            "(default: bundled all-MiniLM-L6-v2)."),
    text: str = typer.Option("response", help="Column holding the text."),
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
) -> None:
    """What choosing with a fast embedding costs each selector, on a sample of your own pools."""
    import json

    from mrt_fast.embeddings.quality import compare_embeddings, summarize
    from mrt_fast.errors import MrtInputError
    from mrt_fast.datasets.formats import check_output
    from mrt_fast._util.files import write_text

    with _user_errors():
        try:
            ks = [int(v) for v in k.split(",") if v.strip()]
        except ValueError:
            raise MrtInputError(f"--k must be integers separated by commas, got {k!r}") from None
        if not 0 <= tolerance < 1:
            raise MrtInputError(f"--tolerance must be in [0, 1), got {tolerance}")
        if json_out is not None:
            check_output(json_out, "--json", table=False)
        df = compare_embeddings(inp, model, reference, text=text, by=by, reward=reward, ks=ks, pools=pools,
                                seed=seed, cache_dir=False if no_cache else cache_dir, device=device)
        rows = df.to_dicts()
        verdict = summarize(rows, tolerance)
    ref_name = reference or "MiniLM"
    tab = Table(title=f"{model} vs {ref_name}: {rows[0]['pools']} pools, {rows[0]['texts']} texts, "
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


@app.command("select")
def select_cmd(
    inp: str = typer.Argument(..., help="Input: a file, a directory of Parquet/JSONL files (hive partitions "
                              "included) or a quoted glob such as 'data/*.parquet'."),
    out: Path = typer.Argument(..., help="Output: a directory (no suffix: part-00000.parquet ... + _manifest.json, "
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
    kernel: str = typer.Option("shift", help="shift: (1+c)/2, clip: max(0, c)."),
    n_modes: Optional[int] = typer.Option(None, help="Modes per pool when they are computed (default: silhouette rule)."),
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
    chunk_rows: Optional[int] = typer.Option(None, "--chunk-rows", hidden=True,
                                             help="Candidates per bucket (prefer --memory-limit)."),
    engine: str = typer.Option("local", "--engine", help="local (this machine) or ray (Ray Data: a local "
                               "instance, or the cluster at --ray-address)."),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="Ray cluster to join (e.g. auto, "
                                              "host:6379, ray://host:10001); --engine ray only."),
    parts: Optional[int] = typer.Option(None, "--parts", help="--engine ray: number of buckets/parts "
                                        "(default: from the data and the cluster's CPUs)."),
) -> None:
    """Keep K responses per prompt of a table or dataset, in bounded memory (resumable to a directory)."""
    import shlex
    import sys

    from mrt_fast.datasets.local import select_dataset

    with _user_errors():
        if chunk_rows is not None and chunk_rows < 1:
            raise typer.BadParameter("--chunk-rows must be >= 1")
        _check_engine(engine, ray_address)
        command = " ".join(["mrt", *(shlex.quote(a) for a in sys.argv[1:])])
        k = _k_or_column(k)
        cand_cols = None if candidate_columns is None else [c.strip() for c in candidate_columns.split(",")
                                                            if c.strip()]
        if engine == "ray":
            from mrt_fast.datasets.ray_engine import select_dataset as ray_select_dataset

            rep = ray_select_dataset(
                inp, out, k, method, by=by, embedding=embedding, reward=reward, mode=mode, alpha=alpha, k_max=k_max,
                kernel=kernel, n_modes=n_modes, seed=seed, layout=layout, n_buckets=parts, overwrite=overwrite,
                address=ray_address, command=command, candidate_columns=cand_cols,
            )
        else:
            rep = select_dataset(
                inp, out, k, method, by=by, embedding=embedding, reward=reward, mode=mode, alpha=alpha, k_max=k_max,
                kernel=kernel, n_modes=n_modes, seed=seed, layout=layout, memory_limit=memory_limit, workers=workers,
                candidate_columns=cand_cols, overwrite=overwrite, progress=console, command=command,
                rows_per_bucket=chunk_rows,
            )
    if rep.already_done:
        console.print(f"{out} is already complete ({rep.n_parts} part(s), {rep.n_out_rows} rows); nothing to do",
                      soft_wrap=True, highlight=False)
        return
    tab = Table(title=f"mrt select: {rep.method}, K = {k}", show_header=False)
    tab.add_column("")
    tab.add_column("", justify="right")
    ratio = f"{rep.mean_ratio:.4f}" if rep.mean_ratio is not None else "-"
    buckets = f"{rep.n_parts}" + (" (spilled to disk)" if rep.spilled else " (in memory)")
    if rep.resumed:
        buckets += f", {rep.parts_done_now} done by this run"
    for name, v in (("pools", f"{rep.n_pools:,}"), ("candidates", f"{rep.n_candidates:,}"),
                    ("kept", f"{rep.n_kept:,}"), ("pools <= K (kept whole)", f"{rep.n_small_pools:,}"),
                    ("mean certified ratio", ratio), ("buckets", buckets), ("rows/s", f"{rep.rows_per_second:,.0f}"),
                    ("peak memory", f"{rep.peak_rss / 2**30:.2f} GiB (limit {rep.memory_limit / 2**30:.2f} GiB)"),
                    ("seconds", f"{rep.seconds:.2f}")):
        tab.add_row(name, v)
    console.print(tab)
    for note in rep.notes:
        typer.echo(f"warning: {note}", err=True)
    what = "rows" if rep.layout == "rows" else "prompts"
    console.print(f"wrote {rep.n_out_rows} {what} to {out}" + (" (resumed)" if rep.resumed else ""), soft_wrap=True,
                  highlight=False)


def _check_engine(engine: str, ray_address: Optional[str]) -> None:
    from mrt_fast.errors import MrtInputError

    if engine not in ("local", "ray"):
        raise MrtInputError(f"--engine must be 'local' or 'ray', got {engine!r}")
    if ray_address is not None and engine != "ray":
        raise MrtInputError("--ray-address needs --engine ray")
    if engine == "ray":
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            raise MissingDependencyError("--engine ray needs Ray Data: pip install 'mrt_fast[ray]'")


# ---- variance diagnostics commands ----


@app.command("diagnose")
def diagnose_cmd(
    inp: str = typer.Argument(..., help="Per-response losses: a file (.parquet, .jsonl, .csv), a directory of "
                              "Parquet/JSONL files or a quoted glob; streamed, never read whole."),
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
                                 "allocation, capped by each prompt's number of losses and --k-max)."),
    allocation: Path = typer.Option(None, "--allocation", help="Write the allocation (prompt_id, k, ...) here; "
                                    "feed it to mrt select --k k after a join."),
    engine: str = typer.Option("local", "--engine", help="local (streamed on this machine) or ray (Ray Data)."),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="Ray cluster to join; --engine ray only."),
) -> None:
    """How many responses per prompt are worth keeping: V_x, V_y|x, K* and the budget law."""
    import json

    from mrt_fast.datasets.diagnose import variance_budget_dataset
    from mrt_fast.errors import MrtInputError

    with _user_errors():
        _check_engine(engine, ray_address)
        if allocation is not None and allocate is None:
            raise MrtInputError("--allocation needs --allocate TOTAL")
        if engine == "ray":
            from functools import partial

            from mrt_fast.datasets.ray_engine import variance_budget_dataset as ray_variance_budget_dataset

            variance_budget_dataset = partial(ray_variance_budget_dataset, address=ray_address)  # noqa: F811
        _check_report_outputs(json_out, plot, allocation)
        opts = dict(by=by, loss=loss, cost_prompt=cost_prompt, cost_response=cost_response, budget=budget,
                    k_max=k_max, loss_bound=loss_bound, delta=delta, n_boot=n_boot, seed=seed, bootstrap=bootstrap,
                    interval=interval)
        if allocate is not None:
            # per-prompt K names each prompt: the (id, loss) columns are read into memory
            from mrt_fast.datasets.sources import discover
            from mrt_fast.variance.law import variance_budget

            ds = discover(inp)
            ds.check_columns([(by, "prompt id"), (loss, "loss")])
            rep = variance_budget(ds.scan().select([by, loss]).collect(), **opts)
        else:
            rep = variance_budget_dataset(inp, **opts)
    console.print(repr(rep), highlight=False)
    tab = Table(title="predicted variance by K")
    cols = rep.predicted.columns
    for c in cols:
        tab.add_column(c, justify="right")
    for row in rep.predicted.iter_rows():
        tab.add_row(*[f"{v:.4g}" if isinstance(v, float) else str(v) for v in row])
    console.print(tab)
    from mrt_fast.datasets.formats import write_table
    from mrt_fast._util.files import write_text

    with _user_errors():
        if json_out is not None:
            write_text(json_out, json.dumps(rep.to_dict(), indent=2))
            console.print(f"wrote {json_out}")
        if plot is not None:
            rep.plot(plot)
            console.print(f"wrote {plot}")
        if allocate is not None:
            al = rep.allocate(allocate, k_max=k_max)
            console.print(repr(al), highlight=False)
            if allocation is not None:
                write_table(al.table, allocation)
                console.print(f"wrote {allocation}")


def _check_report_outputs(json_out: Optional[Path], plot: Optional[Path], allocation: Optional[Path]) -> None:
    """diagnose's outputs, checked before any work: a place a file can be written,
    an image format matplotlib writes for --plot, a table format for --allocation."""
    from mrt_fast.errors import MrtInputError
    from mrt_fast.datasets.formats import check_output

    if json_out is not None:
        check_output(json_out, "--json", table=False)
    if plot is not None:
        from mrt_fast.variance.law import PLOT_FORMATS

        if plot.suffix.lower().lstrip(".") not in PLOT_FORMATS:
            raise MrtInputError(f"--plot {str(plot)!r}: unsupported image format {plot.suffix!r} "
                                "(use .png, .pdf or .svg)")
        check_output(plot, "--plot", table=False)
    if allocation is not None:
        check_output(allocation, "--allocation")


@app.command("nll")
def nll_cmd(
    inp: Path = typer.Argument(..., help="Table with prompt and response text columns."),
    out: Path = typer.Argument(..., help="Output table with the loss column added; format from the suffix."),
    model: str = typer.Option("smollm2", help="'smollm2' (bundled GGUF) or a local Hugging Face model directory."),
    prompt: str = typer.Option("prompt", help="Prompt text column."),
    response: str = typer.Option("response", help="Response text column."),
    loss: str = typer.Option("loss", help="Name of the loss column written."),
    batch_size: int = typer.Option(8, help="Pairs per forward pass."),
    max_length: int = typer.Option(None, help="Truncate pairs longer than this many tokens as training does."),
    prompt_format: str = typer.Option("auto", help="auto (chat template when the tokenizer has one) | chat | plain; "
                                      "use the setting training will use."),
) -> None:
    """Add each response's loss l_ij (mean token NLL of response + EOS, prompt masked) under a causal LM."""
    import polars as pl


    from mrt_fast.datasets import formats as _formats
    from mrt_fast.errors import MrtInputError

    with _user_errors():
        if batch_size < 1:
            raise MrtInputError(f"--batch-size must be >= 1, got {batch_size}")
        if max_length is not None and max_length < 1:
            raise MrtInputError(f"--max-length must be >= 1, got {max_length}")
        lf = _input_table(inp, (prompt, response))
        if loss in lf.collect_schema().names():
            raise MrtInputError(f"{str(inp)!r} already has a {loss!r} column", column=loss)
        _formats.check_output(out)
        df = _formats.decode_embedding_columns(_formats.collect(lf, inp))
        for c in (prompt, response):
            if df[c].dtype != pl.Utf8:
                raise MrtInputError(f"column {c!r} must hold text, got {df[c].dtype}", column=c)
            if df[c].null_count():
                row = int(df[c].is_null().arg_true()[0])
                raise MrtInputError(f"column {c!r} is null in row {row}", column=c, row=row)
        with _needs("train"):
            from mrt_fast.llm.nll import load_smollm2, response_nll

            if model == "smollm2":
                m, tok = load_smollm2()
            else:
                if not Path(model).is_dir():
                    raise MrtInputError(f"--model {model!r}: not 'smollm2' and not a local model directory")
                from transformers import AutoModelForCausalLM, AutoTokenizer

                tok = AutoTokenizer.from_pretrained(model)
                m = AutoModelForCausalLM.from_pretrained(model)
                if tok.pad_token_id is None:
                    tok.pad_token = tok.eos_token
        vals = response_nll(m, tok, df[prompt].to_list(), df[response].to_list(),
                            batch_size=batch_size, max_length=max_length, prompt_format=prompt_format)
        res = df.with_columns(pl.Series(loss, vals))
        _formats.write_table(res, out)
    console.print(f"wrote {len(res)} rows with {loss!r} to {out}")


# ---- LLM pipeline commands ----


def _kv_options(pairs: list[str] | None) -> dict:
    """--set key=value pairs (values parsed as YAML scalars/lists)."""
    import yaml

    out = {}
    for item in pairs or []:
        if "=" not in item:
            raise typer.BadParameter(f"--set expects key=value, got {item!r}")
        k, v = item.split("=", 1)
        out[k.strip()] = yaml.safe_load(v)
    return out


@app.command("generate")
def generate_cmd(
    prompts: Path = typer.Argument(..., help="Prompt table (.parquet/.jsonl/.csv) with prompt_id and prompt."),
    out: Path = typer.Argument(..., help="Candidate table to write; shards in OUT.parts/ make the run resumable."),
    model: str = typer.Option(..., "--model", help="Model path, hub id, .gguf file or pkg://package/file."),
    n: int = typer.Option(64, "--n", help="Candidates per prompt."),
    temperature: float = typer.Option(1.0),
    top_p: float = typer.Option(1.0),
    max_new_tokens: int = typer.Option(256),
    seed: int = typer.Option(0),
    backend: str = typer.Option("auto", help="auto | vllm | transformers."),
    shard_prompts: int = typer.Option(64, help="Prompts per shard (unit of resumption)."),
) -> None:
    """Overgenerate N candidate responses per prompt (vLLM on GPU, transformers on CPU); resumable."""
    from mrt_fast.datasets import formats as _formats
    with _user_errors():
        with _needs("train"):
            from mrt_fast.llm.generate import GenerationConfig, generate

            cfg = GenerationConfig(n=n, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
                                   seed=seed, backend=backend, shard_prompts=shard_prompts)
            cfg.validate()
            _input_table(prompts, ("prompt_id", "prompt"), "prompt table")
            _formats.check_output(out)
            parts = out.with_name(out.name + ".parts")
            fresh = not parts.exists()
            try:
                df = generate(str(prompts), out, model, cfg)
            except BaseException:
                if fresh and parts.is_dir() and {f.name for f in parts.iterdir()} <= {"meta.json"}:
                    import shutil

                    shutil.rmtree(parts, ignore_errors=True)  # no shard written: nothing to resume from
                raise
    console.print(f"{df.height} candidates for {df['prompt_id'].n_unique()} prompts -> {out}")


@app.command("score")
def score_cmd(
    inp: Path = typer.Argument(..., help="Candidate table with prompt and response columns."),
    out: Path = typer.Argument(..., help="Output table with a reward column."),
    model: str = typer.Option(..., "--model", help="Sequence-classification reward model (num_labels=1)."),
    batch_size: int = typer.Option(16),
) -> None:
    """Score every (prompt, response) with a reward model."""
    from mrt_fast.datasets import formats as _formats
    from mrt_fast.errors import MrtInputError

    with _user_errors():
        if batch_size < 1:
            raise MrtInputError(f"--batch-size must be >= 1, got {batch_size}")
        lf = _input_table(inp, ("prompt", "response"))
        _formats.check_output(out)
        with _needs("train"):
            from mrt_fast.llm.reward import score

            df = score(_formats.decode_embedding_columns(_formats.collect(lf, inp)), model, batch_size=batch_size)
        _formats.write_table(df, out)
    console.print(f"scored {df.height} rows -> {out}; reward mean {df['reward'].mean():.4f}")


@app.command("train")
def train_cmd(
    data: Path = typer.Argument(..., help="Kept rows: prompt_id, prompt, response."),
    out: Path = typer.Argument(..., help="Output directory (adapter/, train_log.jsonl)."),
    model: str = typer.Option(..., "--model"),
    max_steps: int = typer.Option(200, help="Optimizer steps (the same for every K)."),
    sets: list[str] = typer.Option(None, "--set", help="Any TrainConfig field, key=value (repeatable)."),
) -> None:
    """LoRA fine-tuning on the per-prompt-averaged multi-response loss."""
    from mrt_fast._util import files as _files
    with _user_errors():
        with _needs("train"):
            from mrt_fast.llm.train import TrainConfig, train

            cfg = TrainConfig.from_dict({"max_steps": max_steps, **_kv_options(sets)})
            _input_table(data, ("prompt_id", "prompt", "response"), "training data")
            _files.check_output_dir(out)
            r = train(str(data), model, out, cfg)
    console.print(f"{r.steps} steps over {r.n_pairs} pairs ({r.n_prompts} prompts, {r.epochs:.2f} epochs); "
                  f"final loss {r.log[-1]['loss']:.4f}; adapter -> {r.adapter_dir}")


@app.command("evaluate")
def evaluate_cmd(
    data: Path = typer.Argument(..., help="Held-out prompts: prompt_id, prompt, reference[, tests]."),
    model: str = typer.Option(..., "--model"),
    adapter: Path = typer.Option(None, help="LoRA adapter directory."),
    reward_model: str = typer.Option(None, help="Reward model for best-of-n reward."),
    embedder: str = typer.Option("minilm", help="minilm | hashing | a sentence-transformers path."),
    out: Path = typer.Option(None, help="Write the metrics as JSON here."),
    sets: list[str] = typer.Option(None, "--set", help="Any EvalConfig field, key=value (repeatable)."),
) -> None:
    """Reference loss, coverage, diversity, best-of-n reward and pass@k on held-out prompts."""
    import json

    from mrt_fast.llm.evaluate import EvalConfig, evaluate
    from mrt_fast.embeddings.embedders import make_embedder

    with _user_errors():
        from mrt_fast._util import files as _files
        from mrt_fast.datasets import formats as _formats
        from mrt_fast.errors import MrtInputError

        with _needs("train"):
            cfg = EvalConfig.from_dict(_kv_options(sets))
            _input_table(data, ("prompt_id", "prompt", "reference"), "evaluation data")
            if adapter is not None and not adapter.is_dir():
                raise MrtInputError(f"--adapter {str(adapter)!r} is not a directory")
            if out:
                _formats.check_output(out, "--out", table=False)
            m = evaluate(str(data), model, adapter=adapter, config=cfg,
                         embedder=make_embedder(embedder), reward_model=reward_model)
        if out:
            _files.write_text(out, json.dumps(m, indent=2))
    console.print(m)


@app.command("run")
def run_cmd(
    config: Path = typer.Argument(..., help="Experiment YAML (see docs/pipeline.md)."),
    k: Optional[str] = typer.Option(None, "--k", help="Override select.ks: 'auto' (K from the variance advisor, "
                                    "needs select.cost_prompt and select.cost_response) or a list like '1,2,4'."),
) -> None:
    """Generate -> embed -> score -> select -> train -> evaluate over a method x K grid; writes results."""
    from mrt_fast.llm.pipeline import RunConfig, results_markdown, run

    with _user_errors():
        cfg = RunConfig.from_yaml(config)
        if k is not None:
            cfg.select = {**cfg.select, "ks": k}
        res = run(cfg)
    console.print(results_markdown(res))
    console.print(f"results in {cfg.out_dir}/results.csv, results.md, results.png")


@app.command("export")
def export_cmd(
    kept: Path = typer.Argument(..., help="Kept rows (from mrt select): prompt_id, prompt, response[, weight, reward]."),
    out: Path = typer.Argument(..., help="Training file to write (.jsonl; TRL also .parquet)."),
    fmt: str = typer.Option("trl", "--format", help="trl (prompt/completion + weight) or openrlhf (input/output/reward)."),
    conversational: bool = typer.Option(False, "--conversational", help="TRL: user/assistant message lists."),
    by: str = typer.Option("prompt_id", help="Prompt id column."),
    prompt: str = typer.Option("prompt", help="Prompt text column."),
    response: str = typer.Option("response", help="Response text column."),
    reward: str = typer.Option("reward", help="Reward column (openrlhf), used when present."),
) -> None:
    """Write kept rows as a TRL or OpenRLHF training file."""
    from mrt_fast.llm.export import export

    with _user_errors():
        res = export(kept, out, fmt, conversational=conversational, by=by, prompt=prompt, response=response,
                     reward=reward)
    console.print(f"wrote {res.height} {fmt} rows ({', '.join(res.columns)}) to {out}")


# ---- simulate commands ----
@app.command()
def simulate(
    quick: bool = typer.Option(False, "--quick", help="Small sizes (seconds to a minute); same qualitative checks."),
    out: Path = typer.Option(Path("simulate_out"), "--out", help="Folder for the PNGs and results.json."),
    seed: int = typer.Option(0, help="Seed of every draw and initialisation."),
    threads: int = typer.Option(2, help="torch CPU threads."),
) -> None:
    """Reproduce the paper's controlled experiments (needs the torch extra)."""
    from mrt_fast.errors import MrtInputError
    from mrt_fast._util.files import check_output_dir

    with _user_errors():
        if threads < 1:
            raise MrtInputError(f"--threads must be >= 1, got {threads}")
        if seed < 0:
            raise MrtInputError(f"--seed must be >= 0, got {seed}")
        check_output_dir(out, "--out")
        with _needs("torch"):
            from mrt_fast.simulate import run
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


# ---- checks shared by the commands above ----


def _input_table(path: Path, columns: tuple[str, ...] = (), role: str = "input"):
    """Check an input table before any work: readable, the columns present, at least one row."""
    import polars as pl


    from mrt_fast.datasets import formats as _formats
    from mrt_fast.errors import MrtInputError

    lf = _formats.scan(path)
    names = lf.collect_schema().names()
    missing = [c for c in columns if c not in names]
    if missing:
        raise MrtInputError(f"{role} {str(path)!r}: column(s) {missing} not found; it has columns {names}",
                            column=missing[0])
    if int(_formats.collect(lf.select(pl.len()), path).item()) == 0:
        raise MrtInputError(f"{role} {str(path)!r} has no rows")
    return lf


def _needs(extra: str):
    """An ImportError of an optional stack becomes one line naming the extra."""

    @contextlib.contextmanager
    def guard():
        try:
            yield
        except ImportError as e:
            raise MissingDependencyError(f"this command needs the {extra} extra: pip install 'mrt_fast[{extra}]' ({e})") from None

    return guard()


if __name__ == "__main__":
    app()
