"""Every table read and write of mrt_fast: Parquet, JSONL and CSV with polars.

Reads are lazy scans (only the needed columns, only the needed rows); writes
go to a temporary file in the destination's directory and are renamed into
place on success, so a failed run never leaves a half-written file.

Temporary files are named ``.NAME.HOST-PID.RANDOM.tmp`` and created with mode
``0666`` minus the umask (what the finished file keeps). A process killed
before its rename (kill -9, SIGTERM, power loss) leaves its temporary file
behind; the next write into the same directory removes such files of the same
destination whose writer ran on this host and is no longer alive, and leaves
every other file alone (a live concurrent writer's, another host's, anything
not matching the pattern).
CSV cannot hold lists: embedding columns are written as JSON text and read
back from it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl

from .errors import MrtInputError

FORMATS = {".parquet": "parquet", ".pq": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv"}


def fmt_of(path: Path, role: str) -> str:
    f = FORMATS.get(path.suffix.lower())
    if f is None:
        raise MrtInputError(
            f"{role} file {str(path)!r}: unsupported format {path.suffix!r} (use .parquet, .jsonl/.ndjson or .csv)"
        )
    return f


def _one_line(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return msg[0] if msg else type(e).__name__


def scan(path: Path) -> pl.LazyFrame:
    """A lazy scan of an input table; fails with a one-line error if unreadable."""
    path = Path(path)
    f = fmt_of(path, "input")
    if not path.exists():
        raise MrtInputError(f"input file {str(path)!r} does not exist")
    if not path.is_file():
        raise MrtInputError(f"input {str(path)!r} is not a file")
    if not os.access(path, os.R_OK):
        raise MrtInputError(f"input file {str(path)!r} is not readable (permission denied)")
    try:
        if f == "parquet":
            lf = pl.scan_parquet(path)
        elif f == "jsonl":
            lf = pl.scan_ndjson(path, infer_schema_length=1000)
        else:
            lf = pl.scan_csv(path)
        lf.collect_schema()
    except Exception as e:  # noqa: BLE001 - polars raises several kinds for a bad file
        raise MrtInputError(f"cannot read {str(path)!r} as {f}: {_one_line(e)}") from None
    return lf


def collect(lf: pl.LazyFrame, path: Path) -> pl.DataFrame:
    try:
        return lf.collect()
    except Exception as e:  # noqa: BLE001
        raise MrtInputError(f"cannot read {str(path)!r}: {_one_line(e)}") from None


def decode_embedding(df: pl.DataFrame, name: str) -> pl.DataFrame:
    """An embedding column stored as JSON text (CSV) becomes a list of floats."""
    if name in df.columns and df[name].dtype in (pl.Utf8, pl.String):
        try:
            return df.with_columns(pl.col(name).str.json_decode(pl.List(pl.Float32)))
        except Exception as e:  # noqa: BLE001
            raise MrtInputError(f"column {name!r} holds text that is not a JSON list of numbers: {_one_line(e)}") from None
    return df


def _csv_safe(df: pl.DataFrame) -> pl.DataFrame:
    nested = [c for c, t in df.schema.items() if isinstance(t, (pl.List, pl.Array, pl.Struct))]
    if not nested:
        return df
    return df.with_columns(
        pl.Series(c, [None if v is None else json.dumps(v if not hasattr(v, "tolist") else v.tolist())
                      for v in df[c].to_list()], dtype=pl.Utf8)
        for c in nested
    )


def _host_tag() -> str:
    """This host's name, reduced to the characters a temp-file name keeps."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname())[:32] or "host"


_TMP_RE = r"^\.{name}\.(?P<host>[A-Za-z0-9_-]+)-(?P<pid>\d+)\.[0-9a-f]{{8}}\.tmp$"


def _pid_alive(pid: int) -> bool:
    if os.name != "posix":  # no signal-0 probe: treat every writer as alive
        return True
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    except OSError:
        return True
    return True


def clean_stale_temps(path: str | os.PathLike) -> list[Path]:
    """Remove temp files of ``path`` left by a writer on this host that is no longer alive.

    Only names of the form ``.NAME.HOST-PID.RANDOM.tmp`` with this host's tag
    and a PID with no live process are removed; returns what was removed.
    """
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    pat = re.compile(_TMP_RE.format(name=re.escape(path.name)))
    host = _host_tag()
    removed = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for e in entries:
        m = pat.match(e.name)
        if m is None or m["host"] != host or int(m["pid"]) == os.getpid() or _pid_alive(int(m["pid"])):
            continue
        try:
            if e.is_file(follow_symlinks=False):
                os.unlink(e.path)
                removed.append(Path(e.path))
        except OSError:
            pass
    return removed


