"""mrt run reuses an output only when it was made with the current settings: a changed setting is
refused in one line before any work, or redone (with what depends on it) on request."""

from __future__ import annotations

import json

import polars as pl
import pytest

from mrt_fast import MrtInputError

pytestmark = [pytest.mark.train, pytest.mark.usefixtures("torch_one_thread")]


@pytest.fixture
def trained(monkeypatch):
    """The run directories trained, in order."""
    import mrt_fast.llm.train as train_mod

    seen = []
    real = train_mod.train
    monkeypatch.setattr(train_mod, "train", lambda data, model, out, *a, **kw: (seen.append(out.name),
                                                                               real(data, model, out, *a, **kw))[1])
    return seen


def _cfg(tmp_path, tiny_paths, methods=("random", "grades"), ks=(1,), **select):
    from mrt_fast.llm.testing import tiny_prompt_table

    tiny_prompt_table(3, with_reference=False).write_ndjson(tmp_path / "train.jsonl")
    tiny_prompt_table(3, offset=5).write_ndjson(tmp_path / "eval.jsonl")
    return {"out_dir": str(tmp_path / "out"), "model": str(tiny_paths["lm"]), "reward_model": str(tiny_paths["reward"]),
            "embedder": "hashing", "data": {"train_prompts": str(tmp_path / "train.jsonl"),
                                             "eval": str(tmp_path / "eval.jsonl")},
            "generate": {"n": 3, "max_new_tokens": 4}, "select": {"methods": list(methods), "ks": list(ks), **select},
            "train": {"max_steps": 1}, "evaluate": {"n_samples": 2, "max_new_tokens": 4}, "threads": 1,
            "baseline": False}


def _files(out):
    return {str(p.relative_to(out)): p.stat().st_mtime_ns for p in sorted(out.rglob("*")) if p.is_file()}


def _kept(out, cell):
    from mrt_fast.llm.cells import kept_key

    return kept_key(pl.read_parquet(out / "select" / f"{cell}.parquet"))


def test_a_changed_selection_setting_is_refused_then_redone_for_its_cells_only(tiny_paths, tmp_path, trained,
                                                                                capsys):
    """A selection made again trains its cell again only when it keeps other rows: the trained cell
    is keyed by the content of its kept rows and the training settings."""
    from mrt_fast.llm.pipeline import run

    cfg = _cfg(tmp_path, tiny_paths)
    run(cfg, progress=False)
    out = tmp_path / "out"
    assert sorted(trained) == ["grades_k1", "random_k1"] and (out / ".mrt" / "stages.json").exists()
    before = _files(out)
    trained.clear()
    again = run(cfg, progress=False)  # nothing changed: everything reused
    assert trained == [] and again["cell"].to_list() == ["reused", "reused"]
    assert {k: v for k, v in _files(out).items() if k.startswith(("select", "runs", "cand", "emb", "scored"))} == \
        {k: v for k, v in before.items() if k.startswith(("select", "runs", "cand", "emb", "scored"))}
    cfg["select"]["alpha"] = 0.25
    before = _files(out)
    with pytest.raises(MrtInputError) as e:
        run(cfg, progress=False)
    msg = str(e.value)
    assert "\n" not in msg and str(out) in msg and "select/grades_k1" in msg and "alpha 0.75 -> 0.25" in msg
    assert "random_k1" not in msg and "--redo-changed" in msg
    assert _files(out) == before and trained == []  # nothing written, nothing trained
    # narrowing the grid is no change: grades_k1 lies outside it, kept as it is and not reported
    narrow = {**cfg, "select": {**cfg["select"], "methods": ["random"]}}
    res = run(narrow, progress=True)
    assert trained == [] and res["method"].to_list() == ["random"] and _files(out) == {
        **before, **{k: v for k, v in _files(out).items() if k.startswith(("results", ".mrt", "config"))}}
    assert "1 cell outside the grid kept, not reported" in capsys.readouterr().err
    kept = _kept(out, "grades_k1")
    run(cfg, progress=False, redo_changed=True)
    assert _kept(out, "grades_k1") == kept  # alpha 0.25 keeps the same row of each pool here ...
    assert trained == []  # ... so its trained model and its metrics are reused; random does not read alpha
    after = _files(out)
    assert after["select/grades_k1.parquet"] != before["select/grades_k1.parquet"]  # selected again
    for f in ("runs/random_k1/adapter/adapter_config.json", "runs/random_k1/metrics.json",
              "runs/grades_k1/adapter/adapter_config.json", "runs/grades_k1/metrics.json",
              "select/random_k1.parquet", "candidates.parquet", "scored.parquet"):
        assert after[f] == before[f]
    rec = json.loads((out / ".mrt" / "stages.json").read_text())["stages"]
    assert rec["select/grades_k1"]["settings"]["alpha"] == 0.25 and "alpha" not in rec["select/random_k1"]["settings"]
    # a selection that keeps other rows trains its cell again
    kept = _kept(out, "random_k1")
    cfg["select"]["seed"] = 3
    run(cfg, progress=False, redo_changed=True)
    assert _kept(out, "random_k1") != kept and trained == ["random_k1"]
    assert _files(out)["runs/random_k1/metrics.json"] != after["runs/random_k1/metrics.json"]


