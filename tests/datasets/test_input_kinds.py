"""Inputs as users have them: JSON Lines compressed with gzip or zstd, `.json` files (a JSON
array or JSON Lines), and folders written by Hugging Face `datasets`' `save_to_disk`; each
read as the same table as its Parquet copy, by every reader and every command."""

from __future__ import annotations

import gzip
import json
import warnings

import mrt_fast
import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mrt_fast import MrtInputError
from mrt_fast.cli import app
from mrt_fast.datasets import discover, select_dataset, variance_budget
from mrt_fast.datasets.formats import read_table
from typer.testing import CliRunner

runner = CliRunner()


def table(n_pools: int = 8, seed: int = 0) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 6, n_pools)
    n = int(sizes.sum())
    ids = np.repeat(np.arange(n_pools), sizes)
    return pl.DataFrame({
        "prompt_id": ids, "prompt": [f"p{i}" for i in ids], "response": [f"r{i}" for i in range(n)],
        "reward": rng.normal(size=n), "loss": rng.gamma(2.0, 1.0, n),
    })


def write_json(df: pl.DataFrame, path, kind: str):
    """``df`` as JSON text: ``lines`` (one object a line) or ``array``, compressed by the suffix."""
    rows = df.to_dicts()
    text = json.dumps(rows) if kind == "array" else "".join(json.dumps(r) + "\n" for r in rows)
    if str(path).endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode()))
    elif str(path).endswith(".zst"):
        with pa.CompressedOutputStream(str(path), "zstd") as f:
            f.write(text.encode())
    else:
        path.write_text(text)
    return path


JSON_KINDS = [("t.jsonl.gz", "lines"), ("t.jsonl.zst", "lines"), ("t.ndjson.gz", "lines"), ("t.json", "array"),
              ("t.json", "lines"), ("t.json.gz", "array")]


def quiet_select(*args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mrt_fast.SmallPoolWarning)
        return mrt_fast.select(*args, **kw)


# ------------------------------------------------------------------ compressed JSON and .json


@pytest.mark.parametrize("name, kind", JSON_KINDS)
def test_json_text_reads_as_its_parquet_copy(tmp_path, name, kind):
    df = table()
    p = write_json(df, tmp_path / name, kind)
    assert discover(p).read().equals(df)
    assert read_table(p).equals(df)
    assert discover(p).scan(row_index="i").slice(3, 4).collect().drop("i").equals(df.slice(3, 4))
    out = tmp_path / "kept.parquet"
    select_dataset(p, out, 2, "top")
    assert pl.read_parquet(out).equals(quiet_select(df, 2, "top"))


def test_a_directory_of_compressed_shards_widens_and_names_the_odd_file(tmp_path):
    df = table(12)
    d = tmp_path / "shards"
    d.mkdir()
    a, b = df.slice(0, 20), df.slice(20)
    # one writer wrote whole-number rewards (integers in JSON), another floats
    write_json(a.with_columns(pl.col("reward").round(0).cast(pl.Int64)), d / "a.jsonl.gz", "lines")
    write_json(b, d / "b.jsonl.zst", "lines")
    got = discover(d).read()
    assert got.schema["reward"] == pl.Float64
    assert got["reward"].to_list() == a["reward"].round(0).to_list() + b["reward"].to_list()
    assert discover(str(d / "*.jsonl.*")).read().equals(got)
    write_json(b.drop("loss"), d / "c.jsonl.gz", "lines")
    with pytest.raises(MrtInputError, match=r"c\.jsonl\.gz.*lacks column 'loss'"):
        discover(d).read()


def test_a_bad_line_is_named_by_file_and_line(tmp_path):
    p = tmp_path / "bad.jsonl.gz"
    p.write_bytes(gzip.compress(b'{"prompt_id": 1, "reward": 0.5}\n{"prompt_id": 2, "reward": 0.1}\n{"prompt_id": \n'))
    for read in (lambda: discover(p).read(), lambda: read_table(p)):
        with pytest.raises(MrtInputError, match=r"bad\.jsonl\.gz.*line 3"):
            read()
    r = runner.invoke(app, ["select", str(p), str(tmp_path / "k.parquet"), "--k", "1", "--method", "top"])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "line 3" in r.stderr, r.output


