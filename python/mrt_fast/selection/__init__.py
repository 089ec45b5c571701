"""Which K responses to keep per prompt: the selectors, facility location, modes and kNN graphs.

The selectors run in the Rust core, in parallel over pools, without the GIL.
"""

from __future__ import annotations

from mrt_fast.selection.facility import DENSE_LIMIT_BYTES, FacilityLocationResult, Ragged, facility_location
from mrt_fast.selection.knn import KnnGraph, facility_location_corpus, knn_graph
from mrt_fast.selection.metrics import kept_metrics
from mrt_fast.selection.modes import kmeans, pool_modes
from mrt_fast.selection.options import FACILITY_METHODS, KERNELS, LAYOUTS, METHODS, SelectOptions
from mrt_fast.selection.report import SelectionReport
from mrt_fast.selection.select import select

__all__ = [
    "DENSE_LIMIT_BYTES",
    "FACILITY_METHODS",
    "FacilityLocationResult",
    "KERNELS",
    "KnnGraph",
    "LAYOUTS",
    "METHODS",
    "Ragged",
    "SelectOptions",
    "SelectionReport",
    "facility_location",
    "facility_location_corpus",
    "kept_metrics",
    "kmeans",
    "knn_graph",
    "pool_modes",
    "select",
]
