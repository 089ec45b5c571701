"""Inputs and outputs on object storage (``s3://``), against a real S3-compatible server
(moto's server mode, started here on 127.0.0.1): both engines, resume, the lock, overwrite."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("moto.server")
boto3 = pytest.importorskip("boto3")

import mrt_fast  # noqa: E402
from mrt_fast import MrtInputError  # noqa: E402
from mrt_fast.datasets import Manifest, discover, select_dataset  # noqa: E402
from mrt_fast.datasets import storage  # noqa: E402
from mrt_fast.datasets.job import StoppedForTest, stopping_after  # noqa: E402
from mrt_fast.datasets.object_lock import object_lock  # noqa: E402

pytestmark = [pytest.mark.s3, pytest.mark.filterwarnings("ignore::mrt_fast.errors.SmallPoolWarning")]

_n = iter(range(10**6))  # bucket names of the property test


def rows(n_pools: int, seed: int, d: int = 4, shuffled: bool = False) -> pl.DataFrame:
    """Pools of 1-6 rows, every pool's rows together (a job reads them in place), or ``shuffled``
    (a job exchanges them)."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 7, n_pools)
    n = int(sizes.sum())
    df = pl.DataFrame({
        "prompt_id": np.repeat(np.arange(n_pools), sizes),
        "response": [f"r{i}" for i in range(n)],
        "reward": rng.normal(size=n),
    }).with_columns(pl.Series("embedding", rng.normal(size=(n, d)).astype(np.float32), dtype=pl.List(pl.Float32)))
    return df.sample(fraction=1.0, shuffle=True, seed=seed) if shuffled else df


def put_table(df: pl.DataFrame, url: str) -> None:
    buf = io.BytesIO()
    df.write_parquet(buf) if url.endswith(".parquet") else df.write_ndjson(buf)
    storage.write_bytes(url, buf.getvalue())


def put_files(df: pl.DataFrame, prefix: str, n: int) -> None:
    for j, cut in enumerate(np.array_split(np.arange(df.height), n)):
        put_table(df[int(cut[0]):int(cut[-1]) + 1], f"{prefix}/f{j}.parquet")


def keys(url: str) -> list[str]:
    return [str(o.relative_to(url)) for o in storage.list_files(url)]


def read_output(url: str, **kw) -> pl.DataFrame:
    return discover(url, **kw).read().sort(["prompt_id", "pick_rank"])


def expected(df: pl.DataFrame, k: int = 2) -> pl.DataFrame:
    return mrt_fast.select(df, k, "grades").sort(["prompt_id", "pick_rank"])


@pytest.mark.parametrize("shuffled", [False, True])
def test_select_from_and_to_s3_equals_the_in_memory_result(s3_bucket, shuffled):
    df = rows(40, 1, shuffled=shuffled)
    put_files(df, f"{s3_bucket}/in", 3)
    rep = select_dataset(f"{s3_bucket}/in", f"{s3_bucket}/out", 2, "grades", parts=4)
    assert rep.n_parts == 4 and not rep.resumed and rep.in_place != shuffled and rep.spilled == shuffled
    assert read_output(f"{s3_bucket}/out").equals(expected(df))
    m = Manifest.read(f"{s3_bucket}/out")
    assert m.done and set(m.files) == {n for n, r in m.parts.items() if r}
    # nothing but the recorded parts and the manifest: no lock, no spill, no temporary object left
    assert sorted(keys(f"{s3_bucket}/out")) == sorted([*m.files.values(), ".mrt/manifest.parquet"])
    # a rerun of the finished job does nothing
    assert select_dataset(f"{s3_bucket}/in", f"{s3_bucket}/out", 2, "grades", parts=4).already_done


def test_a_file_output_on_s3_is_written_whole(s3_bucket, tmp_path):
    df = rows(20, 2)
    df.write_parquet(tmp_path / "in.parquet")
    select_dataset(tmp_path / "in.parquet", f"{s3_bucket}/kept.parquet", 2, "grades")
    got = pl.read_parquet(io.BytesIO(storage.read_bytes(f"{s3_bucket}/kept.parquet")))
    assert got.sort(["prompt_id", "pick_rank"]).equals(expected(df))
    assert keys(s3_bucket) == ["kept.parquet"]


