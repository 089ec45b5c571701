"""The job's progress display and its run summary: plain lines when stderr is not a terminal
(rows, rows/s, ETA), this run's counts apart from the job's total, a finished job said to be complete."""

from __future__ import annotations

import re

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from mrt_fast.cli import app
from mrt_fast.datasets.executors import run_row_parts
from mrt_fast.datasets.job import Job, StoppedForTest, run_summary, stopping_after
from mrt_fast.datasets.local import select_dataset
from mrt_fast.datasets.progress import INTERVAL_ENV, JobProgress
from mrt_fast.errors import MrtInputError

LINE = re.compile(r"^mrt (\w+)(: [^:]+)?: ([\d,]+)( of ([\d,]+) (?:rows|prompts) \((\d+)%\)| rows| prompts), "
                  r"([\d,.]+) (?:rows|prompts)/s(, ETA \S+( \S+)?)?$")


def table(n_pools: int = 12, per: int = 5, seed: int = 0) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    n = n_pools * per
    return pl.DataFrame({"prompt_id": np.repeat(np.arange(n_pools), per), "response": [f"r{i}" for i in range(n)],
                         "reward": rng.standard_normal(n),
                         "embedding": rng.standard_normal((n, 4)).astype(np.float32)})


def lines_of(err: str) -> list[re.Match]:
    got = [LINE.match(x) for x in err.splitlines() if x.startswith("mrt ")]
    assert got and all(got), err
    return got


@pytest.mark.parametrize("layout", ["flat", "grouped"])
def test_select_on_a_pipe_prints_plain_lines_of_rows_rate_and_eta(tmp_path, monkeypatch, capsys, layout):
    df = table()
    if layout == "grouped":
        df = df.group_by("prompt_id", maintain_order=True).agg(pl.all())
    df.write_parquet(tmp_path / "in.parquet")
    monkeypatch.setenv(INTERVAL_ENV, "0")  # a line at every step
    select_dataset(tmp_path / "in.parquet", tmp_path / "out", 2, "grades", parts=3, progress=True)
    lines = lines_of(capsys.readouterr().err)
    last = lines[-1]
    assert last.group(1) == "select" and last.group(3) == last.group(5) == f"{df.height:,}" and last.group(6) == "100"
    for phase in {m.group(2) for m in lines}:  # rows only go up within a phase (partitioning, selecting)
        counts = [int(m.group(3).replace(",", "")) for m in lines if m.group(2) == phase]
        assert counts == sorted(counts)


def test_row_parts_print_lines_and_count_this_runs_rows_in_the_rate(tmp_path, monkeypatch, capsys):
    table().write_parquet(tmp_path / "in.parquet")
    monkeypatch.setenv(INTERVAL_ENV, "0")
    with stopping_after(2), pytest.raises(StoppedForTest):
        with Job(tmp_path / "in.parquet", tmp_path / "out", {}, what="copy", progress=True) as job:
            run_row_parts(job, lambda d: d, rows_per_part=10)
    capsys.readouterr()
    with Job(tmp_path / "in.parquet", tmp_path / "out", {}, what="copy", progress="lines") as job:
        assert job.resumed
        run_row_parts(job, lambda d: d, rows_per_part=10)
    lines = lines_of(capsys.readouterr().err)
    # the resumed job starts at the 20 rows done before; this run adds the other 40
    assert [m.group(3) for m in lines] == ["30", "40", "50", "60", "60"]
    assert all(m.group(5) == "60" for m in lines)


def test_no_line_before_the_interval_and_none_when_off(tmp_path, monkeypatch, capsys):
    table().write_parquet(tmp_path / "in.parquet")
    monkeypatch.setenv(INTERVAL_ENV, "3600")
    select_dataset(tmp_path / "in.parquet", tmp_path / "a.parquet", 2, "top", progress=True)
    select_dataset(tmp_path / "in.parquet", tmp_path / "b.parquet", 2, "top", progress=False)
    assert capsys.readouterr().err == ""


def test_the_line_and_a_bad_interval():
    p = JobProgress("lines", name="mrt nll")
    p.start(1000, done=400)
    p.advance(100)
    m = LINE.match(p.line())
    assert m and m.group(3) == "500" and m.group(5) == "1,000" and m.group(6) == "50", p.line()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(INTERVAL_ENV, "soon")
        with pytest.raises(MrtInputError, match=INTERVAL_ENV):
            JobProgress("lines")
    with pytest.raises(MrtInputError, match="progress must be"):
        JobProgress("loud")


def test_run_summary_separates_this_run_from_the_job():
    assert run_summary({"parts": 2, "rows": 1200}, {"parts": 4, "rows": 2400}) == \
        "this run: 2 parts, 1,200 rows; job total: 4 parts, 2,400 rows"


