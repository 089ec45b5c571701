"""Embeddings (offline MiniLM), cache, kNN graphs, demo."""

import json
import os

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from mrt_fast import MrtInputError
from mrt_fast.cli import app
from mrt_fast.datasets import Manifest

runner = CliRunner()


# ------------------------------------------------------------- kNN graph (faiss only)


def brute_graph(x, k, kernel="shift", symmetrize=True):
    xs = x / np.linalg.norm(x, axis=1, keepdims=True)
    c = xs.astype(np.float64) @ xs.T.astype(np.float64)
    n = len(x)
    s = np.zeros((n, n))
    for i in range(n):
        others = [j for j in np.argsort(-c[i], kind="stable") if j != i][:k]
        for j in others:
            s[i, j] = (1 + c[i, j]) / 2 if kernel == "shift" else max(0.0, c[i, j])
        s[i, i] = 1.0
    return np.maximum(s, s.T) if symmetrize else s


@pytest.mark.embed
@settings(max_examples=25, deadline=None)
@given(st.integers(2, 40), st.integers(1, 8), st.integers(2, 6), st.sampled_from(["shift", "clip"]),
       st.booleans(), st.integers(0, 10**6))
def test_knn_graph_equals_brute_force(n, k, d, kernel, sym, seed):
    from mrt_fast.selection.knn import knn_graph

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)).astype(np.float32)
    g = knn_graph(x, k, kernel=kernel, symmetrize=sym)
    want = brute_graph(x, min(k, n - 1), kernel, sym)
    np.testing.assert_allclose(g.dense(), want, atol=2e-6)
    assert np.all(np.diff(g.indptr) >= 1) and g.data.min() >= 0 and g.data.max() <= 1 + 1e-6
    if sym:
        np.testing.assert_allclose(g.dense(), g.dense().T)


@pytest.mark.embed
@pytest.mark.parametrize("index", ["ivf", "hnsw"])
def test_approximate_index_reports_recall(index):
    from mrt_fast.selection.knn import knn_graph

    rng = np.random.default_rng(1)
    x = rng.normal(size=(600, 16)).astype(np.float32)
    g = knn_graph(x, 5, index=index, recall_sample=200, nprobe=64 if index == "ivf" else 8)
    assert g.recall_sample == 200 and g.recall is not None and 0.9 <= g.recall <= 1.0
    low = knn_graph(x, 5, index="ivf", nlist=50, nprobe=1, recall_sample=200)
    assert low.recall < g.recall or g.recall == 1.0
    with pytest.raises(MrtInputError, match="index"):
        knn_graph(x, 5, index="annoy")


@pytest.mark.embed
def test_corpus_facility_location_matches_dense_on_full_graph():
    from mrt_fast import facility_location
    from mrt_fast.selection.knn import facility_location_corpus

    rng = np.random.default_rng(2)
    x = rng.normal(size=(40, 6)).astype(np.float32)
    # with every neighbour kept the graph is the full matrix: same picks as the dense core, kernel by kernel
    for kernel in ("clip", "shift"):
        res, g = facility_location_corpus(x, 4, n_neighbors=39, return_graph=True, kernel=kernel)
        dense = facility_location(x, 4, kernel=kernel)
        assert g.kernel == kernel
        assert res.indices.tolist() == dense.indices.tolist()
        assert res.objective == pytest.approx(dense.objective, rel=1e-5)
        assert 0 < res.ratio <= 1
    assert g.nnz == 40 * 40  # shift: no similarity is 0, no entry dropped


# ------------------------------------------------------------- embeddings (MiniLM, offline)


@pytest.mark.embed
def test_minilm_weights_hash():
    from mrt_fast.embeddings.tiers import MINILM_WEIGHTS_SHA256, minilm_path, sha256_file

    assert sha256_file(minilm_path() / "model.safetensors") == MINILM_WEIGHTS_SHA256


