"""Where a dataset's rows come from: one file, a directory (hive partitions too), a glob, or
a folder written by Hugging Face ``datasets``' ``save_to_disk``.

:func:`discover` finds the files and checks them once (formats, broken links,
hive keys, schemas); a :class:`Dataset` scans or reads them as one table and
knows the file and row of any row it reads.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import polars as pl

from mrt_fast.errors import MrtInputError
from mrt_fast._util.messages import one_line
from mrt_fast.datasets import checked_objects, hf_disk, json_text, parquet_views, storage
from mrt_fast.datasets.exact_numbers import KEY_ROLES, check_json_keys, check_widening
from mrt_fast.datasets.finished import finished_parts
from mrt_fast.datasets.formats import FORMATS, file_schema, fmt_of, table_suffix


# --------------------------------------------------------------------------- datasets

DATASET_FORMATS = ("parquet", "jsonl", hf_disk.FORMAT)
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
        self._own: dict[str, bool] | None = None  # per file: whether it is read with wider types

    def __repr__(self) -> str:
        return f"Dataset({self.source!r}, {len(self.files)} {self.fmt} file(s){', hive' if self.hive else ''})"

    def scan(self, row_index: str | None = None) -> pl.LazyFrame:
        """One lazy scan over every file (in order), optionally with a global row index."""
        files = [str(f) for f in self.files]
        if self.fmt in DATASET_FORMATS:
            schema = self.files_schema()
        try:
            from mrt_fast.datasets import hive

            direct = (self.fmt == "parquet" and not self.by_arrow()) or \
                (self.fmt == "jsonl" and all(json_text.scans_directly(f) for f in self.files))
            by_path = self.hive and direct and all(isinstance(f, (str, os.PathLike)) for f in self.files)
            paths = {"include_file_paths": hive.PATH_COLUMN} if by_path else {}
            if self.hive and not by_path:
                lf = hive.scan_hive(self)
                if row_index is not None:
                    lf = lf.with_row_index(row_index)
            elif self.fmt == "parquet" and direct:
                cast = {} if self.uniform() else {"schema": schema, "cast_options": _WIDEN}
                lf = pl.scan_parquet(files, row_index_name=row_index, hive_partitioning=False, glob=False, **cast,
                                     **paths)
            elif self.fmt == "jsonl" and direct:
                lf = pl.scan_ndjson(files, row_index_name=row_index, schema=schema, **paths)
            elif self.fmt in DATASET_FORMATS:
                lf = pl.concat([self.scan_file(f) for f in self.files], how="vertical")
                if row_index is not None:
                    lf = lf.with_row_index(row_index)
            else:
                lf = pl.scan_csv(files, row_index_name=row_index)
            if by_path:
                lf = hive.from_paths(self, lf)
        except Exception as e:  # noqa: BLE001
            raise MrtInputError(f"cannot read {self.source!r}: {one_line(e)}") from None
        return lf

    def scan_file(self, f: Path) -> pl.LazyFrame:
        """One file of the dataset, read with the dataset's types (hive columns not included)."""
        schema = self.files_schema()
        if self.fmt == hf_disk.FORMAT:
            return hf_disk.scan_stream(f, schema)
        if self.fmt == "parquet":
            if parquet_views.read_by_arrow(f):
                return parquet_views.scan(f, schema)
            if self._own is None:
                self._own = {str(g): dict(s) != dict(schema) for g, s in zip(self.files, self.file_schemas())}
            cast = {"schema": schema, "cast_options": _WIDEN} if self._own[str(f)] else {}
            return pl.scan_parquet(str(f), hive_partitioning=False, glob=False, **cast)
        return json_text.scan_json(f, schema)

    def by_arrow(self) -> bool:
        """Whether a Parquet file of the dataset is read by pyarrow (see
        :mod:`mrt_fast.datasets.parquet_views`)."""
        self.files_schema()
        return self.fmt == "parquet" and any(parquet_views.read_by_arrow(f) for f in self.files)

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
        df = checked_objects.read_all(self, max(1, min(pl.thread_pool_size(), os.cpu_count() or 1)))
        if df is not None:  # Parquet objects: every page checked
            return df
        if self.fmt == "parquet" and not self.hive and n > 1 and self.uniform() and not self.by_arrow():
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

    def rows(self, start: int, n: int, lf: pl.LazyFrame | None = None) -> pl.DataFrame:
        """Rows ``[start, start + n)`` in dataset order (``lf``: the dataset's scan, made once by
        the caller); Parquet objects with every page checked (:mod:`mrt_fast.datasets.checked_objects`)."""
        df = checked_objects.read_rows(self, start, n)
        return df if df is not None else (lf if lf is not None else self.scan()).slice(start, n).collect()

    def frames(self, columns: list[str], batch_rows: int) -> Iterator[pl.DataFrame]:
        """Batches of ``columns`` in dataset order, about ``batch_rows`` rows each; Parquet objects
        with every page checked (:mod:`mrt_fast.datasets.checked_objects`)."""
        it = checked_objects.iter_frames(self, columns, batch_rows)
        return it if it is not None else self.scan().select(columns).collect_batches(chunk_size=batch_rows)

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
        _check_json_keys(self, [col for col, role in needed if role in KEY_ROLES])
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
            schemas = list(zip(self.files, self.file_schemas()))
            unified = unify(schemas)
            check_widening(schemas, unified, lambda f: _own_scan(f, self.fmt))
            self._files_schema = unified
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
        """Rows per file from Parquet footers or Arrow stream batches (None for text formats)."""
        if self.fmt == hf_disk.FORMAT:
            return [hf_disk.stream_rows(f) for f in self.files]
        if self.fmt != "parquet":
            return None
        import pyarrow.parquet as pq

        out = []
        for f in self.files:
            try:
                out.append(pq.ParquetFile(storage.open_input(f)).metadata.num_rows)
            except Exception as e:  # noqa: BLE001
                raise MrtInputError(f"cannot read {str(f)!r} as parquet: {one_line(e)}") from None
        return out

    def memory_bytes(self) -> int:
        """Estimated in-memory (Arrow) size of the whole dataset."""
        if self.fmt != "parquet":
            return self.size_bytes()
        import pyarrow.parquet as pq

        from mrt_fast.datasets.parquet_size import dataset_arrow_bytes

        return dataset_arrow_bytes((pq.ParquetFile(storage.open_input(f)) for f in self.files), len(self.files))

    def locate(self, row: int) -> tuple[Path, int]:
        """The file holding global row ``row`` and the row's index in it."""
        counts = self.row_counts()
        if counts is None:
            counts = [int(self.scan_file(f).select(pl.len()).collect().item()) for f in self.files]
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

                    for _ in pq.ParquetFile(storage.open_input(f), page_checksum_verification=True).iter_batches(
                            batch_size=65536):
                        pass
                else:
                    self.scan_file(f).collect()
            except MrtInputError:
                raise
            except Exception as e:  # noqa: BLE001
                line = json_text.bad_line(f) if self.fmt == "jsonl" else None
                at = f" (line {line})" if line is not None else ""
                raise MrtInputError(f"cannot read {str(f)!r} as {self.fmt}: {one_line(e)}{at}") from None


