"""Where a job's time goes: wall and CPU seconds of each of its steps.

A job's steps run one after another (``plan``, ``read``, ``spill``, ``select``,
``write``): each gets its wall seconds and the CPU seconds of the whole process
over that time (every thread: polars', Arrow's and the core's included), so
CPU above wall means the step ran in parallel. Inside a step that runs several
buckets at once, the work of each bucket is timed per piece (``bucket read``,
``bucket select``, ``bucket write``): their wall seconds summed over the
buckets (several run at the same time, so the sum can exceed the step's wall)
and the count. ``mrt select --profile`` prints the table; the report's
``profile`` holds it as a dict.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Iterator

__all__ = ["Profile"]


class Profile:
    """Steps and pieces of a job, timed (see the module doc)."""

    def __init__(self) -> None:
        self.steps: dict[str, dict[str, float]] = {}
        self.pieces: dict[str, dict[str, float]] = {}
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        """Time one step of the job (run on the job's thread, one step at a time)."""
        w0, c0 = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            s = self.steps.setdefault(name, {"wall": 0.0, "cpu": 0.0})
            s["wall"] += time.perf_counter() - w0
            s["cpu"] += time.process_time() - c0

    @contextlib.contextmanager
    def piece(self, name: str) -> Iterator[None]:
        """Time one piece of a step's parallel work (any thread): wall seconds, summed, and the count."""
        w0 = time.perf_counter()
        try:
            yield
        finally:
            dt = time.perf_counter() - w0
            with self._lock:
                p = self.pieces.setdefault(name, {"wall": 0.0, "count": 0})
                p["wall"] += dt
                p["count"] += 1

    def to_dict(self) -> dict:
        return {"steps": {k: dict(v) for k, v in self.steps.items()},
                "pieces": {k: dict(v) for k, v in self.pieces.items()}}
