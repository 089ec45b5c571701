"""select_dataset / `mrt select` on datasets: the in-memory result, in bounded
memory, resumable, with bad input named."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from unittest import mock

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import mrt_fast
from mrt_fast import MrtInputError
from mrt_fast.datasets import local as batch
from mrt_fast.datasets.executors import local_plan
from mrt_fast.datasets.job import StoppedForTest, stopping_after
from mrt_fast.datasets.lock import lock_path
from mrt_fast.datasets.manifest import MANIFEST
from mrt_fast._util.memory import parse_memory, rss
from mrt_fast.datasets.local import bucket_of, select_dataset
from mrt_fast.cli import app
from mrt_fast.datasets.manifest import Manifest, part_path

runner = CliRunner()


def make_rows(n_pools: int, seed: int = 0, dim: int = 4, str_ids: bool = False, max_pool: int = 12) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, max_pool + 1, n_pools)
    ids = np.repeat(np.arange(n_pools) * 7 + 3, sizes)
    n = len(ids)
    df = pl.DataFrame({
        "prompt_id": [f"p{i}" for i in ids] if str_ids else ids,
        "reward": rng.standard_normal(n).round(3),
        "mode": rng.integers(0, 3, n),
        "embedding": rng.standard_normal((n, dim)).astype(np.float32).tolist(),
        "text": [f"r{i}" for i in range(n)],
    }).with_columns(pl.col("embedding").cast(pl.List(pl.Float32)))
    return df.sample(fraction=1.0, shuffle=True, seed=seed + 1)


def cut(df: pl.DataFrame, d: Path, n_files: int, seed: int = 0, fmt: str = "parquet") -> list[Path]:
    """Rows cut into n_files files (random sizes, possibly empty) named in order."""
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    cuts = np.sort(rng.integers(0, df.height + 1, n_files - 1))
    bounds = [0, *cuts.tolist(), df.height]
    files = []
    for i in range(n_files):
        f = d / f"f{i:03d}.{fmt}"
        part = df[bounds[i]:bounds[i + 1]]
        part.write_parquet(f) if fmt == "parquet" else part.write_ndjson(f)
        files.append(f)
    return files


def ref_select(df, k, method, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return mrt_fast.select(df, k, method, **kw)


def read_dir(out: Path) -> pl.DataFrame:
    """A finished dataset directory, read by polars as it stands (the .mrt/ metadata included)."""
    return pl.scan_parquet(out).collect()


def by_pool(df: pl.DataFrame) -> pl.DataFrame:
    return df.sort(["prompt_id", "pick_rank"])


# --------------------------------------------------------------------------- equal to in memory


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    n_pools=st.integers(1, 30),
    seed=st.integers(0, 10_000),
    n_files=st.integers(1, 5),
    n_parts=st.integers(1, 7),
    method=st.sampled_from(["random", "top", "grades", "diverse", "stratified"]),
    k=st.integers(1, 5),
    str_ids=st.booleans(),
    workers=st.integers(1, 2),
    limit_mib=st.one_of(st.none(), st.integers(128, 4096)),  # on top of what the process holds already
)
def test_equals_select_on_the_whole_table(tmp_path_factory, n_pools, seed, n_files, n_parts, method, k, str_ids,
                                          workers, limit_mib):
    tmp = tmp_path_factory.mktemp("eq")
    df = make_rows(n_pools, seed, str_ids=str_ids)
    cut(df, tmp / "in", n_files, seed)
    ref = ref_select(df, k, method, seed=seed % 7)
    # a file output: the same rows in the same order, buckets planned from rows or from a memory limit
    # (the tiny tables are made to look big: each byte costs 2e4 bytes of work); a limit too small
    # for the largest bucket is refused in one line instead
    with mock.patch.object(batch, "WORK_FACTOR", 2e4):
        try:
            rep = select_dataset(tmp / "in", tmp / "out.parquet", k, method, seed=seed % 7, workers=workers,
                                 rows_per_part=None if limit_mib else max(1, df.height // n_parts),
                                 memory_limit=rss() + (limit_mib << 20) if limit_mib else None)
        except MrtInputError as e:
            assert limit_mib and "is too small" in str(e) and "\n" not in str(e), e
            rep = None
    if rep is not None:
        got = pl.read_parquet(tmp / "out.parquet")
        assert got.equals(ref), (rep, got, ref)
    # a dataset output: the same rows per pool, in pick order, each pool in one part
    select_dataset(str(tmp / "in" / "*.parquet"), tmp / "out", k, method, seed=seed % 7, parts=n_parts,
                   workers=workers)
    got = read_dir(tmp / "out")
    assert by_pool(got).equals(by_pool(ref))
    m = Manifest.read(tmp / "out")
    assert m.done and m.n_parts == n_parts and m.rows == ref.height
    per_part = [pl.read_parquet(part_path(tmp / "out", i))["prompt_id"].unique() for i in range(n_parts)
                if part_path(tmp / "out", i).exists()]  # a part no pool went to has no file
    assert sum(len(p) for p in per_part) == ref["prompt_id"].n_unique()


def test_memory_limit_chooses_buckets_and_keeps_the_result(tmp_path, monkeypatch):
    df = make_rows(60, 3)
    cut(df, tmp_path / "in", 3)
    ref = ref_select(df, 3, "grades")
    # a data set "bigger" than the limit: pretend every byte needs 10^5 bytes of work
    monkeypatch.setattr(local_plan, "WORK_FACTOR", 1e5)
    limit = rss() + 10**9  # on top of what the test process holds already
    rep = select_dataset(tmp_path / "in", tmp_path / "out.parquet", 3, "grades", memory_limit=limit)
    assert rep.spilled and rep.n_parts > 1
    assert pl.read_parquet(tmp_path / "out.parquet").equals(ref)
    monkeypatch.setattr(local_plan, "WORK_FACTOR", 1.0)
    rep = select_dataset(tmp_path / "in", tmp_path / "out2.parquet", 3, "grades", memory_limit=limit)
    assert not rep.spilled and rep.n_parts == 1
    assert pl.read_parquet(tmp_path / "out2.parquet").equals(ref)


#: `mrt` in a child that reports its own peak resident memory (VmHWM: the os.wait4 of a child forked
#: from the test process counts the test process's memory too)
_CHILD = ("import atexit, runpy, sys\nsys.argv = ['mrt', *sys.argv[1:]]\n"
          "def peak():\n"
          "    hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0].split()[1]\n"
          "    sys.stderr.write(f'\\npeak {int(hwm) * 1024}\\n')\n"
          "atexit.register(peak)\n"  # the process's end runs its exit handlers, then skips the teardown
          "runpy.run_module('mrt_fast.cli', run_name='__main__')\n")


def _select_in_child(src: Path, out: Path, limit: str, method: str = "grades") -> tuple[int, str, int]:
    """`mrt select` in a child process: (exit code, stderr, the child's own peak resident bytes)."""
    env = {**os.environ, "PYTHONPATH": str(Path(mrt_fast.__file__).parent.parent), "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-c", _CHILD, "select", str(src), str(out), "--k", "3",
                        "--method", *method.split(), "--memory-limit", limit], stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True, env=env)
    err, _, peak = p.stderr.rstrip().rpartition("\npeak ")
    return p.returncode, err, int(peak)


def test_memory_limit_holds_or_is_refused_in_one_line(tmp_path):
    """Under any limit the job stays under it, counting the interpreter's own memory, or refuses
    in one line naming the smallest limit that does; under that limit it then runs and stays under it."""
    rng = np.random.default_rng(0)
    n, dim = 30_000, 384
    ids = np.repeat(np.arange(2000), rng.integers(5, 26, 2000))[:n]
    src = tmp_path / "in"
    cut(pl.DataFrame({"prompt_id": ids, "reward": rng.standard_normal(len(ids)),
                      "embedding": rng.standard_normal((len(ids), dim), dtype=np.float32)})
        .with_columns(pl.col("embedding").cast(pl.List(pl.Float32))), src, 2)
    least = None
    for i, limit in enumerate(["100MB", "400MB"]):
        rc, err, peak = _select_in_child(src, tmp_path / f"o{i}", limit)
        if rc == 2:
            lines = err.strip().splitlines()
            assert len(lines) == 1 and "use a limit of at least" in lines[0], err
            least = lines[0].rsplit("at least ", 1)[1].replace(" ", "")
            continue
        assert rc == 0, err
        assert peak <= parse_memory(limit), (limit, peak)
    assert least is not None  # 100 MB is below what the interpreter and its libraries hold
    rc, err, peak = _select_in_child(src, tmp_path / "least", least)
    assert rc == 0, err
    assert peak <= parse_memory(least), (least, peak)
    assert read_dir(tmp_path / "least").sort("prompt_id", "pick_rank").equals(
        read_dir(tmp_path / "o1").sort("prompt_id", "pick_rank"))