@pytest.mark.parametrize("layout", ["flat", "grouped"])
def test_mrt_select_resumed_says_this_run_and_the_total_and_a_finished_job_is_complete(tmp_path, layout):
    df = table()
    if layout == "grouped":
        df = df.group_by("prompt_id", maintain_order=True).agg(pl.all())
    df.write_parquet(tmp_path / "in.parquet")
    # one worker: no other part is being written as the stop comes (it would be found on the rerun)
    cmd = ["select", str(tmp_path / "in.parquet"), str(tmp_path / "out"), "--k", "2", "--parts", "3", "--workers", "1"]
    with stopping_after(1), pytest.raises(StoppedForTest):
        CliRunner().invoke(app, cmd, catch_exceptions=False)
    r = CliRunner().invoke(app, cmd)
    text = " ".join(r.output.split())
    assert r.exit_code == 0 and "this run: 2 parts" in text and "job total: 3 parts" in text, r.output
    # every part committed but the job stopped before it was marked finished: nothing is left to do
    with stopping_after(3), pytest.raises(StoppedForTest):
        CliRunner().invoke(app, [*cmd[:2], str(tmp_path / "out2"), *cmd[3:]], catch_exceptions=False)
    for out in ("out", "out2"):
        r = CliRunner().invoke(app, [*cmd[:2], str(tmp_path / out), *cmd[3:]])
        text = " ".join(r.output.split())
        assert r.exit_code == 0 and "already complete" in text and "pools" not in text, r.output
    assert pl.read_parquet(tmp_path / "out2").sort("prompt_id").equals(pl.read_parquet(tmp_path / "out")
                                                                       .sort("prompt_id"))


def test_a_text_stage_resumed_says_this_run_and_the_total(tmp_path):
    from mrt_fast.llm.dataset_stages import run_text_stage

    df = pl.DataFrame({"prompt_id": [1, 1, 2, 2, 3], "prompt": list("aabbc"), "response": list("vwxyz")})
    df.write_parquet(tmp_path / "in.parquet")
    kw = dict(name="upper", columns=("prompt", "response"), out_column="shout", parameters={},
              make_stage=Upper(), rows_per_part=2)
    with stopping_after(1), pytest.raises(StoppedForTest):
        run_text_stage(tmp_path / "in.parquet", tmp_path / "out", **kw)
    rep = run_text_stage(tmp_path / "in.parquet", tmp_path / "out", **kw)
    assert "this run: 2 parts, 3 rows; job total: 3 parts, 5 rows" in str(rep)
    assert "already complete" in str(run_text_stage(tmp_path / "in.parquet", tmp_path / "out", **kw))
    assert pl.read_parquet(tmp_path / "out")["shout"].to_list() == list("VWXYZ")


class Upper:
    """A stage factory with no model: the response in capitals."""

    def __call__(self):
        return lambda df: df.with_columns(pl.col("response").str.to_uppercase().alias("shout"))


# ------------------------------------------------------------- candidates and prompts, ticks inside a part

ITEMS = re.compile(r"^mrt (\w+)(: [^:]+)?: ([\d,]+) of ([\d,]+) candidates \((\d+)%\), ([\d,]+)( of ([\d,]+))? "
                   r"(rows|prompts), ([\d,.]+) candidates/s(, ETA \S+( \S+)?)?$")


def test_a_slow_rate_is_not_rounded_to_zero_and_candidates_lead():
    from mrt_fast.datasets.progress import rate_text

    assert rate_text(0.14) == "0.14" and rate_text(8512.4) == "8,512" and rate_text(0) == "0"
    p = JobProgress("lines", name="mrt nll", unit="prompts")
    p.start(2400, items_total=19200)
    p.tick(800)
    m = ITEMS.match(p.line())
    assert m and m.group(3) == "800" and m.group(4) == "19,200" and m.group(6) == "0" and m.group(9) == "prompts", \
        p.line()


class Ticking:
    """A stage factory with no model that ticks each candidate, as a model stage does after each batch."""

    def __call__(self, tick=None):
        def part(df):
            for n in df["responses"].list.len():
                tick(int(n))
            return df.with_columns(pl.col("responses").list.eval(pl.element().str.len_chars()).alias("n"))

        return part


