"""Preference pairs: which two responses of a prompt make a (chosen, rejected) pair.

Every rule works on one pool's *candidates*: its distinct response texts (copies
of one text are one candidate whose reward is the mean of theirs, so no pair
ever holds the same text twice), in canonical order: reward descending, equal
rewards by text. The rules see nothing of the row order, so shuffled input
gives the same pairs. Every pair has chosen reward > rejected reward and a
margin (their difference) of at least ``min_margin``; rewards within 1e-9 of
the pool's largest absolute reward of each other are equal (rounding in a
mean never makes a pair).

* ``sweet-spot`` (default) — chosen: the best candidate; rejected: the
  candidate whose reward is nearest to mu - 2 sigma, mu and sigma being the
  mean and the population standard deviation (divisor n) of the rewards of
  the pool's rows (every copy counted). Equal distances go to the lower
  reward, then the text. Xiao et al., "Finding the Sweet Spot: Preference Data
  Construction for Scaling Preference Optimization", arXiv:2502.16825. With at
  most five rows mu - 2 sigma is at or below the lowest reward (Samuelson's
  inequality), so the rule is best against worst there.
* ``best-worst`` — best with worst, second best with second worst, ..., while
  the margin is at least ``min_margin``; each candidate in at most one pair.
* ``margin`` — the one pair with the largest reward margin per unit of
  embedding distance, margin / (d + 0.001) with d = 1 - cos(e_chosen,
  e_rejected) clipped to [0, 2]; equal scores go to the larger margin, then
  the texts. After DCRM's best-of-N^2 pairing (Huang and Goyal, "DCRM: A
  Heuristic to Measure Response Pair Quality in Preference Optimization",
  arXiv:2506.14157), which prefers large reward margins between responses that
  differ little; here the distance is the embeddings' cosine distance.
* ``diverse`` — after DivPO (Lanchantin et al., "Diverse Preference
  Optimization", arXiv:2501.18101): with q = ceil(n / 4) (n candidates),
  chosen is, of the q best, the one with the lowest mean cosine similarity to
  the other n - 1 candidates (the most diverse good response); rejected is, of
  the q worst, the one with the highest (the most typical bad response); equal
  values by canonical order.
* ``all`` — every pair with a margin of at least ``min_margin``, largest
  margins first (equal margins in canonical order of chosen, then rejected).

``max_pairs`` caps the pairs a prompt gives under ``best-worst`` and ``all``;
the other rules give at most one.
"""

from __future__ import annotations

import math

import numpy as np

from mrt_fast.errors import MrtInputError

__all__ = ["DEFAULT_RULE", "NEEDS_EMBEDDING", "RULES", "TIE_TOLERANCE", "check_pair_options", "pool_pairs",
           "tie_width"]

TIE_TOLERANCE = 1e-9
RULES = ("sweet-spot", "best-worst", "margin", "diverse", "all")
DEFAULT_RULE = "sweet-spot"
NEEDS_EMBEDDING = ("margin", "diverse")
DISTANCE_EPS = 1e-3


def check_pair_options(rule: str, min_margin: float, max_pairs: int | None) -> None:
    if rule not in RULES:
        raise MrtInputError(f"pairs must be one of {RULES}, got {rule!r}")
    if isinstance(min_margin, bool) or not isinstance(min_margin, (int, float)) or not min_margin >= 0 \
            or not math.isfinite(min_margin):
        raise MrtInputError(f"min_margin must be a finite number >= 0, got {min_margin!r}")
    if max_pairs is not None and (isinstance(max_pairs, bool) or not isinstance(max_pairs, int) or max_pairs < 1):
        raise MrtInputError(f"max_pairs must be an integer >= 1, got {max_pairs!r}")


def tie_width(r: np.ndarray) -> float:
    """Rewards of a pool closer than this are equal: 1e-9 of its largest absolute reward, so the
    rounding of a mean (copies of a text, the pool's mean) never decides a pair or a label."""
    return TIE_TOLERANCE * float(np.abs(r).max()) if len(r) else 0.0


