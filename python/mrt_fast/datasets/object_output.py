"""A job's dataset directory on object storage (``s3://bucket/prefix``).

Object storage has no rename, so a part is never written in place: part
``i`` is the object ``part-NNNNN-<checksum>.parquet``, named by its BLAKE2b
checksum (a retried task writes the same bytes under the same name), and it
belongs to the output only once the manifest (``.mrt/manifest.parquet``,
written after it) records it. A part object the manifest does not record,
left by a killed job, is ignored by readers (:mod:`mrt_fast.datasets.finished`)
and deleted when the job is resumed or overwritten. Resume checks each recorded
part's size against the listing (its name holds its checksum); the rest is
as in a local directory (:mod:`mrt_fast.datasets.manifest`).
"""

from __future__ import annotations

import io
import re
from typing import Any

import polars as pl

from mrt_fast.datasets import storage
from mrt_fast.datasets.formats import write_parquet
from mrt_fast.datasets.lock import META_DIR
from mrt_fast.datasets.manifest import (EMPTY_PART, MANIFEST, SPILL_FILE, Manifest, bytes_check, part_name,
                                        written_by_a_job)
from mrt_fast.errors import MrtInputError

__all__ = ["PART_OBJECT", "discard_unfinished", "find_part", "prepare_output", "put_part"]

#: the name of a part object: its index and its BLAKE2b-128 checksum
PART_OBJECT = re.compile(r"^part-(\d{5})-([0-9a-f]{32})\.parquet$")


def _names(url: str) -> dict[str, storage.ObjectPath]:
    """Every object under ``url``, by its name relative to it."""
    return {str(o.relative_to(url)): o for o in storage.list_files(url)}


def _ours(name: str) -> bool:
    """Whether a name under an output prefix is one a job writes."""
    top = name.split("/", 1)[0]
    return PART_OBJECT.match(name) is not None or written_by_a_job(top)


def put_part(df: pl.DataFrame, url: str, i: int) -> tuple[int, str | None, dict[str, Any]]:
    """Write part ``i`` of the output ``url`` under its own name: (rows, object name, check);
    a part of no rows has no object."""
    if not df.height:
        return 0, None, dict(EMPTY_PART)
    buf = io.BytesIO()
    write_parquet(df, buf)
    data = buf.getvalue()
    check = bytes_check(data)
    name = f"part-{i:05d}-{check['blake2b']}.parquet"
    storage.write_bytes(storage.join(url, name), data)
    return df.height, name, check


def find_part(url: str, i: int, rows: int) -> tuple[str | None, dict[str, Any]]:
    """The object of part ``i`` written by a task of another process (for the job to record):
    (name, check); an extra copy (a task retried with other bytes) is deleted."""
    if not rows:
        return None, dict(EMPTY_PART)
    prefix = f"part-{i:05d}-"
    found = sorted((o for o in storage.list_files(url, recursive=False)
                    if o.name.startswith(prefix) and PART_OBJECT.match(o.name)),
                   key=lambda o: o.stat().st_mtime_ns)
    if not found:
        raise MrtInputError(f"part {i} of {url!r} was reported written but no object {prefix}*.parquet is there")
    keep = found[-1]
    storage.delete(found[:-1])
    return keep.name, {"bytes": keep.stat().st_size, "blake2b": PART_OBJECT.match(keep.name)[2]}


def _verify(man: Manifest, url: str, names: dict[str, storage.ObjectPath]) -> list[str]:
    """Forget a recorded part whose object is missing or of another size; delete the part
    objects not recorded. Returns the names of the parts forgotten."""
    dropped = []
    for i in range(man.n_parts):
        pn = part_name(i)
        if pn not in man.parts or man.parts[pn] == 0:
            continue
        obj, want = names.get(man.files.get(pn, "")), man.checks.get(pn, {})
        if obj is None or obj.stat().st_size != want.get("bytes"):
            dropped.append(pn)
            man.parts.pop(pn, None)
            man.checks.pop(pn, None)
            man.files.pop(pn, None)
    keep = set(man.files.values())
    storage.delete([o for n, o in names.items() if PART_OBJECT.match(n) and n not in keep])
    return dropped


def prepare_output(url: str, parameters: dict[str, Any], fingerprint: str, *,
                   overwrite: bool) -> tuple[str, Manifest | None]:
    """:func:`mrt_fast.datasets.manifest.prepare_output` for an output on object storage
    (the caller holds its lock, :mod:`mrt_fast.datasets.object_lock`)."""
    names = _names(url)
    lock = f"{META_DIR}/lock"
    foreign = sorted(n for n in names if not _ours(n))
    ours = [n for n in names if _ours(n) and n != lock]
    if overwrite:
        man = Manifest.read(url)
        doomed, in_the_way = _what_the_job_wrote(names, man)
        if in_the_way:
            more = f" and {len(in_the_way) - 3} more" if len(in_the_way) > 3 else ""
            raise MrtInputError(f"--overwrite refuses {url!r}: it holds objects no mrt job wrote "
                                f"({', '.join(repr(n) for n in in_the_way[:3])}{more}: no manifest there records "
                                "them); nothing was deleted")
        if man is not None and man.done:  # a prefix left half-deleted is refused by readers, never read short
            man.done, man.finished = False, None
            man.write(url)
        _delete(url, doomed)
        return "new", None
    man = Manifest.read(url)
    if man is None:
        if foreign or ours:
            hint = "write to a new or empty prefix" if foreign else "use --overwrite to replace it"
            raise MrtInputError(f"output {url!r} is not empty and has no manifest ({MANIFEST}); {hint}")
        return "new", None
    why = man.same_job(parameters, fingerprint)
    if why is not None:
        raise MrtInputError(f"output {url!r} holds another job: {why}; use --overwrite to replace it")
    dropped = _verify(man, url, names)
    if man.done and not dropped:
        return "done", man
    man.done, man.finished = False, None
    man.write(url)
    return "resume", man


def _what_the_job_wrote(names: dict[str, storage.ObjectPath], man: Manifest | None) -> tuple[list[str], list[str]]:
    """What overwriting an output deletes (the part objects of the manifest's plan, recorded or
    left by a killed task, and the manifest) and what is in the way (anything else but the lock)."""
    recorded = set(man.files.values()) if man is not None else set()
    doomed, in_the_way = [], []
    for n in sorted(names):
        if n == f"{META_DIR}/lock":
            continue
        m = PART_OBJECT.match(n)
        spill = n.startswith("_spill/") and SPILL_FILE.match(n[len("_spill/"):]) is not None
        ok = n == MANIFEST or n in recorded or spill or (man is not None and m is not None and int(m[1]) < man.n_parts)
        (doomed if ok else in_the_way).append(n)
    return doomed, in_the_way


def _delete(url: str, names: list[str]) -> None:
    """Delete what a job wrote: the manifest last."""
    storage.delete([storage.join(url, n) for n in names if n != MANIFEST])
    if MANIFEST in names:
        storage.delete([storage.join(url, MANIFEST)])


def discard_unfinished(url: str) -> None:
    """Delete what a job wrote under ``url`` when no part was committed (bad input found
    before any part): the prefix is as it was before the job."""
    names = _names(url)
    if any(PART_OBJECT.match(n) for n in names):
        return
    _delete(url, [n for n in names if n == MANIFEST])