def test_a_model_stage_ticks_candidates_inside_a_part(tmp_path, monkeypatch, capsys):
    from mrt_fast.llm.dataset_stages import run_text_stage

    df = pl.DataFrame({"prompt_id": [1, 2, 3], "prompt": list("abc"),
                       "responses": [["x", "yy"], ["zzz"], ["a", "b", "c"]]})
    df.write_parquet(tmp_path / "in.parquet")
    monkeypatch.setenv(INTERVAL_ENV, "0")
    run_text_stage(tmp_path / "in.parquet", tmp_path / "out.parquet", name="count", columns=("prompt", "responses"),
                   out_column="n", parameters={}, make_stage=Ticking(), rows_per_part=10, progress="lines")
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "mrt count: loading the model"  # said before the model loads, not after its first part
    got = [ITEMS.match(x) for x in err[1:]]
    assert got and all(got)
    # one part of all 3 prompts: the candidates moved (1, 2, 3 of 6...) before the part was done
    assert [m.group(3) for m in got][:3] == ["2", "3", "6"] and all(m.group(4) == "6" for m in got)
    assert {m.group(9) for m in got} == {"prompts"} and got[0].group(6) == "0"


def test_grouped_embed_counts_candidates_and_prompts_apart(tmp_path, monkeypatch, capsys):
    import importlib

    from mrt_fast.embeddings.dataset import embed_dataset

    emb = importlib.import_module("mrt_fast.embeddings.embed")

    def fake_texts(texts, model=None, *, callback=None, stats=None, **kw):
        for i in range(0, len(texts), 2):
            callback(min(2, len(texts) - i))
        return np.ones((len(texts), 3), dtype=np.float32) / np.sqrt(3)

    monkeypatch.setattr(emb, "embed_texts", fake_texts)
    monkeypatch.setattr(emb, "check_model", lambda *a, **k: "fake")
    n = 40
    pl.DataFrame({"prompt_id": np.arange(n), "responses": [[f"t{i}.{j}" for j in range(8)] for i in range(n)]}) \
        .write_parquet(tmp_path / "in.parquet")
    monkeypatch.setenv(INTERVAL_ENV, "0")
    rep = embed_dataset(tmp_path / "in.parquet", tmp_path / "out", text="responses", rows_per_part=15,
                        progress="lines")
    got = [ITEMS.match(x) for x in capsys.readouterr().err.splitlines() if "loading the model" not in x]
    assert got and all(got)
    for m in got:  # never past 100%, candidates of 320 and prompts of 40
        assert int(m.group(3).replace(",", "")) <= 320 and int(m.group(5)) <= 100 and m.group(8) == "40"
    assert got[-1].group(3) == "320" and got[-1].group(6) == "40"
    assert rep.candidates == 320 and rep.texts_done_now == 320 and rep.rows_done_now == 40
    assert rep.texts_per_second == pytest.approx(8 * rep.rows_per_second)


def test_the_loading_line_waits_for_the_interval_and_an_early_end_drops_it(monkeypatch, capsys):
    monkeypatch.setenv(INTERVAL_ENV, "3600")
    p = JobProgress("lines", name="mrt nll")
    p.say("loading the model")
    p.close()  # a model that failed to load at once: its error stays the only line
    monkeypatch.setenv(INTERVAL_ENV, "0")
    q = JobProgress("lines", name="mrt nll")
    q.say("loading the model")
    assert capsys.readouterr().err == "mrt nll: loading the model\n"


def test_a_long_select_step_says_its_picks_while_the_rows_stand_still(monkeypatch, capsys):
    """Inside a select step whose rows do not move, the picks the core has made since the step
    began are said every interval; none while the rows move; nothing when progress is off."""
    import threading
    import time

    import mrt_fast._grades_core as core
    from mrt_fast.datasets.pick_progress import picks_shown

    made = iter(range(100, 10_000, 3))
    lock = threading.Lock()

    def picks() -> int:
        with lock:
            return next(made)

    monkeypatch.setattr(core, "picks_made", picks)
    bar = JobProgress("lines", name="mrt select")
    bar.phase("grades-4")
    bar.start(10)
    with picks_shown(bar, quiet_for=0.05):
        time.sleep(0.4)
    said = [ln for ln in capsys.readouterr().err.splitlines() if "picks made" in ln or "pick made" in ln]
    assert said and all(re.fullmatch(r"mrt select: grades-4: \d+ picks? made in \d+s", ln) for ln in said)
    counts = [int(ln.split(": ")[2].split()[0]) for ln in said]
    assert counts == sorted(counts) and counts[0] > 0  # picks since the step began, growing
    with picks_shown(bar, quiet_for=0.3):
        for _ in range(60):  # rows moving: their own lines say enough
            bar.advance(1)
            time.sleep(0.01)
    assert "picks made" not in capsys.readouterr().err
    with picks_shown(JobProgress(False), quiet_for=0.01):
        time.sleep(0.1)
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(core, "picks_made", lambda: 7)  # a step that makes no picks (finding modes)
    with picks_shown(bar, quiet_for=0.05):
        time.sleep(0.2)
    said = capsys.readouterr().err.splitlines()
    assert said and all(re.fullmatch(r"mrt select: grades-4: selecting for \d+s", ln) for ln in said), said
