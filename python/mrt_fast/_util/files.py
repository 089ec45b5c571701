"""Files written atomically: a temporary file beside the destination, renamed into place.

Temporary files are named ``.NAME.HOST-PID.RANDOM.tmp`` and created with mode
``0666`` minus the umask (what the finished file keeps). A process killed
before its rename (kill -9, SIGTERM, power loss) leaves its temporary file
behind; the next write into the same directory removes such files of the same
destination whose writer ran on this host and is no longer alive, and leaves
every other file alone (a live concurrent writer's, another host's, anything
not matching the pattern).

An output's missing parent directories are made when it is written, for a
file as for a directory (:func:`make_parents`); a check before any work
(:func:`check_output_dir`) makes nothing."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import socket
from collections.abc import Iterator
from pathlib import Path
from mrt_fast.errors import MrtInputError
from mrt_fast._util.messages import one_line


def host_tag() -> str:
    """This host's name, reduced to the characters a temp-file name keeps."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname())[:32] or "host"


_TMP_RE = r"^\.{name}\.(?P<host>[A-Za-z0-9_-]+)-(?P<pid>\d+)\.[0-9a-f]{{8}}\.tmp$"


def pid_alive(pid: int) -> bool:
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
    host = host_tag()
    removed = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for e in entries:
        m = pat.match(e.name)
        if m is None or m["host"] != host or int(m["pid"]) == os.getpid() or pid_alive(int(m["pid"])):
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
    return f".{Path(path).name}.{host_tag()}-{os.getpid() if pid is None else pid}.{secrets.token_hex(4)}.tmp"


def make_parents(path: str | os.PathLike) -> list[Path]:
    """Make the missing directories above ``path``; returns those made, deepest first. A
    file where a directory is needed, or one that cannot be made, is one line."""
    made: list[Path] = []
    parent = Path(path).parent
    while str(parent) not in ("", ".") and not parent.exists() and not parent.is_symlink():
        made.append(parent)
        parent = parent.parent
    for d in reversed(made):
        try:
            d.mkdir(exist_ok=True)
        except OSError as e:
            raise MrtInputError(f"cannot create the output directory {str(d)!r}: {e.strerror or one_line(e)}") \
                from None
    return made


def remove_if_empty(dirs: list[Path]) -> None:
    """Remove each of ``dirs`` (deepest first) that is empty: directories made for an output
    that was never written."""
    for d in dirs:
        with contextlib.suppress(OSError):
            d.rmdir()


@contextlib.contextmanager
def parents_made(path: str | os.PathLike) -> Iterator[list[Path]]:
    """The missing directories above ``path`` made for the block (:func:`make_parents`); those
    still empty when it ends (nothing was written into them) are removed again."""
    made = make_parents(path)
    try:
        yield made
    finally:
        remove_if_empty(made)


def new_temp(path: Path, clean: bool = True) -> Path:
    """Create an empty temp file beside ``path`` (mode 0666 minus the umask; missing parent
    directories are made) and return its path."""
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        make_parents(path)
    if clean:
        clean_stale_temps(path)
    for _ in range(100):
        tmp = parent / temp_name(path)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        except OSError as e:
            raise MrtInputError(f"cannot write to {str(parent)!r}: {one_line(e)}") from None
        os.close(fd)
        return tmp
    raise MrtInputError(f"cannot create a temporary file in {str(parent)!r}")


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
    tmp = new_temp(path, clean)
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


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write bytes to a temp file beside ``path`` and rename it into place."""
    with atomic_path(path, clean=False) as tmp:
        tmp.write_bytes(data)


def remove_stale_temps(directory: Path) -> int:
    """Delete the temp files in ``directory`` left by killed writers (see :func:`clean_stale_temps`)."""
    return len(clean_stale_temps(Path(directory) / "x", any_name=True))
