"""The executors: what runs a job's parts, on this machine or on a Ray cluster.

A stage (:mod:`mrt_fast.datasets.stage`) says what a part becomes; a job
(:class:`mrt_fast.datasets.job.Job`) owns the input, the output, the lock, the
manifest and the progress display; an executor runs the parts:

* ``local`` (:mod:`mrt_fast.datasets.executors.local`): on this machine, in
  bounded memory, a few parts at once;
* ``ray`` (:mod:`mrt_fast.datasets.executors.ray`): on the workers of a Ray
  cluster (or a local Ray instance), which write the parts themselves.

Both give the same parts, byte for byte, and the same manifest, so a job one
started the other can finish. Each executor module serves the same names:
``run_row_parts(job, stage, ...)`` (a row stage on runs of consecutive rows),
``prepare_select(...)`` and ``run_select(job, report, ...)`` (the select
stage, through the bucket exchange of :mod:`mrt_fast.datasets.spill`). The
executors import the job, the stages and the exchange, never each other;
:func:`executor` picks one by name.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from mrt_fast.errors import MrtInputError

__all__ = ["ENGINES", "executor", "only_on", "run_row_parts"]

#: the executors, by the name ``engine=`` gives them
ENGINES = ("local", "ray")


def executor(engine: str) -> ModuleType:
    """The executor module of ``engine`` (``"local"`` or ``"ray"``); any other name is refused."""
    if engine == "local":
        from mrt_fast.datasets.executors import local

        return local
    if engine == "ray":
        from mrt_fast.datasets.executors import ray

        return ray
    raise MrtInputError(f"engine must be 'local' or 'ray', got {engine!r}")


def only_on(engine: str, wanted: str, given: dict[str, Any]) -> None:
    """Refuse, in one line, options of the ``wanted`` engine given (not None) to another:
    ``"ray_address and workers apply to engine='ray' only"`` (every name of ``given``)."""
    if engine != wanted and any(v is not None for v in given.values()):
        names = list(given)
        said = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
        raise MrtInputError(f"{said} appl{'ies' if len(names) == 1 else 'y'} to engine={wanted!r} only")


def run_row_parts(job: Any, stage: Any, *, engine: str = "local", rows_per_part: int, n_rows: int | None = None,
                  layout: str = "flat", workers: int | None = None, address: str | None = None,
                  items_total: int | None = None, on_total: Any = None) -> dict[str, Any]:
    """Run a row stage on the job's parts with the executor of ``engine`` (see
    ``run_row_parts`` of :mod:`~mrt_fast.datasets.executors.local` and
    :mod:`~mrt_fast.datasets.executors.ray`)."""
    return executor(engine).run_row_parts(job, stage, rows_per_part=rows_per_part, n_rows=n_rows, layout=layout,
                                          workers=workers, address=address, items_total=items_total,
                                          on_total=on_total)
