"""Fuzzing the dataset path: `select_dataset` and `mrt select` on files as they
come (drifting schemas, corrupt shards, broken links, hive folders) and on a
world that fails (a second job on the same output, kill -9, a full disk).

Every case ends in the rows of `mrt_fast.select` on the whole table read in
memory, or in one `MrtInputError` line (CLI: exit 2, one line on stderr); the
input files are byte for byte as they were, and a rerun after a kill or a full
disk writes parts byte-identical to an uninterrupted run's.
`MRT_FUZZ_EXAMPLES` (as in test_fuzz_api.py) scales the number of cases.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, Phase, given, note, settings
from hypothesis import strategies as st

import mrt_fast
from mrt_fast.datasets.local import select_dataset
from mrt_fast._util.files import temp_name
from mrt_fast.datasets.job import StoppedForTest, stopping_after
from mrt_fast.datasets.lock import lock_path
from mrt_fast.datasets.manifest import Manifest, part_check, part_name

from test_fuzz_api import EXAMPLES, outcome


#: no "explain" phase: it reruns a failing job hundreds of times
FAST_PHASES = [Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink]


def cases(n: int) -> settings:
    """``n`` examples at the default `MRT_FUZZ_EXAMPLES` (60), scaled with it."""
    return settings(max_examples=max(1, n * EXAMPLES // 60), deadline=None, phases=FAST_PHASES,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
pytestmark = pytest.mark.filterwarnings("ignore::mrt_fast.SmallPoolWarning")


# --------------------------------------------------------------------------- tables and files


def pools(n_pools: int, seed: int, first: int = 0) -> pl.DataFrame:
    """Pools of 1 to 6 candidates; rewards and 3-d embeddings are multiples of
    1/16 (exact in float32 and in JSON text), never whole numbers, never a zero row."""
    rng = np.random.default_rng(seed)
    ids = np.repeat(np.arange(first, first + n_pools), rng.integers(1, 7, n_pools))
    n = len(ids)
    emb = rng.integers(-4, 5, (n, 3)) / 4
    emb[:, 0] += 1 / 16
    return pl.DataFrame({"prompt_id": ids, "reward": rng.integers(-16, 16, n) / 8 + 1 / 16,
                         "embedding": emb.astype(np.float32).tolist(), "tag": [f"t{i % 3}" for i in range(n)]},
                        schema_overrides={"embedding": pl.List(pl.Float32)})


def write(df: pl.DataFrame, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    df.write_parquet(path) if path.suffix == ".parquet" else df.write_ndjson(path)
    return path


def snapshot(root: Path) -> dict[str, str]:
    """Every entry under ``root``: a file's SHA-256, a link's target, a folder."""
    out = {}
    for d, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(d) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = "-> " + os.readlink(p)
            elif p.is_dir():
                out[rel] = "dir"
            elif not p.is_file():  # a FIFO: never opened
                out[rel] = "special"
            else:
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def normal(df: pl.DataFrame) -> pl.DataFrame:
    """Numbers at their widest (the engine reads a widened column as the widest type)."""
    casts = {"prompt_id": pl.Int64, "reward": pl.Float64, "embedding": pl.List(pl.Float64)}
    return df.with_columns(pl.col(c).cast(t) for c, t in casts.items() if c in df.columns)


def reference(whole: pl.DataFrame, k: int, method: str, **kw) -> pl.DataFrame:
    """`mrt_fast.select` on the whole table in memory."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return normal(mrt_fast.select(normal(whole), k, method, **kw))


def kept(out: Path) -> pl.DataFrame:
    if out.suffix:
        return normal(pl.read_parquet(out))
    man = Manifest.read(out)
    assert man is not None and man.done, f"{out} is not a finished job"
    return normal(pl.read_parquet(out))  # a finished directory reads as it stands


def assert_same_rows(got: pl.DataFrame, want: pl.DataFrame, ordered: bool) -> None:
    got = got.select(want.columns)
    if not ordered:
        got, want = got.sort("prompt_id", "pick_rank"), want.sort("prompt_id", "pick_rank")
    assert got.height == want.height, (got.height, want.height)
    assert got.equals(want, null_equal=True), (got, want)


def one_line(e: Exception) -> str:
    msg = str(e)
    assert msg.strip() and "\n" not in msg.strip(), repr(msg)
    return msg


def parts_of(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("part-*.parquet"))}


