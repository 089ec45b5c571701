"""The answers stage on the job: both layouts, files and resumable directories, equal to the
in-memory result; a killed job resumes; the CLI; the report counted from the output."""

from __future__ import annotations

import dataclasses

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import mrt_fast
from mrt_fast.answers import answers_dataset
from mrt_fast.cli import app
from mrt_fast.datasets.job import StoppedForTest, stopping_after

runner = CliRunner()
WRITTEN = ["answer", "mode", "reward", "correct"]


def pools(seed: int, n_pools: int = 12) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for p in range(n_pools):
        ref = int(rng.integers(0, 5))
        for j in range(int(rng.integers(1, 6))):
            v = int(rng.integers(0, 5))
            text = rng.choice([f"so the answer is {v}.", f"\\boxed{{{v}}}", f"Answer: {v}.0", "I give up"])
            rows.append((f"p{p}", str(text), str(ref)))
    return pl.DataFrame(rows, schema=["prompt_id", "response", "ref"], orient="row")


def grouped(df: pl.DataFrame) -> pl.DataFrame:
    return df.group_by("prompt_id", maintain_order=True).agg("response", pl.col("ref").first())


def read_dir(path) -> pl.DataFrame:
    return mrt_fast.datasets.discover(str(path)).read()


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), per=st.integers(1, 9), drop=st.sampled_from([False, True, 0.5]))
def test_the_stage_equals_the_in_memory_result_in_both_layouts(tmp_path_factory, seed, per, drop):
    tmp = tmp_path_factory.mktemp("a")
    df = pools(seed)
    for name, table in (("flat", df), ("grouped", grouped(df))):
        table.write_parquet(tmp / f"{name}.parquet")
        want, want_rep = mrt_fast.answers(table, reference="ref", drop_zero_signal=drop, return_report=True)
        rep = answers_dataset(tmp / f"{name}.parquet", tmp / f"{name}_out", reference="ref", rows_per_part=per,
                              drop_zero_signal=drop)
        got = read_dir(tmp / f"{name}_out")
        assert got.equals(want), name
        assert (rep.pools, rep.zero_signal_pools, rep.dropped_pools, rep.dropped_rows) == \
            (want_rep.pools, want_rep.zero_signal_pools, want_rep.dropped_pools, want_rep.dropped_rows)
        if not drop:
            assert _counts(rep) == _counts(want_rep) | {"statuses": {}}
            assert (rep.rows, rep.rows_out, rep.layout) == (want_rep.rows, want_rep.rows_out, want_rep.layout)
        one = answers_dataset(tmp / f"{name}.parquet", tmp / f"{name}.jsonl", reference="ref", drop_zero_signal=drop)
        assert one.zero_signal_pools == want_rep.zero_signal_pools
        assert pl.read_ndjson(tmp / f"{name}.jsonl", schema=want.schema).equals(want)


def _counts(rep) -> dict:
    """The answers' own fields of a report (not the job's)."""
    from mrt_fast.datasets.report import JobReport

    job = {f.name for f in dataclasses.fields(JobReport)}
    return {k: v for k, v in dataclasses.asdict(rep).items() if k not in job}


