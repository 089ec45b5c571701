"""The manifest of a dataset written part by part: what job wrote it, from
which input, which parts are finished, and whether the job is done.

A dataset directory holds ``part-00000.parquet`` ... and a hidden ``.mrt/``
folder with the job's metadata: ``.mrt/manifest.parquet`` (a Parquet file of
no rows, with the parts' schema, the manifest's JSON in its key-value
metadata) and, while a job runs, its lock ``.mrt/lock``. So the directory is
read as it stands by polars (``pl.scan_parquet(DIR)``: zero rows of the same
schema), Hugging Face datasets (hidden folders skipped), pyarrow.dataset and
every ``mrt`` command. A part no row went to is recorded with no file (a
zero-row part would stop Hugging Face datasets). Directories written with a
``_manifest.json`` (earlier versions) are read for resume and rewritten in
the new form. Each part is written under a temporary name and renamed into
place, so a part file that exists is complete; the manifest is rewritten the
same way after every part, recording each part's rows, byte size and BLAKE2b
checksum. A job
is identified by its parameters and the fingerprint of its input: re-running
the same job checks the recorded parts against the files and redoes those
missing or changed; another job is refused unless the directory is
overwritten, and overwriting deletes only what the manifest records as the
job's, never through a symbolic link (:func:`what_the_job_wrote`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mrt_fast.errors import MrtInputError
from mrt_fast._util.files import atomic_write_bytes, remove_stale_temps
from mrt_fast.datasets import storage
from mrt_fast.datasets.lock import LOCK_NAME, META_DIR

#: the manifest, inside the hidden metadata folder
MANIFEST = f"{META_DIR}/manifest.parquet"
#: the key of the manifest's JSON in the Parquet file's key-value metadata
MANIFEST_KEY = b"mrt_fast.manifest"
#: where earlier versions kept the manifest (read for resume, replaced on the next write)
OLD_MANIFEST = "_manifest.json"
FORMAT = "mrt_fast.dataset/2"
#: formats this version reads (``/1`` recorded no part sizes or checksums)
READ_FORMATS = ("mrt_fast.dataset/1", FORMAT)
#: what a job writes in its directory: parts, the metadata folder, the spill
#: folder, an earlier version's manifest and lock, and their temporary files
_WRITTEN = re.compile(rf"^(part-\d{{5}}\.parquet|{re.escape(META_DIR)}|_manifest\.json|_spill|_mrt\.lock"
                      rf"|\.(part-\d{{5}}\.parquet|_manifest\.json|_mrt\.lock)\..+\.tmp)$")


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
    checks: dict[str, dict[str, Any]] = field(default_factory=dict)  # part file name -> {bytes, blake2b}
    files: dict[str, str] = field(default_factory=dict)  # part name -> its object (object storage only)
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

    @staticmethod
    def exists(out_dir: Path) -> bool:
        """Whether ``out_dir`` holds a manifest (of this version or an earlier one)."""
        if storage.is_url(out_dir):
            return storage.ObjectPath(storage.join(out_dir, MANIFEST)).exists()
        return (Path(out_dir) / MANIFEST).exists() or (Path(out_dir) / OLD_MANIFEST).exists()

    @classmethod
    def read(cls, out_dir: Path) -> "Manifest | None":
        """The manifest of ``out_dir`` (None when there is none)."""
        remote = storage.is_url(out_dir)
        if remote:
            p, old = storage.join(out_dir, MANIFEST), None
            data = storage.read_bytes(p)
            if data is None:
                return None
        else:
            p, old = cls.path(out_dir), Path(out_dir) / OLD_MANIFEST
            if not p.exists() and not old.exists():
                return None
        try:
            if remote or p.exists():
                import pyarrow as pa
                import pyarrow.parquet as pq

                try:
                    meta = pq.read_schema(pa.BufferReader(data) if remote else p).metadata or {}
                except Exception as e:  # noqa: BLE001 - pyarrow's words, on one line
                    raise ValueError(str(e).splitlines()[0] if str(e) else type(e).__name__) from None
                if MANIFEST_KEY not in meta:
                    raise ValueError("it holds no manifest")
                d = json.loads(meta[MANIFEST_KEY])
            else:
                p = old
                d = json.loads(old.read_text())
            if not isinstance(d, dict) or d.get("format") not in READ_FORMATS:
                raise ValueError(f"unknown format {d.get('format') if isinstance(d, dict) else d!r}")
            d["format"] = FORMAT  # a /1 manifest is rewritten as /2 (its parts get checks when verified)
            params = d.get("parameters")
            if isinstance(params, dict) and params.get("layout") == "rows":
                params["layout"] = "flat"  # the flat layout's earlier name
            if d.get("layout") == "rows":
                d["layout"] = "flat"
            return cls(**d)
        except (ValueError, TypeError) as e:
            raise MrtInputError(f"{str(p)!r} is not a manifest this version can read: {e}") from None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    def write(self, out_dir: Path) -> None:
        """Write the manifest (atomically): a Parquet file of no rows with the
        schema of the parts written so far, the manifest's JSON in its metadata."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = self._schema(out_dir)
        meta = {**(schema.metadata or {}), MANIFEST_KEY: self.to_json().encode()}
        sink = pa.BufferOutputStream()
        pq.write_table(pa.Table.from_batches([], schema=schema).replace_schema_metadata(meta), sink)
        if storage.is_url(out_dir):
            storage.write_bytes(storage.join(out_dir, MANIFEST), sink.getvalue().to_pybytes())
            return
        out_dir = Path(out_dir)
        (out_dir / META_DIR).mkdir(exist_ok=True)
        atomic_write_bytes(self.path(out_dir), sink.getvalue().to_pybytes())
        (out_dir / OLD_MANIFEST).unlink(missing_ok=True)

    def note_schema(self, schema) -> None:
        """The schema of a part committed with no rows (an Arrow schema): the manifest's schema
        while no part on disk gives one, so an output whose every part is empty still reads as
        zero rows of its columns."""
        self.__dict__.setdefault("_empty_schema", schema)

    def _schema(self, out_dir: Path):
        """The parts' schema (that of the first part on disk; else that of an empty part
        committed, :meth:`note_schema`; no columns before any part)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        cached = self.__dict__.get("_part_schema")
        if cached is not None:
            return cached
        remote = storage.is_url(out_dir)
        for name in sorted(self.parts):
            f = storage.ObjectPath(storage.join(out_dir, self.files.get(name, ""))) if remote else Path(out_dir) / name
            if self.parts[name] > 0 and (name in self.files if remote else f.exists()):
                try:
                    sch = pq.read_schema(storage.open_input(f))
                except Exception:  # noqa: BLE001 - a damaged part is redone; it gives no schema
                    continue
                self.__dict__["_part_schema"] = sch
                return sch
        return self.__dict__.get("_empty_schema", pa.schema([]))

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

    def missing_parts(self, out_dir: Path | None = None) -> list[int]:
        """Parts not recorded as finished (after :meth:`verify`, those not on disk as recorded)."""
        return [i for i in range(self.n_parts) if part_name(i) not in self.parts]

    def record(self, i: int, rows: int, check: dict[str, Any] | None = None, file: str | None = None) -> None:
        """Part ``i`` is finished: its rows, its file's :func:`part_check` and (object
        storage) the name of its object."""
        self.parts[part_name(i)] = int(rows)
        if check is not None:
            self.checks[part_name(i)] = check
        if file is not None:
            self.files[part_name(i)] = file

    def verify(self, out_dir: Path) -> list[str]:
        """Match the record with the part files: a recorded part that is missing
        or whose size or checksum differs is forgotten (its file deleted), so the
        job redoes it. A part file the manifest does not record (a kill between
        its rename and the manifest's update, or any file under a part's name)
        is deleted and redone: nothing vouches for its bytes. A part recorded
        without a checksum (a /1 manifest) is kept if its footer holds its
        rows. Returns the names of the parts forgotten."""
        import pyarrow.parquet as pq

        dropped = []
        for i in range(self.n_parts):
            name, p = part_name(i), part_path(out_dir, i)
            if self.parts.get(name) == 0 and self.checks.get(name, {}).get("bytes") == 0 and not p.exists():
                continue  # a part no row went to: recorded, no file
            if not p.exists():
                if name in self.parts:
                    dropped.append(name)
                self._forget(name)
                continue
            want = self.checks.get(name)
            if want is not None and name in self.parts:
                if p.stat().st_size == want.get("bytes") and part_check(p) == want:
                    continue
            elif name in self.parts:  # recorded by a /1 manifest: its footer must hold the rows
                try:
                    rows = pq.ParquetFile(p).metadata.num_rows
                except Exception:  # noqa: BLE001 - a damaged file is redone
                    rows = None
                if rows is not None and self.parts[name] == rows:
                    self.record(i, rows, part_check(p))
                    continue
            if name in self.parts:
                dropped.append(name)
            self._forget(name)
            p.unlink(missing_ok=True)
        return dropped

    def _forget(self, name: str) -> None:
        self.parts.pop(name, None)
        self.checks.pop(name, None)

    @property
    def rows(self) -> int:
        return sum(self.parts.values())


#: what the manifest records of a part with no rows (and no file)
EMPTY_PART = {"bytes": 0, "blake2b": None}


def part_check(path: str | os.PathLike) -> dict[str, Any]:
    """What the manifest records of a part file: its size and BLAKE2b-128 checksum."""
    h = hashlib.blake2b(digest_size=16)
    n = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
            n += len(chunk)
    return {"bytes": n, "blake2b": h.hexdigest()}


def bytes_check(data: bytes) -> dict[str, Any]:
    """:func:`part_check` of a part's bytes in memory."""
    return {"bytes": len(data), "blake2b": hashlib.blake2b(data, digest_size=16).hexdigest()}