def assert_complete(out: Path, clean: Path) -> None:
    """``out`` is a finished job whose parts are byte for byte ``clean``'s, each as its manifest records."""
    man = Manifest.read(out)
    assert man is not None and man.done, sorted(os.listdir(out))
    assert sorted(man.parts) == [part_name(i) for i in range(man.n_parts)]
    for name in man.parts:
        if man.parts[name]:  # a part no row went to has no file
            assert man.checks[name] == part_check(out / name), name
    assert parts_of(out) == parts_of(clean)
    left = sorted(n for n in os.listdir(out) if not n.startswith("part-") and n != ".mrt")
    assert not left, left  # no spill or temp file left behind
    assert sorted(os.listdir(out / ".mrt")) == ["manifest.parquet"]  # and no lock


# --------------------------------------------------------------------------- drifting schemas

FAULTS = ("missing", "extra", "incompatible")


@st.composite
def drifting_shards(draw):
    """Shards of one format whose columns drift: widths (Int32/Int64 ids,
    Float32/Float64 rewards and embeddings), whole-number JSON rewards, an
    all-null column, or a fault (a column missing or extra, a type that is no
    widening). Returns (format suffix, [(frame as written, drift)], faulty files)."""
    sfx = draw(st.sampled_from([".parquet", ".jsonl"]))
    n_files = draw(st.integers(1, 4))
    shards, faulty = [], []
    for i in range(n_files):
        df = pools(draw(st.integers(1, 5)), draw(st.integers(0, 10**6)), first=10 * i)
        options = ["none", "none", "narrow", "null_tag"] + (["int_reward"] if sfx == ".jsonl" else [])
        drift = draw(st.sampled_from(options + (list(FAULTS) if i else [])))
        if drift == "narrow" and sfx == ".parquet":
            df = df.with_columns(pl.col("prompt_id").cast(draw(st.sampled_from([pl.Int32, pl.Int64]))),
                                 pl.col("reward").cast(draw(st.sampled_from([pl.Float32, pl.Float64]))),
                                 pl.col("embedding").cast(pl.List(draw(st.sampled_from([pl.Float32, pl.Float64])))))
        elif drift == "int_reward":  # JSON writes whole numbers as integers
            df = df.with_columns(pl.col("reward").round(0).cast(pl.Int64))
        elif drift == "null_tag":
            df = df.with_columns(tag=pl.lit(None, pl.Null))
        elif drift == "missing":
            df = df.drop(draw(st.sampled_from(["tag", "reward"])))
        elif drift == "extra":
            df = df.with_columns(note=pl.lit("x"))
        elif drift == "incompatible":
            col = draw(st.sampled_from(["reward", "prompt_id"]))
            df = df.with_columns(pl.col(col).cast(pl.String) + "!")
        if drift in FAULTS:
            faulty.append(f"f{i}{sfx}")
        shards.append((df, drift))
    return sfx, shards, faulty


#: now and then a case runs through `mrt select` in a subprocess
VIA_CLI = st.sampled_from([False] * 9 + [True])


def run_case(source, out: Path, k, method, cli: bool = False, seed: int = 0, **kw):
    """("ok", report) or ("input_error", its one line): `select_dataset` here, or
    with ``cli`` `mrt select` in a subprocess (exit 0, or 2 with one line on
    stderr; of ``kw`` it takes ``rows_per_part``, as ``--chunk-rows``)."""
    if not cli:
        return outcome(lambda: select_dataset(source, out, k, method, seed=seed, **kw))
    argv = [sys.executable, "-m", "mrt_fast.cli", "select", str(source), str(out), "--k", str(k), "--method", method,
            "--seed", str(seed)]
    rows_per_part = kw.pop("rows_per_part", None)
    if rows_per_part is not None:
        argv += ["--chunk-rows", str(rows_per_part)]
    assert not kw, kw
    r = subprocess.run(argv, env=ENV, capture_output=True, text=True)
    if r.returncode == 2:
        return "input_error", one_error_line(r.stderr).removeprefix("error: ").rstrip("\n")
    assert r.returncode == 0, (r.returncode, r.stderr)
    return "ok", None


@cases(60)
@given(case=drifting_shards(), method=st.sampled_from(["top", "random", "grades"]), k=st.integers(1, 4),
       n_parts=st.integers(1, 3), to_file=st.booleans(), seed=st.integers(0, 2**32), cli=VIA_CLI)
