"""The job around every stage: outputs are inputs, one options object, one variance_budget,
flags refused per engine, test hooks outside the public signatures."""

from __future__ import annotations

import inspect
import json

import numpy as np
import polars as pl
import pyarrow.dataset as pads
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import mrt_fast
from mrt_fast import MrtInputError, SelectOptions
from mrt_fast.cli import app
from mrt_fast.datasets import Manifest, select_dataset, variance_budget
from mrt_fast.datasets.manifest import MANIFEST, OLD_MANIFEST

runner = CliRunner()


def table(n_pools: int, seed: int, d: int = 4) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 7, n_pools)
    n = int(sizes.sum())
    emb = rng.normal(size=(n, d)).astype(np.float32)
    return pl.DataFrame({
        "prompt_id": np.repeat(np.arange(n_pools), sizes),
        "response": [f"r{i}" for i in range(n)],
        "reward": rng.normal(size=n),
        "loss": rng.gamma(2.0, 1.0, n),
        "prompt": [f"p{i}" for i in np.repeat(np.arange(n_pools), sizes)],
    }).with_columns(pl.Series("embedding", emb, dtype=pl.List(pl.Float32)))


def finished_dir(tmp_path, parts: int = 4, n_pools: int = 30):
    df = table(n_pools, 1)
    (tmp_path / "in").mkdir()
    df.write_parquet(tmp_path / "in" / "a.parquet")
    out = tmp_path / "kept"
    select_dataset(tmp_path / "in", out, 2, "grades", parts=parts)
    return df, out


def test_a_finished_directory_reads_as_it_stands_everywhere(tmp_path):
    df, out = finished_dir(tmp_path, parts=9, n_pools=5)  # most parts get no pool: no file for them
    m = Manifest.read(out)
    assert m.done and m.n_parts == 9
    want = mrt_fast.select(df, 2, "grades").sort(["prompt_id", "pick_rank"])
    got = pl.scan_parquet(out).collect().sort(["prompt_id", "pick_rank"])
    assert got.equals(want)
    assert pl.read_parquet(out).height == want.height
    assert pads.dataset(out, format="parquet").to_table().num_rows == want.height
    datasets = pytest.importorskip("datasets")
    hf = datasets.load_dataset("parquet", data_dir=str(out), split="train")
    assert hf.num_rows == want.height
    # the metadata stays out of the way: one hidden folder, the manifest a zero-row Parquet file
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith("part-")) == [".mrt"]
    assert pl.read_parquet(out / MANIFEST).height == 0


def test_every_command_reads_what_another_wrote(tmp_path):
    df, out = finished_dir(tmp_path)
    kept = pl.scan_parquet(out).collect()
    # a dataset directory and a glob of its parts are inputs of diagnose, export and select
    for src in (out, out / "part-*.parquet"):
        r = runner.invoke(app, ["diagnose", str(src), "--n-boot", "0"])
        assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["export", str(out), str(tmp_path / "sft.jsonl")])
    assert r.exit_code == 0, r.output
    assert pl.read_ndjson(tmp_path / "sft.jsonl").height == kept.height
    again = kept.drop("pick_rank", "gain")
    again.write_parquet(tmp_path / "plain.parquet")
    r = runner.invoke(app, ["select", str(out), str(tmp_path / "no"), "--k", "1"])
    assert r.exit_code == 2 and "pick_rank" in r.stderr  # read fine; a kept set is not selected twice unasked
    r = runner.invoke(app, ["select", str(tmp_path / "plain.parquet"), str(tmp_path / "again"), "--k", "1",
                            "--method", "top"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["select", str(tmp_path / "again"), str(tmp_path / "one.parquet"), "--k", "1",
                            "--method", "random", "--overwrite"])
    assert r.exit_code == 2 and "pick_rank" in r.stderr


def test_a_directory_of_the_earlier_format_resumes_and_is_rewritten(tmp_path):
    df, out = finished_dir(tmp_path)
    d = json.loads(Manifest.read(out).to_json())
    d["done"] = False
    del d["parts"]["part-00001.parquet"]
    (out / "part-00001.parquet").unlink()
    (out / MANIFEST).unlink()
    (out / OLD_MANIFEST).write_text(json.dumps(d))
    rep = select_dataset(tmp_path / "in", out, 2, "grades")
    assert rep.resumed and rep.parts_done_now == 1
    assert not (out / OLD_MANIFEST).exists() and Manifest.read(out).done
    assert pl.scan_parquet(out).collect().height == rep.n_kept


def test_select_options_hold_every_knob_of_select():
    knobs = set(inspect.signature(mrt_fast.select).parameters) - {"table", "return_report", "options"}
    assert knobs <= set(SelectOptions.__dataclass_fields__)
    o = SelectOptions(k=3, method="dbkon", eps=1e-3, candidate_key="response", optimizer="naive")
    assert o.method == "grades" and o.layout == "auto"
    assert SelectOptions(k=3, layout="rows").layout == "flat"
    for bad, msg in (({"k": 0}, "k must be"), ({"k": 2, "method": "best"}, "method must be"),
                     ({"k": 2, "eps": 0}, "eps must be"), ({"k": 2, "optimizer": "fast"}, "optimizer"),
                     ({"k": 2, "k_max": 1}, "k_max must be >= k"), ({"k": 2, "layout": "wide"}, "layout")):
        with pytest.raises(MrtInputError, match=msg):
            SelectOptions(**bad)
    with pytest.raises(MrtInputError, match="unknown selection option"):
        SelectOptions.of(2, "top", epsilon=1.0)
    with pytest.raises(MrtInputError, match="not both"):
        SelectOptions.of(2, None, SelectOptions(k=2))


@pytest.mark.filterwarnings("ignore::mrt_fast.SmallPoolWarning")
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n_pools=st.integers(1, 25), seed=st.integers(0, 99), parts=st.integers(1, 5),
       method=st.sampled_from(["random", "top", "diverse", "grades"]), optimizer=st.sampled_from(["lazy", "naive"]),
       eps=st.sampled_from([1e-6, 0.5]), key=st.booleans())
