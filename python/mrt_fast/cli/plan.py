"""`mrt plan`: how many responses to generate per prompt, from a pilot."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from mrt_fast.cli.common import ALLOW_PARTIAL, app, check_input_table, console, user_errors


@app.command("plan")
def plan_cmd(
    pilot: str = typer.Argument(..., metavar="PILOT", help="Pilot responses with a reward (or loss) each: a file, a directory or a "
                                "quoted glob."),
    out: Path = typer.Argument(..., metavar="OUTPUT", help="The plan to write (prompt_id, prompt, n, ...): the prompt table of the "
                               "next mrt generate, which samples n responses for each prompt."),
    budget: int = typer.Option(..., "--budget", help="Responses to generate in all."),
    value: str = typer.Option("reward", "--value", help="The pilot column whose within-prompt variance sets n "
                              "(reward or loss)."),
    n_min: int = typer.Option(1, "--n-min", help="Least responses of a prompt that is sampled."),
    n_max: Optional[int] = typer.Option(None, "--n-max", help="Most responses of a prompt."),
    n_zero: int = typer.Option(0, "--n-zero", help="Responses of a prompt whose pilot shows no variance (and no "
                               "unseen answer), unless --keep marks it."),
    keep: Optional[str] = typer.Option(None, "--keep", help="A boolean column: true for prompts never starved."),
    mode: str = typer.Option("mode", "--mode", help="Answer column for the Good-Turing unseen mass (used when "
                             "present)."),
    cost_prompt: float = typer.Option(0.0, "--cost-prompt", help="Cost C_p of sampling a prompt at all (e.g. its "
                                      "prefill), for the comparison with uniform n."),
    cost_response: float = typer.Option(1.0, "--cost-response", help="Cost C_r of one response."),
    by: str = typer.Option("prompt_id", help="Prompt id column."),
    prompt: str = typer.Option("prompt", help="Prompt text column (carried to the plan when present)."),
    allow_partial: bool = ALLOW_PARTIAL,
) -> None:
    """Per-prompt n for the next generation round: Neyman allocation over the pilot's within-prompt
    variance, prompts with no variance starved (docs/guides/per_prompt_k.md)."""
    from mrt_fast._util.disk_space import reporting_full_disk
    from mrt_fast.datasets import formats as _formats
    from mrt_fast.datasets.formats import write_table
    from mrt_fast.datasets.overlap import check_apart
    from mrt_fast.variance.plan import plan_generation

    with user_errors():
        _formats.check_output(out)
        check_apart([("pilot", pilot)], [("output", out)])
        rows = _formats.collect(check_input_table(pilot, (by, value), "pilot", dataset=True,
                                                  allow_partial=allow_partial), pilot)
        plan = plan_generation(rows, budget, by=by, value=value, n_min=n_min, n_max=n_max, n_zero=n_zero, keep=keep,
                               mode=mode, prompt=prompt, cost_prompt=cost_prompt, cost_response=cost_response)
        with reporting_full_disk("writing", out):
            write_table(plan.table, out)
    console.print(f"wrote the plan of {plan.table.height} prompts to {out}")
    for line in plan.lines():
        console.print(f"  {line}")
