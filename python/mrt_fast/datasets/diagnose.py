"""The one `variance_budget`: over a table, a path or a Ray Dataset.

:func:`variance_budget` dispatches on what it is given: a table (polars,
Arrow, pandas) goes to :func:`mrt_fast.variance.law.variance_budget`; a path
(a file, a directory of Parquet/JSONL files, a finished ``mrt`` dataset
directory, a glob) is folded by the executor of ``engine``
(``variance_budget_files`` of :mod:`mrt_fast.datasets.executors.local`: the
prompt id and loss columns read batch by batch by polars' streaming engine into a
:class:`~mrt_fast.variance.law.VarianceAccumulator`, so memory grows with the
number of prompts, not of rows; of :mod:`mrt_fast.datasets.executors.ray`: the
blocks fold on Ray tasks and the accumulators merge exactly); a
``ray.data.Dataset`` folds on Ray. The report is the one `variance_budget` gives on the whole table.
"""

from __future__ import annotations

import os
from typing import Any



from mrt_fast.datasets import sources as _sources
from mrt_fast.errors import MrtInputError


def variance_budget(
    data: Any,
    *,
    by: str = "prompt_id",
    loss: str = "loss",
    engine: str = "local",
    address: str | None = None,
    batch_rows: int = 1_000_000,
    tokens: str | None = None,
    allow_partial: bool = False,
    layout: str = "auto",
    **kwargs: Any,
):
    """`variance_budget` over ``data``: a table, a path (file, directory, glob;
    streamed) or a ``ray.data.Dataset`` (see the module doc). ``tokens``: a
    column of token counts; ``loss`` is then a sum of token log-probabilities
    (``mrt generate``'s ``logprob``) and the loss diagnosed is ``-loss / tokens``
    (a table or a path on the local engine). ``layout``: ``"auto"`` (grouped
    when the loss column holds lists), ``"flat"`` or ``"grouped"``. ``engine``
    (``"local"`` or ``"ray"``) and ``address`` (the Ray cluster) apply to a
    path; ``batch_rows`` to a path on the local engine. The other keywords are
    those of :func:`mrt_fast.variance.law.variance_budget` (costs, ``k_grid``,
    ``k_max``, ``budget``, ``n_prompts``, ``delta``, ``loss_bound``,
    ``n_boot``, ``seed``, ``ci_level``, ``bootstrap``, ``interval``). A flag
    that does not apply to ``data`` is refused in one line. An unfinished ``mrt`` output as
    ``data`` is refused unless ``allow_partial`` (its finished parts are read, with a warning)."""
    from mrt_fast.datasets.executors import executor

    executor(engine)
    if address is not None and engine != "ray":
        raise MrtInputError("address needs engine='ray'")
    if tokens is not None and (engine == "ray" or type(data).__module__.startswith("ray.data")):
        raise MrtInputError("tokens= (generation log-probabilities as the loss) runs on the local engine only")
    if type(data).__module__.startswith("ray.data"):
        from mrt_fast.datasets.executors.ray_fold import variance_budget as on_ray

        return on_ray(data, by=by, loss=loss, layout=layout, **kwargs)
    if isinstance(data, (str, os.PathLike, _sources.Dataset)):
        return executor(engine).variance_budget_files(data, by=by, loss=loss, address=address, batch_rows=batch_rows,
                                                      tokens=tokens, allow_partial=allow_partial, layout=layout,
                                                      **kwargs)
    if engine == "ray":
        raise MrtInputError("engine='ray' applies to a path; pass a ray.data.Dataset to fold a table on Ray")
    from mrt_fast.variance.law import variance_budget as in_memory

    return in_memory(data, by=by, loss=loss, tokens=tokens, layout=layout, **kwargs)
