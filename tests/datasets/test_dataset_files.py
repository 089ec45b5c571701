"""The files of a dataset: hive keys, broken links, schema drift between shards
and the file and row an error names. Every case ends in the in-memory result or
one `MrtInputError` line; no column or file is dropped silently."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import mrt_fast
from mrt_fast import MrtInputError
from mrt_fast.datasets.local import select_dataset
from mrt_fast.cli import app
from mrt_fast.datasets import variance_budget

runner = CliRunner()


def rows(n_pools: int, per: int = 3, first: int = 0, seed: int = 0) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    ids = np.repeat(np.arange(first, first + n_pools), per)
    return pl.DataFrame({"prompt_id": ids, "reward": rng.standard_normal(len(ids)).round(3),
                         "loss": rng.gamma(2.0, 1.0, len(ids))})


def write(df: pl.DataFrame, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    df.write_parquet(path) if path.suffix == ".parquet" else df.write_ndjson(path)
    return path


def ref_select(df, k, method, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return mrt_fast.select(df, k, method, **kw)


def one_line_exit_2(r, *needles):
    assert r.exit_code == 2, (r.exit_code, r.output)
    assert r.output.startswith("error: ") and r.output.count("\n") == 1, r.output
    for n in needles:
        assert n in r.output, (n, r.output)


# --------------------------------------------------------------------------- hive keys


@pytest.mark.parametrize("sfx", [".parquet", ".jsonl"])
@pytest.mark.parametrize("key", ["prompt_id", "reward"])
def test_a_hive_key_that_is_a_column_is_refused(tmp_path, sfx, key):
    for v in (7, 8, 9):
        write(rows(10, 2, first=10 * v), tmp_path / "in" / f"{key}={v}" / f"x{sfx}")
    with pytest.raises(MrtInputError, match=rf"hive key '{key}' of the folders above '.*{key}=7/x\{sfx}' "
                                            "is also a column"):
        select_dataset(tmp_path / "in", tmp_path / "o.parquet", 1, "top")
    assert not (tmp_path / "o.parquet").exists()
    with pytest.raises(MrtInputError, match=f"hive key '{key}'"):
        variance_budget(tmp_path / "in", n_boot=0)
    one_line_exit_2(runner.invoke(app, ["select", str(tmp_path / "in"), str(tmp_path / "o"), "--k", "1",
                                        "--method", "top"]), f"hive key '{key}'")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("sfx", [".parquet", ".jsonl"])
@pytest.mark.parametrize("layout", [("a=1", "b=2"), ("a=1", "plain"), ("a=1/b=2", "b=2/a=1")])
def test_hive_folders_with_different_keys_are_refused(tmp_path, sfx, layout):
    write(rows(3), tmp_path / "in" / layout[0] / f"x{sfx}")
    write(rows(3, first=5), tmp_path / "in" / layout[1] / f"x{sfx}")
    with pytest.raises(MrtInputError, match="hive folders disagree: .* sits under keys"):
        select_dataset(tmp_path / "in", tmp_path / "o.parquet", 1, "top")
    one_line_exit_2(runner.invoke(app, ["select", str(tmp_path / "in"), str(tmp_path / "o"), "--k", "1",
                                        "--method", "top"]), "hive folders disagree")
    one_line_exit_2(runner.invoke(app, ["diagnose", str(tmp_path / "in"), "--n-boot", "0"]), "hive folders disagree")


@pytest.mark.parametrize("sfx", [".parquet", ".jsonl"])
def test_a_hive_key_column_holding_the_folders_value_is_read(tmp_path, sfx):
    """polars' partitioned writes keep the key column in each file, equal to its folder's value."""
    df = rows(12, 2).with_columns(
        split=pl.when(pl.col("prompt_id") % 3 == 0).then(pl.lit("a/b")).otherwise(pl.lit("c")))
    if sfx == ".parquet":
        df.write_parquet(tmp_path / "in", partition_by="split")
    else:
        for (v,), part in df.group_by("split", maintain_order=True):
            write(part, tmp_path / "in" / f"split={v.replace('/', '%2F')}" / "x.jsonl")
    select_dataset(tmp_path / "in", tmp_path / "o.parquet", 1, "top")
    got = pl.read_parquet(tmp_path / "o.parquet").sort("prompt_id")
    want = ref_select(df, 1, "top").sort("prompt_id")
    assert got.select(want.columns).equals(want)


def test_hive_keys_still_become_columns(tmp_path):
    a, b = rows(4), rows(4, first=10)
    write(a, tmp_path / "in" / "split=a" / "x.jsonl")
    write(b, tmp_path / "in" / "split=b" / "x.jsonl")
    select_dataset(tmp_path / "in", tmp_path / "o.parquet", 1, "top")
    got = pl.read_parquet(tmp_path / "o.parquet")
    assert got.height == 8 and sorted(set(got["split"].to_list())) == ["a", "b"]


# --------------------------------------------------------------------------- broken links


@pytest.mark.parametrize("how", ["directory", "glob", "file"])
def test_a_shard_that_is_a_broken_symlink_is_refused(tmp_path, how):
    write(rows(3), tmp_path / "in" / "a.parquet")
    os.symlink(tmp_path / "annex" / "objects" / "b.parquet", tmp_path / "in" / "b.parquet")
    source = {"directory": str(tmp_path / "in"), "glob": str(tmp_path / "in" / "*.parquet"),
              "file": str(tmp_path / "in" / "b.parquet")}[how]
    with pytest.raises(MrtInputError, match=r"'.*b\.parquet' is a symbolic link to '.*annex.*', which does not exist"):
        select_dataset(source, tmp_path / "o.parquet", 1, "top")
    assert not (tmp_path / "o.parquet").exists()
    with pytest.raises(MrtInputError, match="symbolic link"):
        variance_budget(source, n_boot=0)
    one_line_exit_2(runner.invoke(app, ["diagnose", source, "--n-boot", "0"]), "b.parquet", "symbolic link")
    one_line_exit_2(runner.invoke(app, ["select", source, str(tmp_path / "o"), "--k", "1", "--method", "top"]),
                    "symbolic link")


# --------------------------------------------------------------------------- schema drift


@pytest.mark.parametrize("sfx", [".parquet", ".jsonl"])
@pytest.mark.parametrize("late", [True, False])
def test_a_column_only_some_shards_hold_is_refused_for_both_formats(tmp_path, sfx, late):
    """A column one shard holds and another lacks is refused, naming both files and
    the column, whichever file comes first and whatever the format."""
    plain, extra = rows(3), rows(3, first=5).with_columns(note=pl.lit("x"))
    first, second = (plain, extra) if late else (extra, plain)
    write(first, tmp_path / "in" / f"a{sfx}")
    write(second, tmp_path / "in" / f"b{sfx}")
    word = "has" if late else "lacks"
    msg = rf"'.*b\{sfx}' {word} column 'note', which '.*a\{sfx}' {'lacks' if late else 'has'}"
    with pytest.raises(MrtInputError, match=msg) as info:
        select_dataset(tmp_path / "in", tmp_path / "o.parquet", 1, "top")
    assert info.value.column == "note"
    with pytest.raises(MrtInputError, match=msg):
        variance_budget(tmp_path / "in", n_boot=0)
    one_line_exit_2(runner.invoke(app, ["select", str(tmp_path / "in"), str(tmp_path / "o"), "--k", "1",
                                        "--method", "top"]), "column 'note'")


def test_a_jsonl_column_first_seen_after_row_1000_is_kept(tmp_path):
    df = rows(700, 2)
    lines = [json.dumps(r) for r in df.to_dicts()]
    lines[1234] = json.dumps({**json.loads(lines[1234]), "note": "late"})
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n")
    select_dataset(tmp_path / "a.jsonl", tmp_path / "o.parquet", 2, "top")
    got = pl.read_parquet(tmp_path / "o.parquet")
    assert "note" in got.columns and got["note"].drop_nulls().to_list() == ["late"]
    # integral rewards for 1,000 rows, then a fraction: read as floats, not refused as unparsable
    ints = [json.dumps({"prompt_id": i // 2, "reward": i % 3}) for i in range(1400)]
    ints[1300] = json.dumps({"prompt_id": 650, "reward": 2.5})
    (tmp_path / "b.jsonl").write_text("\n".join(ints) + "\n")
    select_dataset(tmp_path / "b.jsonl", tmp_path / "o2.parquet", 1, "top")
    got = pl.read_parquet(tmp_path / "o2.parquet")
    assert got.height == 700 and got.filter(pl.col("prompt_id") == 650)["reward"].to_list() == [2.5]


_WIDTHS = {"int": [pl.Int32, pl.Int64], "float": [pl.Float32, pl.Float64]}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), n_files=st.integers(1, 4), sfx=st.sampled_from([".parquet", ".jsonl"]),
       n_parts=st.integers(1, 3), seed=st.integers(0, 99))
def test_shards_with_drifting_schemas_read_as_one_table_or_are_refused(tmp_path_factory, data, n_files, sfx, n_parts,
                                                                        seed):
    """Shards whose ids and rewards change width (Int32/Int64, Float32/Float64, integral
    JSON rewards) give the in-memory result on their concatenation; a shard with an
    extra or a missing column is refused naming it; nothing is dropped."""
    tmp = tmp_path_factory.mktemp("drift")
    frames, fault = [], None
    for i in range(n_files):
        df = rows(data.draw(st.integers(2, 5)), data.draw(st.integers(2, 4)), first=10 * i, seed=seed + i)
        if sfx == ".parquet":  # JSON has no widths: its drift is integers and fractions in one column
            df = df.with_columns(pl.col("prompt_id").cast(data.draw(st.sampled_from(_WIDTHS["int"]))),
                                 pl.col("reward").cast(data.draw(st.sampled_from(_WIDTHS["float"]))))
        if data.draw(st.booleans()):
            df = df.with_columns(pl.col("reward").round(0))  # whole numbers: JSON writes them as integers
            if sfx == ".jsonl":
                df = df.with_columns(pl.col("reward").cast(pl.Int64))
        kind = data.draw(st.sampled_from(["none"] * 4 + ["extra", "missing"])) if i else "none"
        if kind == "extra":
            df = df.with_columns(note=pl.lit("x"))
        elif kind == "missing":
            df = df.drop("loss")
        if kind != "none" and fault is None:
            fault = (f"f{i}{sfx}", "note" if kind == "extra" else "loss")
        frames.append(df)
        write(df, tmp / "in" / f"f{i}{sfx}")
    if fault is not None:
        with pytest.raises(MrtInputError, match=rf"'.*{fault[0]}' (has|lacks) column '{fault[1]}'"):
            select_dataset(tmp / "in", tmp / "o.parquet", 2, "top", parts=n_parts)
        assert not (tmp / "o.parquet").exists()
        return
    whole = pl.concat([f.with_columns(pl.col("prompt_id").cast(pl.Int64), pl.col("reward").cast(pl.Float64))
                       for f in frames])
    select_dataset(tmp / "in", tmp / "o.parquet", 2, "top", parts=n_parts)
    got = pl.read_parquet(tmp / "o.parquet")
    want = ref_select(whole, 2, "top")
    assert got.height == want.height
    assert got.select(want.columns).sort("prompt_id", "pick_rank").equals(
        want.sort("prompt_id", "pick_rank"), null_equal=True)
    rep = variance_budget(tmp / "in", n_boot=0)
    assert rep.n_prompts == whole["prompt_id"].n_unique()


def test_a_type_that_is_no_widening_is_refused_naming_the_file(tmp_path):
    write(rows(3), tmp_path / "in" / "a.parquet")
    write(rows(3, first=5).with_columns(pl.col("reward").cast(pl.Utf8)), tmp_path / "in" / "b.parquet")
    with pytest.raises(MrtInputError, match=r"column 'reward' is String in '.*b\.parquet' but Float64 in "
                                            r"'.*a\.parquet'"):
        select_dataset(tmp_path / "in", tmp_path / "o.parquet", 1, "top")


# --------------------------------------------------------------------------- grouped layout


def grouped(n_prompts: int, seed: int = 0) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 7, n_prompts)
    return pl.DataFrame({"prompt_id": np.arange(n_prompts) * 3 + 1, "k": rng.integers(1, 5, n_prompts),
                         "reward": [rng.standard_normal(s).round(3).tolist() for s in sizes],
                         "response": [[f"r{i}.{j}" for j in range(s)] for i, s in enumerate(sizes)]})


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n_prompts=st.integers(1, 12), n_parts=st.integers(1, 5), seed=st.integers(0, 99),
       method=st.sampled_from(["top", "random", "grades"]))
def test_grouped_layout_takes_a_per_prompt_k_column(tmp_path_factory, n_prompts, n_parts, seed, method):
    """A K column of the grouped layout (one K per prompt row) keeps each prompt's K,
    as `select` with that column does on the rows."""
    tmp = tmp_path_factory.mktemp("gk")
    g = grouped(n_prompts, seed)
    if method == "grades":  # a 2-d embedding per candidate
        g = g.with_columns(embedding=pl.col("reward").list.eval(pl.concat_list(pl.element(), pl.lit(1.0))))
    g.write_parquet(tmp / "g.parquet")
    select_dataset(tmp / "g.parquet", tmp / "o.parquet", "k", method, parts=n_parts)
    got = pl.read_parquet(tmp / "o.parquet")
    assert got["prompt_id"].to_list() == g["prompt_id"].to_list()
    flat = g.explode([c for c in g.columns if isinstance(g.schema[c], pl.List)])
    want = ref_select(flat, "k", method)
    lists = [c for c in got.columns if isinstance(got.schema[c], pl.List)]
    assert got.explode(lists).select(want.columns).sort("prompt_id", "pick_rank").equals(
        want.sort("prompt_id", "pick_rank"))
    assert got["pick_rank"].list.len().to_list() == [min(k, n) for k, n in
                                                    zip(g["k"].to_list(), g["reward"].list.len().to_list())]


@pytest.mark.parametrize("n_parts", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("where", [(0, 1), (0, 7), (3, 6)])
def test_grouped_layout_refuses_a_repeated_prompt_for_every_part_count(tmp_path, n_parts, where):
    g = grouped(8)
    ids = g["prompt_id"].to_list()
    ids[where[1]] = ids[where[0]]
    g = g.with_columns(pl.Series("prompt_id", ids))
    g[:5].write_parquet(tmp_path / "a.parquet")
    g[5:].write_parquet(tmp_path / "b.parquet")
    second = ("a", where[1]) if where[1] < 5 else ("b", where[1] - 5)
    with pytest.raises(MrtInputError, match=rf"prompt id {ids[where[0]]} is on more than one row, row {where[0]} of "
                                            rf"'.*a\.parquet' and row {second[1]} of '.*{second[0]}\.parquet'"):
        select_dataset(str(tmp_path / "*.parquet"), tmp_path / "o", 2, "top", parts=n_parts)
    assert not (tmp_path / "o").exists()


# --------------------------------------------------------------------------- the file and row an error names


def shards(df: pl.DataFrame, d: Path, cuts: list[int], sfx: str = ".parquet") -> list[tuple[Path, int, int]]:
    """``df`` cut at ``cuts`` into files f0, f1, ...; (file, first row, rows) of each."""
    bounds = [0, *sorted(cuts), df.height]
    out = []
    for i in range(len(bounds) - 1):
        f = write(df[bounds[i]:bounds[i + 1]], d / f"f{i}{sfx}")
        out.append((f, bounds[i], bounds[i + 1] - bounds[i]))
    return out


def where(files, row: int) -> str:
    f, first, _ = next(x for x in files if x[1] <= row < x[1] + x[2])
    return f"row {row - first} of {str(f)!r}"


def with_embeddings(df: pl.DataFrame, seed: int) -> pl.DataFrame:
    e = np.random.default_rng(seed).standard_normal((df.height, 4)).astype(np.float32)
    return df.with_columns(pl.Series("embedding", e.tolist(), dtype=pl.List(pl.Float32)))


def plant(df: pl.DataFrame, row: int, fault: str) -> pl.DataFrame:
    col, value = {"nan embedding": ("embedding", [0.5, float("nan"), 0.0, 1.0]),
                  "null in embedding": ("embedding", [0.5, None, 0.0, 1.0]),
                  "short embedding": ("embedding", [0.5, 1.0]),
                  "inf reward": ("reward", float("inf")), "null reward": ("reward", None)}[fault]
    vals = df[col].to_list()
    vals[row] = value
    return df.with_columns(pl.Series(col, vals, dtype=df.schema[col]))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), n_pools=st.integers(2, 30), n_parts=st.integers(1, 4), seed=st.integers(0, 99),
       fault=st.sampled_from(["nan embedding", "null in embedding", "short embedding", "inf reward", "null reward"]),
       sfx=st.sampled_from([".parquet", ".jsonl"]))
def test_a_bad_value_is_named_by_its_file_and_row(tmp_path_factory, data, n_pools, n_parts, seed, fault, sfx):
    """A bad value of any row, in any file, under any number of buckets: the error names
    that file and the row within it (not a row of the whole input or of a bucket)."""
    if sfx == ".jsonl" and fault in ("nan embedding", "inf reward"):
        fault = "null reward"  # JSON has no NaN or infinity
    tmp = tmp_path_factory.mktemp("where")
    df = with_embeddings(rows(n_pools, 3, seed=seed).sample(fraction=1.0, shuffle=True, seed=seed), seed)
    row = data.draw(st.integers(0, df.height - 1))
    cuts = data.draw(st.lists(st.integers(1, df.height - 1), max_size=3, unique=True))  # no empty file
    files = shards(plant(df, row, fault), tmp / "in", cuts, sfx)
    with pytest.raises(MrtInputError) as info:
        select_dataset(tmp / "in", tmp / "o.parquet", 2, "grades", parts=n_parts)
    assert where(files, row) in str(info.value), (str(info.value), where(files, row))
    assert info.value.row == int(where(files, row).split()[1])
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("n_parts", [1, 2, 5])
@pytest.mark.parametrize("prompt", [0, 6, 13])
def test_a_bad_candidate_of_the_grouped_layout_is_named_by_its_prompts_file_and_row(tmp_path, n_parts, prompt):
    g = with_embeddings(rows(14, 4), 1).group_by("prompt_id", maintain_order=True).agg("reward", "embedding")
    e = g["embedding"].to_list()
    e[prompt][2][1] = float("nan")
    g = g.with_columns(pl.Series("embedding", e, dtype=g.schema["embedding"]))
    files = shards(g, tmp_path / "in", [5, 9])
    with pytest.raises(MrtInputError, match=rf"candidate 2 \({where(files, prompt)}\)"):
        select_dataset(tmp_path / "in", tmp_path / "o", 2, "grades", parts=n_parts)


def test_diagnose_names_the_file_and_row_of_a_bad_loss(tmp_path):
    df = rows(20, 3)
    loss = df["loss"].to_list()
    loss[41] = float("nan")
    files = shards(df.with_columns(pl.Series("loss", loss)), tmp_path / "in", [10, 35])
    for batch_rows in (7, 1000):
        with pytest.raises(MrtInputError, match=rf"loss at {where(files, 41)} is NaN") as info:
            variance_budget(tmp_path / "in", n_boot=0, batch_rows=batch_rows)
        assert "update" not in str(info.value) and info.value.row == 6
