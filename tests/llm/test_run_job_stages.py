"""mrt run's embed, score and select are stages of the dataset job: a run stopped inside embed or
score resumes from the finished parts and ends with what an uninterrupted run makes, on either
engine."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

pytestmark = [pytest.mark.train, pytest.mark.usefixtures("torch_one_thread")]

#: the stages up to the selection (no model trains)
UP_TO_SELECT = ("generate", "embed", "score", "select")
#: 3 prompts x 3 candidates in parts of 2 rows: 5 parts
ROWS = 2


class CountingEmbedder:
    """The hashing embedder, counting the texts it embeds."""

    def __init__(self):
        from mrt_fast.embeddings.embedders import HashingEmbedder

        self.inner, self.texts = HashingEmbedder(), 0

    def __call__(self, texts):
        self.texts += len(texts)
        return self.inner(texts)


#: the calls of `length_reward`, and the call at which it stops the run (None: never)
CALLS = {"n": 0, "stop_at": None}


def length_reward(rows: pl.DataFrame) -> list[float]:
    """A reward hook: the response's length; stops the run as a kill would at call ``stop_at``."""
    from mrt_fast.errors import StoppedForTest

    CALLS["n"] += 1
    if CALLS["stop_at"] is not None and CALLS["n"] >= CALLS["stop_at"]:
        raise StoppedForTest("stopped inside the score stage")
    return [float(len(r or "")) for r in rows["response"].to_list()]


def _cfg(tmp_path, tiny_paths, out, reward_model=True):
    from mrt_fast.llm.testing import tiny_prompt_table

    tiny_prompt_table(3, with_reference=False).write_ndjson(tmp_path / "train.jsonl")
    tiny_prompt_table(3, offset=5).write_ndjson(tmp_path / "eval.jsonl")
    return {"out_dir": str(tmp_path / out), "model": str(tiny_paths["lm"]),
            **({"reward_model": str(tiny_paths["reward"])} if reward_model else {}),
            "embedder": "hashing", "data": {"train_prompts": str(tmp_path / "train.jsonl"),
                                             "eval": str(tmp_path / "eval.jsonl")},
            "generate": {"n": 3, "max_new_tokens": 4}, "select": {"methods": ["random", "diverse"], "ks": [1, 2]},
            "threads": 1, "baseline": False}


def _outputs(out) -> dict[str, pl.DataFrame]:
    files = ["candidates.parquet", "embedded.parquet", "scored.parquet"]
    files += sorted(f"select/{p.name}" for p in (out / "select").glob("*.parquet"))
    return {f: pl.read_parquet(out / f) for f in files}


def _same(a: dict, b: dict) -> None:
    assert list(a) == list(b) and len(a) == 7
    for f in a:
        assert_frame_equal(a[f], b[f], check_exact=False, rtol=1e-6)


def _parts(d) -> list[str]:
    return sorted(p.name for p in d.glob("part-*.parquet"))


def test_a_run_stopped_in_its_embed_stage_resumes_from_the_finished_parts(tiny_paths, tmp_path):
    from mrt_fast.datasets.job import StoppedForTest, stopping_after
    from mrt_fast.llm.pipeline import run

    whole = CountingEmbedder()
    run(_cfg(tmp_path, tiny_paths, "whole"), embedder=whole, stages=UP_TO_SELECT, progress=False, rows_per_part=ROWS)
    assert whole.texts == 9 and not (tmp_path / "whole" / "embedded.parquet.parts").exists()

    cfg = _cfg(tmp_path, tiny_paths, "stopped")
    out = tmp_path / "stopped"
    with stopping_after(2), pytest.raises(StoppedForTest):
        run(cfg, embedder=CountingEmbedder(), stages=UP_TO_SELECT, progress=False, rows_per_part=ROWS)
    assert _parts(out / "embedded.parquet.parts") == ["part-00000.parquet", "part-00001.parquet"]
    assert not (out / "embedded.parquet").exists() and not (out / "scored.parquet").exists()
    again = CountingEmbedder()
    run(cfg, embedder=again, stages=UP_TO_SELECT, progress=False, rows_per_part=ROWS)
    assert again.texts == 9 - 2 * ROWS  # the two finished parts are not embedded again
    assert not (out / "embedded.parquet.parts").exists()
    _same(_outputs(tmp_path / "whole"), _outputs(out))


