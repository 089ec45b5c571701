"""Datasets larger than memory: sources, formats, parts, the manifest, the lock, stages and executors.

A job (:class:`Job`) reads a file, a directory or a glob of Parquet/JSONL
files once and writes a file or a resumable directory of parts; a stage
(:mod:`mrt_fast.datasets.stage`) runs inside it on an executor
(:mod:`mrt_fast.datasets.executors`): ``engine="local"`` on one machine in
bounded memory, ``engine="ray"`` on a Ray cluster, with the same parts
(:func:`select_dataset`). Every stage's run returns a :class:`JobReport`.
:func:`variance_budget` takes a table, a path or a Ray Dataset
(:mod:`mrt_fast.datasets.ray_engine` serves the Ray Dataset functions).
"""

from __future__ import annotations

from mrt_fast._util.lazy import lazy_names

#: each name loads its module on first use: a command that fails on a missing input
#: never pays for the engines
_LAZY = {
    "variance_budget": "mrt_fast.datasets.diagnose",
    "BatchReport": "mrt_fast.datasets.report",
    "JobReport": "mrt_fast.datasets.report",
    "select_dataset": "mrt_fast.datasets.select_job",
    "Manifest": "mrt_fast.datasets.manifest",
    "Dataset": "mrt_fast.datasets.sources",
    "discover": "mrt_fast.datasets.sources",
    "Job": "mrt_fast.datasets.job",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())
