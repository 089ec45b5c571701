"""What a tier costs the selectors: the comparison, the pool sample, the API and the CLI."""

import json

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from mrt_fast import MrtInputError
from mrt_fast.cli import app
from mrt_fast.embeddings.quality import METHODS, compare_embeddings, markdown, quality_rows, sample_pools, summarize

runner = CliRunner()


def _unit(x):
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _pools(sizes, dim=8, seed=0):
    """A table of pools (ids p0, p1, ...) with rewards, and unit embeddings, row for row."""
    rng = np.random.default_rng(seed)
    ids = [f"p{i}" for i, n in enumerate(sizes) for _ in range(n)]
    df = pl.DataFrame({"prompt_id": ids, "reward": rng.normal(size=len(ids))})
    return df, _unit(rng.normal(size=(len(ids), dim)))


sizes_st = st.lists(st.integers(3, 9), min_size=2, max_size=6)


@settings(max_examples=25, deadline=None)
@given(sizes=sizes_st, seed=st.integers(0, 10**6), k=st.integers(1, 4))
def test_a_tier_equal_to_the_reference_costs_nothing(sizes, seed, k):
    df, x = _pools(sizes, seed=seed)
    rows = quality_rows("t", df, x, x.copy(), ks=[k])
    assert [r["selector"] for r in rows] == list(METHODS)
    for r in rows:
        assert r["coverage_gap"] == 0 and r["coverage_gap_ci95"] == [0.0, 0.0] and r["same_picks"]
        assert r["same_ranking"] and r["separated_pairs_reversed"] == []
    v = summarize(rows)
    assert v["within_tolerance_everywhere"] and v["worst_coverage_gap"] == 0 and v["separated_pairs_reversed"] == 0


@settings(max_examples=25, deadline=None)
@given(sizes=sizes_st, seed=st.integers(0, 10**6))
def test_at_k1_no_tier_beats_the_reference_at_diverse(sizes, seed):
    # coverage is the facility-location objective diverse maximises, and one greedy pick is the optimum
    df, x = _pools(sizes, seed=seed)
    _, y = _pools(sizes, seed=seed + 1)
    r = next(r for r in quality_rows("t", df, x, y, ks=[1]) if r["selector"] == "diverse")
    assert r["coverage_gap"] <= 1e-6


def test_a_tier_blind_to_the_clusters_loses_coverage():
    # each pool: two tight clusters; the reference picks one of each at K = 2, a random tier often does not
    rng = np.random.default_rng(0)
    ids, xs = [], []
    for p in range(40):
        a, b = _unit(rng.normal(size=(2, 16)))
        for c in (a, b):
            for _ in range(4):
                ids.append(p)
                xs.append(c + 0.05 * rng.normal(size=16))
    df = pl.DataFrame({"prompt_id": ids, "reward": rng.normal(size=len(ids))})
    x = _unit(np.array(xs))
    rows = quality_rows("clusters", df, x, _unit(rng.normal(size=x.shape)), ks=[2], tier="noise")
    d = next(r for r in rows if r["selector"] == "diverse")
    assert d["coverage_gap"] < -0.05 and d["coverage_gap_ci95"][1] < 0 and not d["same_picks"]
    for r in rows:
        if r["selector"] in ("random", "top"):  # they do not look at the embedding
            assert r["coverage_gap"] == 0 and r["same_picks"]
    assert summarize(rows, 0.02)["within_tolerance_everywhere"] is False
    md = markdown(rows)
    assert md.count("\n") == 2 + len(rows) and "coverage, noise picks" in md


@settings(max_examples=20, deadline=None)
@given(sizes=sizes_st, seed=st.integers(0, 10**6), perm_seed=st.integers(0, 10**6))
def test_the_order_of_the_pools_does_not_matter(sizes, seed, perm_seed):
    df, x = _pools(sizes, seed=seed)
    _, y = _pools(sizes, seed=seed + 7)
    want = quality_rows("t", df, x, y, ks=[2, 3])
    # move whole pools around, each pool's rows keeping their order
    starts = np.cumsum([0, *sizes])
    order = np.random.default_rng(perm_seed).permutation(len(sizes))
    rows = np.concatenate([np.arange(starts[i], starts[i + 1]) for i in order])
    assert quality_rows("t", df[rows], x[rows], y[rows], ks=[2, 3]) == want


