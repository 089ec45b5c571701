"""The LLM pipeline commands: nll, generate, score, train, evaluate, run, export."""

from __future__ import annotations

import os

from pathlib import Path
from typing import Optional

import typer

from mrt_fast.cli.common import (
    ALLOW_PARTIAL,
    app,
    check_engine,
    check_input_table,
    check_job_output,
    check_text_columns,
    console,
    kv_options,
    needs,
    print_report,
    RESPONSE_HELP,
    response_column,
    user_errors,
    warn_notes,
)


# the options nll and score share: the job's parts and the engine that runs them
ROWS_PER_PART = typer.Option(50_000, "--rows-per-part", help="Directory output: input rows per part.")
OVERWRITE = typer.Option(False, "--overwrite", help="Replace an output an earlier mrt job wrote.")
MODEL_ENGINE = typer.Option("local", "--engine", help="local (this machine) or ray (a Ray cluster: each "
                            "worker loads the model once and does whole parts).")
RAY_ADDRESS = typer.Option(None, "--ray-address", help="--engine ray: the cluster to join (default: start or "
                           "join a local one).")
MODEL_WORKERS = typer.Option(None, "--workers", help="--engine ray: model workers (default: the cluster's CPUs).")


def check_text_stage(inp, out, texts: tuple, new_column: str, batch_size: int, engine: str,
                     ray_address, workers, allow_partial: bool = False) -> None:
    """The checks nll and score make before a model loads: their numbers and engine flags, the
    input's text columns, no column of the name they add, and the output."""
    from mrt_fast.errors import MrtInputError

    if batch_size < 1:
        raise MrtInputError(f"--batch-size must be >= 1, got {batch_size}")
    check_engine(engine, ray_address, ray_only={"--workers": workers})
    if workers is not None and workers < 1:
        raise MrtInputError(f"--workers must be >= 1, got {workers}")
    lf = check_input_table(inp, texts, dataset=True, allow_partial=allow_partial)
    if new_column in lf.collect_schema().names():
        raise MrtInputError(f"{str(inp)!r} already has a {new_column!r} column", column=new_column)
    check_text_columns(lf, inp, texts)
    check_job_output(out)

