"""The LLM pipeline: overgeneration, rewards, per-response losses, LoRA training, evaluation, export.

torch and transformers load on first use of a name below (the ``train`` extra).
"""

from __future__ import annotations

import importlib

# names whose module shares the name (generate, train, evaluate, export) are
# reached through their module: mrt_fast.llm.train.train(...)
_WHERE = {
    "GenerationConfig": "generate",
    "RewardModel": "reward", "load_reward_fn": "reward", "score_with": "reward",
    "response_nll": "nll", "nll_table": "nll", "score": "reward",
    "TrainConfig": "train", "TrainResult": "train",
    "EvalConfig": "evaluate", "pass_at_k": "evaluate",
    "RunConfig": "pipeline",
    "materialize_gguf": "models",
    "ExportReport": "preference",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(f"mrt_fast.llm.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'mrt_fast.llm' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
