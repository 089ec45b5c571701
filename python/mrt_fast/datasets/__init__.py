"""Datasets larger than memory: sources, formats, parts, the manifest, the lock, and the engines.

A job (:class:`Job`) reads a file, a directory or a glob of Parquet/JSONL
files once and writes a file or a resumable directory of parts; a stage runs
inside it on an executor: the local engine (:func:`select_dataset`) on one
machine in bounded memory, the Ray engine (:mod:`mrt_fast.datasets.ray_engine`)
on a cluster, with the same result. :func:`variance_budget` takes a table, a
path or a Ray Dataset.
"""

from __future__ import annotations

from mrt_fast.datasets.diagnose import variance_budget
from mrt_fast.datasets.local import BatchReport, select_dataset
from mrt_fast.datasets.manifest import Manifest
from mrt_fast.datasets.sources import Dataset, discover

from mrt_fast.datasets.job import Job

__all__ = ["BatchReport", "Dataset", "Job", "Manifest", "discover", "select_dataset", "variance_budget"]
