"""Closed forms of the selection theorems the simulations check (NumPy only).

* RKoN (random K of n): for i.i.d. candidates with covariance Sigma, the mean of a
  uniformly random K-subset is unbiased with covariance Sigma / K. Conditional on
  a fixed pool, it is unbiased for the pool mean with the finite-population
  correction: Cov = (S^2 / K) (1 - K / n), S^2 the pool covariance with the
  n - 1 denominator.
* Stratification (proportional, K_m = K p_m integral): Cov(strat) =
  (1/K) sum_m p_m Sigma_m and Cov(RKoN) - Cov(strat) = (1/K) sum_m p_m
  (mu_m - g)(mu_m - g)^T, the between-mode covariance over K.
* Orthogonal modes (g_m = g_0 + alpha u_m + xi, xi ~ N(0, sigma_w^2 I_d), u_m
  orthonormal, M uniform modes, K divisible by M):
  Tr Cov(RKoN) / Tr Cov(strat) = 1 + alpha^2 (1 - 1/M) / (d sigma_w^2).
"""

from __future__ import annotations

import numpy as np


def _check_k(k: int, n: int | None = None) -> None:
    if not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"K must be an integer >= 1, got {k!r}")
    if n is not None and k > n:
        raise ValueError(f"K = {k} exceeds the pool size n = {n}")


def rkon_covariance(sigma: np.ndarray, k: int) -> np.ndarray:
    """Cov of the RKoN mean over i.i.d. candidates with covariance ``sigma``: Sigma / K."""
    _check_k(k)
    return np.asarray(sigma, dtype=np.float64) / k


def rkon_pool_covariance(pool: np.ndarray, k: int) -> np.ndarray:
    """Cov of the mean of a uniform K-subset of a fixed pool [n, d] (finite-population correction)."""
    a = np.atleast_2d(np.asarray(pool, dtype=np.float64))
    n = a.shape[0]
    _check_k(k, n)
    if n < 2:
        return np.zeros((a.shape[1], a.shape[1]))
    s2 = np.cov(a, rowvar=False, ddof=1).reshape(a.shape[1], a.shape[1])
    return s2 / k * (1.0 - k / n)


def stratified_covariance(p: np.ndarray, sigmas: np.ndarray, k: int) -> np.ndarray:
    """(1/K) sum_m p_m Sigma_m for proportional stratification."""
    _check_k(k)
    p = _probs(p)
    return np.einsum("m,mij->ij", p, np.asarray(sigmas, dtype=np.float64)) / k


def between_mode_covariance(p: np.ndarray, mus: np.ndarray) -> np.ndarray:
    """sum_m p_m (mu_m - g)(mu_m - g)^T with g = sum_m p_m mu_m."""
    p = _probs(p)
    mus = np.asarray(mus, dtype=np.float64)
    c = mus - p @ mus
    return np.einsum("m,mi,mj->ij", p, c, c)


def orthogonal_modes_ratio(alpha: float, n_modes: int, dim: int, sigma_w: float) -> float:
    """Tr Cov(RKoN) / Tr Cov(strat) = 1 + alpha^2 (1 - 1/M) / (d sigma_w^2)."""
    if n_modes < 1 or dim < n_modes:
        raise ValueError(f"need 1 <= M <= d, got M = {n_modes}, d = {dim}")
    if sigma_w <= 0:
        raise ValueError(f"sigma_w must be > 0, got {sigma_w}")
    return 1.0 + alpha**2 * (1.0 - 1.0 / n_modes) / (dim * sigma_w**2)


def _probs(p) -> np.ndarray:
    p = np.asarray(p, dtype=np.float64)
    if p.ndim != 1 or np.any(p < 0) or not np.isclose(p.sum(), 1.0):
        raise ValueError("mode probabilities must be a 1-d non-negative vector summing to 1")
    return p
