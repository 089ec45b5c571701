"""One dataset job per output: a second job on a live job's output refuses in
one line naming the holder; a dead holder's lock is taken over."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import polars as pl
import pytest

import mrt_fast
from mrt_fast import MrtInputError
from mrt_fast.errors import MrtResourceError
from mrt_fast.datasets.local import select_dataset
from mrt_fast.datasets.lock import LOCK_NAME, JobLock, lock_path, output_lock
from mrt_fast.datasets.manifest import Manifest

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}

HOLD = """
import sys, time
from mrt_fast.datasets.lock import output_lock
with output_lock(sys.argv[1], directory=sys.argv[2] == "dir"):
    print("held", flush=True)
    time.sleep(600)
"""


def hold(out: Path, directory: bool = True) -> subprocess.Popen:
    """A process holding the lock of ``out`` until killed."""
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(out), "dir" if directory else "file"],
                         stdout=subprocess.PIPE, env=ENV)
    assert p.stdout.readline().strip() == b"held"
    return p


def kill9(p: subprocess.Popen) -> None:
    p.send_signal(signal.SIGKILL)
    p.wait()


def make_input(d: Path, n_pools: int = 300, seed: int = 0) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 12, n_pools)
    ids = np.repeat(np.arange(n_pools), sizes)
    df = pl.DataFrame({"prompt_id": ids, "reward": rng.standard_normal(len(ids)).round(3),
                       "embedding": rng.standard_normal((len(ids), 4)).astype(np.float32).tolist()})
    df = df.sample(fraction=1.0, shuffle=True, seed=seed)
    d.mkdir()
    half = df.height // 2
    df[:half].write_parquet(d / "a.parquet")
    df[half:].write_parquet(d / "b.parquet")
    return df


def mrt_select(inp: Path, out: Path, *extra: str, **kw) -> subprocess.Popen | subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "mrt_fast.cli", "select", str(inp), str(out), "--k", "2", *extra]
    return subprocess.run(cmd, env=ENV, capture_output=True, text=True, **kw)


def kept_pools(out: Path) -> set:
    return set(pl.read_parquet(sorted(str(p) for p in out.glob("part-*.parquet")))["prompt_id"].to_list())


def reference(df: pl.DataFrame) -> pl.DataFrame:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return mrt_fast.select(df, 2, "grades")


def test_a_live_holder_is_named_in_one_line_and_a_dead_ones_lock_is_taken_over(tmp_path):
    df = make_input(tmp_path / "in")
    out = tmp_path / "out"
    holder = hold(out)
    try:
        r = mrt_select(tmp_path / "in", out)
        assert r.returncode == 2, r.stderr
        assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: ")
        assert f"pid {holder.pid} on host {socket.gethostname()}" in r.stderr
        assert sorted(os.listdir(out)) == [".mrt"] and os.listdir(out / ".mrt") == [LOCK_NAME]  # the refused job wrote nothing
    finally:
        kill9(holder)
    assert lock_path(out, directory=True).exists()  # what a kill -9 leaves
    r = mrt_select(tmp_path / "in", out)
    assert r.returncode == 0, r.stderr
    assert Manifest.read(out).done and not lock_path(out, directory=True).exists()
    assert kept_pools(out) == set(df["prompt_id"].to_list())
    assert sum(Manifest.read(out).parts.values()) == reference(df).height


def test_a_second_real_job_refuses_and_a_rerun_finishes_a_killed_first(tmp_path):
    df = make_input(tmp_path / "in", n_pools=1500, seed=1)
    full = tmp_path / "full"
    assert mrt_select(tmp_path / "in", full, "--chunk-rows", "800").returncode == 0
    for attempt in range(5):  # the first job must still be running when it is stopped
        out = tmp_path / f"out{attempt}"
        first = subprocess.Popen([sys.executable, "-m", "mrt_fast.cli", "select", str(tmp_path / "in"), str(out),
                                  "--k", "2", "--chunk-rows", "800"], env=ENV, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        while not lock_path(out, directory=True).exists() and first.poll() is None:
            time.sleep(0.001)
        first.send_signal(signal.SIGSTOP)  # alive, holding the lock, mid-job
        if first.poll() is None and lock_path(out, directory=True).exists():
            break
        kill9(first)
    else:
        pytest.fail("the first job always finished before it could be stopped")
    try:
        r = mrt_select(tmp_path / "in", out, "--chunk-rows", "800")
        assert r.returncode == 2 and r.stderr.count("\n") == 1
        assert f"pid {first.pid} on host {socket.gethostname()}" in r.stderr
    finally:
        kill9(first)
    r = mrt_select(tmp_path / "in", out, "--chunk-rows", "800")
    assert r.returncode == 0, r.stderr
    n = Manifest.read(full).n_parts
    assert n > 1 and Manifest.read(out).done and Manifest.read(out).n_parts == n
    for i in range(n):
        name = f"part-{i:05d}.parquet"
        assert (out / name).read_bytes() == (full / name).read_bytes()
    assert kept_pools(out) == set(df["prompt_id"].to_list())


def test_a_file_output_is_locked_beside_it(tmp_path):
    df = make_input(tmp_path / "in", n_pools=40)
    out = tmp_path / "kept.parquet"
    holder = hold(out, directory=False)
    try:
        assert lock_path(out, directory=False).exists()
        with pytest.raises(MrtInputError, match=f"pid {holder.pid} on host"):
            select_dataset(tmp_path / "in", out, 2, "random")
        assert not out.exists()
    finally:
        kill9(holder)
    select_dataset(tmp_path / "in", out, 2, "random")
    assert set(pl.read_parquet(out)["prompt_id"].to_list()) == set(df["prompt_id"].to_list())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "kept.parquet"]  # lock released


RACE = """
import os, sys, time
from pathlib import Path
from mrt_fast.errors import MrtInputError
from mrt_fast.datasets.lock import JobLock
go, stop = Path(sys.argv[2]), Path(sys.argv[3])
while not go.exists():
    time.sleep(0.001)
