"""The similarity kernels of facility location and their default, defined once, in a module of no
imports: the command line reads the default without loading the selection area (polars, NumPy);
`mrt_fast.selection.options` names them for every selector."""

from __future__ import annotations

__all__ = ["DEFAULT_KERNEL", "KERNELS"]

#: how a cosine c becomes a similarity in [0, 1]: "clip" max(0, c), "shift" (1 + c)/2 (the paper's code)
KERNELS = ("clip", "shift")

#: the kernel of every selector and facility-location entry point unless one is given (docs/guides/selection.md,
#: "The kernel": unrelated candidates then cover nothing of each other)
DEFAULT_KERNEL = "clip"
