"""The job: everything around a stage, written once.

A **stage** maps a table of whole pools to a table (select, embed, nll,
score, export) or folds one into an accumulator (diagnose). The **job** owns
what surrounds it, whatever runs it:

* discovery of the input (a file, a directory of Parquet/JSONL files with hive
  partitions, or a glob: :func:`mrt_fast.datasets.sources.discover`), and the
  refusal of an output inside its input;
* the output: a file (``.parquet``/``.jsonl``/``.csv``, written whole or not at
  all) or a resumable dataset directory (``part-NNNNN.parquet`` and the hidden
  ``.mrt/`` metadata folder, readable as it stands by polars, Hugging Face
  datasets and pyarrow); missing parent directories are made for either
  (and removed again when nothing was written);
* the lock (:mod:`mrt_fast.datasets.lock`): one job per output, released by
  the kernel when its holder dies; on object storage, the holder aborts the
  unfinished multipart uploads a killed run left under the output
  (``job.notes`` says so);
* the manifest (:mod:`mrt_fast.datasets.manifest`): the job's parameters and
  input fingerprint, each finished part's rows, size and checksum; resume
  (a rerun of the same job does the missing parts only; a finished directory
  is left as it is; another job's directory is refused unless ``overwrite``);
  a file output follows the same rule through the record in a Parquet file's
  footer (:mod:`mrt_fast.datasets.file_record`);
* the progress display (:class:`mrt_fast.datasets.progress.JobProgress`: a bar
  on a terminal, plain periodic lines otherwise), advanced by the executors;
* committing a part (written atomically, checked, recorded; a full disk is one
  line naming the part), and leaving nothing behind when bad input is found
  before any part was committed.

**Executors** (:mod:`mrt_fast.datasets.executors`) run a stage's parts
inside a job: on this machine (``local``) or on a Ray cluster (``ray``); they
use :func:`rows_before`, :func:`run_all` and :func:`write_part` from here.

Test hook: the environment variable :data:`STOP_AFTER_ENV` (an integer N)
stops a job with :class:`StoppedForTest` once it has committed N parts, as a
kill would (read in one place, :func:`stop_after`).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Callable

import polars as pl

from mrt_fast._util import messages as _messages
from mrt_fast._util.disk_space import reporting_full_disk
from mrt_fast._util.files import check_output_dir
from mrt_fast._util.memory import size_text
from mrt_fast.datasets import formats as _formats
from mrt_fast.datasets import object_output, storage
from mrt_fast.datasets import sources as _sources
from mrt_fast.datasets.lock import output_lock
from mrt_fast.datasets.object_lock import lock_url, object_lock
from mrt_fast.datasets.manifest import (EMPTY_PART, Manifest, discard_unfinished, part_check, part_path,
                                        prepare_output)
from mrt_fast.datasets.progress import JobProgress
from mrt_fast.datasets.report import run_summary
from mrt_fast.datasets.stage import RowStage
from mrt_fast.errors import MrtInputError, MrtResourceError, StoppedForTest

__all__ = ["Job", "RowStage", "STOP_AFTER_ENV", "StoppedForTest", "is_directory_output", "rows_before", "run_all", "start_row_parts",
           "run_summary", "stop_after", "stopping_after", "write_part"]

#: test hook: stop a job after it has committed this many parts (see the module doc)
STOP_AFTER_ENV = "MRT_TEST_STOP_AFTER_PARTS"


def stop_after() -> int | None:
    """The test hook's part count, or None (the one place it is read)."""
    v = os.environ.get(STOP_AFTER_ENV)
    return int(v) if v else None


@contextlib.contextmanager
def stopping_after(n: int):
    """Within the block, jobs stop after ``n`` committed parts (the test hook, set and restored)."""
    old = os.environ.get(STOP_AFTER_ENV)
    os.environ[STOP_AFTER_ENV] = str(int(n))
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(STOP_AFTER_ENV, None)
        else:
            os.environ[STOP_AFTER_ENV] = old


