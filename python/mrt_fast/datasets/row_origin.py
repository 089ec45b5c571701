"""Where a row of a dataset comes from.

Selection reads a dataset as frames of rows (the whole dataset, a bucket of
pools, a part of consecutive prompts), and an error about one of their rows
names its index in that frame, which means nothing to the user. Here such an
error is restated with the file the row came from and its row in that file
(:meth:`mrt_fast.datasets.sources.Dataset.locate`); only when an error is raised, so the
reads themselves carry nothing extra.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from mrt_fast.errors import MrtInputError

if TYPE_CHECKING:  # pragma: no cover
    from mrt_fast.datasets.sources import Dataset

#: "pool 3 (prompt_id=15)": the index of a pool within a frame, and its id
_POOL_INDEX = re.compile(r"\bpool \d+ \(([^()]*)\)")


def restate_row(err: MrtInputError, said: int, where: str, row: int) -> MrtInputError:
    """``err`` with its first mention of row ``said`` replaced by ``where`` (appended
    when the message names no row) and ``row`` as its row attribute."""
    msg, n = re.subn(rf"\brow {said}\b(?! of )", where, str(err), count=1)
    if not n:
        msg = f"{msg} ({where})"
    return MrtInputError(msg, pool=err.pool, column=err.column, row=row)


def in_file(err: MrtInputError, ds: "Dataset", row: int, said: int | None = None) -> MrtInputError:
    """``err``, about global row ``row`` of ``ds`` (which its message calls row
    ``said``, by default its row attribute), restated with the file and the row
    within it; a pool's index within the frame gives way to its id."""
    f, r = ds.locate(row)
    new = restate_row(err, err.row if said is None else said, f"row {r} of {str(f)!r}", r)
    return MrtInputError(_POOL_INDEX.sub(r"pool \1", str(new)), pool=new.pool, column=new.column, row=r)