@app.command("nll")
def nll_cmd(
    inp: str = typer.Argument(..., metavar="INPUT", help="Table with prompt and response text columns: a file, a directory "
                               "(an mrt output included) or a quoted glob."),
    out: str = typer.Argument(..., metavar="OUTPUT", help="Output table with the loss column added; format from the suffix."),
    model: str = typer.Option("smollm2", help="'smollm2' (bundled GGUF) or a local Hugging Face model directory."),
    prompt: str = typer.Option("prompt", help="Prompt text column."),
    response: Optional[str] = typer.Option(None, "--response", "--response-column", help=RESPONSE_HELP),
    loss: str = typer.Option("loss", help="Name of the loss column written."),
    batch_size: int = typer.Option(8, help="Pairs per forward pass."),
    max_length: int = typer.Option(None, help="Truncate pairs longer than this many tokens as training does."),
    prompt_format: str = typer.Option("auto", help="auto (chat template when the tokenizer has one) | chat | plain; "
                                      "use the setting training will use."),
    device: str = typer.Option("auto", help="auto (CUDA when present) | cpu | cuda[:N] | mps."),
    warm_pilot: str = typer.Option("none", "--warm-pilot", help="none | chat (score in the chat template) | lora "
                                   "(score after a short LoRA warm-up on --warm-data)."),
    warm_steps: int = typer.Option(16, "--warm-steps", help="--warm-pilot lora: optimizer steps of the warm-up."),
    warm_data: Optional[str] = typer.Option(None, "--warm-data", help="--warm-pilot lora: a prompt/response table "
                                            "of the task, none of whose prompts is scored."),
    rows_per_part: int = ROWS_PER_PART,
    overwrite: bool = OVERWRITE,
    engine: str = MODEL_ENGINE,
    ray_address: Optional[str] = RAY_ADDRESS,
    workers: Optional[int] = MODEL_WORKERS,
    allow_partial: bool = ALLOW_PARTIAL,
) -> None:
    """Add each response's loss l_ij (mean token NLL of response + EOS, prompt masked) under a causal LM.

    OUTPUT with a suffix is one file; without, a resumable directory of parts. Either layout."""
    from mrt_fast.errors import MrtInputError

    with user_errors(resumable=True):
        if max_length is not None and max_length < 1:
            raise MrtInputError(f"--max-length must be >= 1, got {max_length}")
        response = response_column(inp, response, "--response", allow_partial)
        check_text_stage(inp, out, (prompt, response), loss, batch_size, engine, ray_address, workers,
                         allow_partial)
        if model != "smollm2" and not Path(model).is_dir():
            raise MrtInputError(f"--model {model!r}: not 'smollm2' and not a local model directory")
        from mrt_fast.datasets.overlap import check_apart

        check_apart([("--warm-data", warm_data), ("--model", None if model == "smollm2" else model)],
                    [("output", out)])
        with needs("train"):
            from mrt_fast._util.device import resolve_device
            from mrt_fast.llm.dataset_stages import nll_dataset
            from mrt_fast.llm.models import load_causal_lm, load_tokenizer
            from mrt_fast.llm.nll import smollm2_gguf_path

            from mrt_fast.llm.warm_pilot import warm_up_for_dataset

            dev = resolve_device(device)
            spec = os.path.join(*smollm2_gguf_path()) if model == "smollm2" else model
            with warm_up_for_dataset(spec, warm_pilot, inp, warm_data=warm_data, steps=warm_steps, prompt=prompt,
                                     response=response, prompt_format=prompt_format, device=dev,
                                     engine=engine) as warm:

                def loader():  # float32 on every device: the losses feed the variance law
                    return (load_causal_lm(spec, device=dev, dtype="float32", adapter=warm.adapter),
                            load_tokenizer(spec))

                loader.model_id = model if warm.mode == "none" else f"{model} (warm pilot {warm.tag})"
                rep = nll_dataset(inp, out, loader=loader, prompt=prompt, response=response, loss=loss,
                                  batch_size=batch_size, max_length=max_length, prompt_format=warm.prompt_format,
                                  device=dev, rows_per_part=rows_per_part, overwrite=overwrite, progress=True,
                                  engine=engine, ray_address=ray_address, workers=workers,
                                  allow_partial=allow_partial)
    print_report(rep, "mrt nll", f"{loss!r} written to {out}")
    warn_notes(rep.notes)


@app.command("generate")
def generate_cmd(
    prompts: Path = typer.Argument(..., metavar="PROMPTS", help="Prompt table (.parquet/.jsonl/.csv) with prompt_id and prompt."),
    out: Path = typer.Argument(..., metavar="OUTPUT", help="Candidate table to write; shards in OUT.parts/ make the run resumable."),
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
    from mrt_fast._util import files as _files
    from mrt_fast.datasets import formats as _formats
    with user_errors(resumable=True):
        with needs("train"):
            from mrt_fast.llm.generate import GenerationConfig, generate

            cfg = GenerationConfig(n=n, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
                                   seed=seed, backend=backend, shard_prompts=shard_prompts)
            cfg.validate()
            check_input_table(prompts, ("prompt_id", "prompt"), "prompt table")
            _formats.check_output(out)
            parts = out.with_name(out.name + ".parts")
            from mrt_fast.datasets.overlap import check_apart

            check_apart([("prompt table", prompts), ("--model", model)], [("output", out), ("shard folder", parts)])
            fresh = not parts.exists()
            with _files.parents_made(out):  # removed again if the run leaves nothing in them
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
    inp: str = typer.Argument(..., metavar="INPUT", help="Candidate table with prompt and response columns: a file, a "
                               "directory (an mrt output included) or a quoted glob."),
    out: str = typer.Argument(..., metavar="OUTPUT", help="Output with a reward column: a file, or a resumable directory."),
    model: str = typer.Option(..., "--model", help="Sequence-classification reward model (num_labels=1)."),
    batch_size: int = typer.Option(16),
    prompt: str = typer.Option("prompt", help="Prompt text column."),
    response: Optional[str] = typer.Option(None, "--response", "--response-column", help=RESPONSE_HELP),
    column: str = typer.Option("reward", help="Name of the reward column written."),
    device: str = typer.Option("auto", help="auto (CUDA when present) | cpu | cuda[:N] | mps."),
    rows_per_part: int = ROWS_PER_PART,
    overwrite: bool = OVERWRITE,
    engine: str = MODEL_ENGINE,
    ray_address: Optional[str] = RAY_ADDRESS,
    workers: Optional[int] = MODEL_WORKERS,
    allow_partial: bool = ALLOW_PARTIAL,
) -> None:
    """Score every (prompt, response) with a reward model; either layout, resumable to a directory."""

    with user_errors(resumable=True):
        response = response_column(inp, response, "--response", allow_partial)
        check_text_stage(inp, out, (prompt, response), column, batch_size, engine, ray_address, workers,
                         allow_partial)
        from mrt_fast.datasets.overlap import check_apart

        check_apart([("--model", model)], [("output", out)])
        with needs("train"):
            from mrt_fast._util.device import resolve_device
            from mrt_fast.llm.dataset_stages import score_dataset

            rep = score_dataset(inp, out, model, prompt=prompt, response=response, column=column,
                                batch_size=batch_size, device=resolve_device(device), rows_per_part=rows_per_part,
                                overwrite=overwrite, progress=True, engine=engine, ray_address=ray_address,
                                workers=workers, allow_partial=allow_partial)
    print_report(rep, "mrt score", f"{column!r} written to {out}")
    warn_notes(rep.notes)


