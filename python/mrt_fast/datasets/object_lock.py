"""The lock of a job whose output is on object storage.

Object storage has no ``flock``: the lock is an object, ``OUTPUT/.mrt/lock``
(``.NAME.mrt.lock`` beside a file output), created by a conditional write
(``If-None-Match: *``, :func:`mrt_fast.datasets.storage.put_if`) that only one
of any number of concurrent jobs wins; the others are refused in one line
naming the holder (pid, host, start). The holder deletes it at the end of the
job (only if it is still its own, ``If-Match``).

What holds: two jobs on the same output never both run, on any hosts, as long
as the store honours conditional writes (AWS S3 does, and so do recent
S3-compatible servers). A job killed without its ``finally`` (``kill -9``, a
lost machine) leaves its lock behind: a job on the same host takes it over
once the recorded pid is dead (again a conditional write, against the dead
holder's ETag: of two takers one wins); a lock of another host is refused
until it is deleted by hand, as the local lock of another host is.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Iterator

from mrt_fast._util.files import pid_alive
from mrt_fast.datasets import storage
from mrt_fast.datasets.lock import LOCK_NAME, META_DIR, _busy, _record
from mrt_fast.errors import MrtInputError

__all__ = ["lock_url", "object_lock", "take"]


def _holder(data: bytes) -> dict:
    try:
        d = json.loads(data.decode("utf-8", "replace") or "{}")
    except ValueError:
        d = {}
    return d if isinstance(d, dict) else {}


def take(url: str, what: str) -> str:
    """Take the lock object ``url``; its ETag (what releasing it compares)."""
    for _ in range(20):
        etag = storage.put_if(url, _record())
        if etag is not None:
            return etag
        got = storage.get(url)
        if got is None:  # released meanwhile
            continue
        holder = _holder(got[0])
        dead_here = holder.get("host") == socket.gethostname() and isinstance(holder.get("pid"), int) \
            and holder["pid"] != os.getpid() and not pid_alive(holder["pid"])
        if not dead_here:
            raise MrtInputError(_busy(what, url, holder, other_host=holder.get("host") != socket.gethostname()))
        etag = storage.put_if(url, _record(), etag=got[1])  # take over a dead holder's lock
        if etag is not None:
            return etag
    raise MrtInputError(f"cannot take the lock {url!r}: it keeps changing hands")


@contextlib.contextmanager
def object_lock(url: str, what: str) -> Iterator[str]:
    """Hold the lock object ``url`` for the block (see the module doc)."""
    etag = take(url, what)
    try:
        yield url
    finally:
        storage.delete_if(url, etag)


def lock_url(output: str, *, directory: bool) -> str:
    """Where the lock of an output on object storage lives: ``OUTPUT/.mrt/lock``, or
    ``.NAME.mrt.lock`` beside a file output."""
    if directory:
        return storage.join(output, META_DIR, LOCK_NAME)
    head, _, name = str(output).rstrip("/").rpartition("/")
    return f"{head}/.{name}.mrt.lock"
