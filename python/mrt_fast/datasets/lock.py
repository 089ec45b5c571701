"""One job at a time per output: a lock file held for the job's life.

A dataset job that writes a directory holds ``DIR/.mrt/lock`` (the hidden
metadata folder, :mod:`mrt_fast.datasets.manifest`); one that writes a file
holds ``.NAME.mrt.lock`` beside it. The lock lives only while its job does.

The lock file records the holder's pid, host and start time, and the holder
keeps an exclusive ``flock`` on it until the job ends, so the kernel releases
it when the holder dies in any way (``kill -9`` included). Taking the lock:

* no lock file: a new one, written and flocked under a temporary name, is
  hard-linked into place (``link`` fails when another process was faster);
* a lock file whose flock is held: refused in one line naming the holder;
* a lock file whose flock is free, written on this host: its holder is dead;
  a new lock file is renamed over it, and whoever then holds the flock of the
  file at the path wins (of two processes taking over the same stale lock,
  one gets it, the other is refused naming the winner);
* a lock file of another host with a free flock: refused too (that host's
  process cannot be probed from here); delete the file once that job is
  known to be gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from mrt_fast.errors import MrtInputError
from mrt_fast._util.files import clean_stale_temps, parents_made, pid_alive, temp_name
from mrt_fast._util.disk_space import is_no_space, no_space_error

#: the hidden folder of a dataset directory holding the job's metadata (manifest, lock)
META_DIR = ".mrt"
LOCK_NAME = "lock"


def lock_path(output: str | os.PathLike, *, directory: bool) -> Path:
    """Where the lock of an output lives: inside a directory output, beside a file output."""
    out = Path(output)
    if directory:
        return out / META_DIR / LOCK_NAME
    return out.parent / f".{out.name}.mrt.lock"


class JobLock:
    """A held lock (see the module doc); :meth:`release` gives it back."""

    def __init__(self, path: Path, fd: int):
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def take(cls, path: str | os.PathLike, what: str = "output") -> "JobLock":
        """Take the lock at ``path`` or raise `MrtInputError` naming its live holder."""
        path = Path(path)
        if path.parent.name == META_DIR:
            path.parent.mkdir(exist_ok=True)  # a dataset directory's metadata folder
        clean_stale_temps(path)
        seen: dict | None = None
        for _ in range(1000):
            fd = _open_existing(path)
            if fd is None:
                mine = _create(path)
                if mine is not None:
                    return cls(path, mine)
                continue
            flocked = _try_flock(fd)
            if flocked is False:
                holder = _holder(fd)
                os.close(fd)
                if not _still_at(path, holder["ino"]):
                    continue
                if _changing_hands(holder):  # another process is taking over a dead holder's lock
                    seen = holder
                    time.sleep(0.005)
                    continue
                raise MrtInputError(_busy(what, path, holder))
            if not _same_file(fd, path):  # replaced or released meanwhile
                os.close(fd)
                continue
            holder = _holder(fd)
            if holder.get("host") not in (None, socket.gethostname()):
                os.close(fd)
                raise MrtInputError(_busy(what, path, holder, other_host=True))
            if flocked is None and not _changing_hands(holder):  # no flock here: the pid alone tells
                os.close(fd)
                raise MrtInputError(_busy(what, path, holder))
            mine = _take_over(path, fd)
            if mine is not None:
                return cls(path, mine)
        if seen is not None:  # held all along by a process this host cannot see
            raise MrtInputError(_busy(what, path, seen))
        raise MrtInputError(f"cannot take the lock {str(path)!r}: it keeps changing hands")

    def release(self) -> None:
        """Remove the lock file (if it is still ours) and drop the flock."""
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            if _same_file(self._fd, self.path):
                os.unlink(self.path)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> "JobLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


@contextlib.contextmanager
def output_lock(output: str | os.PathLike, *, directory: bool) -> Iterator[JobLock]:
    """Hold the lock of a job's output for the block.

    A directory output is created if missing (the lock lives in it) and removed
    again on the way out if this call created it and it is empty then; so are
    missing parent directories, of a file output as of a directory output.
    Refused in one line when the path is a file where a directory is wanted,
    or another live job holds the lock."""
    out = Path(output)
    with parents_made(out), _output_lock(out, directory=directory) as lock:
        yield lock


@contextlib.contextmanager
def _output_lock(out: Path, *, directory: bool) -> Iterator[JobLock]:
    created = False
    if directory:
        if out.exists() and not out.is_dir():
            raise MrtInputError(f"output {str(out)!r} exists and is not a directory")
        try:
            out.mkdir()
            created = True
        except FileExistsError:
            pass
        except OSError as e:
            if is_no_space(e):
                raise no_space_error("creating the output directory", out) from None
            raise MrtInputError(f"cannot create the output directory {str(out)!r}: {e.strerror or e}") from None
        if (out / META_DIR).is_symlink():
            _remove_if_empty(out, created)
            raise MrtInputError(f"{str(out / META_DIR)!r} is a symbolic link; an mrt output's metadata folder is "
                                "its own folder, never followed: remove the link")
        try:
            (out / META_DIR).mkdir(exist_ok=True)
        except OSError as e:
            _remove_if_empty(out, created)
            raise MrtInputError(f"cannot create {str(out / META_DIR)!r}: {e.strerror or e}") from None
    try:
        lock = JobLock.take(lock_path(out, directory=directory), f"output {str(out)!r}")
    except OSError as e:
        _remove_if_empty(out, created)
        if is_no_space(e):
            raise no_space_error("taking the lock of", out) from None
        raise MrtInputError(f"cannot lock the output {str(out)!r}: {e.strerror or e}") from None
    except BaseException:
        _remove_if_empty(out, created)
        raise
    try:
        yield lock
    finally:
        lock.release()
        _remove_if_empty(out, created)


def _remove_if_empty(out: Path, created: bool) -> None:
    """Remove an empty metadata folder, and the output directory if this job created it and it is empty."""
    with contextlib.suppress(OSError):
        (out / META_DIR).rmdir()
    if created:
        with contextlib.suppress(OSError):
            out.rmdir()


# --------------------------------------------------------------------------- lock files


def _record() -> bytes:
    return (json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}) + "\n").encode()


def _new_lock_file(path: Path) -> tuple[int, Path]:
    """A flocked file holding this process's record under a temporary name beside ``path``."""
    for _ in range(100):
        tmp = path.with_name(temp_name(path))
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            continue
        try:
            _flock(fd)
            os.write(fd, _record())
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return fd, tmp
    raise MrtInputError(f"cannot create a lock file beside {str(path)!r}")


