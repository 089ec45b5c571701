"""`mrt answers`: answer keys, modes and checker rewards of every response (docs/guides/answers.md)."""

from __future__ import annotations

from typing import Optional

import typer

from mrt_fast.cli.common import (
    ALLOW_PARTIAL,
    RESPONSE_HELP,
    app,
    check_engine,
    print_report,
    response_column,
    user_errors,
    warn_notes,
)


@app.command("answers")
def answers_cmd(
    inp: str = typer.Argument(..., metavar="INPUT", help="Responses: a file, a directory (an mrt output included), a quoted glob "
                              "or an s3:// prefix; flat (a row a response) or grouped (a row a prompt)."),
    out: str = typer.Argument(..., metavar="OUTPUT", help="Output: a file (.parquet/.jsonl/.csv), or a resumable directory."),
    extract: str = typer.Option("last_number", "--extract", help="last_number | boxed | answer_line | "
                                "choice[:LETTERS] | json:PATH | regex:PATTERN (with a group) | code."),
    reference: Optional[str] = typer.Option(None, "--reference", help="Column of reference answers: adds "
                                            "reward and correct."),
    tests: Optional[str] = typer.Option(None, "--tests", help="--extract code: column of test cases "
                                        "([{input, output}], or JSON); programs run in the sandbox."),
    check: str = typer.Option("exact", "--check", help="exact | numeric | set (the reference a list)."),
    abs_tol: Optional[float] = typer.Option(None, "--abs-tol", help="--check numeric: absolute tolerance."),
    rel_tol: Optional[float] = typer.Option(None, "--rel-tol", help="--check numeric: relative tolerance."),
    normalize: Optional[str] = typer.Option(None, "--normalize", help="math | text | none (default: by --extract)."),
    partial: bool = typer.Option(True, "--partial/--no-partial", help="Partial credit (a pass fraction) "
                                 "between the wrong and correct rewards."),
    reward_correct: float = typer.Option(1.0, "--reward-correct"),
    reward_wrong: float = typer.Option(0.0, "--reward-wrong"),
    reward_missing: float = typer.Option(0.0, "--reward-missing", help="Reward of a response with no answer."),
    by: str = typer.Option("prompt_id", "--by", help="Prompt id column."),
    response: Optional[str] = typer.Option(None, "--response", "--response-column", help=RESPONSE_HELP),
    answer_column: str = typer.Option("answer", "--answer-column"),
    mode_column: str = typer.Option("mode", "--mode-column"),
    reward_column: str = typer.Option("reward", "--reward-column"),
    correct_column: str = typer.Option("correct", "--correct-column"),
    layout: str = typer.Option("auto", "--layout", help="auto | flat | grouped."),
    drop_zero_signal: bool = typer.Option(False, "--drop-zero-signal", help="Drop the prompts whose rewards "
                                          "are all equal (no reference: with one answer)."),
    keep_zero_signal: Optional[float] = typer.Option(None, "--keep-zero-signal", help="Cap instead: keep this "
                                                     "share (0-1) of those prompts, chosen by prompt id."),
    parallel: int = typer.Option(1, "--parallel", help="--extract code: programs run at a time."),
    timeout_s: Optional[float] = typer.Option(None, "--timeout-s", help="Sandbox: wall clock per run."),
    cpu_s: Optional[int] = typer.Option(None, "--cpu-s", help="Sandbox: CPU seconds per run."),
    memory_mb: Optional[int] = typer.Option(None, "--memory-mb", help="Sandbox: memory per run."),
    output_mb: Optional[float] = typer.Option(None, "--output-mb", help="Sandbox: stdout + stderr cap."),
    rows_per_part: int = typer.Option(50_000, "--rows-per-part", help="Directory output: input rows per part."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an output an earlier mrt job wrote."),
    engine: str = typer.Option("local", "--engine", help="local | ray."),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="--engine ray: the cluster to join."),
    workers: Optional[int] = typer.Option(None, "--workers", help="--engine ray: workers (default: its CPUs)."),
    allow_partial: bool = ALLOW_PARTIAL,
) -> None:
    """Find each response's answer: its key becomes the mode, the checker's verdict the reward.

    OUTPUT with a suffix is one file; without, a resumable directory of parts. Either layout."""
    from mrt_fast.errors import MrtInputError

    with user_errors(resumable=True):
        check_engine(engine, ray_address, ray_only={"--workers": workers})
        if drop_zero_signal and keep_zero_signal is not None:
            raise MrtInputError("give --drop-zero-signal or --keep-zero-signal SHARE, not both")
        drop: bool | float = drop_zero_signal if keep_zero_signal is None else keep_zero_signal
        sandbox = {k: v for k, v in (("timeout_s", timeout_s), ("cpu_s", cpu_s), ("memory_mb", memory_mb),
                                     ("output_mb", output_mb)) if v is not None}
        if sandbox and extract != "code":
            raise MrtInputError(f"{', '.join('--' + k.replace('_', '-') for k in sandbox)} apply to --extract code")
        response = response_column(inp, response, "--response", allow_partial)
        from mrt_fast.answers.dataset import answers_dataset

        rep = answers_dataset(inp, out, extract=extract, reference=reference, tests=tests, check=check,
                              abs_tol=abs_tol, rel_tol=rel_tol, normalize=normalize, partial=partial,
                              reward_correct=reward_correct, reward_wrong=reward_wrong,
                              reward_missing=reward_missing, by=by, response=response, answer=answer_column,
                              mode=mode_column, reward=reward_column, correct=correct_column, layout=layout,
                              drop_zero_signal=drop, sandbox=sandbox, workers=parallel,
                              rows_per_part=rows_per_part, overwrite=overwrite, progress=True, engine=engine,
                              ray_address=ray_address, ray_workers=workers, allow_partial=allow_partial)
    print_report(rep, "mrt answers", f"answers written to {rep.output}")
    warn_notes(rep.notes)