def is_directory_output(out: Path | str) -> bool:
    """A directory output: an existing directory, or a name without a suffix. A name with a
    suffix is a file, and a suffix that is no table format is refused (never silently a directory).
    On object storage (``s3://``), a URL without a suffix (or ending in ``/``) is a directory."""
    if storage.is_url(out):
        if str(out).endswith("/") or not storage.ObjectPath(str(out)).suffix:
            return True
        _formats.fmt_of(Path(storage.ObjectPath(str(out)).name), "output")
        return False
    out = Path(out)
    if out.is_dir() or not out.suffix:
        return True
    _formats.fmt_of(out, "output")
    return False


class Job:
    """One run of a stage from an input to an output (see the module doc).

    ``with Job(source, output, parameters, ...) as job:`` discovers the input,
    checks the output, takes its lock and reads its manifest: ``job.state`` is
    ``"new"``, ``"resume"`` or ``"done"`` (a finished directory; nothing to
    do). :meth:`start` records the plan (part count, layout) in a new
    manifest and returns the parts still to do; :meth:`commit` writes one
    part (thread-safe); :meth:`finish` marks the job done. A file output is
    written once, by :meth:`write_file`. An `MrtInputError` leaving the block
    before any part was committed leaves no half-made directory behind.
    ``progress`` (see :class:`~mrt_fast.datasets.progress.JobProgress`) is
    ``job.progress``, which the executors advance by input rows.
    """

    def __init__(self, source: Any, output: str | os.PathLike, parameters: dict[str, Any], *,
                 overwrite: bool = False, command: str | None = None, what: str = "job", progress: Any = False):
        self.ds = source if isinstance(source, _sources.Dataset) else _sources.discover(source)
        self.remote = storage.is_url(output)
        self.out: Any = str(output).rstrip("/") if self.remote else Path(output)
        if _sources.output_inside_input(self.out, self.ds):
            raise MrtInputError(f"output {str(self.out)!r} is the input or inside it; write it elsewhere")
        self.to_dir = is_directory_output(output)
        if not self.remote:
            parent = self.out.parent if str(self.out.parent) else Path(".")
            check_output_dir(parent, "output directory")  # missing directories are made by the lock
        self.parameters = parameters
        self.overwrite = overwrite
        self.command = command or what
        self.fingerprint = self.ds.fingerprint()
        self.state = "new"
        self.man: Manifest | None = None
        self._file_rows = 0  # rows of a finished file output (state "done")
        self._stack: ExitStack | None = None
        self._lock = threading.Lock()
        self._committed = 0
        self._stop = stop_after()
        self.progress = JobProgress(progress, name=f"mrt {what}" if what != "job" else what)
        #: where the executor's own logs went, when it sent them away from the terminal (Ray)
        self.logs: str | None = None
        #: what the job did or could not do beside its work, one line each (for the run's report)
        self.notes: list[str] = []

    # ---- the block
    def __enter__(self) -> "Job":
        self._stack = ExitStack()
        if self.remote:
            self._stack.enter_context(object_lock(lock_url(self.out, directory=self.to_dir),
                                                  f"output {self.out!r}"))
        else:
            self._stack.enter_context(output_lock(self.out, directory=self.to_dir))
        try:
            if self.to_dir:
                prepare = object_output.prepare_output if self.remote else prepare_output
                self.state, self.man = prepare(self.out, self.parameters, self.fingerprint,
                                               overwrite=self.overwrite)
            elif not self.remote:
                from mrt_fast.datasets.file_record import check_file_output

                self.state, self._file_rows = check_file_output(self.out, self.parameters, self.fingerprint,
                                                                overwrite=self.overwrite)
            if self.remote:
                self._abort_uploads()
        except BaseException:
            self._stack.close()
            raise
        self._full_disk = reporting_full_disk("writing to", self.out)
        self._full_disk.__enter__()
        return self

    def __exit__(self, et, ev, tb) -> None:
        assert self._stack is not None
        self.progress.close()
        try:
            try:
                self._full_disk.__exit__(et, ev, tb)  # a full disk: one line saying where
            except (MrtInputError, MrtResourceError):
                if self.to_dir and self.state == "new":
                    self._discard_unfinished()  # bad input or no room before any part: the directory is as it was
                raise
            if et is not None and issubclass(et, (MrtInputError, MrtResourceError)) and self.to_dir \
                    and self.state == "new":
                self._discard_unfinished()
        finally:
            self._stack.close()

    def _abort_uploads(self) -> None:
        """Abort the unfinished multipart uploads left under the output on object storage (this job
        holds its lock: none is another writer's); a note when there were some, or when the store
        cannot list them (never a failure)."""
        try:
            n, size = storage.abort_uploads(self.out, directory=self.to_dir)
        except MrtInputError as e:
            self.notes.append(f"{e}; any upload a killed run left unfinished there was not aborted")
            return
        if n:
            self.notes.append(f"aborted {n} unfinished upload{'s' * (n != 1)} left by a killed run "
                              f"({size_text(size)})")

    def _discard_unfinished(self) -> None:
        (object_output.discard_unfinished if self.remote else discard_unfinished)(self.out)

    @property
    def resumed(self) -> bool:
        return self.state == "resume"

    @property
    def done(self) -> bool:
        return self.state == "done"

    # ---- the plan and the parts
    def start(self, n_parts: int, *, layout: str = "flat", rows_per_part: int | None = None,
              n_rows: int | None = None) -> list[int]:
        """Record the plan in a new manifest (a resumed job keeps its own); the parts still to do."""
        if not self.to_dir:
            return list(range(n_parts))
        if self.man is None:
            self.man = Manifest(command=self.command, parameters=self.parameters,
                                input={"source": self.ds.source, "files": len(self.ds.files),
                                       "fingerprint": self.fingerprint, "rows": n_rows},
                                n_parts=int(n_parts), layout=layout, rows_per_part=rows_per_part)
            self.man.write(self.out)
        return self.man.missing_parts(self.out)

    @property
    def rows_written(self) -> int:
        """Rows a finished output holds (its manifest's, or a file's record's)."""
        return self.man.rows if self.man is not None else self._file_rows

    @property
    def n_parts(self) -> int | None:
        return None if self.man is None else self.man.n_parts

    @property
    def rows_per_part(self) -> int | None:
        return None if self.man is None else self.man.rows_per_part

    def commit(self, i: int, df: pl.DataFrame) -> int:
        """Write part ``i`` atomically and record it (its rows, size and checksum);
        a part of no rows is recorded with no file. Returns its rows."""
        assert self.to_dir and self.man is not None
        self._check_stop()
        if not df.height:
            self.man.note_schema(df.to_arrow().schema)
        if self.remote:
            rows, name, check = object_output.put_part(df, self.out, i)
            self._record(i, rows, check, name)
            return rows
        write_part(df, self.out, i)
        check = part_check(part_path(self.out, i)) if df.height else dict(EMPTY_PART)
        self._record(i, df.height, check)
        return df.height

    def record_written(self, i: int, rows: int) -> None:
        """Record part ``i``, written by another process (an executor's task) with
        :func:`write_part`: its rows, and its file's size and checksum."""
        assert self.to_dir and self.man is not None
        if self.remote:
            name, check = object_output.find_part(self.out, i, rows)
            self._record(i, rows, check, name)
            return
        self._record(i, rows, part_check(part_path(self.out, i)) if rows else dict(EMPTY_PART))

    def _record(self, i: int, rows: int, check: dict, file: str | None = None) -> None:
        with self._lock:
            self._check_stop()
            self.man.record(i, rows, check, file)
            self.man.write(self.out)
            self._committed += 1
            self._check_stop()

    def _check_stop(self) -> None:
        """Once a test's stop has come (:func:`stop_after`), a worker still running writes and
        records nothing more, as after a kill."""
        if self._stop is not None and self._committed >= self._stop:
            raise StoppedForTest(f"stopped after {self._committed} part(s)")

    def finish(self) -> int:
        """Mark a directory output done; returns the rows written."""
        assert self.man is not None
        self.man.done = True
        self.man.finished = time.time()
        self.man.write(self.out)
        return self.man.rows

    def write_file(self, df: pl.DataFrame | list[pl.DataFrame]) -> int:
        """Write a file output whole (atomically); returns its rows."""
        frames = df if isinstance(df, list) else [df]
        with contextlib.ExitStack() as stack:
            path = self.out
            if self.remote:  # written whole here, then one upload: the object appears complete or not at all
                import tempfile

                path = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=".mrt-upload-"))) \
                    / storage.ObjectPath(self.out).name
            from mrt_fast.datasets.file_record import record_metadata

            meta = record_metadata(path, self.parameters, self.fingerprint)
            with _formats.AtomicWriter(path, metadata=meta) as wr:
                for f in frames:
                    wr.write(f)
                wr.commit()
            if self.remote:
                storage.put(path, self.out)
        return sum(f.height for f in frames)

    # ---- reading the input
    def count_rows(self) -> int:
        counts = self.ds.row_counts()
        if counts is not None:
            return sum(counts)
        try:
            return int(self.ds.scan().select(pl.len()).collect().item())
        except Exception as e:  # noqa: BLE001
            self.ds.find_unreadable()
            raise MrtInputError(f"cannot read {self.ds.source!r}: {_messages.one_line(e)}") from None

    def read_rows(self, start: int, n: int, lf: pl.LazyFrame | None = None) -> pl.DataFrame:
        """Input rows ``[start, start + n)`` in file order; an unreadable file is named."""
        try:
            return self.ds.rows(start, n, lf)
        except MrtInputError:
            raise
        except Exception as e:  # noqa: BLE001
            self.ds.find_unreadable()
            raise MrtInputError(f"cannot read {self.ds.source!r}: {_messages.one_line(e)}") from None

    def in_file(self, e: MrtInputError, row: int) -> MrtInputError:
        """An error about input row ``row`` (global), said with its file and its row there."""
        from mrt_fast.datasets.row_origin import in_file

        return in_file(e, self.ds, row)


