"""mrt_fast.datasets.ray_engine on a local Ray instance: the same kept rows and the
same variance report as the in-memory functions, through shuffled blocks,
bucket counts, retries and both layouts; bad input raises the local error."""

import re
import warnings

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

ray = pytest.importorskip("ray")

import mrt_fast  # noqa: E402
from mrt_fast import MrtInputError, SmallPoolWarning  # noqa: E402
from mrt_fast.datasets import Manifest, ray_engine as D  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("local_ray")]

METHODS = ["random", "top", "diverse", "grades", "stratified"]


def make_table(n_pools=40, d=8, seed=0, ids="str", shuffle=True):
    """Pools of 1 to 15 candidates, rows shuffled so pools span blocks."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 16, size=n_pools)
    pid = np.repeat(np.arange(n_pools), sizes)
    n = len(pid)
    df = pl.DataFrame(
        {
            "prompt_id": [f"p{i}" for i in pid] if ids == "str" else pid,
            "response": [f"r{i}" for i in range(n)],
            "embedding": rng.normal(size=(n, d)).astype(np.float32),
            # ties on purpose: the order of appearance decides them
            "reward": rng.integers(0, 4, size=n).astype(np.float64),
            "mode": rng.integers(0, 3, size=n),
            "loss": rng.normal(size=n) + rng.normal(size=n_pools)[pid],
        }
    )
    return df.sample(fraction=1.0, shuffle=True, seed=seed) if shuffle else df


def local(df, k, method, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SmallPoolWarning)
        return mrt_fast.select(df, k, method, **kw)


def by_pool(df: pl.DataFrame) -> pl.DataFrame:
    """Rows sorted by pool, then pick order (the per-pool order is what must match)."""
    return df.sort(["prompt_id", "pick_rank"], maintain_order=True)


def assert_same_per_pool(out: pl.DataFrame, ref: pl.DataFrame):
    assert sorted(out.columns) == sorted(ref.columns)
    a, b = by_pool(out.select(ref.columns)), by_pool(ref)
    assert a.height == b.height
    assert a.equals(b), (a.head(), b.head())


def dataset(df: pl.DataFrame, blocks: int):
    return ray.data.from_arrow(df.to_arrow(), override_num_blocks=blocks)


@pytest.mark.parametrize("method", METHODS)
def test_equal_to_local_select_per_pool(method):
    df = make_table(seed=1)
    ref = local(df, 3, method, seed=7)
    out = D.collect(D.select(dataset(df, 5), 3, method, seed=7, n_buckets=3))
    assert_same_per_pool(out, ref)
    # each pool's rows come together, in pick order
    ranks = out.group_by("prompt_id", maintain_order=True).agg(pl.col("pick_rank"))
    assert all(r == list(range(len(r))) for r in ranks["pick_rank"].to_list())


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    seed=st.integers(0, 10_000),
    blocks=st.integers(1, 9),
    n_buckets=st.integers(1, 7),
    k=st.integers(1, 5),
    method=st.sampled_from(METHODS),
    ids=st.sampled_from(["str", "int"]),
)
def test_any_blocks_and_buckets_give_the_local_result(seed, blocks, n_buckets, k, method, ids):
    df = make_table(n_pools=25, seed=seed, ids=ids)
    ref = local(df, k, method, seed=seed)
    out = D.collect(D.select(dataset(df, blocks), k, method, seed=seed, n_buckets=n_buckets))
    assert_same_per_pool(out, ref)


def test_candidate_key_and_options_pass_through():
    df = make_table(seed=3)
    kw = dict(alpha=0.5, k_max=6, kernel="clip", candidate_key="response")
    ref = local(df, 2, "grades", **kw)
    out = D.collect(D.select(dataset(df, 4), 2, "grades", n_buckets=2, **kw))
    assert_same_per_pool(out, ref)


def test_injected_fault_is_retried_with_the_same_output(tmp_path, monkeypatch):
    df = make_table(seed=4)
    ref = local(df, 3, "random", seed=1)
    marker = tmp_path / "fault"
    monkeypatch.setenv(D.FAULT_ENV, str(marker))
    out = D.collect(D.select(dataset(df, 4), 3, "random", seed=1, n_buckets=3))
    assert marker.exists()  # the fault did fire in one task's first attempt
    assert_same_per_pool(out, ref)  # and the retry left no duplicate and lost nothing
    # the same on the grouped layout
    marker2 = tmp_path / "fault2"
    monkeypatch.setenv(D.FAULT_ENV, str(marker2))
    g = grouped(df)
    out2 = D.collect(D.select(ray.data.from_arrow(g.to_arrow(), override_num_blocks=3), 3, "random", seed=1))
    assert marker2.exists()
    assert_same_per_pool(flat_of(out2), ref)


def test_a_fault_that_is_not_retried_surfaces(tmp_path, monkeypatch):
    # a retry budget of zero attempts would lose the work: Ray reports the failure
    from ray.exceptions import RayTaskError

    df = make_table(seed=4)
    marker = tmp_path / "fault"
    monkeypatch.setenv(D.FAULT_ENV, str(marker))
    ds = D.select(dataset(df, 2), 3, "random", n_buckets=2, max_retries=0)
    with pytest.raises((RayTaskError, D.TransientTaskError, Exception)) as e:
        D.collect(ds)
    assert "injected fault" in str(e.value)


def grouped(df: pl.DataFrame) -> pl.DataFrame:
    """One row per prompt, the per-candidate fields as lists (pools in order of first appearance)."""
    cand = [c for c in df.columns if c != "prompt_id"]
    return df.group_by("prompt_id", maintain_order=True).agg(cand)


def flat_of(g: pl.DataFrame) -> pl.DataFrame:
    lists = [c for c, t in g.schema.items() if isinstance(t, pl.List)]
    return g.explode(lists)


@pytest.mark.parametrize("method", ["random", "grades", "stratified"])
def test_grouped_layout_keeps_pools_as_rows(method):
    df = make_table(seed=5)
    g = grouped(df)
    ref = local(df, 3, method, seed=2)
    out = D.collect(D.select(ray.data.from_arrow(g.to_arrow(), override_num_blocks=4), 3, method, seed=2))
    assert out.height == g.height  # one row per prompt still
    assert out["prompt_id"].n_unique() == out.height
    assert isinstance(out.schema["pick_rank"], pl.List)
    # the kept candidates of each prompt, in pick order, are the local ones
    assert_same_per_pool(flat_of(out), ref)
    # the per-prompt columns survive as scalars
    assert out.schema["prompt_id"] == pl.Utf8


def test_layout_detection():
    df = make_table(seed=6)
    assert D.layout_of(df.to_arrow().schema) == "flat"
    assert D.layout_of(grouped(df).to_arrow().schema) == "grouped"
    with pytest.raises(MrtInputError, match="layout must be"):
        D.select(dataset(df, 1), 2, "random", layout="wide")


def test_grouped_rows_with_unequal_lists_are_refused():
    g = pl.DataFrame({"prompt_id": ["a", "b"], "reward": [[1.0, 2.0, 3.0], [1.0, 2.0]],
                      "response": [["x", "y", "z"], ["u"]]})
    with pytest.raises(MrtInputError, match=r"prompt 'b' has 1 values in 'response' but 2 in 'reward' \(row 1\)"):
        D.collect(D.select(ray.data.from_arrow(g.to_arrow()), 1, "top"))


@pytest.mark.parametrize("layout", ["flat", "grouped"])
def test_variance_budget_equals_local(layout):
    df = make_table(n_pools=60, seed=8)
    ref = mrt_fast.variance_budget(df, n_boot=200, seed=3)
    src = df if layout == "flat" else grouped(df)
    rep = D.variance_budget(dataset(src, 6), n_boot=200, seed=3)
    for f in ("n_rows", "n_prompts", "n_single_response_prompts", "n_used_prompts", "k_best", "mrt_pays"):
        assert getattr(rep, f) == getattr(ref, f), f
    for f in ("v_x", "v_x_raw", "v_y_given_x", "var_of_means", "mean_k", "k_star", "loss_bound"):
        assert getattr(rep, f) == pytest.approx(getattr(ref, f), rel=1e-12, abs=1e-15), f
    assert rep.ci.keys() == ref.ci.keys()
    for name in ref.ci:
        assert rep.ci[name] == pytest.approx(ref.ci[name], rel=1e-9), name
    np.testing.assert_allclose(rep.predicted["predicted_variance"].to_numpy(),
                               ref.predicted["predicted_variance"].to_numpy(), rtol=1e-12)
    assert rep.notes == ref.notes


@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 10_000), blocks=st.integers(1, 8), n_pools=st.integers(3, 40))
def test_variance_budget_over_any_blocks_equals_local(seed, blocks, n_pools):
    df = make_table(n_pools=n_pools, seed=seed)
    if df.group_by("prompt_id").len().filter(pl.col("len") >= 2).height < 2:
        return  # too few prompts with two responses: both raise (tested elsewhere)
    ref = mrt_fast.variance_budget(df, n_boot=0)
    rep = D.variance_budget(dataset(df, blocks), n_boot=0)
    assert (rep.n_rows, rep.n_prompts, rep.n_used_prompts) == (ref.n_rows, ref.n_prompts, ref.n_used_prompts)
    for f in ("v_x_raw", "v_y_given_x", "var_of_means", "loss_bound"):
        assert getattr(rep, f) == pytest.approx(getattr(ref, f), rel=1e-12, abs=1e-15), f


def test_variance_budget_bit_equal_when_prompts_are_not_split():
    df = make_table(n_pools=30, seed=9, shuffle=False)
    ref = mrt_fast.variance_budget(df, n_boot=0, loss_bound=5.0)
    rep = D.variance_budget(ray.data.from_arrow(df.to_arrow()), n_boot=0, loss_bound=5.0)
    assert (rep.v_x, rep.v_y_given_x, rep.k_star) == (ref.v_x, ref.v_y_given_x, ref.k_star)


@pytest.mark.parametrize("method,missing", [("grades", "embedding"), ("top", "reward"),
                                            ("stratified", ["mode", "embedding"])])
def test_missing_column_raises_the_local_message(method, missing):
    df = make_table(seed=10).drop(missing)
    with pytest.raises(MrtInputError) as loc:
        mrt_fast.select(df, 2, method)
    with pytest.raises(MrtInputError) as dist:
        D.select(dataset(df, 2), 2, method)
    assert str(dist.value) == str(loc.value)
    with pytest.raises(MrtInputError) as loc_v:
        mrt_fast.variance_budget(df.drop("loss"))
    with pytest.raises(MrtInputError) as dist_v:
        D.variance_budget(dataset(df.drop("loss"), 2))
    assert str(dist_v.value) == str(loc_v.value)


def test_bad_arguments_raise_the_local_message():
    df = make_table(seed=11)
    for args, kw in [((0, "random"), {}), ((2, "best"), {}), ((2, "grades"), {"kernel": "cosine"}),
                     ((2, "grades"), {"k_max": 1})]:
        with pytest.raises(MrtInputError) as loc:
            mrt_fast.select(df, *args, **kw)
        with pytest.raises(MrtInputError) as dist:
            D.select(dataset(df, 1), *args, **kw)
        assert str(dist.value) == str(loc.value)
    with pytest.raises(MrtInputError, match="delta"):
        D.variance_budget(dataset(df, 1), delta=2.0)


def test_bad_values_inside_a_task_raise_mrt_input_error_not_a_ray_error():
    df = make_table(seed=12).with_columns(
        pl.when(pl.col("response") == "r5").then(None).otherwise(pl.col("reward")).alias("reward"))
    with pytest.raises(MrtInputError, match=r"column 'reward' \(reward\) has 1 null value"):
        D.collect(D.select(dataset(df, 3), 2, "top", n_buckets=2))
    bad_loss = make_table(seed=12).with_columns(
        pl.when(pl.col("response") == "r5").then(float("nan")).otherwise(pl.col("loss")).alias("loss"))
    with pytest.raises(MrtInputError, match="(?i)nan|finite"):
        D.variance_budget(dataset(bad_loss, 3))


def test_a_bucket_task_restores_dataset_order_whatever_order_its_rows_arrive_in():
    # the shuffle may deliver a bucket's rows in any order: the row-order id puts them back
    import pyarrow as pa

    df = make_table(seed=13)
    ref = local(df, 3, "random", seed=5)
    t = df.to_arrow()
    t = t.append_column(D._ORDER, pa.array(np.arange(t.num_rows, dtype=np.int64)))
    t = t.append_column(D._BUCKET, pa.array(np.zeros(t.num_rows, dtype=np.int32)))
    perm = np.random.default_rng(0).permutation(t.num_rows)
    out = D._SelectBucket(mrt_fast.SelectOptions(k=3, method="random", seed=5), None)(t.take(pa.array(perm)))
    assert_same_per_pool(pl.from_arrow(out), ref)


# --------------------------------------------------------------------------- dataset jobs and the CLI


def write_files(df: pl.DataFrame, d, n_files: int, fmt: str = "parquet"):
    d.mkdir()
    cuts = np.linspace(0, df.height, n_files + 1).astype(int)
    for i in range(n_files):
        part = df.slice(int(cuts[i]), int(cuts[i + 1] - cuts[i]))
        if fmt == "parquet":
            part.write_parquet(d / f"f{i:02d}.parquet")
        else:
            part.write_ndjson(d / f"f{i:02d}.jsonl")
    return d


def parts_bytes(d):
    return {p.name: p.read_bytes() for p in sorted(d.glob("part-*.parquet"))}


@pytest.mark.parametrize("method,shuffle,fmt", [("random", "files", "parquet"), ("grades", "files", "parquet"),
                                                ("grades", "files", "jsonl"), ("grades", "sort", "parquet")])
def test_job_parts_are_the_local_engines_parts_byte_for_byte(tmp_path, method, shuffle, fmt):
    """Parquet goes through the local engine's spill (read tasks write its bucket files), JSONL through
    polars-read pieces, and "sort" through Ray Data's shuffle: all give the local engine's parts."""
    from mrt_fast.datasets.local import select_dataset as local_job

    df = make_table(n_pools=60, seed=20)
    src = write_files(df, tmp_path / "in", 3, fmt)
    local_job(src, tmp_path / "local", 3, method, parts=4)
    rep = D.select_dataset(src, tmp_path / "ray", 3, method, parts=4, shuffle=shuffle)
    assert not (tmp_path / "ray" / "_spill").exists()
    assert rep.n_parts == 4 and rep.n_input_rows == df.height
    a, b = parts_bytes(tmp_path / "local"), parts_bytes(tmp_path / "ray")
    assert list(a) == list(b) and a == b

    m = Manifest.read(tmp_path / "ray")
    assert m.done and m.rows == rep.n_kept == local(df, 3, method).height
    assert m.checks == Manifest.read(tmp_path / "local").checks


@pytest.mark.parametrize("method,out", [("grades", "ray"), ("stratified", "ray"), ("grades", "kept.parquet")])
def test_job_report_counts_what_the_local_engine_counts(tmp_path, method, out):
    """To a directory or to one file: the same pools, candidates and pick counts as locally."""
    from mrt_fast.datasets.local import select_dataset as local_job

    df = make_table(n_pools=40, seed=21)
    df = pl.concat([df, df.head(df.height // 3)])  # exact repeats inside their pools
    src = write_files(df, tmp_path / "in", 3)
    ref = local_job(src, tmp_path / "local", 3, method, parts=3)
    assert ref.n_duplicates_skipped > 0
    rep = D.select_dataset(src, tmp_path / out, 3, method, parts=3)
    counts = ["n_pools", "n_candidates", "n_small_pools", *mrt_fast.SelectionReport.COUNTS]
    assert {f: getattr(rep, f) for f in counts} == {f: getattr(ref, f) for f in counts}
    assert "duplicates skipped" in str(rep)


def test_job_to_a_file_equals_select_on_the_whole_table(tmp_path):
    df = make_table(n_pools=50, seed=21)
    src = write_files(df, tmp_path / "in", 4, fmt="jsonl")
    D.select_dataset(src, tmp_path / "kept.parquet", 2, "random", seed=3, parts=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "kept.parquet"]  # no spill left
    got = pl.read_parquet(tmp_path / "kept.parquet")
    ref = local(pl.read_ndjson(sorted((tmp_path / "in").glob("*.jsonl"))), 2, "random", seed=3)
    assert got.select(ref.columns).equals(ref)  # the in-memory order too


def test_a_job_that_died_resumes_with_the_missing_parts_only(tmp_path):

    df = make_table(n_pools=60, seed=22)
    src = write_files(df, tmp_path / "in", 2)
    out = tmp_path / "out"
    D.select_dataset(src, out, 3, "grades", parts=5)
    whole = parts_bytes(out)
    # the state a job killed after three parts leaves: two parts missing, manifest not done
    m = Manifest.read(out)
    for name in ("part-00001.parquet", "part-00003.parquet"):
        (out / name).unlink()
        del m.parts[name]
    m.done = False
    m.write(out)
    rep = D.select_dataset(src, out, 3, "grades")
    assert rep.resumed and rep.parts_done_now == 2 and rep.n_parts == 5
    assert parts_bytes(out) == whole
    assert D.select_dataset(src, out, 3, "grades").already_done
    with pytest.raises(MrtInputError, match="another job"):
        D.select_dataset(src, out, 4, "grades")
    # the engines share the format: the local engine finishes a job Ray started
    from mrt_fast.datasets.local import select_dataset as local_job

    (out / "part-00002.parquet").unlink()
    m = Manifest.read(out)
    del m.parts["part-00002.parquet"]
    m.done = False
    m.write(out)
    rep = local_job(src, out, 3, "grades")
    assert rep.resumed and rep.parts_done_now == 1
    assert parts_bytes(out) == whole


@pytest.mark.parametrize("layout", ["flat", "grouped"])
def test_bad_input_found_by_a_task_is_named_as_itself_and_leaves_nothing_behind(tmp_path, layout):
    df = make_table(n_pools=30, seed=25)
    if layout == "grouped":
        df = grouped(df).with_columns(  # prompt p3 gets one response too many
            pl.when(pl.col("prompt_id") == "p3").then(pl.col("response").list.concat(pl.lit(["x"])))
            .otherwise(pl.col("response")).alias("response"))
        want = "grouped layout: prompt 'p3' has"
    else:
        df = df.with_columns(pl.when(pl.int_range(pl.len()) == df.height - 3).then(None)
                             .otherwise(pl.col("prompt_id")).alias("prompt_id"))
        want = r"null prompt id\(s\), the first in '[^']*f01\.parquet' at row \d+"
    src = write_files(df, tmp_path / "in", 2)
    before = sorted(p.name for p in tmp_path.iterdir())
    for out in (tmp_path / "kept.parquet", tmp_path / "new"):
        with pytest.raises(MrtInputError) as e:  # (grouped: one part, so that none is committed before)
            D.select_dataset(src, out, 2, "top", parts=1 if layout == "grouped" else 3)
        assert type(e.value) is MrtInputError  # not Ray's wrapper, whose text is its task banner
        msg = str(e.value)
        assert "\n" not in msg and "ray::" not in msg and re.search(want, msg), msg
        assert sorted(p.name for p in tmp_path.iterdir()) == before  # no spill beside the file, no new directory


def test_a_live_jobs_output_is_refused_on_ray_too(tmp_path):
    import os

    from mrt_fast.datasets.lock import JobLock, lock_path

    src = write_files(make_table(n_pools=10, seed=26), tmp_path / "in", 2)
    for out, is_dir in ((tmp_path / "out", True), (tmp_path / "kept.parquet", False)):
        if is_dir:
            out.mkdir()
        with JobLock.take(lock_path(out, directory=is_dir)):
            with pytest.raises(MrtInputError, match=f"in use by another job \\(pid {os.getpid()} on host"):
                D.select_dataset(src, out, 2, "random", parts=2)
        assert not Manifest.exists(out) and not (tmp_path / "kept.parquet").exists()


def test_grouped_job_parts_equal_the_local_engines(tmp_path):
    from mrt_fast.datasets.local import select_dataset as local_job

    g = grouped(make_table(n_pools=40, seed=23))
    src = write_files(g, tmp_path / "in", 2)
    local_job(src, tmp_path / "local", 2, "grades", parts=3)
    D.select_dataset(src, tmp_path / "ray", 2, "grades", parts=3)
    assert parts_bytes(tmp_path / "local") == parts_bytes(tmp_path / "ray")


def test_cli_engine_ray_select_and_diagnose(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from mrt_fast.cli import app

    df = make_table(n_pools=50, seed=24)
    src = write_files(df, tmp_path / "in", 3)
    runner = CliRunner()
    marker = tmp_path / "fault"
    monkeypatch.setenv(D.FAULT_ENV, str(marker))
    r = runner.invoke(app, ["select", str(src), str(tmp_path / "ray"), "--k", "2", "--method", "top",
                            "--engine", "ray", "--parts", "3"])
    assert r.exit_code == 0, r.output
    assert marker.exists()
    monkeypatch.delenv(D.FAULT_ENV)
    r = runner.invoke(app, ["select", str(src), str(tmp_path / "local"), "--k", "2", "--method", "top",
                            "--chunk-rows", str(-(-df.height // 3))])
    assert r.exit_code == 0, r.output
    got = pl.read_parquet(tmp_path / "ray" / "*.parquet")
    assert_same_per_pool(got, local(pl.read_parquet(sorted(src.glob("*.parquet"))), 2, "top"))
    for engine in ("local", "ray"):
        r = runner.invoke(app, ["diagnose", str(src), "--engine", engine, "--n-boot", "50",
                                "--json", str(tmp_path / f"{engine}.json")])
        assert r.exit_code == 0, r.output
    import json

    a = json.loads((tmp_path / "local.json").read_text())
    b = json.loads((tmp_path / "ray.json").read_text())
    assert a.keys() == b.keys()
    for key in ("n_rows", "n_prompts", "k_best"):
        assert a[key] == b[key]
    for key in ("v_x", "v_y_given_x"):
        assert b[key] == pytest.approx(a[key], rel=1e-12)
    # bad input: the local one-line error, exit code 2
    r = runner.invoke(app, ["select", str(src), str(tmp_path / "x"), "--k", "2", "--method", "grades",
                            "--embedding", "emb", "--engine", "ray"])
    assert r.exit_code == 2 and "has no 'emb' column" in r.output and "mrt embed" in r.output
    r = runner.invoke(app, ["select", str(src), str(tmp_path / "x"), "--k", "2", "--ray-address", "auto"])
    assert r.exit_code == 2 and "--ray-address needs --engine ray" in r.output


def test_the_callers_dataset_context_is_left_alone():
    df = make_table(seed=30)
    ds = dataset(df, 2)
    ctx = ds.context
    before = (ctx.execution_options.preserve_order, ctx.raise_original_map_exception, ctx.shuffle_strategy)
    D.collect(D.select(ds, 2, "random", n_buckets=2))
    D.variance_budget(ds, n_boot=0)
    assert (ctx.execution_options.preserve_order, ctx.raise_original_map_exception, ctx.shuffle_strategy) == before


def test_hive_partitioned_input_gives_the_local_engines_parts(tmp_path):
    from mrt_fast.datasets.local import select_dataset as local_job

    df = make_table(n_pools=40, seed=31)
    df = df.with_columns(pl.Series("split", np.where(np.arange(df.height) % 3 == 0, "a", "b")))
    for v in ("a", "b"):
        d = tmp_path / "in" / f"split={v}"
        d.mkdir(parents=True)
        df.filter(pl.col("split") == v).drop("split").write_parquet(d / "x.parquet")
    local_job(tmp_path / "in", tmp_path / "local", 2, "random", parts=3)
    D.select_dataset(tmp_path / "in", tmp_path / "ray", 2, "random", parts=3)
    assert parts_bytes(tmp_path / "local") == parts_bytes(tmp_path / "ray")
    assert "split" in pl.read_parquet(tmp_path / "ray" / "part-00000.parquet").columns


def test_every_knob_of_select_runs_on_ray_and_the_directory_reads_as_it_stands(tmp_path):
    """SelectOptions is shared: eps, optimizer and candidate_key reach the Ray job, the kernel is the
    options' default (clip) unless given; polars reads its output."""
    from mrt_fast import SelectOptions
    from mrt_fast.selection.options import DEFAULT_KERNEL

    df = make_table(n_pools=30, seed=31).sample(fraction=1.0, shuffle=True, seed=2)
    src = write_files(df, tmp_path / "in", 3)
    opts = SelectOptions(k=2, method="grades", eps=0.25, optimizer="naive", candidate_key="response")
    want = mrt_fast.select(pl.concat([pl.read_parquet(f) for f in sorted((tmp_path / "in").glob("*.parquet"))]),
                           options=opts)
    rep = D.select_dataset(src, tmp_path / "ray", options=opts, parts=4)
    assert rep.n_parts == 4 and Manifest.read(tmp_path / "ray").parameters["eps"] == 0.25
    assert Manifest.read(tmp_path / "ray").parameters["kernel"] == DEFAULT_KERNEL == "clip"
    got = pl.scan_parquet(tmp_path / "ray").collect()
    assert got.sort(["prompt_id", "pick_rank"]).equals(want.sort(["prompt_id", "pick_rank"]))
    ds = ray.data.from_arrow(df.to_arrow())
    lazy = D.collect(D.select(ds, options=opts))
    assert lazy.sort(["prompt_id", "pick_rank"]).equals(mrt_fast.select(df, options=opts)
                                                        .sort(["prompt_id", "pick_rank"]))
    plain = D.collect(D.select(ds, 2, "grades", eps=0.25))
    assert plain.sort(["prompt_id", "pick_rank"]).equals(mrt_fast.select(df, 2, "grades", eps=0.25, kernel="clip")
                                                         .sort(["prompt_id", "pick_rank"]))


