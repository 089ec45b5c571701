"""Stages apart from executors: one select_dataset for both engines, one row-stage interface, one
report; each engine's options refused on the other before any work."""

from __future__ import annotations

import threading

import numpy as np
import polars as pl
import pytest

from mrt_fast.datasets.executors import executor, run_row_parts
from mrt_fast.datasets.job import Job
from mrt_fast.datasets.report import BatchReport, JobReport
from mrt_fast.datasets.select_job import select_dataset
from mrt_fast.datasets.stage import RowStage
from mrt_fast.errors import MrtInputError


def rows(tmp_path, n=30):
    df = pl.DataFrame({"prompt_id": np.arange(n) // 3, "response": [f"r{i}" for i in range(n)],
                       "reward": np.arange(n, dtype=np.float64) % 5})
    df.write_parquet(tmp_path / "in.parquet")
    return df


@pytest.mark.parametrize("engine,kw,said", [
    ("gpu", {}, "engine must be 'local' or 'ray', got 'gpu'"),
    ("local", {"shuffle": "sort"}, "ray_address, max_retries and shuffle apply to engine='ray' only"),
    ("local", {"ray_address": "auto"}, "ray_address, max_retries and shuffle apply to engine='ray' only"),
    ("ray", {"memory_limit": "1GB"}, "memory_limit and workers apply to engine='local' only"),
    ("ray", {"workers": 2}, "memory_limit and workers apply to engine='local' only"),
    ("ray", {"parts": 0}, "parts must be an integer >= 1, got 0"),
])
def test_an_option_of_the_other_engine_is_refused_before_any_work(tmp_path, engine, kw, said):
    rows(tmp_path)
    with pytest.raises(MrtInputError, match=said):
        select_dataset(tmp_path / "in.parquet", tmp_path / "out", 2, "top", engine=engine, **kw)
    assert not (tmp_path / "out").exists()


def test_the_old_import_paths_serve_the_one_select_dataset_and_report():
    import mrt_fast
    from mrt_fast.datasets import local

    assert local.select_dataset is select_dataset is mrt_fast.select_dataset
    assert local.BatchReport is BatchReport is mrt_fast.BatchReport and issubclass(BatchReport, JobReport)
    from mrt_fast.embeddings.dataset import EmbedReport
    from mrt_fast.llm.dataset_stages import StageReport

    assert issubclass(EmbedReport, JobReport) and issubclass(StageReport, JobReport)


def test_the_select_reports_old_names_read_and_write_its_fields(tmp_path):
    df = rows(tmp_path)
    rep = select_dataset(tmp_path / "in.parquet", tmp_path / "out", 2, "top", parts=3)
    assert (rep.n_parts, rep.n_input_rows, rep.n_out_rows) == (rep.parts, rep.rows, rep.rows_out) == (3, df.height,
                                                                                                      20)
    d = rep.to_dict()
    assert d["parts"] == d["n_parts"] == 3 and d["rows_out"] == d["n_out_rows"] == 20
    rep.n_parts = 7
    assert rep.parts == 7
    again = select_dataset(tmp_path / "in.parquet", tmp_path / "out", 2, "top")
    assert again.already_done and str(again) == (f"{tmp_path / 'out'} is already complete (3 part(s), 20 rows "
                                                 "written); nothing to do")


class Counting(RowStage):
    """A stage that counts its rows and how often it was opened (opened once per worker)."""

    name = "count"
    opened = 0

    def open(self, tick=None):
        Counting.opened += 1
        return lambda df: (df.with_columns(pl.col("response").str.to_uppercase()), {"seen": df.height, "parts": 1})


def test_a_row_stage_is_opened_once_and_its_counts_are_summed(tmp_path):
    df = rows(tmp_path, 25)
    Counting.opened = 0
    with Job(tmp_path / "in.parquet", tmp_path / "out", {}) as job:
        r = executor("local").run_row_parts(job, Counting(), rows_per_part=4, workers=3)
    assert Counting.opened == 1 and r["counts"] == {"seen": 25, "parts": 7}
    assert r["parts"] == r["parts_done_now"] == 7 and r["rows_written"] == 25
    got = pl.read_parquet(tmp_path / "out")
    assert got["response"].to_list() == [s.upper() for s in df["response"]]


def test_a_plain_function_of_a_part_is_a_stage_too(tmp_path):
    rows(tmp_path, 10)
    seen = []
    lock = threading.Lock()

    def part(df):
        with lock:
            seen.append(df.height)
        return df

    with Job(tmp_path / "in.parquet", tmp_path / "o.parquet", {}) as job:
        r = run_row_parts(job, part, rows_per_part=3)
    assert sorted(seen) == [1, 3, 3, 3] and r["counts"] == {} and r["rows_written"] == 10
