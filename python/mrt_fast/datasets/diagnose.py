"""`variance_budget` over a path or a Ray Dataset: the dataset side of the one `variance_budget`.

:func:`mrt_fast.variance.variance_budget` reads a table itself and hands a
path or a ``ray.data.Dataset`` to :func:`budget_of_source` (the root package
provides it as the hook ``"variance_budget.source"``). A path (a file, a
directory of Parquet/JSONL files, a finished ``mrt`` dataset directory, a
glob) is folded by the executor of ``engine`` (``variance_budget_files`` of
:mod:`mrt_fast.datasets.executors.local`: the prompt id and loss columns read
batch by batch by polars' streaming engine into a
:class:`~mrt_fast.variance.accumulator.VarianceAccumulator`, so memory grows
with the number of prompts, not of rows; of
:mod:`mrt_fast.datasets.executors.ray`: the blocks fold on Ray tasks and the
accumulators merge exactly); a ``ray.data.Dataset`` folds on Ray. The report
is the one `variance_budget` gives on the whole table.
"""

from __future__ import annotations

import os
from typing import Any

from mrt_fast.datasets import sources as _sources
from mrt_fast.errors import MrtInputError
from mrt_fast.variance.budget import variance_budget
from mrt_fast.variance.options import VarianceOptions

__all__ = ["budget_of_source", "variance_budget"]


def budget_of_source(data: Any, *, by: str, loss: str, layout: str, tokens: str | None, engine: str,
                     address: str | None, batch_rows: int, allow_partial: bool,
                     options: VarianceOptions):
    """`variance_budget` over a path (streamed; on Ray with ``engine="ray"``) or a
    ``ray.data.Dataset``; the arguments are those of `variance_budget`, checked there."""
    from mrt_fast.datasets.executors import executor

    if type(data).__module__.startswith("ray.data"):
        from mrt_fast.datasets.executors.ray_fold import variance_budget as on_ray

        return on_ray(data, by=by, loss=loss, layout=layout, **options.keywords())
    if not isinstance(data, (str, os.PathLike, _sources.Dataset)):
        raise MrtInputError("data must be a table (a polars DataFrame, a pyarrow Table, a pandas DataFrame or a "
                            f"datasets.Dataset), a path or a ray.data.Dataset, got {type(data).__name__}")
    return executor(engine).variance_budget_files(data, by=by, loss=loss, address=address, batch_rows=batch_rows,
                                                  tokens=tokens, allow_partial=allow_partial, layout=layout,
                                                  options=options)
