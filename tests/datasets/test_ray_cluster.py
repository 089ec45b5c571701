"""A real cluster layout: a Ray head and a second Ray node started as separate processes
(`ray start`), `mrt select --engine ray --ray-address` run against them, and the second
node's processes killed with SIGKILL while the job runs. The output must be the local
engine's, part for part, with no row lost or repeated."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl
import pytest

pytest.importorskip("ray")

pytestmark = [pytest.mark.ray, pytest.mark.cluster, pytest.mark.slow]

RAY = shutil.which("ray")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_node(args: list[str], temp_dir: str, env: dict) -> subprocess.Popen:
    """`ray start ... --block` in a session of its own, so that the node's raylet, store and
    workers can be killed together."""
    return subprocess.Popen([RAY, "start", "--block", "--node-ip-address=127.0.0.1", f"--temp-dir={temp_dir}",
                             "--disable-usage-stats", *args], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def kill_node(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait(timeout=30)


def wait_for_cpus(address: str, cpus: int, env: dict, timeout: float = 180) -> None:
    """Wait until the cluster at ``address`` is up and has ``cpus`` CPUs (a node joins in seconds)."""
    code = ("import ray, sys, time\nray.init(address=sys.argv[1], include_dashboard=False, log_to_driver=False)\n"
            "while ray.cluster_resources().get('CPU', 0) < int(sys.argv[2]):\n    time.sleep(0.2)\n")
    t = time.time()
    while True:
        left = timeout - (time.time() - t)
        assert left > 0, f"the Ray cluster at {address} did not reach {cpus} CPUs"
        try:
            r = subprocess.run([sys.executable, "-c", code, address, str(cpus)], env=env, capture_output=True,
                               text=True, timeout=left)
        except subprocess.TimeoutExpired:
            continue
        if r.returncode == 0:
            return
        time.sleep(1)  # the head is not listening yet


def make_input(d: Path, n_pools: int = 3000, seed: int = 0, shuffled: bool = True) -> Path:
    """Pools of 8 to 39 rows over 4 files: rows shuffled (the job exchanges them), or every pool's rows
    together (the job reads them in place)."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(8, 40, n_pools)
    ids = np.repeat(np.arange(n_pools), sizes)
    df = pl.DataFrame({"prompt_id": ids, "reward": rng.standard_normal(len(ids)),
                       "embedding": rng.standard_normal((len(ids), 16)).astype(np.float32)})
    if shuffled:
        df = df.sample(fraction=1.0, shuffle=True, seed=seed)
    d.mkdir()
    for j, part in enumerate(df.iter_slices(df.height // 4 + 1)):
        part.write_parquet(d / f"in-{j}.parquet", row_group_size=5000)
    return d


@pytest.mark.skipif(RAY is None, reason="the ray command is not installed")
@pytest.mark.parametrize("shuffled", [True, False], ids=["exchanged", "in-place"])
def test_select_on_a_two_node_cluster_survives_losing_a_node(tmp_path, shuffled):
    from mrt_fast.datasets import Manifest
    from mrt_fast.datasets.local import select_dataset as local_job

    src = make_input(tmp_path / "in", shuffled=shuffled)
    parts = 12
    assert local_job(src, tmp_path / "local", 4, "grades", parts=parts).in_place == (not shuffled)
    want = {p.name: p.read_bytes() for p in sorted((tmp_path / "local").glob("part-*.parquet"))}

    # a throwaway local cluster: no token authentication (Ray enables it by default)
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_health_check_period_ms": "500",
           "RAY_health_check_failure_threshold": "4", "RAY_health_check_initial_delay_ms": "0",
           "OMP_NUM_THREADS": "1", "RAY_DEDUP_LOGS": "0"}
    port = free_port()
    address = f"127.0.0.1:{port}"
    head_tmp, worker_tmp = tempfile.mkdtemp(prefix="rh"), tempfile.mkdtemp(prefix="rw")
    head = start_node(["--head", f"--port={port}", "--num-cpus=1", "--include-dashboard=false"], head_tmp, env)
    worker = None
    try:
        wait_for_cpus(address, 1, env)
        worker = start_node([f"--address={address}", "--num-cpus=2"], worker_tmp, env)
        wait_for_cpus(address, 3, env)

        out = tmp_path / "ray"
        job = subprocess.Popen([sys.executable, "-m", "mrt_fast.cli", "select", str(src), str(out), "--k", "4",
                                "--method", "grades", "--engine", "ray", "--ray-address", address,
                                "--parts", str(parts)], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
        # kill the second node once the job has written its first part: mid-job, with tasks on that node
        t = time.time()
        while not list(out.glob("part-*.parquet")) and job.poll() is None and time.time() - t < 240:
            time.sleep(0.02)
        assert job.poll() is None, "the job ended before the node could be killed:\n" + job.stdout.read()
        done_before = len(list(out.glob("part-*.parquet")))
        kill_node(worker)
        worker = None
        log, _ = job.communicate(timeout=300)
        assert job.returncode == 0, log
        assert done_before < parts, "the kill came after the job's last part"
    finally:
        for p in (worker, head):
            if p is not None:
                kill_node(p)
        shutil.rmtree(head_tmp, ignore_errors=True)
        shutil.rmtree(worker_tmp, ignore_errors=True)

    got = {p.name: p.read_bytes() for p in sorted(out.glob("part-*.parquet"))}
    assert list(got) == list(want) and got == want  # the local engine's parts, byte for byte
    kept = pl.read_parquet(sorted(out.glob("part-*.parquet")))
    assert Manifest.read(out).layout == ("flat" if shuffled else "consecutive")
    assert kept.height == Manifest.read(out).rows == pl.read_parquet(sorted(want and (tmp_path / "local").glob(
        "part-*.parquet"))).height
    assert kept.select("prompt_id", "pick_rank").is_duplicated().sum() == 0  # nothing written twice
    assert not (out / "_spill").exists()