def test_the_dataset_job_equals_select_with_every_knob(tmp_path_factory, n_pools, seed, parts, method, optimizer,
                                                      eps, key):
    tmp = tmp_path_factory.mktemp("knobs")
    df = table(n_pools, seed)
    df.sample(fraction=1.0, shuffle=True, seed=seed).write_parquet(tmp / "in.parquet")
    opts = SelectOptions(k=2, method=method, eps=eps, optimizer=optimizer, seed=seed,
                         candidate_key="response" if key else None)
    want = mrt_fast.select(pl.read_parquet(tmp / "in.parquet"), options=opts)
    select_dataset(tmp / "in.parquet", tmp / "o.parquet", options=opts, parts=parts)
    assert pl.read_parquet(tmp / "o.parquet").equals(want)
    select_dataset(tmp / "in.parquet", tmp / "o", options=opts, parts=parts)
    got = pl.scan_parquet(tmp / "o").collect()
    assert got.sort(["prompt_id", "pick_rank"]).equals(want.sort(["prompt_id", "pick_rank"]))


def test_one_variance_budget_for_a_table_and_a_path(tmp_path):
    df = table(40, 3)
    df.write_parquet(tmp_path / "l.parquet")
    a = mrt_fast.variance_budget(df, n_boot=0)
    b = mrt_fast.variance_budget(tmp_path / "l.parquet", n_boot=0)
    c = variance_budget(str(tmp_path / "*.parquet"), n_boot=0)
    assert a.v_x == pytest.approx(b.v_x, rel=1e-12) and b.v_x == c.v_x
    assert a.k_star == pytest.approx(b.k_star, rel=1e-9)
    with pytest.raises(MrtInputError, match="applies to a path"):
        mrt_fast.variance_budget(df, engine="ray")
    with pytest.raises(MrtInputError, match="address needs"):
        mrt_fast.variance_budget(tmp_path / "l.parquet", address="auto")
    assert "variance_budget_dataset" not in dir(mrt_fast.datasets)


def test_flags_that_do_not_apply_to_the_engine_are_refused_in_one_line(tmp_path):
    pytest.importorskip("ray")
    table(5, 1).write_parquet(tmp_path / "in.parquet")
    base = ["select", str(tmp_path / "in.parquet"), str(tmp_path / "o"), "--k", "2"]
    for extra, needle in ((["--engine", "ray", "--memory-limit", "1GB"], "--memory-limit applies to --engine local"),
                          (["--engine", "ray", "--workers", "2"], "--workers applies to --engine local"),
                          (["--parts", "2", "--chunk-rows", "10"], "not both"),
                          (["--ray-address", "auto"], "--ray-address needs --engine ray")):
        r = runner.invoke(app, base + extra)
        assert r.exit_code == 2, (extra, r.output)
        err = r.stderr.strip()
        assert err.startswith("error: ") and "\n" not in err and needle in err, err
    assert not (tmp_path / "o").exists()


def test_test_hooks_are_not_in_the_public_signatures():
    from mrt_fast.datasets import ray_engine
    from mrt_fast.embeddings.dataset import embed_dataset

    for f in (select_dataset, embed_dataset, ray_engine.select_dataset, ray_engine.select):
        hooks = [p for p in inspect.signature(f).parameters if p.startswith("_") or p == "fault_once"]
        assert hooks == [], (f.__qualname__, hooks)


def test_parts_means_the_same_on_the_local_engine(tmp_path):
    df, out = finished_dir(tmp_path, parts=3)
    assert Manifest.read(out).n_parts == 3
    rep = select_dataset(tmp_path / "in", tmp_path / "rows", 2, "grades", rows_per_part=(df.height + 1) // 2)
    assert rep.n_parts == 2


@pytest.mark.parametrize("name", ["kept.json", "x.arrow", "out.v2"])
def test_an_unknown_output_suffix_is_refused_never_a_directory(tmp_path, name):
    from mrt_fast.datasets.local import select_dataset

    pl.DataFrame({"prompt_id": [1, 1, 2], "reward": [0.1, 0.2, 0.3]}).write_parquet(tmp_path / "in.parquet")
    with pytest.raises(MrtInputError, match="unsupported format"):
        select_dataset(tmp_path / "in.parquet", tmp_path / name, 1, "top")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.parquet"]
