"""An ``mrt`` output read as an input: whole and finished, or refused.

A job's directory (local, or a prefix on object storage) records in its
manifest (:mod:`mrt_fast.datasets.manifest`) which parts are finished and
whether the job is done. Discovery (:func:`mrt_fast.datasets.sources.discover`)
hands every file it found here, so every reader (each command, each Python
API that takes a path) sees an output the same way:

* a file in the directory of an unfinished output refuses the input in one
  line naming the parts done; ``allow_partial`` (``--allow-partial``) reads
  the finished parts instead, with a :class:`~mrt_fast.errors.PartialOutputWarning`
  giving their parts and rows;
* only the part files the manifest records are read: one a killed run left
  unrecorded (a part object of a killed task, or a file renamed into place
  just before the kill) is not part of the output;
* an output read as a whole directory whose manifest records a part that is
  no longer there is refused, naming the part (never read short).
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

from mrt_fast.datasets import storage
from mrt_fast.datasets.manifest import MANIFEST, Manifest
from mrt_fast.errors import MrtInputError, PartialOutputWarning

__all__ = ["finished_parts"]

#: the name of a part file (local) or part object (object storage)
_PART = re.compile(r"^part-(\d{5})(-[0-9a-f]{32})?\.parquet$")


def _parent(f: Any) -> str:
    return str(f).rsplit("/", 1)[0] if storage.is_url(f) else str(Path(f).parent)


def finished_parts(source: str, files: list, root: Any = None, listed: list | None = None, *,
                   allow_partial: bool = False) -> list:
    """``files`` (found for the input ``source``, under ``root`` when it is a directory or a
    prefix) less the part files no manifest records; refused when one lies in an unfinished
    output (see the module doc). ``listed``: every object under the prefix the files were
    listed from (object storage), where the manifests are looked up (no request per folder)."""
    if not files:
        return files
    remote = storage.is_url(files[0])
    folders = sorted({_parent(f) for f in files})
    if remote:
        have = {str(o) for o in listed or []}
        outputs = [d for d in folders if storage.join(d, MANIFEST) in have]
    else:
        outputs = [d for d in folders if Manifest.exists(Path(d))]
    if not outputs:
        return files
    drop: set[str] = set()
    for d in outputs:
        man = Manifest.read(d if remote else Path(d))
        if man is None:
            continue
        whole = root is not None and str(root).rstrip("/") == d.rstrip("/")
        drop |= _unrecorded(man, d, [f for f in files if _parent(f) == d], remote, whole)
        _check_done(man, source if whole else d, allow_partial)
    return [f for f in files if str(f) not in drop]


def _unrecorded(man: Manifest, folder: str, files: list, remote: bool, whole: bool) -> set[str]:
    """The part files in ``folder`` the manifest does not record; a recorded part missing from a
    whole directory read is refused."""
    recorded = {n for n, rows in man.parts.items() if rows}
    names = {man.files.get(n, "") for n in recorded} if remote else recorded
    present = {Path(str(f)).name if not remote else str(f).rsplit("/", 1)[1] for f in files}
    if whole and man.done:
        missing = sorted(n for n in names if n not in present)
        if missing:
            raise MrtInputError(f"{folder!r} is an mrt output missing {len(missing)} of its recorded parts "
                                f"(the first {missing[0]!r}); rerun the job that writes it to redo them")
    out = set()
    for f in files:
        name = str(f).rsplit("/", 1)[1] if remote else Path(str(f)).name
        if _PART.match(name) and name not in names:
            out.add(str(f))
    return out


def _check_done(man: Manifest, where: str, allow_partial: bool) -> None:
    if man.done:
        return
    done = f"{len(man.parts)} of {man.n_parts} parts done"
    if not allow_partial:
        raise MrtInputError(f"{where!r} is an unfinished mrt output ({done}); rerun the job that writes it to "
                            "finish it, or pass --allow-partial (allow_partial=True) to read the parts done")
    warnings.warn(f"{where!r} is an unfinished mrt output: reading its {done} ({man.rows:,} rows)",
                  PartialOutputWarning, stacklevel=2)
