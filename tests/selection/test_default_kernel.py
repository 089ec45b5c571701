"""One default kernel, "clip", for every selector entry point; "shift" (the paper's code) on request."""

import inspect

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

import mrt_fast
from mrt_fast.cli import app
from mrt_fast.cli.select import select_cmd
from mrt_fast.datasets import Manifest
from mrt_fast.datasets.local import select_dataset
from mrt_fast.selection.knn import facility_location_corpus, knn_graph
from mrt_fast.selection.options import DEFAULT_KERNEL, KERNELS, SelectOptions

# mode A: three near-copies of a high-reward answer; mode B: one answer orthogonal to
# them, of middling reward; one low-reward row sets the bottom of the reward scale
X = np.array([[1, 0.05, 0], [1, 0, 0.05], [1, -0.05, 0], [0, 0, 1], [0.2, 0.2, 0.2]], dtype=np.float32)
R = np.array([1.0, 0.95, 0.9, 0.3, 0.0])
MODE_B = 3


def pool_table(n_pools=3):
    return pl.DataFrame({"prompt_id": np.repeat(np.arange(n_pools), len(R)),
                         "response": [f"p{p} r{i}" for p in range(n_pools) for i in range(len(R))],
                         "embedding": np.tile(X, (n_pools, 1)), "reward": np.tile(R, n_pools)})


def test_the_default_kernel_is_clip_in_every_entry_point():
    assert DEFAULT_KERNEL == "clip" and DEFAULT_KERNEL in KERNELS
    assert SelectOptions(k=2).kernel == DEFAULT_KERNEL
    for fn in (mrt_fast.select, mrt_fast.facility_location, knn_graph):
        assert inspect.signature(fn).parameters["kernel"].default == DEFAULT_KERNEL, fn.__name__
    assert inspect.signature(select_cmd).parameters["kernel"].default.default == DEFAULT_KERNEL
    # the dataset engines (local and Ray) and facility_location_corpus take no kernel default of their own
    assert "kernel" not in inspect.signature(select_dataset).parameters
    assert "kernel" not in inspect.signature(facility_location_corpus).parameters


def test_by_default_grades_covers_the_second_mode_where_shift_keeps_a_near_copy():
    clip = mrt_fast.facility_location(X, 2, rewards=R, alpha=0.75, kernel="clip").indices.tolist()
    shift = mrt_fast.facility_location(X, 2, rewards=R, alpha=0.75, kernel="shift").indices.tolist()
    assert clip == [0, MODE_B] and shift == [0, 1]
    assert mrt_fast.facility_location(X, 2, rewards=R, alpha=0.75).indices.tolist() == clip
    df = pool_table()
    for method in ("grades", "diverse"):
        default = mrt_fast.select(df, 2, method)
        assert default.equals(mrt_fast.select(df, 2, method, kernel="clip"))
        assert default.equals(mrt_fast.select(df, options=SelectOptions(k=2, method=method)))
    assert not mrt_fast.select(df, 2, "grades").equals(mrt_fast.select(df, 2, "grades", kernel="shift"))


def test_the_dataset_job_and_mrt_select_take_the_same_default(tmp_path):
    df = pool_table()
    df.write_parquet(tmp_path / "in.parquet")
    want = mrt_fast.select(df, 2, "grades", kernel="clip")
    rep = select_dataset(tmp_path / "in.parquet", tmp_path / "job", 2, "grades")
    assert Manifest.read(tmp_path / "job").parameters["kernel"] == DEFAULT_KERNEL
    got = pl.scan_parquet(tmp_path / "job").collect()
    assert rep.n_kept == want.height and got.sort(["prompt_id", "pick_rank"]).equals(want)
    r = CliRunner().invoke(app, ["select", str(tmp_path / "in.parquet"), str(tmp_path / "cli.parquet"), "--k", "2"])
    assert r.exit_code == 0, r.output
    assert pl.read_parquet(tmp_path / "cli.parquet").equals(want)
    r = CliRunner().invoke(app, ["select", str(tmp_path / "in.parquet"), str(tmp_path / "shift.parquet"), "--k", "2",
                                 "--kernel", "shift"])
    assert r.exit_code == 0, r.output
    assert pl.read_parquet(tmp_path / "shift.parquet").equals(mrt_fast.select(df, 2, "grades", kernel="shift"))


@pytest.mark.embed
def test_knn_graphs_clip_by_default():
    pytest.importorskip("faiss")
    g = knn_graph(X, 4)
    assert g.kernel == DEFAULT_KERNEL
    # clip: the orthogonal pair has similarity 0 and is dropped; shift would keep it at 1/2
    assert g.nnz < knn_graph(X, 4, kernel="shift").nnz == len(X) ** 2