def test_a_changed_train_setting_redoes_every_trained_cell_and_adding_a_k_runs_only_it(tiny_paths, tmp_path,
                                                                                         trained):
    from mrt_fast.llm.pipeline import run

    cfg = _cfg(tmp_path, tiny_paths, methods=("random",))
    run(cfg, progress=False)
    out = tmp_path / "out"
    cfg["select"]["ks"] = [1, 2]  # a new cell is no change of the existing one
    trained.clear()
    res = run(cfg, progress=False)
    assert trained == ["random_k2"] and res["cell"].to_list() == ["reused", "new"]
    before = _files(out)
    cfg["train"]["max_steps"] = 2
    with pytest.raises(MrtInputError, match=r"train/random_k1 \(train\.max_steps 1 -> 2\)"):
        run(cfg, progress=False)
    cfg["select"]["ks"] = [2]  # random_k1 is outside the grid now: left as it is, not redone, not reported
    trained.clear()
    res = run(cfg, progress=False, redo_changed=True)
    assert trained == ["random_k2"] and res["cell"].to_list() == ["new"] and res["K"].to_list() == [2]
    after = _files(out)
    assert all(after[f] == before[f] for f in before if f.startswith(("runs/random_k1/", "select/random_k1")))
    for f in ("candidates.parquet", "embedded.parquet", "scored.parquet", "select/random_k2.parquet"):
        assert after[f] == before[f]


def test_an_out_dir_without_records_is_refused_then_redone(tiny_paths, tmp_path, trained):
    from mrt_fast.llm.pipeline import run

    cfg = _cfg(tmp_path, tiny_paths, methods=("random",))
    run(cfg, progress=False)
    out = tmp_path / "out"
    (out / ".mrt" / "stages.json").unlink()
    before = _files(out)
    with pytest.raises(MrtInputError, match="made without a record of its settings") as e:
        run(cfg, progress=False)
    assert "\n" not in str(e.value) and "its generate, embed, score and" in str(e.value) and _files(out) == before
    trained.clear()
    run(cfg, progress=False, redo_changed=True)
    assert trained == ["random_k1"] and (out / ".mrt" / "stages.json").exists()


def test_a_selection_lost_before_it_was_made_again_is_made_again_and_its_model_reused(tiny_paths, tmp_path,
                                                                                        trained):
    """--redo-changed deletes a changed selection first; stopped right then, the next run selects
    again and keeps the trained cell when the rows are the same."""
    from mrt_fast.llm.pipeline import run

    cfg = _cfg(tmp_path, tiny_paths, methods=("random",))
    run(cfg, progress=False)
    out = tmp_path / "out"
    before = _files(out)
    (out / "select" / "random_k1.parquet").unlink()
    trained.clear()
    res = run(cfg, progress=False)
    assert trained == [] and res["cell"].to_list() == ["reused"]
    assert _files(out)["runs/random_k1/metrics.json"] == before["runs/random_k1/metrics.json"]


def test_a_changed_data_file_is_refused_and_names_the_stage(tiny_paths, tmp_path):
    from mrt_fast.llm.pipeline import run
    from mrt_fast.llm.testing import tiny_prompt_table

    cfg = _cfg(tmp_path, tiny_paths, methods=("random",))
    run(cfg, progress=False)
    tiny_prompt_table(2, offset=5).write_ndjson(tmp_path / "eval2.jsonl")
    cfg["data"]["eval"] = str(tmp_path / "eval2.jsonl")
    with pytest.raises(MrtInputError, match=r"evaluate/random_k1 \(eval_data"):
        run(cfg, progress=False)


def test_another_model_saved_at_the_same_path_is_a_change(tmp_path):
    from mrt_fast.llm.pipeline import run
    from mrt_fast.llm.testing import save_tiny_models

    paths = save_tiny_models(tmp_path / "models", seed=0)
    cfg = _cfg(tmp_path, paths, methods=("random",))
    run(cfg, progress=False)
    run(cfg, progress=False)  # the same files: everything reused, nothing refused
    save_tiny_models(tmp_path / "models", seed=1)  # other weights under the same path
    with pytest.raises(MrtInputError, match=r"generate \(model: its files changed\)"):
        run(cfg, progress=False)


