"""Code answers: programs run on the test inputs in the sandbox; the reward is the pass fraction,
the mode the tuple of outputs; hanging and flooding programs end by the sandbox's limits."""

from __future__ import annotations

import json

import polars as pl
import pytest

import mrt_fast
from mrt_fast import MrtInputError
from mrt_fast.answers.code import parse_tests
from mrt_fast.sandbox import bwrap_problem

WHY = bwrap_problem()
needs_bwrap = pytest.mark.skipif(WHY is not None, reason=f"bubblewrap cannot isolate programs here: {WHY}")

TESTS = [{"input": "2 3\n", "output": "5\n"}, {"input": "10 -4\n", "output": "6\n"}]
LIMITS = {"timeout_s": 5.0, "cpu_s": 2, "memory_mb": 256, "output_mb": 0.05}


def programs(*codes: str) -> pl.DataFrame:
    return pl.DataFrame({"prompt_id": [1] * len(codes), "response": list(codes),
                         "tests": [json.dumps(TESTS)] * len(codes)})


@needs_bwrap
def test_rewards_are_pass_fractions_and_modes_are_behaviours():
    df = programs(
        "```python\na, b = map(int, input().split())\nprint(a + b)\n```",  # right
        "print(sum(int(x) for x in input().split()))",  # right, written otherwise: the same mode
        "a, b = map(int, input().split())\nprint(a + b if a < 5 else a - b)",  # right on one test
        "print(5)",  # right on one test, by luck
        "",  # no program
    )
    out, rep = mrt_fast.answers(df, extract="code", tests="tests", sandbox=LIMITS, workers=2, return_report=True)
    assert out["reward"].to_list() == [1.0, 1.0, 0.5, 0.5, 0.0]
    assert out["correct"].to_list() == [True, True, False, False, False]
    m = out["mode"].to_list()
    assert m[0] == m[1] and len({m[0], m[2], m[3], m[4]}) == 4
    assert json.loads(out["answer"][2]) == ["5", "14"] and out["answer"][4] is None
    assert rep.statuses == {"passed": 6, "failed": 2} and rep.unanswered == 1
    # the tests as a list column, and the grouped layout, give the same
    lists = df.with_columns(pl.Series("tests", [TESTS] * df.height))
    assert mrt_fast.answers(lists, extract="code", tests="tests", sandbox=LIMITS).equals(
        out.with_columns(lists["tests"]))
    g = df.group_by("prompt_id").agg("response", pl.col("tests").first())
    back = mrt_fast.answers(g, extract="code", tests="tests", sandbox=LIMITS).explode(
        ["response", "answer", "mode", "reward", "correct"])
    assert back.select(out.columns).equals(out)


@needs_bwrap
def test_hanging_and_flooding_programs_end_by_the_limits_and_no_row_is_lost():
    df = programs("while True: pass", "while True: print('x' * 10000)", "import sys; sys.exit(3)")
    out, rep = mrt_fast.answers(df, extract="code", tests="tests", sandbox=LIMITS, workers=2, return_report=True)
    assert out.height == 3 and out["reward"].to_list() == [0.0, 0.0, 0.0]
    assert json.loads(out["answer"][0])[0] in ("<timeout>", "<cpu_limit>")
    assert json.loads(out["answer"][1]) == ["<output_limit>", "<output_limit>"]
    assert json.loads(out["answer"][2]) == ["<error>", "<error>"]
    assert rep.statuses["output_limit"] == 2 and rep.statuses["error"] == 2


@needs_bwrap
def test_inputs_without_expected_outputs_give_modes_only():
    df = pl.DataFrame({"prompt_id": [1, 1], "response": ["print(input()[::-1])", "print(input()[::-1])  # again"],
                       "tests": [[["abc"]], [["abc"]]]})
    out = mrt_fast.answers(df, extract="code", tests="tests", sandbox=LIMITS)
    assert out["mode"][0] == out["mode"][1] and out["answer"][0] == '["cba"]'
    assert out["reward"].to_list() == [0.0, 0.0] and out["correct"].to_list() == [False, False]


@pytest.mark.parametrize("value, says", [
    ("{not json", "not valid JSON"), ("[3]", "a test must be"), ('"x"', "tests must be a list"),
])
def test_bad_tests_are_one_line(value, says):
    with pytest.raises(MrtInputError, match=says) as e:
        parse_tests(value, 4, "tests")
    assert e.value.row == 4 and "row 4" in str(e.value)


def test_without_isolation_programs_are_refused_before_any_runs(monkeypatch):
    from mrt_fast.errors import SandboxUnavailableError
    from mrt_fast.sandbox import run as sb

    monkeypatch.setattr(sb, "_bwrap_exe", lambda: None)
    monkeypatch.delenv(sb.ENV_ISOLATION, raising=False)
    with pytest.raises(SandboxUnavailableError):
        mrt_fast.answers(programs("print(5)"), extract="code", tests="tests")


@needs_bwrap
def test_a_dataset_run_reports_how_the_programs_ended(tmp_path):
    from mrt_fast.answers import answers_dataset

    programs("print(5)", "while True: pass").write_parquet(tmp_path / "in.parquet")
    rep = answers_dataset(tmp_path / "in.parquet", tmp_path / "out", extract="code", tests="tests",
                          sandbox={**LIMITS, "timeout_s": 2.0, "cpu_s": 1})
    assert rep.statuses.get("exited") == 2 and sum(rep.statuses.values()) == 4
    assert set(rep.statuses) - {"exited"} <= {"timeout", "cpu_limit"}
    assert "program runs" in str(rep) and "exited 2" in str(rep)
