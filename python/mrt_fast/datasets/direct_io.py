"""Spill files written and read around the page cache (``O_DIRECT``).

A spill is written once and read once, soon after. Through the page cache,
a spill larger than the kernel's dirty-page threshold (a tenth of the free
memory by default) makes the writer wait on writeback and spend system time
on it: on a 2-core VM, 4.7 GB took 17 s to write that way (11 s of it system
time) and 2.9 s with ``O_DIRECT``, and the direct read back ran at the
disk's 1 GB/s. Here a spill file is written through a small aligned staging
buffer straight to the disk, and read straight into a caller's buffer that
is reused file after file (fresh memory is what costs on such a machine).
Where the file system refuses ``O_DIRECT`` (tmpfs, some network file
systems) the same code does ordinary buffered I/O.
"""

from __future__ import annotations

import errno
import mmap
import os
from pathlib import Path

import numpy as np

#: alignment of O_DIRECT offsets, lengths and buffers (a page; covers 512 B and 4 KiB sectors)
ALIGN = 4096


def _round_up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def aligned(nbytes: int) -> memoryview:
    """A writable, page-aligned buffer of at least ``nbytes`` (its own anonymous mapping)."""
    return memoryview(mmap.mmap(-1, max(ALIGN, _round_up(nbytes))))


def _open(path: str, flags: int) -> tuple[int, bool]:
    direct = getattr(os, "O_DIRECT", 0)
    if direct:
        try:
            return os.open(path, flags | direct | os.O_CLOEXEC, 0o644), True
        except OSError as e:
            if e.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                raise
    return os.open(path, flags | os.O_CLOEXEC, 0o644), False


def _buffered(fd: int) -> None:
    """Turn ``O_DIRECT`` off on an open file (a device whose blocks are larger than ``ALIGN``)."""
    import fcntl

    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~getattr(os, "O_DIRECT", 0))


def _write_all(fd: int, mv) -> None:
    off = 0
    while off < len(mv):
        try:
            off += os.write(fd, mv[off:])
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            _buffered(fd)  # refused as unaligned: carry on without O_DIRECT
            off += os.write(fd, mv[off:])


class DirectWriter:
    """A write-only binary file (what ``pyarrow.ipc.new_file`` writes to) that
    goes to disk in whole aligned blocks of ``staging`` bytes; ``close`` writes
    the last, padded block and cuts the file to its true length."""

    def __init__(self, path: str | os.PathLike, staging: int = 1 << 20):
        self.path = str(path)
        self.fd, self.direct = _open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        self.buf = aligned(max(ALIGN, _round_up(staging)))
        self.arr = np.frombuffer(self.buf, dtype=np.uint8)  # NumPy copies into it without the GIL
        self.fill = 0
        self.size = 0
        self.closed = False

    def write(self, data) -> int:
        n = len(data) if isinstance(data, bytes) else memoryview(data).nbytes
        if n < len(self.buf) - self.fill:  # most writes: a header, padding or a narrow buffer
            self.buf[self.fill:self.fill + n] = memoryview(data).cast("B")
            self.fill += n
            self.size += n
            return n
        mv = np.frombuffer(data, dtype=np.uint8)
        n, pos, cap = len(mv), 0, len(self.buf)
        while pos < n:
            k = min(n - pos, cap - self.fill)
            self.arr[self.fill:self.fill + k] = mv[pos:pos + k]
            self.fill += k
            pos += k
            if self.fill == cap:
                _write_all(self.fd, self.buf)
                self.fill = 0
        self.size += n
        return n

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        pass

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            if self.fill:
                end = _round_up(self.fill) if self.direct else self.fill
                self.buf[self.fill:end] = bytes(end - self.fill)
                _write_all(self.fd, self.buf[:end])
            if self.direct:
                os.ftruncate(self.fd, self.size)
        finally:
            os.close(self.fd)
            del self.arr
            self.buf.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_files(paths: list[Path], buffer: list | None = None) -> list[memoryview]:
    """The bytes of each file, read straight into one buffer (page-aligned slots
    back to back). ``buffer`` (a one-item list) holds the buffer between calls
    and is reused when large enough: the views of one call are valid until the
    next call with the same ``buffer``."""
    sizes = [os.path.getsize(p) for p in paths]
    need = sum(_round_up(s) for s in sizes)
    buf = buffer[0] if buffer and buffer[0] is not None and len(buffer[0]) >= need else None
    if buf is None:
        buf = aligned(need + need // 4)  # room for a somewhat larger next call
        if buffer is not None:
            buffer[:] = [buf]
    out = []
    off = 0
    for p, size in zip(paths, sizes):
        fd, _ = _open(str(p), os.O_RDONLY)
        try:
            got, end = 0, _round_up(size)
            while got < size:
                try:
                    n = os.readv(fd, [buf[off + got:off + end]])
                except OSError as e:
                    if e.errno != errno.EINVAL:
                        raise
                    _buffered(fd)
                    n = os.readv(fd, [buf[off + got:off + end]])
                if n <= 0:
                    break
                got += n
        finally:
            os.close(fd)
        if got != size:
            raise OSError(f"{p}: read {got} of {size} bytes")
        out.append(buf[off:off + size])
        off += _round_up(size)
    return out