@app.command("train")
def train_cmd(
    data: Path = typer.Argument(..., metavar="DATA", help="Kept rows: prompt_id, prompt, response (or a row a "
                                "prompt with a responses list)."),
    out: Path = typer.Argument(..., metavar="OUTPUT", help="Output directory (adapter/, train_log.jsonl)."),
    model: str = typer.Option(..., "--model"),
    max_steps: int = typer.Option(200, help="Optimizer steps (the same for every K)."),
    response: Optional[str] = typer.Option(None, "--response", "--response-column", help=RESPONSE_HELP),
    sets: list[str] = typer.Option(None, "--set", help="Any TrainConfig field, key=value (repeatable)."),
) -> None:
    """LoRA fine-tuning on the per-prompt-averaged multi-response loss."""
    from mrt_fast._util import files as _files
    with user_errors(resumable=True):
        with needs("train"):
            from mrt_fast.llm.train import TrainConfig, train

            cfg = TrainConfig.from_dict({"max_steps": max_steps, **kv_options(sets)})
            check_input_table(data, ("prompt_id", "prompt"), "training data")  # one file
            response = response_column(data, response, "--response")
            check_input_table(data, ("prompt_id", "prompt", response), "training data")
            _files.check_output_dir(out)
            from mrt_fast.datasets.overlap import check_apart

            check_apart([("training data", data), ("--model", model)], [("output directory", out)])
            r = train(str(data), model, out, cfg, response=response)
    console.print(f"{r.steps} steps over {r.n_pairs} pairs ({r.n_prompts} prompts, {r.epochs:.2f} epochs); "
                  f"final loss {r.log[-1]['loss']:.4f}; adapter -> {r.adapter_dir}")


@app.command("evaluate")
def evaluate_cmd(
    data: Path = typer.Argument(..., metavar="DATA", help="Held-out prompts: prompt_id, prompt, reference[, tests]."),
    model: str = typer.Option(..., "--model"),
    adapter: Path = typer.Option(None, help="LoRA adapter directory."),
    reward_model: str = typer.Option(None, help="Reward model for best-of-n reward."),
    embedder: str = typer.Option("minilm", help="minilm | hashing | a sentence-transformers path."),
    out: Path = typer.Option(None, help="Write the metrics as JSON here."),
    sets: list[str] = typer.Option(None, "--set", help="Any EvalConfig field, key=value (repeatable)."),
) -> None:
    """Reference loss, coverage, diversity, best-of-n reward and pass@k on held-out prompts."""
    import json

    from mrt_fast.embeddings.embedders import make_embedder
    from mrt_fast.llm.evaluate import EvalConfig, evaluate

    with user_errors():
        from mrt_fast._util import files as _files
        from mrt_fast.datasets import formats as _formats
        from mrt_fast.errors import MrtInputError

        with needs("train"):
            cfg = EvalConfig.from_dict(kv_options(sets))
            check_input_table(data, ("prompt_id", "prompt", "reference"), "evaluation data")
            if adapter is not None and not adapter.is_dir():
                raise MrtInputError(f"--adapter {str(adapter)!r} is not a directory")
            if out:
                _formats.check_output(out, "--out", table=False)
                from mrt_fast.datasets.overlap import check_apart

                check_apart([("evaluation data", data), ("--model", model), ("--adapter", adapter),
                             ("--reward-model", reward_model)], [("--out", out)])
            m = evaluate(str(data), model, adapter=adapter, config=cfg,
                         embedder=make_embedder(embedder), reward_model=reward_model)
        if out:
            _files.write_text(out, json.dumps(m, indent=2))
    console.print(m)


