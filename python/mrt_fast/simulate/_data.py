"""The controlled data-generating process of the paper's simulations.

x ~ N(0, I_5); y = sin(2 x_1) + 0.5 x_2 + offset_m + eps with offset_m in
{-1.5, 0, +1.5} chosen uniformly and eps ~ N(0, 0.01) (variance 0.01, so
standard deviation 0.1). Reward R = -(y - f(x))^2 with f the noiseless centre,
so the reward favours the middle mode.
"""

from __future__ import annotations

import torch

DIM = 5
OFFSETS = (-1.5, 0.0, 1.5)
NOISE_STD = 0.1  # eps ~ N(0, 0.01): variance 0.01
REWARD_MODE = 1  # index of the centre offset (0.0), the mode the reward favours


def generator(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(int(seed))
    return g


def centre(x: torch.Tensor) -> torch.Tensor:
    """f(x) = sin(2 x_1) + 0.5 x_2 (the noiseless centre), over the last axis."""
    return torch.sin(2.0 * x[..., 0]) + 0.5 * x[..., 1]


def prompts(shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """Prompts x ~ N(0, I_5) of shape ``shape + (5,)``."""
    return torch.randn(*shape, DIM, generator=gen)


def responses(x: torch.Tensor, k: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``k`` responses per prompt: returns (y, mode) of shape ``x.shape[:-1] + (k,)``."""
    shape = tuple(x.shape[:-1]) + (k,)
    mode = torch.randint(0, len(OFFSETS), shape, generator=gen)
    off = torch.tensor(OFFSETS, dtype=x.dtype)[mode]
    eps = NOISE_STD * torch.randn(*shape, generator=gen, dtype=x.dtype)
    return centre(x)[..., None] + off + eps, mode


def reward(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """R(x, y) = -(y - f(x))^2; ``y`` has one more trailing axis than ``x[..., 0]``."""
    return -((y - centre(x)[..., None]) ** 2)
