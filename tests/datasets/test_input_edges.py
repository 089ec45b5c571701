"""Inputs at the edges: integer ids that floats cannot hold, hive folder values, Arrow view
types, byte order marks, files that are not regular files, damaged Parquet pages, a config
that is not UTF-8. Each ends in the in-memory result or one `MrtInputError` line naming
the file (and line or row) at fault."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mrt_fast
from mrt_fast import MrtInputError
from mrt_fast.datasets.local import select_dataset
from mrt_fast.datasets.sources import discover

BIG = 2**60


def one_line(e: BaseException) -> str:
    msg = str(e)
    assert msg.strip() and "\n" not in msg.strip(), msg
    return msg


def pools(ids, reward=None) -> pl.DataFrame:
    ids = list(ids)
    reward = reward if reward is not None else [0.5 + i / 64 for i in range(len(ids))]
    return pl.DataFrame({"prompt_id": ids, "reward": reward})


def n_pools(out: Path) -> int:
    return pl.read_parquet(out)["prompt_id"].n_unique()


def select(src, out, k=1, method="top", **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return select_dataset(src, out, k, method, **kw)


# --------------------------------------------------------------------------- ids floats cannot hold


def test_int64_ids_beside_float64_ids_in_another_shard_are_refused_naming_both(tmp_path):
    (tmp_path / "in").mkdir()
    pools(np.repeat(np.arange(BIG, BIG + 10, dtype=np.int64), 2)).write_parquet(tmp_path / "in" / "a.parquet")
    pools(np.repeat(np.arange(10) + 0.5, 2)).write_parquet(tmp_path / "in" / "b.parquet")
    with pytest.raises(MrtInputError) as e:
        select(tmp_path / "in", tmp_path / "o")
    msg = one_line(e.value)
    assert "a.parquet" in msg and "b.parquet" in msg and str(BIG) in msg and "2^53" in msg, msg
    assert e.value.column == "prompt_id"
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("a,b", [(pl.Int32, pl.Int64), (pl.Float32, pl.Float64), (pl.Int64, pl.Float64),
                                 (pl.UInt32, pl.Float64), (pl.Int16, pl.Float32)])
def test_widening_that_loses_nothing_is_read(tmp_path, a, b):
    (tmp_path / "in").mkdir()
    first = pools(np.repeat(np.arange(10), 2)).with_columns(pl.col("prompt_id").cast(a))
    second = pools(np.repeat(np.arange(10, 20), 2) + (0.5 if b.is_float() and not a.is_float() else 0))
    first.write_parquet(tmp_path / "in" / "a.parquet")
    second.with_columns(pl.col("prompt_id").cast(b)).write_parquet(tmp_path / "in" / "b.parquet")
    select(tmp_path / "in", tmp_path / "o")
    assert n_pools(tmp_path / "o") == 20


def test_the_widening_check_covers_every_column_not_only_ids(tmp_path):
    (tmp_path / "in").mkdir()
    pools([1, 1], reward=[BIG + 1, BIG + 3]).write_ndjson(tmp_path / "in" / "a.jsonl")
    pools([2, 2], reward=[0.5, 0.25]).write_ndjson(tmp_path / "in" / "b.jsonl")
    with pytest.raises(MrtInputError, match=r"column 'reward' is Int64 in .*a\.jsonl.* but Float64 in .*b\.jsonl"):
        select(tmp_path / "in", tmp_path / "o")


def test_one_json_file_mixing_large_whole_ids_and_fractional_ids_is_refused_with_its_line(tmp_path):
    f = tmp_path / "in.jsonl"
    lines = [json.dumps({"prompt_id": 1.5, "reward": 0.5})]
    lines += [f'{{"prompt_id": {BIG + i}, "reward": 0.5}}' for i in range(20)]
    f.write_text("\n".join(lines) + "\n")
    with pytest.raises(MrtInputError) as e:
        select(f, tmp_path / "o.parquet")
    msg = one_line(e.value)
    assert "in.jsonl" in msg and f"{BIG} (line 2)" in msg and "mixes whole and fractional" in msg, msg
    assert not (tmp_path / "o.parquet").exists()


def test_one_json_file_of_small_whole_and_fractional_ids_is_read(tmp_path):
    f = tmp_path / "in.jsonl"
    f.write_text('{"prompt_id": 1, "reward": 0.5}\n{"prompt_id": 1.5, "reward": 0.5}\n{"prompt_id": 1, "reward": 0.7}\n')
    select(f, tmp_path / "o.parquet", k=2)
    assert n_pools(tmp_path / "o.parquet") == 2


@pytest.mark.parametrize("value", [2**64 + 5, -(2**64) - 5, 2**127 - 1])
def test_json_integers_beyond_64_bits_are_one_line_with_the_line(tmp_path, value):
    f = tmp_path / "in.jsonl"
    f.write_text(f'{{"prompt_id": 3, "reward": 0.5}}\n{{"prompt_id": {value}, "reward": 0.5}}\n')
    with pytest.raises(MrtInputError) as e:
        select(f, tmp_path / "o.parquet")
    msg = one_line(e.value)
    assert "beyond the 64-bit range" in msg and f"{value} on line 2" in msg and "in.jsonl" in msg, msg


def test_json_integers_beyond_128_bits_name_their_line(tmp_path):
    f = tmp_path / "in.jsonl"
    f.write_text(f'{{"prompt_id": 3, "reward": 0.5}}\n\n{{"prompt_id": {2**130}, "reward": 0.5}}\n')
    with pytest.raises(MrtInputError) as e:
        select(f, tmp_path / "o.parquet")
    assert "(line 3)" in one_line(e.value) and "in.jsonl" in str(e.value)


@given(ids=st.lists(st.integers(-(2**127), 2**127 - 1) | st.integers(-5, 5), min_size=1, max_size=6))
@settings(max_examples=60, deadline=None)
def test_128_bit_integer_ids_are_keyed_as_the_same_values_of_other_types(ids):
    """A 128-bit integer id keys as the int64 (or decimal text) id of the same value."""
    from mrt_fast.tables.arrays import pool_keys

    got = pool_keys(pl.Series(ids, dtype=pl.Int128))
    want = [pool_keys(pl.Series([v], dtype=pl.Int64) if -(2**63) <= v < 2**63 else pl.Series([str(v)]))[0]
            for v in ids]
    assert got.tolist() == want


def test_a_table_of_128_bit_ids_is_selected_and_advised():
    ids = [2**64 + 1] * 3 + [3] * 2 + [2**100] * 2
    df = pl.DataFrame({"prompt_id": pl.Series(ids, dtype=pl.Int128), "reward": [0.1, 0.5, 0.3, 0.2, 0.4, 0.8, 0.6]})
    for method in ("random", "top"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert mrt_fast.select(df, 1, method)["prompt_id"].to_list() == [2**64 + 1, 3, 2**100]
    as_text = df.with_columns(pl.col("prompt_id").cast(pl.String))
    assert repr(mrt_fast.variance_budget(df, loss="reward")) == repr(mrt_fast.variance_budget(as_text, loss="reward"))


# --------------------------------------------------------------------------- hive values


@pytest.mark.parametrize("sfx", [".parquet", ".jsonl"])
def test_hive_values_are_kept_as_their_text(tmp_path, sfx):
    folders = {"007": "007", "010": "010", "a=b": "a=b", "": "", "x%2Fy": "x/y", "__HIVE_DEFAULT_PARTITION__": None}
    for i, folder in enumerate(folders):
        d = tmp_path / "in" / f"split={folder}"
        d.mkdir(parents=True)
        df = pools([10 * i, 10 * i, 10 * i + 1])
        df.write_parquet(d / "f.parquet") if sfx == ".parquet" else df.write_ndjson(d / "f.jsonl")
    select(tmp_path / "in", tmp_path / "o", k=3)
    got = pl.read_parquet(tmp_path / "o").select("prompt_id", "split").unique().sort("prompt_id")
    want = [v for v in folders.values() for _ in range(2)]
    assert got["split"].dtype == pl.String
    assert got["split"].to_list() == want


# --------------------------------------------------------------------------- Arrow view types


def view_list(arr: pa.ChunkedArray | pa.Array, large: bool = False) -> pa.Array:
    """A list column as a list view whose values are stored in reverse row order."""
    arr = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
    offs = np.asarray(arr.offsets)
    sizes = np.diff(offs)
    rev = [arr.values.slice(int(offs[i]), int(sizes[i])) for i in reversed(range(len(arr)))]
    values = pa.concat_arrays(rev) if rev else arr.values.slice(0, 0)
    new_offs = np.concatenate([[0], np.cumsum(sizes[::-1])])[:-1][::-1] if len(arr) else np.zeros(0, np.int64)
    cls, it = (pa.LargeListViewArray, pa.int64()) if large else (pa.ListViewArray, pa.int32())
    mask = arr.is_null() if arr.null_count else None
    return cls.from_arrays(pa.array(new_offs, it), pa.array(sizes, it), values, mask=mask)


def candidates() -> pl.DataFrame:
    return pl.DataFrame({"prompt_id": ["a", "a", "a", "b", "b"], "reward": [0.1, 0.4, 0.2, 0.3, 0.9],
                         "response": ["x", "y", "z", "w", "v"], "loss": [0.1, 0.5, 0.3, 0.2, 0.4],
                         "embedding": [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.5, 0.2], [0.3, 0.3]],
                         "tags": [["t"], [], None, ["u", "v"], ["w"]]},
                        schema_overrides={"embedding": pl.List(pl.Float32)})


def as_views(df: pl.DataFrame) -> pa.Table:
    t = df.to_arrow(compat_level=pl.CompatLevel.newest())
    t = t.set_column(t.schema.get_field_index("tags"), "tags", view_list(t.column("tags")))
    return t.set_column(t.schema.get_field_index("embedding"), "embedding", view_list(t.column("embedding"), True))


def test_view_tables_are_accepted_by_the_python_api():
    df = candidates()
    views = as_views(df)
    assert {str(f.type).split("<")[0] for f in views.schema} >= {"string_view", "list_view", "large_list_view"}
    for method in ("top", "random", "grades", "stratified"):
        got = pl.from_arrow(mrt_fast.select(views, 1, method, seed=3))
        want = mrt_fast.select(df, 1, method, seed=3)
        assert got.equals(want), (method, got, want)
    assert mrt_fast.variance_budget(views, loss="loss").k_star == mrt_fast.variance_budget(df, loss="loss").k_star
    assert mrt_fast.pool_modes(views).equals(mrt_fast.pool_modes(df))


def test_view_tables_are_accepted_by_per_pool_k_and_export(tmp_path):
    from mrt_fast.llm.export import export

    df = candidates().with_columns(k=pl.when(pl.col("prompt_id") == "a").then(2).otherwise(1),
                                   prompt=pl.col("prompt_id"))
    views = as_views(df)
    assert pl.from_arrow(mrt_fast.select(views, "k", "top")).equals(mrt_fast.select(df, "k", "top"))
    got = export(views, tmp_path / "v.jsonl", "openrlhf")
    assert got.equals(export(df, tmp_path / "p.jsonl", "openrlhf"))


def test_a_grouped_view_table_is_accepted():
    g = candidates().group_by("prompt_id", maintain_order=True).agg(pl.col("response", "reward", "embedding"))
    t = g.to_arrow(compat_level=pl.CompatLevel.newest())
    t = t.set_column(1, "response", view_list(t.column("response")))
    assert pl.from_arrow(mrt_fast.select(t, 1, "top")).equals(mrt_fast.select(g, 1, "top"))


@given(rows=st.lists(st.one_of(st.none(), st.lists(st.one_of(st.none(), st.text(max_size=20)), max_size=4)),
                     max_size=12), start=st.integers(0, 3), large=st.booleans())
@settings(max_examples=60, deadline=None)
def test_plain_array_of_a_view_holds_the_same_values(rows, start, large):
    from mrt_fast.tables.arrow_views import plain_array

    arr = view_list(pa.array(rows, pa.list_(pa.string_view())), large).slice(min(start, len(rows)))
    plain = plain_array(arr)
    plain.validate(full=True)
    assert plain.to_pylist() == arr.to_pylist()
    assert "view" not in str(plain.type)


@pytest.mark.parametrize("how", ["parquet", "save_to_disk"])
def test_files_holding_view_types_are_read(tmp_path, how):
    df = candidates()
    views = as_views(df)
    if how == "parquet":
        src = tmp_path / "in"
        src.mkdir()
        pq.write_table(views.slice(0, 3), src / "a.parquet")
        pq.write_table(views.slice(3), src / "b.parquet")
        assert "list_view" in str(pq.read_schema(src / "a.parquet"))
    else:
        src = tmp_path / "hf"
        src.mkdir()
        with pa.ipc.new_stream(src / "data-00000-of-00001.arrow", views.schema) as w:
            w.write_table(views)
        (src / "state.json").write_text('{"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}')
        (src / "dataset_info.json").write_text("{}")
    for method in ("top", "grades"):
        select(src, tmp_path / f"o-{method}.parquet", 1, method)
        got = pl.read_parquet(tmp_path / f"o-{method}.parquet")
        want = mrt_fast.select(df, 1, method)
        assert got.select(want.columns).equals(want), (got, want)
    assert mrt_fast.datasets.formats.read_table(src if how != "parquet" else src / "a.parquet").height > 0


# --------------------------------------------------------------------------- byte order marks


@pytest.mark.parametrize("name", ["in.jsonl", "in.json", "in.csv", "in.jsonl.gz"])
def test_a_utf8_byte_order_mark_is_skipped(tmp_path, name):
    import gzip

    df = pools([1, 1, 2])
    if name.endswith(".csv"):
        text = df.write_csv()
    elif name == "in.json":
        text = json.dumps(df.to_dicts())
    else:
        text = df.write_ndjson()
    data = b"\xef\xbb\xbf" + text.encode()
    (tmp_path / name).write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    select(tmp_path / name, tmp_path / "o.parquet", k=2)
    assert pl.read_parquet(tmp_path / "o.parquet").columns[:2] == ["prompt_id", "reward"]
    assert pl.read_parquet(tmp_path / "o.parquet").height == 3


def test_a_byte_order_mark_in_one_shard_of_several(tmp_path):
    (tmp_path / "in").mkdir()
    pools([1, 1]).write_ndjson(tmp_path / "in" / "a.jsonl")
    (tmp_path / "in" / "b.jsonl").write_bytes(b"\xef\xbb\xbf" + pools([2, 2]).write_ndjson().encode())
    select(tmp_path / "in", tmp_path / "o.parquet", k=2)
    assert pl.read_parquet(tmp_path / "o.parquet").height == 4


# --------------------------------------------------------------------------- not regular files, empty paths


def test_a_fifo_or_a_device_is_named_for_what_it_is(tmp_path):
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    for src, what in [(fifo, "a FIFO"), (Path("/dev/zero"), "a character device")]:
        with pytest.raises(MrtInputError) as e:
            discover(src)
        assert what in one_line(e.value) and str(src) in str(e.value), str(e.value)
    (tmp_path / "a.jsonl").write_text(pools([1]).write_ndjson())
    with pytest.raises(MrtInputError, match="pipe.jsonl.* is a FIFO"):
        discover(tmp_path)  # never skipped inside a directory
    with pytest.raises(MrtInputError, match="is a FIFO"):
        discover(f"{tmp_path}/*.jsonl")


@pytest.mark.parametrize("path", ["", " "])
def test_an_empty_input_path_is_refused(tmp_path, path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    pools([1]).write_parquet(tmp_path / "a.parquet")
    with pytest.raises(MrtInputError, match="input path is empty"):
        select(path, tmp_path / "o.parquet")


def test_the_cli_refuses_an_empty_input_in_one_line(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from mrt_fast.cli import app

    monkeypatch.chdir(tmp_path)  # a directory holding a table: "" must not read it
    pools([1, 1, 2]).write_parquet(tmp_path / "a.parquet")
    r = CliRunner().invoke(app, ["select", "", str(tmp_path / "o.parquet"), "--k", "1"])
    assert r.exit_code == 2 and r.output.startswith("error: ") and r.output.count("\n") == 1, r.output
    assert "input path is empty" in r.output and not (tmp_path / "o.parquet").exists()


# --------------------------------------------------------------------------- Parquet page checksums


def zero_last_page_bytes(src: Path, dst: Path, n: int = 64) -> None:
    """``src`` with the last ``n`` bytes of its last column chunk's data zeroed."""
    data = bytearray(src.read_bytes())
    md = pq.ParquetFile(src).metadata
    cc = md.row_group(md.num_row_groups - 1).column(md.num_columns - 1)
    start = cc.dictionary_page_offset if cc.has_dictionary_page else cc.data_page_offset
    end = start + cc.total_compressed_size
    data[end - n:end] = bytes(n)
    dst.write_bytes(bytes(data))


