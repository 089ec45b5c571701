"""The answers stage reads and writes s3:// (a moto S3 server on 127.0.0.1) like local files."""

from __future__ import annotations

import io

import polars as pl
import pytest

pytest.importorskip("moto.server")
pytest.importorskip("boto3")

import mrt_fast  # noqa: E402
from mrt_fast.answers import answers_dataset  # noqa: E402
from mrt_fast.datasets import discover, storage  # noqa: E402

pytestmark = pytest.mark.s3


def test_answers_from_and_to_s3_equal_the_in_memory_result(s3_bucket):
    df = pl.DataFrame({"prompt_id": [1, 1, 2, 2, 3], "response": ["408", "480", "\\boxed{1/2}", "0.5", "x"],
                       "ref": ["408", "408", "1/2", "1/2", "3"]})
    buf = io.BytesIO()
    df.write_parquet(buf)
    storage.write_bytes(f"{s3_bucket}/in/f.parquet", buf.getvalue())
    rep = answers_dataset(f"{s3_bucket}/in", f"{s3_bucket}/out", reference="ref", rows_per_part=2)
    assert discover(f"{s3_bucket}/out").read().equals(mrt_fast.answers(df, reference="ref"))
    assert rep.pools == 3 and rep.zero_signal_pools == 2
    again = answers_dataset(f"{s3_bucket}/in", f"{s3_bucket}/out", reference="ref", rows_per_part=2)
    assert again.rows == df.height  # finished: left as it is, reported from the output
