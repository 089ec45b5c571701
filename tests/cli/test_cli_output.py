"""What the command line prints to a pipe or a log: whole lines (no folding at 80 columns)."""

from __future__ import annotations

import numpy as np
import polars as pl
from mrt_fast.cli import app
from typer.testing import CliRunner


def test_piped_output_keeps_paths_and_the_report_whole(tmp_path):
    rng = np.random.default_rng(0)
    ids = np.repeat(np.arange(30), 4)
    losses = pl.DataFrame({"prompt_id": ids, "loss": 2.0 + rng.normal(size=30)[ids] + rng.normal(size=ids.size)})
    deep = tmp_path / ("a_folder_with_a_long_name_" * 3) / ("and_another_one_below_it_" * 3)
    deep.mkdir(parents=True)
    losses.write_parquet(deep / "losses.parquet")
    report = deep / "report.json"
    r = CliRunner().invoke(app, ["diagnose", str(deep / "losses.parquet"), "--json", str(report), "--n-boot", "0"])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert f"wrote {report}" in lines, lines[-3:]
    assert len(f"wrote {report}") > 80
    from mrt_fast import variance_budget

    want = repr(variance_budget(deep / "losses.parquet", n_boot=0)).splitlines()
    assert any(len(line) > 80 for line in want)  # else the check below proves nothing
    assert [line for line in want if line not in lines] == []  # each line of the report whole


BOX = set("─│┌┐└┘├┤┬┴┼━┃┏┓┗┛┡┩╇")


def test_piped_tables_are_plain_columns(tmp_path):
    rng = np.random.default_rng(1)
    pl.DataFrame({"prompt_id": np.repeat(np.arange(20), 5), "embedding": rng.normal(size=(100, 4)).astype(np.float32),
                  "reward": rng.random(100)}).write_parquet(tmp_path / "in.parquet")
    r = CliRunner().invoke(app, ["select", str(tmp_path / "in.parquet"), str(tmp_path / "out.parquet"), "--k", "2",
                                 "--profile"])
    assert r.exit_code == 0, r.output
    assert not BOX & set(r.stdout), r.stdout
    rows = [line.split() for line in r.stdout.splitlines()]
    assert ["pools", "20", "(100", "candidates,", "40", "kept)"] in rows  # label and value on one line
    assert any(row[:1] == ["plan"] for row in rows)


def _interrupt(*a, **kw):
    raise KeyboardInterrupt


def test_ctrl_c_ends_with_one_line_and_exit_130(tmp_path, monkeypatch):
    import yaml
    from mrt_fast.llm import pipeline
    monkeypatch.setattr(pipeline, "run", _interrupt)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"out_dir": "out", "model": "m", "data": {"train_prompts": "t", "eval": "e"}}))
    r = CliRunner().invoke(app, ["run", str(cfg)])
    assert (r.exit_code, r.stderr) == (130, "interrupted; rerun the same command to resume\n"), r.output
    # a command that does not resume says only that it was interrupted
    import mrt_fast.variance

    monkeypatch.setattr(mrt_fast.variance, "variance_budget", _interrupt)
    losses = tmp_path / "l.parquet"
    pl.DataFrame({"prompt_id": [1, 1, 2, 2], "loss": [1.0, 2.0, 3.0, 1.0]}).write_parquet(losses)
    r = CliRunner().invoke(app, ["diagnose", str(losses)])
    assert (r.exit_code, r.stderr) == (130, "interrupted\n"), r.output
    # a job stage resumes from its finished parts: mrt answers says so as mrt select does
    import mrt_fast.answers.dataset

    monkeypatch.setattr(mrt_fast.answers.dataset, "answers_dataset", _interrupt)
    r = CliRunner().invoke(app, ["answers", str(losses), str(tmp_path / "out"), "--response", "prompt_id"])
    assert (r.exit_code, r.stderr) == (130, "interrupted; rerun the same command to resume\n"), r.output


def test_the_libraries_progress_bars_and_future_warnings_are_left_out(tmp_path, monkeypatch):
    import warnings

    from mrt_fast.cli import quiet

    for k in quiet.ENVIRONMENT:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("TRANSFORMERS_VERBOSITY", "info")  # the user's own choice wins
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        r = CliRunner().invoke(app, ["diagnose", str(tmp_path / "missing.parquet")])
        assert r.exit_code == 2
        import os

        assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1" and os.environ["TRANSFORMERS_VERBOSITY"] == "info"
        with warnings.catch_warnings(record=True) as seen:
            warnings.warn_explicit("old", FutureWarning, "x.py", 1, module="transformers.generation.utils")
            warnings.warn_explicit("ours", UserWarning, "x.py", 1, module="transformers.generation.utils")
            warnings.warn_explicit("other", FutureWarning, "x.py", 1, module="somebody_else")
        assert sorted(str(w.message) for w in seen) == ["other", "ours"]
