"""Which K responses to keep per prompt: the selectors, facility location, modes and kNN graphs.

The selectors run in the Rust core, in parallel over pools, without the GIL. Each name is loaded
on first use, so that importing a light module of this area (the kernel defaults, for the
command line) loads neither polars nor NumPy.
"""

from __future__ import annotations

from mrt_fast._util.lazy import lazy_names

_LAZY = {
    "DENSE_LIMIT_BYTES": "mrt_fast.selection.facility",
    "FacilityLocationResult": "mrt_fast.selection.facility",
    "Ragged": "mrt_fast.selection.facility",
    "facility_location": "mrt_fast.selection.facility",
    "KnnGraph": "mrt_fast.selection.knn",
    "facility_location_corpus": "mrt_fast.selection.knn",
    "knn_graph": "mrt_fast.selection.knn",
    "kept_metrics": "mrt_fast.selection.metrics",
    "kmeans": "mrt_fast.selection.modes",
    "pool_modes": "mrt_fast.selection.modes",
    "FACILITY_METHODS": "mrt_fast.selection.options",
    "KERNELS": "mrt_fast.selection.kernels",
    "LAYOUTS": "mrt_fast.selection.options",
    "METHODS": "mrt_fast.selection.options",
    "SelectOptions": "mrt_fast.selection.options",
    "SelectionReport": "mrt_fast.selection.report",
    "select": "mrt_fast.selection.select",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals(),
                                  submodules=("candidate_keys", "content", "dedup", "facility", "grouped", "knn",
                                              "kernels", "metrics", "mode_merge", "modes", "options",
                                              "per_pool_k", "report", "select", "table_errors"))
