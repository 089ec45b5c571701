"""A full disk said in one line: what was being written, where, and the room left.

Python, polars and Arrow each word a full disk their own way (``OSError``
28, ``ComputeError: ... No space left on device (os error 28)``, ``Error
writing bytes to file ... [errno 28]``); :func:`reporting_full_disk` turns
any of them into one :class:`~mrt_fast.errors.MrtResourceError` line, so that a
full disk is never taken for bad input nor shown as a traceback.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path

from mrt_fast.errors import MrtInputError, MrtResourceError

_CODES = {errno.ENOSPC, errno.EDQUOT}
_WORDS = ("no space left on device", "os error 28", "errno 28", "disk quota exceeded", "os error 122")


def is_no_space(e: BaseException | None) -> bool:
    """Whether ``e`` (or an exception it was raised from) is a full disk or an exhausted quota."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in _CODES:
            return True
        if any(w in str(e).lower() for w in _WORDS):
            return True
        e = e.__cause__ or e.__context__
    return False


def free_bytes(path: str | os.PathLike) -> int | None:
    """Bytes free to this user on the file system holding ``path`` (its nearest existing folder)."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        st = os.statvfs(p)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def no_space_error(action: str, path: str | os.PathLike) -> MrtResourceError:
    """``no space left on device while ACTION 'PATH' (N bytes free); free space and rerun ...``."""
    free = free_bytes(path)
    room = "" if free is None else f" ({free:,} bytes free)"
    return MrtResourceError(f"no space left on device while {action} {str(path)!r}{room}; "
                            "free space and rerun the same command to resume", path=str(path))


@contextlib.contextmanager
def reporting_full_disk(action: str, path: str | os.PathLike) -> Iterator[None]:
    """Raise :func:`no_space_error` for a full disk met in the block; anything else passes unchanged."""
    try:
        yield
    except (MrtInputError, MrtResourceError):
        raise
    except Exception as e:  # noqa: BLE001 - every library words it its own way
        if is_no_space(e):
            raise no_space_error(action, path) from None
        raise
