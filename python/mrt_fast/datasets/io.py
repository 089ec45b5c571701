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

from mrt_fast.errors import MrtInputError

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
            lf = pl.scan_ndjson(path, infer_schema_length=None)
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


def clean_stale_temps(path: str | os.PathLike, *, any_name: bool = False) -> list[Path]:
    """Remove temp files of ``path`` left by a writer on this host that is no longer alive.

    Only names of the form ``.NAME.HOST-PID.RANDOM.tmp`` with this host's tag
    and a PID with no live process are removed (``any_name``: for every NAME
    in the directory); returns what was removed.
    """
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    pat = re.compile(_TMP_RE.format(name=".+" if any_name else re.escape(path.name)))
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


def temp_name(path: str | os.PathLike, pid: int | None = None) -> str:
    """The name of a temp file of ``path`` written by process ``pid`` (default: this one) on this host."""
    return f".{Path(path).name}.{_host_tag()}-{os.getpid() if pid is None else pid}.{secrets.token_hex(4)}.tmp"


def _new_temp(path: Path, clean: bool = True) -> Path:
    """Create an empty temp file beside ``path`` (mode 0666 minus the umask) and return its path."""
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise MrtInputError(f"output directory {str(parent)!r} does not exist")
    if clean:
        clean_stale_temps(path)
    for _ in range(100):
        tmp = parent / temp_name(path)
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
    if path.exists() and not path.is_file():  # a device or a FIFO: the rename would replace it
        raise MrtInputError(f"{role} {str(path)!r} is not a regular file")
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
def atomic_path(path: str | os.PathLike, *, clean: bool = True) -> Iterator[Path]:
    """Yield a temp path beside ``path`` to write; renamed onto ``path`` when the block succeeds.

    ``clean=False`` skips the scan for stale temps (for many files written into
    one directory that is cleaned once)."""
    path = Path(path)
    tmp = _new_temp(path, clean)
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


# --------------------------------------------------------------------------- datasets

DATASET_FORMATS = ("parquet", "jsonl")
_GLOB_CHARS = set("*?[")
#: how a Parquet file's column is read when another file holds it wider
_WIDEN = pl.ScanCastOptions(integer_cast=["upcast", "allow-float"], float_cast="upcast")


