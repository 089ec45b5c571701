"""A mixture-density network, batched over independent models.

Every parameter carries a leading "model" axis, so S networks (seeds, budget
cells, ...) train in one set of tensor ops. Adam is elementwise and the total
loss is a sum of per-model losses, so each model's trajectory is exactly what
it would be if it were trained alone; gradient clipping is done per model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from mrt_fast.simulate._data import DIM

HIDDEN = 64
COMPONENTS = 5
LR = 5e-3
EPOCHS = 400
CLIP = 5.0
#: component scale floor: sigma >= 0.1, the noise level of the data. Without it
#: full-batch training on <= 320 points drives sigma to 0 on training points and
#: test NLL is dominated by that overconfidence rather than by K.
LOG_SIGMA_MIN, LOG_SIGMA_MAX = math.log(0.1), 5.0

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def _layer_shapes(hidden: int, components: int, dim: int) -> list[tuple[str, tuple[int, ...], int]]:
    return [
        ("w1", (dim, hidden), dim), ("b1", (hidden,), dim),
        ("w2", (hidden, hidden), hidden), ("b2", (hidden,), hidden),
        ("w3", (hidden, 3 * components), hidden), ("b3", (3 * components,), hidden),
    ]


def init_params(seeds, hidden: int = HIDDEN, components: int = COMPONENTS, dim: int = DIM) -> dict[str, torch.Tensor]:
    """Parameters of ``len(seeds)`` networks, each initialised from its own seed
    (PyTorch's default Linear init, U(-1/sqrt(fan_in), 1/sqrt(fan_in)))."""
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise ValueError("seeds must not be empty")
    out: dict[str, list[torch.Tensor]] = {n: [] for n, _, _ in _layer_shapes(hidden, components, dim)}
    for s in seeds:
        g = torch.Generator()
        g.manual_seed(s)
        for name, shape, fan_in in _layer_shapes(hidden, components, dim):
            bound = 1.0 / math.sqrt(fan_in)
            out[name].append((torch.rand(*shape, generator=g) * 2 - 1) * bound)
    return {n: torch.stack(v) for n, v in out.items()}


def n_params(params: dict[str, torch.Tensor]) -> int:
    """Parameters of one network."""
    return sum(p[0].numel() for p in params.values())


def raw_output(params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """Raw head output [S, N, 3C] for prompts x of shape [S, N, D] (or [N, D], shared)."""
    if x.dim() == 2:
        x = x.expand(params["w1"].shape[0], *x.shape)
    h = torch.tanh(torch.einsum("snd,sdh->snh", x, params["w1"]) + params["b1"][:, None])
    h = torch.tanh(torch.einsum("snd,sdh->snh", h, params["w2"]) + params["b2"][:, None])
    return torch.einsum("snd,sdh->snh", h, params["w3"]) + params["b3"][:, None]


def nll_from_output(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Negative log-likelihood of responses ``y`` [..., R] under head output ``out`` [..., 3C]."""
    c = out.shape[-1] // 3
    logits, mu, log_sigma = out[..., :c], out[..., c : 2 * c], out[..., 2 * c :]
    log_sigma = log_sigma.clamp(LOG_SIGMA_MIN, LOG_SIGMA_MAX)
    logw = torch.log_softmax(logits, dim=-1)[..., None, :]
    z = (y[..., None] - mu[..., None, :]) * torch.exp(-log_sigma)[..., None, :]
    logp = logw - 0.5 * z * z - log_sigma[..., None, :] - _LOG_SQRT_2PI
    return -torch.logsumexp(logp, dim=-1)


def nll(params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-response NLL [S, N, R] of y [S, N, R] (or [N, R]) given x [S, N, D] (or [N, D])."""
    return nll_from_output(raw_output(params, x), y)


@dataclass
class TrainLog:
    final_loss: torch.Tensor  # [S] last training loss per model
    steps: int


def train(
    params: dict[str, torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    epochs: int = EPOCHS,
    lr: float = LR,
    clip: float = CLIP,
) -> TrainLog:
    """Full-batch Adam on every model at once (in place).

    x [S, N, D], y [S, N, R], mask [S, N, R] (1 where a response exists). Each
    model minimises the per-prompt-averaged NLL of its own data: the mean over
    its prompts of the mean over that prompt's responses.
    """
    if mask is None:
        mask = torch.ones_like(y)
    per_prompt = mask.sum(-1)
    if bool((per_prompt[mask.any(-1)] == 0).any()):
        raise ValueError("a prompt has no responses")
    prompt_w = torch.where(per_prompt > 0, 1.0 / per_prompt.clamp_min(1), torch.zeros_like(per_prompt))
    n_prompts = (per_prompt > 0).sum(-1).clamp_min(1)  # [S]
    weight = mask * prompt_w[..., None] / n_prompts[:, None, None]
    for p in params.values():
        p.requires_grad_(True)
    opt = torch.optim.Adam(list(params.values()), lr=lr)
    last = None
    for _ in range(int(epochs)):
        opt.zero_grad(set_to_none=True)
        per_model = (nll(params, x, y) * weight).sum(dim=(1, 2))  # [S]
        per_model.sum().backward()
        with torch.no_grad():
            sq = sum(p.grad.pow(2).flatten(1).sum(1) for p in params.values())
            scale = (clip / (sq.sqrt() + 1e-6)).clamp(max=1.0)
            for p in params.values():
                p.grad.mul_(scale.view(-1, *([1] * (p.dim() - 1))))
        opt.step()
        last = per_model.detach()
    for p in params.values():
        p.requires_grad_(False)
    return TrainLog(final_loss=last, steps=int(epochs))