def test_resume_on_s3_after_a_stop_loses_and_duplicates_no_row(s3_bucket):
    df = rows(60, 3)
    put_files(df, f"{s3_bucket}/in", 2)
    with stopping_after(2), pytest.raises(StoppedForTest):
        select_dataset(f"{s3_bucket}/in", f"{s3_bucket}/out", 2, "grades", parts=5)
    m = Manifest.read(f"{s3_bucket}/out")
    assert not m.done and len(m.parts) == 2
    # what a kill between a part's upload and the manifest leaves: an object no manifest records
    stray = "part-00004-" + "0" * 32 + ".parquet"
    storage.write_bytes(f"{s3_bucket}/out/{stray}", b"not a part")
    with pytest.raises(MrtInputError, match=r"unfinished mrt output \(2 of 5 parts done\)"):
        read_output(f"{s3_bucket}/out")
    with pytest.warns(mrt_fast.errors.PartialOutputWarning, match="2 of 5 parts done"):
        assert read_output(f"{s3_bucket}/out", allow_partial=True).height == sum(m.parts.values())  # stray ignored
    rep = select_dataset(f"{s3_bucket}/in", f"{s3_bucket}/out", 2, "grades", parts=5)
    assert rep.resumed and rep.parts_done_now == 3
    got = read_output(f"{s3_bucket}/out")
    assert got.equals(expected(df))
    assert got.select("prompt_id", "response").is_duplicated().sum() == 0
    assert stray not in keys(f"{s3_bucket}/out")


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.integers(2, 5), stop=st.integers(1, 4), seed=st.integers(0, 1000), n_files=st.integers(1, 3),
       shuffled=st.booleans())
def test_stopped_after_any_part_a_rerun_on_s3_gives_the_in_memory_result(s3_endpoint, parts, stop, seed, n_files,
                                                                         shuffled):
    stop = min(stop, parts - 1)
    name = f"mrt-prop-{next(_n)}"
    boto3.client("s3").create_bucket(Bucket=name)
    b = f"s3://{name}"
    df = rows(25, seed, shuffled=shuffled)
    put_files(df, f"{b}/in", n_files)
    with stopping_after(stop), pytest.raises(StoppedForTest):
        select_dataset(f"{b}/in", f"{b}/out", 2, "grades", parts=parts)
    rep = select_dataset(f"{b}/in", f"{b}/out", 2, "grades", parts=parts)
    assert rep.resumed
    got = read_output(f"{b}/out")
    assert got.equals(expected(df))
    assert got.select("prompt_id", "response").is_duplicated().sum() == 0


def test_a_part_lost_from_s3_is_redone(s3_bucket):
    df = rows(30, 4)
    put_table(df, f"{s3_bucket}/in.parquet")
    select_dataset(f"{s3_bucket}/in.parquet", f"{s3_bucket}/out", 2, "grades", parts=3)
    m = Manifest.read(f"{s3_bucket}/out")
    lost = sorted(m.files.values())[0]
    storage.delete([f"{s3_bucket}/out/{lost}"])
    rep = select_dataset(f"{s3_bucket}/in.parquet", f"{s3_bucket}/out", 2, "grades", parts=3)
    assert rep.resumed and rep.parts_done_now == 1
    assert read_output(f"{s3_bucket}/out").equals(expected(df))


def test_a_second_job_on_the_same_s3_output_is_refused_in_one_line(s3_bucket):
    df = rows(10, 5)
    put_table(df, f"{s3_bucket}/in.parquet")
    lock = f"{s3_bucket}/out/.mrt/lock"
    with object_lock(lock, "output"):
        with pytest.raises(MrtInputError) as e:
            select_dataset(f"{s3_bucket}/in.parquet", f"{s3_bucket}/out", 2, "grades")
        assert "in use by another job" in str(e.value) and str(os.getpid()) in str(e.value)
        assert "\n" not in str(e.value)
        with pytest.raises(MrtInputError):  # the conditional write: only one taker ever wins
            with object_lock(lock, "output"):
                pass
    assert ".mrt/lock" not in keys(f"{s3_bucket}/out")  # released
    select_dataset(f"{s3_bucket}/in.parquet", f"{s3_bucket}/out", 2, "grades")


