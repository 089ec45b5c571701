"""Parquet objects on object storage whose pages were damaged are refused naming the object, on every
path `mrt select` reads them by (in memory, spilled, read in place, grouped rows by parts; the Ray
engine's exchange, its parts read in place and its row stages) and by the variance fold, never decoded
as other values: polars does not check page checksums, so these paths read objects with Arrow, which
does, or walk them first."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_input_edges import zero_last_page_bytes

from mrt_fast import MrtInputError
from mrt_fast.datasets import select_dataset, storage
from mrt_fast.datasets.parquet_pages import verify_pages

pytest.importorskip("moto.server")

pytestmark = [pytest.mark.s3, pytest.mark.filterwarnings("ignore::mrt_fast.errors.SmallPoolWarning")]


def table(n_pools: int = 300, seed: int = 0, consecutive: bool = False) -> pa.Table:
    """Pools of 4 with the reward last: a zeroed last page changes rewards, which no check of the
    values would notice."""
    rng = np.random.default_rng(seed)
    ids = np.repeat(np.arange(n_pools), 4)
    if not consecutive:
        ids = rng.permutation(ids)
    n = len(ids)
    return pa.table({"prompt_id": pa.array(ids, pa.int64()),
                     "embedding": pa.array(list(rng.random((n, 4)).astype(np.float32)), pa.list_(pa.float32())),
                     "reward": pa.array(rng.random(n))})


def put_damaged(t: pa.Table, tmp: Path, prefix: str, n_files: int = 2) -> str:
    """``t`` over ``n_files`` objects with page checksums, the last one's last page zeroed; its URL."""
    cuts = np.linspace(0, t.num_rows, n_files + 1).astype(int)
    for j in range(n_files):
        good = tmp / f"f{j}.parquet"
        pq.write_table(t.slice(cuts[j], cuts[j + 1] - cuts[j]), good, write_page_checksum=True,
                       compression="none", use_dictionary=False)
        if j == n_files - 1:
            zero_last_page_bytes(good, tmp / "bad.parquet")
            good = tmp / "bad.parquet"
        storage.write_bytes(f"{prefix}/f{j}.parquet", good.read_bytes())
    return f"{prefix}/f{n_files - 1}.parquet"


@pytest.mark.parametrize("how", ["in memory", "spilled", "in place"])
def test_a_damaged_object_is_refused_naming_it(tmp_path, s3_bucket, how):
    bad = put_damaged(table(consecutive=how == "in place"), tmp_path, f"{s3_bucket}/in")
    assert not pq.read_table(tmp_path / "bad.parquet")["reward"].equals(
        pq.read_table(tmp_path / "f1.parquet")["reward"])  # polars and pyarrow alike decode it unchecked
    with pytest.raises(MrtInputError) as e:
        select_dataset(f"{s3_bucket}/in", tmp_path / "o.parquet", 2, "grades", parts=None if how == "in memory"
                       else 3)
    assert bad in str(e.value) and "checksum" in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert not (tmp_path / "o.parquet").exists()


def test_objects_arrow_reads_otherwise_are_walked_first(tmp_path, s3_bucket):
    """Objects whose types differ (int32 ids in one, int64 in the other) are read by polars: each is
    walked first, one request a column chunk."""
    t = table()
    bad = put_damaged(t.cast(pa.schema([("prompt_id", pa.int32()), *list(t.schema)[1:]])), tmp_path,
                      f"{s3_bucket}/in")
    pq.write_table(t.slice(0, 600), tmp_path / "f0_64.parquet", write_page_checksum=True)
    storage.write_bytes(f"{s3_bucket}/in/f0.parquet", (tmp_path / "f0_64.parquet").read_bytes())
    for parts in (None, 3):
        with pytest.raises(MrtInputError, match="does not match its checksum") as e:
            select_dataset(f"{s3_bucket}/in", tmp_path / "o.parquet", 2, "grades", parts=parts)
        assert bad in str(e.value)
    # a good object walks clean, and is walked once per version
    storage.write_bytes(f"{s3_bucket}/ok.parquet", (tmp_path / "f0_64.parquet").read_bytes())
    verify_pages(storage.ObjectPath(f"{s3_bucket}/ok.parquet"))


def grouped(n_pools: int = 200, seed: int = 1) -> pa.Table:
    """One row per prompt (lists of 3 candidates), the rewards last."""
    rng = np.random.default_rng(seed)
    return pa.table({"prompt_id": pa.array(np.arange(n_pools), pa.int64()),
                     "embedding": pa.array([list(rng.random((3, 4)).astype(np.float32)) for _ in range(n_pools)],
                                           pa.list_(pa.list_(pa.float32()))),
                     "reward": pa.array([list(rng.random(3)) for _ in range(n_pools)], pa.list_(pa.float64()))})


@pytest.mark.parametrize("parts", [None, 3])
def test_grouped_rows_read_by_parts_refuse_a_damaged_object(tmp_path, s3_bucket, parts):
    bad = put_damaged(grouped(), tmp_path, f"{s3_bucket}/in")
    with pytest.raises(MrtInputError) as e:
        select_dataset(f"{s3_bucket}/in", f"{s3_bucket}/out", 2, "grades", parts=parts)
    assert bad in str(e.value) and "checksum" in str(e.value), str(e.value)


