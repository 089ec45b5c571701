"""An unfinished ``mrt`` output (a job stopped before its end) is never read as complete: every
command and Python API that reads a path refuses it in one line naming the parts done, unless
asked for a partial read (``--allow-partial`` / ``allow_partial=True``), which reads the finished
parts only, with a warning giving their parts and rows."""

from __future__ import annotations

import os
import shutil

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from mrt_fast.cli import app
from mrt_fast.datasets import Manifest, discover, select_dataset, variance_budget
from mrt_fast.datasets.job import StoppedForTest, stopping_after
from mrt_fast.errors import MrtInputError, PartialOutputWarning

pytestmark = pytest.mark.filterwarnings("ignore::mrt_fast.errors.SmallPoolWarning")
runner = CliRunner()


def table(n_pools: int = 40, seed: int = 0) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    ids = np.repeat(np.arange(n_pools), 5)
    return pl.DataFrame({"prompt_id": ids, "prompt": [f"p{i}" for i in ids],
                         "response": [f"r{i}" for i in range(len(ids))],
                         "reward": rng.normal(size=len(ids)), "loss": rng.gamma(2.0, 1.0, len(ids))})


@pytest.fixture
def unfinished(tmp_path):
    """A select output stopped after 3 of its 8 parts."""
    table().write_parquet(tmp_path / "in.parquet")
    with stopping_after(3), pytest.raises(StoppedForTest):
        select_dataset(tmp_path / "in.parquet", tmp_path / "out", 3, "top", parts=8)
    m = Manifest.read(tmp_path / "out")
    assert not m.done and len(m.parts) == 3
    return tmp_path / "out"


def one_line_refusal(r, *needles):
    assert r.exit_code == 2, (r.exit_code, r.output)
    err = r.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    for n in needles:
        assert n in err, (n, err)


COMMANDS = {
    "select": ["select", "{src}", "{d}/dest", "--k", "2"],
    "embed": ["embed", "{src}", "{d}/dest"],
    "nll": ["nll", "{src}", "{d}/dest", "--model", "{d}"],
    "score": ["score", "{src}", "{d}/dest", "--model", "{d}"],
    "diagnose": ["diagnose", "{src}", "--n-boot", "0"],
    "diagnose --allocate": ["diagnose", "{src}", "--n-boot", "0", "--allocate", "50"],
    "diagnose --pool-sizes": ["diagnose", "{d}/in.parquet", "--n-boot", "0", "--allocate", "50",
                              "--pool-sizes", "{src}"],
    "export": ["export", "{src}", "{d}/dest.jsonl", "--plain"],
    "embed-quality": ["embed-quality", "{src}"],
    "answers": ["answers", "{src}", "{d}/dest"],
}


@pytest.mark.parametrize("how", ["directory", "glob", "parent directory"])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_refuses_an_unfinished_output(unfinished, command, how):
    d = unfinished.parent
    src = {"directory": str(unfinished), "glob": f"{unfinished}/*.parquet", "parent directory": str(d / "runs")}[how]
    if how == "parent directory":
        (d / "runs").mkdir()
        shutil.move(unfinished, d / "runs" / "out")
    before = sorted(os.listdir(d))
    r = runner.invoke(app, [a.format(src=src, d=d) for a in COMMANDS[command]])
    one_line_refusal(r, "is an unfinished mrt output (3 of 8 parts done)", "--allow-partial")
    assert sorted(os.listdir(d)) == before  # nothing written


def test_allow_partial_reads_the_finished_parts_with_a_warning(unfinished):
    d = unfinished.parent
    rows = Manifest.read(unfinished).rows
    r = runner.invoke(app, ["export", str(unfinished), str(d / "x.jsonl"), "--plain", "--allow-partial"])
    assert r.exit_code == 0, r.output
    assert "warning:" in r.stderr and "3 of 8 parts done" in r.stderr and f"{rows:,} rows" in r.stderr
    assert pl.read_ndjson(d / "x.jsonl").height == rows
    r = runner.invoke(app, ["diagnose", str(unfinished), "--n-boot", "0", "--allow-partial"])
    assert r.exit_code == 0, r.output
    assert "3 of 8 parts done" in r.stderr


def test_python_apis_refuse_it_and_read_it_when_allowed(unfinished):
    d = unfinished.parent
    m = Manifest.read(unfinished)
    for call in (lambda **kw: discover(unfinished, **kw),
                 lambda **kw: select_dataset(unfinished, d / "sel", 2, "top", **kw),
                 lambda **kw: variance_budget(str(unfinished), n_boot=0, **kw)):
        with pytest.raises(MrtInputError, match=r"unfinished mrt output \(3 of 8 parts done\)"):
            call()
        assert not (d / "sel").exists()
    with pytest.warns(PartialOutputWarning, match=rf"3 of 8 parts done \({m.rows:,} rows\)"):
        got = discover(unfinished, allow_partial=True).read()
    recorded = pl.concat([pl.read_parquet(unfinished / n) for n in sorted(m.parts) if m.parts[n]])
    assert got.equals(recorded)
    with pytest.warns(PartialOutputWarning):
        rep = variance_budget(str(unfinished), n_boot=0, allow_partial=True)
    assert rep.n_rows == m.rows


@pytest.mark.parametrize("api", ["embed_dataset", "nll_dataset", "score_dataset", "sample_pools"])
def test_the_model_stages_refuse_it_before_any_model_loads(unfinished, api):
    d = unfinished.parent
    if api == "embed_dataset":
        from mrt_fast.embeddings.dataset import embed_dataset as f
        call = lambda: f(unfinished, d / "dest", model="no-such-model")  # noqa: E731
    elif api == "sample_pools":
        from mrt_fast.embeddings.quality import sample_pools as f
        call = lambda: f(str(unfinished))  # noqa: E731
    else:
        from mrt_fast.llm import dataset_stages
        f = getattr(dataset_stages, api)
        call = lambda: f(unfinished, d / "dest", "no-such-model")  # noqa: E731
    with pytest.raises(MrtInputError, match=r"unfinished mrt output \(3 of 8 parts done\)"):
        call()
    assert not (d / "dest").exists()


def test_only_recorded_parts_are_read(unfinished):
    m = Manifest.read(unfinished)
    # a part file renamed into place just before a kill, not yet in the manifest: not read
    stray = next(f"part-{i:05d}.parquet" for i in range(8) if f"part-{i:05d}.parquet" not in m.parts)
    shutil.copy(unfinished / sorted(n for n in m.parts if m.parts[n])[0], unfinished / stray)
    with pytest.warns(PartialOutputWarning):
        assert discover(unfinished, allow_partial=True).read().height == m.rows


def test_a_finished_output_missing_a_recorded_part_is_refused(tmp_path):
    table().write_parquet(tmp_path / "in.parquet")
    select_dataset(tmp_path / "in.parquet", tmp_path / "out", 3, "top", parts=4)
    assert discover(tmp_path / "out").read().height == Manifest.read(tmp_path / "out").rows
    (tmp_path / "out" / "part-00002.parquet").unlink()
    with pytest.raises(MrtInputError, match="missing 1 of its recorded parts.*part-00002"):
        discover(tmp_path / "out")
    r = runner.invoke(app, ["export", str(tmp_path / "out"), str(tmp_path / "x.jsonl")])
    one_line_refusal(r, "part-00002.parquet")