def _is_glob(s: str) -> bool:
    return any(c in _GLOB_CHARS for c in s)


def hive_columns(ds: Dataset) -> list[str]:
    """The hive keys of the dataset (the same above every file, see :func:`discover`)."""
    if not ds.hive or ds.root is None:
        return []
    from mrt_fast.datasets.schema import hive_keys

    return list(hive_keys(ds.files[0].relative_to(ds.root)))


def _own_scan(f: Path, fmt: str) -> pl.LazyFrame:
    """One file read with its own types (not the dataset's)."""
    if fmt == hf_disk.FORMAT:
        return hf_disk.scan_stream(f)
    if fmt == "parquet":
        return parquet_views.scan(f) if parquet_views.read_by_arrow(f) else \
            pl.scan_parquet(str(f), hive_partitioning=False, glob=False)
    if isinstance(f, (str, os.PathLike)):
        return json_text.scan_json(f)
    return pl.scan_ndjson(str(f), infer_schema_length=None)


def _check_json_keys(ds: Dataset, columns: list[str]) -> None:
    """:func:`mrt_fast.datasets.exact_numbers.check_json_keys` on every JSON text file of ``ds``."""
    if ds.fmt != "jsonl" or not columns:
        return
    for f, s in zip(ds.files, ds.file_schemas()):
        if isinstance(f, (str, os.PathLike)):
            check_json_keys(f, s, columns, json_text.scan_json, json_text.row_at)
        else:
            check_json_keys(f, s, columns, lambda o, t: pl.scan_ndjson(str(o), schema=t), lambda o, r: f"row {r}")


