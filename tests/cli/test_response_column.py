"""The response column: `response` by default, `responses` when that is the input's column (said on
stderr), a wrong name answered with the other usual one, and --response-column in every command."""

from __future__ import annotations

import polars as pl
import pytest
from typer.testing import CliRunner

from mrt_fast.cli import app


@pytest.fixture()
def grouped(tmp_path):
    p = tmp_path / "g.parquet"
    pl.DataFrame({"prompt_id": [1, 2], "prompt": ["a", "b"], "responses": [["x", "y"], ["z", "w"]],
                  "reward": [[1.0, 0.0], [0.5, 0.2]]}).write_parquet(p)
    return p


def run(args):
    return CliRunner().invoke(app, args)


def test_nll_and_score_find_responses_by_themselves(grouped, tmp_path):
    for cmd in (["nll", "--model", str(tmp_path / "no_model")], ["score", "--model", str(tmp_path / "no_model")]):
        r = run([cmd[0], str(grouped), str(tmp_path / f"{cmd[0]}.parquet"), *cmd[1:]])
        assert "reading the responses from column 'responses'" in r.output, r.output
        assert "'response'" not in r.output.split("error:")[-1]  # what fails next is not the column


@pytest.mark.parametrize("cmd", [["nll"], ["embed"], ["export"], ["answers"]])
def test_a_missing_response_column_says_did_you_mean(grouped, tmp_path, cmd):
    flag = "--text" if cmd[0] == "embed" else "--response"
    for f in (flag, "--response-column"):
        r = run([*cmd, str(grouped), str(tmp_path / "o.jsonl"), f, "response"])
        assert r.exit_code == 2 and "did you mean 'responses'" in r.output, r.output


def test_answers_reads_grouped_responses_by_default(grouped, tmp_path):
    out = tmp_path / "a.parquet"
    r = run(["answers", str(grouped), str(out)])
    assert r.exit_code == 0, r.output
    assert "reading the responses from column 'responses'" in r.output
    assert pl.read_parquet(out)["answer"].to_list() == [[None, None], [None, None]]


def test_export_reads_grouped_responses_by_default(grouped, tmp_path):
    out = tmp_path / "sft.jsonl"
    r = run(["export", str(grouped), str(out), "--plain"])
    assert r.exit_code == 0, r.output
    assert pl.read_ndjson(out).height == 4


def test_a_null_response_in_a_list_is_named_before_the_model(tmp_path):
    p = tmp_path / "g.parquet"
    pl.DataFrame({"prompt_id": [1, 2], "prompt": ["a", "b"], "responses": [["x", "y"], ["z", None]]}).write_parquet(p)
    r = run(["nll", str(p), str(tmp_path / "o.parquet"), "--model", str(tmp_path / "no_model")])
    assert r.exit_code == 2 and "row 1, candidate 1" in r.output, r.output


def _commands_with_arguments() -> list[str]:
    import typer

    group = typer.main.get_command(app)
    return sorted(name for name, c in group.commands.items()
                  if any(p.param_type_name == "argument" for p in c.params))


@pytest.mark.parametrize("cmd", _commands_with_arguments())
def test_help_names_the_arguments_for_people(cmd):
    import re

    r = run([cmd, "--help"])
    assert r.exit_code == 0
    usage = next(line for line in r.output.splitlines() if "Usage:" in line)
    args = re.findall(r"\{([^}]*)\}", usage)
    assert args and all(a.isupper() for a in args), usage  # INPUT, OUTPUT, ...: no parameter names
