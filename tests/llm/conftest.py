"""Fixtures the LLM test modules share: one torch thread per test module that asks for the tiny
models, and the tiny offline models themselves (saved once per module)."""

import pytest


@pytest.fixture(scope="module")
def torch_one_thread():
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny_paths(tmp_path_factory, torch_one_thread):
    from mrt_fast.llm.testing import save_tiny_models

    return save_tiny_models(tmp_path_factory.mktemp("models"))
