"""Arrow view types (``string_view``, ``binary_view``, ``list_view``, ``large_list_view``) as
their plain equivalents.

Arrow's view layouts are what polars hands out with
``to_arrow(compat_level=CompatLevel.newest())`` and what pyarrow keeps in a
Parquet or IPC file written from such a table. Many pyarrow kernels (``take``)
and polars' import of lists do not accept them, so every Arrow table, batch or
schema that comes in is cast here once: ``string_view`` to ``large_string``,
``binary_view`` to ``large_binary``, ``list_view`` to ``list`` and
``large_list_view`` to ``large_list``, at any depth (inside lists, structs and
maps). The values are unchanged; a table without view types is returned as it is.
List views are rebuilt from their offsets and sizes (a view may share or reorder
its values, and pyarrow's own cast of them makes invalid arrays).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

__all__ = ["has_views", "plain_array", "plain_schema", "plain_type", "plain_views"]


def plain_type(t: pa.DataType) -> pa.DataType:
    """``t`` with every view type replaced by its plain equivalent."""
    if pa.types.is_string_view(t):
        return pa.large_string()
    if pa.types.is_binary_view(t):
        return pa.large_binary()
    if pa.types.is_list_view(t):
        return pa.list_(t.value_field.with_type(plain_type(t.value_type)))
    if pa.types.is_large_list_view(t):
        return pa.large_list(t.value_field.with_type(plain_type(t.value_type)))
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        inner = plain_type(t.value_type)
        if inner == t.value_type:
            return t
        field = t.value_field.with_type(inner)
        if pa.types.is_fixed_size_list(t):
            return pa.list_(field, t.list_size)
        return pa.large_list(field) if pa.types.is_large_list(t) else pa.list_(field)
    if pa.types.is_struct(t):
        fields = [f.with_type(plain_type(f.type)) for f in t]
        return t if all(a.type == b.type for a, b in zip(fields, t)) else pa.struct(fields)
    if pa.types.is_map(t):
        key, item = plain_type(t.key_type), plain_type(t.item_type)
        return t if (key, item) == (t.key_type, t.item_type) else pa.map_(key, item, t.keys_sorted)
    if pa.types.is_dictionary(t):
        value = plain_type(t.value_type)
        return t if value == t.value_type else pa.dictionary(t.index_type, value, t.ordered)
    return t


def has_views(schema: pa.Schema) -> bool:
    """Whether any column of ``schema`` holds a view type (at any depth)."""
    return any(plain_type(f.type) != f.type for f in schema)


def plain_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with its view types replaced (metadata kept)."""
    if not has_views(schema):
        return schema
    return pa.schema([f.with_type(plain_type(f.type)) for f in schema], metadata=schema.metadata)


def _mask(arr: pa.Array) -> pa.Array | None:
    return arr.is_null() if arr.null_count else None


def plain_array(arr: Any) -> Any:
    """An Arrow array (or chunked array) with its view types replaced."""
    if isinstance(arr, pa.ChunkedArray):
        want = plain_type(arr.type)
        if want == arr.type:
            return arr
        return pa.chunked_array([plain_array(c) for c in arr.chunks], type=want)
    t = arr.type
    want = plain_type(t)
    if want == t:
        return arr
    if pa.types.is_list_view(t) or pa.types.is_large_list_view(t):
        large = pa.types.is_large_list_view(t)
        offsets = arr.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
        sizes = arr.sizes.to_numpy(zero_copy_only=False).astype(np.int64)
        if arr.null_count:
            sizes = np.where(arr.is_valid().to_numpy(zero_copy_only=False), sizes, 0)
        ends = np.cumsum(sizes)
        at = np.arange(int(ends[-1]) if len(ends) else 0, dtype=np.int64)
        at += np.repeat(offsets - (ends - sizes), sizes)
        values = plain_array(arr.values).take(pa.array(at))
        new_offsets = pa.array(np.concatenate([[0], ends]), pa.int64() if large else pa.int32())
        cls = pa.LargeListArray if large else pa.ListArray
        return cls.from_arrays(new_offsets, values, type=want, mask=_mask(arr))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        offsets = arr.offsets.to_numpy(zero_copy_only=False)
        values = plain_array(arr.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0])))
        offsets = pa.array(offsets - offsets[0], arr.offsets.type)
        return type(arr).from_arrays(offsets, values, type=want, mask=_mask(arr))
    if pa.types.is_fixed_size_list(t):
        n = t.list_size
        values = plain_array(arr.values.slice(arr.offset * n, len(arr) * n))
        return pa.FixedSizeListArray.from_arrays(values, type=want, mask=_mask(arr))
    if pa.types.is_struct(t):
        return pa.StructArray.from_arrays([plain_array(arr.field(i)) for i in range(t.num_fields)],
                                          fields=list(want), mask=_mask(arr))
    return arr.cast(want)  # string_view, binary_view; maps and dictionaries of them


def plain_views(table: Any) -> Any:
    """An Arrow ``Table`` or ``RecordBatch`` with its view columns cast to plain types (the same
    object when it has none); anything else is returned as it is."""
    if not isinstance(table, (pa.Table, pa.RecordBatch)) or not has_views(table.schema):
        return table
    cols = [plain_array(c) for c in table.columns]
    return type(table).from_arrays(cols, schema=plain_schema(table.schema))
