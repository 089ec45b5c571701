"""Fuzzing what a job's output meets as the input or the target of another: unfinished outputs
read by any reader, outputs that alias an input, ``--overwrite`` over foreign content and links,
and odd object paths.

Every case ends in a result (the finished parts only, when a partial read is asked for) or in one
`MrtInputError` line (CLI: exit 2, one line on stderr) with every file, link and folder as it
was. Small data and few examples (`MRT_FUZZ_EXAMPLES`, as in test_fuzz_api.py, scales them).
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import given, note
from hypothesis import strategies as st
from typer.testing import CliRunner

from mrt_fast.cli import app
from mrt_fast.datasets import Manifest, discover, select_dataset, variance_budget
from mrt_fast.datasets import storage
from mrt_fast.datasets.job import StoppedForTest, stopping_after
from mrt_fast.errors import MrtInputError, PartialOutputWarning

from test_fuzz_api import outcome
from test_fuzz_datasets import cases, snapshot

pytestmark = pytest.mark.filterwarnings("ignore::mrt_fast.SmallPoolWarning")
runner = CliRunner()


def table(n_pools: int, seed: int) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    ids = np.repeat(np.arange(n_pools), rng.integers(2, 5, n_pools))
    return pl.DataFrame({"prompt_id": ids, "prompt": [f"p{i}" for i in ids],
                         "response": [f"r{i}" for i in range(len(ids))], "reward": rng.normal(size=len(ids)),
                         "loss": rng.gamma(2.0, 1.0, len(ids))})


def one_line_cli(r) -> str:
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    err = r.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    return err


# --------------------------------------------------------------------------- unfinished outputs

READERS = ("discover", "glob", "variance_budget", "mrt export", "mrt diagnose", "mrt diagnose --allocate")


@cases(12)
@given(n_parts=st.integers(2, 5), stop=st.integers(1, 4), seed=st.integers(0, 10**6),
       reader=st.sampled_from(READERS), allow=st.booleans(), stray=st.booleans())
def test_an_unfinished_output_is_refused_by_every_reader_or_read_as_its_finished_parts(
        tmp_path_factory, n_parts, stop, seed, reader, allow, stray):
    stop = min(stop, n_parts - 1)
    d = tmp_path_factory.mktemp("unfinished")
    table(12, seed).write_parquet(d / "in.parquet")
    with stopping_after(stop), pytest.raises(StoppedForTest):
        select_dataset(d / "in.parquet", d / "out", 2, "top", parts=n_parts)
    m = Manifest.read(d / "out")
    if stray:  # a complete part file the manifest does not record (a kill between its rename and the record)
        missing = next(f"part-{i:05d}.parquet" for i in range(n_parts) if f"part-{i:05d}.parquet" not in m.parts)
        (d / "out" / missing).write_bytes((d / "in.parquet").read_bytes())
    before = snapshot(d)
    kw = {"allow_partial": True} if allow else {}
    flag = ["--allow-partial"] if allow else []
    note(f"{reader}, {stop} of {n_parts} parts, allow_partial={allow}, stray={stray}")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        if reader.startswith("mrt "):
            args = {"mrt export": ["export", str(d / "out"), str(d / "x.jsonl"), "--plain"],
                    "mrt diagnose": ["diagnose", str(d / "out"), "--n-boot", "0"],
                    "mrt diagnose --allocate": ["diagnose", str(d / "out"), "--n-boot", "0", "--allocate",
                                                str(m.rows), "--allocation", str(d / "al.csv")]}[reader]
            r = runner.invoke(app, args + flag)
            if not allow:
                assert f"unfinished mrt output ({stop} of {n_parts} parts done)" in one_line_cli(r)
            else:
                assert r.exit_code == 0, r.output
                assert f"{stop} of {n_parts} parts done ({m.rows:,} rows)" in r.stderr
            if reader == "mrt export" and allow:
                assert pl.read_ndjson(d / "x.jsonl").height == m.rows
            got = None
        else:
            fn = {"discover": lambda: discover(d / "out", **kw).read(),
                  "glob": lambda: discover(f"{d}/out/*.parquet", **kw).read(),
                  "variance_budget": lambda: variance_budget(str(d / "out"), n_boot=0, **kw)}[reader]
            kind, got = outcome(fn)
            if not allow:
                assert kind == "input_error" and f"({stop} of {n_parts} parts done)" in str(got), (kind, got)
            else:
                assert kind == "ok", got
                assert any(issubclass(w.category, PartialOutputWarning) for w in seen)
    if allow and reader in ("discover", "glob"):
        assert got.height == m.rows  # the recorded parts, never the stray one
    if not allow:
        assert snapshot(d) == before


# --------------------------------------------------------------------------- outputs aliasing inputs

ALIASES = ("same path", "link to it", "through ..", "through a linked folder", "hard link", "folder holding it",
           "inside the input folder")
COMMANDS = ("export", "diagnose --json", "diagnose --allocation", "diagnose --plot", "embed-quality --json",
            "select", "nll", "plan")


@cases(16)
@given(alias=st.sampled_from(ALIASES), command=st.sampled_from(COMMANDS), as_dir=st.booleans(),
       seed=st.integers(0, 10**6))
def test_an_output_aliasing_an_input_is_refused_and_nothing_changes(tmp_path_factory, alias, command, as_dir, seed):
    root = tmp_path_factory.mktemp("alias")
    data = root / "data"
    data.mkdir()
    (data / "sub").mkdir()
    table(8, seed).write_parquet(data / "a.parquet")
    src = data if as_dir else data / "a.parquet"
    os.symlink(data / "a.parquet", root / "link.parquet")
    os.symlink(data, root / "linked")
    os.link(data / "a.parquet", root / "hard.parquet")
    target = {"same path": data / "a.parquet", "link to it": root / "link.parquet",
              "through ..": data / "sub" / ".." / "a.parquet", "through a linked folder": root / "linked" / "a.parquet",
              "hard link": root / "hard.parquet", "folder holding it": root,
              "inside the input folder": data / "sub" / "r.parquet"}[alias]
    if alias == "inside the input folder" and not as_dir:
        target = data  # a file input: its folder holds it
    args = {"export": ["export", src, target],
            "diagnose --json": ["diagnose", src, "--n-boot", "0", "--json", target],
            "diagnose --allocation": ["diagnose", src, "--n-boot", "0", "--allocate", "40", "--allocation", target],
            "diagnose --plot": ["diagnose", src, "--n-boot", "0", "--plot", target],
            "embed-quality --json": ["embed-quality", src, "--json", target],
            "select": ["select", src, target, "--k", "1", "--method", "top"],
            "nll": ["nll", src, target, "--model", root],
            "plan": ["plan", src, target, "--budget", "50"]}[command]
    note(f"{command} {alias} (input a {'folder' if as_dir else 'file'})")
    before = snapshot(root)
    r = runner.invoke(app, [str(a) for a in args])
    one_line_cli(r)
    assert snapshot(root) == before


# --------------------------------------------------------------------------- overwrite over foreign content

INTRUSIONS = ("foreign file", "foreign file in .mrt", "folder named like a part", "folder named _spill",
              "link as a part", ".mrt a link", "link to a folder as _spill", "spill of the job's own",
              "part of the plan not recorded")
OURS = ("spill of the job's own", "part of the plan not recorded")


@cases(12)
@given(intrusion=st.sampled_from(INTRUSIONS), n_parts=st.integers(2, 4), seed=st.integers(0, 10**6),
       unfinished=st.booleans())
def test_overwrite_deletes_only_what_its_manifest_records(tmp_path_factory, intrusion, n_parts, seed, unfinished):
    root = tmp_path_factory.mktemp("overwrite")
    df = table(10, seed)
    df.write_parquet(root / "in.parquet")
    out, outside = root / "out", root / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("keep")
    if unfinished:
        with stopping_after(1), pytest.raises(StoppedForTest):
            select_dataset(root / "in.parquet", out, 2, "top", parts=n_parts)
    else:
        select_dataset(root / "in.parquet", out, 2, "top", parts=n_parts)
    m = Manifest.read(out)
    if intrusion == "foreign file":
        (out / "notes.md").write_text("mine")
    elif intrusion == "foreign file in .mrt":
        (out / ".mrt" / "mine.json").write_text("{}")
    elif intrusion == "folder named like a part":
        (out / f"part-{n_parts + 1:05d}.parquet").mkdir()
        (out / f"part-{n_parts + 1:05d}.parquet" / "x").write_text("mine")
    elif intrusion == "folder named _spill":  # (an unfinished job may hold its own spill there)
        (out / "_spill").mkdir(exist_ok=True)
        (out / "_spill" / "data.csv").write_text("mine")
    elif intrusion == "link as a part":
        name = sorted(n for n in m.parts if m.parts[n])[0]
        (out / name).unlink()
        os.symlink(outside / "precious.txt", out / name)
    elif intrusion == ".mrt a link":
        os.rename(out / ".mrt", outside / "meta")
        os.symlink(outside / "meta", out / ".mrt")
    elif intrusion == "link to a folder as _spill":
        shutil.rmtree(out / "_spill", ignore_errors=True)
        os.symlink(outside, out / "_spill")
    elif intrusion == "spill of the job's own":
        (out / "_spill").mkdir(exist_ok=True)
        (out / "_spill" / "bucket-00000.0.arrow").write_bytes(b"spill")
    elif intrusion == "part of the plan not recorded":
        name = sorted(m.parts)[-1]
        m.parts.pop(name)
        m.done = False
        m.write(out)
    note(f"{intrusion}, {n_parts} parts, unfinished={unfinished}")
    before = snapshot(root)
    kind, got = outcome(lambda: select_dataset(root / "in.parquet", out, 1, "top", parts=2, overwrite=True))
    if intrusion in OURS:
        assert kind == "ok", got
        assert discover(out).read().height == got.n_out_rows
        assert sorted(os.listdir(out)) == [".mrt", "part-00000.parquet", "part-00001.parquet"]
    else:
        assert kind == "input_error", got
        assert snapshot(root) == before
    assert (outside / "precious.txt").read_text() == "keep"


# --------------------------------------------------------------------------- odd object paths

SEGMENTS = st.sampled_from(["a", "b.parquet", "x y", ".", "..", "", "...", ".hidden", "c=1"])


@cases(60)
@given(scheme=st.sampled_from(["s3", "S3", "s3", "S3a"]), bucket=st.sampled_from(["bkt", ""]),
       segments=st.lists(SEGMENTS, max_size=4), slash=st.booleans())
def test_an_object_path_names_one_object_or_is_refused_in_one_line(scheme, bucket, segments, slash):
    url = f"{scheme}://{bucket}" + "".join("/" + s for s in segments) + ("/" if slash else "")
    kind, got = outcome(lambda: storage.is_url(url))
    named = list(segments)
    while named and not named[-1]:  # trailing slashes name the prefix itself
        named.pop()
    odd = scheme != "s3" or not bucket or any(s in ("", ".", "..") for s in named)
    note(f"{url!r}: {kind} {got}")
    assert (kind == "input_error") == odd, (url, kind, got)
    if kind == "ok":
        # what a job locks and what it writes are under one key prefix, spelled one way
        from mrt_fast.datasets.object_lock import lock_url

        prefix = url.rstrip("/")
        assert lock_url(url, directory=True).startswith(prefix + "/")
        assert storage.ObjectPath(url).url == prefix
        assert "/".join(storage.ObjectPath(url).parts) == prefix.split("://", 1)[1]


def test_paths_without_a_scheme_are_local():
    for p in ("a/../b", "./x", Path("s3:") / "x"):
        assert storage.is_url(str(p)) is False
    with pytest.raises(MrtInputError, match="lower case"):
        storage.is_url("S3://bkt/key")
