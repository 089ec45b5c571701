import os

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import importlib.util
import sys
from pathlib import Path

import pytest

# The folder tests/datasets is on sys.path's tests/ as a namespace package named `datasets`.
# Where Hugging Face `datasets` is not installed, transformers would find that folder, take it for
# the library and fail on `datasets.Dataset`: the name is marked absent instead.
_spec = importlib.util.find_spec("datasets")
if _spec is not None and _spec.origin is None and any(
        Path(p).resolve() == Path(__file__).resolve().parent / "datasets" for p in _spec.submodule_search_locations or ()):
    sys.modules["datasets"] = None


def _has(mod: str) -> bool:
    return importlib.util.find_spec(mod) is not None


def pytest_collection_modifyitems(config, items):
    """Skip marked tests whose optional stack is missing (never silently pass)."""
    needs = {"torch": ["torch"], "train": ["torch", "transformers", "peft"], "embed": ["sentence_transformers", "faiss"],
             "int8": ["onnxruntime", "onnx", "torch", "transformers"], "ray": ["ray"]}
    gpu = False
    if _has("torch"):
        try:
            import torch

            gpu = torch.cuda.is_available()
        except Exception:  # noqa: BLE001  (a broken CUDA set-up raises anything: no GPU then)
            gpu = False
    for item in items:
        for mark, mods in needs.items():
            if item.get_closest_marker(mark) and not all(_has(m) for m in mods):
                item.add_marker(pytest.mark.skip(reason=f"needs the {mark!r} extra"))
        if item.get_closest_marker("gpu") and not gpu:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))


@pytest.fixture(scope="module", autouse=True)
def _no_ray_left_running():
    """A Ray instance a test module started (the engine starts one on first use) ends with the
    module: the next module's tests start their own, with their own settings."""
    import sys

    yield
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()


@pytest.fixture(scope="session")
def tiny_source(tmp_path_factory):
    """A one-layer BERT (random, seeded) with the bundled MiniLM tokenizer: a model source that builds in seconds."""
    import shutil

    import torch
    from transformers import BertConfig, BertModel

    from mrt_fast.embeddings.tiers import minilm_path

    d = tmp_path_factory.mktemp("tiny_bert")
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=64)
    BertModel(cfg).save_pretrained(d)
    shutil.copy(minilm_path() / "tokenizer.json", d / "tokenizer.json")
    return d
