"""What a batch job may hold in memory: the limit, less what the process holds already.

A memory limit bounds the peak resident memory of the whole process. The
interpreter with polars, Arrow and NumPy loaded is itself 100 to 200 MiB, so
the job's own working memory is the limit minus the resident memory when the
job starts (the *base*) minus a little headroom. Every phase is planned
within that budget:

* the spill pass: each thread holds a Parquet reader, a few copies of its
  current batch and one staging block per open bucket file
  (:func:`spill_thread_bytes`);
* reading an input that fits whole: a few copies of each reading thread's
  batch besides the table (:func:`whole_read_bytes`);
* selection: each worker holds a few copies of its bucket (``WORK_FACTOR``
  in :mod:`mrt_fast.datasets.executors.local_plan`) besides a fixed ``SELECT_WORKER``; what the
  spill pass leaves resident is measured again before selection starts.

A limit the job cannot be planned in is refused before any work, in one
line naming the smallest limit that would do (:meth:`Budget.refusal`).
"""

from __future__ import annotations

import functools
import math
import os
import re
import resource
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from mrt_fast.errors import MrtInputError

MiB = 2**20
#: room kept free of any plan: the run's Python objects, allocator slack
HEADROOM = 24 * MiB
#: a spill thread's fixed cost: its Parquet reader's buffers and its allocators' heaps
SPILL_THREAD = 40 * MiB
#: a spill thread's batch, in copies of its bytes (decoded, the next one decoded ahead, cut by bucket,
#: encoded, allocator slack)
SPILL_COPIES = 13
#: a spill thread's decoded chunk of row groups, in copies of its bytes (pages, decoded, as Arrow)
CHUNK_COPIES = 4
#: a selecting worker's fixed cost (its thread's allocator heaps, the core's scratch), besides its bucket
SELECT_WORKER = 24 * MiB
#: reading a whole input into memory: copies of each reading thread's batch
WHOLE_READ_COPIES = 5
#: smallest batch of the spill pass
MIN_BATCH_ROWS = 1024
#: smallest batch of a spill thread that decodes whole row groups (smaller batches, if that lets it)
MIN_WHOLE_BATCH_ROWS = 16_384
#: staging block of an open bucket file: preferred, and the least a tight budget gets
STAGING = 1 << 20
MIN_STAGING = 16 << 10
#: datasets read by polars' streaming engine (JSONL, hive partitions): a few of its morsels per core
POLARS_READ_COPIES = 4

_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9, "t": 1e12, "tb": 1e12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_memory(value: Any) -> int:
    """Bytes from ``2GB``, ``512MiB``, ``1.5g`` or a number of bytes."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        n = int(value)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
        if not m or m.group(2).lower() not in _UNITS:
            raise MrtInputError(f"memory limit {value!r}: expected a size such as 2GB, 512MiB or 1500000000")
        n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if n < 64 * 2**20:
        raise MrtInputError(f"memory limit {value!r} is below 64 MiB")
    return n


def available_memory() -> int:
    """Memory available to this process: MemAvailable, capped by a cgroup limit."""
    avail = None
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    if avail is None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            avail = 4 * 2**30
    try:
        raw = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if raw != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
            avail = min(avail, int(raw) - used)
    except (OSError, ValueError):
        pass
    return max(int(avail), 256 * 2**20)


def default_memory_limit() -> int:
    """Half of the memory available now, plus what this process holds already."""
    return available_memory() // 2 + rss()


def rss() -> int:
    """Resident memory of this process now (bytes)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return peak_rss()


def peak_rss() -> int:
    """Peak resident memory of this program so far (bytes): VmHWM, which starts again at exec
    (``ru_maxrss`` keeps the high-water mark of the process that forked it)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def release_unused() -> None:
    """Hand the memory Arrow's allocator and the C allocator keep for reuse back to the system (between
    phases)."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


#: blocks of at least this size are mapped on their own by the C allocator, and unmapped when freed
MMAP_THRESHOLD = 1 * MiB
#: glibc's mallopt parameter of the mmap threshold
_M_MMAP_THRESHOLD = -3
_pinned = [False]


def hold_to_limit() -> bool:
    """Fix the C allocator's mmap threshold at :data:`MMAP_THRESHOLD` for this process (glibc only; once).

    glibc raises its threshold to the size of each large block freed (up to 32 MiB), so later blocks of
    that size come from its heaps, which keep freed memory resident: a job whose pools and buckets
    vary in size then holds freed blocks it counted as returned, and goes over its limit. A fixed
    threshold maps every large block on its own and returns it when freed. A job with a memory limit
    calls this before any work; returns whether the threshold is set."""
    if _pinned[0]:
        return True
    libc = _glibc()
    if libc is None:
        return False
    _pinned[0] = bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    return _pinned[0]


@functools.lru_cache(maxsize=1)
def _glibc():
    """The process's C library when it is glibc (mallopt and malloc_trim), else None."""
    import ctypes
    import platform

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc


def size_text(n: float) -> str:
    """``123 MiB`` / ``1.5 GiB``: how a size is named in a message."""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{math.ceil(n / MiB)} MiB"


def spill_thread_bytes(batch_rows: int, row_bytes: float, n_files: int, staging: int) -> int:
    """Memory of one spill thread: reader, batch copies, a staging block per open bucket file."""
    return int(SPILL_THREAD + SPILL_COPIES * batch_rows * row_bytes + n_files * (staging + (16 << 10)))