def written_by_a_job(name: str) -> bool:
    """Whether a file name in a dataset directory is one a job writes (its metadata folder included)."""
    return _WRITTEN.match(name) is not None


def prepare_output(out_dir: Path, parameters: dict[str, Any], fingerprint: str, *,
                   overwrite: bool) -> tuple[str, Manifest | None]:
    """Decide what to do with a dataset directory before any work (the caller
    holds its lock, :func:`mrt_fast.datasets.lock.output_lock`).

    Returns ``("new", None)`` (empty, or overwritten), ``("resume", m)`` (an
    unfinished run of the same job, or a finished one that lost or changed
    parts: those are redone) or ``("done", m)`` (finished, every part as
    recorded). Refuses another job's directory unless ``overwrite``, and a
    non-empty directory without a manifest. ``overwrite`` deletes only what a
    job wrote: it refuses a directory holding anything else, and the current
    directory; nothing is deleted then.
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise MrtInputError(f"output {str(out_dir)!r} exists and is not a directory")
    if not out_dir.exists():
        return "new", None
    remove_stale_temps(out_dir)
    if (out_dir / META_DIR).is_dir():
        remove_stale_temps(out_dir / META_DIR)
    names = sorted(os.listdir(out_dir))
    foreign = [n for n in names if not written_by_a_job(n)]
    ours = [n for n in names if written_by_a_job(n) and not _only_the_lock(out_dir, n)]
    if overwrite:
        _check_overwrite(out_dir)
        m = Manifest.read(out_dir)
        doomed, in_the_way = what_the_job_wrote(out_dir, m)
        if in_the_way:
            raise MrtInputError(f"--overwrite refuses {str(out_dir)!r}: it holds files no mrt job wrote "
                                f"({_few(in_the_way)}: no manifest there records them); nothing was deleted")
        _delete_written(out_dir, doomed, m)
        return "new", None
    m = Manifest.read(out_dir)
    if m is None:
        if foreign or ours:
            hint = "write to a new or empty directory" if foreign else "use --overwrite to replace it"
            raise MrtInputError(f"output directory {str(out_dir)!r} is not empty and has no manifest "
                                f"({MANIFEST}); {hint}")
        return "new", None
    why = m.same_job(parameters, fingerprint)
    if why is not None:
        raise MrtInputError(f"output {str(out_dir)!r} holds another job: {why}; use --overwrite to replace it")
    unchecked = len(m.parts) - len(m.checks)
    dropped = m.verify(out_dir)
    if m.done and not dropped:
        if unchecked:  # a /1 manifest: record the checks its parts now have
            m.write(out_dir)
        return "done", m
    m.done, m.finished = False, None
    m.write(out_dir)
    return "resume", m


def _few(names: list[str]) -> str:
    return ", ".join(repr(n) for n in names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _check_overwrite(out_dir: Path) -> None:
    """Refuse to overwrite the current directory (or one above it)."""
    here, target = Path.cwd().resolve(), out_dir.resolve()
    if target == here or target in here.parents:
        raise MrtInputError(f"--overwrite refuses {str(out_dir)!r}: it is the current directory or holds it; "
                            "nothing was deleted")


def _only_the_lock(out_dir: Path, name: str) -> bool:
    """Whether ``name`` is the metadata folder holding nothing but the job's lock."""
    return name == META_DIR and set(os.listdir(out_dir / name)) <= {LOCK_NAME}


