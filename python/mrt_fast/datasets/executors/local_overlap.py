"""A lone selecting worker's buckets, with the disk and a second core kept busy meanwhile.

Where memory leaves room for one selecting worker only, each bucket was read, decoded, selected and
its kept rows written in turn: the disk waited while the core selected, and the core waited on the
disk. :func:`run_overlapped` runs the same steps bucket after bucket with two helpers: one thread reads
the next bucket's bytes from disk while the worker selects this one (the read is I/O, no core), and
another writes the last bucket's kept rows while the worker decodes this one (one core each). The
buckets' bytes live in two buffer slots used in turn; a slot is read into again only once the kept
rows of the bucket it held are written (kept rows may share its memory).

Order of the steps for bucket ``j`` (slot ``j % 2``)::

    bytes j read (started while j - 1 was selected)
    decode j                 | write j - 1
    wait for write j - 1
    select j                 | read bytes of j + 1 into slot (j + 1) % 2
    write j (handed over)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any


def run_overlapped(todo: Sequence[int], read: Callable[[int, int], Any], decode: Callable[[int, Any, int], Any],
                   select: Callable[[int, Any], Any], write: Callable[[int, Any], None]) -> None:
    """Every bucket of ``todo`` in order: ``read(i, slot)`` (its bytes into buffer slot 0 or 1),
    ``decode(i, raw, slot)``, ``select(i, decoded)`` (None: nothing to write) and ``write(i,
    selected)``, overlapped as the module says. The first failure is raised; a failing step stops
    the buckets after it, and what is running is waited for (a bucket selected is written)."""
    if not todo:
        return
    with ThreadPoolExecutor(1, thread_name_prefix="mrt-bucket-read") as rd, \
            ThreadPoolExecutor(1, thread_name_prefix="mrt-bucket-write") as wr:
        reading: Future | None = rd.submit(read, todo[0], 0)
        writing: Future | None = None
        try:
            for j, i in enumerate(todo):
                assert reading is not None
                raw = reading.result()
                reading = None
                decoded = decode(i, raw, j % 2)
                del raw
                if writing is not None:  # the slot of bucket j - 1 is free once its rows are written
                    writing.result()
                    writing = None
                if j + 1 < len(todo):
                    reading = rd.submit(read, todo[j + 1], (j + 1) % 2)
                selected = select(i, decoded)
                del decoded
                if selected is not None:
                    writing = wr.submit(write, i, selected)
                del selected
            if writing is not None:
                writing.result()
        finally:
            if reading is not None:  # a bucket's bytes not wanted now; a bucket selected is still written
                reading.cancel()
