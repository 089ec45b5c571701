"""The manifest of a dataset written part by part: what job wrote it, from
which input, which parts are finished, and whether the job is done.

A dataset directory holds ``part-00000.parquet`` ... and ``_manifest.json``.
Each part is written under a temporary name and renamed into place, so a part
file that exists is complete; the manifest is rewritten the same way after
every part. A job is identified by its parameters and the fingerprint of its
input: re-running the same job finishes the missing parts, another job is
refused unless the directory is overwritten.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .errors import MrtInputError
from .io import atomic_write_bytes, remove_stale_temps

MANIFEST = "_manifest.json"
FORMAT = "mrt_fast.dataset/1"


def part_name(i: int) -> str:
    return f"part-{i:05d}.parquet"


def part_path(out_dir: Path, i: int) -> Path:
    return Path(out_dir) / part_name(i)


@dataclass
class Manifest:
    """``_manifest.json`` of a dataset directory."""

    command: str
    parameters: dict[str, Any]
    input: dict[str, Any]  # source, files, fingerprint
    n_parts: int
    parts: dict[str, int] = field(default_factory=dict)  # part file name -> rows
    done: bool = False
    layout: str = "rows"
    rows_per_part: int | None = None  # grouped layout: part i holds input rows [i * r, (i + 1) * r)
    format: str = FORMAT
    started: float = field(default_factory=time.time)
    finished: float | None = None

    # ---- files
    @staticmethod
    def path(out_dir: Path) -> Path:
        return Path(out_dir) / MANIFEST

    @classmethod
    def read(cls, out_dir: Path) -> "Manifest | None":
        """The manifest of ``out_dir`` (None when there is none)."""
        p = cls.path(out_dir)
        if not p.exists():
            return None
        try:
            d = json.loads(p.read_text())
            if d.get("format") != FORMAT:
                raise ValueError(f"unknown format {d.get('format')!r}")
            return cls(**d)
        except (ValueError, TypeError) as e:
            raise MrtInputError(f"{str(p)!r} is not a manifest this version can read: {e}") from None

    def write(self, out_dir: Path) -> None:
        atomic_write_bytes(self.path(out_dir), (json.dumps(asdict(self), indent=1, sort_keys=True) + "\n").encode())

    # ---- the job
    def same_job(self, parameters: dict[str, Any], fingerprint: str) -> str | None:
        """None when this manifest is of the job (parameters, input); else why not, in a few words."""
        if self.input.get("fingerprint") != fingerprint:
            return "the input changed since it was started (files, sizes or modification times differ)"
        diff = [f"{k}: {self.parameters.get(k)!r} -> {v!r}" for k, v in parameters.items()
                if self.parameters.get(k) != v]
        diff += [f"{k}: {v!r} -> absent" for k, v in self.parameters.items() if k not in parameters]
        if diff:
            return "its parameters differ (" + "; ".join(diff) + ")"
        return None

    def missing_parts(self, out_dir: Path) -> list[int]:
        """Parts not yet on disk (a part file on disk is complete: it was renamed into place)."""
        return [i for i in range(self.n_parts) if not part_path(out_dir, i).exists()]

    def record(self, i: int, rows: int) -> None:
        self.parts[part_name(i)] = int(rows)

    def reconcile(self, out_dir: Path) -> None:
        """Count parts present on disk but not recorded (a kill between a part's
        rename and the manifest's update)."""
        import pyarrow.parquet as pq

        for i in range(self.n_parts):
            name = part_name(i)
            p = part_path(out_dir, i)
            if name not in self.parts and p.exists():
                self.parts[name] = pq.ParquetFile(p).metadata.num_rows
            if name in self.parts and not p.exists():
                del self.parts[name]

    @property
    def rows(self) -> int:
        return sum(self.parts.values())


def prepare_output(out_dir: Path, parameters: dict[str, Any], fingerprint: str, *, overwrite: bool) -> tuple[str, Manifest | None]:
    """Decide what to do with a dataset directory before any work.

    Returns ``("new", None)`` (nothing there, or overwritten), ``("resume", m)``
    (an unfinished run of the same job) or ``("done", m)`` (the job is
    finished). Refuses another job's directory, or a non-empty directory
    without a manifest, unless ``overwrite``.
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise MrtInputError(f"output {str(out_dir)!r} exists and is not a directory")
    parent = out_dir.parent if str(out_dir.parent) else Path(".")
    if not parent.is_dir():
        raise MrtInputError(f"output directory {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK):
        raise MrtInputError(f"cannot write to {str(parent)!r} (permission denied)")
    if not out_dir.exists():
        return "new", None
    m = Manifest.read(out_dir)
    if overwrite:
        shutil.rmtree(out_dir)
        return "new", None
    if m is None:
        if any(out_dir.iterdir()):
            raise MrtInputError(
                f"output directory {str(out_dir)!r} is not empty and has no {MANIFEST}; use --overwrite to replace it"
            )
        return "new", None
    why = m.same_job(parameters, fingerprint)
    if why is not None:
        raise MrtInputError(f"output {str(out_dir)!r} holds another job: {why}; use --overwrite to replace it")
    if m.done:
        return "done", m
    remove_stale_temps(out_dir)
    m.reconcile(out_dir)
    return "resume", m
