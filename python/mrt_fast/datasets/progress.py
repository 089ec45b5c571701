"""The progress display of a job, the same for every command and engine.

On a terminal it is a rich bar (rows done, rows/s, elapsed), drawn on
stderr and cleared at the end. When stderr is not a terminal (a log file, a
batch scheduler, a pipe) it is a plain line every :data:`INTERVAL_ENV`
seconds (default :data:`DEFAULT_INTERVAL`)::

    mrt select: 120,000 of 971,000 rows (12%), 8,512 rows/s, ETA 1m 40s

The rate and the ETA count this run's rows only (a resumed job's parts done
before are in the total, not in the rate). ``how``: ``False``/``None``
(nothing), ``True``/``"auto"`` (a bar on a terminal, else lines), ``"bar"``,
``"lines"``, or a rich ``Console`` to draw the bar on.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

__all__ = ["DEFAULT_INTERVAL", "INTERVAL_ENV", "JobProgress", "duration_text", "interval"]

#: seconds between two plain progress lines (an environment variable, a number >= 0)
INTERVAL_ENV = "MRT_PROGRESS_INTERVAL"
DEFAULT_INTERVAL = 10.0


def interval() -> float:
    """Seconds between plain lines: :data:`INTERVAL_ENV`, else :data:`DEFAULT_INTERVAL`."""
    from mrt_fast.errors import MrtInputError

    v = os.environ.get(INTERVAL_ENV)
    if not v:
        return DEFAULT_INTERVAL
    try:
        s = float(v)
    except ValueError:
        s = -1.0
    if not s >= 0:
        raise MrtInputError(f"{INTERVAL_ENV} must be a number of seconds >= 0, got {v!r}")
    return s


def duration_text(seconds: float) -> str:
    """``45s``, ``3m 05s``, ``2h 10m``."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s // 3600}h {s % 3600 // 60:02d}m"


class JobProgress:
    """One job's progress by rows (see the module doc); thread-safe."""

    def __init__(self, how: Any = False, name: str = "job", unit: str = "rows"):
        self.name, self.unit = name, unit
        self.mode = self._mode(how)
        self.every = interval() if self.mode == "lines" else 0.0
        self._console = how if hasattr(how, "print") else None
        self._lock = threading.Lock()
        self.total: int | None = None
        self.done = self.before = 0
        self.phase_name = name
        self._t0 = self._last = time.monotonic()
        self._printed = False
        self._bar = self._task = None

    @staticmethod
    def _mode(how: Any) -> str:
        if how is None or how is False:
            return "off"
        if how in ("bar", "lines"):
            return how
        if how is True or how == "auto" or hasattr(how, "print"):
            stream = getattr(how, "file", None) if hasattr(how, "print") else sys.stderr
            return "bar" if getattr(stream, "isatty", lambda: False)() else "lines"
        from mrt_fast.errors import MrtInputError

        raise MrtInputError(f"progress must be True, False, 'auto', 'bar' or 'lines', got {how!r}")

    # ---- what the executors say
    def start(self, total: int | None, done: int = 0) -> None:
        """The work is known: ``total`` rows, ``done`` of them by an earlier run."""
        with self._lock:
            self.total, self.done, self.before = total, int(done), int(done)
            self._t0 = self._last = time.monotonic()
        if self._bar is not None:
            self._bar.reset(self._task, total=total, completed=done, description=self.phase_name)
        elif self.mode == "bar":
            self._draw()

    def phase(self, name: str) -> None:
        self.phase_name = f"{self.name}: {name}"
        if self._bar is not None:
            self._bar.update(self._task, description=self.phase_name)

    def set_total(self, total: int) -> None:
        with self._lock:
            self.total = int(total)
        if self._bar is not None:
            self._bar.update(self._task, total=total)

    def advance(self, n: int) -> None:
        with self._lock:
            self.done += int(n)
            now = time.monotonic()
            due = self.mode == "lines" and now - self._last >= self.every
            if due:
                self._last = now
        if self._bar is not None:
            self._bar.advance(self._task, n)
        elif due:
            self._line()

    def close(self) -> None:
        """Stop the bar; after plain lines, one last line with the final count."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        elif self.mode == "lines" and self._printed:
            self._line()

    # ---- drawing
    def line(self) -> str:
        """The plain line as it stands now."""
        with self._lock:
            done, total, before, t = self.done, self.total, self.before, time.monotonic() - self._t0
        rate = (done - before) / t if t > 0 else 0.0
        head = f"{self.phase_name}: {done:,}" + (f" of {total:,} {self.unit}" if total else f" {self.unit}")
        if total:
            head += f" ({100 * done / total:.0f}%)"
        tail = f", {rate:,.0f} {self.unit}/s"
        if total and rate > 0 and done < total:
            tail += f", ETA {duration_text((total - done) / rate)}"
        return head + tail

    def _line(self) -> None:
        self._printed = True
        print(self.line(), file=sys.stderr, flush=True)

    def _draw(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TimeElapsedColumn
        from rich.text import Text

        unit = self.unit

        class Rate(ProgressColumn):
            def render(self, task):  # noqa: D401
                s = task.finished_speed or task.speed
                return Text("" if s is None else f"{s:,.0f} {unit}/s")

        self._bar = Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(), Rate(),
                             TimeElapsedColumn(), console=self._console or Console(stderr=True), transient=True)
        self._bar.start()
        # the rate counts this run's rows: the bar starts at the rows done before
        self._task = self._bar.add_task(self.phase_name, total=self.total, completed=self.before)