def test_a_dead_holders_lock_on_s3_is_taken_over(s3_bucket):
    df = rows(10, 6)
    put_table(df, f"{s3_bucket}/in.parquet")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    import json
    import socket

    storage.write_bytes(f"{s3_bucket}/out/.mrt/lock", json.dumps({"pid": dead.pid, "host": socket.gethostname(),
                                                                "started": 0}).encode())
    select_dataset(f"{s3_bucket}/in.parquet", f"{s3_bucket}/out", 2, "grades")
    assert read_output(f"{s3_bucket}/out").equals(expected(df))
    # a lock of another host is never taken over (its holder cannot be probed from here)
    storage.write_bytes(f"{s3_bucket}/o2/.mrt/lock", json.dumps({"pid": 1, "host": "elsewhere"}).encode())
    with pytest.raises(MrtInputError, match="delete the lock"):
        select_dataset(f"{s3_bucket}/in.parquet", f"{s3_bucket}/o2", 2, "grades")


def test_overwrite_on_s3_deletes_only_what_a_job_wrote(s3_bucket):
    df = rows(20, 7)
    put_table(df, f"{s3_bucket}/in.parquet")
    select_dataset(f"{s3_bucket}/in.parquet", f"{s3_bucket}/out", 2, "grades", parts=3)
    with pytest.raises(MrtInputError, match="another job"):
        select_dataset(f"{s3_bucket}/in.parquet", f"{s3_bucket}/out", 3, "grades", parts=3)
    select_dataset(f"{s3_bucket}/in.parquet", f"{s3_bucket}/out", 3, "grades", parts=2, overwrite=True)
    assert read_output(f"{s3_bucket}/out").equals(expected(df, 3))
    assert len(Manifest.read(f"{s3_bucket}/out").files) == len([k for k in keys(f"{s3_bucket}/out") if k.startswith("part-")])
    storage.write_bytes(f"{s3_bucket}/out/notes.txt", b"mine")
    with pytest.raises(MrtInputError, match="no mrt job wrote"):
        select_dataset(f"{s3_bucket}/in.parquet", f"{s3_bucket}/out", 2, "grades", overwrite=True)
    assert "notes.txt" in keys(f"{s3_bucket}/out") and Manifest.read(f"{s3_bucket}/out").done  # nothing deleted


def test_bad_s3_urls_are_one_line_errors(s3_bucket):
    with pytest.raises(MrtInputError, match="matches no"):
        discover(f"{s3_bucket}/nothing")
    with pytest.raises(MrtInputError, match="unsupported URL scheme"):
        discover("gs://b/x.parquet")
    put_table(rows(5, 8), f"{s3_bucket}/in.parquet")
    with pytest.raises(MrtInputError, match="inside it"):
        select_dataset(f"{s3_bucket}", f"{s3_bucket}/out", 2, "grades")


