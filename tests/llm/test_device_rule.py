"""One device rule for every model stage: a device that is not here is refused before any work."""

from __future__ import annotations

import pytest

from mrt_fast import MrtInputError
from mrt_fast._util.device import resolve_device

pytestmark = pytest.mark.train


def _absent_cuda() -> str:
    import torch

    return f"cuda:{torch.cuda.device_count()}"  # one index past the last device (cuda:0 without a GPU)


def test_the_rule_itself():
    assert resolve_device(None) == resolve_device("auto") == resolve_device("AUTO")
    assert resolve_device("cpu") == "cpu"
    for bad in ("tpu", "gpu", "cuda:x", ""):
        with pytest.raises(MrtInputError, match="device"):
            resolve_device(bad)
    with pytest.raises(MrtInputError, match="device"):
        resolve_device(_absent_cuda())


def test_every_model_stage_refuses_a_device_that_is_not_here(tmp_path):
    import polars as pl

    from mrt_fast.llm.evaluate import EvalConfig, evaluate
    from mrt_fast.llm.generate import GenerationConfig, generate
    from mrt_fast.llm.reward import RewardModel
    from mrt_fast.llm.testing import save_tiny_models, tiny_prompt_table
    from mrt_fast.llm.train import TrainConfig, train

    models = save_tiny_models(tmp_path / "m")
    prompts = tiny_prompt_table(2)
    pairs = pl.DataFrame({"prompt_id": [0, 0], "prompt": ["a", "a"], "response": ["b", "c"]})
    for device in ("tpu", _absent_cuda()):
        with pytest.raises(MrtInputError, match="device"):
            RewardModel(str(models["reward"]), device=device)
        with pytest.raises(MrtInputError, match="device"):
            generate(prompts, tmp_path / "g", str(models["lm"]), GenerationConfig(n=2, device=device, backend="transformers"))
        with pytest.raises(MrtInputError, match="device"):
            train(pairs, str(models["lm"]), tmp_path / "t", TrainConfig(device=device, max_steps=1))
        with pytest.raises(MrtInputError, match="device"):
            evaluate(prompts, str(models["lm"]), config=EvalConfig(n_samples=1, device=device))
