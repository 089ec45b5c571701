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
