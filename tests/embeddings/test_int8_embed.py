"""The int8 tier: MiniLM (here a tiny BERT) exported to ONNX, quantized, run by onnxruntime."""

import json

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from mrt_fast import MissingDependencyError, MrtInputError
from mrt_fast.cli import app

pytestmark = [pytest.mark.embed, pytest.mark.int8]
runner = CliRunner()

WORDS = ["the", "model", "returns", "a", "tensor", "of", "shape", "batch", "file", "is", "read", "once", "and",
         "cached", "quantum", "apple", "red", "night", "dog", "runs", "x", "value", "error", "when", "empty"]


def _fp32_reference(src, texts):
    """The same model in float32 through transformers: mean of the output states over the mask, normalised."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    net = AutoModel.from_pretrained(str(src)).eval()
    tok = AutoTokenizer.from_pretrained(str(src))
    out = []
    with torch.inference_mode():
        for t in texts:  # one text per call: no padding at all
            b = tok([t], truncation=True, max_length=64, return_tensors="pt")
            h = net(**b).last_hidden_state
            out.append(torch.nn.functional.normalize(h.mean(dim=1), dim=1).numpy()[0])
    return np.stack(out)


@pytest.fixture(scope="module")
def int8_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("int8_cache")


@pytest.fixture(scope="module")
def tiny_int8(tiny_source, int8_cache):
    from mrt_fast.embeddings.int8 import load_int8

    return load_int8(f"int8:{tiny_source}", int8_cache, progress=False)


def test_built_once_recorded_and_rebuilt_when_damaged(tiny_source, tmp_path, monkeypatch):
    from mrt_fast.embeddings import int8 as int8_embed
    from mrt_fast.embeddings.tiers import sha256_file

    import subprocess
    import sys

    from mrt_fast._util.files import temp_name

    name = f"int8:{tiny_source}"
    path = int8_embed.int8_path(name, tmp_path)
    # what a build killed half-way leaves: temp files of a dead process, removed by the next build
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    path.parent.mkdir(parents=True)
    stale = [path.parent / temp_name(p, pid=dead.pid) for p in (path, path.with_name(path.stem + ".fp32.onnx"))]
    for f in stale:
        f.write_bytes(b"half")
    m = int8_embed.load_int8(name, tmp_path, progress=False)
    assert not any(f.exists() for f in stale)
    assert sorted(f.name for f in path.parent.iterdir()) == sorted([path.name, path.with_suffix(".json").name])
    assert path.is_file() and sha256_file(tiny_source / "model.safetensors")[:16] in path.name
    meta = json.loads(path.with_suffix(".json").read_text())
    assert meta["onnx_sha256"] == sha256_file(path) and meta["dim"] == 32 and meta["max_tokens"] == 64
    assert m.model_id.startswith("int8:") and meta["source_sha256"][:16] in m.model_id
    first = sha256_file(path)

    # a second process (fresh in-memory table) reads the file and does not build again
    int8_embed._LOADED.clear()
    monkeypatch.setattr(int8_embed, "build", lambda *a, **k: pytest.fail("built again"))
    int8_embed.load_int8(name, tmp_path, progress=False)
    monkeypatch.undo()

    # a damaged file is built again, and the build is deterministic
    int8_embed._LOADED.clear()
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))
    int8_embed.load_int8(name, tmp_path, progress=False)
    assert sha256_file(path) == first
    # so is a missing record
    int8_embed._LOADED.clear()
    path.with_suffix(".json").unlink()
    int8_embed.load_int8(name, tmp_path, progress=False)
    assert path.with_suffix(".json").is_file()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(st.sampled_from(WORDS), min_size=1, max_size=40).map(" ".join), min_size=1, max_size=12),
       st.integers(1, 20))
def test_int8_equals_the_float_model_whatever_the_batch(tiny_int8, tiny_source, texts, batch_size):
    """Padding is masked (a text's embedding does not depend on the longer texts batched with it) and int8
    weights stay close to float32: each row within cosine 0.99 of the float model run on that text alone."""
    x = tiny_int8.encode(texts, batch_size)
    assert x.shape == (len(texts), 32) and x.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-5)
    ref = _fp32_reference(tiny_source, texts)
    assert np.min(np.sum(x * ref, axis=1)) > 0.99


def test_masking_is_what_keeps_the_batch_out(tiny_int8):
    """The control for the test above: fed a mask of ones, the padded row moves (far) more than it does
    when batched with the mask."""
    short, long_ = "the dog runs", " ".join(WORDS * 2)
    alone = tiny_int8.encode([short])[0]
    both = tiny_int8.encode([short, long_])[0]
    assert float(alone @ both) > 0.99
    enc = [e.ids for e in tiny_int8._tok.encode_batch([long_, short], add_special_tokens=True)]
    ids = np.zeros((2, len(enc[0])), dtype=np.int64)
    ids[0], ids[1, : len(enc[1])] = enc[0], enc[1]
    h = tiny_int8._session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids),
                                      "token_type_ids": np.zeros_like(ids)})[0]
    v = h[1, : len(enc[1])].mean(axis=0)
    unmasked = 1.0 - float(alone @ (v / np.linalg.norm(v)))
    masked = 1.0 - float(alone @ both)
    assert unmasked > 1e-6 and masked < 0.1 * unmasked


def test_through_embed_texts_the_table_and_the_cache(tiny_source, int8_cache, tmp_path):
    from mrt_fast.embeddings.embed import embed, embed_texts

    name = f"int8:{tiny_source}"
    texts = ["a red apple", "quantum physics", "a red apple", "the dog barks at night"]
    stats: dict = {}
    x = embed_texts(texts, name, cache_dir=int8_cache, progress=False, stats=stats)
    assert x.shape == (4, 32) and stats["computed"] == 3 and stats["model_id"].startswith("int8:")
    np.testing.assert_array_equal(x[0], x[2])
    stats2: dict = {}
    y = embed_texts(texts, name, cache_dir=int8_cache, progress=False, stats=stats2)
    assert stats2["hits"] == 3 and stats2["computed"] == 0
    np.testing.assert_array_equal(x, y)
    df = embed(pl.DataFrame({"response": texts}), model=name, cache_dir=int8_cache, progress=False)
    assert df["embedding"].dtype == pl.Array(pl.Float32, 32)


def test_cuda_and_missing_onnxruntime_are_clear_errors(tiny_source, int8_cache, tmp_path, monkeypatch):
    import sys

    from mrt_fast.embeddings import int8 as int8_embed
    from mrt_fast.embeddings.embed import embed_texts

    name = f"int8:{tiny_source}"
    with pytest.raises(MrtInputError, match="runs on the CPU|no CUDA device"):
        embed_texts(["x y"], name, cache_dir=int8_cache, device="cuda", progress=False)
    inp = tmp_path / "in.parquet"
    pl.DataFrame({"response": ["yes"]}).write_parquet(inp)
    r = runner.invoke(app, ["embed", str(inp), str(tmp_path / "o.parquet"), "--model", name, "--device", "cuda",
                            "--cache-dir", str(int8_cache)])
    assert r.exit_code == 2 and ("runs on the CPU" in r.stderr or "no CUDA device" in r.stderr)
    assert not (tmp_path / "o.parquet").exists()
    with pytest.raises(MrtInputError, match="not a local sentence-transformers model directory"):
        int8_embed.load_int8(f"int8:{tmp_path / 'nowhere'}", tmp_path, progress=False)
    int8_embed._LOADED.clear()
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    # a missing extra is a broken install, not bad input: an ImportError, never a ValueError
    with pytest.raises(MissingDependencyError, match=r"mrt_fast\[int8\]") as e:
        embed_texts(["x y"], name, cache_dir=tmp_path, progress=False)
    assert isinstance(e.value, ImportError) and not isinstance(e.value, ValueError)


def test_cli_writes_int8_embeddings(tiny_source, int8_cache, tmp_path):
    inp, out = tmp_path / "in.parquet", tmp_path / "out.parquet"
    pl.DataFrame({"prompt_id": [1, 1, 2], "response": ["a b", "c d e", "f"]}).write_parquet(inp)
    r = runner.invoke(app, ["embed", str(inp), str(out), "--model", f"int8:{tiny_source}",
                            "--cache-dir", str(int8_cache)])
    assert r.exit_code == 0, r.output
    df = pl.read_parquet(out)
    assert df["embedding"].dtype == pl.Array(pl.Float32, 32) and df.height == 3


@pytest.mark.slow
def test_bundled_minilm_int8_keeps_minilm_embeddings(tmp_path):
    """The real tier: the bundled MiniLM quantized stays close to MiniLM (cosine over 0.96 on every text,
    0.98 on average; a two-token text is the worst: 0.966, and 0.984 on average, with onnxruntime 1.32
    and torch 2.15's export)."""
    from mrt_fast.embeddings.embed import embed_texts

    texts = ["Return the number of items in a container.", "The dog barks at the moon all night long.",
             "Quantum entanglement links the states of two particles.", "ok", "x" * 3000,
             "Raise ValueError when the input is empty; otherwise return a sorted copy of the list."]
    ref = embed_texts(texts, None, cache_dir=False, device="cpu", progress=False)
    x = embed_texts(texts, "int8", cache_dir=tmp_path, progress=False)
    assert x.shape == ref.shape == (6, 384)
    cos = np.sum(x * ref, axis=1)
    assert cos.min() > 0.96 and cos.mean() > 0.98
