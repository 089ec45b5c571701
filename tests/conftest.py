import os

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import importlib.util

import pytest


def _has(mod: str) -> bool:
    return importlib.util.find_spec(mod) is not None


def pytest_collection_modifyitems(config, items):
    """Skip marked tests whose optional stack is missing (never silently pass)."""
    needs = {"torch": ["torch"], "train": ["torch", "transformers", "peft"], "embed": ["sentence_transformers", "faiss"],
             "ray": ["ray"]}
    gpu = False
    if _has("torch"):
        try:
            import torch

            gpu = torch.cuda.is_available()
        except Exception:  # pragma: no cover
            gpu = False
    for item in items:
        for mark, mods in needs.items():
            if item.get_closest_marker(mark) and not all(_has(m) for m in mods):
                item.add_marker(pytest.mark.skip(reason=f"needs the {mark!r} extra"))
        if item.get_closest_marker("gpu") and not gpu:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
