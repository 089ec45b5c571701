"""Objects above the writer's multipart threshold on object storage (``s3://``), against moto's
server: pyarrow's S3 filesystem sends an object of 10 MiB or more as a multipart upload
(fixed in Arrow, not a setting), so the inputs and parts here are real sizes, generated here.
A multipart object's ETag is no MD5 of its bytes: a part is known by the size the listing gives
and the BLAKE2b checksum in its name, which these tests check against the bytes read back."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

boto3 = pytest.importorskip("boto3")
pytest.importorskip("moto.server")

import mrt_fast  # noqa: E402
from mrt_fast import MrtInputError  # noqa: E402
from mrt_fast.datasets import Manifest, discover, select_dataset  # noqa: E402
from mrt_fast.datasets import storage  # noqa: E402
from mrt_fast.datasets.job import StoppedForTest, stopping_after  # noqa: E402
from mrt_fast.datasets.object_output import PART_OBJECT  # noqa: E402
from test_object_storage import keys, put_table, rows  # noqa: E402

pytestmark = [pytest.mark.s3, pytest.mark.filterwarnings("ignore::mrt_fast.errors.SmallPoolWarning")]

MiB = 2**20
#: pyarrow's S3 output stream uploads an object of this size or more in parts of this size
PART_UPLOAD = 10 * MiB


def head(url: str) -> dict:
    b, _, k = str(url).split("://", 1)[1].partition("/")
    return boto3.client("s3").head_object(Bucket=b, Key=k)


def n_upload_parts(url: str) -> int:
    """How many parts the object was uploaded in (the ``-N`` of a multipart ETag; 1 for one PUT)."""
    etag = head(url)["ETag"].strip('"')
    return int(etag.split("-")[1]) if "-" in etag else 1


def wide_rows(n_pools: int, seed: int, d: int = 64) -> pl.DataFrame:
    """Pools of 2 or 3 responses with random (incompressible) float32 embeddings: ~260 bytes a row
    in Parquet, of which K=2 keeps ~80%."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(2, 4, n_pools)
    n = int(sizes.sum())
    return pl.DataFrame({
        "prompt_id": np.repeat(np.arange(n_pools), sizes),
        "response": [f"r{i}" for i in range(n)],
        "reward": rng.normal(size=n),
        "loss": rng.gamma(2.0, 0.5, size=n),
    }).with_columns(pl.Series("embedding", rng.normal(size=(n, d)).astype(np.float32), dtype=pl.List(pl.Float32)))


def parquet_bytes(df: pl.DataFrame, **kw) -> bytes:
    buf = io.BytesIO()
    df.write_parquet(buf, **kw)
    return buf.getvalue()


def by_pick(df: pl.DataFrame) -> pl.DataFrame:
    return df.sort(["prompt_id", "pick_rank"])


@pytest.fixture(scope="module")
def big_object(s3_endpoint):
    """A 25 MiB object of random bytes written by :func:`storage.write_bytes` (3 upload parts)."""
    name = "mrt-large-bytes"
    boto3.client("s3").create_bucket(Bucket=name)
    data = np.random.default_rng(0).integers(0, 256, 25 * MiB + 12345, dtype=np.uint8).tobytes()
    url = f"s3://{name}/blob.bin"
    storage.write_bytes(url, data)
    return url, data


def test_an_object_above_the_threshold_is_uploaded_in_parts_and_reads_back_whole(big_object):
    url, data = big_object
    assert n_upload_parts(url) == 3
    assert head(url)["ETag"].strip('"') != hashlib.md5(data).hexdigest()
    assert storage.read_bytes(url) == data
    assert storage.ObjectPath(url).stat().st_size == len(data)
    [listed] = storage.list_files(url.rsplit("/", 1)[0])
    assert listed.stat().st_size == len(data)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(at=st.integers(0, 25 * MiB + 12345), n=st.integers(0, 3 * MiB),
       near=st.sampled_from([None, PART_UPLOAD, 2 * PART_UPLOAD]))