@app.command("run")
def run_cmd(
    config: Path = typer.Argument(..., metavar="CONFIG", help="Experiment YAML (see docs/guides/pipeline.md)."),
    k: Optional[str] = typer.Option(None, "--k", help="Override select.ks: 'auto' (K from the variance advisor, "
                                    "needs select.cost_prompt and select.cost_response) or a list like '1,2,4'."),
    sets: Optional[list[str]] = typer.Option(None, "--set", help="Override a config value: key=value with a dotted "
                                             "key (--set train.max_steps=2 --set generate.n=4); repeatable."),
    out_dir: Optional[Path] = typer.Option(None, "--out-dir", help="Override out_dir (relative to the current "
                                           "directory)."),
    redo_changed: bool = typer.Option(False, "--redo-changed", help="Outputs in out_dir made with other settings "
                                      "(or without a record of them) are deleted with what was made from them, "
                                      "and made again; without it such an out_dir is refused."),
    engine: str = typer.Option("local", "--engine", help="Where the embed, score and select stages run: local "
                               "(this machine) or ray (the current Ray cluster, or a new local instance); the "
                               "outputs are the same."),
) -> None:
    """Generate -> embed -> score -> select -> train -> evaluate over a method x K grid; writes results.

    Relative paths in the config are relative to the YAML file. Outputs already in out_dir are reused
    when they were made with the same settings."""
    from mrt_fast.llm.pipeline import RunConfig, results_markdown, run

    with user_errors(resumable=True):
        overrides = kv_options(sets)
        if out_dir is not None:
            overrides["out_dir"] = str(out_dir)
        cfg = RunConfig.from_yaml(config, overrides)
        if k is not None:
            cfg.select = {**cfg.select, "ks": k}
        res = run(cfg, redo_changed=redo_changed, engine=engine)
    console.print(results_markdown(res), markup=False, highlight=False)
    console.print(f"results in {cfg.out_dir}/results.csv, results.md, results.png", markup=False, highlight=False)


