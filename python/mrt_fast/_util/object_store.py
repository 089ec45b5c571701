"""Ray's object store lost or full, said in one line as a :class:`~mrt_fast.errors.MrtResourceError`.

A node or worker that dies takes the objects it held with it (``ObjectLostError`` and its
kinds: the owner died, reconstruction failed, a fetch timed out); a store with no room left
refuses new objects (``ObjectStoreFullError``, ``OutOfDiskError`` when spilling finds no
disk); a worker short of memory is killed (``OutOfMemoryError``). None of these is the
input's fault. Ray is optional, so its errors are known here by their class names.
"""

from __future__ import annotations

from mrt_fast._util.messages import one_line
from mrt_fast.errors import MrtResourceError

#: Ray's error class (or a base of it) -> what ran out, said to the user
_KINDS = {
    "ObjectLostError": "Ray lost an object of this job (a node or worker holding it died)",
    "ObjectStoreFullError": "Ray's object store is full",
    "OutOfDiskError": "Ray's node has no disk space left to spill objects",
    "OutOfMemoryError": "a Ray worker ran out of memory and was killed",
}


def _ray_kind(e: BaseException) -> str | None:
    for c in type(e).__mro__:
        if c.__module__.startswith("ray.") and c.__name__ in _KINDS:
            return c.__name__
    return None


def object_store_error(e: BaseException | None) -> MrtResourceError | None:
    """The one-line resource error for Ray's object store lost or full anywhere in ``e``'s
    chain (its causes and the ``cause`` Ray's task errors hold), or None."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        kind = _ray_kind(e)
        if kind is not None:
            return MrtResourceError(f"{_KINDS[kind]} ({kind}: {one_line(e)[:300]}); give Ray more memory, "
                                    "disk or nodes, and rerun the same command")
        nxt = getattr(e, "cause", None)
        e = nxt if isinstance(nxt, BaseException) else (e.__cause__ or e.__context__)
    return None
