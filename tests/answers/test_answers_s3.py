"""The answers stage reads and writes s3:// (a moto S3 server on 127.0.0.1) like local files."""

from __future__ import annotations

import io
import os

import polars as pl
import pytest

moto_server = pytest.importorskip("moto.server")
boto3 = pytest.importorskip("boto3")

import mrt_fast  # noqa: E402
from mrt_fast.answers import answers_dataset  # noqa: E402
from mrt_fast.datasets import discover, storage  # noqa: E402

pytestmark = pytest.mark.s3
ENV = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION")


@pytest.fixture(scope="module")
def bucket():
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    srv = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    srv.start()
    host, port = srv.get_host_and_port()
    old = {k: os.environ.get(k) for k in ENV}
    os.environ.update(AWS_ENDPOINT_URL=f"http://{host}:{port}", AWS_ACCESS_KEY_ID="testing",
                      AWS_SECRET_ACCESS_KEY="testing", AWS_REGION="us-east-1")
    try:
        boto3.client("s3").create_bucket(Bucket="mrt-answers")
        yield "s3://mrt-answers"
    finally:
        srv.stop()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_answers_from_and_to_s3_equal_the_in_memory_result(bucket):
    df = pl.DataFrame({"prompt_id": [1, 1, 2, 2, 3], "response": ["408", "480", "\\boxed{1/2}", "0.5", "x"],
                       "ref": ["408", "408", "1/2", "1/2", "3"]})
    buf = io.BytesIO()
    df.write_parquet(buf)
    storage.write_bytes(f"{bucket}/in/f.parquet", buf.getvalue())
    rep = answers_dataset(f"{bucket}/in", f"{bucket}/out", reference="ref", rows_per_part=2)
    assert discover(f"{bucket}/out").read().equals(mrt_fast.answers(df, reference="ref"))
    assert rep.pools == 3 and rep.zero_signal_pools == 2
    again = answers_dataset(f"{bucket}/in", f"{bucket}/out", reference="ref", rows_per_part=2)
    assert again.rows == df.height  # finished: left as it is, reported from the output