def test_any_range_of_a_multipart_object_reads_its_bytes(big_object, at, n, near):
    """Random access (what Parquet readers do) across and beside the boundaries of upload parts."""
    url, data = big_object
    if near is not None:
        at = max(0, near - n // 2)
    with storage.open_input(url) as f:
        assert f.size() == len(data)
        assert f.read_at(n, at) == data[at:at + n]


@pytest.fixture(scope="module")
def large_input(s3_endpoint):
    """A Parquet input above the threshold (uploaded in parts, read by row groups): (url, rows)."""
    name = "mrt-large-input"
    boto3.client("s3").create_bucket(Bucket=name)
    df = wide_rows(52_000, 11)
    data = parquet_bytes(df, row_group_size=20_000)
    url = f"s3://{name}/in.parquet"
    storage.write_bytes(url, data)
    return url, df


def test_a_large_input_is_read_in_parts_by_range(large_input):
    url, df = large_input
    assert n_upload_parts(url) >= 4  # above 3 x 10 MiB
    with storage.open_input(url) as f:
        pf = pq.ParquetFile(f)
        assert pf.metadata.num_row_groups >= 7 and pf.metadata.num_rows == df.height
        middle = pl.from_arrow(pf.read_row_group(pf.metadata.num_row_groups // 2))
    at = (pf.metadata.num_row_groups // 2) * 20_000
    assert middle.equals(df[at:at + middle.height])
    assert discover(url).read().equals(df)


def test_parts_above_the_threshold_resume_and_are_read_by_another_command(large_input, s3_bucket, tmp_path):
    """`select` to parts above the threshold, stopped after one part and resumed: the multipart
    part is kept (its size matches the listing, its name the checksum of its bytes), the output
    equals the in-memory result, and `mrt diagnose` reads it as it reads a local copy."""
    src, df = large_input
    out = f"{s3_bucket}/out"
    with stopping_after(1), pytest.raises(StoppedForTest):
        select_dataset(src, out, 2, "grades", parts=2)
    first = Manifest.read(out)
    assert not first.done and len(first.files) == 1
    # what a kill during an upload leaves: a multipart upload never completed, which no listing shows
    b, c = s3_bucket.split("://", 1)[1], boto3.client("s3")
    cut = f"out/part-00001-{'0' * 32}.parquet"
    up = c.create_multipart_upload(Bucket=b, Key=cut)["UploadId"]
    c.upload_part(Bucket=b, Key=cut, UploadId=up, PartNumber=1, Body=b"x" * (5 * MiB))
    rep = select_dataset(src, out, 2, "grades", parts=2)
    assert rep.resumed and rep.parts_done_now == 1  # the multipart part written before the stop was kept

    m = Manifest.read(out)
    assert m.done and m.files.items() >= first.files.items()
    assert sorted(keys(out)) == sorted([*m.files.values(), ".mrt/manifest.parquet"])  # the lock is released
    for name, obj in sorted(m.files.items()):
        url = storage.join(out, obj)
        assert n_upload_parts(url) == 2, obj
        got = storage.read_bytes(url)
        assert hashlib.blake2b(got, digest_size=16).hexdigest() == PART_OBJECT.match(obj)[2] \
            == m.checks[name]["blake2b"]
        assert len(got) == m.checks[name]["bytes"] == head(url)["ContentLength"]
        assert head(url)["ETag"].strip('"') != hashlib.md5(got).hexdigest()
    assert by_pick(discover(out).read()).equals(by_pick(mrt_fast.select(df, 2, "grades")))

    local = tmp_path / "copy"  # the same objects as local files
    for k in keys(out):
        (local / k).parent.mkdir(parents=True, exist_ok=True)
        (local / k).write_bytes(storage.read_bytes(storage.join(out, k)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    for where, report in ((out, "s3.json"), (str(local), "local.json")):
        r = subprocess.run([sys.executable, "-m", "mrt_fast.cli", "diagnose", where, "--n-boot", "0",
                            "--json", str(tmp_path / report)], env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    got = json.loads((tmp_path / "s3.json").read_text())
    assert got == json.loads((tmp_path / "local.json").read_text())
    assert got["n_rows"] == rep.n_kept and got["n_prompts"] == df["prompt_id"].n_unique()


def test_a_file_output_above_the_threshold_is_uploaded_whole(large_input, s3_bucket):
    src, df = large_input
    select_dataset(src, f"{s3_bucket}/kept.parquet", 2, "grades")
    assert n_upload_parts(f"{s3_bucket}/kept.parquet") >= 2
    got = pl.read_parquet(io.BytesIO(storage.read_bytes(f"{s3_bucket}/kept.parquet")))
    assert by_pick(got).equals(by_pick(mrt_fast.select(df, 2, "grades")))
    assert keys(s3_bucket) == ["kept.parquet"]  # the lock beside it is released


# --------------------------------------------------------------------------- unfinished uploads


def start_upload(url: str) -> str:
    """What a kill during a multipart upload leaves at ``url``: an upload of one 5 MiB piece, never
    completed (no listing shows it). Its upload id."""
    b, _, k = url.split("://", 1)[1].partition("/")
    c = boto3.client("s3")
    up = c.create_multipart_upload(Bucket=b, Key=k)["UploadId"]
    c.upload_part(Bucket=b, Key=k, UploadId=up, PartNumber=1, Body=b"x" * (5 * MiB))
    return up


def unfinished(bucket_url: str) -> set[str]:
    """The keys of the bucket's unfinished uploads."""
    pages = boto3.client("s3").get_paginator("list_multipart_uploads").paginate(Bucket=bucket_url.split("://")[1])
    return {u["Key"] for page in pages for u in page.get("Uploads", [])}


@pytest.mark.parametrize("how", ["new", "resume", "overwrite", "file"])
def test_a_job_aborts_the_unfinished_uploads_of_its_output_and_no_other(s3_bucket, how):
    """Taking the lock of an output (a new job, a resume after a stop, --overwrite; a directory or
    a file output), a job aborts the unfinished uploads under that output, says so in one note,
    and leaves those of sibling names (``out2/``, ``kept.parquet2``) alone."""
    df = rows(30, 4)
    put_table(df, f"{s3_bucket}/in.parquet")
    out = f"{s3_bucket}/kept.parquet" if how == "file" else f"{s3_bucket}/out"
    run = lambda **kw: select_dataset(f"{s3_bucket}/in.parquet", out, 2, "grades", **kw)  # noqa: E731
    if how == "resume":
        with stopping_after(1), pytest.raises(StoppedForTest):
            run(parts=3)
    elif how == "overwrite":
        assert run(parts=3).notes == []  # nothing to abort: nothing said
    mine = [out] if how == "file" else [f"{out}/part-00001-{'0' * 32}.parquet", f"{out}/.mrt/manifest.parquet"]
    siblings = [f"{out}2", f"{s3_bucket}/out2/part-00001-{'0' * 32}.parquet", f"{s3_bucket}/ou"]
    for u in mine + siblings:
        start_upload(u)
    rep = run(parts=3, overwrite=how == "overwrite")
    n = len(mine)
    assert rep.notes == [f"aborted {n} unfinished upload{'s' * (n > 1)} left by a killed run ({5 * n} MiB)"]
    assert rep.resumed == (how == "resume")
    assert unfinished(s3_bucket) == {u.split("/", 3)[3] for u in siblings}
    got = discover(out).read() if how != "file" else pl.read_parquet(io.BytesIO(storage.read_bytes(out)))
    assert by_pick(got).equals(by_pick(mrt_fast.select(df, 2, "grades")))
    assert run(parts=3).notes == []  # aborted once: the next run finds none


@pytest.mark.parametrize("command", [["select", "--k", "2"], pytest.param(["embed", "--no-cache", "--column", "e2"],
                                                                           marks=pytest.mark.embed)],
                         ids=["select", "embed"])
def test_the_cli_says_in_one_line_that_it_aborted_unfinished_uploads(s3_bucket, command):
    df = rows(20, 5)
    put_table(df, f"{s3_bucket}/in.parquet")
    start_upload(f"{s3_bucket}/out/part-00000-{'0' * 32}.parquet")
    start_upload(f"{s3_bucket}/out2/part-00000-{'0' * 32}.parquet")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    r = subprocess.run([sys.executable, "-m", "mrt_fast.cli", command[0], f"{s3_bucket}/in.parquet", f"{s3_bucket}/out",
                        *command[1:]], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    # besides the job's progress lines (a slow model load says so), one warning line
    lines = [ln for ln in r.stderr.splitlines() if not ln.startswith("mrt embed: loading the model")]
    assert lines == ["warning: aborted 1 unfinished upload left by a killed run (5 MiB)"]
    assert unfinished(s3_bucket) == {f"out2/part-00000-{'0' * 32}.parquet"}


class NoUploadListing:
    """moto's server behind a WSGI layer that answers the listing of unfinished uploads as a store
    that does not implement it does (501 ``NotImplemented``); every other request goes to moto."""

    BODY = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>NotImplemented</Code>'
            b"<Message>A header you provided implies functionality that is not implemented</Message></Error>")

    def __init__(self, app):
        self.app = app

    def __call__(self, environ, start_response):
        from urllib.parse import parse_qs

        if environ["REQUEST_METHOD"] == "GET" \
                and "uploads" in parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True):
            start_response("501 Not Implemented", [("Content-Type", "application/xml"),
                                                   ("Content-Length", str(len(self.BODY)))])
            return [self.BODY]
        return self.app(environ, start_response)


@pytest.fixture
def no_upload_listing(s3_endpoint, monkeypatch):
    """The environment pointed at a real moto server (same buckets) that does not list unfinished uploads."""
    import threading

    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    srv = make_server("127.0.0.1", 0, NoUploadListing(DomainDispatcherApplication(create_backend_app)), True,
                      request_handler=MotoRequestHandler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{srv.server_address[1]}")
    try:
        yield
    finally:
        srv.shutdown()
        t.join()


def test_a_store_that_does_not_list_unfinished_uploads_does_not_fail_the_job(s3_bucket, no_upload_listing):
    df = rows(20, 6)
    put_table(df, f"{s3_bucket}/in.parquet")
    with pytest.raises(MrtInputError, match="NotImplemented"):
        storage.abort_uploads(f"{s3_bucket}/out", directory=True)
    rep = select_dataset(f"{s3_bucket}/in.parquet", f"{s3_bucket}/out", 2, "grades", parts=2)
    [note] = rep.notes
    assert note.startswith(f"cannot list the unfinished uploads under '{s3_bucket}/out/'") and "NotImplemented" in note
    assert "\n" not in note and "not aborted" in note
    assert by_pick(discover(f"{s3_bucket}/out").read()).equals(by_pick(mrt_fast.select(df, 2, "grades")))


def test_every_row_stage_reports_the_uploads_it_aborted(s3_bucket):
    """nll and score run as row stages of the same job: their report carries the note too."""
    from mrt_fast.llm.dataset_stages import run_text_stage

    df = rows(10, 7)
    put_table(df, f"{s3_bucket}/in.parquet")
    start_upload(f"{s3_bucket}/lens/part-00000-{'0' * 32}.parquet")
    length = pl.col("response").str.len_chars().alias("length")
    rep = run_text_stage(f"{s3_bucket}/in.parquet", f"{s3_bucket}/lens", name="length", columns=("response",),
                         out_column="length", parameters={}, rows_per_part=20,
                         make_stage=lambda: lambda d: d.with_columns(length))
    assert rep.notes == ["aborted 1 unfinished upload left by a killed run (5 MiB)"]
    assert discover(f"{s3_bucket}/lens").read()["length"].to_list() == df["response"].str.len_chars().to_list()
    assert not unfinished(s3_bucket)


@pytest.mark.embed
def test_embed_reports_the_uploads_it_aborted(s3_bucket):
    from mrt_fast.embeddings.dataset import embed_dataset

    df = pl.DataFrame({"prompt_id": np.repeat(np.arange(3), 2), "response": [f"answer {i}" for i in range(6)]})
    put_table(df, f"{s3_bucket}/in.parquet")
    start_upload(f"{s3_bucket}/emb.parquet")
    rep = embed_dataset(f"{s3_bucket}/in.parquet", f"{s3_bucket}/emb.parquet", cache_dir=False)
    assert rep.notes == ["aborted 1 unfinished upload left by a killed run (5 MiB)"]
    assert not unfinished(s3_bucket) and discover(f"{s3_bucket}/emb.parquet").read().height == 6