def _new_temp(path: Path) -> Path:
    """Create an empty temp file beside ``path`` (mode 0666 minus the umask) and return its path."""
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise MrtInputError(f"output directory {str(parent)!r} does not exist")
    clean_stale_temps(path)
    for _ in range(100):
        tmp = parent / f".{path.name}.{_host_tag()}-{os.getpid()}.{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        except OSError as e:
            raise MrtInputError(f"cannot write to {str(parent)!r}: {_one_line(e)}") from None
        os.close(fd)
        return tmp
    raise MrtInputError(f"cannot create a temporary file in {str(parent)!r}")


def check_output(path: str | os.PathLike, role: str = "output", *, table: bool = True) -> Path:
    """Fail now, before any work, if ``path`` cannot be written.

    Checks the format (for tables), that the directory exists and that a file
    can be created there (by creating and removing a temp file), and that
    ``path`` itself is not a directory.
    """
    path = Path(path)
    if table:
        fmt_of(path, role)
    if path.is_dir():
        raise MrtInputError(f"{role} {str(path)!r} is a directory")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise MrtInputError(f"{role} directory {str(parent)!r} does not exist")
    _new_temp(path).unlink()
    return path


def check_output_dir(path: str | os.PathLike, role: str = "output directory") -> Path:
    """Fail now if ``path`` cannot be used as an output directory (created later if missing)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise MrtInputError(f"{role} {str(path)!r} exists and is not a directory")
    probe = path
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise MrtInputError(f"{role} {str(path)!r}: {str(probe)!r} is not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise MrtInputError(f"cannot write to {str(probe)!r} (permission denied)")
    return path


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp path beside ``path`` to write; renamed onto ``path`` when the block succeeds."""
    path = Path(path)
    tmp = _new_temp(path)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write text atomically (temp file + rename)."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


class AtomicWriter:
    """Append polars frames to a temp file; `commit` renames it onto `path`."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.fmt = fmt_of(self.path, "output")
        self.tmp = _new_temp(self.path)
        self._pq = None
        self._fh = None
        self.rows = 0
        self._first = True

    def write(self, df: pl.DataFrame) -> None:
        if self.fmt == "parquet":
            import pyarrow.parquet as pq

            t = df.to_arrow()
            if self._pq is None:
                self._pq = pq.ParquetWriter(self.tmp, t.schema)
            self._pq.write_table(t.cast(self._pq.schema) if t.schema != self._pq.schema else t)
        else:
            if self._fh is None:
                self._fh = open(self.tmp, "wb")
            if self.fmt == "jsonl":
                df.write_ndjson(self._fh)
            else:
                _csv_safe(df).write_csv(self._fh, include_header=self._first)
        self._first = False
        self.rows += df.height

    def _close(self) -> None:
        if self._pq is not None:
            self._pq.close()
            self._pq = None
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def commit(self, empty_schema: pl.DataFrame | None = None) -> None:
        if self._first and empty_schema is not None:
            self.write(empty_schema.clear())
        self._close()
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        self._close()
        try:
            self.tmp.unlink()
        except FileNotFoundError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, et, ev, tb):
        if et is not None or self.tmp.exists():
            self.abort()
        return False


def read_table(path: str | os.PathLike) -> pl.DataFrame:
    """Read a .parquet / .jsonl / .csv file into polars (one-line error if unreadable)."""
    path = Path(path)
    return decode_embedding_columns(collect(scan(path), path))


def decode_embedding_columns(df: pl.DataFrame) -> pl.DataFrame:
    """Columns named like an embedding that hold JSON text (CSV) become lists of floats."""
    for c in df.columns:
        if c == "embedding" or c.endswith("_embedding"):
            df = decode_embedding(df, c)
    return df


def write_table(df: pl.DataFrame, path: str | os.PathLike) -> Path:
    """Write atomically (temp file + rename) as .parquet / .jsonl / .csv, creating the directory."""
    path = Path(path)
    fmt_of(path, "output")
    path.parent.mkdir(parents=True, exist_ok=True)
    with AtomicWriter(path) as w:
        w.write(df)
        w.commit()
    return path


def as_polars(table: Any) -> pl.DataFrame:
    """polars, pyarrow, pandas, a list of dicts or a path -> polars DataFrame."""
    if isinstance(table, pl.DataFrame):
        return table
    if isinstance(table, (str, os.PathLike)):
        return read_table(table)
    if isinstance(table, list):
        return pl.DataFrame(table)
    if type(table).__module__.startswith("pyarrow"):
        return pl.from_arrow(table)  # type: ignore[return-value]
    if type(table).__module__.startswith("pandas"):
        return pl.from_pandas(table)
    raise TypeError(f"expected a table (polars/pyarrow/pandas, list of dicts or a path), got {type(table).__name__}")


def require_columns(df: pl.DataFrame, cols: list[str], what: str) -> None:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise MrtInputError(f"{what}: column(s) {missing} not found; the table has columns {df.columns}",
                            column=missing[0])