def text_pools(seed: int, dim: int, n: int = 300_000) -> pl.DataFrame:
    """``n`` candidates in pools of 8-72, every pool's rows together: a reward, a text response of 20-120
    words (500 distinct texts) and ``dim``-d float16 vectors (a real candidate pool's shape)."""
    rng = np.random.default_rng(seed)
    ids = np.repeat(np.arange(n // 40), rng.integers(8, 73, n // 40))[:n]
    words = np.array(["alpha", "beta", "gamma", "answer", "because", "therefore", "the", "is", "x", "=", "42"])
    texts = np.array([" ".join(words[rng.integers(0, len(words), m)]) for m in rng.integers(20, 120, 500)])
    df = pl.DataFrame({"prompt_id": ids, "reward": rng.standard_normal(len(ids)),
                       "response": texts[rng.integers(0, len(texts), len(ids))],
                       "embedding": rng.standard_normal((len(ids), dim)).astype(np.float16)})
    return df.with_columns(pl.col("embedding").cast(pl.List(pl.Float16)))


def test_a_text_column_holds_the_limit_at_every_step(tmp_path):
    """Responses as text beside float16 vectors (the shape of a real candidate pool): from the
    smallest limit the job accepts up to where it reads a bucket ahead, the peak stays under the
    limit (the selection touches memory the plan cannot size; what it holds back covers it)."""
    df = text_pools(seed=1, dim=32).sample(fraction=1.0, shuffle=True, seed=2)
    src = tmp_path / "in"
    cut(df, src, 4)
    rc, err, _ = _select_in_child(src, tmp_path / "refused", "64MiB")
    assert rc == 2 and "use a limit of at least" in err, err
    least = parse_memory(err.strip().splitlines()[-1].rsplit("at least ", 1)[1].replace(" ", ""))
    for i, f in enumerate([1.0, 1.1, 1.2, 1.3, 1.45, 1.6]):
        limit = int(least * f)
        rc, err, peak = _select_in_child(src, tmp_path / f"o{i}", str(limit))
        assert rc == 0, err
        assert peak <= limit, (f, limit, peak)


@pytest.mark.parametrize("method", ["stratified", "top", "random", "diverse", "grades --dedup 0.95"])
def test_every_method_holds_the_limit_from_the_least_one_up(tmp_path, method):
    """Each method's own work (stratified finding modes from the embeddings: k-means, content
    order, duplicate classes; near-duplicate removal) stays within the limit from the smallest
    the job accepts up to where it runs in memory: float16 vectors, as generated data comes."""
    rng = np.random.default_rng(3)
    n = 300_000
    ids = np.repeat(np.arange(n // 40), rng.integers(8, 73, n // 40))[:n]
    df = pl.DataFrame({"prompt_id": ids, "reward": rng.standard_normal(len(ids)),
                       "embedding": rng.standard_normal((len(ids), 32)).astype(np.float16)})
    src = tmp_path / "in"
    cut(df.with_columns(pl.col("embedding").cast(pl.List(pl.Float16))).sample(fraction=1.0, shuffle=True, seed=4),
        src, 4)
    rc, err, _ = _select_in_child(src, tmp_path / "refused", "64MiB", method)
    assert rc == 2 and "use a limit of at least" in err, err
    least = parse_memory(err.strip().splitlines()[-1].rsplit("at least ", 1)[1].replace(" ", ""))
    kept = None
    for i, f in enumerate([1.0, 1.3, 1.6, 6.0]):
        limit = int(least * f)
        rc, err, peak = _select_in_child(src, tmp_path / f"o{i}", str(limit), method)
        assert rc == 0, err
        assert peak <= limit, (method, f, limit, peak)
        got = read_dir(tmp_path / f"o{i}").sort("prompt_id", "pick_rank")
        assert kept is None or got.equals(kept), (method, f)  # the same rows, spilled or not
        kept = got


def test_stratified_with_computed_modes(tmp_path):
    from mrt_fast.selection.modes import pool_modes

    df = make_rows(40, 3, dim=8, max_pool=30).drop("mode")
    cut(df, tmp_path / "in", 3)
    ref = ref_select(pool_modes(df, by="prompt_id", embedding="embedding", out="mode", seed=0), 3, "stratified")
    for n in (1, 4):
        select_dataset(tmp_path / "in", tmp_path / f"o{n}.parquet", 3, "stratified", parts=n)
        assert pl.read_parquet(tmp_path / f"o{n}.parquet").equals(ref)


@pytest.mark.parametrize("method", ["random", "top", "grades", "diverse", "stratified"])
def test_empty_buckets_have_the_parts_schema(tmp_path, method):
    df = make_rows(3, 2, max_pool=8).drop("mode")
    cut(df, tmp_path / "in", 2)
    select_dataset(tmp_path / "in", tmp_path / "o", 2, method, parts=9)  # most buckets empty
    schemas = {tuple(pl.read_parquet_schema(p).items()) for p in (tmp_path / "o").glob("part-*.parquet")}
    assert len(schemas) == 1
    assert pl.scan_parquet(str(tmp_path / "o" / "*.parquet")).collect().height == ref_select(df if method != "stratified"
        else df.with_columns(pl.lit(0).alias("mode")), 2, method).height


def test_bucket_of_is_the_pool_key_digest():
    from mrt_fast.tables.arrays import pool_keys

    s = pl.Series(["a", "b", None, "c"])
    b = bucket_of(s, 5)
    assert b[2] == 5  # nulls never share a real bucket
    full = pool_keys(pl.Series(["a", "b", "c"])) % np.uint64(5)
    assert b[[0, 1, 3]].tolist() == full.tolist()
    ints = pl.Series([1, 2, 3, 2**40])
    assert bucket_of(ints, 7).tolist() == (pool_keys(ints) % np.uint64(7)).tolist()


@given(st.lists(st.integers(0, 70_000), max_size=300), st.sampled_from([np.uint32, np.int64]))
@settings(max_examples=200, deadline=None)
def test_bucket_order_is_a_stable_sort_by_bucket(buckets, dtype):
    from mrt_fast.datasets.spill import bucket_order

    b = np.array(buckets, dtype=dtype)
    n = int(b.max()) + 1 if len(b) else 1
    order, cuts = bucket_order(b, n)
    assert order.tolist() == sorted(range(len(b)), key=lambda r: (buckets[r], r))
    assert len(cuts) == n + 1 and cuts[0] == 0 and cuts[-1] == len(b)
    for i in range(n):
        assert all(buckets[r] == i for r in order[cuts[i]:cuts[i + 1]])


@pytest.mark.parametrize("spec", ["2GB", "512MiB", "1.5g", 3_000_000_000])
def test_parse_memory(spec):
    assert parse_memory(spec) >= 64 * 2**20


@pytest.mark.parametrize("spec", ["lots", "2XB", "1MB", -5])
def test_parse_memory_refuses(spec):
    with pytest.raises(MrtInputError):
        parse_memory(spec)


# --------------------------------------------------------------------------- inputs


def test_dirs_globs_jsonl_and_hive(tmp_path):
    df = make_rows(25, 5)
    ref = by_pool(ref_select(df, 2, "top"))
    jf = cut(df, tmp_path / "j", 3, fmt="jsonl")
    select_dataset(tmp_path / "j", tmp_path / "oj", 2, "top", parts=3)
    ref_j = by_pool(ref_select(pl.concat([pl.read_ndjson(f) for f in jf if f.stat().st_size]), 2, "top"))
    assert by_pool(read_dir(tmp_path / "oj")).equals(ref_j)
    # hive: split=a/ and split=b/ folders; the key becomes a column
    h = tmp_path / "h"
    a, b = df[: df.height // 2], df[df.height // 2:]
    (h / "split=a").mkdir(parents=True)
    (h / "split=b").mkdir(parents=True)
    a.write_parquet(h / "split=a" / "x.parquet")
    b.write_parquet(h / "split=b" / "x.parquet")
    select_dataset(h, tmp_path / "oh", 2, "top", parts=2)
    got = by_pool(read_dir(tmp_path / "oh"))
    assert "split" in got.columns
    assert got.select(ref.columns).equals(ref)
    # a quoted glob across folders
    select_dataset(str(h / "*" / "*.parquet"), tmp_path / "og.parquet", 2, "top")
    assert by_pool(pl.read_parquet(tmp_path / "og.parquet")).select(ref.columns).equals(ref)


def test_grouped_layout_in_and_out(tmp_path):
    rows = make_rows(20, 9, max_pool=10).sort("prompt_id", maintain_order=True)
    grouped = rows.group_by("prompt_id", maintain_order=True).agg(
        pl.col("text").alias("responses"), pl.col("reward"), pl.col("embedding"), pl.col("mode"))
    grouped = grouped.with_columns(pl.lit("the prompt").alias("prompt"))
    cut(grouped, tmp_path / "g", 3)
    ref = ref_select(rows.rename({"text": "responses"}), 3, "grades")
    for n_parts in (1, 4):
        out = tmp_path / f"out{n_parts}"
        rep = select_dataset(tmp_path / "g", out, 3, "grades", parts=n_parts)
        assert rep.layout == "grouped"
        got = read_dir(out)
        assert got.height == grouped.height  # one row per prompt
        assert got.schema["embedding"] == grouped.schema["embedding"]
        assert got["prompt"].to_list() == ["the prompt"] * got.height
        flat = got.drop("prompt").explode(["responses", "reward", "embedding", "mode", "pick_rank", "gain"])
        assert by_pool(flat).equals(by_pool(ref).select(flat.columns))
    # a file output in the grouped layout keeps the input's prompt order
    select_dataset(tmp_path / "g", tmp_path / "g.parquet", 3, "grades", parts=2)
    assert pl.read_parquet(tmp_path / "g.parquet")["prompt_id"].to_list() == grouped["prompt_id"].to_list()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n_pools=st.integers(1, 25), seed=st.integers(0, 1000), n_files=st.integers(1, 4), n_parts=st.integers(1, 6),
       method=st.sampled_from(["random", "top", "grades", "stratified"]), k=st.integers(1, 4))
def test_grouped_equals_select_on_the_rows(tmp_path_factory, n_pools, seed, n_files, n_parts, method, k):
    tmp = tmp_path_factory.mktemp("grouped")
    rows = make_rows(n_pools, seed).sort("prompt_id", maintain_order=True)
    g = rows.group_by("prompt_id", maintain_order=True).agg(pl.col("text"), pl.col("reward"), pl.col("embedding"),
                                                             pl.col("mode"))
    g = g.sample(fraction=1.0, shuffle=True, seed=seed)
    cut(g, tmp / "g", n_files, seed)
    ref = ref_select(g.explode(["text", "reward", "embedding", "mode"]), k, method, seed=seed)
    select_dataset(tmp / "g", tmp / "out.parquet", k, method, seed=seed, parts=n_parts, layout="grouped")
    got = pl.read_parquet(tmp / "out.parquet")
    assert got["prompt_id"].to_list() == g["prompt_id"].to_list()
    lists = [c for c in got.columns if c != "prompt_id"]
    assert got.explode(lists).equals(ref.select(got.columns))


def test_grouped_layout_refuses_ragged_lists(tmp_path):
    g = pl.DataFrame({"prompt_id": [1, 2], "reward": [[1.0, 2.0], [3.0]], "responses": [["a", "b"], ["c", "d"]]})
    g.write_parquet(tmp_path / "g.parquet")
    with pytest.raises(MrtInputError, match="prompt 2 has 2 values in 'responses'"):
        select_dataset(tmp_path / "g.parquet", tmp_path / "o", 1, "top")
    assert not (tmp_path / "o").exists()
    # a per-prompt list column is left alone once the per-candidate ones are named
    g = pl.DataFrame({"prompt_id": [1, 2], "reward": [[1.0, 2.0], [3.0]], "responses": [["a", "b"], ["c"]],
                      "tests": [["t1"], ["t2", "t3"]]})
    g.write_parquet(tmp_path / "g2.parquet")
    r = runner.invoke(app, ["select", str(tmp_path / "g2.parquet"), str(tmp_path / "o2.parquet"), "--k", "1",
                            "--method", "top", "--candidate-columns", "reward,responses"])
    assert r.exit_code == 0, r.output
    got = pl.read_parquet(tmp_path / "o2.parquet")
    assert got["responses"].to_list() == [["b"], ["c"]] and got["tests"].to_list() == [["t1"], ["t2", "t3"]]


# --------------------------------------------------------------------------- resume


def stopped_after_two_parts(tmp_path, method: str, parts: int) -> Manifest:
    """An input in 4 files, its uninterrupted job in ``full`` and the same job stopped after 2 of its
    ``parts`` in ``part``: the stopped job's manifest."""
    cut(make_rows(80, 11), tmp_path / "in", 4)
    select_dataset(tmp_path / "in", tmp_path / "full", 3, method, parts=parts)
    with stopping_after(2), pytest.raises(StoppedForTest):
        select_dataset(tmp_path / "in", tmp_path / "part", 3, method, parts=parts)
    return Manifest.read(tmp_path / "part")


def test_resume_after_a_kill_gives_byte_identical_parts(tmp_path):
    m = stopped_after_two_parts(tmp_path, "grades", 6)
    assert not m.done and len(m.parts) == 2
    # a half-written temp file is never read and is cleaned
    import subprocess
    import sys

    from mrt_fast._util.files import temp_name

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # what a kill -9 mid-write leaves: a temp file whose writer is gone
    (tmp_path / "part" / temp_name("part-00005.parquet", dead.pid)).write_bytes(b"half")
    rep = select_dataset(tmp_path / "in", tmp_path / "part", 3, "grades", parts=6)
    assert rep.resumed and rep.parts_done_now == 4
    for i in range(6):
        assert _bytes(part_path(tmp_path / "part", i)) == _bytes(part_path(tmp_path / "full", i))
    assert not list((tmp_path / "part").glob(".*.tmp"))
    assert not (tmp_path / "part" / batch.SPILL_DIR).exists()
    # finished: says so, does nothing
    rep = select_dataset(tmp_path / "in", tmp_path / "part", 3, "grades")
    assert rep.already_done and rep.parts_done_now == 0
    r = runner.invoke(app, ["select", str(tmp_path / "in"), str(tmp_path / "part"), "--k", "3"])
    assert r.exit_code == 0 and "already complete" in r.output


@pytest.mark.parametrize("stray", ["another part", "the input", "a part with a byte changed"])
def test_a_file_under_an_unrecorded_parts_name_is_redone_not_adopted(tmp_path, stray):
    """A rerun redoes every part its manifest does not record, whatever file sits under that part's
    name (a kill between a part's rename and its record leaves one that nothing vouches for): a valid
    Parquet file with rows, even the right part with one byte changed, never becomes the output."""
    m = stopped_after_two_parts(tmp_path, "top", 4)
    name = next(part_path(tmp_path / "part", i) for i in range(4) if part_path(tmp_path / "part", i).name
                not in m.parts)
    if stray == "another part":
        data = _bytes(part_path(tmp_path / "full", 0))
    elif stray == "the input":
        data = _bytes(next((tmp_path / "in").glob("*.parquet")))
    else:
        data = bytearray(_bytes(tmp_path / "full" / name.name))
        data[len(data) - 40] ^= 0xFF  # in the footer: the file still opens and counts its rows
        data = bytes(data)
    name.write_bytes(data)
    rep = select_dataset(tmp_path / "in", tmp_path / "part", 3, "top", parts=4)
    assert rep.resumed and rep.parts_done_now == 2
    for i in range(4):
        assert _bytes(part_path(tmp_path / "part", i)) == _bytes(part_path(tmp_path / "full", i))


def test_stale_spill_of_a_killed_file_output_is_removed(tmp_path):
    df = make_rows(10, 1)
    cut(df, tmp_path / "in", 2)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".o.parquet.spill-{dead.pid}-abc"
    (stale / "parts").mkdir(parents=True)
    live = tmp_path / f".o.parquet.spill-{os.getpid()}-abc"
    live.mkdir()
    select_dataset(tmp_path / "in", tmp_path / "o.parquet", 2, "random", parts=2)
    assert not stale.exists() and live.exists()


def test_resume_grouped(tmp_path):
    rows = make_rows(30, 2)
    g = rows.group_by("prompt_id", maintain_order=True).agg(pl.col("reward"), pl.col("embedding"))
    cut(g, tmp_path / "g", 2)
    select_dataset(tmp_path / "g", tmp_path / "full", 2, "grades", parts=5)
    with stopping_after(3), pytest.raises(StoppedForTest):
        select_dataset(tmp_path / "g", tmp_path / "part", 2, "grades", parts=5)
    select_dataset(tmp_path / "g", tmp_path / "part", 2, "grades")
    for i in range(5):
        assert _bytes(part_path(tmp_path / "part", i)) == _bytes(part_path(tmp_path / "full", i))


def _cli(*args):
    return [sys.executable, "-m", "mrt_fast.cli", "select", *map(str, args)]


@pytest.mark.slow
def test_sigkill_at_any_moment_then_rerun(tmp_path):
    df = make_rows(1000, 4, dim=16, max_pool=30)
    cut(df, tmp_path / "in", 4)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def cmd(out):
        return _cli(tmp_path / "in", out, "--k", "4", "--chunk-rows", "1500")

    subprocess.run(cmd(tmp_path / "full"), check=True, env=env, capture_output=True)
    n_parts = Manifest.read(tmp_path / "full").n_parts
    assert n_parts > 5
    unfinished = 0
    # kill once the job has started writing, once the spill is complete, once a part is written
    for j, when in enumerate([Path(MANIFEST), Path(batch.SPILL_DIR) / "_complete", Path("part-00002.parquet")]):
        out = tmp_path / f"killed{j}"
        p = subprocess.Popen(cmd(out), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        t0 = time.time()
        while not (out / when).exists() and p.poll() is None and time.time() - t0 < 60:
            time.sleep(0.002)
        p.send_signal(signal.SIGKILL)
        p.wait()
        unfinished += not (Manifest.read(out) and Manifest.read(out).done)
        r = subprocess.run(cmd(out), env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        for i in range(n_parts):
            assert _bytes(part_path(out, i)) == _bytes(part_path(tmp_path / "full", i))
        assert Manifest.read(out).done and not (out / batch.SPILL_DIR).exists()
    assert unfinished >= 2  # the kills did land mid-run


# --------------------------------------------------------------------------- refusals


def test_refusals_and_overwrite(tmp_path):
    df = make_rows(20, 1)
    files = cut(df, tmp_path / "in", 2)
    select_dataset(tmp_path / "in", tmp_path / "o", 2, "random", parts=2)
    with pytest.raises(MrtInputError, match=r"another job: its parameters differ \(k: 2 -> 3\)"):
        select_dataset(tmp_path / "in", tmp_path / "o", 3, "random")
    r = runner.invoke(app, ["select", str(tmp_path / "in"), str(tmp_path / "o"), "--k", "3", "--method", "random"])
    assert r.exit_code == 2 and r.output.count("\n") == 1 and "--overwrite" in r.output
    os.utime(files[0], ns=(1, 1))  # the input changed
    with pytest.raises(MrtInputError, match="the input changed"):
        select_dataset(tmp_path / "in", tmp_path / "o", 2, "random")
    rep = select_dataset(tmp_path / "in", tmp_path / "o", 3, "random", overwrite=True)
    assert rep.n_kept == ref_select(df, 3, "random").height
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x.txt").write_text("mine")
    with pytest.raises(MrtInputError, match="not empty and has no manifest"):
        select_dataset(tmp_path / "in", tmp_path / "busy", 2, "random")


def test_output_inside_input_refused(tmp_path):
    df = make_rows(5, 1)
    cut(df, tmp_path / "in", 1)
    for out in (tmp_path / "in", tmp_path / "in" / "sub", tmp_path / "in" / "f000.parquet"):
        with pytest.raises(MrtInputError, match="is the input or inside it"):
            select_dataset(tmp_path / "in", out, 1, "random")
    with pytest.raises(MrtInputError, match="is the input or inside it"):
        select_dataset(str(tmp_path / "in" / "*.parquet"), tmp_path / "in" / "out.parquet", 1, "random")
    with pytest.raises(MrtInputError, match="is the input or inside it"):
        select_dataset(str(tmp_path / "**" / "*.parquet"), tmp_path / "in" / "deeper" / "out", 1, "random")
    # beside the files a glob names (not matched by it) is fine
    rep = select_dataset(str(tmp_path / "in" / "*.parquet"), tmp_path / "in" / "kept", 1, "random")
    assert rep.n_kept == 5


def _snapshot(d: Path) -> dict:
    """Every file under ``d`` (not following links) with its bytes."""
    return {str(p.relative_to(d)): (p.read_bytes() if p.is_file() and not p.is_symlink() else None)
            for p in sorted(d.rglob("*"))}


def test_overwrite_replaces_only_what_a_job_wrote(tmp_path, monkeypatch):
    df = make_rows(20, 3)
    cut(df, tmp_path / "in", 2)
    data = tmp_path / "in" / "f000.parquet"
    # the current directory, holding the input: refused, every file in place
    monkeypatch.chdir(tmp_path / "in")
    before = _snapshot(tmp_path)
    r = runner.invoke(app, ["select", "f000.parquet", ".", "--k", "2", "--overwrite"])
    assert r.exit_code == 2 and r.output.count("\n") == 1
    assert _snapshot(tmp_path) == before
    # the current directory, the input elsewhere: refused, even when it is a job's directory
    cwd = tmp_path / "cwd"
    select_dataset(tmp_path / "in", cwd, 2, "random")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "notes.txt").write_text("mine")
    for d in (cwd, tmp_path / "elsewhere"):
        monkeypatch.chdir(d)
        before = _snapshot(tmp_path)
        r = runner.invoke(app, ["select", str(tmp_path / "in"), ".", "--k", "3", "--overwrite"])
        assert r.exit_code == 2 and r.output.count("\n") == 1 and "nothing was deleted" in r.output, r.output
        assert _snapshot(tmp_path) == before
    monkeypatch.chdir(tmp_path)
    # a directory holding files no job wrote, with or without a manifest: refused, nothing deleted
    foreign = tmp_path / "foreign"
    select_dataset(tmp_path / "in", foreign, 2, "random", parts=2)
    (foreign / "README.md").write_text("notes")
    for d in (foreign, tmp_path / "elsewhere"):
        before = _snapshot(tmp_path)
        with pytest.raises(MrtInputError, match="holds files no mrt job wrote.*nothing was deleted"):
            select_dataset(tmp_path / "in", d, 3, "random", overwrite=True)
        assert _snapshot(tmp_path) == before
    # an input file, the input directory, a parent of the input: refused, nothing deleted
    for out in (data, tmp_path / "in", tmp_path):
        before = _snapshot(tmp_path)
        with pytest.raises(MrtInputError, match="is the input or inside it"):
            select_dataset(tmp_path / "in", out, 3, "random", overwrite=True)
        assert _snapshot(tmp_path) == before
    # a job's directory (with a dead job's lock and temp file) is replaced
    ours = tmp_path / "ours"
    select_dataset(tmp_path / "in", ours, 2, "random", parts=3)
    lock_path(ours, directory=True).write_text('{"pid": 999999999, "host": "%s"}' % __import__("socket").gethostname())
    rep = select_dataset(tmp_path / "in", ours, 3, "random", overwrite=True, parts=2)
    assert rep.n_kept == ref_select(df, 3, "random").height
    assert sorted(p.name for p in ours.iterdir()) == [".mrt", "part-00000.parquet", "part-00001.parquet"]
    assert os.listdir(ours / ".mrt") == ["manifest.parquet"]


def test_an_output_reached_through_a_link_into_the_input_is_refused(tmp_path):
    df = make_rows(10, 2)
    cut(df, tmp_path / "in", 2)
    (tmp_path / "in" / "sub").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "in")
    (tmp_path / "to_sub").symlink_to(tmp_path / "in" / "sub")
    (tmp_path / "to_file.parquet").symlink_to(tmp_path / "in" / "f000.parquet")
    before = _snapshot(tmp_path / "in")
    for out in (tmp_path / "link" / "kept", tmp_path / "to_sub", tmp_path / "to_file.parquet",
                tmp_path / "link" / "kept.parquet", tmp_path / "elsewhere" / ".." / "in" / "kept"):
        with pytest.raises(MrtInputError, match="is the input or inside it"):
            select_dataset(tmp_path / "in", out, 2, "random")
    for out in (tmp_path / "in" / "kept", tmp_path / "to_sub"):  # the input read through a link
        with pytest.raises(MrtInputError, match="is the input or inside it"):
            select_dataset(tmp_path / "link", out, 2, "random")
    assert _snapshot(tmp_path / "in") == before
    assert select_dataset(tmp_path / "link", tmp_path / "kept", 2, "random").n_kept == ref_select(df, 2, "random").height


# --------------------------------------------------------------------------- part checks


def _finished(tmp_path, layout="rows"):
    df = make_rows(60, 5)
    if layout == "grouped":
        df = df.group_by("prompt_id", maintain_order=True).agg(pl.col("reward"), pl.col("embedding"))
    cut(df, tmp_path / "in", 3)
    select_dataset(tmp_path / "in", tmp_path / "out", 2, "grades", parts=4)
    return {p.name: p.read_bytes() for p in sorted((tmp_path / "out").glob("part-*.parquet"))}


@pytest.mark.parametrize("layout", ["rows", "grouped"])
@pytest.mark.parametrize("damage", ["delete", "flip", "truncate", "replace"])
def test_a_finished_directory_that_lost_or_changed_a_part_redoes_it(tmp_path, layout, damage):
    whole = _finished(tmp_path, layout)
    out = tmp_path / "out"
    m = Manifest.read(out)
    assert set(m.checks) == set(whole) and all(c["bytes"] == len(whole[n]) for n, c in m.checks.items())
    p = out / "part-00002.parquet"
    if damage == "delete":
        p.unlink()
    elif damage == "flip":  # same size, one byte changed
        b = bytearray(p.read_bytes())
        b[len(b) // 2] ^= 0x01
        p.write_bytes(bytes(b))
    elif damage == "truncate":
        p.write_bytes(p.read_bytes()[:-10])
    else:  # a valid Parquet file with other rows
        pl.read_parquet(out / "part-00001.parquet").write_parquet(p)
    rep = select_dataset(tmp_path / "in", out, 2, "grades")
    assert not rep.already_done and rep.resumed and rep.parts_done_now == 1
    assert {q.name: q.read_bytes() for q in sorted(out.glob("part-*.parquet"))} == whole
    assert Manifest.read(out).done
    assert select_dataset(tmp_path / "in", out, 2, "grades").already_done


def _bytes(p):
    """A part file's bytes (None: a part of no rows, which has no file)."""
    return p.read_bytes() if p.exists() else None


def _old_manifest(out, d):
    """Leave ``out`` with the manifest ``d`` as earlier versions kept it: ``_manifest.json``."""
    (out / MANIFEST).unlink(missing_ok=True)
    (out / "_manifest.json").write_text(json.dumps(d))


@pytest.mark.parametrize("damage", ["delete", "flip"])
def test_a_stopped_job_that_lost_a_finished_part_redoes_it_from_the_input(tmp_path, damage):
    """The spill of a stopped job no longer holds the buckets of its finished parts:
    one of those parts lost or changed before the rerun is redone from the input,
    with its rows, never from an emptied bucket."""
    whole = _finished(tmp_path)
    out = tmp_path / "stopped"
    with stopping_after(3), pytest.raises(StoppedForTest):
        select_dataset(tmp_path / "in", out, 2, "grades", parts=4)
    assert (out / batch.SPILL_DIR).is_dir()
    p = out / "part-00001.parquet"
    if damage == "delete":
        p.unlink()
    else:
        b = bytearray(p.read_bytes())
        b[len(b) // 2] ^= 0x01
        p.write_bytes(bytes(b))
    rep = select_dataset(tmp_path / "in", out, 2, "grades", parts=4)
    assert rep.resumed and rep.parts_done_now == 2
    assert {q.name: q.read_bytes() for q in sorted(out.glob("part-*.parquet"))} == whole
    assert Manifest.read(out).rows == sum(pl.read_parquet(out / n).height for n in whole)


def test_a_manifest_of_the_first_format_is_read_and_checked(tmp_path):
    whole = _finished(tmp_path)
    out = tmp_path / "out"
    d = json.loads(Manifest.read(out).to_json())
    d["format"] = "mrt_fast.dataset/1"
    d["parameters"]["layout"] = d["layout"] = "rows"  # the flat layout's earlier name
    del d["checks"]
    _old_manifest(out, d)  # as an earlier version wrote it
    assert select_dataset(tmp_path / "in", out, 2, "grades").already_done
    assert set(Manifest.read(out).checks) == set(whole)  # the checks are recorded now
    d["parts"]["part-00003.parquet"] += 1  # a part whose rows are not the recorded ones
    _old_manifest(out, d)
    rep = select_dataset(tmp_path / "in", out, 2, "grades")
    assert rep.resumed and rep.parts_done_now == 1
    assert {q.name: q.read_bytes() for q in sorted(out.glob("part-*.parquet"))} == whole
    _old_manifest(out, {**d, "format": "mrt_fast.dataset/9"})
    with pytest.raises(MrtInputError, match="not a manifest this version can read"):
        select_dataset(tmp_path / "in", out, 2, "grades")


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("n_parts", [1, 3])
def test_null_prompt_ids_are_counted_and_refused(tmp_path, n_parts):
    df = make_rows(40, 6).with_row_index("i").with_columns(
        pl.when(pl.col("i") % 50 == 7).then(None).otherwise(pl.col("prompt_id")).alias("prompt_id")).drop("i")
    n_null = df["prompt_id"].null_count()
    assert n_null > 1
    cut(df, tmp_path / "in", 3)
    with pytest.raises(MrtInputError, match=f"has {n_null} null prompt id\\(s\\), the first in '.*f00.\\.parquet'"):
        select_dataset(tmp_path / "in", tmp_path / "o", 2, "random", parts=n_parts)
    assert not (tmp_path / "o").exists()
    r = runner.invoke(app, ["select", str(tmp_path / "in"), str(tmp_path / "o.parquet"), "--k", "2",
                            "--method", "random", "--chunk-rows", "50"])
    assert r.exit_code == 2 and "null prompt id" in r.output and not (tmp_path / "o.parquet").exists()


@pytest.mark.parametrize("n_parts", [1, 3])
def test_corrupt_file_is_named_before_any_output(tmp_path, n_parts):
    df = make_rows(30, 2)
    files = cut(df, tmp_path / "in", 3)
    data = files[1].read_bytes()
    files[1].write_bytes(data[: len(data) // 2] + b"\0" * 64 + data[len(data) // 2 + 64:])  # damaged pages
    files[2].write_bytes(b"not parquet at all")
    with pytest.raises(MrtInputError, match="f002.parquet"):
        select_dataset(tmp_path / "in", tmp_path / "o", 2, "grades", parts=n_parts)
    assert not (tmp_path / "o").exists()  # nothing committed, nothing left behind
    files[2].unlink()
    with pytest.raises(MrtInputError, match="f001.parquet"):
        select_dataset(tmp_path / "in", tmp_path / "o", 2, "grades", parts=n_parts)
    assert not (tmp_path / "o").exists()
    with pytest.raises(MrtInputError, match="f001.parquet"):
        select_dataset(tmp_path / "in", tmp_path / "o.parquet", 2, "grades", parts=n_parts)
    assert not (tmp_path / "o.parquet").exists() and not list(tmp_path.glob(".o.parquet*"))
    files[1].unlink()  # once fixed, the same command runs
    rep = select_dataset(tmp_path / "in", tmp_path / "o", 2, "grades", parts=n_parts)
    assert rep.n_kept == ref_select(pl.read_parquet(files[0]), 2, "grades").height


def test_missing_column_names_the_file(tmp_path):
    df = make_rows(20, 2)
    files = cut(df, tmp_path / "in", 3)
    pl.read_parquet(files[1]).drop("embedding").write_parquet(files[1])
    with pytest.raises(MrtInputError, match=r"column 'embedding' \(embedding\) not found in '.*f001.parquet'"):
        select_dataset(tmp_path / "in", tmp_path / "o", 2, "grades")
    r = runner.invoke(app, ["select", str(tmp_path / "in"), str(tmp_path / "o"), "--k", "2"])
    assert r.exit_code == 2 and "f001.parquet" in r.output


@pytest.mark.parametrize("source", ["missing.parquet", "empty_dir", "*.nothing"])
def test_no_input(tmp_path, source, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty_dir").mkdir()
    r = runner.invoke(app, ["select", source, "o", "--k", "2"])
    assert r.exit_code == 2 and r.output.startswith("error:") and r.output.count("\n") == 1


# --------------------------------------------------------------------------- diagnose


def _losses(n_prompts=60, seed=0):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(2, 9, n_prompts)
    ids = np.repeat(np.arange(n_prompts), sizes)
    return pl.DataFrame({"prompt_id": ids, "loss": rng.gamma(2.0, 1.0, len(ids)) + np.repeat(
        rng.standard_normal(n_prompts), sizes)}).sample(fraction=1.0, shuffle=True, seed=seed)


def test_diagnose_dataset_equals_the_whole_table(tmp_path):
    from mrt_fast import variance_budget  # one entry: a table or a path

    df = _losses()
    cut(df, tmp_path / "in", 4)
    a = variance_budget(df, n_boot=50).to_dict()
    b = variance_budget(tmp_path / "in", n_boot=50, batch_rows=37).to_dict()
    for key in ("v_x", "v_y_given_x", "k_star", "n_prompts"):
        if key in a:
            assert a[key] == pytest.approx(b[key], rel=1e-9), key
    assert a.keys() == b.keys()


def test_diagnose_bad_inputs_one_line_exit_2(tmp_path):
    df = _losses()
    cut(df, tmp_path / "in", 2)
    (tmp_path / "empty.parquet").write_bytes(b"")
    df.head(0).write_parquet(tmp_path / "zero.parquet")
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 garbage")
    (tmp_path / "nothing").mkdir()
    cases = [
        [str(tmp_path / "nothing")],
        [str(tmp_path / "empty.parquet")],
        [str(tmp_path / "zero.parquet")],
        [str(tmp_path / "bad.parquet")],
        [str(tmp_path / "in"), "--json", str(tmp_path / "empty.parquet" / "r.json")],
        [str(tmp_path / "in"), "--plot", str(tmp_path / "empty.parquet" / "r.png")],
    ]
    for args in cases:
        r = runner.invoke(app, ["diagnose", *args, "--n-boot", "0"])
        assert r.exit_code == 2, (args, r.output)
        assert r.output.startswith("error:") and r.output.count("\n") == 1, (args, r.output)
    r = runner.invoke(app, ["diagnose", str(tmp_path / "in"), "--n-boot", "0", "--json", str(tmp_path / "r.json")])
    assert r.exit_code == 0, r.output
    assert "k_star" in json.loads((tmp_path / "r.json").read_text()) or json.loads((tmp_path / "r.json").read_text())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(0, 40), min_size=1, max_size=6), narrow=st.integers(-1, 5), seed=st.integers(0, 99))
def test_dataset_read_equals_one_scan(tmp_path_factory, sizes, narrow, seed):
    """`Dataset.read` (files decoded by several threads) gives the rows of one scan, in order,
    and a dataset one scan cannot read (a file whose id column has another type) fails the same way."""
    from mrt_fast.datasets import sources as _sources
    d = tmp_path_factory.mktemp("read")
    rng = np.random.default_rng(seed)
    start = 0
    for j, n in enumerate(sizes):
        ids = pl.Series("prompt_id", rng.integers(0, 5, n), dtype=pl.Int32 if j == narrow else pl.Int64)
        pl.DataFrame({"prompt_id": ids, "v": np.arange(start, start + n, dtype=np.float64),
                      "embedding": rng.standard_normal((n, 3)).astype(np.float32).tolist()},
                     schema_overrides={"embedding": pl.List(pl.Float32)}).write_parquet(d / f"f{j:02d}.parquet")
        start += n
    ds = _sources.discover(d)
    try:
        want = ds.scan().collect()
    except Exception as e:  # noqa: BLE001
        with pytest.raises(type(e)):
            ds.read()
        return
    got = ds.read()
    assert got.schema == want.schema
    assert got.equals(want)
    # the embeddings decoded straight into one buffer: the same table, that column in one chunk
    got = ds.read(contiguous="embedding")
    assert got.schema == want.schema and got.equals(want)
    assert got["embedding"].n_chunks() == 1 or narrow >= 0 or not want.height


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(0, 60), min_size=1, max_size=5), fault=st.sampled_from(["", "ragged", "null", "hole"]),
       array=st.booleans(), group_rows=st.integers(3, 50), seed=st.integers(0, 99))
def test_contiguous_read_equals_one_scan(tmp_path_factory, sizes, fault, array, group_rows, seed):
    """Embeddings decoded into one buffer: the rows of one scan; vectors that are ragged or hold nulls
    are read the ordinary way (and so reported by select as before)."""
    from mrt_fast.datasets import sources as _sources
    d = tmp_path_factory.mktemp("contig")
    rng = np.random.default_rng(seed)
    for j, n in enumerate(sizes):
        emb = rng.standard_normal((n, 3)).astype(np.float32).tolist()
        if n and fault == "ragged" and j == len(sizes) - 1:
            emb[-1] = emb[-1][:2]
        if n and fault == "null":
            emb[n // 2] = None
        if n and fault == "hole":
            emb[0][1] = None
        t = pl.DataFrame({"prompt_id": rng.integers(0, 5, n), "embedding": emb},
                         schema_overrides={"embedding": pl.List(pl.Float32)})
        if array and fault != "ragged":
            t = t.with_columns(pl.col("embedding").cast(pl.Array(pl.Float32, 3)))
        t.write_parquet(d / f"f{j:02d}.parquet", row_group_size=group_rows)
    ds = _sources.discover(d)
    want = ds.scan().collect()
    got = ds.read(contiguous="embedding")
    assert got.schema == want.schema and got.equals(want)
    if not fault and want.height:
        assert got["embedding"].n_chunks() == 1
        x = got["embedding"].to_numpy() if array else np.stack(got["embedding"].to_list())
        assert np.array_equal(x, np.stack(want["embedding"].to_list()))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n_pools=st.integers(1, 40), seed=st.integers(0, 999), n_files=st.integers(1, 4), n_buckets=st.integers(1, 6),
       group_rows=st.integers(2, 40), batch_rows=st.integers(1, 50), str_ids=st.booleans(), ragged=st.booleans(),
       chunk_rows=st.sampled_from([0, 1, 7, 30, 100, 10_000]), half=st.booleans())
def test_spill_by_arrow_threads_equals_the_scan(tmp_path_factory, n_pools, seed, n_files, n_buckets, group_rows,
                                                 batch_rows, str_ids, ragged, chunk_rows, half):
    """The spill pass read by two threads (runs of row groups; with ``chunk_rows``, row groups
    that fit decoded by polars, several at once, the others by Arrow) gives every bucket the rows
    the one-thread Arrow pass gives it, in input order, with the same types; a bucket read with its
    embeddings in one reused buffer is the same frame. Float16 vectors included."""
    tmp = tmp_path_factory.mktemp("spill")
    df = make_rows(n_pools, seed, str_ids=str_ids)
    if half:
        df = df.with_columns(pl.col("embedding").cast(pl.List(pl.Float16)))
    if ragged:  # one vector shorter than the rest: spilled all the same, left to select to refuse
        emb = df["embedding"].to_list()
        emb[len(emb) // 2] = emb[len(emb) // 2][:2]
        df = df.with_columns(pl.Series("embedding", emb, dtype=df["embedding"].dtype))
    (tmp / "in").mkdir()
    bounds = np.sort(np.random.default_rng(seed).integers(0, df.height + 1, n_files - 1)).tolist()
    for i, (a, b) in enumerate(zip([0, *bounds], [*bounds, df.height])):
        df[a:b].write_parquet(tmp / "in" / f"f{i}.parquet", row_group_size=group_rows)
    ds = mrt_fast.datasets.sources.discover(tmp / "in")
    from mrt_fast.datasets.arrow_runs import arrow_schema

    assert arrow_schema(ds) is not None  # the two-thread pass reads by Arrow
    assert batch.spill(ds, tmp / "one", n_buckets, "prompt_id", batch_rows=batch_rows, threads=1) == 0
    assert batch.spill(ds, tmp / "two", n_buckets, "prompt_id", batch_rows=batch_rows, threads=2,
                       chunk_rows=chunk_rows) == 0
    schema = pl.Schema({batch.ROW: pl.get_index_type(), **dict(df.schema)})
    buf: list = [[None], [None]]
    total = 0
    for i in range(n_buckets):
        a = batch.read_bucket(tmp / "one", i, schema)
        b = batch.read_bucket(tmp / "two", i, schema)
        c = batch.read_bucket(tmp / "two", i, schema, "embedding", buf)
        assert a.schema == b.schema == c.schema == schema
        assert a.equals(b) and a.equals(c)
        assert a[batch.ROW].is_sorted()
        if c.height and not ragged and not half:
            assert c["embedding"].n_chunks() == 1
        want = bucket_of(df["prompt_id"], n_buckets) == i
        assert sorted(a["prompt_id"].to_list()) == sorted(df.filter(pl.Series(want))["prompt_id"].to_list())
        total += a.height
    assert total == df.height


@pytest.mark.parametrize("dictionary", [False, True])
def test_bucket_files_hold_every_slice_and_their_end(tmp_path, dictionary):
    """Slices appended to the bucket files (Arrow IPC streams: encoded slice by slice, or by Arrow's
    stream writer where a column carries a dictionary that changes between batches) read back as the
    rows of each bucket in input order; a file cut short of its end marker is refused, not read short."""
    import pyarrow as pa

    from mrt_fast.datasets.spill import BucketWriters

    rng = np.random.default_rng(3)
    n, nb = 500, 4
    ids = rng.integers(0, 30, n)
    words = np.array(["a", "bb", "ccc", "dddd"])[rng.integers(0, 4, n)]
    t = pa.table({batch.ROW: pa.array(np.arange(n, dtype=np.uint32)), "prompt_id": ids,
                  "text": pa.array(words).dictionary_encode() if dictionary else pa.array(words)})
    with BucketWriters(tmp_path, nb, 0, staging=4096) as w:
        for a in range(0, n, 120):  # batches whose dictionaries differ
            part = t.slice(a, 120)
            if dictionary:
                part = part.set_column(2, "text", pa.array(part["text"].to_pylist()).dictionary_encode())
            w.add(part.combine_chunks().to_batches()[0], pl.Series(part["prompt_id"].to_numpy()))
    whole = pl.DataFrame({batch.ROW: np.arange(n, dtype=np.uint32), "prompt_id": ids, "text": words})
    want_bucket = bucket_of(whole["prompt_id"], nb)
    total = 0
    for i in range(nb):
        got = batch.read_bucket(tmp_path, i)
        got = got.with_columns(pl.col("text").cast(pl.String))
        want = whole.filter(pl.Series(want_bucket == i))
        assert got.select(want.columns).equals(want.with_columns(pl.col(batch.ROW).cast(got[batch.ROW].dtype)))
        total += got.height
    assert total == n
    f = batch.bucket_files(tmp_path, 0)[0]
    f.write_bytes(f.read_bytes()[:-8])
    with pytest.raises(pa.ArrowInvalid, match="end-of-stream"):
        batch.read_bucket(tmp_path, 0)


def test_select_dataset_takes_a_k_column(tmp_path):
    """k may name an integer column holding each pool's K, as in mrt_fast.select."""
    import mrt_fast

    rng = np.random.default_rng(3)
    n = 240
    df = pl.DataFrame({"prompt_id": np.repeat(np.arange(24), 10), "reward": rng.random(n),
                       "embedding": rng.normal(size=(n, 8)).astype(np.float32),
                       "k": np.repeat(rng.integers(1, 6, 24), 10)})
    df.slice(0, 120).write_parquet(tmp_path / "a.parquet")
    df.slice(120).write_parquet(tmp_path / "b.parquet")
    mrt_fast.select_dataset(str(tmp_path / "*.parquet"), tmp_path / "out", "k", "grades",
                            memory_limit=rss() + 10**9)
    got = pl.read_parquet(tmp_path / "out" / "*.parquet").sort("prompt_id", "pick_rank")
    want = mrt_fast.select(df, "k", "grades").sort("prompt_id", "pick_rank")
    assert got.select(want.columns).equals(want)
    assert got.group_by("prompt_id").len().sort("prompt_id")["len"].to_list() == \
        df.group_by("prompt_id").agg(pl.col("k").first()).sort("prompt_id")["k"].to_list()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chunks=st.lists(st.binary(min_size=0, max_size=9000), min_size=0, max_size=12),
       staging=st.integers(1, 3), direct=st.booleans())
def test_direct_files_read_back_what_was_written(tmp_path_factory, chunks, staging, direct):
    """Spill files written through aligned staging blocks (O_DIRECT where the file system takes it,
    buffered I/O where it does not) read back byte for byte, several into one reused buffer."""
    import pyarrow as pa

    from mrt_fast.datasets import direct_io

    d = tmp_path_factory.mktemp("direct")
    with mock.patch.object(direct_io.os, "O_DIRECT", getattr(os, "O_DIRECT", 0) if direct else 0, create=True):
        paths = []
        for j in range(2):
            p = d / f"f{j}.bin"
            with direct_io.DirectWriter(p, staging * 4096) as w:
                for k, c in enumerate(chunks[j::2]):  # bytes, and Arrow buffers as the IPC writer gives
                    assert w.write(pa.py_buffer(c) if k % 2 else c) == len(c)
            paths.append(p)
        want = [b"".join(chunks[0::2]), b"".join(chunks[1::2])]
        assert [p.read_bytes() for p in paths] == want
        buf: list = [None]
        for _ in range(2):  # the second read reuses the buffer
            got = direct_io.read_files(paths, buf)
            assert [bytes(g) for g in got] == want


def test_direct_files_carry_on_when_the_device_refuses_direct_io(tmp_path, monkeypatch):
    """A write or read refused as unaligned (EINVAL: a device with larger blocks) is retried without
    O_DIRECT, and the bytes are the same."""
    import errno

    from mrt_fast.datasets import direct_io

    real_write, real_readv = os.write, os.readv
    refused = {"write": 0, "read": 0}

    def write(fd, data):
        if not refused["write"]:
            refused["write"] += 1
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_write(fd, data)

    def readv(fd, bufs):
        if not refused["read"]:
            refused["read"] += 1
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_readv(fd, bufs)

    data = os.urandom(3 * 4096 + 123)
    monkeypatch.setattr(direct_io.os, "write", write)
    monkeypatch.setattr(direct_io.os, "readv", readv)
    with direct_io.DirectWriter(tmp_path / "f.bin", 4096) as w:
        w.write(data)
    (got,) = direct_io.read_files([tmp_path / "f.bin"])
    assert bytes(got) == data and refused == {"write": 1, "read": 1}


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 1000), n_parts=st.integers(2, 6), method=st.sampled_from(["random", "stratified", "grades"]))
def test_signed_zero_ids_are_one_pool_when_the_job_spills(tmp_path_factory, seed, n_parts, method):
    """0.0 and -0.0 are one prompt id in memory and across buckets: the
    spilled job keeps the rows `select` keeps, whichever spelling comes first."""
    tmp = tmp_path_factory.mktemp("zeros")
    df = make_rows(12, seed).with_columns(pl.col("prompt_id").cast(pl.Float64) - 3.0)  # pool 3 becomes 0.0
    rng = np.random.default_rng(seed)
    neg = (df["prompt_id"] == 0.0).to_numpy() & (rng.random(df.height) < 0.5)
    df = df.with_columns(pl.Series("prompt_id", np.where(neg, -0.0, df["prompt_id"].to_numpy())))
    cut(df, tmp / "in", 3, seed)
    ref = ref_select(df, 2, method, seed=seed)
    select_dataset(tmp / "in", tmp / "out.parquet", 2, method, seed=seed,
                   rows_per_part=max(1, df.height // n_parts))
    got = pl.read_parquet(tmp / "out.parquet")
    assert got["text"].to_list() == ref["text"].to_list()
    plain = ref_select(df.with_columns(pl.col("prompt_id").abs()), 2, method, seed=seed)
    assert sorted(plain["text"].to_list()) == sorted(ref["text"].to_list())


# --------------------------------------------------------------------------- report


def with_repeats(n_pools: int = 30, seed: int = 3) -> pl.DataFrame:
    """make_rows plus exact repeats of some rows (same pool, same embedding and reward)."""
    df = make_rows(n_pools, seed, dim=4, max_pool=12)
    return pl.concat([df, df.head(df.height // 3)]).drop("mode")


@pytest.mark.parametrize("method", ["grades", "stratified"])
def test_batch_report_counts_what_select_counts(tmp_path, method):
    df = with_repeats()
    _, ref = mrt_fast.select(df, 3, method, return_report=True)
    assert ref.n_duplicates_skipped > 0
    assert (ref.n_one_mode_pools if method == "stratified" else ref.n_zero_gain_picks + ref.n_tie_picks) > 0
    cut(df, tmp_path / "in", 3)
    for n in (1, 3):
        rep = select_dataset(tmp_path / "in", tmp_path / f"o{n}.parquet", 3, method, parts=n)
        got = {f: getattr(rep, f) for f in mrt_fast.SelectionReport.COUNTS}
        assert got == {f: getattr(ref, f) for f in mrt_fast.SelectionReport.COUNTS}, n


def test_batch_report_prints_as_a_summary(tmp_path):
    df = with_repeats()
    cut(df, tmp_path / "in", 2)
    rep = select_dataset(tmp_path / "in", tmp_path / "o.parquet", 3, "stratified", parts=2)
    text = str(rep)
    lines = text.splitlines()
    assert lines[0] == "BatchReport" and 8 < len(lines) < 20
    for label in ("one-mode pools", "duplicates skipped", "picks decided by the tie rule"):
        row = [ln for ln in lines if ln.strip().startswith(label)]
        assert len(row) == 1, label
    assert row[0].split()[-1] == f"{rep.n_tie_picks:,}"
    assert f"{rep.n_one_mode_pools:,}" in [ln for ln in lines if "one-mode pools" in ln][0]
    r = repr(rep)
    assert r.startswith("BatchReport(") and "\n" not in r and "peak_rss" not in r
    assert f"n_one_mode_pools={rep.n_one_mode_pools}" in r


def test_cli_summary_says_what_decided_the_picks(tmp_path):
    df = with_repeats()
    cut(df, tmp_path / "in", 2)
    _, ref = mrt_fast.select(df, 3, "stratified", return_report=True)
    r = runner.invoke(app, ["select", str(tmp_path / "in"), str(tmp_path / "o.parquet"), "--k", "3",
                            "--method", "stratified"])
    assert r.exit_code == 0, r.output
    assert re.search(rf"one-mode pools\W+{ref.n_one_mode_pools}\b", r.output)
    assert re.search(rf"duplicates skipped\W+{ref.n_duplicates_skipped}\b", r.output)
    assert re.search(r"picks decided by the tie rule\W+\d", r.output)
    r = runner.invoke(app, ["select", str(tmp_path / "in"), str(tmp_path / "g.parquet"), "--k", "3"])
    assert r.exit_code == 0 and re.search(r"zero-gain picks\W+\d", r.output), r.output


@settings(max_examples=80, deadline=None)
@given(groups=st.lists(st.integers(1, 50), min_size=1, max_size=12), chunk_rows=st.integers(1, 120),
       in_file=st.integers(0, 1000))
def test_row_group_chunks_cover_the_piece_in_order(groups, chunk_rows, in_file):
    """The chunks of a run's piece are its rows, in order, without a gap or an overlap: runs of
    whole row groups of at most ``chunk_rows`` rows for polars, and each larger row group alone
    for Arrow."""
    from mrt_fast.datasets.arrow_runs import Piece, groups_of, row_group_chunks

    ids = list(range(3, 3 + len(groups)))
    p = Piece("f.parquet", ids, 0, sum(groups), in_file, list(groups))
    pos = in_file
    starts = np.cumsum([in_file, *groups])
    for first, rows, arrow_groups in row_group_chunks(p, chunk_rows):
        assert first == pos and rows > 0
        assert first in starts and first + rows in starts  # whole row groups
        # the row groups of a chunk (what Arrow reads where polars' types cannot be cast back)
        got = groups_of(p, first, rows)
        assert sum(groups[ids.index(g)] for g in got) == rows and got == sorted(got)
        if arrow_groups is None:
            assert rows <= chunk_rows
        else:
            g = arrow_groups[0]
            assert len(arrow_groups) == 1 and groups[ids.index(g)] == rows > chunk_rows
            assert starts[ids.index(g)] == first
        pos += rows
    assert pos == in_file + sum(groups)


def test_the_spill_decodes_row_groups_that_fit_with_polars(tmp_path, monkeypatch):
    """With room for several row groups, a spill thread decodes them by polars, and its buckets
    are those of the Arrow pass."""
    import mrt_fast.datasets.arrow_runs as runs

    df = make_rows(30, 1).with_columns(pl.col("embedding").cast(pl.List(pl.Float16)))
    (tmp_path / "in").mkdir()
    df[:100].write_parquet(tmp_path / "in" / "a.parquet", row_group_size=16)
    df[100:].write_parquet(tmp_path / "in" / "b.parquet", row_group_size=16)
    ds = mrt_fast.datasets.sources.discover(tmp_path / "in")
    calls = []
    scan = runs.pl_scan
    monkeypatch.setattr(runs, "pl_scan", lambda *a: calls.append(a) or scan(*a))
    batch.spill(ds, tmp_path / "arrow", 3, "prompt_id", batch_rows=10, threads=2)
    assert not calls
    batch.spill(ds, tmp_path / "polars", 3, "prompt_id", batch_rows=10, threads=2, chunk_rows=50)
    assert len(calls) >= 2
    schema = pl.Schema({batch.ROW: pl.get_index_type(), **dict(df.schema)})
    for i in range(3):
        assert batch.read_bucket(tmp_path / "polars", i, schema).equals(batch.read_bucket(tmp_path / "arrow", i, schema))


@settings(max_examples=300, deadline=None)
@given(work=st.integers(1 << 20, 8 << 30), row_bytes=st.floats(8, 20_000), n_buckets=st.integers(2, 2000),
       threads=st.integers(1, 8), group_rows=st.sampled_from([0, 1000, 65_536, 124_000, 1_000_000]),
       lent=st.sampled_from([0.0, 0.5, 1.0, 3.0]))
def test_spill_plan_with_its_decoded_chunks_stays_within_the_work(work, row_bytes, n_buckets, threads, group_rows,
                                                                   lent):
    """Each spill thread's batch, decoded chunk of row groups and the part of its staging blocks
    not lent together fit its share of the work; the staging blocks take at most a quarter of what
    the thread has beyond its fixed cost and smallest batch plus its share of half the lent memory
    (or are the smallest block), and are the largest such; and where one thread with a batch of
    16,384 rows (or its planned batch, if smaller) decodes the largest row group whole, the plan's
    threads do too."""
    from mrt_fast._util.memory import (CHUNK_COPIES, MIN_BATCH_ROWS, MIN_STAGING, MIN_WHOLE_BATCH_ROWS,
                                       SPILL_COPIES, Budget, plan_spill, spill_thread_bytes)

    b = Budget(0, 0).with_work(work)
    lent_bytes = int(lent * work)
    sp = plan_spill(b, row_bytes, n_buckets, threads, 10**9, group_rows, lent=lent_bytes)
    if sp is None:
        assert plan_spill(b, row_bytes, n_buckets, 1, 10**9, lent=lent_bytes) is None
        return
    assert 1 <= sp.threads <= threads
    n_files = n_buckets + 1
    per = b.work / sp.threads
    borrowed = lent_bytes / (2 * sp.threads)
    own_staging = max(0.0, n_files * sp.staging - borrowed)
    used = spill_thread_bytes(sp.batch_rows, row_bytes, n_files, 0) + own_staging
    assert sp.chunk_rows >= 0 and sp.batch_rows >= 1
    assert used + CHUNK_COPIES * sp.chunk_rows * max(1.0, row_bytes) <= per + 1
    spare = per - spill_thread_bytes(MIN_BATCH_ROWS, row_bytes, n_files, 0)
    assert sp.staging == MIN_STAGING or n_files * sp.staging <= spare / 4 + borrowed
    assert n_files * 2 * sp.staging > spare / 4 + borrowed or sp.staging == 1 << 20  # the largest that fits
    alone = plan_spill(b, row_bytes, n_buckets, 1, 10**9, lent=lent_bytes)
    if group_rows:
        fixed1 = spill_thread_bytes(0, row_bytes, n_files, 0) + max(0.0, n_files * alone.staging - lent_bytes / 2)
        small = min(alone.batch_rows, MIN_WHOLE_BATCH_ROWS)
        rb = max(1.0, row_bytes)
        if fixed1 + SPILL_COPIES * small * rb + CHUNK_COPIES * group_rows * rb <= b.work:
            assert sp.chunk_rows >= group_rows


def test_polars_decodes_the_spill_only_where_it_is_the_faster(tmp_path, monkeypatch):
    """Float16 vectors are decoded by polars; float32 ones (Arrow the faster) and files of no vectors by Arrow."""
    import pyarrow as pa

    import mrt_fast.datasets.arrow_runs as runs

    assert runs.polars_decodes_faster(pa.schema([("e", pa.list_(pa.float16()))]))
    assert runs.polars_decodes_faster(pa.schema([("p", pa.int64()), ("e", pa.large_list(pa.float16()))]))
    assert not runs.polars_decodes_faster(pa.schema([("e", pa.list_(pa.float32())), ("r", pa.float16())]))
    assert not runs.polars_decodes_faster(None)
    df = make_rows(20, 2)
    (tmp_path / "in").mkdir()
    df.write_parquet(tmp_path / "in" / "a.parquet", row_group_size=16)
    calls = []
    scan = runs.pl_scan
    monkeypatch.setattr(runs, "pl_scan", lambda *a: calls.append(a) or scan(*a))
    batch.spill(mrt_fast.datasets.sources.discover(tmp_path / "in"), tmp_path / "s", 3, "prompt_id",
                batch_rows=10, threads=2, chunk_rows=1000)
    assert not calls  # float32 vectors: Arrow


def test_the_plan_knows_the_largest_row_group_only_where_polars_decodes_it(tmp_path):
    """`whole_group_rows`: the rows of the largest row group of local float16-vector files (whose
    groups the spill decodes whole), 0 for float32 vectors (Arrow decodes them a batch at a time)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for dt, want in ((pa.float16(), 40), (pa.float32(), 0)):
        d = tmp_path / str(dt)
        d.mkdir()
        for f, n in (("a", 100), ("b", 30)):
            vecs = pa.array([[1.0, 2.0]] * n, type=pa.list_(dt))
            pq.write_table(pa.table({"prompt_id": list(range(n)), "embedding": vecs}), d / f"{f}.parquet",
                           row_group_size=40)
        assert local_plan.whole_group_rows(mrt_fast.datasets.sources.discover(d)) == want


def test_a_killed_runs_spill_beside_a_file_is_removed_when_the_file_is_done(tmp_path):
    """A run killed after its file output was finished, before it removed its spill: the next run
    finds the job done, and the dead run's spill folder is gone all the same."""
    df = make_rows(20, 3)
    cut(df, tmp_path / "in", 2)
    out = tmp_path / "o.parquet"
    select_dataset(tmp_path / "in", out, 3, "grades")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a process id that is gone
    stale = tmp_path / f".o.parquet.spill-{dead.pid}-x"
    (stale / "parts").mkdir(parents=True)
    rep = select_dataset(tmp_path / "in", out, 3, "grades")
    assert rep.already_done
    assert sorted(os.listdir(tmp_path)) == ["in", "o.parquet"]
