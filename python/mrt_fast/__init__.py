"""mrt_fast: multi-response training at scale.

How many responses per prompt to keep (`variance_budget`), which ones
(`select`, `facility_location`), and training/evaluating on the result.
"""

from __future__ import annotations

from mrt_fast._grades_core import __version__
from mrt_fast.errors import MrtInputError
from mrt_fast.selection.select import (
    METHODS,
    FacilityLocationResult,
    Ragged,
    SelectionReport,
    SmallPoolWarning,
    facility_location,
    select,
)

__all__ = [
    "__version__",
    "METHODS",
    "FacilityLocationResult",
    "MrtInputError",
    "Ragged",
    "SelectionReport",
    "SmallPoolWarning",
    "facility_location",
    "select",
    "select_dataset",
]


def __getattr__(name: str):
    # heavier parts load on first use
    if name in ("variance_budget", "VarianceAccumulator", "VarianceReport"):
        from mrt_fast.variance import law as variance

        return getattr(variance, name)
    if name in ("select_dataset", "BatchReport"):
        from mrt_fast.datasets import local as batch

        return getattr(batch, name)
    if name == "embed_texts":
        import importlib

        return getattr(importlib.import_module("mrt_fast.embeddings.embed"), name)
    if name in ("embed_dataset", "EmbedReport"):
        import importlib

        return getattr(importlib.import_module("mrt_fast.embeddings.dataset"), name)
    if name == "pool_modes":
        from mrt_fast.selection import modes

        return modes.pool_modes
    if name in ("knn_graph", "facility_location_corpus"):
        from mrt_fast.selection import knn

        return getattr(knn, name)
    # LLM pipeline (torch/transformers load on first use)
    _llm = {"pass_at_k": "evaluate", "EvalConfig": "evaluate", "GenerationConfig": "generate",
            "TrainConfig": "train", "RewardModel": "reward"}
    if name in _llm:
        import importlib

        return getattr(importlib.import_module(f".{_llm[name]}", __name__), name)
    if name == "simulate":  # the paper's controlled experiments (torch extra)
        import importlib

        return importlib.import_module("mrt_fast.simulate")
    raise AttributeError(f"module 'mrt_fast' has no attribute {name!r}")
