"""An iterator's next item made in a second thread while the caller works on the current one.

Where the items come from work that releases the GIL (Arrow decoding Parquet pages) and the caller's
work on each does too (cutting, encoding, writing), the two overlap on two cores: a spill pass that
one thread runs under a tight memory limit then goes at the pace of the slower of the two, not of
their sum. At most ``depth`` items wait made ahead, besides the one the caller holds.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")

_DONE = object()


def read_ahead(items: Iterable[T], depth: int = 1) -> Iterator[T]:
    """The items of ``items`` in order, the next ``depth`` made by a second thread meanwhile.

    An exception the items raise is raised here, at the item it came instead of. Leaving the loop
    early (``break``, an exception, the generator closed) stops the thread before it makes more
    than the items already waiting."""
    if depth < 1:
        yield from items
        return
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(x) -> bool:
        while not stop.is_set():
            try:
                q.put(x, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def make() -> None:
        try:
            for x in items:
                if not put((True, x)):
                    return
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, raised there
            put((False, e))
            return
        put((True, _DONE))

    th = threading.Thread(target=make, name="mrt-read-ahead", daemon=True)
    th.start()
    try:
        while True:
            ok, x = q.get()
            if not ok:
                raise x
            if x is _DONE:
                return
            yield x
    finally:
        stop.set()
        th.join()
        close = getattr(items, "close", None)
        if close is not None:
            close()  # a generator left early lets go of its files now