def _ok(r: np.ndarray, i, j, min_margin: float):
    m = r[i] - r[j]
    return (m > tie_width(r)) & (m >= min_margin)


def best_worst(r: np.ndarray, min_margin: float, max_pairs: int | None) -> list[tuple[int, int]]:
    n = len(r)
    out = []
    for i in range(n // 2):  # the margins r[i] - r[n-1-i] only shrink: stop at the first too small
        if not _ok(r, i, n - 1 - i, min_margin) or (max_pairs is not None and len(out) == max_pairs):
            break
        out.append((i, n - 1 - i))
    return out


def sweet_spot(r: np.ndarray, mu: float, sigma: float, min_margin: float) -> list[tuple[int, int]]:
    j = np.flatnonzero(_ok(r, 0, np.arange(len(r)), min_margin))
    if not len(j):
        return []
    dist = np.abs(r[j] - (mu - 2.0 * sigma))
    best = np.lexsort((j, r[j], dist))[0]  # nearest, then the lower reward, then canonical order
    return [(0, int(j[best]))]


def _cosines(e: np.ndarray) -> np.ndarray:
    return np.clip(e @ e.T, -1.0, 1.0)


def margin_rule(r: np.ndarray, e: np.ndarray, min_margin: float) -> list[tuple[int, int]]:
    i, j = np.triu_indices(len(r), 1)
    keep = _ok(r, i, j, min_margin)
    i, j = i[keep], j[keep]
    if not len(i):
        return []
    m = r[i] - r[j]
    d = np.clip(1.0 - _cosines(e)[i, j], 0.0, 2.0)
    best = np.lexsort((j, i, -m, -(m / (d + DISTANCE_EPS))))[0]
    return [(int(i[best]), int(j[best]))]


def diverse(r: np.ndarray, e: np.ndarray, min_margin: float) -> list[tuple[int, int]]:
    n = len(r)
    q = math.ceil(n / 4)
    s = _cosines(e)
    mean_cos = (s.sum(axis=1) - np.diag(s)) / (n - 1)
    top, bottom = np.arange(q), np.arange(n - q, n)
    c = top[np.lexsort((top, mean_cos[top]))[0]]
    w = bottom[np.lexsort((bottom, -mean_cos[bottom]))[0]]
    return [(int(c), int(w))] if _ok(r, c, w, min_margin) else []


def all_pairs(r: np.ndarray, min_margin: float, max_pairs: int | None) -> list[tuple[int, int]]:
    i, j = np.triu_indices(len(r), 1)
    keep = _ok(r, i, j, min_margin)
    i, j = i[keep], j[keep]
    order = np.lexsort((j, i, -(r[i] - r[j])))[:max_pairs]
    return [(int(a), int(b)) for a, b in zip(i[order], j[order])]


def pool_pairs(rule: str, r: np.ndarray, *, embedding: np.ndarray | None = None, mu: float = 0.0,
               sigma: float = 0.0, min_margin: float = 0.0, max_pairs: int | None = None) -> list[tuple[int, int]]:
    """The (chosen, rejected) positions of one pool's candidates under ``rule``.

    ``r``: the candidates' rewards in canonical order (descending; equal rewards by text);
    ``embedding``: their unit-norm embeddings in the same order (``margin``, ``diverse``);
    ``mu``, ``sigma``: the mean and population standard deviation of the pool's row rewards
    (``sweet-spot``)."""
    if len(r) < 2:
        return []
    if rule == "best-worst":
        return best_worst(r, min_margin, max_pairs)
    if rule == "sweet-spot":
        return sweet_spot(r, mu, sigma, min_margin)
    if rule == "all":
        return all_pairs(r, min_margin, max_pairs)
    if embedding is None:
        raise MrtInputError(f"the {rule!r} pairing rule needs an embedding column")
    if rule == "margin":
        return margin_rule(r, embedding, min_margin)
    if rule == "diverse":
        return diverse(r, embedding, min_margin)
    raise MrtInputError(f"pairs must be one of {RULES}, got {rule!r}")