@pytest.mark.embed
def test_embed_cache_hit_and_miss(tmp_path):
    from mrt_fast.embeddings.embed import EmbeddingCache, embed_texts, resolve_model

    st1, st2 = {}, {}
    a = embed_texts(["a red apple", "quantum physics", "a red apple"], cache_dir=tmp_path, stats=st1, progress=False)
    assert (st1["hits"], st1["computed"]) == (0, 2)
    assert a.dtype == np.float32 and a.shape == (3, 384)
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1, atol=1e-5)
    assert np.array_equal(a[0], a[2])
    assert float(a[0] @ a[1]) < 0.5
    b = embed_texts(["quantum physics", "a green pear"], cache_dir=tmp_path, stats=st2, progress=False)
    assert (st2["hits"], st2["computed"]) == (1, 1)
    np.testing.assert_array_equal(b[0], a[1])
    c = EmbeddingCache(tmp_path)
    assert c.count(resolve_model(None)[0]) == 3
    c.close()
    # no cache: same vectors, nothing written
    d = embed_texts(["a red apple"], cache_dir=False, progress=False)
    np.testing.assert_allclose(d[0], a[0], atol=1e-5)


@pytest.mark.embed
def test_embed_cli_round_trip_and_errors(tmp_path):
    df = pl.DataFrame({"prompt_id": [1, 1, 2], "response": ["yes", "no", "maybe"], "reward": [1.0, 0.0, 0.5]})
    for suf in (".parquet", ".jsonl", ".csv"):
        inp, out = tmp_path / f"in{suf}", tmp_path / f"out{suf}"
        {".parquet": df.write_parquet, ".jsonl": df.write_ndjson, ".csv": df.write_csv}[suf](inp)
        r = runner.invoke(app, ["embed", str(inp), str(out), "--cache-dir", str(tmp_path / "c")])
        assert r.exit_code == 0, r.output
        got = pl.read_parquet(out) if suf == ".parquet" else (pl.read_ndjson(out) if suf == ".jsonl" else pl.read_csv(out))
        assert got["response"].to_list() == df["response"].to_list()
        emb = got["embedding"]
        if suf == ".csv":
            emb = pl.Series([json.loads(v) for v in emb])
        assert len(emb[0]) == 384
    # then select on the embedded csv (embedding stored as JSON text)
    r = runner.invoke(app, ["select", str(tmp_path / "out.csv"), str(tmp_path / "sel.csv"), "--k", "1"])
    assert r.exit_code == 0, r.output
    assert pl.read_csv(tmp_path / "sel.csv").height == 2
    # errors: empty text, missing text, wrong column, model not available offline
    cases = {
        "empty": pl.DataFrame({"response": ["ok", "  "]}),
        "null": pl.DataFrame({"response": ["ok", None]}),
        "schema": pl.DataFrame({"text": ["ok"]}),
        "notext": pl.DataFrame({"response": [1, 2]}),
    }
    for name, bad in cases.items():
        inp, out = tmp_path / f"{name}.parquet", tmp_path / f"{name}_out.parquet"
        bad.write_parquet(inp)
        r = runner.invoke(app, ["embed", str(inp), str(out), "--no-cache"])
        assert r.exit_code == 2, (name, r.output)
        assert r.stderr.strip().count("\n") == 0 and r.stderr.startswith("error:"), r.stderr
        assert not out.exists()
    inp = tmp_path / "in.parquet"
    r = runner.invoke(app, ["embed", str(inp), str(tmp_path / "m.parquet"), "--model", "no-such-org/no-such-model"])
    assert r.exit_code == 2 and "offline" in r.stderr and r.stderr.strip().count("\n") == 0
    assert not (tmp_path / "m.parquet").exists()
    assert not [p for p in os.listdir(tmp_path) if ".tmp" in p]


@pytest.mark.embed
def test_embed_table_api(tmp_path):
    from mrt_fast.embeddings.embed import embed

    df = pl.DataFrame({"response": ["one", "two"], "x": [1, 2]})
    out = embed(df, cache_dir=tmp_path, progress=False)
    assert out.schema["embedding"] == pl.Array(pl.Float32, 384) and out["x"].to_list() == [1, 2]
    with pytest.raises(MrtInputError, match=r"\(empty\) at row 1"):
        embed(pl.DataFrame({"response": ["one", ""]}), cache_dir=False)
    with pytest.raises(MrtInputError, match="not found"):
        embed(df, text="prompt", cache_dir=False)