def write_part(df: pl.DataFrame, out_dir: Path, i: int) -> int:
    """Write part ``i`` of a dataset directory atomically (a part of no rows has
    no file); returns its rows. For executors whose tasks write parts where the
    job does not run; the job records them (:meth:`Job.record_written`). On object storage
    the part gets its own name (:func:`mrt_fast.datasets.object_output.put_part`)."""
    if storage.is_url(out_dir):
        return object_output.put_part(df, str(out_dir), i)[0]
    p = part_path(Path(out_dir), i)
    if not df.height:
        p.unlink(missing_ok=True)
        return 0
    with reporting_full_disk(f"writing part {i} to", Path(out_dir)):
        _formats.write_parquet_atomic(df, p)
    return df.height


def start_row_parts(job: "Job", rows_per_part: int, n_rows: int | None, layout: str) -> tuple[int, int, int, list[int], int]:
    """The start every executor makes of a row stage's job: the input's rows (``n_rows`` when known;
    none is a one-line error), the rows a part (the job's own when it resumes), the parts, the parts
    to do and the input rows of those done before: ``(n, per, n_parts, todo, before)``."""
    n = job.count_rows() if n_rows is None else n_rows
    if n == 0:
        raise MrtInputError(f"{job.ds.source!r} has no rows: there is nothing to do")
    per = int(job.rows_per_part or rows_per_part)
    n_parts = job.n_parts or max(1, -(-n // per))
    todo = job.start(n_parts, layout=layout, rows_per_part=per, n_rows=n)
    return n, per, n_parts, todo, rows_before(n, per, n_parts, todo)


def rows_before(n_rows: int, rows_per_part: int, n_parts: int, todo: list[int]) -> int:
    """Input rows of the parts of runs of ``rows_per_part`` rows done before (not in ``todo``)."""
    left = set(todo)
    return sum(min(rows_per_part, n_rows - i * rows_per_part) for i in range(n_parts) if i not in left)


def run_all(one: Callable[[int], None], todo: list[int], workers: int) -> None:
    """``one(i)`` for every part, ``workers`` at a time (threads: the core, polars and
    Arrow release the GIL); the first failure stops the parts not started."""
    from mrt_fast.errors import SmallPoolWarning

    # the warnings filter is process-wide: set once here, not per thread (catch_warnings is not thread-safe)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SmallPoolWarning)
        if workers > 1 and len(todo) > 1:
            with ThreadPoolExecutor(max_workers=workers) as ex:
                futures = [ex.submit(one, i) for i in todo]
                try:
                    for f in futures:
                        f.result()
                except BaseException:
                    for f in futures:
                        f.cancel()
                    raise
        else:
            for i in todo:
                one(i)