def test_drifting_shards_give_the_in_memory_rows_or_one_line(tmp_path_factory, case, method, k, n_parts, to_file,
                                                            seed, cli):
    sfx, shards, faulty = case
    tmp = tmp_path_factory.mktemp("drift")
    for i, (df, _) in enumerate(shards):
        write(df, tmp / "in" / f"f{i}{sfx}")
    before = snapshot(tmp / "in")
    out = tmp / ("o.parquet" if to_file else "o")
    kind, got = run_case(tmp / "in", out, k, method, cli, seed, **({} if cli else {"parts": n_parts}))
    note(f"{[d for _, d in shards]} -> {kind}: {got if kind != 'ok' else ''}")
    assert snapshot(tmp / "in") == before
    if faulty:
        assert kind == "input_error", "a shard with other columns or types was read"
        assert any(f in one_line(got) for f in faulty), got
        assert not out.exists()
        return
    assert kind == "ok", f"refused: {got}"
    whole = pl.concat([normal(df) for df, _ in shards], how="vertical_relaxed")
    assert_same_rows(kept(out), reference(whole, k, method, seed=seed), ordered=to_file)


# --------------------------------------------------------------------------- corrupt shards and broken links


@st.composite
def corruptions(draw, n_files: int, sfx: str):
    """One fault in file ``i``: truncated, replaced by garbage, a bad JSON line, an
    empty file, or a link (beside the files) whose target is missing."""
    kinds = ["truncated", "garbage", "empty", "dangling"] + (["bad_line"] if sfx == ".jsonl" else [])
    return draw(st.sampled_from(kinds)), draw(st.integers(0, n_files - 1)), draw(st.randoms(use_true_random=False))


BAD_LINES = ['{"prompt_id": 1, "reward": ', "garbage", '{"prompt_id": 1, "reward": 0.5}}', "[1, 2]", '"text"',
             '{"prompt_id": 1, "reward": 0.5, "embedding": [1.0, NaN], "tag": "x"}']


def corrupt(path: Path, kind: str, rnd) -> Path:
    """Damage ``path``; returns the file the error must name."""
    data = path.read_bytes()
    if kind == "truncated":  # JSONL: within a line (a file cut at a line's end is a shorter, valid file)
        cuts = [p for p in range(1, len(data)) if path.suffix == ".parquet" or b"\n" not in data[p - 1:p + 1]]
        path.write_bytes(data[:rnd.choice(cuts)])
    elif kind == "garbage":
        path.write_bytes(bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 200))))
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "bad_line":
        lines = data.decode().splitlines()
        lines.insert(rnd.randrange(len(lines) + 1), rnd.choice(BAD_LINES))
        path.write_text("\n".join(lines) + "\n")
    elif kind == "dangling":
        link = path.with_name("z" + path.name)
        os.symlink(path.parent.parent / "annex" / path.name, link)
        return link
    return path


@cases(40)
@given(data=st.data(), sfx=st.sampled_from([".parquet", ".jsonl"]), n_files=st.integers(1, 3),
       method=st.sampled_from(["top", "grades"]), n_parts=st.integers(1, 3), to_file=st.booleans(),
       how=st.sampled_from(["directory", "glob"]), cli=VIA_CLI)
def test_a_corrupt_shard_or_broken_link_is_one_line_naming_it(tmp_path_factory, data, sfx, n_files, method, n_parts,
                                                              to_file, how, cli):
    tmp = tmp_path_factory.mktemp("corrupt")
    files = [write(pools(4, i), tmp / "in" / f"f{i}{sfx}") for i in range(n_files)]
    kind, i, rnd = data.draw(corruptions(n_files, sfx))
    bad = corrupt(files[i], kind, rnd)
    before = snapshot(tmp / "in")
    out = tmp / ("o.parquet" if to_file else "o")
    source = tmp / "in" if how == "directory" else f"{tmp / 'in'}/*{sfx}"
    got = run_case(source, out, 2, method, cli, **({} if cli else {"parts": n_parts}))
    note(f"{kind} {bad.name} -> {got}")
    assert got[0] == "input_error", f"{kind} {bad.name} was read"
    assert bad.name in one_line(got[1]), got[1]
    assert snapshot(tmp / "in") == before
    assert not out.exists()


# --------------------------------------------------------------------------- hive keys


