"""Work an area hands to a higher area that it may not import.

The areas are layered: a lower one never imports a higher one
(``tests/test_layout.py``). Where a lower area's entry point takes input that
only a higher area can read (``mrt_fast.variance.variance_budget`` given a
path or a Ray Dataset, read by ``mrt_fast.datasets``), the root package
provides the hook, naming the function that does the work as
``"module:function"``, and the lower area calls :func:`handler`, which imports
that module on first use.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

_PROVIDED: dict[str, str] = {}


def provide(hook: str, target: str) -> None:
    """Let ``target`` (``"package.module:function"``) do the work of ``hook``."""
    module, sep, name = target.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"a hook's target is 'module:function', got {target!r}")
    _PROVIDED[hook] = target


def handler(hook: str) -> Callable[..., Any]:
    """The function provided for ``hook`` (its module imported now)."""
    try:
        target = _PROVIDED[hook]
    except KeyError:
        raise LookupError(f"nothing provides the hook {hook!r}") from None
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)
