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
    from .generate import GenerationConfig, generate

    cfg = GenerationConfig(n=n, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, seed=seed,
                           backend=backend, shard_prompts=shard_prompts)
    df = generate(str(prompts), out, model, cfg)
    console.print(f"{df.height} candidates for {df['prompt_id'].n_unique()} prompts -> {out}")


@app.command("score")
def score_cmd(
    inp: Path = typer.Argument(..., help="Candidate table with prompt and response columns."),
    out: Path = typer.Argument(..., help="Output table with a reward column."),
    model: str = typer.Option(..., "--model", help="Sequence-classification reward model (num_labels=1)."),
    batch_size: int = typer.Option(16),
) -> None:
    """Score every (prompt, response) with a reward model."""
    from ._llm import write_table
    from .reward import score

    df = score(str(inp), model, batch_size=batch_size)
    write_table(df, out)
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
    from .train import TrainConfig, train

    cfg = TrainConfig.from_dict({"max_steps": max_steps, **_kv_options(sets)})
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

    from .evaluate import EvalConfig, evaluate
    from .pipeline import make_embedder

    m = evaluate(str(data), model, adapter=adapter, config=EvalConfig.from_dict(_kv_options(sets)),
                 embedder=make_embedder(embedder), reward_model=reward_model)
    if out:
        out.write_text(json.dumps(m, indent=2))
    console.print(m)


@app.command("run")
def run_cmd(
    config: Path = typer.Argument(..., help="Experiment YAML (see docs)."),
) -> None:
    """Generate -> embed -> score -> select -> train -> evaluate over a method x K grid; writes results."""
    from .pipeline import RunConfig, results_markdown, run

    cfg = RunConfig.from_yaml(config)
    res = run(cfg)
    console.print(results_markdown(res))
    console.print(f"results in {cfg.out_dir}/results.csv, results.md, results.png")


if __name__ == "__main__":
    app()