#: the files of a spill folder (the local engine's and Ray's, by their path in it) and of the metadata folder
SPILL_FILE = re.compile(r"^(bucket-\d{5}\.(\d+\.arrow|dropped)|_complete|b\d{5}/o\d{20}\.arrow"
                        r"|(b\d{5}/)?\.[^/]+\.tmp)$")
_META_FILE = re.compile(rf"^({re.escape(LOCK_NAME)}|manifest\.parquet|\.(lock|manifest\.parquet)\..+\.tmp)$")
_PART_FILE = re.compile(r"^part-(\d{5})\.parquet$")
_TEMP_FILE = re.compile(r"^\.(part-\d{5}\.parquet|_manifest\.json|_mrt\.lock)\..+\.tmp$")


def _plain_file(p: Path) -> bool:
    return p.is_file() and not p.is_symlink()


def _spill_entries(d: Path) -> list[str]:
    """Every file, link and folder name in a spill folder, relative to it (Ray's bucket folders
    opened, never a link)."""
    out = []
    for f in sorted(os.listdir(d)):
        sub = d / f
        if re.fullmatch(r"b\d{5}", f) and sub.is_dir() and not sub.is_symlink():
            out += [f"{f}/{g}" for g in sorted(os.listdir(sub))]
        else:
            out.append(f)
    return out