class Dataset:
    """The files of an input: one file, a directory of Parquet/JSONL files (hive
    partitions included: ``key=value`` folders become columns) or a glob.

    ``files`` are sorted by path; rows are read file by file in that order, so
    a row's position in the dataset is its position in that concatenation.
    Every file holds the same columns; a column's type may widen from file to
    file (:mod:`mrt_fast.datasets.schema`), and is read as the widest.
    """

    def __init__(self, source: str | os.PathLike, files: list[Path], fmt: str, hive: bool, root: Path | None):
        self.source = str(source)
        self.files = files
        self.fmt = fmt
        self.hive = hive
        self.root = root  # the directory the files live under (None for one file)
        self._file_schemas: list[pl.Schema] | None = None
        self._files_schema: pl.Schema | None = None

    def __repr__(self) -> str:
        return f"Dataset({self.source!r}, {len(self.files)} {self.fmt} file(s){', hive' if self.hive else ''})"

    def scan(self, row_index: str | None = None) -> pl.LazyFrame:
        """One lazy scan over every file (in order), optionally with a global row index."""
        files = [str(f) for f in self.files]
        if self.fmt in DATASET_FORMATS:
            schema = self.files_schema()
        try:
            if self.fmt == "parquet":
                cast = {} if self.uniform() else {"schema": schema, "cast_options": _WIDEN}
                lf = pl.scan_parquet(files, row_index_name=row_index, hive_partitioning=self.hive,
                                     glob=False, **cast)
            elif self.fmt == "jsonl" and self.hive:
                lf = _hive_ndjson(self)
                if row_index is not None:
                    lf = lf.with_row_index(row_index)
            elif self.fmt == "jsonl":
                lf = pl.scan_ndjson(files, row_index_name=row_index, schema=schema)
            else:
                lf = pl.scan_csv(files, row_index_name=row_index)
        except Exception as e:  # noqa: BLE001
            raise MrtInputError(f"cannot read {self.source!r}: {_one_line(e)}") from None
        return lf

    def read(self, contiguous: str | None = None) -> pl.DataFrame:
        """Every row in memory, in dataset order. Parquet files without hive
        partitions are decoded by several threads at once, one run of
        consecutive files each (polars decodes a multi-file scan largely on one
        core); anything else, or a dataset that fails that way, is one scan,
        which also gives the error a bad dataset should get.

        ``contiguous`` names an embedding column (float32 vectors of one
        length, no nulls) to be delivered as one chunk, rows back to back:
        each file's vectors are decoded straight into their place in one
        buffer (:mod:`mrt_fast.datasets.contiguous`), so the column is never held
        twice. A column that is not like that is read as any other."""
        if contiguous is not None:
            from mrt_fast.datasets.contiguous import read_contiguous

            df = read_contiguous(self, contiguous)
            if df is not None:
                return df
        n = min(len(self.files), pl.thread_pool_size(), os.cpu_count() or 1)
        if self.fmt == "parquet" and not self.hive and n > 1 and self.uniform():
            from concurrent.futures import ThreadPoolExecutor

            files = [str(f) for f in self.files]
            cuts = [round(i * len(files) / n) for i in range(n + 1)]
            runs = [files[cuts[i]:cuts[i + 1]] for i in range(n)]
            try:
                with ThreadPoolExecutor(max_workers=n) as ex:
                    parts = list(ex.map(lambda fs: pl.scan_parquet(fs, glob=False).collect(), runs))
                return pl.concat(parts, how="vertical", rechunk=False)
            except Exception:  # noqa: BLE001 - the single scan below reports it
                pass
        return self.scan().collect()

    def schema(self) -> pl.Schema:
        """The schema shared by every file (checked file by file, so a corrupt file
        or one lacking a column is named)."""
        return self.check_columns([])

    def check_columns(self, needed: list[tuple[str, str]]) -> pl.Schema:
        """Every file readable and holding every ``(column, role)`` of ``needed``,
        and the files agreeing on their columns; returns the dataset's schema
        (hive columns included)."""
        hive_cols = hive_columns(self)
        for f, s in zip(self.files, self.file_schemas()):
            names = set(s.names()) | set(hive_cols)
            for col, role in needed:
                if col not in names:
                    raise MrtInputError(
                        f"column {col!r} ({role}) not found in {str(f)!r}; it has columns {s.names()}", column=col
                    )
        schema = self.files_schema()
        if self.hive:
            schema = self.scan().collect_schema()
        return schema

    def file_schemas(self) -> list[pl.Schema]:
        """Each file's own schema, in file order (read once)."""
        if self._file_schemas is None:
            self._file_schemas = [file_schema(f, self.fmt) for f in self.files]
        return self._file_schemas

    def files_schema(self) -> pl.Schema:
        """The schema the files are read with (hive columns not included): the
        same columns in every file, each type the widest any file holds; a
        one-line error naming the file that differs otherwise, or whose hive
        key is one of its columns."""
        if self._files_schema is None:
            from mrt_fast.datasets.schema import check_hive_collision, hive_values, unify

            if self.hive:
                for f, s in zip(self.files, self.file_schemas()):
                    check_hive_collision(f, self.fmt, s, hive_values(f.relative_to(self.root)))
            self._files_schema = unify(list(zip(self.files, self.file_schemas())))
        return self._files_schema

    def uniform(self) -> bool:
        """Whether every file holds exactly the dataset's types (nothing to widen)."""
        want = dict(self.files_schema())
        return all(dict(s) == want for s in self.file_schemas())

    def fingerprint(self) -> str:
        return fingerprint(self.files)

    def size_bytes(self) -> int:
        return sum(f.stat().st_size for f in self.files)

    def row_counts(self) -> list[int] | None:
        """Rows per file from Parquet footers (None for text formats)."""
        if self.fmt != "parquet":
            return None
        import pyarrow.parquet as pq

        out = []
        for f in self.files:
            try:
                out.append(pq.ParquetFile(f).metadata.num_rows)
            except Exception as e:  # noqa: BLE001
                raise MrtInputError(f"cannot read {str(f)!r} as parquet: {_one_line(e)}") from None
        return out

    def memory_bytes(self) -> int:
        """Estimated in-memory (Arrow) size of the whole dataset."""
        if self.fmt != "parquet":
            return self.size_bytes()
        import pyarrow.parquet as pq

        tot = 0
        for f in self.files:
            md = pq.ParquetFile(f).metadata
            tot += sum(md.row_group(i).total_byte_size for i in range(md.num_row_groups))
        return tot

    def locate(self, row: int) -> tuple[Path, int]:
        """The file holding global row ``row`` and the row's index in it."""
        counts = self.row_counts()
        if counts is None:
            counts = [int(pl.scan_ndjson(f, schema=self.files_schema()).select(pl.len()).collect().item())
                      for f in self.files]
        for f, n in zip(self.files, counts):
            if row < n:
                return f, row
            row -= n
        return self.files[-1], row

    def find_unreadable(self) -> None:
        """Read every file to the end; raise naming the first that fails."""
        for f in self.files:
            try:
                if self.fmt == "parquet":
                    import pyarrow.parquet as pq

                    for _ in pq.ParquetFile(f).iter_batches(batch_size=65536):
                        pass
                else:
                    pl.scan_ndjson(f, schema=self.files_schema()).collect()
            except Exception as e:  # noqa: BLE001
                raise MrtInputError(f"cannot read {str(f)!r} as {self.fmt}: {_one_line(e)}") from None