def test_the_variance_fold_refuses_a_damaged_object(tmp_path, s3_bucket):
    from mrt_fast.datasets.executors.local_fold import variance_budget_files

    t = table()
    bad = put_damaged(t.rename_columns(["prompt_id", "embedding", "loss"]), tmp_path, f"{s3_bucket}/in")
    with pytest.raises(MrtInputError) as e:
        variance_budget_files(f"{s3_bucket}/in", batch_rows=500)
    assert bad in str(e.value) and "checksum" in str(e.value), str(e.value)
    good = f"{s3_bucket}/good"
    storage.write_bytes(f"{good}/f0.parquet", (tmp_path / "f0.parquet").read_bytes())
    assert variance_budget_files(good, batch_rows=500).n_prompts > 0


@pytest.mark.ray
@pytest.mark.parametrize("how", ["exchanged", "in place", "Ray Data's shuffle", "Ray Data's reader"])
def test_the_ray_engine_refuses_a_damaged_object_naming_it(tmp_path, s3_endpoint, local_ray, s3_bucket, how):
    from mrt_fast.datasets import ray_engine

    bad = put_damaged(table(consecutive=how == "in place"), tmp_path, f"{s3_bucket}/in")
    with pytest.raises(MrtInputError) as e:
        if how == "Ray Data's reader":
            ray_engine.read(f"{s3_bucket}/in").count()
        else:
            ray_engine.select_dataset(f"{s3_bucket}/in", f"{s3_bucket}/out", 2, "grades", parts=3,
                                      shuffle="sort" if how == "Ray Data's shuffle" else "files")
    assert bad in str(e.value) and "checksum" in str(e.value), str(e.value)


@pytest.mark.ray
def test_ray_row_stages_refuse_a_damaged_object(tmp_path, s3_endpoint, local_ray, s3_bucket):
    from mrt_fast.datasets import ray_engine

    bad = put_damaged(grouped(), tmp_path, f"{s3_bucket}/in")
    with pytest.raises(MrtInputError) as e:
        ray_engine.select_dataset(f"{s3_bucket}/in", f"{s3_bucket}/out", 2, "grades", parts=3)
    assert bad in str(e.value) and "checksum" in str(e.value), str(e.value)


def test_objects_without_checksums_are_read_by_polars_and_give_the_same_rows(tmp_path, s3_bucket):
    """Most writers (polars, pyarrow's default) write no page checksums: nothing to check, so such
    objects keep polars' reader; objects with them are read by Arrow; the rows are the same."""
    from mrt_fast.datasets import checked_objects, discover
    from mrt_fast.datasets.parquet_pages import carries_checksums

    t = table()
    for name, crc in (("plain", False), ("crc", True)):
        pq.write_table(t, tmp_path / f"{name}.parquet", write_page_checksum=crc)
        storage.write_bytes(f"{s3_bucket}/{name}/f.parquet", (tmp_path / f"{name}.parquet").read_bytes())
        ds = discover(f"{s3_bucket}/{name}")
        assert carries_checksums(ds.files[0]) is crc and checked_objects.applies(ds) is crc
        assert (checked_objects.read_all(ds, 2) is not None) is crc
    got = [select_dataset(f"{s3_bucket}/{name}", tmp_path / f"{name}-o.parquet", 2, "grades") and
           pq.read_table(tmp_path / f"{name}-o.parquet") for name in ("plain", "crc")]
    assert got[0].equals(got[1])


def test_the_memory_plan_counts_the_checked_readers_buffers(tmp_path, s3_bucket):
    """A whole read of checksummed objects holds a read buffer a column a thread besides its batches: the
    in-memory plan counts them, so a limit that fits the data alone no longer fits it with them."""
    import os

    import polars as pl

    from mrt_fast._util.memory import Budget
    from mrt_fast.datasets import discover
    from mrt_fast.datasets.arrow_runs import OBJECT_BUFFER
    from mrt_fast.datasets.checked_objects import read_buffer_bytes
    from mrt_fast.datasets.executors.local_plan import fits_in_memory

    t = table()
    for name, crc in (("plain", False), ("crc", True)):
        pq.write_table(t, tmp_path / f"{name}.parquet", write_page_checksum=crc)
        storage.write_bytes(f"{s3_bucket}/{name}/f.parquet", (tmp_path / f"{name}.parquet").read_bytes())
    assert read_buffer_bytes(discover(tmp_path / "crc.parquet")) == 0  # a local file: walked, read by polars
    assert read_buffer_bytes(discover(f"{s3_bucket}/plain")) == 0
    ds = discover(f"{s3_bucket}/crc")
    buffers = read_buffer_bytes(ds)
    assert buffers == OBJECT_BUFFER * 3 * max(1, min(pl.thread_pool_size(), os.cpu_count() or 1))
    total = ds.memory_bytes()
    lo, hi = 0, 1 << 34  # the least work that fits without the buffers
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits_in_memory(total, t.num_rows, Budget(0, 0).with_work(mid)) else (mid, hi)
    work = Budget(0, 0).with_work(hi)
    assert fits_in_memory(total, t.num_rows, work) and not fits_in_memory(total, t.num_rows, work, None, buffers)