try:
    lock = JobLock.take(sys.argv[1])
except MrtInputError as e:
    print("refused", e, flush=True)
    sys.exit(0)
print("got", os.getpid(), flush=True)
while not stop.exists():
    time.sleep(0.01)
lock.release()
"""


def test_of_many_processes_taking_over_one_stale_lock_exactly_one_gets_it(tmp_path):
    path = lock_path(tmp_path / "out", directory=True)
    kill9(hold(tmp_path / "out"))
    stale = json.loads(path.read_text())
    go, stop = tmp_path / "go", tmp_path / "stop"
    racers = [subprocess.Popen([sys.executable, "-c", RACE, str(path), str(go), str(stop)], stdout=subprocess.PIPE,
                               text=True, env=ENV) for _ in range(6)]
    time.sleep(1.0)
    go.touch()
    lines = []
    for p in racers:
        lines.append(p.stdout.readline().strip())
    stop.touch()
    for p in racers:
        p.wait()
    got = [ln for ln in lines if ln.startswith("got")]
    assert len(got) == 1, lines
    winner = got[0].split()[1]
    for ln in lines:
        if ln.startswith("refused"):
            assert f"pid {winner} on host" in ln and f"pid {stale['pid']} " not in ln, lines
    assert not path.exists()  # the winner released it


def test_a_lock_of_another_host_is_refused_with_what_to_do(tmp_path):
    path = tmp_path / LOCK_NAME
    path.write_text(json.dumps({"pid": 4242, "host": "elsewhere", "started": 0}))
    with pytest.raises(MrtInputError, match="pid 4242 on host elsewhere.*delete the lock file"):
        JobLock.take(path)
    assert path.exists()


def test_the_lock_is_invisible_to_readers_and_released_on_errors(tmp_path):
    import pyarrow.dataset as pads

    from mrt_fast.datasets.sources import discover

    make_input(tmp_path / "in", n_pools=30)
    out = tmp_path / "out"
    select_dataset(tmp_path / "in", out, 2, "random")
    n = sum(Manifest.read(out).parts.values())
    with output_lock(out, directory=True):
        assert lock_path(out, directory=True).exists()
        assert pads.dataset(out).to_table().num_rows == n
        assert pl.scan_parquet(out / "*.parquet").collect().height == n
        assert all(f.name.startswith("part-") for f in discover(out).files)
    assert not lock_path(out, directory=True).exists()
    # a job that fails on bad input found while it runs releases the lock and leaves no new directory
    bad = tmp_path / "bad"
    bad.mkdir()
    pl.DataFrame({"prompt_id": [1, None, 2], "reward": [0.1, 0.2, 0.3]}).write_parquet(bad / "x.parquet")
    for n_parts in (1, 2):
        with pytest.raises(MrtInputError, match="null prompt id"):
            select_dataset(bad, tmp_path / "new", 1, "top", parts=n_parts)
        assert not (tmp_path / "new").exists()
        with pytest.raises(MrtInputError, match="null prompt id"):
            select_dataset(bad, tmp_path / "new.parquet", 1, "top", parts=n_parts)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["bad", "in", "out"]


def test_without_flock_the_recorded_pid_tells_whether_the_holder_lives(tmp_path, monkeypatch):
    from mrt_fast.datasets import lock as job_lock

    monkeypatch.setattr(job_lock, "_try_flock", lambda fd: None)  # a file system without flock
    path = tmp_path / LOCK_NAME
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        path.write_text(json.dumps({"pid": live.pid, "host": socket.gethostname(), "started": 0}))
        with pytest.raises(MrtInputError, match=f"pid {live.pid} on host"):
            JobLock.take(path)
    finally:
        kill9(live)
    with JobLock.take(path):  # its holder is dead now
        assert json.loads(path.read_text())["pid"] == os.getpid()
    assert not path.exists()


def test_a_full_disk_while_taking_the_lock_says_so_in_one_line(tmp_path, monkeypatch):
    """No room for the lock file: the one line a full disk gets (what, where, the bytes free), nothing left."""
    import errno

    from mrt_fast.datasets import lock as job_lock

    def full(path):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(job_lock, "_new_lock_file", full)
    make_input(tmp_path / "in", n_pools=10)
    for out in (tmp_path / "out", tmp_path / "out.parquet"):
        with pytest.raises(MrtResourceError, match=r"^no space left on device while taking the lock of '.*out(\.parquet)?' "
                                                r"\([\d,]+ bytes free\); free space and rerun the same command"):
            select_dataset(tmp_path / "in", out, 2, "random")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]
