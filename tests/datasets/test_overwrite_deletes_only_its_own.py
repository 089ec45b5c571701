"""``--overwrite`` deletes only what a manifest records (and the job's own lock and temporary
files), never through a symbolic link: a linked ``.mrt``, user folders named like a job's files,
and foreign files inside ``.mrt/`` are refused, named, with nothing deleted."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import polars as pl
import pytest

from mrt_fast.datasets import Manifest, discover, select_dataset
from mrt_fast.datasets.job import StoppedForTest, stopping_after
from mrt_fast.errors import MrtInputError

pytestmark = pytest.mark.filterwarnings("ignore::mrt_fast.errors.SmallPoolWarning")


def table(n_pools: int = 30) -> pl.DataFrame:
    ids = np.repeat(np.arange(n_pools), 4)
    return pl.DataFrame({"prompt_id": ids, "reward": np.arange(len(ids), dtype=float),
                         "response": [f"r{i}" for i in range(len(ids))]})


def snapshot(*dirs):
    out = {}
    for d in dirs:
        for p in sorted(d.rglob("*")):
            out[str(p)] = ("link", os.readlink(p)) if p.is_symlink() else \
                hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
    return out


@pytest.fixture
def job(tmp_path):
    table().write_parquet(tmp_path / "in.parquet")
    select_dataset(tmp_path / "in.parquet", tmp_path / "out", 2, "top", parts=3)
    return tmp_path / "in.parquet", tmp_path / "out"


def overwrite(inp, out):
    return select_dataset(inp, out, 3, "top", parts=2, overwrite=True)


def test_a_linked_metadata_folder_is_never_followed(job, tmp_path):
    inp, out = job
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    (mine / "manifest.parquet").write_bytes((out / ".mrt" / "manifest.parquet").read_bytes())
    os.rename(out / ".mrt", tmp_path / "old-meta")
    os.symlink(mine, out / ".mrt")
    before = snapshot(tmp_path)
    for ow in (True, False):
        with pytest.raises(MrtInputError, match=r"\.mrt' is a symbolic link"):
            select_dataset(inp, out, 3, "top", parts=2, overwrite=ow)
        assert snapshot(tmp_path) == before


@pytest.mark.parametrize("name", ["_spill", "part-00000.parquet", "part-00009.parquet", "_manifest.json"])
def test_user_folders_named_like_a_jobs_files_are_refused(job, tmp_path, name):
    inp, out = job
    target = out / name
    if target.exists():
        target.unlink()
    target.mkdir()
    (target / "data.txt").write_text("mine")
    before = snapshot(tmp_path)
    with pytest.raises(MrtInputError, match=rf"no mrt job wrote \('{name}.*nothing was deleted"):
        overwrite(inp, out)
    assert snapshot(tmp_path) == before


def test_a_linked_part_is_refused_and_its_target_kept(job, tmp_path):
    inp, out = job
    (tmp_path / "precious.parquet").write_bytes((out / "part-00001.parquet").read_bytes())
    (out / "part-00001.parquet").unlink()
    os.symlink(tmp_path / "precious.parquet", out / "part-00001.parquet")
    before = snapshot(tmp_path)
    with pytest.raises(MrtInputError, match="part-00001.parquet"):
        overwrite(inp, out)
    assert snapshot(tmp_path) == before


def test_foreign_files_in_the_metadata_folder_are_refused(job, tmp_path):
    inp, out = job
    (out / ".mrt" / "notes.txt").write_text("mine")
    before = snapshot(tmp_path)
    with pytest.raises(MrtInputError, match=r"'\.mrt/notes\.txt'"):
        overwrite(inp, out)
    assert snapshot(tmp_path) == before


def test_what_a_job_wrote_is_replaced(job, tmp_path):
    inp, out = job
    # a spill folder of spill files, a part of the plan not yet recorded: the job's own
    (out / "_spill").mkdir()
    (out / "_spill" / "bucket-00001.0.arrow").write_bytes(b"x")
    (out / "_spill" / "_complete").write_text("fp 3")
    m = Manifest.read(out)
    m.parts.pop("part-00002.parquet")  # renamed into place, the kill before the manifest recorded it
    m.write(out)
    rep = overwrite(inp, out)
    assert rep.n_parts == 2
    assert sorted(p.name for p in out.iterdir()) == [".mrt", "part-00000.parquet", "part-00001.parquet"]
    assert discover(out).read().height == rep.n_out_rows


def test_an_overwrite_stopped_midway_leaves_no_output_read_as_complete(job, tmp_path, monkeypatch):
    inp, out = job
    import mrt_fast.datasets.manifest as manifest

    parts = []
    real_unlink = manifest.Path.unlink

    def unlink_then_die(self, missing_ok=False):  # a kill once the first part is deleted
        if self.name.startswith("part-"):
            parts.append(self.name)
            if len(parts) > 1:
                raise KeyboardInterrupt
        return real_unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(manifest.Path, "unlink", unlink_then_die)
    with pytest.raises(KeyboardInterrupt):
        overwrite(inp, out)
    monkeypatch.undo()
    assert (out / "part-00001.parquet").exists() and not (out / "part-00000.parquet").exists()
    with pytest.raises(MrtInputError, match="unfinished mrt output"):
        discover(out)
    rep = overwrite(inp, out)  # a second overwrite finishes the replacement
    assert discover(out).read().height == rep.n_out_rows


def test_an_unfinished_job_is_overwritten(tmp_path):
    table().write_parquet(tmp_path / "in.parquet")
    with stopping_after(1), pytest.raises(StoppedForTest):
        select_dataset(tmp_path / "in.parquet", tmp_path / "out", 2, "top", parts=3)
    rep = overwrite(tmp_path / "in.parquet", tmp_path / "out")
    assert discover(tmp_path / "out").read().height == rep.n_out_rows