@dataclass(frozen=True)
class Budget:
    """A memory limit and the resident memory of the process when the job started."""

    limit: int
    base: int

    @classmethod
    def now(cls, limit: int) -> "Budget":
        return cls(int(limit), rss())

    @property
    def work(self) -> int:
        """Bytes the job itself may hold at once."""
        return self.limit - self.base - HEADROOM

    def with_work(self, work: int) -> "Budget":
        """The budget of the same process under the limit that leaves ``work`` bytes to the job."""
        return Budget(self.base + HEADROOM + int(work), self.base)

    def refusal(self, least: int, what: str) -> MrtInputError:
        """The one-line refusal of this limit for ``what``, naming ``least``, the smallest limit that does."""
        least = math.ceil(least / (16 * MiB)) * 16 * MiB
        if least >= 2**30:  # said in tenths of a GiB: rounded up, never below what is needed
            least = math.ceil(round(least / (0.1 * 2**30), 6)) * 0.1 * 2**30
        return MrtInputError(
            f"memory limit {size_text(self.limit)} is too small for {what}: this process holds "
            f"{size_text(self.base)} already; use a limit of at least {size_text(least)}")


def least_work(fits: Callable[[int], bool], most: int) -> int:
    """The smallest work (to 1 MiB) for which ``fits`` holds, given that it holds at ``most``."""
    lo, hi = 0, max(MiB, int(most))
    while not fits(hi):  # pragma: no cover - ``most`` fits by the caller's word
        hi *= 2
    while hi - lo > MiB:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid
    return hi


@dataclass(frozen=True)
class SpillPlan:
    """How the spill pass reads: threads, rows per batch, staging block per bucket file,
    and the most rows of row groups a thread decodes at once (0: a batch at a time)."""

    threads: int
    batch_rows: int
    staging: int
    chunk_rows: int = 0


def spill_batch_rows(n_buckets: int) -> int:
    """Rows per batch of the spill pass, memory permitting: about 4096 rows per bucket
    (fewer, larger record batches), at least 16,384 and at most 200,000."""
    return min(200_000, max(16_384, 4096 * n_buckets))


def plan_spill(budget: Budget, row_bytes: float, n_buckets: int, threads: int,
               n_rows: int | None, group_rows: int = 0, lent: int = 0) -> SpillPlan | None:
    """The spill pass within the budget: as many of ``threads`` as fit, batches of
    about 4096 rows per bucket (fewer, larger record batches; at most 200,000
    rows), a staging block per bucket file of up to 1 MiB, and what is left
    of the thread's share for decoding row groups whole (``chunk_rows``).

    The staging blocks of a thread take at most a quarter of what it has beyond
    its fixed cost, plus its share of half of ``lent``: memory the pass may
    borrow because nothing else holds it while the pass runs (the selection's
    share; a block is its own mapping, gone when its file is closed). A small
    block makes many small writes, which a disk does slowly.

    With ``group_rows`` (the largest row group, where whole row groups decode
    faster than a batch at a time), the most threads whose share decodes such a
    group whole, with batches made smaller for it down to 16,384 rows, where
    fewer threads than fit do; otherwise the thread count with the most rows
    in its batches at once. None when one thread with the smallest batch does
    not fit."""
    n_files = n_buckets + 1
    want = spill_batch_rows(n_buckets) if n_rows else 100_000
    rb = max(1.0, row_bytes)
    plans = []
    for t in range(max(1, threads), 0, -1):
        per = budget.work / t
        borrowed = max(0, int(lent)) / (2 * t)
        spare = per - spill_thread_bytes(MIN_BATCH_ROWS, row_bytes, n_files, 0)
        staging = STAGING
        while staging > MIN_STAGING and n_files * staging > spare / 4 + borrowed:
            staging //= 2
        fixed = spill_thread_bytes(0, row_bytes, n_files, 0) + max(0.0, n_files * staging - borrowed)
        rows = int((per - fixed) / (SPILL_COPIES * rb))
        if rows >= MIN_BATCH_ROWS:
            batch = min(want, rows)
            if group_rows:  # a smaller batch, if that lets the thread decode a whole row group
                fit = int((per - fixed - CHUNK_COPIES * group_rows * rb) / (SPILL_COPIES * rb))
                if fit >= min(batch, MIN_WHOLE_BATCH_ROWS):
                    batch = min(batch, fit)
            left = per - fixed - SPILL_COPIES * batch * rb
            plan = SpillPlan(t, batch, staging, max(0, int(left / (CHUNK_COPIES * rb))))
            if plan.chunk_rows >= group_rows:
                return plan
            plans.append(plan)
    # else the most rows in flight: more threads of tiny batches spend their time on batches
    return max(plans, key=lambda p: p.threads * p.batch_rows, default=None)


def whole_read_bytes(total_bytes: int, row_bytes: float, batch_rows: int) -> int:
    """Memory of reading a whole input into one frame besides the frame itself: every reading
    thread decodes a batch of ``batch_rows`` rows at a time, each batch held a few times over
    (pages read, decompressed, decoded, copied into place)."""
    threads = os.cpu_count() or 1
    return int(WHOLE_READ_COPIES * min(total_bytes, threads * batch_rows * row_bytes))


def polars_read_bytes(row_group_bytes: int) -> int:
    """Memory of polars' streaming engine reading a dataset whose largest row group (or file) is this big."""
    try:
        import polars as pl

        cores = pl.thread_pool_size()
    except Exception:  # noqa: BLE001
        cores = os.cpu_count() or 1
    return int(POLARS_READ_COPIES * cores * row_group_bytes)
