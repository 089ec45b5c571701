"""Picks shown while a selection runs.

One huge pool can keep the core busy for minutes inside one call, with no
row done until it returns. While a select step runs, a thread reads the
core's count of picks made (:func:`mrt_fast._grades_core.picks_made`) and,
once the rows have not moved for a while, says how many picks have been
made: beside the bar, or as a plain line every progress interval::

    mrt select: grades-50: 12 picks made in 1m 40s

A step that makes no picks in the core (random, top, stratified finding modes)
says how long it has been selecting instead (``selecting for 1m 40s``).
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Iterator

from mrt_fast.datasets.progress import JobProgress, duration_text

__all__ = ["picks_shown"]


@contextlib.contextmanager
def picks_shown(bar: JobProgress, quiet_for: float | None = None) -> Iterator[None]:
    """While the block runs, the picks made since it began, shown once ``bar``'s rows have not
    moved for ``quiet_for`` seconds (default: 2 on a bar, the progress interval for lines), then
    again each time that much more time has passed."""
    if bar.mode == "off":
        yield
        return
    from mrt_fast import _grades_core as core

    wait = quiet_for if quiet_for is not None else (2.0 if bar.mode == "bar" else max(bar.every, 0.5))
    start, t0 = core.picks_made(), time.monotonic()
    stop = threading.Event()

    def show() -> None:
        rows = bar.done
        while not stop.wait(wait):
            if bar.done != rows:  # the rows moved: their own display says enough
                rows = bar.done
                continue
            n = core.picks_made() - start
            took = duration_text(time.monotonic() - t0)
            bar.status(f"{n:,} pick{'' if n == 1 else 's'} made in {took}" if n else f"selecting for {took}")

    th = threading.Thread(target=show, name="mrt-picks", daemon=True)
    th.start()
    try:
        yield
    finally:
        stop.set()
        th.join()
        bar.status("")