def _create(path: Path) -> int | None:
    """A new lock at ``path`` (None when another process made one first)."""
    fd, tmp = _new_lock_file(path)
    try:
        os.link(tmp, path)
    except FileExistsError:
        return _discard(fd, tmp)
    except OSError:  # no hard links here: exclusive create (a short unlocked moment, checked below)
        _discard(fd, tmp)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return None
        _flock(fd)
        os.write(fd, _record())
        if _same_file(fd, path):
            return fd
        os.close(fd)
        return None
    os.unlink(tmp)
    return fd


def _take_over(path: Path, stale: int) -> int | None:
    """Replace the lock file of a dead holder (flocked at ``stale``) with ours;
    None when yet another process replaced it meanwhile."""
    fd, tmp = _new_lock_file(path)
    os.replace(tmp, path)
    os.close(stale)
    if _same_file(fd, path):
        return fd
    os.close(fd)
    return None


def _discard(fd: int, tmp: Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(tmp)
    os.close(fd)


def _open_existing(path: Path) -> int | None:
    try:
        return os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return None


def _flock(fd: int) -> None:
    if _try_flock(fd) is False:
        raise MrtInputError("cannot lock a file this process just created")


def _try_flock(fd: int) -> bool | None:
    """An exclusive flock without waiting: True when taken, False when another
    open file holds it, None where the platform or file system has no flock
    (the recorded pid alone then tells whether the holder lives)."""
    try:
        import fcntl
    except ImportError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:  # ENOLCK, EOPNOTSUPP, ...
        return None
    return True


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    me = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (me.st_dev, me.st_ino)


def _still_at(path: Path, ino: int) -> bool:
    try:
        return os.stat(path).st_ino == ino
    except FileNotFoundError:
        return False


def _changing_hands(holder: dict) -> bool:
    """A flocked lock file whose record is not of a live process: it is being
    created (no record yet) or taken over (the record of a dead holder here)."""
    pid = holder.get("pid")
    if not isinstance(pid, int):
        return True
    return holder.get("host") == socket.gethostname() and not pid_alive(pid)

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, not ours to signal
        return True
    return True


def _holder(fd: int) -> dict:
    """The record of the lock file open at ``fd`` (what could be read of it) and its inode."""
    try:
        raw = os.pread(fd, 4096, 0)
        d = json.loads(raw.decode("utf-8", "replace") or "{}")
        if not isinstance(d, dict):
            d = {}
    except (OSError, ValueError):
        d = {}
    d["ino"] = os.fstat(fd).st_ino
    return d


def _busy(what: str, path: Path, holder: dict, other_host: bool = False) -> str:
    pid, host = holder.get("pid", "?"), holder.get("host", "?")
    started = holder.get("started")
    since = f" since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(started))}" \
        if isinstance(started, (int, float)) else ""
    msg = f"{what} is in use by another job (pid {pid} on host {host}{since}; lock {str(path)!r})"
    if other_host:
        msg += "; if that job is no longer running, delete the lock file and run again"
    else:
        msg += "; wait for it to finish, or stop it, then run again"
    return msg