def test_a_zeroed_page_is_one_line_naming_the_file(tmp_path):
    t = pa.table({"prompt_id": np.arange(400) // 4, "reward": np.linspace(0, 1, 400)})
    pq.write_table(t, tmp_path / "good.parquet", write_page_checksum=True, compression="none", use_dictionary=False)
    (tmp_path / "in").mkdir()
    zero_last_page_bytes(tmp_path / "good.parquet", tmp_path / "in" / "bad.parquet")
    assert not pl.read_parquet(tmp_path / "in" / "bad.parquet")["reward"].equals(pl.from_arrow(t)["reward"])
    for src in (tmp_path / "in", tmp_path / "in" / "bad.parquet"):
        with pytest.raises(MrtInputError) as e:
            select(src, tmp_path / "o.parquet")
        assert "bad.parquet" in one_line(e.value) and "checksum" in str(e.value), str(e.value)
    select(tmp_path / "good.parquet", tmp_path / "o.parquet")


def test_our_parquet_outputs_carry_page_checksums(tmp_path):
    from mrt_fast.datasets.formats import write_table

    pools(np.repeat(np.arange(50), 3)).write_parquet(tmp_path / "in.parquet")
    select(tmp_path / "in.parquet", tmp_path / "o.parquet")
    select(tmp_path / "in.parquet", tmp_path / "dir", parts=2)
    write_table(pools([1, 2]), tmp_path / "t.parquet")
    for f in [tmp_path / "o.parquet", tmp_path / "t.parquet", *sorted((tmp_path / "dir").glob("part-*.parquet"))]:
        zero_last_page_bytes(f, tmp_path / "z.parquet", n=8)
        with pytest.raises(MrtInputError, match="checksum"):
            discover(tmp_path / "z.parquet").schema()


def test_our_parquet_outputs_keep_dictionaries_to_values_that_repeat(tmp_path):
    import pyarrow.parquet as pq

    from mrt_fast.datasets.formats import read_table, write_table

    df = pl.DataFrame({"prompt_id": [1, 1, 2], "responses": [["a", "b"], ["a"], ["c"]], "text": ["x", "y", "x"],
                       "reward": [0.5, 0.25, 0.5], "embedding": [[1.0, 2.0], [3.0, 4.0], [1.0, 2.0]]},
                      schema_overrides={"embedding": pl.Array(pl.Float32, 2)})
    write_table(df, tmp_path / "t.parquet")
    md = pq.ParquetFile(tmp_path / "t.parquet").metadata.row_group(0)
    dictionary = {md.column(i).path_in_schema: "RLE_DICTIONARY" in md.column(i).encodings
                  for i in range(md.num_columns)}
    assert dictionary == {"prompt_id": True, "responses.list.element": True, "text": True, "reward": False,
                          "embedding.list.element": False}
    assert read_table(tmp_path / "t.parquet").equals(df)


# --------------------------------------------------------------------------- config text


def test_a_run_config_that_is_not_utf8_is_one_line(tmp_path):
    from mrt_fast.llm.pipeline import RunConfig

    cfg = tmp_path / "run.yaml"
    cfg.write_bytes("out_dir: r\nmodel: m\ndata: {}\nnote: caf\xe9\n".encode("latin-1"))
    with pytest.raises(MrtInputError, match="not UTF-8") as e:
        RunConfig.from_yaml(cfg)
    assert "run.yaml" in one_line(e.value)


def test_a_utf8_run_config_is_read_whatever_the_locale(tmp_path):
    """UTF-8 is the config's encoding, not the locale's: under the C locale (ASCII, no UTF-8
    mode) a config holding non-ASCII text is read, not refused as 'not UTF-8'."""
    import subprocess
    import sys

    cfg = tmp_path / "run.yaml"
    cfg.write_text("out_dir: r\nmodel: modèle\ndata: {train_prompts: t.jsonl, eval: e.jsonl}\n", encoding="utf-8")
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0"}
    code = ("import sys; from mrt_fast.llm.pipeline import RunConfig; "
            "print(ascii(RunConfig.from_yaml(sys.argv[1]).model))")
    r = subprocess.run([sys.executable, "-c", code, str(cfg)], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-500:]
    assert r.stdout.splitlines()[-1] == ascii("modèle")