def test_json_beside_other_tables_is_metadata_and_alone_is_data(tmp_path):
    df = table()
    d = tmp_path / "d"
    d.mkdir()
    df.write_parquet(d / "part-0.parquet")
    (d / "info.json").write_text('{"description": "a sidecar, not rows"}')
    assert discover(d).read().equals(df)
    j = tmp_path / "j"
    j.mkdir()
    write_json(df.slice(0, 5), j / "a.json", "array")
    write_json(df.slice(5), j / "b.json", "lines")
    assert discover(j).read().equals(df)
    hf = tmp_path / "parent" / "hf"  # the metadata of a save_to_disk folder below is not data either
    hf.mkdir(parents=True)
    (hf / "state.json").write_text('{"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}')
    (hf / "dataset_info.json").write_text("{}")
    with pytest.raises(MrtInputError, match="matches no"):
        discover(tmp_path / "parent")


@pytest.mark.parametrize("name", ["kept.jsonl.gz", "kept.json", "kept.jsonl.zst"])
def test_json_text_that_is_only_read_is_refused_as_an_output(tmp_path, name):
    p = write_json(table(), tmp_path / "in.jsonl.gz", "lines")
    with pytest.raises(MrtInputError, match="unsupported format .* for writing"):
        select_dataset(p, tmp_path / name, 1, "top")
    assert sorted(x.name for x in tmp_path.iterdir()) == ["in.jsonl.gz"]


def test_commands_take_compressed_json(tmp_path):
    df = table()
    d = tmp_path / "shards"
    d.mkdir()
    write_json(df.slice(0, 10), d / "a.jsonl.gz", "lines")
    write_json(df.slice(10), d / "b.jsonl.gz", "lines")
    for src in (d, d / "*.jsonl.gz"):
        r = runner.invoke(app, ["diagnose", str(src), "--n-boot", "0"])
        assert r.exit_code == 0, r.output
    want = variance_budget(df, n_boot=0)
    assert variance_budget(str(d), n_boot=0).v_x == pytest.approx(want.v_x)
    r = runner.invoke(app, ["export", str(d), str(tmp_path / "sft.jsonl")])
    assert r.exit_code == 0, r.output
    assert pl.read_ndjson(tmp_path / "sft.jsonl").height == df.height


# ------------------------------------------------------------------ save_to_disk folders


def hf_folder(df: pl.DataFrame, path, shards: int = 1):
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()
    datasets.Dataset.from_polars(df).save_to_disk(str(path), num_shards=shards)
    return path


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n_pools=st.integers(1, 12), shards=st.integers(1, 4), start=st.integers(0, 40), n=st.integers(0, 40),
       seed=st.integers(0, 2**16))
def test_a_save_to_disk_folder_reads_as_the_table_it_was_made_from(tmp_path_factory, n_pools, shards, start, n,
                                                                    seed):
    df = table(n_pools, seed)
    shards = min(shards, df.height)
    p = hf_folder(df, tmp_path_factory.mktemp("hf") / "ds", shards)
    ds = discover(p)
    assert len(ds.files) == shards and sum(ds.row_counts()) == df.height
    assert ds.read().equals(df)
    assert read_table(p).equals(df)
    assert ds.scan(row_index="i").slice(start, n).collect().drop("i").equals(df.slice(start, n))
    assert ds.scan().select("reward").head(n).collect().equals(df.select("reward").head(n))
    if start < df.height:
        f, row = ds.locate(start)
        assert pl.from_arrow(pa.ipc.open_stream(str(f)).read_all()).row(row) == df.row(start)


