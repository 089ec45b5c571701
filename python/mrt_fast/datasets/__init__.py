"""Datasets larger than memory: sources, formats, parts, the manifest, the lock, and the engines.

A job reads a file, a directory or a glob of Parquet/JSONL files once and
writes a file or a resumable directory of parts; the local engine
(:func:`select_dataset`) runs on one machine in bounded memory, the Ray engine
(:mod:`mrt_fast.datasets.ray_engine`) on a cluster, with the same result.
"""

from __future__ import annotations

from mrt_fast.datasets.diagnose import variance_budget_dataset
from mrt_fast.datasets.local import BatchReport, select_dataset
from mrt_fast.datasets.manifest import Manifest
from mrt_fast.datasets.sources import Dataset, discover

__all__ = ["BatchReport", "Dataset", "Manifest", "discover", "select_dataset", "variance_budget_dataset"]