@st.composite
def hive_layouts(draw):
    """Files under ``key=value`` folders: a plain key, a key that is also a column
    holding the folder's value (read) or other values (refused), or folders naming
    different keys (refused). Returns (sfx, [(relative folder, frame)], key, verdict)."""
    sfx = draw(st.sampled_from([".parquet", ".jsonl"]))
    kind = draw(st.sampled_from(["plain", "equal", "different", "mixed"]))
    key = {"plain": "split"}.get(kind) or draw(st.sampled_from(["tag", "prompt_id"]))
    n = draw(st.integers(1, 3))
    files = []
    for i in range(n):
        df = pools(draw(st.integers(1, 4)), draw(st.integers(0, 10**6)), first=10 * i)
        value = f"{7 + i}" if key == "prompt_id" else f"v{i}"
        if kind == "equal":  # the column holds its folder's value (polars' partitioned writes leave it so)
            df = df.with_columns(pl.lit(int(value) if key == "prompt_id" else value).alias(key))
        files.append((f"{key}={value}", df))
    verdict = "ok"
    if kind == "different":
        j = draw(st.integers(0, n - 1))
        folder, df = files[j]
        if df[key].cast(pl.String).unique().to_list() == [folder.split("=")[1]]:
            df = df.with_columns(pl.lit(99 if key == "prompt_id" else "other").alias(key))
        files[j] = (folder, df)
        verdict = f"hive key {key!r}"
    elif kind == "mixed":
        other = draw(st.sampled_from(["b=1", ".", "split=a/b=1", "b=1/split=a"]))
        files = [(f"split=s{i}", df.drop("tag")) for i, (_, df) in enumerate(files)]
        files.append((other, pools(2, 7, first=90).drop("tag")))
        verdict = "hive folders disagree"
        key = "split"
    return sfx, files, key, verdict


@cases(40)
@given(case=hive_layouts(), method=st.sampled_from(["top", "random"]), k=st.integers(1, 3), n_parts=st.integers(1, 3),
       cli=VIA_CLI)
def test_hive_keys_are_read_as_columns_or_refused(tmp_path_factory, case, method, k, n_parts, cli):
    sfx, files, key, verdict = case
    tmp = tmp_path_factory.mktemp("hive")
    for i, (folder, df) in enumerate(files):
        write(df, tmp / "in" / folder / f"f{i}{sfx}")
    before = snapshot(tmp / "in")
    out = tmp / "o"
    got = run_case(tmp / "in", out, k, method, cli, **({} if cli else {"parts": n_parts}))
    note(f"{[f for f, _ in files]} -> {got}")
    assert snapshot(tmp / "in") == before
    if verdict != "ok":
        assert got[0] == "input_error", "refused folders were read"
        assert verdict in one_line(got[1]), got[1]
        assert not out.exists()
        return
    assert got[0] == "ok", got[1]
    whole = pl.concat([normal(df.with_columns(pl.lit(folder.split("=")[1]).alias(key)))
                       for folder, df in files], how="vertical_relaxed")
    want = reference(whole, k, method).with_columns(pl.col(key).cast(pl.String))
    assert_same_rows(kept(out).with_columns(pl.col(key).cast(pl.String)), want, ordered=False)


# --------------------------------------------------------------------------- inputs at the edges

EDGE_KINDS = ("mixed_ids", "hive_odd", "views", "bom", "special", "corrupt_page")
#: folder values: leading zeros, '=' inside, empty, percent-encoded, Hive's null, spaces, signs
ODD_VALUES = ("007", "010", "a=b", "", "x%2Fy", "__HIVE_DEFAULT_PARTITION__", "v 1", "-0", "1e3", "=")


def _view_table(df: pl.DataFrame):
    """``df`` as Arrow with view types: strings as string_view, embeddings as large_list_view."""
    import pyarrow as pa

    t = df.to_arrow(compat_level=pl.CompatLevel.newest())
    emb = t.column("embedding").combine_chunks()
    offs = np.asarray(emb.offsets)
    view = pa.LargeListViewArray.from_arrays(pa.array(offs[:-1], pa.int64()), pa.array(np.diff(offs), pa.int64()),
                                             emb.values)
    return t.set_column(t.schema.get_field_index("embedding"), "embedding", view)


