"""mrt run writes only into its own out_dir (``.mrt/stages.json``), an empty one or a new one: a
folder holding other files, the root folder and the home folder are refused in one line before
anything is read or written."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mrt_fast import MrtInputError
from mrt_fast.llm.run_dir import STAGE_OUTPUTS, WRITTEN, check_out_dir


def _cfg(tmp_path, out):
    for name in ("train.jsonl", "eval.jsonl"):
        (tmp_path / name).write_text('{"prompt_id": 1, "prompt": "p", "reference": "r"}\n')
    return {"out_dir": str(out), "model": str(tmp_path / "no-model"), "embedder": "hashing",
            "data": {"train_prompts": str(tmp_path / "train.jsonl"), "eval": str(tmp_path / "eval.jsonl")},
            "select": {"methods": ["random"], "ks": [1]}}


def _tree(d):
    return sorted(str(p.relative_to(d)) for p in d.rglob("*"))


@pytest.mark.parametrize("where", ["root", "home", "cwd", "foreign"])
def test_an_out_dir_mrt_run_did_not_make_is_refused_before_any_work(tmp_path, monkeypatch, where):
    from mrt_fast.llm import pipeline
    from mrt_fast.llm.pipeline import run

    def past_the_check(*a, **kw):  # nothing of the run may happen in such a folder (the root included)
        raise AssertionError("the run went on past the out_dir check")

    monkeypatch.setattr(pipeline.StagePlan, "check", past_the_check)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my own file")
    (mine / "config.json").write_text("{}")
    (mine / "results.csv").write_text("a,b\n")
    monkeypatch.chdir(mine)
    out = {"root": "/", "home": str(home), "cwd": ".", "foreign": str(mine)}[where]
    before = _tree(mine), (mine / "config.json").read_text()
    with pytest.raises(MrtInputError) as e:
        run(_cfg(tmp_path, out), progress=False)
    msg = str(e.value)
    assert "\n" not in msg and "new or empty folder" in msg, msg
    assert {"root": "root folder", "home": "home folder", "cwd": "'notes.txt'", "foreign": "'notes.txt'"}[where] in msg
    assert (_tree(mine), (mine / "config.json").read_text()) == before and not (home / ".mrt").exists()


def test_only_an_out_dir_of_mrt_run_or_an_empty_one_passes(tmp_path):
    from mrt_fast.llm import stage_records as sr
    from mrt_fast.llm.run_dir import check_out_dir

    check_out_dir(tmp_path / "new" / "deeper", sr.RECORDS)
    (tmp_path / "empty").mkdir()
    check_out_dir(tmp_path / "empty", sr.RECORDS)
    ours = tmp_path / "ours"
    (ours / ".mrt").mkdir(parents=True)
    (ours / "notes.txt").write_text("added by hand")
    (ours / sr.RECORDS).write_text('{"version": 1, "stages": {}}')
    check_out_dir(ours, sr.RECORDS)  # the marker: whatever else it holds is the user's own addition
    old = tmp_path / "old"
    (old / "runs").mkdir(parents=True)
    (old / "candidates.parquet").write_bytes(b"")
    check_out_dir(old, sr.RECORDS)  # only names mrt run writes: the records check decides
    (old / "x.txt").write_text("")
    with pytest.raises(MrtInputError, match="holds 'x.txt'"):
        check_out_dir(old, sr.RECORDS)
    f = tmp_path / "file"
    f.write_text("")
    with pytest.raises(MrtInputError, match="is not a folder"):
        check_out_dir(f, sr.RECORDS)


@pytest.mark.parametrize("held", [("config.json",), ("results.csv", "results.md"), ("config.json", "results.png"),
                                  (".mrt",)])
def test_a_folder_of_only_config_or_results_files_is_not_taken_for_an_old_out_dir(tmp_path, monkeypatch, held):
    """Names mrt run writes at the top, but no output of a stage: a user's own folder (its config.json
    and results.* are not mrt run's to replace), refused before anything is written."""
    from mrt_fast.llm import pipeline
    from mrt_fast.llm.pipeline import run

    monkeypatch.setattr(pipeline.StagePlan, "check", lambda *a, **kw: pytest.fail("the run went on past the check"))
    mine = tmp_path / "mine"
    mine.mkdir()
    for name in held:
        if name == ".mrt":
            (mine / name).mkdir()
        else:
            (mine / name).write_text(f"my own {name}")
    before = _tree(mine), {n: (mine / n).read_text() for n in held if n != ".mrt"}
    with pytest.raises(MrtInputError, match="no output of a stage") as e:
        run(_cfg(tmp_path, mine), progress=False)
    assert "\n" not in str(e.value) and "new or empty folder" in str(e.value) and repr(held[0]) in str(e.value)
    assert (_tree(mine), {n: (mine / n).read_text() for n in held if n != ".mrt"}) == before


#: what a folder may hold: names mrt run writes, a user's own, a temporary file of an atomic write
NAMES = sorted(WRITTEN) + ["notes.txt", "data.parquet", "config.yaml", "results.json", "runs.bak",
                           ".config.json.host-12.0123abcd.tmp"]


@settings(max_examples=60, deadline=None)
@given(names=st.sets(st.sampled_from(NAMES), max_size=6), marker=st.booleans())
def test_a_folder_passes_only_as_mrt_runs_own_or_empty(tmp_path_factory, names, marker):
    """Drawn folder contents: the check passes a folder with the marker, an empty one, or one holding
    only names mrt run writes with a stage's output among them; anything else is one line."""
    from mrt_fast.llm import stage_records as sr
    out = tmp_path_factory.mktemp("out")
    for n in names:
        (out / n).mkdir() if "." not in n.strip(".") else (out / n).write_text("x")
    if marker:
        (out / sr.RECORDS).parent.mkdir(exist_ok=True)
        (out / sr.RECORDS).write_text('{"version": 1, "stages": {}}')
    shown = {n for n in names if not n.endswith(".tmp")} | ({".mrt"} if marker else set())
    ok = marker or not shown or (shown <= WRITTEN and bool(shown & STAGE_OUTPUTS))
    try:
        check_out_dir(out, sr.RECORDS)
    except MrtInputError as e:
        assert not ok and "\n" not in str(e) and "new or empty folder" in str(e), (names, marker, str(e))
    else:
        assert ok, (names, marker)
