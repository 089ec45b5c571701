"""User tables (polars, pyarrow, pandas) turned into the core's arrays; the flat and grouped layouts."""

from __future__ import annotations

from mrt_fast.tables.arrays import as_frame, require_columns, table_kind, to_polars
from mrt_fast.tables.layouts import FLAT, GROUPED, LAYOUTS, attach, candidate_columns, detect, explode, regroup

__all__ = ["FLAT", "GROUPED", "LAYOUTS", "as_frame", "attach", "candidate_columns", "detect", "explode", "regroup",
           "require_columns", "table_kind", "to_polars"]
