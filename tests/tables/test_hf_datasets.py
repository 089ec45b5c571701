"""A Hugging Face `datasets.Dataset` goes in as it is and comes back as a `Dataset`."""

from __future__ import annotations

import warnings

import numpy as np
import polars as pl
import pytest

import mrt_fast
from mrt_fast import MrtInputError

datasets = pytest.importorskip("datasets")


def table(seed: int = 0) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    ids = np.repeat(np.arange(6), 5)
    return pl.DataFrame({"prompt_id": ids, "response": [f"r{i}" for i in range(30)],
                         "reward": rng.standard_normal(30), "loss": rng.gamma(2.0, 1.0, 30),
                         "embedding": rng.standard_normal((30, 8)).astype(np.float32)}
                        ).with_columns(pl.col("embedding").cast(pl.List(pl.Float32)))


@pytest.mark.parametrize("method", ["random", "top", "grades"])
def test_select_takes_and_gives_a_dataset(method):
    df = table()
    ds = datasets.Dataset.from_polars(df)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got, rep = mrt_fast.select(ds, 2, method, return_report=True)
        want = mrt_fast.select(df, 2, method)
    assert isinstance(got, datasets.Dataset) and rep.n_pools == 6
    assert pl.from_arrow(got.data.table).select(want.columns).equals(want)


def test_a_shuffled_dataset_is_read_in_its_current_order():
    df = table(1)
    ds = datasets.Dataset.from_polars(df).shuffle(seed=3)  # an index mapping over the same Arrow table
    got = mrt_fast.select(ds, 2, "random")
    want = mrt_fast.select(pl.from_arrow(ds.with_format("arrow")[:]), 2, "random")
    assert got.to_dict() == want.to_dict(as_series=False)


def test_variance_budget_reads_a_dataset():
    df = table(2)
    a = mrt_fast.variance_budget(datasets.Dataset.from_polars(df), n_boot=50)
    b = mrt_fast.variance_budget(df, n_boot=50)
    assert (a.v_x, a.v_y_given_x, a.k_best) == (b.v_x, b.v_y_given_x, b.k_best)


def test_the_table_readers_and_export_take_a_dataset(tmp_path):
    from mrt_fast.datasets.formats import as_polars
    from mrt_fast.llm.export import export

    df = table(3).with_columns(prompt=pl.format("p{}", "prompt_id"))
    ds = datasets.Dataset.from_polars(df).shuffle(seed=1)
    assert as_polars(ds).equals(pl.from_arrow(ds.with_format("arrow")[:]))
    for fmt in ("trl", "dpo"):
        got = export(ds, tmp_path / f"a-{fmt}.jsonl", fmt)
        assert got.equals(export(as_polars(ds), tmp_path / f"b-{fmt}.jsonl", fmt))


def test_splits_and_streams_are_refused_in_one_line():
    d = datasets.DatasetDict({"train": datasets.Dataset.from_polars(table())})
    with pytest.raises(MrtInputError, match=r"pass one split, e.g. ds\['train'\]"):
        mrt_fast.select(d, 2, "random")
    with pytest.raises(MrtInputError, match="IterableDataset"):
        mrt_fast.select(datasets.Dataset.from_polars(table()).to_iterable_dataset(), 2, "random")
    with pytest.raises(MrtInputError, match="datasets.Dataset"):
        mrt_fast.variance_budget({"prompt_id": [1], "loss": [1.0]})