# ------------------------------------------------------------- bundled data and demo


def test_bundled_examples():
    from mrt_fast.cli.demo import load_examples

    df = load_examples()
    assert df.height == 32 and df["prompt_id"].n_unique() == 8
    assert sorted(df["domain"].unique()) == ["advisory", "code", "creative", "reasoning"]
    assert df.group_by("prompt_id").len()["len"].to_list() == [4] * 8
    assert set(df["axis"]) == {"prompt", "response"}
    text = " ".join(df["response"].to_list() + df["prompt"].to_list() + df["theme"].to_list())
    for leftover in ("\\", "$O", "``", "{,}", "~"):
        assert leftover not in text.replace("\\n", ""), leftover
    assert df["reward"].is_between(-1, 1).all() and df["response"].str.len_chars().min() > 100


@pytest.mark.embed
def test_demo_reduced(tmp_path):
    r = runner.invoke(app, ["demo", "--out-dir", str(tmp_path / "d"), "--max-prompts", "3",
                            "--cache-dir", str(tmp_path / "c")])
    assert r.exit_code == 0, r.output
    for name in ("selectors.png", "kept.jsonl", "metrics.json"):
        assert (tmp_path / "d" / name).stat().st_size > 0
    m = json.loads((tmp_path / "d" / "metrics.json").read_text())
    assert set(m) == {"random", "top", "diverse", "grades", "stratified"}
    kept = pl.read_ndjson(tmp_path / "d" / "kept.jsonl")
    assert kept.height == 5 * 3 * 2
    # facility location (alpha = 0) maximises coverage; top-K has the highest reward
    assert m["diverse"]["coverage"] >= max(m["random"]["coverage"], m["top"]["coverage"]) - 1e-9
    assert m["top"]["reward"] >= max(v["reward"] for v in m.values()) - 1e-9
    assert "code_041" in r.output and "gain" in r.output


# ------------------------------------------------------------- static tier, device, output column


@pytest.fixture(scope="module", autouse=True)
def small_fitting_corpus():
    """The static tier is fitted on 300 corpus texts here, not thousands (the fit itself is tested elsewhere)."""
    from mrt_fast.embeddings import static as static_embed

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(static_embed, "TRAIN_TEXTS", 300)
        yield


def _fresh_static():
    from mrt_fast.embeddings import static as static_embed

    static_embed._LOADED.clear()


@pytest.mark.embed
def test_static_distillation_is_deterministic_and_cached(tiny_source, tmp_path, monkeypatch):
    from mrt_fast.embeddings import static as static_embed
    from mrt_fast.embeddings.tiers import sha256_file

    name = f"static:{tiny_source}"
    _fresh_static()
    a = static_embed.load_static(name, tmp_path / "c1", progress=False)
    _fresh_static()
    b = static_embed.load_static(name, tmp_path / "c2", progress=False)
    assert np.array_equal(a.vectors, b.vectors) and a.model_id == b.model_id
    assert a.vectors.shape == (30522, 32) and a.vectors.dtype == np.float32
    # the file is named after the source weights' hash; a second load reads it and distils nothing
    path = static_embed.static_path(name, tmp_path / "c1")
    assert path.is_file() and sha256_file(tiny_source / "model.safetensors")[:16] in path.name
    _fresh_static()
    monkeypatch.setattr(static_embed, "distill", lambda *a, **k: pytest.fail("distilled again"))
    c = static_embed.load_static(name, tmp_path / "c1")
    assert np.array_equal(c.vectors, a.vectors)
    monkeypatch.undo()
    # a damaged file is not trusted: it is distilled again, to the same vectors
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))
    _fresh_static()
    d = static_embed.load_static(name, tmp_path / "c1", progress=False)
    assert np.array_equal(d.vectors, a.vectors)
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.embed
def test_static_model_is_fitted_and_its_cache_versioned(tiny_source, static_cache, monkeypatch):
    from mrt_fast.embeddings import static as static_embed

    name = f"static:{tiny_source}"
    m = static_embed.load_static(name, static_cache)
    fit = m.meta["fit"]
    # fitted on the corpus: lower held-out loss than the linear map alone, recorded with the corpus' hash
    assert m.meta["train_texts"] == 300 and m.meta["train_texts_found"] == 300
    assert fit["texts_train"] + fit["texts_heldout"] == 300 and fit["loss_trained"] < fit["loss_linear"]
    assert len(m.meta["train_corpus_sha256"]) == 64 and "-tl300-v2" in m.model_id
    assert m.center is not None and m.center.shape == (m.dim,)
    # the corpus size and the format are in the file name: another size or version is another file
    path = static_embed.static_path(name, static_cache)
    assert path.name.endswith(f"-tl300-v{static_embed.FORMAT_VERSION}.npz")
    monkeypatch.setattr(static_embed, "TRAIN_TEXTS", 301)
    assert static_embed.static_path(name, static_cache) != path
    monkeypatch.undo()
    # a file of an older format under the current name is not trusted: it is distilled again
    old = static_embed.StaticModel(m.vectors, m.tokenizer_json, {**m.meta, "format": 1})
    calls = []
    monkeypatch.setattr(static_embed, "distill", lambda *a, **k: calls.append(k) or m)
    with monkeypatch.context() as mp:
        mp.setattr(static_embed, "_LOADED", {})
        static_embed._write(old, path)
        assert static_embed.load_static(name, static_cache) is m and len(calls) == 1
        assert calls[0]["train_texts"] == 300


