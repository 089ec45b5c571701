"""Names of a package served on first use (PEP 562), so importing it costs only what is used."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(package: str, names: Mapping[str, str], namespace: dict[str, Any],
               submodules: tuple[str, ...] = ()) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: ``names`` maps each public name to the
    module that defines it; ``submodules`` are served as modules. A loaded name is stored in
    ``namespace`` (the package's globals), so it is looked up once."""

    def __getattr__(name: str) -> Any:
        if name in names:
            value = getattr(importlib.import_module(names[name]), name)
            namespace[name] = value
            return value
        if name in submodules:
            return importlib.import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(namespace.get("__all__", ())) | set(submodules))

    return __getattr__, __dir__
