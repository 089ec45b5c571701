"""Every error and warning class of mrt_fast.

* :class:`MrtInputError` (a ``ValueError``): the input (a table, an argument,
  a file) cannot be used; the Rust core raises the same class. The message is
  one line naming what is wrong; where it is known, the pool (its prompt id),
  the column and the row are also attributes, so code can act on them without
  parsing the message.
* :class:`MissingDependencyError` (an ``ImportError``): an optional extra or
  an outside tool this call needs is not installed. It is not an input error,
  so ``except ValueError`` around bad data never hides a broken install.
* :class:`MrtResourceError` (a ``RuntimeError``): the machine ran out of
  something the work needs (a full disk or quota, Ray's object store lost or
  full); neither the input's fault nor a bug, and no ``ValueError``. The
  message is one line saying what ran out, where, and that a rerun resumes.
* :data:`USER_ERRORS`: the classes above, which ``mrt`` commands show as one
  line (exit code 2); any other exception is a bug and shows its traceback.
* Signals of the dataset jobs: :class:`StoppedForTest` (a job's test hook
  stopped it), :class:`TransientTaskError` and :class:`InjectedFault` (a Ray
  task failure worth retrying), :class:`Irregular` (a chunk of vectors the
  zero-copy reader cannot take; the caller reads it another way).
* Warnings: :class:`SmallPoolWarning`, :class:`PartialOutputWarning`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["EmbeddingModelError", "InjectedFault", "Irregular", "MissingDependencyError", "MrtInputError",
           "MrtResourceError", "PartialOutputWarning", "SandboxUnavailableError", "SmallPoolWarning", "StoppedForTest",
           "TransientTaskError", "USER_ERRORS"]


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


class MrtResourceError(RuntimeError):
    """The machine ran out of something the work needs: a full disk or quota, Ray's object
    store lost or full. Not the input's fault, so not a ``ValueError``; the message is one
    line saying what ran out and where. ``path``: where it was writing, when known."""

    def __init__(self, message: str = "", *, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path

    def __reduce__(self):  # keep the attribute through pickle (Ray, multiprocessing)
        return (_rebuild_resource, (type(self), str(self), self.path))


def _rebuild_resource(cls, message, path):
    return cls(message, path=path)


#: the errors an ``mrt`` command shows as one line (exit code 2): the user's input, a missing
#: install, a machine out of room; any other exception is a bug and keeps its traceback
USER_ERRORS: tuple[type[BaseException], ...] = (MrtInputError, MissingDependencyError, MrtResourceError)


class StoppedForTest(RuntimeError):
    """A dataset job stopped by its test hook (``MRT_TEST_STOP_AFTER_PARTS``, as if killed after N parts)."""


class TransientTaskError(RuntimeError):
    """A Ray task failure worth retrying (Ray retries tasks that raise it)."""


class InjectedFault(TransientTaskError):
    """Raised once by the Ray engine's fault-injection hook (``MRT_RAY_FAULT_ONCE``)."""


class Irregular(Exception):
    """A chunk that is not float32 vectors of the expected length without nulls (the zero-copy
    vector reader refuses it; its caller reads the column another way)."""
