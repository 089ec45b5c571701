"""What wrote a file output: the record that gives a file the rerun rule of a directory.

A dataset directory carries its manifest; a file output (``.parquet``,
``.jsonl``, ``.csv``) cannot carry one, so the job that writes it leaves a
small hidden record beside it, ``.NAME.mrt.json``: the command, its
parameters, the input's fingerprint, the rows, and the file's size and
modification time. A rerun then follows the directory's rule:

* the same job (same parameters, same input) over a file it wrote and that
  nobody changed since: already complete, nothing to do;
* anything else over an existing file (other parameters, another input, a
  file changed since, or one no job wrote): refused in one line unless
  ``overwrite``, which replaces it.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from mrt_fast.errors import MrtInputError

__all__ = ["check_file_output", "read_record", "record_path", "remove_record", "write_record"]


def record_path(out: Path) -> Path:
    """The record of file output ``out``: ``.NAME.mrt.json`` beside it."""
    out = Path(out)
    return out.with_name(f".{out.name}.mrt.json")


def _stamp(out: Path) -> dict[str, int]:
    st = Path(out).stat()
    return {"size": int(st.st_size), "mtime_ns": int(st.st_mtime_ns)}


def read_record(out: Path) -> dict[str, Any] | None:
    """The record of ``out``, or None (none, or unreadable)."""
    try:
        return json.loads(record_path(out).read_text())
    except (OSError, ValueError):
        return None


def write_record(out: Path, command: str, parameters: dict, fingerprint: str, rows: int) -> None:
    """Record what wrote ``out`` (just written); a record that cannot be written is no failure of the job
    (a rerun then refuses the file as one no job wrote, unless ``overwrite``)."""
    from mrt_fast._util.files import write_text

    rec = {"command": command, "parameters": parameters, "fingerprint": fingerprint, "rows": int(rows),
           **_stamp(out)}
    with contextlib.suppress(OSError, MrtInputError):
        write_text(record_path(out), json.dumps(rec, sort_keys=True, default=str) + "\n")


def check_file_output(out: Path, parameters: dict, fingerprint: str, *, overwrite: bool,
                      command: str = "the job") -> tuple[str, int]:
    """``("new", 0)`` (no file, or ``overwrite``) or ``("done", rows)`` (the same job wrote it and it is
    unchanged); any other existing file is refused in one line."""
    out = Path(out)
    if not out.exists():
        with contextlib.suppress(OSError):
            record_path(out).unlink()  # a record of a file since removed
        return "new", 0
    if out.is_dir():
        return "new", 0  # the lock says a directory is not a file
    rec = read_record(out)
    same = (rec is not None and rec.get("fingerprint") == fingerprint
            and json.dumps(rec.get("parameters"), sort_keys=True, default=str)
            == json.dumps(parameters, sort_keys=True, default=str))
    if same and {k: rec.get(k) for k in ("size", "mtime_ns")} == _stamp(out):
        return "done", int(rec.get("rows", 0))
    if overwrite:
        return "new", 0
    if rec is None:
        why = "and was not written by an mrt job"
    elif same:
        why = "and was changed after the job that wrote it"
    elif rec.get("fingerprint") != fingerprint:
        why = f"written by {rec.get('command', 'another job')!r} from another input"
    else:
        why = f"written by {rec.get('command', 'another job')!r} with other parameters"
    raise MrtInputError(f"output {str(out)!r} exists, {why}; give --overwrite (overwrite=True) to replace it, "
                        "or write to another name")


def remove_record(out: Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(record_path(out))