@st.composite
def edge_inputs(draw):
    """Files at one edge of what inputs may be. Returns (kind, write(root) -> None,
    whole frame expected (or None), needles of the one line expected (or None))."""
    import pyarrow.parquet as pq
    from urllib.parse import unquote

    kind = draw(st.sampled_from(EDGE_KINDS))
    n = draw(st.integers(1, 3))
    frames = [pools(draw(st.integers(1, 4)), draw(st.integers(0, 10**6)), first=10 * i) for i in range(n)]
    whole = pl.concat(frames, how="vertical_relaxed")

    if kind == "mixed_ids":  # integer ids beside fractional ones, in two shards or in one JSON file
        base = draw(st.sampled_from([0, 2**60, 2**64]))  # small, beyond 2^53, beyond 64 bits (JSON only)
        big = base > 0
        within = draw(st.booleans())
        sfx = ".jsonl" if within or base >= 2**63 else draw(st.sampled_from([".parquet", ".jsonl"]))
        ints = frames[0].with_columns((pl.col("prompt_id").cast(pl.Int128) + base)
                                      .cast(pl.Int64 if base < 2**63 else pl.Int128))
        floats = pools(2, draw(st.integers(0, 99)), first=500).with_columns(pl.col("prompt_id") + 0.5)
        first_big = ints["prompt_id"][0]
        lines = ints.write_ndjson().splitlines() + floats.write_ndjson().splitlines()
        order = draw(st.permutations(range(len(lines))))

        def write_mixed(root: Path) -> None:
            if within:
                (root / "in").mkdir(parents=True)
                (root / "in" / "f0.jsonl").write_text("\n".join(lines[i] for i in order) + "\n")
            else:
                write(ints, root / "in" / f"f0{sfx}")
                write(floats, root / "in" / f"f1{sfx}")

        if big:
            return kind, write_mixed, None, ["f0" + sfx, str(first_big) if not within else "2^53"]
        mixed = pl.concat([ints.with_columns(pl.col("prompt_id").cast(pl.Float64)), floats], how="vertical_relaxed")
        if within:  # the rows as the one file holds them (a gain is a sum over the pool's rows, in their order)
            mixed = mixed[list(order)]
        return kind, write_mixed, mixed, None

    if kind == "hive_odd":
        sfx = draw(st.sampled_from([".parquet", ".jsonl"]))
        values = draw(st.lists(st.sampled_from(ODD_VALUES), min_size=n, max_size=n, unique=True))

        def write_hive(root: Path) -> None:
            for i, (v, df) in enumerate(zip(values, frames)):
                write(df, root / "in" / f"split={v}" / f"f{i}{sfx}")

        decoded = [None if v == "__HIVE_DEFAULT_PARTITION__" else unquote(v) for v in values]
        whole = pl.concat([df.with_columns(split=pl.lit(v, pl.String)) for v, df in zip(decoded, frames)])
        return kind, write_hive, whole, None

    if kind == "views":
        def write_views(root: Path) -> None:
            (root / "in").mkdir(parents=True)
            for i, df in enumerate(frames):
                pq.write_table(_view_table(df), root / "in" / f"f{i}.parquet")

        return kind, write_views, whole, None

    if kind == "bom":
        boms = draw(st.lists(st.booleans(), min_size=n, max_size=n))
        array = draw(st.booleans())

        def write_bom(root: Path) -> None:
            (root / "in").mkdir(parents=True)
            for i, (df, bom) in enumerate(zip(frames, boms)):
                text = json.dumps(df.to_dicts()) if array else df.write_ndjson()
                name = f"f{i}.json" if array else f"f{i}.jsonl"
                (root / "in" / name).write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode())

        return kind, write_bom, whole, None

    if kind == "special":
        sfx = draw(st.sampled_from([".parquet", ".jsonl"]))

        def write_special(root: Path) -> None:
            for i, df in enumerate(frames):
                write(df, root / "in" / f"f{i}{sfx}")
            os.mkfifo(root / "in" / f"pipe{sfx}")

        return kind, write_special, None, [f"pipe{sfx}", "FIFO"]

    bad = draw(st.integers(0, n - 1))
    at = draw(st.integers(1, 8))

    def write_corrupt(root: Path) -> None:  # pyarrow with page checksums, one byte of a page flipped
        (root / "in").mkdir(parents=True)
        for i, df in enumerate(frames):
            p = root / "in" / f"f{i}.parquet"
            pq.write_table(df.to_arrow(), p, write_page_checksum=True, compression="none", use_dictionary=False)
            if i == bad:
                data = bytearray(p.read_bytes())
                cc = pq.ParquetFile(p).metadata.row_group(0).column(1)  # reward: no two bytes of a page equal 0
                end = cc.data_page_offset + cc.total_compressed_size
                data[end - at] ^= 0xFF
                p.write_bytes(bytes(data))

    return kind, write_corrupt, None, [f"f{bad}.parquet", "checksum"]


@cases(40)
@given(case=edge_inputs(), method=st.sampled_from(["top", "random", "grades"]), k=st.integers(1, 3),
       n_parts=st.integers(1, 2), cli=VIA_CLI)
