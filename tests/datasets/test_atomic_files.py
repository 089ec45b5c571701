"""Files written by mrt_fast: atomic, the umask's mode, and no temp file outliving its writer."""

import os
import random
import signal
import subprocess
import sys
import time

import polars as pl
import pytest

from mrt_fast import MrtInputError
from mrt_fast.datasets.formats import AtomicWriter, check_output, write_table
from mrt_fast._util.files import host_tag, clean_stale_temps, write_text


def temps(d, name):
    return sorted(p.name for p in d.iterdir() if p.name.startswith(f".{name}.") and p.name.endswith(".tmp"))


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
@pytest.mark.parametrize("suffix", [".parquet", ".csv", ".jsonl", ".json"])
def test_written_files_get_the_umask_mode(tmp_path, umask, suffix):
    old = os.umask(umask)
    try:
        p = tmp_path / f"t{suffix}"
        if suffix == ".json":
            write_text(p, "{}")
        else:
            write_table(pl.DataFrame({"a": [1, 2]}), p)
    finally:
        os.umask(old)
    assert (p.stat().st_mode & 0o777) == (0o666 & ~umask)
    assert temps(tmp_path, p.name) == []


def _sleeper():
    """A live process that is not us (a concurrent writer)."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def _dead_pid():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_stale_temps_of_dead_writers_are_removed_and_nothing_else(tmp_path):
    host = host_tag()
    live = _sleeper()
    try:
        dead = _dead_pid()
        names = {
            "dead": f".out.parquet.{host}-{dead}.0123abcd.tmp",
            "live": f".out.parquet.{host}-{live.pid}.0123abcd.tmp",
            "other_host": f".out.parquet.{host}x-{dead}.0123abcd.tmp",
            "other_file": f".other.parquet.{host}-{dead}.0123abcd.tmp",
            "not_ours": ".out.parquet.abcdefgh.tmp",
            "user_file": "out.parquet.tmp",
        }
        for n in names.values():
            (tmp_path / n).write_bytes(b"x")
        removed = clean_stale_temps(tmp_path / "out.parquet")
        assert [p.name for p in removed] == [names["dead"]]
        left = set(os.listdir(tmp_path))
        assert left == set(names.values()) - {names["dead"]}
        # a write to the destination cleans the same way and leaves its own nothing
        write_table(pl.DataFrame({"a": [1]}), tmp_path / "out.parquet")
        assert set(os.listdir(tmp_path)) == left | {"out.parquet"}
    finally:
        live.kill()
        live.wait()


def test_failed_write_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError):
        with AtomicWriter(tmp_path / "x.parquet") as w:
            w.write(pl.DataFrame({"a": [1]}))
            raise RuntimeError("boom")
    assert os.listdir(tmp_path) == []
    (tmp_path / "d.parquet").mkdir()
    with pytest.raises(MrtInputError, match="is a directory"):
        check_output(tmp_path / "d.parquet")
    check_output(tmp_path / "missing" / "x.parquet")  # made when written, not when checked
    assert os.listdir(tmp_path) == ["d.parquet"]
    (tmp_path / "f.txt").write_text("x")
    with pytest.raises(MrtInputError, match="is not a directory"):
        check_output(tmp_path / "f.txt" / "x" / "y.parquet")


def test_a_write_makes_the_missing_directories(tmp_path):
    with AtomicWriter(tmp_path / "a" / "b" / "x.parquet") as w:
        w.write(pl.DataFrame({"a": [1]}))
        w.commit()
    assert pl.read_parquet(tmp_path / "a" / "b" / "x.parquet")["a"].to_list() == [1]


WRITER = r"""
import sys, time, polars as pl
from mrt_fast.datasets.formats import AtomicWriter
with AtomicWriter(sys.argv[1]) as w:
    for i in range(int(sys.argv[2])):
        w.write(pl.DataFrame({"i": list(range(i * 1000, (i + 1) * 1000))}))
        time.sleep(0.002)
    w.commit()
"""


def _writer(path, chunks):
    return subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(chunks)], env={**os.environ})


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_killed_writer_leaves_old_file_and_next_run_cleans_up(tmp_path, sig):
    out = tmp_path / "out.parquet"
    pl.DataFrame({"i": [-1]}).write_parquet(out)  # the previous result
    rng = random.Random(int(sig))
    for trial in range(3):
        p = _writer(out, 400)
        time.sleep(rng.uniform(0.4, 1.5))
        p.send_signal(sig)
        p.wait()
        # the old file is intact (or, if the writer finished first, the complete new one)
        got = pl.read_parquet(out)["i"].to_list()
        assert got == [-1] or got == list(range(400_000))
    # the rerun completes, and the temps of the killed runs are gone
    assert _writer(out, 3).wait() == 0
    assert pl.read_parquet(out)["i"].to_list() == list(range(3000))
    assert temps(tmp_path, out.name) == []


def test_a_concurrent_writer_keeps_its_temp_file(tmp_path):
    out = tmp_path / "out.parquet"
    slow = _writer(out, 2000)
    try:
        deadline = time.time() + 20
        while not temps(tmp_path, out.name) and time.time() < deadline:
            time.sleep(0.05)
        mine = temps(tmp_path, out.name)
        assert len(mine) == 1 and f"-{slow.pid}." in mine[0]
        write_table(pl.DataFrame({"i": [7]}), out)  # another writer to the same path meanwhile
        assert mine[0] in temps(tmp_path, out.name)
    finally:
        slow.kill()
        slow.wait()


@pytest.mark.train
@pytest.mark.slow
def test_kill_9_mrt_score_at_a_random_point_then_rerun(tmp_path):
    """`mrt score` killed at a random point never leaves a partial output; the rerun is complete and clean."""
    from mrt_fast.llm.testing import CORPUS, save_tiny_models

    paths = save_tiny_models(tmp_path / "models")
    rm = str(paths["reward"])
    n = 48
    pl.DataFrame({"prompt_id": [i // 4 for i in range(n)], "prompt": [CORPUS[i % len(CORPUS)][:40] for i in range(n)],
                  "response": [CORPUS[(3 * i) % len(CORPUS)][-40:] for i in range(n)]}).write_parquet(tmp_path / "in.parquet")
    out = tmp_path / "out" / "scored.parquet"
    out.parent.mkdir()
    cmd = [sys.executable, "-c", "from mrt_fast.cli import app; app()", "score", str(tmp_path / "in.parquet"), str(out),
           "--model", rm, "--batch-size", "8"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    from mrt_fast.llm.reward import score

    ref = score(pl.read_parquet(tmp_path / "in.parquet"), rm, batch_size=8, progress=False)
    rng = random.Random(0)
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(rng.uniform(0.5, 8.0))
    p.send_signal(signal.SIGKILL)
    p.wait()
    if out.exists():  # finished before the kill: complete
        assert pl.read_parquet(out).equals(ref)
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert pl.read_parquet(out).equals(ref)
    assert sorted(os.listdir(out.parent)) == ["scored.parquet"]