def test_without_a_reward_only_the_selectors_that_need_none():
    df, x = _pools([5, 6, 7])
    rows = quality_rows("t", df.drop("reward"), x, x[::-1].copy(), ks=[2])
    assert [r["selector"] for r in rows] == ["random", "diverse", "stratified"]
    with pytest.raises(MrtInputError, match="3 reference and 18 tier"):
        quality_rows("t", df, x[:3], x, ks=[2])


def test_summarize_counts_each_cells_pairs_once():
    rows = []
    for ds in ("a", "b"):
        for m, gap in zip(METHODS, (0.0, 0.0, -0.03, -0.01, 0.0)):
            rows.append({"dataset": ds, "k": 2, "selector": m, "coverage_gap": gap, "same_ranking": ds == "a",
                         "pairs_separated_by_reference": ["diverse > top", "diverse > random"],
                         "separated_pairs_reversed": ["diverse > top"] if ds == "b" else []})
    v = summarize(rows, 0.02)
    assert v["separated_pairs"] == 4 and v["separated_pairs_reversed"] == 1
    assert v["worst_gap_by_selector"]["diverse"] == -0.03 and not v["within_tolerance_everywhere"]
    assert summarize(rows, 0.05)["within_tolerance_everywhere"] and not v["same_ranking_everywhere"]
    with pytest.raises(MrtInputError, match="no quality rows"):
        summarize([])


# ------------------------------------------------------------------ the pool sample


def _table(n_pools, seed):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 6, n_pools)
    ids = np.repeat(np.arange(n_pools) * 7919 % 100_003, sizes)
    return pl.DataFrame({"prompt_id": ids, "response": [f"t{i}" for i in range(len(ids))],
                         "reward": rng.normal(size=len(ids))})


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n_pools=st.integers(2, 40), pools=st.integers(2, 50), seed=st.integers(0, 10**6), parts=st.integers(1, 4))
def test_the_sample_is_whole_pools_chosen_by_id_alone(tmp_path_factory, n_pools, pools, seed, parts):
    df = _table(n_pools, seed)
    got = sample_pools(df, pools=pools, seed=seed % 3, columns=["response", "reward"])
    assert got.columns == ["prompt_id", "response", "reward"]
    assert got["prompt_id"].n_unique() == min(pools, n_pools)
    for pid, g in got.group_by("prompt_id"):
        # every row of a chosen pool, in input order
        assert g["response"].to_list() == df.filter(pl.col("prompt_id") == pid[0])["response"].to_list()
    # the same pools from the rows shuffled and cut into files
    shuffled = df.sample(fraction=1.0, shuffle=True, seed=seed)
    d = tmp_path_factory.mktemp("ds")
    cuts = np.linspace(0, df.height, parts + 1).astype(int)
    for i in range(parts):
        shuffled[cuts[i]:cuts[i + 1]].write_parquet(d / f"part-{i}.parquet")
    again = sample_pools(str(d), pools=pools, seed=seed % 3, columns=["response"])
    assert set(again["prompt_id"]) == set(got["prompt_id"])
    assert sorted(again["response"]) == sorted(got["response"])


def test_sample_errors(tmp_path):
    df = _table(5, 0)
    with pytest.raises(MrtInputError, match="column 'text' is not in the table"):
        sample_pools(df, columns=["text"])
    with pytest.raises(MrtInputError, match="pools must be an integer >= 2"):
        sample_pools(df, pools=1)
    with pytest.raises(MrtInputError, match="1 pool"):
        sample_pools(df.filter(pl.col("prompt_id") == df["prompt_id"][0]))
    with pytest.raises(MrtInputError, match="null prompt ids"):
        sample_pools(df.with_columns(pl.when(pl.col("reward") > 0).then(pl.col("prompt_id")).alias("prompt_id")),
                     pools=100)
    with pytest.raises(MrtInputError, match="no_such"):
        sample_pools(str(tmp_path / "no_such.parquet"))


# ------------------------------------------------------------------ with models


@pytest.fixture(scope="module")
def tiny_static(tiny_source, tmp_path_factory):
    """The tiny source's static tier, built into a cache directory of its own."""
    from mrt_fast.embeddings.static import load_static

    d = tmp_path_factory.mktemp("eq_cache")
    load_static(f"static:{tiny_source}", d, progress=False)
    return f"static:{tiny_source}", d


