"""Datasets larger than memory: sources, formats, parts, the manifest, the lock, and the engines.

A job (:class:`Job`) reads a file, a directory or a glob of Parquet/JSONL
files once and writes a file or a resumable directory of parts; a stage runs
inside it on an executor: the local engine (:func:`select_dataset`) on one
machine in bounded memory, the Ray engine (:mod:`mrt_fast.datasets.ray_engine`)
on a cluster, with the same result. :func:`variance_budget` takes a table, a
path or a Ray Dataset.
"""

from __future__ import annotations

from mrt_fast._util.lazy import lazy_names

#: each name loads its module on first use: a command that fails on a missing input
#: never pays for the engines
_LAZY = {
    "variance_budget": "mrt_fast.datasets.diagnose",
    "BatchReport": "mrt_fast.datasets.local",
    "select_dataset": "mrt_fast.datasets.local",
    "Manifest": "mrt_fast.datasets.manifest",
    "Dataset": "mrt_fast.datasets.sources",
    "discover": "mrt_fast.datasets.sources",
    "Job": "mrt_fast.datasets.job",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())
