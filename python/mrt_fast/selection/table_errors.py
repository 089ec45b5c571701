"""Errors of the core said of the user's table: the pool by its prompt id, the column by name."""

from __future__ import annotations

import numpy as np
import polars as pl

from mrt_fast.errors import MrtInputError


def said_of_table(e: MrtInputError, keys: pl.Series, by: str, columns: dict) -> MrtInputError:
    """The core's error about pool index `e.pool`, argument `e.column` and row
    `e.row`, said of the table: the pool by its prompt id, the column by name."""
    p = e.pool
    if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or not 0 <= p < len(keys):
        return e
    p = int(p)
    key = keys[p]
    if isinstance(key, pl.Series):  # a nested id (list, array): named by its values on one line
        key = key.to_list()
    msg, prefix = str(e), f"pool {p}: "
    rest = msg[len(prefix):] if msg.startswith(prefix) else msg
    return MrtInputError(
        f"pool {p} ({by}={key!r}): {rest}", pool=key, column=columns.get(e.column, e.column), row=e.row
    )