@pytest.mark.embed
def test_static_name_is_the_bundled_minilm():
    from mrt_fast.embeddings.tiers import MINILM_WEIGHTS_SHA256
    from mrt_fast.embeddings.static import is_static, static_path

    assert is_static("static") and is_static("static:/x") and not is_static(None) and not is_static("minilm")
    assert MINILM_WEIGHTS_SHA256[:16] in static_path("static", "/nowhere").name
    with pytest.raises(MrtInputError, match="not a local"):
        static_path("static:/no/such/dir")


@pytest.mark.embed
@settings(max_examples=30, deadline=None)
@given(st.lists(st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=60)
                .filter(lambda t: t.strip()), min_size=1, max_size=12))
def test_static_embedding_is_the_normalised_mean_of_token_vectors(tiny_source_cached, texts):
    m = tiny_source_cached
    got = m.encode(texts, batch_size=5)
    assert got.shape == (len(texts), m.dim) and got.dtype == np.float32
    for i, t in enumerate(texts):
        ids = m._tok.encode(t, add_special_tokens=False).ids or [m._unk]
        want = m.vectors[ids].astype(np.float64).mean(axis=0)
        want /= np.linalg.norm(want)
        if m.center is not None:  # the corpus' mean embedding is taken off, then the row normalised again
            want = want - m.center
            want /= np.linalg.norm(want)
        np.testing.assert_allclose(got[i], want, atol=1e-5)
        # a text's embedding does not depend on its batch
        np.testing.assert_array_equal(m.encode([t])[0], got[i])
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1, atol=1e-5)


@pytest.fixture(scope="module")
def static_cache(tiny_source, tmp_path_factory):
    """A cache directory holding the tiny source's distilled model."""
    from mrt_fast.embeddings.static import load_static

    d = tmp_path_factory.mktemp("sc")
    load_static(f"static:{tiny_source}", d, progress=False)
    return d


@pytest.fixture(scope="module")
def tiny_source_cached(tiny_source, static_cache):
    from mrt_fast.embeddings.static import load_static

    return load_static(f"static:{tiny_source}", static_cache)