@pytest.fixture
def local_ray(s3_endpoint):
    """A local 2-CPU Ray instance started after the endpoint is set (its workers inherit it)."""
    import logging

    ray = pytest.importorskip("ray")
    if ray.is_initialized():  # an instance an earlier test left: its workers lack the endpoint
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.mark.ray
@pytest.mark.parametrize("shuffled", [True, False])
def test_ray_engine_on_s3_resumes_and_equals_the_local_engine(s3_bucket, local_ray, shuffled):
    """Ray reads the input from s3, exchanges the rows through pieces under the output's prefix
    (or, pools in consecutive rows, reads each part's rows in place) and writes the parts there:
    stopped after a part and rerun, the output is the in-memory result."""
    from mrt_fast.datasets import ray_engine

    df = rows(50, 9, shuffled=shuffled)
    put_files(df, f"{s3_bucket}/in", 3)
    with stopping_after(1), pytest.raises(StoppedForTest):
        ray_engine.select_dataset(f"{s3_bucket}/in", f"{s3_bucket}/out", 2, "grades", parts=4)
    assert not any(k.startswith("_spill/") for k in keys(f"{s3_bucket}/out"))  # the exchange is cleaned up
    rep = ray_engine.select_dataset(f"{s3_bucket}/in", f"{s3_bucket}/out", 2, "grades", parts=4)
    assert rep.resumed and 0 < rep.parts_done_now < 4 and rep.in_place == (not shuffled)
    got = read_output(f"{s3_bucket}/out")
    assert got.equals(expected(df)) and got.select("prompt_id", "response").is_duplicated().sum() == 0
    m = Manifest.read(f"{s3_bucket}/out")
    assert sorted(keys(f"{s3_bucket}/out")) == sorted([*m.files.values(), ".mrt/manifest.parquet"])
    ray_engine.select_dataset(f"{s3_bucket}/in", f"{s3_bucket}/kept.parquet", 2, "grades", parts=3)
    got = pl.read_parquet(io.BytesIO(storage.read_bytes(f"{s3_bucket}/kept.parquet")))
    assert got.sort(["prompt_id", "pick_rank"]).equals(expected(df))
    assert not [k for k in keys(s3_bucket) if ".spill-" in k]


def test_the_cli_refuses_a_second_job_on_an_s3_output_in_one_line_and_takes_over_after_a_kill(s3_bucket):
    """`mrt select IN OUT` with s3:// URLs: a live job's lock is a one-line refusal (exit 2); once
    that job is killed with -9 (its lock left behind) the next run takes the lock over and finishes."""
    df = rows(15, 10)
    put_table(df, f"{s3_bucket}/in.parquet")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom mrt_fast.datasets.object_lock import take\n"
         f"take({s3_bucket + '/out/.mrt/lock'!r}, 'output'); print('held', flush=True); time.sleep(120)"],
        env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        cmd = [sys.executable, "-m", "mrt_fast.cli", "select", f"{s3_bucket}/in.parquet", f"{s3_bucket}/out", "--k", "2"]
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        assert r.returncode == 2, r.stderr
        assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: ")
        assert f"pid {holder.pid}" in r.stderr and "in use by another job" in r.stderr
        assert keys(f"{s3_bucket}/out") == [".mrt/lock"]  # the refused job wrote nothing
    finally:
        holder.kill()
        holder.wait()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert read_output(f"{s3_bucket}/out").equals(expected(df))
    assert ".mrt/lock" not in keys(f"{s3_bucket}/out")


@pytest.mark.embed
def test_embed_on_s3_writes_the_rows_of_a_local_run_and_resumes(s3_bucket, tmp_path):
    from mrt_fast.embeddings.dataset import embed_dataset

    df = pl.DataFrame({"prompt_id": np.repeat(np.arange(4), 3),
                       "response": [f"answer number {i} about topic {i % 4}" for i in range(12)]})
    put_files(df, f"{s3_bucket}/in", 2)
    df.write_parquet(tmp_path / "in.parquet")
    local = embed_dataset(tmp_path / "in.parquet", tmp_path / "local.parquet", cache_dir=False, rows_per_part=4)
    with stopping_after(1), pytest.raises(StoppedForTest):
        embed_dataset(f"{s3_bucket}/in", f"{s3_bucket}/emb", cache_dir=False, rows_per_part=4)
    rep = embed_dataset(f"{s3_bucket}/in", f"{s3_bucket}/emb", cache_dir=False, rows_per_part=4)
    assert rep.resumed and rep.parts_done_now == 2 and local.rows == 12
    want = pl.read_parquet(tmp_path / "local.parquet")
    got = discover(f"{s3_bucket}/emb").read()
    assert got.select("prompt_id", "response").equals(want.select("prompt_id", "response"))
    np.testing.assert_allclose(np.array(got["embedding"].to_list()), np.array(want["embedding"].to_list()),
                               rtol=1e-5, atol=1e-6)