def test_inputs_at_the_edges_give_the_in_memory_rows_or_one_line(tmp_path_factory, case, method, k, n_parts, cli):
    """Mixed integer/float ids (across shards, inside one JSON file; small, beyond 2^53 or beyond
    64 bits), odd hive
    values, Arrow view types, byte order marks, a FIFO among the shards, a damaged page."""
    kind, write_files, whole, needles = case
    tmp = tmp_path_factory.mktemp("edge")
    write_files(tmp)
    before = snapshot(tmp / "in")
    out = tmp / "o"
    got = run_case(tmp / "in", out, k, method, cli, **({} if cli else {"parts": n_parts}))
    note(f"{kind} -> {got}")
    assert snapshot(tmp / "in") == before
    if whole is None:
        assert got[0] == "input_error", f"{kind} was read"
        assert all(s in one_line(got[1]) for s in needles), (needles, got[1])
        assert not out.exists()
        return
    assert got[0] == "ok", got[1]
    if kind == "mixed_ids":
        # the reference selects the ids as the job read them (widened or not): equal candidates are
        # ordered by their content, types included; then both are compared as floats
        got_rows = pl.read_parquet(out)
        floats = {"prompt_id": pl.Float64, "reward": pl.Float64, "embedding": pl.List(pl.Float64)}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want = mrt_fast.select(whole.with_columns(pl.col("prompt_id").cast(got_rows.schema["prompt_id"])),
                                   k, method)
        assert_same_rows(got_rows.cast(floats), want.cast(floats), ordered=False)
        return
    assert_same_rows(kept(out), reference(whole, k, method), ordered=False)


# --------------------------------------------------------------------------- a job stopped after any part


def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def damage(out: Path, how: str, rnd) -> None:
    """What may happen to a stopped job's directory before its rerun: a part lost,
    changed or cut short, or a dead writer's temp file left beside it."""
    finished = sorted(out.glob("part-*.parquet"))
    if how == "none" or not finished:
        return
    p = rnd.choice(finished)
    if how == "lost":
        p.unlink()
    elif how == "changed":
        data = bytearray(p.read_bytes())
        data[rnd.randrange(len(data))] ^= 0xFF
        p.write_bytes(bytes(data))
    elif how == "cut":
        p.write_bytes(p.read_bytes()[:rnd.randrange(len(p.read_bytes()))])
    elif how == "stale_temp":
        (out / temp_name(p, pid=dead_pid())).write_bytes(b"half a part")


@cases(25)
@given(sfx=st.sampled_from([".parquet", ".jsonl"]), n_files=st.integers(1, 3), seed=st.integers(0, 10**6),
       method=st.sampled_from(["top", "random", "grades"]), n_parts=st.integers(2, 6), data=st.data(),
       workers=st.integers(1, 2), how=st.sampled_from(["none", "lost", "changed", "cut", "stale_temp"]))
def test_a_job_stopped_after_any_part_reruns_to_the_same_bytes(tmp_path_factory, sfx, n_files, seed, method, n_parts,
                                                               data, workers, how):
    """A job stopped after its j-th part (the test hook of a kill), its directory then
    damaged, reruns to parts byte-identical to an uninterrupted run's."""
    tmp = tmp_path_factory.mktemp("stop")
    for i in range(n_files):
        write(pools(30, seed + i, first=100 * i), tmp / "in" / f"f{i}{sfx}")
    before = snapshot(tmp / "in")
    kw = {"seed": seed, "parts": n_parts, "workers": workers}
    select_dataset(tmp / "in", tmp / "clean", 2, method, **kw)
    j = data.draw(st.integers(1, n_parts - 1))
    with stopping_after(j), pytest.raises(StoppedForTest):
        select_dataset(tmp / "in", tmp / "o", 2, method, **kw)
    # the draw does not depend on how many parts the stopped run left (with two workers a part being
    # written as the stop came may or may not be there): hypothesis replays the same draws
    damage(tmp / "o", how, random.Random(data.draw(st.integers(0, 2**32 - 1))))
    rep = select_dataset(tmp / "in", tmp / "o", 2, method, **kw)
    assert rep.resumed and not rep.already_done
    assert_complete(tmp / "o", tmp / "clean")
    assert snapshot(tmp / "in") == before
    assert select_dataset(tmp / "in", tmp / "o", 2, method, **kw).already_done


# --------------------------------------------------------------------------- real processes: kill -9, two jobs


def mrt_select(inp: Path, out: Path, *extra: str, chunk_rows: int = 2000) -> list[str]:
    return [sys.executable, "-m", "mrt_fast.cli", "select", str(inp), str(out), "--k", "2", "--chunk-rows",
            str(chunk_rows), *extra]