@pytest.mark.embed
def test_compare_embeddings_is_quality_rows_on_the_sample(tiny_static):
    from mrt_fast.cli.demo import load_examples
    from mrt_fast.embeddings.embed import embed_texts

    name, cache = tiny_static
    df = load_examples()
    got = compare_embeddings(df, name, text="response", ks=(1, 2), pools=6, seed=1, cache_dir=cache, progress=False)
    sample = sample_pools(df, pools=6, seed=1, columns=["response", "reward"])
    texts = sample["response"].to_list()
    want = quality_rows("sample", sample, embed_texts(texts, None, cache_dir=cache, progress=False),
                        embed_texts(texts, name, cache_dir=cache, progress=False), (1, 2), tier=name)
    assert got.drop("model_id", "reference_id").to_dicts() == want
    assert got.height == 10 and got["pools"][0] == 6
    assert got["model_id"][0].startswith("static:") and "all-MiniLM-L6-v2" in got["reference_id"][0]
    # no reward column: the selectors that need one are left out
    no_reward = compare_embeddings(df.drop("reward"), name, ks=(2,), pools=6, cache_dir=cache, progress=False)
    assert no_reward["selector"].to_list() == ["random", "diverse", "stratified"]


@pytest.mark.embed
def test_compare_embeddings_errors(tiny_static):
    name, cache = tiny_static
    df = pl.DataFrame({"prompt_id": [0, 0, 1, 1], "response": ["a b", "c d", "e f", "g h"], "reward": ["x"] * 4})
    with pytest.raises(MrtInputError, match="both 'static'"):
        compare_embeddings(df, "static", "static")
    with pytest.raises(MrtInputError, match="ks must be integers"):
        compare_embeddings(df, name, ks=(0,))
    with pytest.raises(MrtInputError, match="reward column 'reward' must be numeric"):
        compare_embeddings(df, name, cache_dir=cache)
    with pytest.raises(MrtInputError, match="must hold strings"):
        compare_embeddings(df.with_columns(pl.col("prompt_id").alias("response")), name, reward=None, cache_dir=cache)
    with pytest.raises(MrtInputError, match="empty"):
        compare_embeddings(df.with_columns(pl.lit(" ").alias("response")), name, reward=None, cache_dir=cache,
                           progress=False)


@pytest.mark.embed
def test_cli_embed_quality(tiny_static, tmp_path):
    from mrt_fast.cli.demo import load_examples

    name, cache = tiny_static
    src = tmp_path / "pools.parquet"
    load_examples().write_parquet(src)
    out = tmp_path / "q.json"
    r = runner.invoke(app, ["embed-quality", str(src), "--model", name, "--pools", "5", "--k", "1,2",
                            "--cache-dir", str(cache), "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "worst gap" in r.output and "pairs that MiniLM separates" in r.output
    doc = json.loads(out.read_text())
    assert len(doc["rows"]) == 10 and set(doc["verdict"]) >= {"worst_coverage_gap", "within_tolerance_everywhere"}
    assert doc["verdict"]["worst_coverage_gap"] == min(r["coverage_gap"] for r in doc["rows"])
    for args, msg in ((["--k", "two"], "--k must be integers"), (["--tolerance", "2"], "--tolerance"),
                      (["--text", "nope"], "column 'nope' (--text) not found"),
                      (["--json", str(out / "no" / "q.json")], "is not a directory")):
        r = runner.invoke(app, ["embed-quality", str(src), "--model", name, "--cache-dir", str(cache), *args])
        assert r.exit_code == 2 and msg in r.output, (args, r.output)


@pytest.mark.embed
def test_grouped_pools_give_what_their_flat_rows_give(tiny_static, tmp_path):
    """vLLM's layout (a row a prompt, `responses` and `reward` lists) is read as its flat rows, and the
    command line finds the `responses` column by itself."""
    from mrt_fast.cli.demo import load_examples

    name, cache = tiny_static
    flat = load_examples().select("prompt_id", "response", "reward")
    grouped = flat.group_by("prompt_id", maintain_order=True).agg(pl.col("response").alias("responses"),
                                                                  pl.col("reward"))
    kw = dict(ks=(1, 2), pools=6, seed=1, cache_dir=cache, progress=False)
    want = compare_embeddings(flat, name, **kw)
    assert compare_embeddings(grouped, name, text="responses", **kw).equals(want)
    grouped.write_parquet(tmp_path / "g.parquet")
    out = tmp_path / "q.json"
    r = runner.invoke(app, ["embed-quality", str(tmp_path / "g.parquet"), "--model", name, "--pools", "6", "--seed",
                            "1", "--k", "1,2", "--cache-dir", str(cache), "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "reading the responses from column 'responses'" in r.output
    assert json.loads(out.read_text())["rows"] == json.loads(json.dumps(want.to_dicts()))
