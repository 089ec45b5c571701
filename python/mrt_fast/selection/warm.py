"""A method run once on a tiny table, so the memory it touches is resident before a job counts it.

The first selection in a process maps code of the libraries it calls (polars' hashing and
grouping, the core's k-means) and grows the heaps of the threads that run it; the memory
stays with the process. A job that plans within a limit calls :func:`warm_method` before it
measures what the process holds, so that memory is counted as held rather than found later
as a peak the plan did not expect: 20 to 30 MiB measured for random, top and stratified (rows
hashed and grouped by polars) and for near-duplicate removal. Facility location alone touches
little beyond what the plan's fixed cost per worker holds, and is not run.
"""

from __future__ import annotations

import warnings

import numpy as np
import polars as pl

from mrt_fast.selection.options import SelectOptions

#: pools and candidates of the tiny table (several pools per core thread, modes to find)
_POOLS, _PER_POOL, _DIM = 64, 24, 16


def warm_method(opts: SelectOptions, schema: pl.Schema) -> None:
    """Select with ``opts``' method and knobs (K, dedup, modes found or given) from a tiny table
    of the input's embedding dtype; nothing of it is kept. Nothing for facility location
    without ``dedup``."""
    from mrt_fast.selection.options import FACILITY_METHODS
    from mrt_fast.selection.select import select

    if opts.method in FACILITY_METHODS and opts.dedup is None:
        return

    rng = np.random.default_rng(0)
    n = _POOLS * _PER_POOL
    inner = schema.get(opts.embedding)
    dt = inner.inner if isinstance(inner, (pl.List, pl.Array)) and inner.inner in (pl.Float16, pl.Float32) \
        else pl.Float32  # type: ignore[union-attr]
    centres = rng.normal(size=(3, _DIM))
    x = centres[rng.integers(0, 3, n)] + 0.1 * rng.normal(size=(n, _DIM))
    cols = {"p": np.repeat(np.arange(_POOLS), _PER_POOL), "r": rng.normal(size=n),
            "e": pl.Series(x.astype(np.float32)).cast(pl.List(dt))}
    if opts.method == "stratified" and opts.mode in schema:
        cols["m"] = rng.integers(0, 3, n)
    k = opts.k if isinstance(opts.k, int) else 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        select(pl.DataFrame(cols), min(k, _PER_POOL), opts.method, by="p", embedding="e", reward="r", mode="m",
               dedup=opts.dedup, n_modes=opts.n_modes, seed=opts.seed)
