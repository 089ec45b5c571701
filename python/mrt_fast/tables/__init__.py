"""User tables (polars, pyarrow, pandas) turned into the core's arrays, and the keys of their pools."""

from __future__ import annotations

from mrt_fast.tables.arrays import as_frame, require_columns, table_kind, to_polars

__all__ = ["as_frame", "require_columns", "table_kind", "to_polars"]
