"""The decoded size of a Parquet file (`parquet_size.arrow_bytes`): text stored with a dictionary
(a prompt repeated on each of its responses) is sized as Arrow holds it, not as the footer's encoded
pages say; other columns keep the footer's figure."""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mrt_fast.datasets import sources
from mrt_fast.datasets.parquet_size import arrow_bytes, dictionary_text_columns


def footer_bytes(path) -> int:
    md = pq.ParquetFile(path).metadata
    return sum(md.row_group(g).total_byte_size for g in range(md.num_row_groups))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.integers(1, 20_000), distinct=st.integers(1, 400), length=st.integers(1, 300),
       nested=st.booleans(), group_rows=st.integers(500, 20_000), seed=st.integers(0, 999))
def test_dictionary_text_is_sized_as_arrow_holds_it(tmp_path_factory, rows, distinct, length, nested, group_rows,
                                                     seed):
    rng = np.random.default_rng(seed)
    words = np.array(["x" * int(n) for n in rng.integers(1, length + 1, distinct)])
    text = words[rng.integers(0, distinct, rows)]
    col = pa.array([[t, t] for t in text]) if nested else pa.array(text)
    table = pa.table({"prompt_id": np.arange(rows) // 7, "text": col})
    path = tmp_path_factory.mktemp("size") / "f.parquet"
    pq.write_table(table, path, row_group_size=group_rows, use_dictionary=True)
    pf = pq.ParquetFile(path)
    got = arrow_bytes(pf)
    assert got >= footer_bytes(path)  # never less than the footer says
    assert "text" in dictionary_text_columns(pf.metadata)
    # the text as Arrow holds it, within what sizing from the first rows can miss (lengths vary)
    text_bytes = table.column("text").nbytes
    other = footer_bytes(path) - sum(pf.metadata.row_group(g).column(c).total_uncompressed_size
                                     for g in range(pf.metadata.num_row_groups)
                                     for c in range(pf.metadata.num_columns)
                                     if pf.metadata.row_group(g).column(c).path_in_schema.startswith("text"))
    sampled = min(rows, 2048)
    lens = np.char.str_len(text)
    # what the first rows say of a row's text, against the mean over every row
    skew = (lens[:sampled].mean() + 4 * (2 if nested else 1)) / (lens.mean() + 4 * (2 if nested else 1))
    assert 0.5 * skew * text_bytes <= got - other <= 2.0 * skew * text_bytes + 64 * 1024


def test_numbers_and_plain_text_keep_the_footers_figure(tmp_path):
    rng = np.random.default_rng(0)
    n = 5000
    df = pl.DataFrame({"prompt_id": np.arange(n) // 5, "reward": rng.standard_normal(n),
                       "response": [f"unique response {i} " * 3 for i in range(n)]})
    df.write_parquet(tmp_path / "a.parquet")
    pq.write_table(df.to_arrow(), tmp_path / "b.parquet", use_dictionary=False)
    for f in ("a.parquet", "b.parquet"):
        pf = pq.ParquetFile(tmp_path / f)
        if "response" not in dictionary_text_columns(pf.metadata):
            assert arrow_bytes(pf) == footer_bytes(tmp_path / f)
    # an empty file: nothing to decode
    pq.write_table(df.head(0).to_arrow(), tmp_path / "e.parquet")
    assert arrow_bytes(pq.ParquetFile(tmp_path / "e.parquet")) == footer_bytes(tmp_path / "e.parquet")


def test_a_dataset_of_repeated_prompts_is_sized_whole(tmp_path):
    """The dataset's estimate (what the memory plan starts from) counts every row's text."""
    rng = np.random.default_rng(1)
    n = 40_000
    prompts = np.array([f"prompt {i}: " + "words " * 60 for i in range(n // 8)])
    df = pl.DataFrame({"prompt": prompts[np.arange(n) // 8], "reward": rng.standard_normal(n)})
    (tmp_path / "in").mkdir()
    df.write_parquet(tmp_path / "in" / "p.parquet")
    est = sources.discover(tmp_path / "in").memory_bytes()
    arrow = pq.read_table(tmp_path / "in" / "p.parquet").nbytes
    assert footer_bytes(tmp_path / "in" / "p.parquet") < arrow / 3  # the footer alone misses most of it
    assert 0.8 * arrow <= est <= 1.25 * arrow


def test_many_files_are_sized_from_a_few_samples(tmp_path, monkeypatch):
    """Past SAMPLED_FILES files, only that many are decoded; the others are sized at their bytes per row."""
    from mrt_fast.datasets import parquet_size

    rng = np.random.default_rng(2)
    (tmp_path / "in").mkdir()
    texts = np.array([f"response {i} " + "text " * 40 for i in range(50)])
    for j in range(40):
        n = int(rng.integers(200, 2000))
        pl.DataFrame({"prompt_id": np.arange(n) // 4, "response": texts[rng.integers(0, 50, n)]}).write_parquet(
            tmp_path / "in" / f"f{j:03d}.parquet")
    sampled = []
    real = parquet_size.sampled_bytes_per_row
    monkeypatch.setattr(parquet_size, "sampled_bytes_per_row", lambda pf, cols: sampled.append(1) or real(pf, cols))
    est = sources.discover(tmp_path / "in").memory_bytes()
    arrow = sum(pq.read_table(f).nbytes for f in sorted((tmp_path / "in").glob("*.parquet")))
    assert len(sampled) <= parquet_size.SAMPLED_FILES
    assert 0.8 * arrow <= est <= 1.25 * arrow