def one_error_line(stderr: str) -> str:
    assert stderr.startswith("error: ") and stderr.count("\n") == 1, stderr
    assert "Traceback" not in stderr
    return stderr


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """An input of 20,000 candidates in two shuffled Parquet files, its
    uninterrupted outputs (a directory of 10 parts of 2,000 rows, and a file),
    how long the directory's job held its lock, and the input's snapshot."""
    tmp = tmp_path_factory.mktemp("job")
    rng = np.random.default_rng(0)
    n = 20_000
    ids = np.repeat(np.arange(n), rng.integers(1, 12, n))[:n]
    df = pl.DataFrame({"prompt_id": ids, "reward": rng.integers(-16, 16, n) / 8 + 1 / 16,
                       "embedding": rng.standard_normal((n, 8)).astype(np.float32)})
    df = df.sample(fraction=1.0, shuffle=True, seed=0)
    (tmp / "in").mkdir()
    df[: n // 2].write_parquet(tmp / "in" / "a.parquet")
    df[n // 2:].write_parquet(tmp / "in" / "b.parquet")
    p = subprocess.Popen(mrt_select(tmp / "in", tmp / "clean"), env=ENV, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    t_lock = wait_for_lock(p, tmp / "clean")
    assert p.wait() == 0, p.stderr.read()
    held = time.monotonic() - t_lock
    assert Manifest.read(tmp / "clean").n_parts == 10
    r = subprocess.run(mrt_select(tmp / "in", tmp / "clean.parquet"), env=ENV, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return tmp / "in", {False: tmp / "clean", True: tmp / "clean.parquet"}, held, snapshot(tmp / "in")


def wait_for_lock(p: subprocess.Popen, out: Path) -> float:
    """When ``p`` took the lock of ``out`` (or ended)."""
    lock = lock_path(out, directory=not out.suffix)
    while not lock.exists() and p.poll() is None:
        time.sleep(0.0005)
    return time.monotonic()


def finished_parts(out: Path) -> int:
    """The parts a job on ``out`` has written so far (a file output's are in its spill)."""
    if out.suffix:
        return len(list(out.parent.glob(f".{out.name}.spill-*/parts/*.parquet")))
    return len(list(out.glob("part-*.parquet")))


def wait_for_parts(p: subprocess.Popen, out: Path, n: int) -> None:
    """Until a job on ``out`` has written ``n`` parts (or ``p`` ended)."""
    while finished_parts(out) < n and p.poll() is None:
        time.sleep(0.0005)


#: where a kill lands: ("time", x) x times an uninterrupted job's lock time after the
#: lock is taken, or ("part", n) as the n-th part appears
KILL_POINTS = st.tuples(st.just("time"), st.floats(0.0, 1.2)) | st.tuples(st.just("part"), st.integers(1, 10))


@pytest.mark.slow
@cases(8)
@given(points=st.lists(KILL_POINTS, min_size=1, max_size=2), to_file=st.sampled_from([False, False, True]))
def test_kill_9_of_a_real_job_at_a_random_point_then_a_rerun_gives_the_same_parts(job, tmp_path_factory, points,
                                                                                  to_file):
    """`mrt select` killed with SIGKILL at random points of its life (once or twice),
    then run again: exit 0, and the parts are byte for byte an uninterrupted run's,
    each as the manifest records it (a file output: the file, and nothing beside it)."""
    inp, clean, held, before = job
    out = tmp_path_factory.mktemp("kill") / ("o.parquet" if to_file else "o")
    for how, at in points:
        p = subprocess.Popen(mrt_select(inp, out), env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True)
        wait_for_lock(p, out)
        if how == "time":
            time.sleep(at * held)
        else:
            wait_for_parts(p, out, at)
        p.send_signal(signal.SIGKILL)
        rc = p.wait()
        note(f"killed at {how} {at} ({held:.2f}s): rc {rc}, {finished_parts(out)} parts")
        assert rc in (0, -signal.SIGKILL), p.stderr.read()
    r = subprocess.run(mrt_select(inp, out), env=ENV, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    if to_file:
        assert out.read_bytes() == clean[True].read_bytes()
        assert os.listdir(out.parent) == [out.name]  # a dead job's spill and lock are gone
    else:
        assert_complete(out, clean[False])
    assert snapshot(inp) == before


@pytest.mark.slow
@cases(4)
@given(gap=st.floats(0.0, 0.6), to_file=st.sampled_from([False, False, True]))
def test_two_real_jobs_on_one_output_finish_it_once_or_refuse_in_one_line(job, tmp_path_factory, gap, to_file):
    """Two `mrt select` on the same output, the second started ``gap`` times a job's
    lock time after the first: each exits 0 or refuses in one line naming the
    holder; the output ends complete, with an uninterrupted run's parts (a file
    output: its bytes, and nothing beside it)."""
    inp, clean, held, before = job
    out = tmp_path_factory.mktemp("two") / ("o.parquet" if to_file else "o")
    jobs = []
    for _ in range(2):
        jobs.append(subprocess.Popen(mrt_select(inp, out), env=ENV, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True))
        time.sleep(gap * held)
    results = [(p.wait(), p.stderr.read()) for p in jobs]
    note(f"gap {gap:.2f} x {held:.2f}s: {results}")
    for rc, err in results:
        assert rc in (0, 2), err
        if rc == 2:
            assert "pid" in one_error_line(err) and "host" in err, err
    assert 0 in [rc for rc, _ in results]
    if to_file:
        assert out.read_bytes() == clean[True].read_bytes()
        assert os.listdir(out.parent) == [out.name]
    else:
        assert_complete(out, clean[False])
    assert snapshot(inp) == before


# --------------------------------------------------------------------------- a full disk


@pytest.fixture(scope="module")
def small_disk(tmp_path_factory):
    """An 8 MiB tmpfs (root only; skipped where it cannot be mounted), unmounted at the end."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system needs root")
    d = tmp_path_factory.mktemp("disk")
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(d)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)


def leave_free(disk: Path, free: int) -> None:
    """Empty ``disk``, then fill it (a ballast file) until ``free`` bytes are left."""
    for p in disk.iterdir():
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    st_ = os.statvfs(disk)
    fill = st_.f_bavail * st_.f_frsize - free
    if fill > 0:
        with open(disk / "ballast", "wb") as fh:
            os.posix_fallocate(fh.fileno(), 0, fill)


@pytest.fixture(scope="module")
def spill_input(tmp_path_factory):
    """12,000 candidates with 16-d embeddings in three Parquet files (about 1 MB spilled)."""
    tmp = tmp_path_factory.mktemp("spill_in")
    rng = np.random.default_rng(1)
    n = 12_000
    ids = np.repeat(np.arange(n), rng.integers(1, 12, n))[:n]
    df = pl.DataFrame({"prompt_id": ids, "reward": rng.integers(-16, 16, n) / 8 + 1 / 16,
                       "embedding": rng.standard_normal((n, 16)).astype(np.float32)})
    df = df.sample(fraction=1.0, shuffle=True, seed=1)
    for i in range(3):
        write(df[i * n // 3:(i + 1) * n // 3], tmp / "in" / f"f{i}.parquet")
    return tmp / "in"


FREE = st.sampled_from([0, 1, 4096, 64 << 10]) | st.integers(0, 3 << 20)


@cases(12)
@given(free=FREE, to_file=st.booleans(), rows_per_part=st.sampled_from([2500, 6000, 20000]),
       method=st.sampled_from(["top", "grades"]), cli=VIA_CLI)
def test_a_full_disk_is_one_line_and_a_rerun_with_room_finishes_as_a_clean_run(small_disk, spill_input, tmp_path_factory,
                                                                                free, to_file, rows_per_part, method,
                                                                                cli):
    """A job on a disk with ``free`` bytes left finishes, or stops with one
    `MrtResourceError` line saying the disk is full (the CLI: exit 2, one line); with
    room again the same job finishes with a clean run's rows (a directory: its parts,
    byte for byte)."""
    name = "o.parquet" if to_file else "o"
    clean = tmp_path_factory.mktemp("clean") / name
    select_dataset(spill_input, clean, 2, method, rows_per_part=rows_per_part)
    before = snapshot(spill_input)
    out = small_disk / name
    leave_free(small_disk, free)
    got = run_case(spill_input, out, 2, method, cli, rows_per_part=rows_per_part)
    note(f"{free} bytes free: {got}")
    if got[0] == ("input_error" if cli else "resource_error"):  # the CLI says both in one line, exit 2
        msg = one_line(got[1])
        assert "no space left on device while" in msg and "bytes free" in msg and "rerun" in msg, msg
        assert str(spill_input) not in msg, "a full disk blamed on the input"
        (small_disk / "ballast").unlink()
        got = run_case(spill_input, out, 2, method, cli, rows_per_part=rows_per_part)
    assert got[0] == "ok", got[1]
    assert snapshot(spill_input) == before
    if to_file:
        assert_same_rows(kept(out), kept(clean), ordered=True)
        assert sorted(p.name for p in small_disk.iterdir()) in (["ballast", name], [name])
    else:
        assert_complete(out, clean)