def test_a_shuffled_dataset_is_saved_and_read_in_its_order(tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()
    df = table(10)
    hf = datasets.Dataset.from_polars(df).shuffle(seed=3)
    hf.save_to_disk(str(tmp_path / "s"))
    assert discover(tmp_path / "s").read()["response"].to_list() == hf["response"]


def test_select_on_a_save_to_disk_folder_equals_select_on_the_table(tmp_path):
    df = table(20)
    p = hf_folder(df, tmp_path / "ds", 3)
    for out in (tmp_path / "kept.parquet", tmp_path / "kept"):
        select_dataset(p, out, 2, "top", rows_per_part=7)
        got = pl.read_parquet(out if out.suffix else out / "part-*.parquet")
        assert got.sort(["prompt_id", "pick_rank"]).equals(quiet_select(df, 2, "top").sort(["prompt_id", "pick_rank"]))
    with pytest.raises(MrtInputError, match="is the input or inside it"):
        select_dataset(p, p / "kept.parquet", 2, "top")


def test_every_command_takes_a_save_to_disk_folder(tmp_path):
    df = table(10)
    p = hf_folder(df, tmp_path / "ds", 2)
    r = runner.invoke(app, ["select", str(p), str(tmp_path / "kept"), "--k", "2", "--method", "top"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["diagnose", str(p), "--n-boot", "0"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["export", str(p), str(tmp_path / "sft.jsonl"), "--plain"])
    assert r.exit_code == 0, r.output
    assert pl.read_ndjson(tmp_path / "sft.jsonl")["completion"].to_list() == df["response"].to_list()
    # the model commands check their input first: a missing model is then the one error
    for cmd, new in (("nll", "--loss"), ("score", "--column")):
        r = runner.invoke(app, [cmd, str(p), str(tmp_path / f"{cmd}.parquet"), new, "new",
                                "--model", str(tmp_path / "no-model")])
        assert r.exit_code == 2 and "no-model" in r.stderr and r.stderr.count("\n") == 1, (cmd, r.output)
    prompts = hf_folder(df.select("prompt_id", "prompt").unique("prompt_id", maintain_order=True), tmp_path / "pr")
    r = runner.invoke(app, ["generate", str(prompts), str(tmp_path / "gen.parquet"), "--model",
                            str(tmp_path / "no-model"), "--n", "2"])
    assert r.exit_code == 2 and "no-model" in r.stderr and r.stderr.count("\n") == 1, r.output


@pytest.mark.embed
def test_embed_takes_a_save_to_disk_folder(tmp_path):
    df = table(4)
    p = hf_folder(df, tmp_path / "ds", 2)
    r = runner.invoke(app, ["embed", str(p), str(tmp_path / "e"), "--cache-dir", str(tmp_path / "c"),
                            "--chunk-rows", "5"])
    assert r.exit_code == 0, r.output
    got = pl.read_parquet(tmp_path / "e" / "part-*.parquet")
    assert got.drop("embedding").equals(df) and got["embedding"].dtype.size == 384


def test_a_datasetdict_folder_is_refused_naming_its_splits(tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()
    hf = datasets.Dataset.from_polars(table())
    datasets.DatasetDict({"train": hf, "test": hf}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(MrtInputError, match=r"DatasetDict folder of splits \['train', 'test'\].*dd/train"):
        discover(tmp_path / "dd")
    with pytest.raises(MrtInputError, match="DatasetDict"):
        read_table(tmp_path / "dd")
    r = runner.invoke(app, ["select", str(tmp_path / "dd"), str(tmp_path / "k"), "--k", "1", "--method", "top"])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "'test'" in r.stderr, r.output
    assert discover(tmp_path / "dd" / "train").read().equals(table())


def test_a_save_to_disk_folder_missing_a_file_is_named(tmp_path):
    p = hf_folder(table(), tmp_path / "ds", 2)
    (p / "data-00001-of-00002.arrow").unlink()
    with pytest.raises(MrtInputError, match="data-00001-of-00002.arrow.*missing"):
        discover(p)


@pytest.mark.ray
def test_the_ray_engine_reads_them_as_the_local_one(tmp_path):
    pytest.importorskip("ray")
    from mrt_fast.datasets import ray_engine

    df = table(12)
    d = tmp_path / "gz"
    d.mkdir()
    write_json(df.slice(0, 15), d / "a.jsonl.gz", "lines")
    write_json(df.slice(15), d / "b.jsonl.zst", "lines")
    for src in (hf_folder(df, tmp_path / "ds", 3), d):
        got = pl.DataFrame(ray_engine.read(src).take_all(), schema=df.schema)
        assert got.sort("response").equals(df.sort("response"))  # blocks may come back in any order
        out = tmp_path / f"kept-{src.name}.parquet"
        ray_engine.select_dataset(src, out, 2, "top", parts=2)
        assert pl.read_parquet(out).sort(["prompt_id", "pick_rank"]).equals(
            quiet_select(df, 2, "top").sort(["prompt_id", "pick_rank"]))