@pytest.mark.embed
def test_embed_on_ray_writes_the_local_engines_parts_and_resumes(tmp_path):
    """`embed_dataset(engine="ray")`: parts written by Ray workers (each loads the model once), the
    same rows as the local engine, a directory readable as it stands, resumed after a lost part."""
    from mrt_fast.datasets.job import part_path
    from mrt_fast.embeddings.dataset import embed_dataset

    df = pl.DataFrame({"prompt_id": np.repeat(np.arange(5), 3),
                       "response": [f"answer number {i} about topic {i % 4}" for i in range(15)]})
    (tmp_path / "in").mkdir()
    df.head(7).write_parquet(tmp_path / "in" / "a.parquet")
    df.tail(8).write_parquet(tmp_path / "in" / "b.parquet")
    local = embed_dataset(tmp_path / "in", tmp_path / "local.parquet", cache_dir=False, rows_per_part=4)
    rep = embed_dataset(tmp_path / "in", tmp_path / "ray", cache_dir=False, rows_per_part=4, engine="ray",
                        workers=2)
    assert rep.parts == 4 and rep.parts_done_now == 4 and local.rows == 15
    want = pl.read_parquet(tmp_path / "local.parquet")
    got = pl.read_parquet(tmp_path / "ray")
    assert got.select("prompt_id", "response").equals(want.select("prompt_id", "response"))
    np.testing.assert_allclose(np.array(got["embedding"].to_list()), np.array(want["embedding"].to_list()),
                               rtol=1e-5, atol=1e-6)
    part_path(tmp_path / "ray", 2).unlink()
    again = embed_dataset(tmp_path / "in", tmp_path / "ray", cache_dir=False, rows_per_part=4, engine="ray")
    assert again.resumed and again.parts_done_now == 1
    assert pl.read_parquet(tmp_path / "ray").select("response").equals(want.select("response"))
    f = embed_dataset(tmp_path / "in", tmp_path / "ray.parquet", cache_dir=False, rows_per_part=4, engine="ray")
    assert f.rows == 15 and pl.read_parquet(tmp_path / "ray.parquet").select("response").equals(
        want.select("response"))