def discover(source: str | os.PathLike, *, allow_partial: bool = False) -> Dataset:
    """The files of an input (a file, a directory, a glob or a ``save_to_disk`` folder); a
    one-line error if none. An unfinished ``mrt`` output is refused unless ``allow_partial``
    (:mod:`mrt_fast.datasets.finished`)."""
    import glob as _glob

    s = str(source)
    if not s.strip():
        raise MrtInputError("the input path is empty; name a file, a directory or a glob")
    if storage.is_url(s):
        return _discover_objects(s, allow_partial)
    p = Path(s)
    if p.is_file():
        fmt = fmt_of(p, "input")
        return Dataset(s, [p], fmt, False, None)
    if hf_disk.is_save_to_disk(p):
        return Dataset(s, hf_disk.arrow_files(p), hf_disk.FORMAT, False, p)
    if p.is_dir():
        found = _without_json_sidecars([f for f in p.rglob("*") if table_suffix(f) in FORMATS
                                        and not any(part.startswith((".", "_")) for part in f.relative_to(p).parts)])
        _refuse_broken_links(found)
        _refuse_special_files(found)
        files = sorted(f for f in found if f.is_file())
        root = p
        what = f"directory {s!r}"
    elif _is_glob(s):
        found = [Path(f) for f in _glob.glob(s, recursive=True)]
        _refuse_broken_links(found)
        _refuse_special_files([f for f in found if table_suffix(f) in FORMATS])
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
        _refuse_special_files([p])
        raise MrtInputError(f"input {s!r} does not exist")
    files = finished_parts(s, files, root if p.is_dir() else None, allow_partial=allow_partial)
    if not files and p.is_dir():
        from mrt_fast.datasets.manifest import Manifest

        man = Manifest.read(p)
        if man is not None and man.done and man.rows == 0:  # a finished output of no rows: its manifest's schema
            return Dataset(s, [Manifest.path(p)], "parquet", False, p)
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


def _without_json_sidecars(files: list[Path]) -> list[Path]:
    """A directory's ``.json`` files, when it also holds tables of other suffixes, are taken
    for metadata beside the data and left out (so are the files of a ``save_to_disk`` folder
    inside it); a directory of ``.json`` files alone is a dataset of them."""
    def is_json(f: Path) -> bool:
        return table_suffix(f).startswith(".json") and not table_suffix(f).startswith(".jsonl")

    folders = {d: hf_disk.is_save_to_disk(d) for d in {f.parent for f in files}}
    files = [f for f in files if not folders[f.parent]]
    if all(is_json(f) for f in files):
        return files
    return [f for f in files if not is_json(f)]


def _refuse_broken_links(paths: list[Path]) -> None:
    """A symbolic link whose target is missing (a git-annex or DVC file not
    fetched) is an input file that cannot be read: refused, never skipped."""
    for f in paths:
        if f.is_symlink() and not f.exists():
            raise MrtInputError(f"input file {str(f)!r} is a symbolic link to {os.readlink(f)!r}, which does not "
                                "exist (fetch it, or remove the link)")