def file_schema(f: Path, fmt: str) -> pl.Schema:
    """One file's schema, read from its footer/first lines; a one-line error naming it if unreadable."""
    if not os.access(f, os.R_OK):
        raise MrtInputError(f"input file {str(f)!r} is not readable (permission denied)")
    try:
        if fmt == "parquet":
            return pl.Schema(pl.read_parquet_schema(f))
        if fmt == "jsonl":
            if f.stat().st_size == 0:
                raise MrtInputError(f"input file {str(f)!r} is empty")
            return pl.scan_ndjson(f, infer_schema_length=None).collect_schema()
        return pl.scan_csv(f).collect_schema()
    except MrtInputError:
        raise
    except Exception as e:  # noqa: BLE001
        raise MrtInputError(f"cannot read {str(f)!r} as {fmt}: {_one_line(e)}") from None


def _is_glob(s: str) -> bool:
    return any(c in _GLOB_CHARS for c in s)


def hive_columns(ds: Dataset) -> list[str]:
    """The hive keys of the dataset (the same above every file, see :func:`discover`)."""
    if not ds.hive or ds.root is None:
        return []
    from mrt_fast.datasets.schema import hive_keys

    return list(hive_keys(ds.files[0].relative_to(ds.root)))


def _hive_ndjson(ds: Dataset) -> pl.LazyFrame:
    """JSONL files under ``key=value`` folders, the keys as (text) columns.
    (polars reads the hive partitions of Parquet itself.)"""
    from mrt_fast.datasets.schema import hive_values

    schema = ds.files_schema()
    parts = []
    for f in ds.files:
        one = pl.scan_ndjson(f, schema=schema)
        vals = hive_values(f.relative_to(ds.root))  # a key the file holds keeps the file's column
        parts.append(one.with_columns(pl.lit(v).alias(k) for k, v in vals.items() if k not in schema))
    return pl.concat(parts, how="vertical")


