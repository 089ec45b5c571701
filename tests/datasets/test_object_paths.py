"""Object storage paths and outputs: odd URLs refused in one line before any lock or work,
JSON text objects read as local files are, unfinished outputs and --overwrite as locally, and
no folder marker object left behind (against the moto server of test_object_storage)."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

boto3 = pytest.importorskip("boto3")
pytest.importorskip("moto.server")

from mrt_fast.cli import app  # noqa: E402
from mrt_fast.datasets import Manifest, discover, select_dataset  # noqa: E402
from mrt_fast.datasets import storage  # noqa: E402
from mrt_fast.datasets.job import StoppedForTest, stopping_after  # noqa: E402
from mrt_fast.errors import MrtInputError, PartialOutputWarning  # noqa: E402
from test_object_storage import put_table, rows  # noqa: E402

pytestmark = [pytest.mark.s3, pytest.mark.filterwarnings("ignore::mrt_fast.errors.SmallPoolWarning")]
runner = CliRunner()


def raw_keys(url: str) -> list[str]:
    """Every key of the bucket, folder markers (``key/``) included."""
    name = url.split("://", 1)[1].split("/", 1)[0]
    return sorted(o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=name).get("Contents", []))


@pytest.mark.parametrize("odd", ["{b}/x/../out", "{b}/./out", "{b}/x//out", "S3://{n}/out", "s3://{n}/.."])
def test_odd_object_paths_are_refused_before_any_lock(s3_bucket, tmp_path, odd):
    rows(10, 0).write_parquet(tmp_path / "in.parquet")
    url = odd.format(b=s3_bucket, n=s3_bucket.split("://")[1])
    for call in (lambda: select_dataset(tmp_path / "in.parquet", url, 2, "grades", parts=2),
                 lambda: discover(url + "/in.parquet")):
        with pytest.raises(MrtInputError, match="segment|lower case") as e:
            call()
        assert "\n" not in str(e.value)
    assert raw_keys(s3_bucket) == []  # no lock, no part, no manifest anywhere
    r = runner.invoke(app, ["select", str(tmp_path / "in.parquet"), url, "--k", "2"])
    assert r.exit_code == 2 and r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.output


def json_objects(df: pl.DataFrame, url: str, kind: str) -> None:
    """``df`` cut in two objects of JSON text: ``.jsonl.gz``, ``.jsonl.zst`` or ``.json`` lines."""
    import pyarrow as pa

    for j, part in enumerate((df[:df.height // 2], df[df.height // 2:])):
        data = part.write_ndjson().encode()
        if kind.endswith((".gz", ".zst")):
            sink = pa.BufferOutputStream()
            with pa.CompressedOutputStream(sink, "gzip" if kind.endswith(".gz") else "zstd") as f:
                f.write(data)
            data = sink.getvalue().to_pybytes()
        storage.write_bytes(f"{url}/f{j}.{kind}", data)


@pytest.mark.parametrize("kind", ["jsonl.gz", "jsonl.zst", "json"])
def test_json_text_objects_are_read_as_local_files_are(s3_bucket, tmp_path, kind):
    df = rows(12, 1).drop("embedding")
    json_objects(df, f"{s3_bucket}/in", kind)
    for src in (f"{s3_bucket}/in", f"{s3_bucket}/in/*.{kind}"):
        got = discover(src).read()
        assert got.equals(df.with_columns(pl.col("prompt_id").cast(got["prompt_id"].dtype)))


_props = iter(range(10**6))  # bucket names of the property test


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(["jsonl", "jsonl.gz", "jsonl.zst", "json", "json array"]), n=st.integers(1, 3),
       seed=st.integers(0, 1000), bom=st.booleans(), glob=st.booleans(), nested=st.booleans())
def test_json_text_objects_of_any_layout_are_read_as_the_table(s3_endpoint, kind, n, seed, bom, glob, nested):
    """The generator of the class: JSON text objects as datatrove and others lay them out (JSON lines,
    compressed or not, .json lines or arrays, a byte order mark, in folders under the prefix) read by
    the prefix or a glob give the table they were cut from."""
    name = f"mrt-json-{next(_props)}"
    boto3.client("s3").create_bucket(Bucket=name)
    df = rows(9, seed).drop("embedding")
    cuts = np.array_split(np.arange(df.height), n)
    sfx = "json" if kind == "json array" else kind
    for j, cut in enumerate(cuts):
        part = df[int(cut[0]):int(cut[-1]) + 1]
        data = (json.dumps(part.to_dicts()) if kind == "json array" else part.write_ndjson()).encode()
        data = (b"\xef\xbb\xbf" if bom and j == 0 else b"") + data
        if kind.endswith((".gz", ".zst")):
            import pyarrow as pa

            sink = pa.BufferOutputStream()
            with pa.CompressedOutputStream(sink, "gzip" if kind.endswith(".gz") else "zstd") as f:
                f.write(data)
            data = sink.getvalue().to_pybytes()
        storage.write_bytes(f"s3://{name}/in/{f'd{j}/' if nested else ''}f{j}.{sfx}", data)
    src = f"s3://{name}/in" + (("/**/*." if nested else "/*.") + sfx if glob else "")
    got = discover(src).read()
    assert got.equals(df.with_columns(pl.col("prompt_id").cast(got["prompt_id"].dtype))), (got, df)


def test_a_lone_json_array_object_is_read(s3_bucket):
    df = rows(5, 2).drop("embedding")
    storage.write_bytes(f"{s3_bucket}/a.json", json.dumps(df.to_dicts()).encode())
    assert discover(f"{s3_bucket}/a.json").read().equals(df)


def test_export_reads_s3_and_refuses_an_unfinished_output_there(s3_bucket, tmp_path):
    df = rows(40, 3).drop("embedding").with_columns(prompt=pl.format("p{}", "prompt_id"))
    put_table(df, f"{s3_bucket}/in.parquet")
    with stopping_after(2), pytest.raises(StoppedForTest):
        select_dataset(f"{s3_bucket}/in.parquet", f"{s3_bucket}/out", 2, "top", parts=5)
    rows_done = Manifest.read(f"{s3_bucket}/out").rows
    r = runner.invoke(app, ["export", f"{s3_bucket}/out", str(tmp_path / "x.jsonl"), "--plain"])
    assert r.exit_code == 2 and "unfinished mrt output (2 of 5 parts done)" in r.stderr, r.output
    assert not (tmp_path / "x.jsonl").exists()
    r = runner.invoke(app, ["export", f"{s3_bucket}/out", str(tmp_path / "x.jsonl"), "--plain", "--allow-partial"])
    assert r.exit_code == 0, r.output
    assert pl.read_ndjson(tmp_path / "x.jsonl").height == rows_done and "2 of 5 parts done" in r.stderr
    with pytest.warns(PartialOutputWarning):
        assert discover(f"{s3_bucket}/out", allow_partial=True).read().height == rows_done
    r = runner.invoke(app, ["export", f"{s3_bucket}/in.parquet", str(tmp_path / "all.jsonl"), "--plain"])
    assert r.exit_code == 0, r.output
    assert pl.read_ndjson(tmp_path / "all.jsonl").height == df.height


@pytest.mark.parametrize("foreign", ["_spill/data.txt", "part-00000.parquet/data.txt", ".mrt/notes.txt",
                                     "part-00001.parquet"])
def test_overwrite_on_s3_refuses_what_no_manifest_records(s3_bucket, foreign):
    df = rows(20, 4)
    put_table(df, f"{s3_bucket}/in.parquet")
    select_dataset(f"{s3_bucket}/in.parquet", f"{s3_bucket}/out", 2, "grades", parts=3)
    storage.write_bytes(f"{s3_bucket}/out/{foreign}", b"mine")
    before = raw_keys(s3_bucket)
    with pytest.raises(MrtInputError, match=rf"no mrt job wrote \('{foreign}'.*nothing was deleted"):
        select_dataset(f"{s3_bucket}/in.parquet", f"{s3_bucket}/out", 3, "grades", parts=2, overwrite=True)
    assert raw_keys(s3_bucket) == before and Manifest.read(f"{s3_bucket}/out").done


def test_no_folder_marker_is_left_behind(s3_bucket, tmp_path):
    df = rows(20, 5)
    put_table(df, f"{s3_bucket}/in.parquet")
    select_dataset(f"{s3_bucket}/in.parquet", f"{s3_bucket}/kk", 2, "grades", parts=3)
    select_dataset(f"{s3_bucket}/in.parquet", f"{s3_bucket}/kk", 3, "grades", parts=2, overwrite=True)
    with pytest.raises(MrtInputError):  # bad input found before any part: the prefix is as it was
        select_dataset(f"{s3_bucket}/in.parquet", f"{s3_bucket}/jj", 2, "grades", parts=2, by="response",
                       candidate_key="nope")
    assert not [k for k in raw_keys(s3_bucket) if k.endswith("/")], raw_keys(s3_bucket)
    assert not [k for k in raw_keys(s3_bucket) if k.startswith("jj")]
