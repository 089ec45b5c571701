"""Selection: which K responses to keep per prompt.

`select` takes a table with one row per candidate and returns the kept rows;
`facility_location` is the NumPy-level entry to the facility-location core.
All per-pool work runs in the Rust core, in parallel over pools, without the GIL.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from typing import Any

import numpy as np
import polars as pl

from mrt_fast import _grades_core as core
from mrt_fast.selection.candidate_keys import checked_key
from mrt_fast.errors import MrtInputError
from mrt_fast.tables.hf import arrow_to_hf, hf_to_arrow, is_hf
from mrt_fast.tables.layouts import GROUPED, table_layout
from mrt_fast.tables.arrays import (
    columns_of,
    group,
    mode_labels,
    numeric,
    pool_keys,
    require,
    table_kind,
    take,
    to_polars,
)
from mrt_fast.tables.embedding_blocks import EmbeddingBlocks, embedding_blocks
from mrt_fast.errors import SmallPoolWarning
from mrt_fast.selection.report import SelectionReport
from mrt_fast.selection.options import DEFAULT_KERNEL, FACILITY_METHODS, SelectOptions
from mrt_fast.selection.mode_merge import DEFAULT_MAX_MODE_COSINE
from mrt_fast.selection.facility import dense_limit_bytes
from mrt_fast.selection.table_errors import said_of_table as _said_of_table
from mrt_fast.selection.content import (block_keys, content_keys, content_ordered, duplicate_classes,
                                       repeated_in_pools, table_content_keys, text_keys)
from mrt_fast.selection.dedup import near_duplicate_mask


def found_modes(df: pl.DataFrame, g, by: str, embedding: str, seed: int, n_modes: int | None = None,
                max_mode_cosine: float = DEFAULT_MAX_MODE_COSINE) -> np.ndarray:
    """Mode labels of every row of `df` (grouped by `g`) by the k-means policy of `modes`
    (stratified with no mode column)."""
    from mrt_fast.selection.modes import labelled_modes, renumber

    found = labelled_modes(df, g, by, embedding, seed=seed, n_modes=n_modes, max_mode_cosine=max_mode_cosine)
    if found.content_rank is None:  # an embedding is not finite: the core named it already
        return np.ascontiguousarray(found.labels)
    # strata numbered in content order, not row order: the allocation's ties then follow the data
    return np.ascontiguousarray(renumber(found.labels, found.groups, found.content_rank))


def one_mode_pools(modes: np.ndarray, g) -> int:
    """Pools whose candidates all carry one mode label."""
    lab = modes[g.rows.astype(np.int64)]
    at = g.offsets[:-1].astype(np.int64)
    return int(np.sum(np.minimum.reduceat(lab, at) == np.maximum.reduceat(lab, at))) if len(lab) else 0


def _dedup(table, kind, df, g, by, embedding, reward, mode, candidate_key, threshold, added_columns):
    """Remove near-duplicates inside each pool (see `dedup`): the table,
    its frame and groups without them, and how many were removed."""
    x = embedding_blocks(df, embedding)  # read where it lies; the core widens a pool at a time
    rew = numeric(df, reward, "reward") if reward in df.columns else None
    if rew is not None and not np.all(np.isfinite(rew)):
        return table, df, g, 0  # selection names the bad reward
    if candidate_key is not None:  # the key's order, already in g.rows
        order = np.empty(df.height, dtype=np.uint64)
        order[g.rows.astype(np.int64)] = np.arange(df.height, dtype=np.uint64)
    else:
        if not x.all_finite():
            return table, df, g, 0  # selection names the bad embedding
        order = block_keys(x, rewards=rew)
    # candidates equal in embedding and reward: their content (every column) orders them
    content = None if candidate_key is not None else table_content_keys(table, kind, (embedding, mode),
                                                                           added_columns, None)
    keep = near_duplicate_mask(x, g.offsets, g.rows, order, rew, threshold, content)
    n_removed = int((~keep).sum())
    if not n_removed:
        return table, df, g, 0
    idx = np.flatnonzero(keep).astype(np.uint64)
    table = take(table, kind, idx, {})
    df = df[pl.Series(idx)]
    return table, df, group(df, by, candidate_key), n_removed


def select(
    table: Any,
    k: int | str | None = None,
    method: str = "grades",
    *,
    by: str = "prompt_id",
    embedding: str = "embedding",
    reward: str = "reward",
    mode: str = "mode",
    alpha: float = 0.75,
    eps: float = 1e-6,
    k_max: int | None = None,
    kernel: str = DEFAULT_KERNEL,
    seed: int = 0,
    candidate_key: str | None = None,
    optimizer: str = "lazy",
    return_report: bool = False,
    layout: str = "auto",
    candidate_columns: list[str] | None = None,
    options: SelectOptions | None = None,
    text: str | None = None,
    dedup: float | None = None,
    n_modes: int | None = None,
    max_mode_cosine: float = DEFAULT_MAX_MODE_COSINE,
):
    """Keep K candidates per prompt.

    Parameters
    ----------
    table : polars.DataFrame | pyarrow.Table | pandas.DataFrame | datasets.Dataset
        One row per candidate response (or one per prompt: ``layout``). The
        result has the same type.
    k : int | str
        Candidates kept per pool (prompt), or the name of an integer column
        holding each pool's K (constant within a pool, >= 1; e.g. from
        `VarianceReport.allocate`). Pools with n <= K are kept whole and
        reported (a :class:`SmallPoolWarning` and ``report.n_small_pools``).
    method : str
        ``"random"`` (``"rkon"``), ``"top"`` (``"bkon"``), ``"diverse"``
        (``"dkon"``: facility location, alpha = 0), ``"grades"`` (``"dbkon"``:
        quality-weighted facility location) or ``"stratified"`` (by ``mode``).
    by, embedding, reward, mode : str
        Column names: the prompt id, the embedding (list/array of floats), the
        reward (numeric) and the mode label columns. Each distinct mode label is
        its own stratum; float labels must be whole numbers (1.5 is an error,
        never truncated into the stratum of 1).
    alpha, eps, k_max :
        GRADES quality weights ``q = eps + (r - min r)/(max r - min r + eps)``,
        weights ``q**alpha``; ``k_max`` keeps only the best ``k_max`` by quality
        as the ground set.
    kernel : "clip" | "shift"
        Cosine c mapped into [0, 1] as ``max(0, c)`` (default: unrelated
        candidates cover nothing of each other) or ``(1 + c)/2`` (the paper's
        code; see docs/guides/selection.md, "The kernel").
    seed : int
        Random draws are seeded per pool from ``(seed, prompt id)`` and each
        candidate's content (its embedding, reward and text): a pool's draw
        does not depend on other pools, sharding, threads or the order of its
        rows.
    candidate_key : str, optional
        A column ordering the candidates inside a pool before selection (e.g. a
        candidate index or the response text): ties and draws then follow the
        key instead of the content hash. The key must order each pool: a null
        or NaN key, or a value repeated within a pool on rows that differ in
        any column, is an `MrtInputError` naming the rows (-0.0 is 0.0).
        Without it, results do not depend on the row order either: ties go
        by quality, coverage and a content hash (see docs/guides/selection.md).
    text : str, optional
        A text column (e.g. the response): rows with the same text are
        duplicates, never kept twice while a distinct candidate is left (rows
        with the same embedding always are); the text also enters the content
        key.
    dedup : float, optional
        Near-duplicate removal inside each pool before selection: a candidate
        whose cosine with a better one (higher reward, then content key) is at
        least ``dedup`` is removed; ``report.n_near_duplicates_removed``
        counts them. Needs the embedding column.
    optimizer : "lazy" | "naive"
        Greedy variant for facility location; both return the same picks.
    n_modes, max_mode_cosine :
        Stratified without a ``mode`` column finds each pool's modes
        (:func:`mrt_fast.selection.modes.pool_modes`): ``n_modes`` per pool
        (default: the silhouette rule), modes whose directions are at a cosine
        above ``max_mode_cosine`` merged.
    return_report : bool
        Also return a :class:`SelectionReport`.
    layout : "auto" | "flat" | "grouped"
        ``flat``: one row per candidate. ``grouped``: one row per prompt, the
        candidates' values in list columns (``candidate_columns``, else every
        list column but ``by``); the result is grouped too: each prompt's kept
        values in pick order, with ``pick_rank``/``gain``/``weight`` lists.
        ``auto`` reads it from the columns: grouped when the embedding holds a
        list of vectors or the reward or mode column holds lists.
    options : SelectOptions, optional
        Every knob above at once (then give the table only): the object the
        dataset jobs, the Ray engine and ``mrt select`` share. The keywords
        build one; either way the options are checked once and every path
        (in memory, dataset jobs, Ray, ``mrt select``) reads the same object.

    A pool whose n x n similarity would exceed ``DENSE_LIMIT_BYTES`` (2 GiB;
    less inside :func:`~mrt_fast.selection.facility.dense_limit_within`, as
    batch jobs derive it from their memory limit) runs with similarity columns recomputed on demand. Bad input raises
    :class:`MrtInputError` with ``pool`` (the prompt id), ``column`` and ``row``
    set where known.

    Returns
    -------
    The same table type with only the kept rows (grouped by pool in order of
    first appearance, then by pick order), every input column intact, plus
    ``pick_rank`` (0-based order of selection within its pool), ``gain`` (the
    marginal gain, facility-location methods) and ``weight`` (stratified: the
    per-row weight that keeps the weighted estimate unbiased). Stratified
    selection that found the modes itself also adds them as the ``mode``
    column (before ``pick_rank``).
    """
    knobs = dict(by=by, embedding=embedding, reward=reward, mode=mode, alpha=alpha, eps=eps, k_max=k_max,
                 kernel=kernel, seed=seed, candidate_key=candidate_key, optimizer=optimizer, layout=layout,
                 candidate_columns=candidate_columns, text=text, dedup=dedup, n_modes=n_modes,
                 max_mode_cosine=max_mode_cosine)
    if options is None:
        if k is None:
            raise MrtInputError("k is required: an integer >= 1 or the name of a column holding each pool's K")
        options = SelectOptions(k=k, method=method, **knobs)
    else:
        if not isinstance(options, SelectOptions):
            raise MrtInputError(f"options must be a SelectOptions, got {type(options).__name__}")
        given = [n for n, v in {"k": k, "method": method, **knobs}.items() if not _is_default(n, v)]
        if given:
            raise MrtInputError(f"give either options=SelectOptions(...) or k, method and the keywords, not both "
                                f"(also given: {', '.join(given)})")
    return select_table(table, options, return_report=return_report)


#: the keyword defaults of `select`: those of `SelectOptions` (k: none)
_DEFAULTS = {"k": None, **{f.name: f.default for f in dataclasses.fields(SelectOptions) if f.name != "k"}}


def _is_default(name: str, value: Any) -> bool:
    d = _DEFAULTS[name]
    return value is d or (type(value) is type(d) and value == d)


def select_table(table: Any, opts: SelectOptions, *, return_report: bool = False,
                 added_columns: tuple[str, ...] = ()):
    """:func:`select` with its options made: the one path of every entry point.
    `added_columns`: columns the caller added to the user's table, left out when
    rows are compared (see `candidate_keys`)."""
    if is_hf(table):  # a datasets.Dataset: selected as its Arrow table, handed back as a Dataset
        res = select_table(hf_to_arrow(table), opts, return_report=return_report, added_columns=added_columns)
        return (arrow_to_hf(res[0]), res[1]) if return_report else arrow_to_hf(res)
    kind = table_kind(table)
    probes = {opts.embedding: 1, opts.reward: 0, opts.mode: 0}
    if table_layout(table, kind, probes, opts.layout) == GROUPED:
        from mrt_fast.selection.grouped import select_grouped

        return select_grouped(select_table, table, kind, opts, return_report=return_report)
    if isinstance(opts.k, str):  # a per-pool K column
        from mrt_fast.selection.per_pool_k import select_k_column

        return select_k_column(select_one_k, table, opts, return_report=return_report, added_columns=added_columns)
    return select_one_k(table, opts, return_report=return_report, added_columns=added_columns)


def _by_content(res: dict, g, x: EmbeddingBlocks, rew, text_key, params, kernel, content_of):
    """Facility location's picks `res` over the pools of `g`, with the pools where
    the row order could have decided a pick selected again with their rows equal in
    embedding, reward and text put in content order (`content_of`); the groups and
    the picks. Only a pool that set such a row aside as a repeat of a kept one, or
    kept two of them, can have had a pick decided by the row order."""
    if rew is not None and not np.all(np.isfinite(rew)):
        return g, res
    off = g.offsets.astype(np.int64)
    # a pool that set a repeat aside, or kept two candidates that may be equal
    # (in pool, reward, text and first coordinate): the row order may have decided there
    res_off = res["offsets"].astype(np.int64)
    pool_of_pick = np.repeat(np.arange(g.n_pools), np.diff(res_off))
    picked = g.rows[off[pool_of_pick] + res["indices"].astype(np.int64)].astype(np.int64)
    quick = pool_of_pick.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    quick ^= (x.column(picked) + np.float32(0.0)).view(np.uint32).astype(np.uint64)
    if rew is not None:
        quick ^= (rew[picked] + 0.0).view(np.uint64) * np.uint64(0x94D049BB133111EB)
    if text_key is not None:
        quick ^= text_key[picked] * np.uint64(0xD6E8FEB86659FD93)
    sq = np.sort(quick)
    repeated = sq[1:][sq[1:] == sq[:-1]]
    flagged = res["dup_skipped"] > 0
    if len(repeated):
        flagged[pool_of_pick[np.isin(quick, repeated)]] = True
    suspect = np.flatnonzero(flagged)
    if not len(suspect):
        return g, res
    sizes = np.diff(off)[suspect]
    pos = np.repeat(off[suspect], sizes) + (np.arange(int(sizes.sum())) - np.repeat(np.cumsum(sizes) - sizes, sizes))
    sub_off = np.zeros(len(suspect) + 1, dtype=np.uint64)
    np.cumsum(sizes, out=sub_off[1:])
    sub = type(g)(keys=g.keys.gather(suspect), offsets=sub_off, rows=g.rows[pos], identity=False)
    ordered = content_ordered(sub, x, rew, text_key, content_of)
    if ordered is sub:
        return g, res
    again = core.fl_batch(x.blocks, ordered.offsets, params, rows=ordered.rows, rewards=rew, kernel=kernel,
                          dense_limit=dense_limit_bytes(), text=text_key)
    rows = g.rows.copy()
    rows[pos] = ordered.rows
    g = type(g)(keys=g.keys, offsets=g.offsets, rows=rows, identity=False)
    # the picks of the suspect pools replaced by those made again
    old_off, new_sub = res["offsets"].astype(np.int64), again["offsets"].astype(np.int64)
    counts = np.diff(old_off)
    counts[suspect] = np.diff(new_sub)
    out_off = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=out_off[1:])
    keep_pool = np.ones(len(counts), dtype=bool)
    keep_pool[suspect] = False
    pool_old = np.repeat(np.arange(len(counts)), np.diff(old_off))
    kept = keep_pool[pool_old]
    at_old = out_off[pool_old[kept]] + (np.flatnonzero(kept) - old_off[pool_old[kept]])
    pool_new = np.repeat(np.arange(len(suspect)), np.diff(new_sub))
    at_new = out_off[suspect[pool_new]] + (np.arange(len(pool_new)) - new_sub[pool_new])
    out = dict(res)
    for name in ("indices", "gains"):
        a = np.empty(int(out_off[-1]), dtype=res[name].dtype)
        a[at_old] = res[name][kept]
        a[at_new] = again[name]
        out[name] = a
    out["offsets"] = out_off.astype(res["offsets"].dtype)
    for name in ("objective", "upper_bound", "ties", "zero_gain", "dup_skipped"):
        a = np.array(res[name], copy=True)
        a[suspect] = again[name]
        out[name] = a
    return g, out


def select_one_k(table: Any, opts: SelectOptions, *, return_report: bool, added_columns: tuple[str, ...] = ()):
    """`select` of a flat table with one integer K (``opts.k``)."""
    t0 = time.perf_counter()
    try:
        return _select(table, opts, t0, return_report=return_report, added_columns=added_columns)
    except (pl.exceptions.PolarsError, pl.exceptions.PanicException) as e:
        # a column polars cannot group, cast or key (an id or label of an unusable type)
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise MrtInputError(f"the table cannot be used for selection: {type(e).__name__}: {msg}") from None


def _select(table: Any, opts: SelectOptions, t0: float, *, return_report: bool, added_columns: tuple[str, ...]):
    k, m = opts.k, opts.method
    assert isinstance(k, int)
    by, embedding, reward, mode, text = opts.by, opts.embedding, opts.reward, opts.mode, opts.text
    alpha = 0.0 if m == "diverse" else opts.alpha
    eps, k_max, kernel, seed, optimizer = opts.eps, opts.k_max, opts.kernel, opts.seed, opts.optimizer
    candidate_key, dedup = opts.candidate_key, opts.dedup
    kind = table_kind(table)
    cols = columns_of(table, kind)
    require(cols, by, "prompt id")
    need = [by]
    find_modes = m == "stratified" and mode not in cols
    if m in FACILITY_METHODS or find_modes or dedup is not None:
        # stratified without a mode column finds the modes (k-means on the embeddings)
        require(cols, embedding, f"embedding{' (to find modes: no mode column)' if find_modes else ''}")
        need.append(embedding)
    elif embedding in cols:
        need.append(embedding)  # duplicates: the same embedding
    if m == "top" or (m == "grades" and (alpha > 0 or k_max is not None)):
        require(cols, reward, "reward")
        need.append(reward)
    elif reward in cols:
        need.append(reward)  # quality for ties, and part of the content key
    if m == "stratified" and not find_modes:
        need.append(mode)
    if candidate_key is not None:
        require(cols, candidate_key, "candidate key")
        need.append(candidate_key)
    if text is not None:
        require(cols, text, "text")
        need.append(text)
    df = to_polars(table, kind, list(dict.fromkeys(need)))
    if candidate_key is not None:
        df = checked_key(table, kind, df, by, candidate_key, added_columns)
    g = group(df, by, candidate_key)
    n_removed = 0
    if dedup is not None:
        table, df, g, n_removed = _dedup(table, kind, df, g, by, embedding, reward, mode, candidate_key, dedup,
                                             added_columns)
    text_key = text_keys(df, text) if text is not None else None
    rows = None if g.identity else g.rows
    sizes = g.sizes()
    small = sizes <= k

    extra: dict[str, np.ndarray] = {}
    found = None
    report = SelectionReport(
        method=m,
        k=k,
        n_pools=g.n_pools,
        n_candidates=df.height,
        n_kept=0,
        n_small_pools=int(small.sum()),
        small_pool_ids=g.keys.gather(np.flatnonzero(small)[:20].tolist()).to_list(),  # no numpy.ma
        n_near_duplicates_removed=n_removed,
    )
    try:
        content = dups = None
        if m not in FACILITY_METHODS:
            leave_out = (embedding, mode)  # mode labels name strata; relabelled, they draw the same
            once = [c for c in cols if cols.count(c) == 1]  # a repeated name is not read (nor refused) here
            full = to_polars(table, kind, [c for c in once if c not in added_columns and c not in leave_out])
            ck = content_keys(full, leave_out, text_key)
            dups = duplicate_classes(df, embedding, text_key, ck)
            if embedding in df.columns:
                # rows equal in every other column: the embedding tells them apart
                same = repeated_in_pools(g.offsets, ck[g.rows.astype(np.int64)])
                if same.any():
                    at = g.rows.astype(np.int64)[same]
                    ck = ck.copy()
                    ck[at] ^= core.content_keys(embedding_blocks(df, embedding).rows(at)) * np.uint64(0x9E3779B97F4A7C15)
            content = ck if candidate_key is None else None
        if m in FACILITY_METHODS:
            x = embedding_blocks(df, embedding)  # the column's chunks, read in place by the core
            rew = numeric(df, reward, "reward") if reward in df.columns else None
            params = core.FlParams(k, alpha=alpha, eps=eps, k_max=k_max, optimizer=optimizer)
            res = core.fl_batch(
                x.blocks, g.offsets, params, rows=rows, rewards=rew, kernel=kernel, dense_limit=dense_limit_bytes(),
                text=text_key, ordered=candidate_key is not None,
            )
            if candidate_key is None:
                # candidates equal in embedding, reward and text: their content (every column) orders them
                g, res = _by_content(res, g, x, rew, text_key, params, kernel, lambda r: table_content_keys(
                    table, kind, (embedding, mode), added_columns, None, r))
            extra["gain"] = res["gains"]
            report.objective = res["objective"]
            report.upper_bound = res["upper_bound"]
            report.n_tie_picks = int(res["ties"].sum())
            report.n_zero_gain_picks = int(res["zero_gain"].sum())
            report.n_duplicates_skipped = int(res["dup_skipped"].sum())
        elif m == "random":
            res = core.random_k(g.offsets, pool_keys(g.keys), k, seed, rows=rows, n_rows=df.height, content=content,
                                dups=dups)
        elif m == "top":
            rew = numeric(df, reward, "reward")
            res = core.top_k(g.offsets, rew, k, rows=rows, content=content, dups=dups)
        else:
            if find_modes:
                modes = found = found_modes(df, g, by, embedding, seed, opts.n_modes, opts.max_mode_cosine)
            else:
                modes = mode_labels(df, mode)
            res = core.stratified_k(g.offsets, modes, pool_keys(g.keys), k, seed, rows=rows, content=content,
                                    dups=dups)
            extra["weight"] = res["weights"]
            report.modes_missed = int(res["modes_missed"].sum())
            report.n_one_mode_pools = one_mode_pools(modes, g)
        if "dup_skipped" in res and m not in FACILITY_METHODS:
            report.n_duplicates_skipped = int(res["dup_skipped"].sum())
    except MrtInputError as e:
        columns = {"embeddings": embedding, "rewards": reward, "modes": mode}
        raise _said_of_table(e, g.keys, by, columns) from None

    out_off = res["offsets"].astype(np.int64)
    counts = np.diff(out_off)
    pool_of = np.repeat(np.arange(g.n_pools), counts)
    pos = g.offsets.astype(np.int64)[pool_of] + res["indices"].astype(np.int64)
    idx = g.rows[pos]
    rank = np.arange(len(idx), dtype=np.int64) - out_off[pool_of]
    extra = {"pick_rank": rank.astype(np.int32), **extra}
    if found is not None:  # the modes found, before what select adds (the strata of `weight`)
        extra = {mode: found[idx], **extra}
    out = take(table, kind, idx, extra)
    report.n_kept = int(len(idx))
    report.seconds = time.perf_counter() - t0
    if report.n_small_pools:
        warnings.warn(
            f"{report.n_small_pools} of {report.n_pools} pools have <= k = {k} candidates and were kept whole "
            f"(first: {report.small_pool_ids[:5]})",
            SmallPoolWarning,
            stacklevel=2,
        )
    return (out, report) if return_report else out