def discover(source: str | os.PathLike) -> Dataset:
    """The files of an input (a file, a directory or a glob); a one-line error if none."""
    import glob as _glob

    s = str(source)
    p = Path(s)
    if p.is_file():
        fmt = fmt_of(p, "input")
        return Dataset(s, [p], fmt, False, None)
    if p.is_dir():
        found = [f for f in p.rglob("*") if f.suffix.lower() in FORMATS
                 and not any(part.startswith((".", "_")) for part in f.relative_to(p).parts)]
        _refuse_broken_links(found)
        files = sorted(f for f in found if f.is_file())
        root = p
        what = f"directory {s!r}"
    elif _is_glob(s):
        found = [Path(f) for f in _glob.glob(s, recursive=True)]
        _refuse_broken_links(found)
        files = sorted(f for f in found if f.is_file())
        fixed = []
        for part in p.parts:
            if _is_glob(part):
                break
            fixed.append(part)
        root = Path(*fixed) if fixed else Path(".")
        what = f"glob {s!r}"
    else:
        _refuse_broken_links([p])
        raise MrtInputError(f"input {s!r} does not exist")
    if not files:
        raise MrtInputError(f"{what} matches no .parquet/.jsonl file")
    fmts = {fmt_of(f, "input") for f in files}
    if len(fmts) > 1:
        raise MrtInputError(f"{what} mixes formats {sorted(fmts)}; use one format per dataset")
    fmt = fmts.pop()
    if fmt not in DATASET_FORMATS:
        raise MrtInputError(f"{what}: a dataset of several files must be Parquet or JSONL, got {fmt}")
    from mrt_fast.datasets.schema import common_hive_keys

    hive = bool(common_hive_keys(files, root))
    return Dataset(s, files, fmt, hive, root)


def _refuse_broken_links(paths: list[Path]) -> None:
    """A symbolic link whose target is missing (a git-annex or DVC file not
    fetched) is an input file that cannot be read: refused, never skipped."""
    for f in paths:
        if f.is_symlink() and not f.exists():
            raise MrtInputError(f"input file {str(f)!r} is a symbolic link to {os.readlink(f)!r}, which does not "
                                "exist (fetch it, or remove the link)")


def fingerprint(files: list[Path]) -> str:
    """A digest of the sorted (path, size, mtime_ns) of the files."""
    import hashlib

    h = hashlib.sha256()
    for f in sorted(files):
        st = f.stat()
        h.update(f"{f.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:32]


def output_inside_input(out: Path, ds: Dataset) -> bool:
    """True when ``out`` is one of the input files, is inside the input's
    directory, holds an input file, or matches the input glob; symbolic links
    and ``..`` are followed (an output reached through a link into the input
    is inside it)."""
    outs = {Path(os.path.abspath(out)), Path(os.path.realpath(out))}
    for f in ds.files:
        for fa in {Path(os.path.abspath(f)), Path(os.path.realpath(f))}:
            if any(fa == o or o in fa.parents for o in outs):
                return True
    if ds.root is not None and Path(ds.source).is_dir():
        for r in {Path(os.path.abspath(ds.root)), Path(os.path.realpath(ds.root))}:
            if any(o == r or r in o.parents for o in outs):
                return True
    if ds.root is not None and _is_glob(ds.source):
        pat = Path(os.path.abspath(ds.source)).parts
        for o in outs:
            cand = [o] + [o / f"part-00000{sfx}" for sfx in (".parquet", ".jsonl")]
            if any(_glob_match(c.parts, pat) for c in cand):
                return True
    return False


def _glob_match(parts: tuple[str, ...], pat: tuple[str, ...]) -> bool:
    """Whether a path (its parts) matches a glob (its parts) as `glob.glob(recursive=True)` would."""
    import fnmatch

    if not pat:
        return not parts
    if pat[0] == "**":
        return any(_glob_match(parts[i:], pat[1:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], pat[0]) and _glob_match(parts[1:], pat[1:])


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write bytes to a temp file beside ``path`` and rename it into place."""
    with atomic_path(path, clean=False) as tmp:
        tmp.write_bytes(data)


def write_parquet_atomic(df: pl.DataFrame, path: Path) -> None:
    """Write a Parquet file under a temp name beside ``path``, renamed into place when complete."""
    with atomic_path(path, clean=False) as tmp:
        df.write_parquet(tmp)


def remove_stale_temps(directory: Path) -> int:
    """Delete the temp files in ``directory`` left by killed writers (see :func:`clean_stale_temps`)."""
    return len(clean_stale_temps(Path(directory) / "x", any_name=True))
