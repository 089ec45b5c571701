"""mrt_fast: multi-response training at scale.

How many responses per prompt to keep (`variance_budget`), which ones
(`select`, `facility_location`), and training/evaluating on the result.

The areas are subpackages: :mod:`mrt_fast.selection`, :mod:`mrt_fast.variance`,
:mod:`mrt_fast.tables`, :mod:`mrt_fast.datasets`, :mod:`mrt_fast.embeddings`,
:mod:`mrt_fast.llm`, :mod:`mrt_fast.sandbox`, :mod:`mrt_fast.simulate`,
:mod:`mrt_fast.answers` (callable: ``mrt_fast.answers(table, ...)``); the
names below are their most used entries, each loaded on first use.
"""

from __future__ import annotations

from mrt_fast._grades_core import __version__
from mrt_fast.errors import MissingDependencyError, MrtInputError, SmallPoolWarning
from mrt_fast._util.hooks import provide
from mrt_fast._util.lazy import lazy_names

# `mrt_fast.variance.variance_budget` reads a table itself; a path or a Ray Dataset goes to the
# datasets area, which the variance area may not import (the areas are layered)
provide("variance_budget.source", "mrt_fast.datasets.diagnose:budget_of_source")

#: name -> the module that serves it, loaded on first use, so that `import mrt_fast`
#: (and every `mrt` command, `--help` included) costs only what it uses
_LAZY = {
    "FacilityLocationResult": "mrt_fast.selection.facility",
    "Ragged": "mrt_fast.selection.facility",
    "facility_location": "mrt_fast.selection.facility",
    "METHODS": "mrt_fast.selection.options",
    "SelectOptions": "mrt_fast.selection.options",
    "SelectionReport": "mrt_fast.selection.report",
    "select": "mrt_fast.selection.select",
    "pool_modes": "mrt_fast.selection.modes",
    "knn_graph": "mrt_fast.selection.knn",
    "facility_location_corpus": "mrt_fast.selection.knn",
    "variance_budget": "mrt_fast.variance.budget",
    "VarianceAccumulator": "mrt_fast.variance.accumulator",
    "VarianceOptions": "mrt_fast.variance.options",
    "VarianceReport": "mrt_fast.variance.report",
    "select_dataset": "mrt_fast.datasets.select_job",
    "BatchReport": "mrt_fast.datasets.report",
    "JobReport": "mrt_fast.datasets.report",
    "embed": "mrt_fast.embeddings.embed",
    "embed_texts": "mrt_fast.embeddings.embed",
    "embed_dataset": "mrt_fast.embeddings.dataset",
    "EmbedReport": "mrt_fast.embeddings.dataset",
    "pass_at_k": "mrt_fast.llm.evaluate",
    "EvalConfig": "mrt_fast.llm.evaluate",
    "GenerationConfig": "mrt_fast.llm.generate",
    "TrainConfig": "mrt_fast.llm.train",
    "RewardModel": "mrt_fast.llm.reward",
    "answers_dataset": "mrt_fast.answers.dataset",
}
AREAS = ("selection", "variance", "tables", "datasets", "embeddings", "llm", "sandbox", "simulate", "errors",
         "answers")

__all__ = sorted([
    "__version__",
    "MissingDependencyError",
    "MrtInputError",
    "SmallPoolWarning",
    *_LAZY,
])


__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals(), AREAS)