def test_the_cli_refuses_in_one_line_with_exit_2_and_redoes_with_redo_changed(tiny_paths, tmp_path, trained):
    import yaml
    from typer.testing import CliRunner

    from mrt_fast.cli import app
    from mrt_fast.llm.pipeline import run

    cfg = _cfg(tmp_path, tiny_paths, methods=("grades",))
    run(cfg, progress=False)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    trained.clear()
    r = CliRunner().invoke(app, ["run", str(tmp_path / "c.yaml"), "--set", "select.kernel=shift"])
    err = r.stderr.strip()
    assert r.exit_code == 2 and len(err.splitlines()) == 1 and "kernel 'clip' -> 'shift'" in err, err
    assert "Traceback" not in r.output and trained == []
    kept = _kept(tmp_path / "out", "grades_k1")
    r = CliRunner().invoke(app, ["run", str(tmp_path / "c.yaml"), "--set", "select.kernel=shift", "--redo-changed"])
    assert r.exit_code == 0, r.output
    assert trained == ([] if _kept(tmp_path / "out", "grades_k1") == kept else ["grades_k1"])


def test_identical_cells_are_reused_on_a_rerun_and_follow_their_twin(tiny_paths, tmp_path, trained):
    """K = the pool size: grades evaluates random's model; a rerun reuses both, and a change of random's
    selection that keeps the same rows (every row, at K = the pool size) trains nothing again."""
    from mrt_fast.llm.pipeline import run

    cfg = _cfg(tmp_path, tiny_paths, ks=(3,))
    run(cfg, progress=False)
    assert trained == ["random_k3"]
    trained.clear()
    res = run(cfg, progress=False)
    assert trained == [] and res["same_as"].to_list() == [None, "random_k3"]
    out = tmp_path / "out"
    before = _files(out)
    cfg["select"]["seed"] = 5  # read by random only
    with pytest.raises(MrtInputError, match=r"select/random_k3 \(seed 0 -> 5\)"):
        run(cfg, progress=False)
    res = run(cfg, progress=False, redo_changed=True)
    after = _files(out)
    assert trained == [] and after["select/grades_k3.parquet"] == before["select/grades_k3.parquet"]
    assert after["select/random_k3.parquet"] != before["select/random_k3.parquet"]
    for f in ("runs/random_k3/metrics.json", "runs/random_k3/adapter/adapter_config.json", "runs/grades_k3/metrics.json"):
        assert after[f] == before[f]
    assert res["same_as"].to_list() == [None, "random_k3"]


HOOK = "def reward(rows):\n    return [{scale} * len(r) for r in rows['response'].to_list()]\n"


def test_a_reward_hook_is_recorded_by_its_code(tiny_paths, tmp_path, monkeypatch):
    """The hook's file and source are its record: an edit is a change; a hook whose code cannot be
    read (made by exec) has no fingerprint, and what was made with it is never reused."""
    from mrt_fast.llm.pipeline import run

    (tmp_path / "myhook.py").write_text(HOOK.format(scale=1.0))
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = _cfg(tmp_path, tiny_paths, methods=("top",))
    cfg.pop("reward_model")
    cfg["reward_fn"] = "myhook:reward"
    stages = ("generate", "embed", "score", "select")
    run(cfg, progress=False, stages=stages)
    run(cfg, progress=False, stages=stages)  # the same code: reused
    (tmp_path / "myhook.py").write_text(HOOK.format(scale=-1.0))
    with pytest.raises(MrtInputError, match=r"score \(reward_fn 'myhook:reward': its code changed\)") as e:
        run(cfg, progress=False, stages=stages)
    assert "\n" not in str(e.value)
    ns: dict = {}
    exec(HOOK.format(scale=1.0), ns)  # noqa: S102 - a hook with neither a file nor a source
    run(cfg, reward_fn=ns["reward"], progress=False, stages=stages, redo_changed=True)
    with pytest.raises(MrtInputError, match=r"score \(reward_fn .* has no fingerprint of its code .*--redo-changed"):
        run(cfg, reward_fn=ns["reward"], progress=False, stages=stages)
    scored = _files(tmp_path / "out")["scored.parquet"]
    run(cfg, reward_fn=ns["reward"], progress=False, stages=stages, redo_changed=True)
    assert _files(tmp_path / "out")["scored.parquet"] != scored  # made again, not reused
