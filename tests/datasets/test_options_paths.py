"""One `SelectOptions`, the same kept rows on every path: `select` with the options or
with keywords, `select_dataset` (local and Ray engines), the Ray Dataset `select` and
`mrt select`, on the flat and the grouped layout, for every field of the options set
to a value other than its default."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import mrt_fast
from mrt_fast import SmallPoolWarning
from mrt_fast.cli import app
from mrt_fast.datasets.local import select_dataset
from mrt_fast.selection.options import SelectOptions

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
#: columns holding one value per candidate (list columns in the grouped layout)
PER_CANDIDATE = ["response", "embedding", "reward", "cand", "strata"]
#: the fields of SelectOptions other than k and method, with their defaults
DEFAULTS = {f.name: f.default for f in dataclasses.fields(SelectOptions)}


def flat_table(sizes: list[int], seed: int) -> pl.DataFrame:
    """Pools of the given sizes: a few repeated embeddings, texts and rewards (ties on purpose),
    a candidate index, mode labels and a per-pool K."""
    rng = np.random.default_rng(seed)
    n = sum(sizes)
    pid = np.repeat(np.arange(len(sizes)), sizes)
    x = rng.standard_normal((n, 4)).astype(np.float32)
    twin = rng.random(n) < 0.2  # a repeat of the row before it, or a slight rewording of it
    for i in np.flatnonzero(twin[1:]) + 1:
        if pid[i] == pid[i - 1]:
            x[i] = x[i - 1] + np.float32(0.01 * (rng.random() < 0.5)) * rng.standard_normal(4).astype(np.float32)
    cand = np.concatenate([rng.permutation(s) for s in sizes])
    return pl.DataFrame({
        "prompt_id": [f"p{i}" for i in pid],
        "response": [f"r{int(v)}" for v in rng.integers(0, max(2, n // 2), n)],
        "embedding": x,
        "reward": rng.integers(0, 3, n).astype(np.float64),
        "cand": cand.astype(np.int64),
        "strata": rng.integers(0, 3, n).astype(np.int64),
        "kcol": (1 + pid % 3).astype(np.int64),
    }).with_columns(pl.col("embedding").cast(pl.List(pl.Float32)))


def grouped_of(flat: pl.DataFrame, meta: bool = False) -> pl.DataFrame:
    lists = [c for c in PER_CANDIDATE if c in flat.columns]
    g = flat.group_by(flat.columns[0], maintain_order=True).agg(
        [pl.col(c).first() for c in flat.columns[1:] if c not in lists] + [pl.col(c) for c in lists])
    if meta:  # a list column of the prompt, not one value per candidate
        g = g.with_columns(pl.Series("meta", [[1, 2]] * g.height, dtype=pl.List(pl.Int64)))
    return g


#: field -> (method, options other than the defaults, columns renamed in the table)
CASES = {
    "k": ("grades", {"k": "kcol"}, {}),
    "method": (None, {}, {}),  # drawn: random, top, diverse, stratified
    "by": ("grades", {"by": "qid"}, {"prompt_id": "qid"}),
    "embedding": ("diverse", {"embedding": "vec"}, {"embedding": "vec"}),
    "reward": ("grades", {"reward": "score"}, {"reward": "score"}),
    "mode": ("stratified", {"mode": "strata"}, {}),
    "alpha": ("grades", {"alpha": 0.3}, {}),
    "eps": ("grades", {"eps": 0.5}, {}),
    "k_max": ("grades", {"k_max": 3}, {}),
    "kernel": ("grades", {"kernel": "shift"}, {}),
    "seed": ("random", {"seed": 11}, {}),
    "candidate_key": ("grades", {"candidate_key": "cand"}, {}),
    "optimizer": ("grades", {"optimizer": "naive"}, {}),
    "n_modes": ("stratified", {"n_modes": 2}, {}),
    "max_mode_cosine": ("stratified", {"max_mode_cosine": 0.2}, {}),
    "layout": ("grades", {"layout": None}, {}),  # the table's own layout, named
    "candidate_columns": ("grades", {"candidate_columns": PER_CANDIDATE}, {}),
    "text": ("diverse", {"text": "response"}, {}),
    "dedup": ("grades", {"dedup": 0.99}, {}),
}


def test_every_field_has_a_case():
    assert set(CASES) == set(DEFAULTS)


def options_and_table(field: str, layout: str, sizes: list[int], seed: int, method: str | None):
    """The options of a case and its table in ``layout`` (stratified selection finds the
    modes unless the case names the mode column)."""
    m, changes, renamed = CASES[field]
    changes = dict(changes)
    if field == "layout":
        changes["layout"] = layout
    opts = SelectOptions(**{"k": 2, "method": m or method, **changes})
    flat = flat_table(sizes, seed)
    if opts.method == "stratified" and opts.mode != "strata":
        flat = flat.drop("strata")
    if layout == "flat":
        return opts.replace(candidate_columns=None), flat.rename(renamed)
    return opts, grouped_of(flat, meta=field == "candidate_columns").rename(renamed)


def quiet_select(table, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SmallPoolWarning)
        return mrt_fast.select(table, **kw)


def keywords(opts: SelectOptions) -> dict:
    """The options as keywords of `mrt_fast.select` (those not at their default)."""
    return {f: v for f, v in dataclasses.asdict(opts).items() if f in ("k", "method") or v != DEFAULTS[f]}


def cli_args(opts: SelectOptions) -> list[str]:
    """The options as `mrt select` flags."""
    args = ["--k", str(opts.k), "--method", opts.method]
    for f, v in keywords(opts).items():
        if f in ("k", "method"):
            continue
        flag = "--" + f.replace("_", "-")
        args += [flag, ",".join(v) if f == "candidate_columns" else str(v)]
    return args


def same_rows(got: pl.DataFrame, ref: pl.DataFrame, by: str, what: str) -> None:
    assert sorted(got.columns) == sorted(ref.columns), what
    keys = [by, "pick_rank"] if ref.schema["pick_rank"] == pl.Int32 else [by]
    a, b = got.select(ref.columns).sort(keys), ref.sort(keys)
    assert a.equals(b), (what, a, b)


def run_local_paths(tmp, opts: SelectOptions, table: pl.DataFrame) -> pl.DataFrame:
    """The kept rows of `select` with the options, checked equal to those of every other local path."""
    ref = quiet_select(table, options=opts)
    same_rows(quiet_select(table, **keywords(opts)), ref, opts.by, "select with keywords")
    src = tmp / "in"
    src.mkdir()
    cut = table.height // 2
    table.head(cut).write_parquet(src / "0.parquet")
    table.slice(cut).write_parquet(src / "1.parquet")
    select_dataset(src, tmp / "local.parquet", options=opts, parts=2)
    same_rows(pl.read_parquet(tmp / "local.parquet"), ref, opts.by, "select_dataset")
    r = CliRunner().invoke(app, ["select", str(src), str(tmp / "cli.parquet"), "--parts", "1", *cli_args(opts)])
    assert r.exit_code == 0, r.output
    same_rows(pl.read_parquet(tmp / "cli.parquet"), ref, opts.by, "mrt select")
    return ref


@pytest.mark.parametrize("layout", ["flat", "grouped"])
@pytest.mark.parametrize("field", sorted(CASES))
@settings(max_examples=2, **SETTINGS)
@given(sizes=st.lists(st.integers(1, 7), min_size=2, max_size=5), seed=st.integers(0, 10_000),
       method=st.sampled_from(["random", "top", "diverse", "stratified"]))
def test_every_path_keeps_the_rows_of_select(tmp_path_factory, field, layout, sizes, seed, method):
    if field == "candidate_columns" and layout == "flat":
        pytest.skip("candidate_columns names the grouped layout's lists")
    opts, table = options_and_table(field, layout, sizes, seed, method)
    run_local_paths(tmp_path_factory.mktemp("paths"), opts, table)


def test_select_with_options_finds_the_number_of_modes_asked_for():
    """`select(table, options=...)` and `select_dataset` with the same options find the same modes."""
    flat = flat_table([12, 12, 12], 4).drop("strata")
    opts = SelectOptions(k=4, method="stratified", n_modes=2)
    kept = quiet_select(flat, options=opts)
    assert kept.group_by("prompt_id").agg(pl.col("mode").n_unique())["mode"].to_list() == [2, 2, 2]
    assert kept.equals(quiet_select(flat, k=4, method="stratified", n_modes=2))


# --------------------------------------------------------------------------- Ray

#: options with several fields off their default at once (every field in one case or another), so that
#: the Ray engine runs a few jobs only
RAY_CASES = [
    ("grades", dict(k="kcol", by="qid", embedding="vec", reward="score", alpha=0.3, eps=0.5, k_max=3,
                    kernel="shift", candidate_key="cand", optimizer="naive", text="response", dedup=0.99)),
    ("stratified", dict(max_mode_cosine=0.2, seed=5, layout="grouped", candidate_columns=PER_CANDIDATE[:-1])),
    ("stratified", dict(mode="found", n_modes=2, seed=3, layout="flat")),
    ("stratified", dict(mode="strata", seed=3)),
]


@pytest.mark.ray
@pytest.mark.parametrize("case", range(len(RAY_CASES)))
@settings(max_examples=1, phases=[Phase.explicit, Phase.generate], **SETTINGS)  # a Ray job per example
@given(sizes=st.lists(st.integers(1, 7), min_size=2, max_size=5), seed=st.integers(0, 10_000))
def test_the_ray_engine_keeps_the_rows_of_select(tmp_path_factory, local_ray, case, sizes, seed):
    from mrt_fast.datasets import ray_engine as D

    method, changes = RAY_CASES[case]
    changes = dict(changes)
    opts = SelectOptions(k=changes.pop("k", 2), method=method, **changes)
    flat = flat_table(sizes, seed)
    if opts.method == "stratified" and opts.mode != "strata":
        flat = flat.drop("strata")
    table = (flat if opts.layout != "grouped" else grouped_of(flat, meta=True)).rename(
        {"prompt_id": "qid", "embedding": "vec", "reward": "score"} if "by" in changes else {})
    tmp = tmp_path_factory.mktemp("ray")
    ref = run_local_paths(tmp, opts, table)
    D.select_dataset(tmp / "in", tmp / "ray.parquet", options=opts, parts=2)
    same_rows(pl.read_parquet(tmp / "ray.parquet"), ref, opts.by, "Ray select_dataset")
    got = D.collect(D.select(local_ray.data.from_arrow(table.to_arrow(), override_num_blocks=2), options=opts))
    same_rows(got, ref, opts.by, "Ray Dataset select")


def test_the_keywords_of_select_are_the_options_with_their_defaults():
    import inspect

    from mrt_fast import MrtInputError

    params = inspect.signature(mrt_fast.select).parameters
    assert set(params) - {"table", "return_report", "options"} == set(DEFAULTS)
    assert {n: params[n].default for n in DEFAULTS if n != "k"} == {n: d for n, d in DEFAULTS.items() if n != "k"}
    flat = flat_table([3, 4], 0)
    with pytest.raises(MrtInputError, match="not both.*n_modes"):
        mrt_fast.select(flat, options=SelectOptions(k=2, method="stratified"), n_modes=3)
