"""Experiment (c) selector EMSE and the top-K pool-size sweep.

Per-response gradients of the MDN NLL with respect to all parameters are
factored exactly by the chain rule: for a fixed prompt x every response shares
the Jacobian J(x) = d out / d theta of the network head (15 x P), and the
gradient of response y is g(y) = J(x)^T v(y) with v(y) = d NLL / d out
(computed with torch.func.vmap(grad)). A selector's pool estimate is then
g_hat = J^T v_bar, and bias^2, Tr Cov and cosines are quadratic forms in
G = J J^T: the same numbers as with full P-dimensional gradients, at 15-dim cost.
"""

from __future__ import annotations

import time
import warnings

import numpy as np
import polars as pl
import torch
from torch.func import grad, jacrev, vmap

from mrt_fast import select as _select
from mrt_fast.errors import SmallPoolWarning
from mrt_fast.simulate import _data as D
from mrt_fast.simulate import _mdn as M

SELECTORS = ("random", "top", "diverse", "grades", "stratified")
EMBED_BANDWIDTH = 0.35
EMBED_SPACING = 0.25


def response_features(y: np.ndarray, bandwidth: float = EMBED_BANDWIDTH, spacing: float = EMBED_SPACING) -> np.ndarray:
    """Embed scalar responses as Gaussian bumps on a grid covering their range.

    The cosine between two such vectors is close to exp(-(y - y')^2 / (4 h^2)),
    a smooth kernel in y: responses of one mode (spread 0.1) are near 1 and
    responses 1.5 apart (neighbouring modes) near 0. A raw 1-d embedding [y]
    would be useless under cosine similarity (every cosine is +-1).
    """
    y = np.asarray(y, dtype=np.float64).ravel()
    if y.size == 0 or not np.all(np.isfinite(y)):
        raise ValueError("responses must be a non-empty finite array")
    lo = np.floor(y.min()) - 3 * bandwidth
    hi = np.ceil(y.max()) + 3 * bandwidth
    grid = np.arange(lo, hi + spacing, spacing)
    return np.exp(-0.5 * ((y[:, None] - grid[None, :]) / bandwidth) ** 2).astype(np.float32)