def test_a_run_stopped_in_its_score_stage_resumes_from_the_finished_parts(tiny_paths, tmp_path):
    from mrt_fast.datasets.job import StoppedForTest
    from mrt_fast.llm.pipeline import run

    CALLS.update(n=0, stop_at=None)
    run(_cfg(tmp_path, tiny_paths, "whole", reward_model=False), reward_fn=length_reward, stages=UP_TO_SELECT,
        progress=False, rows_per_part=ROWS)
    assert CALLS["n"] == 5  # one call a part

    cfg = _cfg(tmp_path, tiny_paths, "stopped", reward_model=False)
    out = tmp_path / "stopped"
    CALLS.update(n=0, stop_at=4)  # parts 0-2 finished, stopped inside part 3
    with pytest.raises(StoppedForTest):
        run(cfg, reward_fn=length_reward, stages=UP_TO_SELECT, progress=False, rows_per_part=ROWS)
    assert (out / "embedded.parquet").exists() and not (out / "scored.parquet").exists()
    assert len(_parts(out / "scored.parquet.parts")) == 3
    CALLS.update(n=0, stop_at=None)
    run(cfg, reward_fn=length_reward, stages=UP_TO_SELECT, progress=False, rows_per_part=ROWS)
    assert CALLS["n"] == 2  # parts 3 and 4 only
    assert not (out / "scored.parquet.parts").exists()
    _same(_outputs(tmp_path / "whole"), _outputs(out))
    scored = pl.read_parquet(out / "scored.parquet")
    np.testing.assert_array_equal(scored["reward"].to_numpy(),
                                  [float(len(r or "")) for r in scored["response"].to_list()])


def test_a_stopped_stage_with_other_settings_is_refused_naming_the_change(tiny_paths, tmp_path):
    """The parts of a stopped stage are an output of the run: a rerun with other settings is
    refused by the run's records (naming the change), and --redo-changed starts the stage again."""
    from mrt_fast import MrtInputError
    from mrt_fast.datasets.job import StoppedForTest, stopping_after
    from mrt_fast.llm.pipeline import run

    cfg = _cfg(tmp_path, tiny_paths, "out")
    out = tmp_path / "out"
    with stopping_after(1), pytest.raises(StoppedForTest):
        run(cfg, stages=UP_TO_SELECT, progress=False, rows_per_part=ROWS)
    assert _parts(out / "embedded.parquet.parts") == ["part-00000.parquet"]
    cfg["embedder"] = "minilm"
    with pytest.raises(MrtInputError, match=r"embed \(embedder 'hashing' -> 'minilm'\)"):
        run(cfg, stages=UP_TO_SELECT, progress=False, rows_per_part=ROWS)
    cfg["embedder"] = "hashing"
    fresh = CountingEmbedder()
    run(cfg, embedder=fresh, stages=UP_TO_SELECT, progress=False, rows_per_part=ROWS, redo_changed=True)
    assert fresh.texts == 9  # another embedder (an object passed in): the stage made again from the start


@pytest.mark.ray
def test_mrt_run_on_ray_gives_the_local_result(tiny_paths, tmp_path, monkeypatch):
    pytest.importorskip("ray")
    from mrt_fast.llm.pipeline import run

    monkeypatch.setenv("MRT_CACHE_DIR", str(tmp_path / "cache"))
    for eng in ("local", "ray"):
        run(_cfg(tmp_path, tiny_paths, eng), stages=UP_TO_SELECT, progress=False, rows_per_part=ROWS, engine=eng)
    _same(_outputs(tmp_path / "local"), _outputs(tmp_path / "ray"))


def test_the_engine_and_rows_per_part_are_checked_before_any_work(tiny_paths, tmp_path):
    from mrt_fast import MrtInputError
    from mrt_fast.llm.pipeline import run

    cfg = _cfg(tmp_path, tiny_paths, "out")
    with pytest.raises(MrtInputError, match="engine must be 'local' or 'ray', got 'spark'"):
        run(cfg, progress=False, engine="spark")
    with pytest.raises(MrtInputError, match="rows_per_part must be an integer >= 1, got 0"):
        run(cfg, progress=False, rows_per_part=0)
    assert not (tmp_path / "out").exists()


def test_mrt_run_engine_option_reaches_the_run_and_a_bad_one_is_one_line(tmp_path, monkeypatch):
    import yaml
    from typer.testing import CliRunner

    from mrt_fast.cli import app
    from mrt_fast.llm import pipeline

    seen = {}
    monkeypatch.setattr(pipeline, "run", lambda cfg, **kw: (seen.update(kw), pl.DataFrame())[1])
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"out_dir": "out", "model": "m", "data": {"train_prompts": "t", "eval": "e"}}))
    assert CliRunner().invoke(app, ["run", str(cfg), "--engine", "ray"]).exit_code == 0
    assert seen == {"redo_changed": False, "engine": "ray"}
    monkeypatch.undo()
    r = CliRunner().invoke(app, ["run", str(cfg), "--engine", "spark"])
    assert r.exit_code == 2 and "engine must be 'local' or 'ray', got 'spark'" in r.output