def test_embed_flags_that_do_not_apply_to_ray_are_refused(tmp_path):
    from typer.testing import CliRunner

    from mrt_fast.cli import app

    pl.DataFrame({"response": ["a"]}).write_parquet(tmp_path / "in.parquet")
    r = CliRunner().invoke(app, ["embed", str(tmp_path / "in.parquet"), str(tmp_path / "o"), "--engine", "ray",
                                 "--processes", "2"])
    assert r.exit_code == 2 and "--processes applies to --engine local only" in r.output
    r = CliRunner().invoke(app, ["embed", str(tmp_path / "in.parquet"), str(tmp_path / "o"), "--workers", "2"])
    assert r.exit_code == 2 and "--workers applies to --engine ray only" in r.output
    assert not (tmp_path / "o").exists()


class _Shout:
    """A text stage factory with no model (picklable): the response in capitals."""

    def __call__(self):
        return lambda df: df.with_columns(pl.col("response").str.to_uppercase().alias("shout"))


def test_a_text_stage_on_ray_gives_the_local_parts_and_resumes(tmp_path):
    import sys

    from ray import cloudpickle

    from mrt_fast.datasets.job import StoppedForTest, stopping_after
    from mrt_fast.llm.dataset_stages import run_text_stage

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this test module
    df = make_table(n_pools=7, seed=3).select("prompt_id", pl.col("prompt_id").alias("prompt"), "response")
    src = write_files(df, tmp_path / "in", 2)
    kw = dict(name="shout", columns=("prompt", "response"), out_column="shout", parameters={},
              make_stage=_Shout(), rows_per_part=4)
    run_text_stage(src, tmp_path / "local", **kw)
    with stopping_after(2), pytest.raises(StoppedForTest):
        run_text_stage(src, tmp_path / "ray", engine="ray", workers=2, **kw)
    rep = run_text_stage(src, tmp_path / "ray", engine="ray", workers=2, **kw)
    assert rep.resumed and 0 < rep.parts_done_now < rep.parts and "job total: 13 parts" in str(rep)
    assert parts_bytes(tmp_path / "ray") == parts_bytes(tmp_path / "local")
    f = run_text_stage(src, tmp_path / "ray.parquet", engine="ray", **kw)
    assert f.rows_done_now == df.height and pl.read_parquet(tmp_path / "ray.parquet").equals(
        pl.read_parquet(tmp_path / "local"))
    with pytest.raises(MrtInputError, match="engine='ray' only"):
        run_text_stage(src, tmp_path / "x", workers=2, **kw)