def what_the_job_wrote(out_dir: Path, m: "Manifest | None") -> tuple[list[str], list[str]]:
    """What overwriting ``out_dir`` deletes, and what is in the way (relative names). Deleted: the
    parts of the manifest's plan, the manifest, the lock and temporary files of the job, a spill
    folder holding spill files only, an earlier version's manifest and lock; all plain files or
    folders, never a symbolic link. Anything else, a link or a folder of those names included,
    is in the way."""
    doomed, in_the_way = [], []
    for n in sorted(os.listdir(out_dir)):
        p = out_dir / n
        if n == META_DIR and p.is_dir() and not p.is_symlink():
            for f in sorted(os.listdir(p)):
                ok = _META_FILE.match(f) and _plain_file(p / f)
                (doomed if ok else in_the_way).append(f"{n}/{f}")
            continue
        if n == "_spill" and p.is_dir() and not p.is_symlink():
            bad = [f"{n}/{f}" for f in _spill_entries(p) if not (SPILL_FILE.match(f) and _plain_file(p / f))]
            in_the_way += bad
            if not bad:
                doomed.append(n)
            continue
        part = _PART_FILE.match(n)
        if part is not None:
            ok = m is not None and (n in m.parts or int(part[1]) < m.n_parts) and _plain_file(p)
        else:
            ok = (n in (OLD_MANIFEST, "_mrt.lock") or _TEMP_FILE.match(n) is not None) and _plain_file(p)
        (doomed if ok else in_the_way).append(n)
    return doomed, in_the_way


def _delete_written(out_dir: Path, names: list[str], m: "Manifest | None") -> None:
    """Delete ``names`` (what :func:`what_the_job_wrote` found) in ``out_dir``: a finished
    manifest is first marked unfinished (a directory left half-deleted is then refused by
    readers, never read short), and deleted last; the lock of the job running is kept."""
    if m is not None and m.done:
        m.done, m.finished = False, None
        m.write(out_dir)
    last = {MANIFEST, OLD_MANIFEST, f"{META_DIR}/{LOCK_NAME}"}
    for n in names:
        if n in last:
            continue
        p = out_dir / n
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink(missing_ok=True)
    (out_dir / MANIFEST).unlink(missing_ok=True)
    (out_dir / OLD_MANIFEST).unlink(missing_ok=True)


def discard_unfinished(out_dir: Path) -> None:
    """Delete what a job wrote in ``out_dir`` when no part was committed (bad input found
    before any part): the directory is as it was before the job."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir() or any(out_dir.glob("part-*.parquet")):
        return
    _delete_written(out_dir, what_the_job_wrote(out_dir, None)[0], None)