@app.command("export")
def export_cmd(
    kept: str = typer.Argument(..., metavar="KEPT", help="Kept rows (from mrt select: a file, a dataset "
                               "directory, a quoted glob or s3://): prompt_id, prompt, response[, weight, reward]."),
    out: str = typer.Argument(..., metavar="OUTPUT", help="Training file to write (.jsonl; TRL also .parquet), a "
                              "local path."),
    fmt: str = typer.Option("trl", "--format", help="trl (prompt/completion + weight), openrlhf (input/output/reward), "
                            "dpo (prompt/chosen/rejected pairs from the rewards), kto (prompt/completion/label) "
                            "or listwise (one row a prompt: completions best first, rewards)."),
    conversational: Optional[bool] = typer.Option(
        None, "--conversational/--plain", help="trl, dpo, kto, listwise: user/assistant message lists (TRL applies "
        "the chat template) or plain strings. Default: the prompt format of mrt train, conversational unless "
        "--model's tokenizer has no chat template."),
    model: Optional[str] = typer.Option(None, "--model", help="The model that will train on the file; only its "
                                        "tokenizer is read, to see whether it has a chat template."),
    pairs: str = typer.Option("sweet-spot", "--pairs", help="dpo: the pairing rule, sweet-spot (best vs the one "
                              "nearest mu - 2 sigma), best-worst, margin (DCRM-style, needs --embedding), diverse "
                              "(DivPO-style, needs --embedding) or all (docs/guides/preference.md)."),
    min_margin: float = typer.Option(0.0, "--min-margin", help="dpo: the least reward gap of a pair."),
    max_pairs: Optional[int] = typer.Option(None, "--max-pairs", help="dpo best-worst, all: at most this many pairs "
                                            "a prompt."),
    kto_label: str = typer.Option("quantile:0.5", "--kto-label", help="kto: threshold:X, quantile:Q (of all "
                                  "rewards), column:NAME (a boolean verdict such as correct) or pool-mean."),
    pool: Optional[str] = typer.Option(None, "--pool", help="The candidate table the kept rows were selected "
                                       "from: the preference rows take every candidate of the kept prompts."),
    pairs_from: Optional[str] = typer.Option(None, "--pairs-from", help="dpo, kto, listwise: take the responses "
                                             "of the kept rows (kept) or every candidate of the kept prompts in "
                                             "--pool (pool). Default: pool when --pool is given, else kept."),
    embedding: str = typer.Option("embedding", "--embedding", help="Embedding column (--pairs margin, diverse)."),
    by: str = typer.Option("prompt_id", help="Prompt id column."),
    prompt: str = typer.Option("prompt", help="Prompt text column."),
    response: Optional[str] = typer.Option(None, "--response", "--response-column", help=RESPONSE_HELP),
    reward: str = typer.Option("reward", help="Reward column (dpo, kto, listwise; openrlhf when present)."),
    engine: str = typer.Option("local", "--engine", help="local only: the weights and pairs of a prompt need "
                               "all its kept rows at once, and the output is one file."),
    allow_partial: bool = ALLOW_PARTIAL,
) -> None:
    """Write kept rows as a TRL (SFT, DPO, KTO), listwise or OpenRLHF training file.

    The TRL files use mrt train's prompt format by default (see --conversational/--plain); the
    preference formats report what they left out and why."""
    from mrt_fast.llm.export import export
    from mrt_fast.llm.labels import parse_label_rule
    from mrt_fast.llm.pairs import check_pair_options

    from mrt_fast.datasets import formats as _formats
    from mrt_fast.errors import MrtInputError

    with user_errors():
        if engine == "ray":
            raise MrtInputError("mrt export runs on the local engine only (--engine ray is refused): the weights "
                                "and pairs of a prompt need all its kept rows at once, and it writes one file")
        check_engine(engine, None)
        from mrt_fast.datasets import storage
        from mrt_fast.datasets.overlap import check_apart

        if storage.is_url(out):
            raise MrtInputError(f"output {str(out)!r}: mrt export writes a local file (copy it to object storage "
                                "after)")
        inputs = [("input", kept), ("--pool", pool), ("--model", model)]
        check_apart(inputs, [("output", out)])
        check_pair_options(pairs, min_margin, max_pairs)  # before reading a large input
        parse_label_rule(kto_label)
        response = response_column(kept, response, "--response", allow_partial)
        rows = _formats.decode_embedding_columns(_formats.collect(
            check_input_table(kept, dataset=True, allow_partial=allow_partial), kept))
        pool_rows = None
        if pool is not None:
            pool_rows = _formats.decode_embedding_columns(_formats.collect(
                check_input_table(pool, dataset=True, allow_partial=allow_partial), pool))
        tok = None
        if model is not None and conversational is None and fmt != "openrlhf":
            with needs("train"):
                from mrt_fast.llm.models import load_tokenizer

                tok = load_tokenizer(model)
        from mrt_fast._util.disk_space import reporting_full_disk

        with reporting_full_disk("writing", out):
            res, rep = export(rows, Path(out), fmt, conversational=conversational, tokenizer=tok, by=by,
                              prompt=prompt, response=response, reward=reward, min_margin=min_margin,
                              max_pairs=max_pairs, pairs=pairs, kto_label=kto_label, pool=pool_rows,
                              pairs_from=pairs_from, embedding=embedding, return_report=True)
    console.print(f"wrote {res.height} {fmt} rows ({', '.join(res.columns)}) to {out}")
    for line in rep.lines():
        console.print(f"  {line}")