@pytest.mark.train
def test_mrt_nll_and_score_on_ray_equal_the_local_engine(tmp_path):
    pytest.importorskip("transformers")
    from typer.testing import CliRunner

    from mrt_fast.cli import app
    from mrt_fast.llm.testing import save_tiny_models

    models = save_tiny_models(tmp_path / "m")
    df = make_table(n_pools=4, seed=4).select("prompt_id", pl.format("say {}", "prompt_id").alias("prompt"),
                                              "response")
    src = write_files(df, tmp_path / "in", 2)
    runner = CliRunner()
    for cmd, model, col in (("nll", models["lm"], "loss"), ("score", models["reward"], "reward")):
        base = [cmd, str(src), "--model", str(model), "--device", "cpu", "--rows-per-part", "5"]
        r = runner.invoke(app, [*base[:2], str(tmp_path / f"{cmd}-local.parquet"), *base[2:]])
        assert r.exit_code == 0, r.output
        r = runner.invoke(app, [*base[:2], str(tmp_path / f"{cmd}-ray"), *base[2:], "--engine", "ray",
                                "--workers", "2"])
        assert r.exit_code == 0, r.output
        a, b = pl.read_parquet(tmp_path / f"{cmd}-local.parquet"), pl.read_parquet(tmp_path / f"{cmd}-ray")
        assert a.drop(col).equals(b.drop(col))
        np.testing.assert_allclose(b[col].to_numpy(), a[col].to_numpy(), rtol=1e-5)
        r = runner.invoke(app, [*base[:2], str(tmp_path / "x"), *base[2:], "--workers", "2"])
        assert r.exit_code == 2 and "--workers applies to --engine ray only" in r.output
        r = runner.invoke(app, [*base[:2], str(tmp_path / "x"), *base[2:], "--ray-address", "auto"])
        assert r.exit_code == 2 and "--ray-address needs --engine ray" in r.output


