"""Modes on an absolute scale: a lone candidate is no mode, and two modes whose
directions are closer than a cosine are one.

The silhouette rule is scale-free: a pool of lightly reworded copies of one
answer holds real, small sub-groups (the words each copy dropped), and the
rule sees them as modes however close they are. A partition it chooses is
therefore coarsened (:func:`coarsen`):

* a mode of a single distinct candidate is an outlier, not a variation of an
  answer (its silhouette is 0 by convention): it joins the mode whose
  direction is nearest;
* the direction of a mode is the normalised mean of its unit rows, and while
  two modes of a pool have directions at a cosine above ``max_mode_cosine``
  the closest two are merged (centroid linkage on the sphere).
  ``max_mode_cosine = 1`` merges nothing.

The default, 0.8, sits between what sentence embeddings give paraphrases and
distinct answers (docs/guides/modes.md has the measurements): rewordings that keep
most of an answer's words are at cosine 0.9 and more, distinct approaches to
one prompt (the MOSAIC examples) at a median of 0.6.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from mrt_fast.errors import MrtInputError

#: directions of two modes at a cosine above this make one mode
DEFAULT_MAX_MODE_COSINE = 0.8


def check_max_mode_cosine(value: Any) -> float:
    """``value`` as a float in [-1, 1], or one `MrtInputError` line."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not -1.0 <= float(value) <= 1.0:
        raise MrtInputError(f"max_mode_cosine must be a cosine in [-1, 1], got {value!r}")
    return float(value)


def merged_groups(sums: np.ndarray, max_cosine: float) -> np.ndarray:
    """For modes with row sums ``sums`` (m x d), the mode each is merged into
    (an index of ``sums``): the closest two directions are merged while their
    cosine exceeds ``max_cosine``; ties go to the lower index."""
    m = len(sums)
    into = np.arange(m)
    if m < 2 or max_cosine >= 1.0:
        return into
    s = np.array(sums, dtype=np.float64)
    alive = list(range(m))
    while len(alive) > 1:
        v = s[alive]
        nrm = np.linalg.norm(v, axis=1)
        u = v / np.where(nrm > 0, nrm, 1.0)[:, None]
        c = u @ u.T
        np.fill_diagonal(c, -np.inf)
        i, j = np.unravel_index(int(np.argmax(c)), c.shape)
        if not c[i, j] > max_cosine:
            break
        a, b = alive[min(i, j)], alive[max(i, j)]
        s[a] += s[b]
        into[into == b] = a
        alive.remove(b)
    return into


def merge_close_modes(unit: np.ndarray, labels: np.ndarray, pool_of: np.ndarray, max_cosine: float) -> np.ndarray:
    """``labels`` (a mode per row, numbered 0.. within each pool) with the
    modes of each pool whose directions are closer than ``max_cosine`` merged
    (see :func:`merged_groups`); ``unit`` holds the unit rows and ``pool_of``
    each row's pool (any integers). Merged modes keep the lower label."""
    labels = np.asarray(labels, dtype=np.int64)
    pool_of = np.asarray(pool_of, dtype=np.int64)
    if max_cosine >= 1.0 or len(labels) == 0:
        return labels.copy()
    # one group per (pool, mode); sums of unit rows per group
    gkey = np.stack([pool_of, labels], axis=1)
    groups, gid = np.unique(gkey, axis=0, return_inverse=True)
    gid = gid.ravel()
    order = np.argsort(gid, kind="stable")
    starts = np.flatnonzero(np.r_[True, np.diff(gid[order]) != 0])
    sums = np.add.reduceat(unit[order].astype(np.float64), starts, axis=0)
    out_label = groups[:, 1].copy()
    gpool = groups[:, 0]
    bounds = np.flatnonzero(np.r_[True, np.diff(gpool) != 0, True])
    for a, b in zip(bounds[:-1], bounds[1:]):
        if b - a < 2:
            continue
        into = merged_groups(sums[a:b], max_cosine)
        out_label[a:b] = groups[a:b, 1][into]
    return out_label[gid]


def absorb_singletons(unit: np.ndarray, labels: np.ndarray, pool_of: np.ndarray) -> np.ndarray:
    """``labels`` with every mode of a single row joined to the mode of its
    pool whose direction (from the modes of two rows or more) is nearest to
    that row; ties to the lower label. A pool with no such mode is one mode."""
    labels = np.asarray(labels, dtype=np.int64).copy()
    pool_of = np.asarray(pool_of, dtype=np.int64)
    d = pl.DataFrame({"p": pool_of, "l": labels, "i": np.arange(len(labels), dtype=np.int64)})
    d = d.with_columns(pl.len().over(["p", "l"]).alias("n"), pl.col("l").n_unique().over("p").alias("m"))
    lone = d.filter((pl.col("n") == 1) & (pl.col("m") > 1))
    if lone.height == 0:
        return labels
    for (p,), part in d.filter(pl.col("p").is_in(lone["p"].unique().implode())).group_by(["p"]):
        rows, lab, n = part["i"].to_numpy(), part["l"].to_numpy(), part["n"].to_numpy()
        kept = np.unique(lab[n > 1])
        single = rows[n == 1]
        if len(kept) == 0:
            labels[rows] = lab.min()
            continue
        c = np.stack([unit[rows[lab == v]].sum(axis=0) for v in kept]).astype(np.float64)
        c /= np.maximum(np.linalg.norm(c, axis=1, keepdims=True), 1e-300)
        labels[single] = kept[np.argmax(unit[single].astype(np.float64) @ c.T, axis=1)]
    return labels


def coarsen(unit: np.ndarray, labels: np.ndarray, pool_of: np.ndarray, max_cosine: float) -> np.ndarray:
    """The modes the silhouette rule chose (``labels``, per pool ``pool_of``),
    lone candidates absorbed (:func:`absorb_singletons`), then modes closer
    than ``max_cosine`` merged (:func:`merge_close_modes`)."""
    return merge_close_modes(unit, absorb_singletons(unit, labels, pool_of), pool_of, max_cosine)