@pytest.mark.embed
def test_static_through_embed_texts_and_table(tiny_source, tmp_path):
    from mrt_fast.embeddings.embed import embed, embed_texts

    name = f"static:{tiny_source}"
    stats = {}
    x = embed_texts(["a red apple", "quantum physics", "a red apple"], name, cache_dir=tmp_path, progress=False,
                    stats=stats)
    assert x.shape == (3, 32) and np.array_equal(x[0], x[2]) and stats["model_id"].startswith("static:")
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1, atol=1e-5)
    assert not (tmp_path / "embeddings.sqlite").exists()  # the static tier skips the text cache
    df = embed(pl.DataFrame({"response": ["one", "two"], "x": [1, 2]}), model=name, cache_dir=tmp_path, progress=False)
    assert df.schema["embedding"] == pl.Array(pl.Float32, 32)
    with pytest.raises(MrtInputError, match="empty at row 1"):
        embed_texts(["ok", " "], name, cache_dir=tmp_path)


@pytest.mark.embed
def test_embed_refuses_to_overwrite_a_column(tiny_source, tmp_path):
    from mrt_fast.embeddings.embed import embed

    name = f"static:{tiny_source}"
    df = pl.DataFrame({"prompt_id": [1, 2], "response": ["yes", "no"], "embedding": [0.5, 0.25]})
    for col in ("prompt_id", "response", "embedding"):
        with pytest.raises(MrtInputError, match="--overwrite-column") as e:
            embed(df, out=col, model=name, cache_dir=tmp_path, progress=False)
        assert e.value.column == col
    got = embed(df, model=name, cache_dir=tmp_path, progress=False, overwrite=True)
    assert got.columns == df.columns and got.schema["embedding"] == pl.Array(pl.Float32, 32)
    # CLI: refused before any work (no output), allowed with --overwrite-column
    inp = tmp_path / "in.parquet"
    df.write_parquet(inp)
    for col in ("prompt_id", "response", "embedding"):
        out = tmp_path / f"out_{col}.parquet"
        r = runner.invoke(app, ["embed", str(inp), str(out), "--column", col, "--model", name,
                                "--cache-dir", str(tmp_path)])
        assert r.exit_code == 2 and "already" not in r.stderr and col in r.stderr, r.output
        assert "--overwrite-column" in r.stderr and r.stderr.strip().count("\n") == 0
        assert not out.exists()
    out = tmp_path / "ok.parquet"
    r = runner.invoke(app, ["embed", str(inp), str(out), "--column", "prompt_id", "--overwrite-column",
                            "--model", name, "--cache-dir", str(tmp_path)])
    assert r.exit_code == 0, r.output
    got = pl.read_parquet(out)
    assert got.columns == df.columns and got.schema["prompt_id"] == pl.Array(pl.Float32, 32)
    assert got["embedding"].to_list() == [0.5, 0.25]


@pytest.mark.embed
def test_device_choice(monkeypatch):
    from mrt_fast._util import device as dev

    with pytest.raises(MrtInputError, match="device must be"):
        dev.resolve_device("tpu")
    monkeypatch.setattr(dev, "cuda_available", lambda: False)
    assert dev.resolve_device("auto") == dev.resolve_device(None) == "cpu" == dev.resolve_device("CPU")
    with pytest.raises(MrtInputError, match="no CUDA device"):
        dev.resolve_device("cuda")
    monkeypatch.setattr(dev, "cuda_available", lambda: True)
    assert dev.resolve_device("auto") == "cuda"


@pytest.mark.embed
def test_cuda_without_gpu_is_a_clear_error(tmp_path):
    from mrt_fast._util.device import cuda_available

    if cuda_available():
        pytest.skip("a CUDA device is present")
    inp = tmp_path / "in.parquet"
    pl.DataFrame({"response": ["yes"]}).write_parquet(inp)
    r = runner.invoke(app, ["embed", str(inp), str(tmp_path / "o.parquet"), "--device", "cuda", "--no-cache"])
    assert r.exit_code == 2 and "no CUDA device" in r.stderr and not (tmp_path / "o.parquet").exists()


@pytest.mark.embed
@pytest.mark.gpu
def test_minilm_on_cuda_matches_cpu(tmp_path):
    from mrt_fast.embeddings.embed import embed_texts

    texts = ["a red apple", "quantum physics", "the dog barks at night"]
    g = embed_texts(texts, device="cuda", cache_dir=False, progress=False)
    c = embed_texts(texts, device="cpu", cache_dir=False, progress=False)
    np.testing.assert_allclose(g, c, atol=1e-3)


