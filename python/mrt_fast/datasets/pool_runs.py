"""Inputs whose pools already lie in consecutive rows, cut into parts without an exchange.

Generation writes a prompt's responses one after another (vLLM's ``n``
samples, a pipeline that explodes a list of responses): every pool is then
one run of consecutive rows. Such an input needs no bucket exchange
(:mod:`mrt_fast.datasets.spill`) to bring a pool together: any cut between
two runs leaves every pool whole, so a job that does not fit in memory can
read parts of consecutive rows in place and select them as they are.

:func:`consecutive_pools` reads only the prompt id column, batch by batch,
and finds where each run starts; it gives up (returns None) at the first
batch in which one id starts two runs, or once an id is found to start two
runs anywhere, so a shuffled input costs one batch of ids.
:func:`cut_runs` cuts the runs into parts of about as many rows each, the
same cuts for the same input and part count (a resumed job finds its parts
again).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import polars as pl

if TYPE_CHECKING:  # pragma: no cover
    from mrt_fast.datasets.sources import Dataset

#: the layout a manifest records for a job whose parts are runs of consecutive pools
LAYOUT = "consecutive"
#: prompt ids read at a time
ID_BATCH_ROWS = 1 << 16


def consecutive_pools(ds: "Dataset", by: str, most_runs: int) -> np.ndarray | None:
    """The first row of every run of rows with one pool key in input order, then the row count,
    when every pool is one run (each key starts exactly one run); None when some pool is not,
    when an id is null, when the input is not Parquet (reading one column of a text format
    costs a whole read), or when more than ``most_runs`` runs would have to be held. Reading
    fails: None (the caller's ordinary path says why).

    Runs are runs of :func:`~mrt_fast.tables.arrays.pool_keys`: two ids of one key next to each
    other make one run, which a cut never splits, so every pool still lies whole in one part;
    an id with the key of another elsewhere makes a key start two runs, and the input is
    spilled. The ids are read by Arrow a batch at a time and its memory handed back after."""
    from mrt_fast._util.memory import release_unused
    from mrt_fast.datasets import storage
    from mrt_fast.datasets.arrow_runs import READ_OPTIONS
    from mrt_fast.tables.arrays import pool_keys

    if ds.fmt != "parquet" or ds.hive:
        return None
    import pyarrow.parquet as pq

    starts: list[np.ndarray] = []
    firsts: list[np.ndarray] = []
    n_runs = offset = 0
    last: int | None = None
    try:
        for f in ds.files:
            for batch in pq.ParquetFile(storage.open_input(f), **READ_OPTIONS).iter_batches(
                    batch_size=ID_BATCH_ROWS, columns=[by], use_threads=False):
                ids = batch.column(0)
                if len(ids) == 0:
                    continue
                if ids.null_count:
                    return None
                keys = pool_keys(pl.Series(by, ids))
                new = np.empty(len(keys), dtype=bool)
                new[0] = last is None or int(keys[0]) != last
                np.not_equal(keys[1:], keys[:-1], out=new[1:])
                at = np.flatnonzero(new)
                first = keys[at]
                if len(np.unique(first)) != len(first):
                    return None
                n_runs += len(at)
                if n_runs > most_runs:
                    return None
                starts.append(at + offset)
                firsts.append(first)
                offset += len(keys)
                last = int(keys[-1])
        if firsts and len(np.unique(np.concatenate(firsts))) != n_runs:
            return None
    except Exception:  # noqa: BLE001 - the ordinary path reads the input again and names what is wrong
        return None
    finally:
        release_unused()
    return np.concatenate([*starts, np.array([offset], dtype=np.int64)]).astype(np.int64)


def cut_runs(bounds: np.ndarray, n_parts: int) -> np.ndarray:
    """Cuts ``c`` (``n_parts + 1`` rows, from 0 to the row count) of the runs that start at
    ``bounds[:-1]`` (``bounds[-1]``: the row count): part ``i`` holds rows ``[c[i], c[i + 1])``,
    ending at the first run start at or after ``(i + 1) n / n_parts``. Every cut is a run
    start, so a run (a pool) lies whole in one part; a part is empty where one run spans
    several targets."""
    n = int(bounds[-1])
    p = max(1, int(n_parts))
    targets = (np.arange(1, p, dtype=np.float64) * n / p).astype(np.int64)
    at = np.searchsorted(bounds, targets, side="left")
    inner = bounds[np.minimum(at, len(bounds) - 1)]
    return np.concatenate([[0], inner, [n]]).astype(np.int64)