def test_the_cli_on_ray_reads_like_the_local_engine(tmp_path):
    """`mrt select --engine ray` in its own process: Ray's information lines and progress bars go
    to Ray Data's log file, which the summary names; the summary has the local engine's fields,
    with the parts and the memory said as they are on Ray."""
    import os
    import subprocess
    import sys

    src = write_files(make_table(n_pools=30, seed=31), tmp_path / "in", 2)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MRT_PROGRESS_INTERVAL": "0.2"}
    r = subprocess.run([sys.executable, "-m", "mrt_fast.cli", "select", str(src), str(tmp_path / "out"), "--k", "2",
                        "--engine", "ray", "--parts", "3"], capture_output=True, text=True, env=env)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert not re.search(r"\bINFO\b|Running Dataset|execution finished", out), out
    m = re.search(r"Ray's logs: (\S+)", out)
    assert m, out
    assert os.path.isdir(m.group(1)) and os.listdir(m.group(1))  # the session's logs, where the summary says
    for field in ("pools", "candidates", "kept", "buckets", "rows/s", "peak memory", "seconds"):
        assert field in out
    assert "3 (exchanged through files)" in out and "limit 0.00" not in out


def test_a_ray_select_job_is_timed_as_one_step(tmp_path):
    from mrt_fast.datasets.select_job import select_dataset

    make_table().write_parquet(tmp_path / "in.parquet")
    rep = select_dataset(tmp_path / "in.parquet", tmp_path / "out", 2, "grades", engine="ray")
    assert list(rep.profile["steps"]) == ["plan", "run on Ray"] and rep.profile["pieces"] == {}