# ------------------------------------------------------------- datasets (directory / glob in, resumable out)


def _texts_table(n: int, seed: int = 0) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    words = ["apple", "river", "proof", "lemma", "poem", "loop", "cloud", "graph", "tensor", "story", "bridge", "storm"]
    texts = [" ".join(rng.choice(words, size=int(rng.integers(1, 9)))) + f" #{i % 5}" for i in range(n)]
    return pl.DataFrame({"prompt_id": np.arange(n) // 3, "response": texts, "reward": rng.uniform(size=n)})


def _write_parts(df: pl.DataFrame, d, sizes, fmt="parquet"):
    d.mkdir(parents=True, exist_ok=True)
    s = 0
    for i, n in enumerate(sizes):
        part = df.slice(s, n)
        (part.write_parquet if fmt == "parquet" else part.write_ndjson)(d / f"f{i:02d}.{fmt if fmt == 'parquet' else 'jsonl'}")
        s += n
    assert s == df.height


@pytest.mark.embed
@settings(max_examples=12, deadline=None)
@given(st.integers(1, 40), st.integers(1, 15), st.integers(1, 6), st.integers(0, 10**6))
def test_dataset_embed_resumes_to_the_in_memory_result(tiny_source, static_cache, tmp_path_factory, n, per_part,
                                                        fail_after, seed):
    from mrt_fast.embeddings.embed import embed
    from mrt_fast.datasets.job import StoppedForTest, stopping_after
    from mrt_fast.embeddings.dataset import embed_dataset, read_dataset

    name = f"static:{tiny_source}"
    tmp = tmp_path_factory.mktemp("ds")
    cache = static_cache  # the distilled model is reused across examples
    df = _texts_table(n, seed)
    cut = sorted(np.random.default_rng(seed).integers(0, n + 1, size=2).tolist())
    _write_parts(df, tmp / "in", [cut[0], cut[1] - cut[0], n - cut[1]])
    want = embed(df, model=name, cache_dir=cache, progress=False)
    n_parts = -(-n // per_part)
    out = tmp / "out"
    if fail_after < n_parts:
        with stopping_after(fail_after), pytest.raises(StoppedForTest):
            embed_dataset(tmp / "in", out, model=name, cache_dir=cache, rows_per_part=per_part)
        assert len(list(out.glob("part-*.parquet"))) == fail_after
        import subprocess
        import sys

        from mrt_fast._util.files import temp_name

        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()  # what a kill -9 mid-write leaves: a temp file whose writer is gone
        (out / temp_name("part-99999.parquet", dead.pid)).write_bytes(b"half")
    rep = embed_dataset(tmp / "in", out, model=name, cache_dir=cache, rows_per_part=per_part)
    assert rep.resumed == (fail_after < n_parts) and rep.parts == n_parts
    assert rep.parts_done_now == n_parts - (fail_after if fail_after < n_parts else 0)
    assert not list(out.glob(".*.tmp"))
    got = read_dataset(out)
    assert got.columns == want.columns and got.height == n
    assert got.equals(want)
    again = embed_dataset(tmp / "in", out, model=name, cache_dir=cache, rows_per_part=per_part)
    assert again.already_done and again.parts_done_now == 0


@pytest.mark.embed
def test_dataset_embed_jobs_globs_and_files(tiny_source, tmp_path):
    from mrt_fast.embeddings.embed import embed
    from mrt_fast.embeddings.dataset import embed_dataset, read_dataset

    name = f"static:{tiny_source}"
    df = _texts_table(30)
    _write_parts(df, tmp_path / "j", [10, 12, 8], fmt="jsonl")
    want = embed(df, model=name, cache_dir=tmp_path, progress=False)
    # a glob of JSONL files into one Parquet file
    rep = embed_dataset(str(tmp_path / "j" / "*.jsonl"), tmp_path / "all.parquet", model=name, cache_dir=tmp_path,
                        rows_per_part=7)
    assert rep.rows == 30 and pl.read_parquet(tmp_path / "all.parquet").equals(want)
    # another job (another column name) in the same directory is refused; --overwrite replaces it
    embed_dataset(tmp_path / "j", tmp_path / "o", model=name, cache_dir=tmp_path, rows_per_part=9)
    with pytest.raises(MrtInputError, match="another job"):
        embed_dataset(tmp_path / "j", tmp_path / "o", column="e2", model=name, cache_dir=tmp_path, rows_per_part=9)
    embed_dataset(tmp_path / "j", tmp_path / "o", column="e2", model=name, cache_dir=tmp_path, rows_per_part=9,
                  overwrite=True)
    assert "e2" in read_dataset(tmp_path / "o").columns
    # the output may not be inside the input
    with pytest.raises(MrtInputError, match="inside"):
        embed_dataset(tmp_path / "j", tmp_path / "j" / "out", model=name, cache_dir=tmp_path)
    # a live job's output (directory or file) is refused, naming it
    from mrt_fast.datasets.lock import lock_path, JobLock

    for out, is_dir in ((tmp_path / "o", True), (tmp_path / "all.parquet", False)):
        with JobLock.take(lock_path(out, directory=is_dir)):
            with pytest.raises(MrtInputError, match=f"in use by another job \\(pid {os.getpid()} on host"):
                embed_dataset(tmp_path / "j", out, column="e2", model=name, cache_dir=tmp_path, rows_per_part=9)


@pytest.mark.embed
def test_dataset_embed_cli_and_bad_rows(tiny_source, tmp_path):
    name = f"static:{tiny_source}"
    df = _texts_table(20)
    _write_parts(df, tmp_path / "in", [8, 12])
    r = runner.invoke(app, ["embed", str(tmp_path / "in"), str(tmp_path / "out"), "--model", name,
                            "--cache-dir", str(tmp_path), "--chunk-rows", "6"])
    assert r.exit_code == 0, r.output
    assert "texts/s" in r.output and "20" in r.output
    man = Manifest.read(tmp_path / "out")
    assert man.done and man.n_parts == 4 and man.rows == 20
    assert pl.scan_parquet(tmp_path / "out").collect().height == 20  # the directory reads as it stands
    r = runner.invoke(app, ["embed", str(tmp_path / "in"), str(tmp_path / "out"), "--model", name,
                            "--cache-dir", str(tmp_path), "--chunk-rows", "6"])
    assert r.exit_code == 0 and "already complete" in r.output
    # an empty text in the second file: one line naming the file and its row, nothing left behind
    bad = df.with_columns(pl.when(pl.int_range(pl.len()) == 13).then(pl.lit(" ")).otherwise(pl.col("response"))
                          .alias("response"))
    _write_parts(bad, tmp_path / "bad", [8, 12])
    r = runner.invoke(app, ["embed", str(tmp_path / "bad"), str(tmp_path / "bad_out"), "--model", name,
                            "--cache-dir", str(tmp_path)])
    assert r.exit_code == 2 and "f01.parquet" in r.stderr and "row 5" in r.stderr, r.output
    assert r.stderr.strip().count("\n") == 0 and not (tmp_path / "bad_out").exists()
    # the column check comes before any work, for datasets too
    r = runner.invoke(app, ["embed", str(tmp_path / "in"), str(tmp_path / "o2"), "--column", "reward",
                            "--model", name, "--cache-dir", str(tmp_path)])
    assert r.exit_code == 2 and "--overwrite-column" in r.stderr and not (tmp_path / "o2").exists()


@pytest.mark.embed
@pytest.mark.slow
def test_minilm_worker_processes_give_the_same_embeddings():
    from mrt_fast.embeddings.embed import embed_texts

    texts = ["a red apple", "quantum physics of black holes", "the dog barks", "short", "a longer sentence " * 8]
    one = embed_texts(texts, cache_dir=False, device="cpu", progress=False)
    two = embed_texts(texts, cache_dir=False, device="cpu", processes=2, batch_size=2, progress=False)
    np.testing.assert_allclose(two, one, atol=1e-5)
    with pytest.raises(MrtInputError, match="processes"):
        embed_texts(texts, cache_dir=False, processes=0)
