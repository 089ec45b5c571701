"""Training on transformers' Trainer: a run stopped after a checkpoint and resumed ends where an uninterrupted one does."""

from __future__ import annotations

import json

import polars as pl
import pytest

from mrt_fast import MrtInputError

pytestmark = pytest.mark.train

DATA = pl.DataFrame({
    "prompt_id": [f"p{i // 2}" for i in range(8)],
    "prompt": ["The quick", "The quick", "Paris is", "Paris is", "Tell me", "Tell me", "Write a", "Write a"],
    "response": [" brown fox", " red fox", " the capital", " in France", " a fact", " about cats", " poem", " song"],
})


def _adapter(path):
    from safetensors.torch import load_file

    return load_file(str(path / "adapter" / "adapter_model.safetensors"))


class _StopAt:
    """A TrainerCallback that kills the run after `step` optimizer steps (a stand-in for a preempted job)."""

    def __init__(self, step):
        self.step = step

    def __getattr__(self, name):  # every other callback event: nothing to do
        if name.startswith("on_"):
            return lambda *a, **k: None
        raise AttributeError(name)

    def on_step_end(self, args, state, control, **kw):
        if state.global_step == self.step:
            raise KeyboardInterrupt


def test_resume_after_checkpoint_gives_the_same_adapter(tmp_path):
    import torch

    from mrt_fast.llm.testing import tiny_causal_lm, tiny_tokenizer
    from mrt_fast.llm.train import train

    torch.set_num_threads(1)
    tok = tiny_tokenizer()
    kw = dict(tokenizer=tok, max_steps=5, batch_size=2, grad_accum=2, learning_rate=5e-3, lora_dropout=0.1,
              save_steps=2, progress=False)
    full = train(DATA, tiny_causal_lm(tok, seed=7), tmp_path / "full", **kw)
    with pytest.raises(KeyboardInterrupt):
        train(DATA, tiny_causal_lm(tok, seed=7), tmp_path / "cut", callbacks=[_StopAt(3)], **kw)
    assert (tmp_path / "cut" / "checkpoints" / "checkpoint-2").is_dir()
    assert not (tmp_path / "cut" / "adapter").exists()
    resumed = train(DATA, tiny_causal_lm(tok, seed=7), tmp_path / "cut", **kw)
    a, b = _adapter(tmp_path / "full"), _adapter(tmp_path / "cut")
    assert set(a) == set(b)

    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)
    # the log has each step once, the losses of the uninterrupted run
    assert [r["step"] for r in resumed.log] == [1, 2, 3, 4, 5]
    for x, y in zip(full.log, resumed.log):
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-5)
    assert json.loads((tmp_path / "cut" / "train_config.json").read_text())["resumed_from_step"] == 2
    # training moved the adapter: the comparison is not between two untouched initialisations
    lora_b = [k for k in a if "lora_B" in k]
    assert max(float(a[k].abs().max()) for k in lora_b) > 1e-4
    # a checkpoint of other settings is not resumed silently
    with pytest.raises(MrtInputError, match="other settings"):
        train(DATA, tiny_causal_lm(tok, seed=7), tmp_path / "cut", **{**kw, "learning_rate": 1e-3})
