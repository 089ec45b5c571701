"""The one device rule: which torch device a model runs on.

``auto`` (or ``None``) is ``cuda`` when a CUDA device is present, else
``cpu``; ``cpu``, ``cuda``, ``cuda:N`` and ``mps`` are taken as asked, and one
that is not present is an :class:`MrtInputError`, never a silent fall back.
Every command with ``--device`` (embed, generate, score, nll, train, evaluate,
the advisor) goes through :func:`resolve_device`.
"""

from __future__ import annotations

import re

from mrt_fast.errors import MrtInputError

DEVICES = ("auto", "cpu", "cuda", "mps")


def cuda_available() -> bool:
    """Whether torch is installed and sees a CUDA device."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _torch_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def check_device(device: str | None) -> None:
    """Validate a device name for a model that runs on the CPU anyway (the static tier):
    no torch import for ``auto``/``cpu``; ``cuda`` still needs a CUDA device."""
    d = "auto" if device is None else str(device).strip().lower()
    if d not in ("auto", "cpu"):
        resolve_device(device)


def resolve_device(device: str | None) -> str:
    """``auto`` (or ``None``): ``cuda`` when a CUDA device is present, else ``cpu``.

    ``cuda``/``cuda:N`` without a CUDA device is an :class:`MrtInputError`, not
    a silent fall back to the CPU.
    """
    d = "auto" if device is None else str(device).strip().lower()
    if d == "auto":
        if not _torch_importable():
            return "cpu"
        return "cuda" if cuda_available() else "cpu"
    if d == "cpu":
        return "cpu"
    if re.fullmatch(r"cuda(:\d+)?", d):
        if not cuda_available():
            raise MrtInputError(f"device {device!r} asked for, but no CUDA device is available (use --device cpu or auto)")
        import torch

        if ":" in d and int(d.split(":")[1]) >= torch.cuda.device_count():
            raise MrtInputError(f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s) present")
        return d
    if d == "mps":
        try:
            import torch

            ok = bool(torch.backends.mps.is_available())
        except (ImportError, AttributeError):
            ok = False
        if not ok:
            raise MrtInputError(f"device {device!r} asked for, but no MPS device is available (use --device cpu or auto)")
        return d
    raise MrtInputError(f"device must be one of auto, cpu, cuda (or cuda:N), mps; got {device!r}")
