"""A memory cgroup for each sandboxed run, where this process may make one (cgroup v2 or v1).

The cgroup bounds everything the run's processes hold in memory, together:
anonymous memory of every process, shared memory (memfd, System V, POSIX),
tmpfs pages and the kernel's own memory for them (inodes, dentries). The
caller starts bubblewrap inside it (`MemoryCgroup.wrap`), so every process of
the run is in it from its first instruction.

`MemoryCgroup.create` returns ``None`` where no child cgroup with a memory limit
can be made here (no memory controller, a read-only cgroup file system, a v2
cgroup that does not delegate its memory controller), or when
``MRT_SANDBOX_CGROUP=off``; the sandbox then bounds memory with rlimits, mount
options and its seccomp filter instead.
"""

from __future__ import annotations

import functools
import os
import secrets
import signal
import subprocess
import time

ENV_CGROUP = "MRT_SANDBOX_CGROUP"
_PREFIX = "mrt-sandbox-"


def _mounts() -> list[tuple[str, str, str, set[str]]]:
    """(mount root, mount point, fs type, super options) of each cgroup mount of this process."""
    out = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields, rfields = left.split(), right.split()
                if len(fields) >= 5 and len(rfields) >= 3 and rfields[0] in ("cgroup", "cgroup2"):
                    out.append((fields[3], fields[4], rfields[0], set(rfields[2].split(","))))
    except OSError:
        pass
    return out


def _own_paths() -> dict[str, str]:
    """Controller (``""`` for v2) -> this process's cgroup path, from /proc/self/cgroup."""
    out: dict[str, str] = {}
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, ctrls, path = line.rstrip("\n").split(":", 2)
                for c in ctrls.split(",") if ctrls else [""]:
                    out[c] = path
    except (OSError, ValueError):
        pass
    return out


def _join(root: str, point: str, path: str) -> str | None:
    """The directory of cgroup ``path`` under a mount of cgroup ``root`` at ``point``."""
    if root != "/" and not (path == root or path.startswith(root.rstrip("/") + "/")):
        return None
    rel = path[len(root):] if root != "/" else path
    return os.path.join(point, rel.lstrip("/"))


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _candidates() -> list[tuple[int, str]]:
    """(version, directory) where a child memory cgroup might be made, v2 first."""
    own = _own_paths()
    found = []
    for root, point, fstype, opts in _mounts():
        if fstype == "cgroup2" and "" in own:
            d = _join(root, point, own[""])
            try:
                with open(os.path.join(point, "cgroup.controllers")) as f:
                    has_memory = "memory" in f.read().split()
            except OSError:
                has_memory = False
            if d and has_memory:
                found.append((2, d))
        elif fstype == "cgroup" and "memory" in opts and "memory" in own:
            d = _join(root, point, own["memory"])
            if d:
                found.append((1, d))
    return sorted(found)[::-1]


@functools.lru_cache(maxsize=None)
def _parent() -> tuple[int, str] | None:
    """A (version, directory) under which a per-run memory cgroup can be made, checked once."""
    for version, d in _candidates():
        try:
            cg = MemoryCgroup._make(version, d, 64 << 20)
        except OSError:
            continue
        try:
            moved = subprocess.run(cg.wrap(["true"]), capture_output=True, timeout=30).returncode == 0
        except (OSError, subprocess.SubprocessError):
            moved = False
        cg.close()
        if moved:
            return version, d
    return None


def available() -> tuple[int, str] | None:
    """(cgroup version, parent directory) that per-run memory cgroups go under, or ``None``."""
    if os.environ.get(ENV_CGROUP, "").strip().lower() == "off":
        return None
    return _parent()


class MemoryCgroup:
    """One run's memory cgroup: ``memory_bytes`` for all its processes together, no swap."""

    def __init__(self, version: int, path: str):
        self.version = version
        self.path = path

    @classmethod
    def create(cls, memory_bytes: int) -> MemoryCgroup | None:
        where = available()
        if where is None:
            return None
        _remove_stale(where[1])
        try:
            return cls._make(where[0], where[1], memory_bytes)
        except OSError:
            return None

    @classmethod
    def _make(cls, version: int, parent: str, memory_bytes: int) -> MemoryCgroup:
        if version == 2:
            sub = os.path.join(parent, "cgroup.subtree_control")
            with open(sub) as f:
                if "memory" not in f.read().split():
                    _write(sub, "+memory")  # refused where the parent holds processes: no cgroup then
        path = os.path.join(parent, f"{_PREFIX}{os.getpid()}-{secrets.token_hex(4)}")
        os.mkdir(path, 0o700)
        cg = cls(version, path)
        try:
            if version == 2:
                _write(os.path.join(path, "memory.max"), str(memory_bytes))
                if os.path.exists(os.path.join(path, "memory.swap.max")):
                    _write(os.path.join(path, "memory.swap.max"), "0")
            else:
                _write(os.path.join(path, "memory.limit_in_bytes"), str(memory_bytes))
                if os.path.exists(os.path.join(path, "memory.memsw.limit_in_bytes")):
                    _write(os.path.join(path, "memory.memsw.limit_in_bytes"), str(memory_bytes))
                try:
                    _write(os.path.join(path, "memory.swappiness"), "0")
                except OSError:
                    pass
        except BaseException:
            cg.close()
            raise
        return cg

    @property
    def procs_file(self) -> str:
        return os.path.join(self.path, "cgroup.procs")

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` started by a shell that first moves itself into the cgroup, then execs it."""
        return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', self.procs_file, *argv]

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of the run for passing the memory limit."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            with open(os.path.join(self.path, name)) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill" and int(value) > 0:
                        return True
        except (OSError, ValueError):
            pass
        return False

    def peak_bytes(self) -> int | None:
        """The most memory the run held at once (``None`` where the kernel does not say)."""
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        try:
            with open(os.path.join(self.path, name)) as f:
                return int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def close(self) -> None:
        """Kill whatever is still in the cgroup and remove it."""
        for _ in range(200):
            try:
                with open(self.procs_file) as f:
                    pids = [int(p) for p in f.read().split()]
            except (OSError, ValueError):
                pids = []
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.01)


def _remove_stale(parent: str) -> None:
    """Remove the empty cgroups of callers that died without removing theirs."""
    try:
        names = [n for n in os.listdir(parent) if n.startswith(_PREFIX)]
    except OSError:
        return
    for n in names:
        try:
            pid = int(n[len(_PREFIX):].split("-")[0])
        except ValueError:
            continue
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, 0)
            continue  # its caller is alive
        except ProcessLookupError:
            pass
        except OSError:
            continue
        try:
            os.rmdir(os.path.join(parent, n))
        except OSError:
            pass