def test_a_killed_job_resumes_with_the_missing_parts(tmp_path):
    df = pools(3, 30)
    df.write_parquet(tmp_path / "in.parquet")
    with stopping_after(2), pytest.raises(StoppedForTest):
        answers_dataset(tmp_path / "in.parquet", tmp_path / "out", reference="ref", rows_per_part=10)
    rep = answers_dataset(tmp_path / "in.parquet", tmp_path / "out", reference="ref", rows_per_part=10)
    assert read_dir(tmp_path / "out").equals(mrt_fast.answers(df, reference="ref"))
    # the answers counted over the whole output; the job's fields say what this run did
    assert rep.responses == rep.rows == df.height and rep.pools == df["prompt_id"].n_unique()
    n, parts = df.height, -(-df.height // 10)
    assert (rep.resumed, rep.parts, rep.parts_done_now, rep.rows_done_now) == (True, parts, parts - 2, n - 20)
    assert f"this run: {parts - 2} parts, {n - 20} rows; job total: {parts} parts, {n} rows" in str(rep)
    again = answers_dataset(tmp_path / "in.parquet", tmp_path / "out", reference="ref", rows_per_part=10)
    assert again.already_done and f"is already complete ({parts} part(s), {n} rows written)" in str(again)
    assert _counts(again) == _counts(rep)
    # other settings on the same output are refused, not mixed in
    with pytest.raises(mrt_fast.MrtInputError):
        answers_dataset(tmp_path / "in.parquet", tmp_path / "out", reference="ref", rows_per_part=10,
                        check="numeric")


def test_cli_writes_the_columns_and_reports(tmp_path):
    df = pools(5)
    df.write_parquet(tmp_path / "in.parquet")
    r = runner.invoke(app, ["answers", str(tmp_path / "in.parquet"), str(tmp_path / "out.parquet"),
                            "--extract", "last_number", "--reference", "ref"])
    assert r.exit_code == 0, r.output
    assert "no learning signal" in r.output and "answers written to" in r.output
    assert pl.read_parquet(tmp_path / "out.parquet").equals(mrt_fast.answers(df, reference="ref"))
    r = runner.invoke(app, ["answers", str(tmp_path / "in.parquet"), str(tmp_path / "kept.parquet"),
                            "--reference", "ref", "--drop-zero-signal"])
    assert r.exit_code == 0 and "dropped" in r.output
    assert pl.read_parquet(tmp_path / "kept.parquet").equals(
        mrt_fast.answers(df, reference="ref", drop_zero_signal=True))


@pytest.mark.parametrize("args, says", [
    (["--extract", r"regex:\d+"], "has no group"),
    (["--reference", "gold"], "column 'gold' (reference) not found"),
    (["--reference", "ref", "--answer-column", "ref"], "name that one otherwise"),
    (["--drop-zero-signal", "--keep-zero-signal", "0.5"], "not both"),
    (["--timeout-s", "3"], "apply to --extract code"),
    (["--workers", "2"], "--engine ray only"),
    (["--extract", "code"], "give tests="),
])
def test_cli_bad_input_is_one_line(tmp_path, args, says):
    pools(1).write_parquet(tmp_path / "in.parquet")
    r = runner.invoke(app, ["answers", str(tmp_path / "in.parquet"), str(tmp_path / "out"), *args])
    assert r.exit_code == 2, r.output
    err = r.output.strip().splitlines()
    assert len(err) == 1 and says in err[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.ray
def test_the_ray_engine_writes_what_the_local_one_does(tmp_path):
    df = pools(7)
    grouped(df).write_parquet(tmp_path / "g.parquet")
    answers_dataset(tmp_path / "g.parquet", tmp_path / "local", reference="ref", rows_per_part=4)
    answers_dataset(tmp_path / "g.parquet", tmp_path / "ray", reference="ref", rows_per_part=4, engine="ray",
                    ray_workers=2)
    assert read_dir(tmp_path / "ray").equals(read_dir(tmp_path / "local"))


def test_a_raising_function_is_named_with_its_file_and_row(tmp_path):
    df = pools(2)
    df.write_parquet(tmp_path / "in.parquet")
    bad = df["response"][5]

    def fn(text):
        if text == bad:
            raise ValueError("unreadable")
        return text

    with pytest.raises(mrt_fast.MrtInputError, match=r"unreadable at row .*in\.parquet") as e:
        answers_dataset(tmp_path / "in.parquet", tmp_path / "out", extract=fn, rows_per_part=4)
    assert "\n" not in str(e.value)
    first = df["response"].to_list().index(bad)
    assert f"row {first}" in str(e.value)  # the input's row (one file: the global row)


def test_an_unfinished_input_is_refused_unless_partial_reads_are_asked_for(tmp_path):
    from mrt_fast.errors import PartialOutputWarning

    df = pools(4, 20)
    df.write_parquet(tmp_path / "in.parquet")
    with stopping_after(1), pytest.raises(StoppedForTest):
        answers_dataset(tmp_path / "in.parquet", tmp_path / "half", rows_per_part=10)
    with pytest.raises(mrt_fast.MrtInputError, match="unfinished mrt output"):
        answers_dataset(tmp_path / "half", tmp_path / "again")
    with pytest.warns(PartialOutputWarning):
        rep = answers_dataset(tmp_path / "half", tmp_path / "again.parquet", allow_partial=True,
                              answer="answer2", mode="mode2")
    assert rep.rows == 10


def test_an_output_whose_every_pool_is_dropped_reads_as_the_empty_result(tmp_path):
    """Every pool without signal and dropped: the directory (no part file) and the file read as
    zero rows of the in-memory result's columns, and the report counts every pool dropped."""
    df = pl.DataFrame({"prompt_id": ["a", "a", "b", "b", "b"], "response": ["\\boxed{3}"] * 2 + ["Answer: 4"] * 3,
                       "ref": ["3", "3", "4", "4", "4"]})
    df.write_parquet(tmp_path / "in.parquet")
    want, want_rep = mrt_fast.answers(df, reference="ref", drop_zero_signal=True, return_report=True)
    assert want.height == 0 and want_rep.dropped_pools == 2
    rep = answers_dataset(tmp_path / "in.parquet", tmp_path / "out", reference="ref", rows_per_part=2,
                          drop_zero_signal=True)
    assert read_dir(tmp_path / "out").equals(want)
    assert (rep.pools, rep.zero_signal_pools, rep.dropped_pools, rep.dropped_rows) == \
        (want_rep.pools, want_rep.zero_signal_pools, want_rep.dropped_pools, want_rep.dropped_rows)
    assert rep.rows_out == 0
    one = answers_dataset(tmp_path / "in.parquet", tmp_path / "out.jsonl", reference="ref", drop_zero_signal=True)
    assert (one.dropped_pools, one.rows_out) == (2, 0)
    assert pl.read_ndjson(tmp_path / "out.jsonl", schema=want.schema).equals(want)
