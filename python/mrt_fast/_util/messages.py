"""One-line messages from exceptions, for errors that must stay one line."""

from __future__ import annotations



def one_line(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return msg[0] if msg else type(e).__name__