def _refuse_special_files(paths: list[Path]) -> None:
    """A FIFO, a device or a socket where a table is expected is refused, naming what it is
    (never read, never skipped)."""
    import stat

    kinds = {stat.S_ISFIFO: "a FIFO (named pipe)", stat.S_ISCHR: "a character device",
             stat.S_ISBLK: "a block device", stat.S_ISSOCK: "a socket"}
    for f in paths:
        try:
            mode = f.stat().st_mode
        except OSError:
            continue
        kind = next((k for test, k in kinds.items() if test(mode)), None)
        if kind is not None:
            raise MrtInputError(f"input {str(f)!r} is {kind}, not a regular file or a directory; write the table "
                                "to a file first")


def fingerprint(files: list[Path]) -> str:
    """A digest of the sorted (path, size, mtime_ns) of the files."""
    import hashlib

    h = hashlib.sha256()
    for f in sorted(files, key=str):
        st = f.stat()
        h.update(f"{f.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:32]


def output_inside_input(out: Path, ds: Dataset) -> bool:
    """True when ``out`` is one of the input files, is inside the input's
    directory, holds an input file, or matches the input glob; symbolic links
    and ``..`` are followed (an output reached through a link into the input
    is inside it), and a hard link of an input file is that file. An output on
    object storage is inside an input there when its key prefix is, or holds,
    an input object or the input's prefix."""
    if storage.is_url(out) or any(storage.is_url(f) for f in ds.files[:1]):
        return _object_inside_input(str(out), ds)
    if os.path.isfile(out) and any(os.path.samefile(out, f) for f in ds.files if os.path.exists(f)):
        return True
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




# --------------------------------------------------------------------------- object storage


def _discover_objects(s: str, allow_partial: bool = False) -> Dataset:
    """:func:`discover` of an ``s3://`` input: one object, a prefix (an ``mrt`` output's
    recorded parts only) or a glob."""
    from mrt_fast.datasets.schema import common_hive_keys

    one = storage.ObjectPath(s)
    if not s.endswith("/") and not _is_glob(s) and one.suffix and one.is_file():
        return Dataset(s, [one], fmt_of(Path(one.name), "input"), False, None)
    if _is_glob(s):
        head = "/".join(p for p in s.split("/")[:next(i for i, p in enumerate(s.split("/")) if _is_glob(p))])
        pat = storage.ObjectPath(s).parts
        listed = storage.list_files(head)
        found = [f for f in listed if _glob_match(f.parts, pat)]
        root, what = storage.ObjectPath(head), f"glob {s!r}"
    else:
        root, what = storage.ObjectPath(s), f"prefix {s!r}"
        found = listed = storage.list_files(root)
    files = sorted(f for f in found if table_suffix(Path(f.name)) in FORMATS
                   and not any(part.startswith((".", "_")) for part in f.relative_to(root).parts))
    if not all(_plain_json(f) for f in files):  # .json beside other tables is metadata, as in a local directory
        files = [f for f in files if not _plain_json(f)]
    files = finished_parts(s, files, None if _is_glob(s) else root, listed, allow_partial=allow_partial)
    if not files:
        raise MrtInputError(f"{what} matches no .parquet/.jsonl object")
    fmts = {fmt_of(Path(f.name), "input") for f in files}
    if len(fmts) > 1:
        raise MrtInputError(f"{what} mixes formats {sorted(fmts)}; use one format per dataset")
    fmt = fmts.pop()
    if fmt not in DATASET_FORMATS:
        raise MrtInputError(f"{what}: a dataset of several objects must be Parquet or JSONL, got {fmt}")
    return Dataset(s, files, fmt, bool(common_hive_keys(files, root)), root)


def _plain_json(f: storage.ObjectPath) -> bool:
    sfx = table_suffix(Path(f.name))
    return sfx.startswith(".json") and not sfx.startswith(".jsonl")


def _object_inside_input(out: str, ds: Dataset) -> bool:
    """:func:`output_inside_input` on object storage (plain key prefixes: no links there)."""
    if not storage.is_url(out) or not all(storage.is_url(f) for f in ds.files):
        return False
    o = out.rstrip("/")
    for f in [*(str(f) for f in ds.files), *([str(ds.root)] if ds.root is not None else [])]:
        if f == o or f.startswith(o + "/") or (ds.root is not None and f == str(ds.root) and o.startswith(f + "/")):
            return True
    return False
