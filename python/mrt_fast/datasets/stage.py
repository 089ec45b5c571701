"""The stage interface: what a job runs on its parts, whichever executor runs them.

A **row stage** maps one part of a job (a table of whole pools: a run of
consecutive input rows, or a bucket of pools) to its output rows. Select,
embed, nll, score and answers are row stages; the executors
(:mod:`mrt_fast.datasets.executors`) run them on this machine or on Ray.

A stage is a picklable object (an executor on other machines gets a copy) with

* ``name``: the stage's name on the progress display (``mrt embed``);
* ``loads``: what :meth:`RowStage.open` loads, said on the display before it
  (``"the model"``), or None;
* ``open(tick=None)``: run once per worker, before its first part and only
  when there is work; returns the **function of a part**. ``tick(n)``, when
  the executor gives one (the local executor gives its display's), is called
  as ``n`` more candidates are done.

The function of a part returns the output rows, or ``(rows, counts)``:
``counts`` maps what the stage counted (texts embedded, pools selected, ...)
to numbers, summed over the parts by the executor (:class:`Counts`) and
returned with its result, wherever the parts ran.

:func:`as_stage` takes a plain function of a part as a stage;
:class:`FromFactory` a factory (``factory()`` or ``factory(tick=)`` returns
the function of a part).
"""

from __future__ import annotations

import inspect
import threading
from typing import Any, Callable, Mapping

import polars as pl

__all__ = ["Counts", "FromFactory", "PartFunction", "RowStage", "as_stage", "split_result"]

#: what the function of a part returns: the rows, or the rows and what the stage counted
PartResult = Any


class RowStage:
    """A stage run on the parts of a job (see the module doc). Calling it is :meth:`open`."""

    name = "stage"
    #: what :meth:`open` loads, said on the progress display before it (None: nothing worth saying)
    loads: str | None = None

    def open(self, tick: Callable[[int], None] | None = None) -> Callable[[pl.DataFrame], PartResult]:
        """The function of a part (a model loaded here, once per worker)."""
        raise NotImplementedError  # pragma: no cover - an interface

    def __call__(self, tick: Callable[[int], None] | None = None) -> Callable[[pl.DataFrame], PartResult]:
        return self.open() if tick is None else self.open(tick)


class PartFunction(RowStage):
    """A function of a part as a stage: nothing to load, ``open()`` returns it."""

    def __init__(self, fn: Callable[[pl.DataFrame], PartResult], name: str = "stage"):
        self.fn, self.name = fn, name

    def open(self, tick: Callable[[int], None] | None = None) -> Callable[[pl.DataFrame], PartResult]:
        return self.fn


class FromFactory(RowStage):
    """A factory as a stage: ``factory()``, or ``factory(tick=tick)`` when it takes ``tick``
    and the executor gives one, returns the function of a part."""

    def __init__(self, factory: Callable[..., Callable[[pl.DataFrame], PartResult]], name: str = "stage",
                 loads: str | None = None):
        self.factory, self.name, self.loads = factory, name, loads

    @property
    def takes_tick(self) -> bool:
        """Whether the factory takes ``tick`` (the stage then ticks the display by candidates)."""
        try:
            return "tick" in inspect.signature(self.factory).parameters
        except (TypeError, ValueError):  # a callable without a signature: no ticks
            return False

    def open(self, tick: Callable[[int], None] | None = None) -> Callable[[pl.DataFrame], PartResult]:
        if tick is not None and self.takes_tick:
            return self.factory(tick=tick)
        return self.factory()


def as_stage(stage: Any) -> RowStage:
    """``stage`` if it is a :class:`RowStage`, else a function of a part taken as one."""
    return stage if isinstance(stage, RowStage) else PartFunction(stage)


def split_result(res: PartResult) -> tuple[pl.DataFrame, Mapping[str, Any] | None]:
    """The rows and the counts (or None) of what a function of a part returned."""
    if isinstance(res, tuple):
        return res[0], res[1]
    return res, None


class Counts:
    """What a stage counted, summed over the parts (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.total: dict[str, Any] = {}

    def add(self, counts: Mapping[str, Any] | None) -> None:
        if not counts:
            return
        with self._lock:
            for k, v in counts.items():
                self.total[k] = self.total.get(k, 0) + v
