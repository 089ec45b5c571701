"""Experiment (e): the same selector ranking with a discrete-token transformer.

Prompts are 4 tokens over a 64-token vocabulary (0..59 content, 60..62 mode
markers); a response is 6 tokens from a deterministic three-mode conditional:
mode m (uniform) emits the marker 60 + m and then copies the prompt rotated by
m (y_t = x_{(t - 1 + m) mod 4}). The reward prefers mode 0 (1.0, 0.5, 0.25), so
top-K keeps only mode 0. A 2-layer causal transformer (d = 32) is trained with
AdamW on the K responses each selector keeps per prompt (per-prompt averaged
loss, the same number of optimizer steps for every K); all selector x K cells
train at once as one batched model. Test NLL is the cross-entropy of the true
three-mode conditional on held-out prompts (its minimum is log 3).
"""

from __future__ import annotations

import math
import time
import warnings

import numpy as np
import polars as pl
import torch

from mrt_fast import select as _select
from mrt_fast.errors import SmallPoolWarning

VOCAB = 64
PROMPT_LEN = 4
RESP_LEN = 6
N_MODES = 3
MARKER = 60
CONTENT = 60
MODE_REWARD = (1.0, 0.5, 0.25)


def responses_for(x: torch.Tensor, mode: torch.Tensor) -> torch.Tensor:
    """The deterministic response of each mode: x [..., 4], mode [...] -> [..., 6]."""
    t = torch.arange(RESP_LEN - 1)
    idx = (t + mode[..., None]) % PROMPT_LEN
    body = torch.gather(x, -1, idx)
    return torch.cat([(MARKER + mode)[..., None], body], dim=-1)


def _init(seeds, d: int, layers: int, ff: int, ctx: int) -> dict[str, torch.Tensor]:
    out: dict[str, list] = {}

    def add(name, shape, std, g):
        out.setdefault(name, []).append(torch.randn(*shape, generator=g) * std)

    for s in seeds:
        g = torch.Generator()
        g.manual_seed(int(s))
        add("tok", (VOCAB, d), 0.1, g)
        add("pos", (ctx, d), 0.1, g)
        for i in range(layers):
            add(f"qkv{i}", (d, 3 * d), 1 / math.sqrt(d), g)
            add(f"o{i}", (d, d), 1 / math.sqrt(d), g)
            add(f"f1{i}", (d, ff), 1 / math.sqrt(d), g)
            add(f"f2{i}", (ff, d), 1 / math.sqrt(ff), g)
        add("out", (d, VOCAB), 1 / math.sqrt(d), g)
    return {k: torch.stack(v) for k, v in out.items()}


def _ln(h):
    return torch.nn.functional.layer_norm(h, h.shape[-1:])


