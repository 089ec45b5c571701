"""Every error and warning class of mrt_fast.

* :class:`MrtInputError` (a ``ValueError``): the input (a table, an argument,
  a file) cannot be used; the Rust core raises the same class. The message is
  one line naming what is wrong; where it is known, the pool (its prompt id),
  the column and the row are also attributes, so code can act on them without
  parsing the message.
* :class:`MissingDependencyError` (an ``ImportError``): an optional extra or
  an outside tool this call needs is not installed. It is not an input error,
  so ``except ValueError`` around bad data never hides a broken install.
* Warnings: :class:`SmallPoolWarning`, :class:`PartialOutputWarning`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["EmbeddingModelError", "MissingDependencyError", "MrtInputError", "PartialOutputWarning",
           "SandboxUnavailableError", "SmallPoolWarning"]


class MrtInputError(ValueError):
    """A table, argument or file that mrt_fast cannot use; the message names it.

    Attributes ``pool`` (the prompt id of the pool, or the pool's index where
    the id is not known), ``column`` and ``row`` are ``None`` when they do not
    apply.
    """

    def __init__(self, message: str = "", *, pool: Any = None, column: str | None = None,
                 row: int | None = None) -> None:
        super().__init__(message)
        self.pool = pool
        self.column = column
        self.row = row

    def __reduce__(self):  # keep the attributes through pickle (Ray, multiprocessing)
        return (_rebuild, (type(self), str(self), self.pool, self.column, self.row))


def _rebuild(cls, message, pool, column, row):
    return cls(message, pool=pool, column=column, row=row)


class MissingDependencyError(ImportError):
    """An optional extra (``pip install 'mrt_fast[EXTRA]'``) or an outside tool is missing.

    The message is one line naming what is missing and how to install it.
    """


class SandboxUnavailableError(MissingDependencyError):
    """Generated code was about to run but no isolation layer (bubblewrap) can be used here.

    Raised before any program runs; the message says how to install bubblewrap or
    how to opt in to running generated code without isolation.
    """


class SmallPoolWarning(UserWarning):
    """Some pools had no more than K candidates and were kept whole."""


class PartialOutputWarning(UserWarning):
    """An unfinished ``mrt`` output was read as asked (``allow_partial``): only its finished parts."""


class EmbeddingModelError(MrtInputError):
    """The embedding model cannot be loaded (offline)."""
