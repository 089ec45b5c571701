"""Plain NumPy references for the selection tests (deliberately naive)."""

import itertools

import numpy as np


def cosine_sim(x, kernel):
    x = np.asarray(x, dtype=np.float64)
    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    c = np.clip(xn @ xn.T, -1, 1)
    np.fill_diagonal(c, 1.0)
    return np.maximum(c, 0) if kernel == "clip" else (1 + c) / 2


def quality(r, eps=1e-6):
    r = np.asarray(r, dtype=np.float64)
    return eps + (r - r.min()) / (r.max() - r.min() + eps)


def F(S, w, sel):
    """F(S) = sum_i w_i max_{j in sel} w_j S_ij."""
    sel = list(sel)
    if not sel:
        return 0.0
    return float(np.sum(w * np.max(w[sel][None, :] * S[:, sel], axis=1)))


def naive_greedy(S, w, k):
    n = len(w)
    chosen, gains = [], []
    for _ in range(min(k, n)):
        base = F(S, w, chosen)
        g = np.array([-np.inf if j in chosen else F(S, w, chosen + [j]) - base for j in range(n)])
        j = int(np.argmax(g))  # first max: ties to the lower index
        chosen.append(j)
        gains.append(g[j])
    return chosen, gains


def brute_opt(S, w, k):
    n = len(w)
    return max(F(S, w, c) for c in itertools.combinations(range(n), min(k, n)))


# ---------------------------------------------------------------- fuzz references


def id_key(v):
    """A hashable key for an id value (text and numbers never equal; lists by their items)."""
    return (type(v) is str, tuple(v) if isinstance(v, list) else v)


def groups(ids):
    """Pools by id value, in order of first appearance: [(id, [row, ...]), ...]."""
    out = {}
    for i, v in enumerate(ids):
        out.setdefault(id_key(v), (v, []))[1].append(i)
    return list(out.values())


def unit_rows(x):
    """Rows scaled to unit norm in float64 (the scale of a row does not change its cosines)."""
    x = np.asarray(x, dtype=np.float64)
    m = np.max(np.abs(x), axis=1, keepdims=True)
    x = x / np.where(m > 0, m, 1.0)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def beyond_float32(x):
    """Rows whose squared norm leaves float32's normal range: the core may refuse them."""
    sq = np.sum(np.asarray(x, dtype=np.float64) ** 2, axis=1)
    return bool(((sq > 0) & ((sq < 1e-36) | (sq > 1e36))).any())


def weights(r, alpha, eps=1e-6):
    """GRADES weights q**alpha (1 without rewards)."""
    if r is None:
        return None
    return quality(r, eps) ** alpha


def marginal(S, w, chosen, j):
    return F(S, w, list(chosen) + [j]) - F(S, w, chosen)


def check_greedy(S, w, picks, gains, rtol=1e-4):
    """`picks` is a greedy sequence: every pick has the largest marginal gain
    (ties broken either way) and `gains` are those marginal gains."""
    n = len(w)
    scale = max(1.0, float(np.sum(w * w.max())))
    tol = rtol * scale
    assert len(set(picks)) == len(picks), picks
    chosen = []
    for j, g in zip(picks, gains):
        best = max(marginal(S, w, chosen, i) for i in range(n) if i not in chosen)
        mine = marginal(S, w, chosen, j)
        assert mine >= best - tol, (chosen, j, mine, best)
        assert abs(mine - g) <= tol, (chosen, j, mine, g)
        chosen.append(j)


def prompt_stats(ids, losses):
    """{(is_text, id): (count, mean, M2)} by two passes in float64."""
    acc = {}
    for v, x in zip(ids, losses):
        acc.setdefault(id_key(v), []).append(float(x))
    out = {}
    with np.errstate(all="ignore"):  # inf/NaN losses: the caller expects a refusal
        for key, xs in acc.items():
            a = np.asarray(xs)
            m = float(a.mean())
            out[key] = (len(a), m, float(np.sum((a - m) ** 2)))
    return out


def estimators(stats):
    """v_y_given_x and v_x_raw from per-prompt (count, mean, M2); None with fewer than 2 usable prompts."""
    u = [(n, m, m2) for n, m, m2 in stats.values() if n >= 2]
    if len(u) < 2:
        return None
    n = np.array([t[0] for t in u], dtype=float)
    mean = np.array([t[1] for t in u])
    s2 = np.array([t[2] for t in u]) / (n - 1)
    return {"v_y_given_x": float(s2.mean()), "v_x_raw": float(mean.var(ddof=1) - (s2 / n).mean())}


def weights_fit(r, alpha, eps, k):
    """Whether GRADES weights q**alpha of one pool leave float64 room for its
    gains (each a sum of at most m (k + 1) terms w_i w_j): "yes", "no" (the
    core refuses), or "edge" (within a factor 16 of a limit, or rewards
    whose quality the reference cannot compute)."""
    with np.errstate(all="ignore"):
        q = quality(r, eps)
        if not np.isfinite(q).all():
            return "edge"
        # in logs: q**alpha itself may overflow or underflow
        log_top = alpha * float(np.log(q.max()))
    m = len(q)
    log_terms = np.log(m * (min(k, m) + 1.0))
    hi = 2 * log_top + log_terms  # log of the largest possible sum
    lo = 2 * log_top  # log of w_max^2
    top, bottom, margin = np.log(np.finfo(np.float64).max), np.log(np.finfo(np.float64).tiny), np.log(16.0)
    if hi > top + margin or lo < bottom - margin:
        return "no"
    if hi > top - margin or lo < bottom + margin:
        return "edge"
    return "yes"


def adjusted_rand(a, b) -> float:
    """Adjusted Rand index of two labelings (1 for the same partition)."""
    _, ia = np.unique(a, return_inverse=True)
    _, ib = np.unique(b, return_inverse=True)
    c = np.zeros((ia.max() + 1, ib.max() + 1))
    np.add.at(c, (ia, ib), 1)
    pairs = lambda v: float((v * (v - 1) / 2).sum())  # noqa: E731
    sc, sa, sb, total = pairs(c), pairs(c.sum(1)), pairs(c.sum(0)), len(a) * (len(a) - 1) / 2
    expected = sa * sb / total
    den = 0.5 * (sa + sb) - expected
    return 1.0 if den == 0 else (sc - expected) / den