def _single(params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    if params["w1"].shape[0] != 1:
        raise ValueError("expected the parameters of one network")
    return {k: v[0].detach() for k, v in params.items()}


def _out_one(p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    return M.raw_output({k: v[None] for k, v in p.items()}, x[None, None])[0, 0]


def head_jacobian(params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """J(x) = d out / d theta for prompts x [N, D]: [N, 3C, P]."""
    p = _single(params)
    jac = vmap(jacrev(_out_one), in_dims=(None, 0))(p, x)
    n, o = x.shape[0], p["b3"].shape[0]
    return torch.cat([jac[k].reshape(n, o, -1) for k in p], dim=-1)


def output_grads(params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """v = d NLL(y) / d out per response: x [N, D], y [N, R] -> [N, R, 3C]."""
    with torch.no_grad():
        out = M.raw_output(params, x)[0]  # [N, 3C]

    def one(o, yy):
        return M.nll_from_output(o, yy[None])[0]

    per_resp = vmap(grad(one), in_dims=(None, 0))  # over responses
    return vmap(per_resp, in_dims=(0, 0))(out, y)  # over prompts


def param_grads(params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Direct per-response parameter gradients [N, R, P] (for checking the factorisation)."""
    p = _single(params)

    def loss(pp, xx, yy):
        return M.nll_from_output(_out_one(pp, xx), yy[None])[0]

    g = vmap(vmap(grad(loss), in_dims=(None, None, 0)), in_dims=(None, 0, 0))(p, x, y)
    n, r = y.shape
    return torch.cat([g[k].reshape(n, r, -1) for k in p], dim=-1)


def fit_reference_model(seed: int = 0, n_prompts: int = 256, k: int = 4, epochs: int = M.EPOCHS):
    """The network whose gradients the selectors estimate: an MDN trained on
    ``n_prompts`` x ``k`` responses from the true conditional."""
    g = D.generator(30_000 + seed)
    x = D.prompts((n_prompts,), g)
    y, _ = D.responses(x, k, g)
    params = M.init_params([200 + seed])
    M.train(params, x[None], y[None], epochs=epochs)
    return params


def _pool_table(x: torch.Tensor, y: torch.Tensor, mode: torch.Tensor, with_embedding: bool) -> pl.DataFrame:
    """One row per candidate of every (prompt, pool) pair; prompt_id = prompt * pools + pool."""
    n_prompt, n_pool, n = y.shape
    yy = y.reshape(-1).numpy().astype(np.float64)
    rew = D.reward(x[:, None], y).reshape(-1).numpy().astype(np.float64)
    cols = {
        "prompt_id": np.repeat(np.arange(n_prompt * n_pool, dtype=np.int64), n),
        "row": np.arange(yy.size, dtype=np.int64),
        "y": yy,
        "reward": rew,
        "mode": mode.reshape(-1).numpy().astype(np.int64),
    }
    df = pl.DataFrame(cols)
    if with_embedding:
        emb = response_features(yy)
        df = df.with_columns(pl.Series("embedding", emb, dtype=pl.Array(pl.Float32, emb.shape[1])))
    return df


def _pool_means(kept: pl.DataFrame, v_flat: torch.Tensor, n_pools_total: int, k: int) -> torch.Tensor:
    """Per-pool selector estimate v_bar = (1/K) sum_j w_j v_j (w = 1 unless stratified)."""
    rows = torch.from_numpy(kept["row"].to_numpy().copy())
    pool = torch.from_numpy(kept["prompt_id"].to_numpy().copy())
    w = torch.from_numpy(kept["weight"].to_numpy().copy()).to(v_flat.dtype) if "weight" in kept.columns else None
    vv = v_flat[rows]
    if w is not None:
        vv = vv * w[:, None]
    acc = torch.zeros(n_pools_total, v_flat.shape[1], dtype=v_flat.dtype)
    acc.index_add_(0, pool, vv)
    return acc / k


def _stats(vbar: torch.Tensor, v_target: torch.Tensor, gram: torch.Tensor) -> dict:
    """bias^2, Tr Cov, EMSE and cosine per prompt, in parameter space via G = J J^T.

    vbar [P, pools, O], v_target [P, O], gram [P, O, O].
    """
    m = vbar.mean(1)
    d = m - v_target
    bias2 = torch.einsum("po,poq,pq->p", d, gram, d)
    c = vbar - m[:, None]
    cov = torch.einsum("pso,psq->poq", c, c) / (vbar.shape[1] - 1)
    tr = torch.einsum("poq,pqo->p", gram, cov)
    mm = torch.einsum("po,poq,pq->p", m, gram, m)
    tt = torch.einsum("po,poq,pq->p", v_target, gram, v_target)
    mt = torch.einsum("po,poq,pq->p", m, gram, v_target)
    cos = mt / torch.sqrt(mm * tt).clamp_min(1e-30)
    return {
        "bias2": float(bias2.mean()),
        "trace_cov": float(tr.mean()),
        "emse": float((bias2 + tr).mean()),
        "cosine": float(cos.mean()),
        "cosine_per_prompt": cos.tolist(),
    }


def _setup(seed, n_prompts, target_responses, model):
    if model == "trained":
        params = fit_reference_model(seed)
    elif model == "untrained":
        params = M.init_params([200 + seed])
    else:
        raise ValueError(f"model must be 'trained' or 'untrained', got {model!r}")
    g = D.generator(40_000 + seed)
    x = D.prompts((n_prompts,), g)
    with torch.no_grad():
        jac = head_jacobian(params, x).double()
    gram = torch.einsum("noj,nqj->noq", jac, jac)
    yt, _ = D.responses(x, target_responses, g)
    v_target = output_grads(params, x, yt).double().mean(1)
    return params, x, gram, v_target, g


def _run_selectors(params, x, gram, v_target, g, k, n, pools, selectors, seed):
    n_prompts = x.shape[0]
    y, mode = D.responses(x[:, None].expand(n_prompts, pools, D.DIM), n, g)  # [P, pools, n]
    v = output_grads(params, x, y.reshape(n_prompts, -1)).double()  # [P, pools*n, O]
    v_flat = v.reshape(-1, v.shape[-1])
    need_emb = any(s in ("diverse", "grades") for s in selectors)
    df = _pool_table(x, y, mode, need_emb)
    out = {}
    for s in selectors:
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SmallPoolWarning)
            kept = _select(df, k, s, kernel="clip", seed=seed)
        vbar = _pool_means(kept, v_flat, n_prompts * pools, k).reshape(n_prompts, pools, -1)
        st = _stats(vbar, v_target, gram)
        st["reward_mode_fraction"] = float((kept["mode"] == D.REWARD_MODE).mean())
        st["select_seconds"] = time.perf_counter() - t0
        out[s] = st
    return out


def selector_emse(
    *,
    seed: int = 0,
    k: int = 4,
    n: int = 32,
    n_prompts: int = 30,
    pools: int = 200,
    target_responses: int = 500,
    selectors=SELECTORS,
    model: str = "untrained",
) -> dict:
    """Fig 1(c): bias^2 + Tr Cov of each selector's K-of-n gradient estimate.

    One polars table holds every candidate of every pool of every prompt
    (prompt_id = (prompt, pool) pair, embedding = `response_features(y)` under kernel="clip" (its cosines are already >= 0),
    reward = -(y - f(x))^2, mode = true mode); each selector is one
    `mrt_fast.select` call over all pools at once.
    """
    t0 = time.perf_counter()
    params, x, gram, v_target, g = _setup(seed, n_prompts, target_responses, model)
    res = _run_selectors(params, x, gram, v_target, g, k, n, pools, selectors, seed)
    return {
        "k": k, "n": n, "n_prompts": n_prompts, "pools": pools, "target_responses": target_responses,
        "model": model, "n_params": M.n_params(params),
        "embedding": f"Gaussian bumps on a grid, bandwidth {EMBED_BANDWIDTH}, spacing {EMBED_SPACING}",
        "selectors": res, "seconds": time.perf_counter() - t0,
    }


def topk_pool_sweep(
    *,
    seed: int = 0,
    k: int = 4,
    ns=(8, 16, 32, 64, 128),
    n_prompts: int = 30,
    pools: int = 200,
    target_responses: int = 500,
    model: str = "untrained",
) -> dict:
    """Top-K at fixed K over growing pools: its bias toward the reward mode grows with n
    (random-K alongside as the unbiased reference)."""
    t0 = time.perf_counter()
    params, x, gram, v_target, g = _setup(seed, n_prompts, target_responses, model)
    rows = []
    for n in ns:
        if n < k:
            raise ValueError(f"pool size n = {n} is smaller than K = {k}")
        r = _run_selectors(params, x, gram, v_target, g, k, int(n), pools, ("random", "top"), seed)
        rows.append({"n": int(n), "top": r["top"], "random": r["random"]})
    return {"k": k, "ns": [int(n) for n in ns], "model": model, "rows": rows, "seconds": time.perf_counter() - t0}
