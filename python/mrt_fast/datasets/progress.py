"""The progress display of a job, the same for every command and engine.

On a terminal it is a rich bar (rows done, rows/s, elapsed), drawn on
stderr and cleared at the end. When stderr is not a terminal (a log file, a
batch scheduler, a pipe) it is a plain line every :data:`INTERVAL_ENV`
seconds (default :data:`DEFAULT_INTERVAL`)::

    mrt select: 120,000 of 971,000 rows (12%), 8,512 rows/s, ETA 1m 40s

Rows are the input's rows: candidates in the flat layout, prompts in the
grouped one (``unit``). A stage that runs a model counts the candidates it
has done inside a part too (:meth:`JobProgress.tick`, after each model
batch), so a long part shows progress while it runs; the line then leads with
the candidates, their rate and the ETA, and gives the rows beside them::

    mrt embed: 4,096 of 19,200 candidates (21%), 512 of 2,400 prompts, 25 candidates/s, ETA 10m 04s

The rate and the ETA count this run's work only (a resumed job's parts done
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

__all__ = ["DEFAULT_INTERVAL", "INTERVAL_ENV", "JobProgress", "duration_text", "interval", "rate_text"]

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


def rate_text(rate: float) -> str:
    """``8,512``, ``25``, ``0.14``: a rate said with the digits that mean something."""
    if rate >= 10:
        return f"{rate:,.0f}"
    return f"{rate:.2g}" if rate > 0 else "0"


class JobProgress:
    """One job's progress by rows, and by candidates where a stage ticks them (see the module
    doc); thread-safe. ``unit``: what a row is (``rows``; ``prompts`` in the grouped layout)."""

    ITEM = "candidates"

    def __init__(self, how: Any = False, name: str = "job", unit: str = "rows"):
        self.name, self.unit = name, unit
        self.mode = self._mode(how)
        self.every = interval() if self.mode == "lines" else 0.0
        self._console = how if hasattr(how, "print") else None
        self._lock = threading.Lock()
        self.total: int | None = None
        self.done = self.before = 0
        #: candidates: their total (None: not counted), done, and done before this run
        self.items_total: int | None = None
        self.items = self.items_before = 0
        self.phase_name = name
        self._t0 = self._last = time.monotonic()
        self._printed = False
        self._bar = self._task = None
        self._saying: threading.Timer | None = None  # a line of say() not printed yet

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
    def start(self, total: int | None, done: int = 0, items_total: int | None = None) -> None:
        """The work is known: ``total`` rows, ``done`` of them by an earlier run; ``items_total``:
        the candidates they hold, when the stage ticks them (those of the rows done before are
        counted as done, in proportion)."""
        with self._lock:
            self.total, self.done, self.before = total, int(done), int(done)
            self.items_total = None if items_total is None else int(items_total)
            before = 0
            if self.items_total is not None and total:
                before = min(self.items_total, round(self.items_total * int(done) / total))
            self.items = self.items_before = before
            self._t0 = self._last = time.monotonic()
        bar_total, bar_done = (total, done) if self.items_total is None else (self.items_total, self.items)
        if self._bar is not None:
            self._bar.reset(self._task, total=bar_total, completed=bar_done, description=self.phase_name)
        elif self.mode == "bar":
            self._draw()

    def say(self, what: str) -> None:
        """A step with no count (a model loading): ``mrt nll: loading the model`` as a plain line
        once it has lasted the interval (at once with an interval of 0), unless the work moved or
        the display closed first (:meth:`quiet`); the bar shows it as its description."""
        if self.mode == "lines":
            self.quiet()
            text = f"{self.name}: {what}"
            if self.every <= 0:
                print(text, file=sys.stderr, flush=True)
                return
            timer = threading.Timer(self.every, lambda: print(text, file=sys.stderr, flush=True))
            timer.daemon = True
            self._saying = timer
            timer.start()
        elif self._bar is not None:
            self._bar.update(self._task, description=f"{self.name}: {what}")

    def quiet(self) -> None:
        """Drop the line :meth:`say` has not printed yet."""
        timer, self._saying = self._saying, None
        if timer is not None:
            timer.cancel()

    def set_unit(self, unit: str) -> None:
        """What a row is: ``rows``, or ``prompts`` in the grouped layout."""
        self.unit = unit

    def tick(self, n: int) -> None:
        """``n`` more candidates done inside a part (a model batch): the display moves before
        the part is done. Ignored unless the candidates were counted (``items_total``)."""
        self.quiet()
        with self._lock:
            if self.items_total is None:
                return
            self.items += int(n)
            due = self._due()
        if self._bar is not None:
            self._bar.advance(self._task, n)
        elif due:
            self._line()

    def _due(self) -> bool:
        """Whether a plain line is due now (with the lock held)."""
        now = time.monotonic()
        if self.mode == "lines" and now - self._last >= self.every:
            self._last = now
            return True
        return False

    def status(self, what: str) -> None:
        """A count inside a long step (picks inside one huge pool), shown now: beside the bar's
        description, or as a plain line ``mrt select: grades-50: 12 picks made in 1m 40s``; an
        empty ``what`` takes it off the bar."""
        if self._bar is not None:
            self._bar.update(self._task, description=f"{self.phase_name} ({what})" if what else self.phase_name)
        elif self.mode == "lines" and what:
            print(f"{self.phase_name}: {what}", file=sys.stderr, flush=True)

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
        """``n`` more rows done (a part committed)."""
        self.quiet()
        with self._lock:
            self.done += int(n)
            due = self._due()
            ticking = self.items_total is not None
        if self._bar is not None:
            if not ticking:  # with candidates counted, the bar follows them
                self._bar.advance(self._task, n)
        elif due:
            self._line()

    def close(self) -> None:
        """Stop the bar; after plain lines, one last line with the final count."""
        self.quiet()
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
            items, items_total, items_before = self.items, self.items_total, self.items_before
        if items_total is not None:  # candidates lead: they move inside a part
            rate = (items - items_before) / t if t > 0 else 0.0
            head = (f"{self.phase_name}: {items:,} of {items_total:,} {self.ITEM}"
                    + (f" ({100 * items / items_total:.0f}%)" if items_total else "")
                    + f", {done:,}" + (f" of {total:,}" if total else "") + f" {self.unit}")
            tail = f", {rate_text(rate)} {self.ITEM}/s"
            if rate > 0 and items < items_total:
                tail += f", ETA {duration_text((items_total - items) / rate)}"
            return head + tail
        rate = (done - before) / t if t > 0 else 0.0
        head = f"{self.phase_name}: {done:,}" + (f" of {total:,} {self.unit}" if total else f" {self.unit}")
        if total:
            head += f" ({100 * done / total:.0f}%)"
        tail = f", {rate_text(rate)} {self.unit}/s"
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

        unit = self.unit if self.items_total is None else self.ITEM

        class Rate(ProgressColumn):
            def render(self, task):  # noqa: D401
                s = task.finished_speed or task.speed
                return Text("" if s is None else f"{rate_text(s)} {unit}/s")

        from rich.progress import TimeRemainingColumn

        self._bar = Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(), Rate(),
                             TimeElapsedColumn(), TimeRemainingColumn(),
                             console=self._console or Console(stderr=True), transient=True)
        self._bar.start()
        # the rate counts this run's work: the bar starts at what was done before
        total, before = (self.total, self.before) if self.items_total is None else (self.items_total,
                                                                                  self.items_before)
        self._task = self._bar.add_task(self.phase_name, total=total, completed=before)