def _logits(p: dict[str, torch.Tensor], seq: torch.Tensor, layers: int, heads: int) -> torch.Tensor:
    """seq [S, B, T] -> logits [S, B, T, V] (causal)."""
    s, b, t = seq.shape
    d = p["tok"].shape[-1]
    h = torch.stack([p["tok"][i][seq[i]] for i in range(s)]) + p["pos"][:, None, :t]
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    for i in range(layers):
        q, k, v = torch.einsum("sbtd,sde->sbte", _ln(h), p[f"qkv{i}"]).split(d, dim=-1)
        q, k, v = (z.reshape(s, b, t, heads, d // heads).transpose(2, 3) for z in (q, k, v))
        att = torch.nn.functional.scaled_dot_product_attention(
            q.reshape(s * b, heads, t, -1), k.reshape(s * b, heads, t, -1), v.reshape(s * b, heads, t, -1),
            attn_mask=causal,
        ).reshape(s, b, heads, t, -1).transpose(2, 3).reshape(s, b, t, d)
        h = h + torch.einsum("sbtd,sde->sbte", att, p[f"o{i}"])
        f = torch.nn.functional.gelu(torch.einsum("sbtd,sdf->sbtf", _ln(h), p[f"f1{i}"]))
        h = h + torch.einsum("sbtf,sfd->sbtd", f, p[f"f2{i}"])
    return torch.einsum("sbtd,sdv->sbtv", _ln(h), p["out"])


def _seq_nll(p, x, y, layers, heads) -> torch.Tensor:
    """Sum over response tokens of -log p: x [S, B, 4], y [S, B, 6] -> [S, B]."""
    seq = torch.cat([x, y], dim=-1)
    lg = _logits(p, seq[..., :-1], layers, heads)[..., PROMPT_LEN - 1 :, :]
    lp = torch.log_softmax(lg, dim=-1)
    return -torch.gather(lp, -1, y[..., None])[..., 0].sum(-1)


def token_transformer(
    *,
    seed: int = 0,
    ks=(1, 2, 4),
    selectors=("random", "top", "grades", "stratified"),
    n_prompts: int = 96,
    n: int = 16,
    steps: int = 250,
    lr: float = 1e-2,
    weight_decay: float = 0.01,
    d: int = 32,
    layers: int = 2,
    heads: int = 2,
    test_prompts: int = 128,
) -> dict:
    """Test NLL of a small transformer trained on each selector's K-of-n data."""
    t0 = time.perf_counter()
    g = torch.Generator()
    g.manual_seed(50_000 + seed)
    x = torch.randint(0, CONTENT, (n_prompts, PROMPT_LEN), generator=g)
    mode = torch.randint(0, N_MODES, (n_prompts, n), generator=g)
    y = responses_for(x[:, None].expand(-1, n, -1), mode)  # [P, n, 6]
    onehot = torch.nn.functional.one_hot(y, VOCAB).float().reshape(n_prompts * n, -1) / math.sqrt(RESP_LEN)
    df = pl.DataFrame({
        "prompt_id": np.repeat(np.arange(n_prompts), n),
        "cand": np.tile(np.arange(n), n_prompts),
        "mode": mode.reshape(-1).numpy(),
        "reward": np.asarray(MODE_REWARD)[mode.reshape(-1).numpy()],
    }).with_columns(pl.Series("embedding", onehot.numpy(), dtype=pl.Array(pl.Float32, onehot.shape[1])))

    cells = [(s, int(k)) for s in selectors for k in ks]
    kmax = max(k for _, k in cells)
    xs = x[None, :, None].expand(len(cells), -1, kmax, -1).clone()
    ys = torch.zeros(len(cells), n_prompts, kmax, RESP_LEN, dtype=torch.long)
    w = torch.zeros(len(cells), n_prompts, kmax)
    kept_modes = {}
    for c, (s, k) in enumerate(cells):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SmallPoolWarning)
            kept = _select(df, k, s, kernel="clip", seed=seed)
        pid = torch.tensor(kept["prompt_id"].to_numpy(), dtype=torch.long)
        cand = torch.tensor(kept["cand"].to_numpy(), dtype=torch.long)
        rank = torch.tensor(kept["pick_rank"].to_numpy(), dtype=torch.long)
        ys[c, pid, rank] = y[pid, cand]
        wt = kept["weight"].to_numpy() if "weight" in kept.columns else np.ones(kept.height)
        w[c, pid, rank] = torch.tensor(wt, dtype=torch.float32) / k
        kept_modes[f"{s}/K={k}"] = np.bincount(kept["mode"].to_numpy(), minlength=N_MODES).tolist()
    w = w / n_prompts  # per-prompt averaged loss
    flat = lambda z: z.reshape(len(cells), n_prompts * kmax, *z.shape[3:])  # noqa: E731

    params = _init([300 + seed] * len(cells), d, layers, 2 * d, PROMPT_LEN + RESP_LEN)
    for p in params.values():
        p.requires_grad_(True)
    opt = torch.optim.AdamW(list(params.values()), lr=lr, weight_decay=weight_decay)
    xf, yf, wf = flat(xs), flat(ys), flat(w)
    for _ in range(int(steps)):
        opt.zero_grad(set_to_none=True)
        loss = (_seq_nll(params, xf, yf, layers, heads) * wf).sum()
        loss.backward()
        opt.step()

    gt = torch.Generator()
    gt.manual_seed(60_000 + seed)
    xt = torch.randint(0, CONTENT, (test_prompts, PROMPT_LEN), generator=gt)
    with torch.no_grad():
        per_mode = []
        for m in range(N_MODES):
            yt = responses_for(xt, torch.full((test_prompts,), m))
            per_mode.append(_seq_nll(params, xt[None].expand(len(cells), -1, -1), yt[None].expand(len(cells), -1, -1),
                                     layers, heads).mean(1))
        test = torch.stack(per_mode, 1).mean(1)  # [cells]
    table = {s: {} for s in selectors}
    for c, (s, k) in enumerate(cells):
        table[s][k] = float(test[c])
    return {
        "ks": [int(k) for k in ks], "selectors": list(selectors), "n": n, "n_prompts": n_prompts,
        "steps": steps, "d": d, "layers": layers, "test_nll": table, "optimum": math.log(N_MODES),
        "kept_modes": kept_modes, "seconds": time.perf_counter() - t0,
    }
