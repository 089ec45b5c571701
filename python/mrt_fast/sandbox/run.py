"""Running untrusted generated programs in isolation (bubblewrap).

Each program runs under ``bwrap`` (bubblewrap, Debian/Ubuntu package
``bubblewrap``) in its own pid, network, IPC, UTS and mount namespaces, with a
read-only view of ``/usr``, ``/lib*`` and the interpreter's prefix, a fresh
``/proc`` of its own pid namespace, a minimal read-only ``/dev`` (no host
``/dev/shm``), a private size-capped tmpfs as its working directory and no
environment from the caller. Inside, a supervisor (`mrt_fast.sandbox.boot`)
forks the program, which drops to its own user id (when the caller is root) and
sets ``RLIMIT_CPU``, ``RLIMIT_AS``, ``RLIMIT_NPROC``, ``RLIMIT_FSIZE``,
``RLIMIT_NOFILE`` and ``RLIMIT_CORE`` before any of its code runs (where the
caller may make one, a per-run memory cgroup holds the whole run to
``memory_mb``; without one, seccomp refuses memfd and System V shared memory); the
supervisor reports the exit status and CPU time on a pipe the program never
holds. A seccomp filter (`mrt_fast.sandbox.seccomp`, compiled by libseccomp where it is
installed) refuses nested user namespaces, ptrace, keyrings, bpf, io_uring,
mounts, sockets and the like.

The caller reads stdout and stderr through pipes with a byte cap and a wall
clock deadline; at the deadline, or when the cap is passed, it kills the pid
namespace's init, which takes every process of the namespace with it (a
``fork`` + ``setsid`` child included), and waits until it is gone.

Status labels (`STATUSES`), decided from how the run ended, a limit only from
evidence the sandbox owns, never from what the program printed:

* ``timeout``: the wall clock deadline passed (the caller killed it);
* ``output_limit``: stdout + stderr passed ``output_mb`` (the caller killed it);
* ``cpu_limit``: killed by ``SIGXCPU`` or ``SIGKILL`` after using its CPU time;
* ``memory_limit``: a ``MemoryError`` (an allocation refused under
  ``RLIMIT_AS``) reached the top level while the program's peak address space
  was at least half its ``RLIMIT_AS``, or the memory cgroup's OOM killer struck;
* ``error``: any other non-zero exit or signal (``sys.exit(86)``, a self-sent
  ``SIGXCPU``), or no report from the supervisor (`ExecResult.reason`);
* ``passed`` / ``failed``: exit code 0, and the output matches the expected one
  (``passed``) or not (``failed``); ``passed`` when no expected output is given.

Without bubblewrap (or where it cannot create the namespaces) `run_program`
refuses with `SandboxUnavailableError`, unless the caller opts in to running
generated code with no isolation: ``isolation="none-i-understand"`` or the
environment variable ``MRT_SANDBOX_ISOLATION=none-i-understand``. See
docs/guides/sandbox.md for the threat model.
"""

from __future__ import annotations

import functools
import json
import math
import os
import random
import resource
import select
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from mrt_fast.sandbox.seccomp import compile_filter
from mrt_fast.errors import MrtInputError, SandboxUnavailableError
from mrt_fast.sandbox.cgroup import MemoryCgroup

STATUSES = ("passed", "failed", "error", "timeout", "cpu_limit", "memory_limit", "output_limit")
BWRAP = "bwrap"
UNISOLATED = "none-i-understand"
ISOLATIONS = (BWRAP, UNISOLATED)
ENV_ISOLATION = "MRT_SANDBOX_ISOLATION"

_BOOT = Path(__file__).with_name("boot.py")
MEMORY_EXIT = 86  # the same codes as in _sandbox_boot
SETUP_EXIT = 85
_WORKDIR = "/sandbox"  # the private tmpfs; /tmp links to it unless the interpreter lives under /tmp
_BOOT_IN_SANDBOX = "/.sandbox/boot.py"
_CODE_IN_SANDBOX = "/.sandbox/program.py"
_FILTER_IN_SANDBOX = "/.sandbox/filter.bpf"
_MIN_PROGRAM_MB = 24  # RLIMIT_AS an interpreter needs to start
_CAP_SETGID, _CAP_SETUID = 6, 7
#: the share of ``cpu_s`` a program must have used for a SIGXCPU/SIGKILL to be RLIMIT_CPU's: the kernel
#: counts that limit by sampling at scheduler ticks, the report gives the precise run time, and on a busy
#: machine the two differ by several percent (a run signalled at its 2 s limit reported 1.93 s)
_CPU_SHARE = 0.75
_MAX_WAIT_S = 3600.0  # the longest single wait; a longer deadline is waited for in steps
_MIN_BWRAP = (0, 8, 0)
_SYSTEM_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


@dataclass
class ExecResult:
    """What a sandboxed run did.

    ``status``: one of `STATUSES`. ``returncode``: the program's exit code, or
    minus the signal that ended it; ``None`` when the caller killed the run or
    the supervisor did not report. ``cpu_s``: CPU time of the program and its
    reaped descendants (``None`` without a report). ``isolation``: ``"bwrap"``
    or ``"none-i-understand"``. ``memory_bound``: ``"cgroup"`` when a memory
    cgroup held the whole run to ``memory_mb``, ``"rlimit"`` when rlimits, the
    tmpfs caps and the seccomp filter did (see docs/guides/sandbox.md).
    ``memory_peak_bytes``: the most the run's cgroup held at once (``None``
    without a cgroup).
    """

    status: str
    returncode: int | None
    stdout: str
    stderr: str
    wall_s: float
    isolation: str
    cpu_s: float | None = None
    memory_bound: str = "rlimit"
    memory_peak_bytes: int | None = None

    @property
    def ok(self) -> bool:
        return self.status == "passed"

    @property
    def network_namespace(self) -> bool:
        return self.isolation == BWRAP

    @property
    def reason(self) -> str:
        """The status, or for ``error`` how the program ended: ``exit 86``, ``signal SIGXCPU``
        (``no report`` when the supervisor wrote none)."""
        if self.status != "error":
            return self.status
        if self.returncode is None:
            return "no report"
        if self.returncode >= 0:
            return f"exit {self.returncode}"
        try:
            return f"signal {signal.Signals(-self.returncode).name}"
        except ValueError:
            return f"signal {-self.returncode}"


# ------------------------------------------------------------------ isolation choice


def _bwrap_exe() -> str | None:
    return shutil.which("bwrap") or (
        "/usr/bin/bwrap" if os.access("/usr/bin/bwrap", os.X_OK) else None)


def resolve_isolation(isolation: str | None = None) -> str:
    """The isolation mode to use: the argument, else ``$MRT_SANDBOX_ISOLATION``, else ``"bwrap"``."""
    mode = isolation if isolation is not None else (os.environ.get(ENV_ISOLATION) or BWRAP)
    if mode not in ISOLATIONS:
        raise MrtInputError(f"isolation must be one of {list(ISOLATIONS)}, got {mode!r}")
    return mode


@functools.lru_cache(maxsize=None)
def _bwrap_problem_cached(exe: str | None, python: str) -> str | None:
    if exe is None:
        return "the bwrap executable (bubblewrap) is not on PATH"
    try:
        v = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30).stdout.split()
        version = tuple(int(x) for x in v[-1].split(".")[:3])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        version = None
    if version is not None and version < _MIN_BWRAP:
        return (f"bubblewrap {'.'.join(map(str, _MIN_BWRAP))} or newer is needed "
                f"(--disable-userns, --size), found {'.'.join(map(str, version))}")
    try:
        r = _run_bwrap(exe, "print('ok')", "", python=python, timeout_s=30.0, cpu_s=10,
                       memory_bytes=512 << 20, output_bytes=1 << 16, disk_bytes=1 << 20, max_processes=16)
    except OSError as e:
        return f"bwrap could not be started: {e}"
    if r.status != "passed" or r.stdout.strip() != "ok":
        why = (r.stderr.strip().splitlines() or [f"status {r.status}"])[-1]
        return f"bwrap cannot create the sandbox here ({why[:300]})"
    return None


def bwrap_problem(python: str | None = None) -> str | None:
    """Why bubblewrap cannot isolate programs here, or ``None`` when it can (checked once per interpreter)."""
    return _bwrap_problem_cached(_bwrap_exe(), python or sys.executable)


def require_isolation(isolation: str | None = None, python: str | None = None) -> str:
    """The usable isolation mode, or `SandboxUnavailableError` (before any program runs)."""
    mode = resolve_isolation(isolation)
    if mode == BWRAP:
        why = bwrap_problem(python)
        if why is not None:
            raise SandboxUnavailableError(
                f"refusing to run generated code: {why}. Install bubblewrap (Debian/Ubuntu: "
                f"`apt-get install bubblewrap`), or opt in to running it with no isolation at all "
                f"with isolation={UNISOLATED!r} or {ENV_ISOLATION}={UNISOLATED} (see docs/guides/sandbox.md)")
    return mode


# ------------------------------------------------------------------ running


def run_program(
    code: str,
    stdin: str = "",
    *,
    expected_output: str | None = None,
    timeout_s: float = 10.0,
    cpu_s: int = 5,
    memory_mb: int = 512,
    output_mb: float = 16,
    disk_mb: int | None = None,
    max_processes: int = 32,
    python: str | None = None,
    isolation: str | None = None,
) -> ExecResult:
    """Run Python source ``code`` with ``stdin`` in the sandbox; never raises for what the program does.

    ``expected_output``: when given, an exit code 0 gives ``passed`` only if the
    output matches it (`outputs_match`), else ``failed``. ``memory_mb`` bounds all
    the memory of the run (see docs/guides/sandbox.md); ``output_mb`` caps stdout +
    stderr together; ``disk_mb`` (default ``min(64, memory_mb // 4)``) is the size
    of the private working directory, a tmpfs counted in ``memory_mb``;
    ``max_processes`` counts processes and threads. Raises
    `SandboxUnavailableError` when bubblewrap cannot be used and the caller has
    not opted in to ``isolation="none-i-understand"``.
    """
    if not isinstance(code, str) or not isinstance(stdin, str):
        raise MrtInputError(f"code and stdin must be str, got {type(code).__name__} and {type(stdin).__name__}")
    if expected_output is not None and not isinstance(expected_output, str):
        raise MrtInputError(f"expected_output must be a str, got {type(expected_output).__name__}")
    _check_encodable("code", code)
    _check_encodable("stdin", stdin)
    if disk_mb is None and isinstance(memory_mb, (int, float)) and not isinstance(memory_mb, bool) \
            and math.isfinite(memory_mb):
        disk_mb = max(1, min(64, int(memory_mb) // 4))
    for name, v, lo in (("timeout_s", timeout_s, 0), ("cpu_s", cpu_s, 1), ("memory_mb", memory_mb, 32),
                        ("output_mb", output_mb, 0), ("disk_mb", disk_mb, 1), ("max_processes", max_processes, 1)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < lo \
                or (lo == 0 and v == 0):
            raise MrtInputError(f"{name} must be a finite number {'>' if lo == 0 else '>='} {lo}, got {v!r}")
    if int(cpu_s) != cpu_s or int(max_processes) != max_processes:
        raise MrtInputError("cpu_s and max_processes must be whole numbers")
    if memory_mb - disk_mb < _MIN_PROGRAM_MB:
        raise MrtInputError(
            f"memory_mb={memory_mb!r} must exceed disk_mb={disk_mb!r} by at least {_MIN_PROGRAM_MB}: the working "
            f"directory is a tmpfs, so its files count in memory_mb")
    python = python or sys.executable
    if not os.path.isabs(python):
        python = shutil.which(python) or os.path.abspath(python)
    mode = require_isolation(isolation, python)
    limits = dict(timeout_s=float(timeout_s), cpu_s=int(cpu_s), memory_bytes=int(memory_mb * (1 << 20)),
                  output_bytes=max(1, int(output_mb * (1 << 20))), disk_bytes=int(disk_mb * (1 << 20)),
                  max_processes=int(max_processes))
    _check_settable(limits, dict(cpu_s=cpu_s, memory_mb=memory_mb, disk_mb=disk_mb, max_processes=max_processes))
    if mode == BWRAP:
        r = _run_bwrap(_bwrap_exe(), code, stdin, python=python, **limits)
    else:
        r = _run_unisolated(code, stdin, python=python, **limits)
    if r.status == "passed" and expected_output is not None and not outputs_match(r.stdout, expected_output):
        r.status = "failed"
    return r


def _check_encodable(name: str, text: str) -> None:
    """Refuse text that has no UTF-8 bytes (a lone surrogate outside the ``surrogateescape`` range)."""
    try:
        text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as e:
        raise MrtInputError(f"{name} holds a lone surrogate {text[e.start]!r} at index {e.start}, which has "
                            f"no UTF-8 bytes to pass to the program") from None


_RLIM_MAX = (1 << 63) - 1  # what setrlimit takes short of RLIM_INFINITY


def _rlimit_values(limits: dict) -> dict:
    """Each rlimit the program gets (soft value; RLIMIT_CPU's hard value is one more)."""
    return {resource.RLIMIT_CPU: limits["cpu_s"] + 1, resource.RLIMIT_AS: _program_memory(limits),
            resource.RLIMIT_FSIZE: limits["disk_bytes"], resource.RLIMIT_NPROC: limits["max_processes"]}


def _check_settable(limits: dict, given: dict) -> None:
    """Refuse a limit the program's process could not set: above what setrlimit takes, or above this
    process's hard limit, which the sandbox inherits and cannot raise."""
    names = {resource.RLIMIT_CPU: ("cpu_s", "RLIMIT_CPU"), resource.RLIMIT_AS: ("memory_mb", "RLIMIT_AS"),
             resource.RLIMIT_FSIZE: ("disk_mb", "RLIMIT_FSIZE"), resource.RLIMIT_NPROC: ("max_processes", "RLIMIT_NPROC")}
    for res, value in _rlimit_values(limits).items():
        arg, rname = names[res]
        hard = resource.getrlimit(res)[1]
        top = _RLIM_MAX if hard == resource.RLIM_INFINITY else min(hard, _RLIM_MAX)
        if value > top:
            raise MrtInputError(f"{arg}={given[arg]!r} cannot be set: it needs {rname} {value}, above the "
                                f"{'hard limit ' if top == hard else 'largest value '}{top} allowed here")


def _max_files() -> int:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return 256 if hard == resource.RLIM_INFINITY else min(256, hard)


def _program_memory(limits: dict) -> int:
    """RLIMIT_AS of each process of the program: memory_mb less the tmpfs it may fill."""
    return limits["memory_bytes"] - limits["disk_bytes"]


def _inode_cap(disk_bytes: int) -> int:
    """Files the private tmpfs may hold (each costs the kernel about 1 KB)."""
    return 1024 + disk_bytes // (64 << 10)


def _close_all(fds: list[int]) -> None:
    """Close every descriptor of ``fds`` (each still owned: closed nowhere else)."""
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, 0)
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _under(path: str, root: str) -> bool:
    return os.path.commonpath([path, root]) == root


def _interpreter_dirs(python: str) -> list[tuple[str, str]]:
    """(source, destination) directories the interpreter needs, besides /usr and /lib*."""
    def prefix_of(exe: str) -> str:  # PREFIX/bin/python -> PREFIX; anywhere else only its own directory
        d = os.path.dirname(exe)
        return os.path.dirname(d) if os.path.basename(d) == "bin" else d

    cands = [prefix_of(python), prefix_of(os.path.realpath(python))]
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        cands += [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
    out: list[tuple[str, str]] = []
    for d in cands:
        d = os.path.abspath(d)
        real = os.path.realpath(d)
        for dest in (real, d):
            if dest == "/" or _under(dest, "/usr") or any(_under(dest, o) for _, o in out):
                continue
            out = [(s, o) for s, o in out if not _under(o, dest)] + [(real, dest)]
    return out


def _bwrap_argv(exe: str, python: str, *, privileged: bool, disk_bytes: int, code_fd: int, boot_fd: int,
                info_fd: int, seccomp_fd: int | None, config: dict) -> list[str]:
    """The bubblewrap command line. A root caller's supervisor mounts the working directory itself (a
    tmpfs with an inode cap, which bubblewrap's ``--tmpfs`` lacks), then drops CAP_SYS_ADMIN and loads
    the filter; otherwise bubblewrap mounts it (size only) and loads the filter."""
    a = [exe, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
         "--die-with-parent", "--new-session", "--hostname", "sandbox", "--cap-drop", "ALL"]
    if privileged:  # the supervisor drops the program to its own user id: keep only what that needs
        a += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SYS_ADMIN"]
    else:
        a += ["--unshare-user", "--disable-userns"]
    a += ["--ro-bind", "/usr", "/usr"]
    for d in _SYSTEM_DIRS:
        if os.path.islink(d):
            a += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            a += ["--ro-bind", d, d]
    made: set[str] = set()
    dirs = _interpreter_dirs(python)
    if any(_under(dest, _WORKDIR) for _, dest in dirs):
        raise SandboxUnavailableError(f"the interpreter {python} lies under {_WORKDIR}, the sandbox's working directory")
    for src, dest in dirs:
        parents = []
        p = os.path.dirname(dest)
        while p != "/" and p not in made:
            parents.append(p)
            p = os.path.dirname(p)
        for p in reversed(parents):  # world-readable parents, whatever the host's modes are
            a += ["--perms", "0755", "--dir", p]
            made.add(p)
        a += ["--ro-bind", src, dest]
    a += ["--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev"]
    if privileged:
        a += ["--dir", _WORKDIR, "--perms", "0444", "--ro-bind-data", str(code_fd), _CODE_IN_SANDBOX]
        if seccomp_fd is not None:
            a += ["--perms", "0444", "--ro-bind-data", str(seccomp_fd), _FILTER_IN_SANDBOX]
    else:
        a += ["--perms", "1777", "--size", str(disk_bytes), "--tmpfs", _WORKDIR,
              "--perms", "0644", "--file", str(code_fd), f"{_WORKDIR}/program.py"]
        if seccomp_fd is not None:
            a += ["--seccomp", str(seccomp_fd)]
    a += [*(() if any(_under(dest, "/tmp") for _, dest in dirs) else ("--symlink", _WORKDIR, "/tmp")),
          "--perms", "0444", "--ro-bind-data", str(boot_fd), _BOOT_IN_SANDBOX,
          "--remount-ro", "/", "--chdir", _WORKDIR, "--info-fd", str(info_fd), "--clearenv",
          "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", _WORKDIR, "--setenv", "LANG", "C.UTF-8",
          "--setenv", "TMPDIR", _WORKDIR]
    a += ["--", python, "-I", "-B", _BOOT_IN_SANDBOX, json.dumps(config)]
    return a


def _run_bwrap(exe: str, code: str, stdin: str, *, python: str, timeout_s: float, cpu_s: int,
               memory_bytes: int, output_bytes: int, disk_bytes: int, max_processes: int) -> ExecResult:
    privileged = os.geteuid() == 0
    rng = random.SystemRandom()
    # a user id of its own for the program (so RLIMIT_NPROC counts only it) and another for the supervisor
    uid = rng.randrange(1 << 20, 1 << 30) * 2 if privileged else None
    fds: list[int] = []
    cgroup = MemoryCgroup.create(memory_bytes)
    try:
        code_fd = _memfd("program", code.encode("utf-8", "surrogateescape"))
        fds.append(code_fd)
        boot_fd = _memfd("boot", _BOOT.read_bytes())
        fds.append(boot_fd)
        stdin_fd = _memfd("stdin", stdin.encode("utf-8", "surrogateescape"))
        fds.append(stdin_fd)
        info_r, info_w = os.pipe()
        fds += [info_r, info_w]
        report_r, report_w = os.pipe()
        fds += [report_r, report_w]
        # without a cgroup, shared memory that RLIMIT_AS does not count is refused
        flt = compile_filter(deny_shared_memory=cgroup is None)
        seccomp_fd = None if flt is None else _memfd("seccomp", flt)
        limits = dict(cpu_s=cpu_s, memory_bytes=memory_bytes, disk_bytes=disk_bytes, max_processes=max_processes)
        workdir = dict(target=_WORKDIR, size=disk_bytes, nr_inodes=_inode_cap(disk_bytes), program=_CODE_IN_SANDBOX,
                       keep_caps=[_CAP_SETGID, _CAP_SETUID])
        config = dict(report_fd=report_w, uid=uid, supervisor_uid=None if uid is None else uid + 1,
                      cpu_s=cpu_s, memory_bytes=_program_memory(limits), file_bytes=disk_bytes,
                      max_processes=max_processes, max_files=_max_files(), audit_hook=False,
                      workdir=workdir if privileged else None,
                      seccomp=_FILTER_IN_SANDBOX if privileged and seccomp_fd is not None else None)
        data_fds = (code_fd, boot_fd) + (() if seccomp_fd is None else (seccomp_fd,))
        fds += data_fds[2:]
        argv = _bwrap_argv(exe, python, privileged=privileged, disk_bytes=disk_bytes, code_fd=code_fd,
                           boot_fd=boot_fd, info_fd=info_w, seccomp_fd=seccomp_fd, config=config)
        if cgroup is not None:
            argv = cgroup.wrap(argv)
        r = _supervise(argv, stdin_fd=stdin_fd, pass_fds=(*data_fds, info_w, report_w),
                       close_after_start=(*data_fds, info_w, report_w), owned=fds, report_r=report_r,
                       info_r=info_r, cwd="/", timeout_s=timeout_s, cpu_s=cpu_s, output_bytes=output_bytes,
                       isolation=BWRAP, address_space=config["memory_bytes"])
        if cgroup is not None:
            _label_cgroup_run(r, cgroup)
        return r
    finally:
        _close_all(fds)
        if cgroup is not None:
            cgroup.close()


def _label_cgroup_run(r: ExecResult, cgroup: MemoryCgroup) -> None:
    """Record the cgroup's peak; a run the kernel's OOM killer ended is ``memory_limit``."""
    r.memory_bound = "cgroup"
    r.memory_peak_bytes = cgroup.peak_bytes()
    if r.status in ("error", "cpu_limit") and cgroup.oom_killed():
        r.status = "memory_limit"


def _run_unisolated(code: str, stdin: str, *, python: str, timeout_s: float, cpu_s: int, memory_bytes: int,
                    output_bytes: int, disk_bytes: int, max_processes: int) -> ExecResult:
    d = tempfile.mkdtemp(prefix="mrt-sandbox-")
    fds: list[int] = []
    try:
        with open(os.path.join(d, "program.py"), "w", encoding="utf-8", errors="surrogateescape") as f:
            f.write(code)
        stdin_fd = _memfd("stdin", stdin.encode("utf-8", "surrogateescape"))
        fds.append(stdin_fd)
        report_r, report_w = os.pipe()
        fds += [report_r, report_w]
        limits = dict(cpu_s=cpu_s, memory_bytes=memory_bytes, disk_bytes=disk_bytes, max_processes=max_processes)
        config = dict(report_fd=report_w, uid=None, supervisor_uid=None, cpu_s=cpu_s,
                      memory_bytes=_program_memory(limits), file_bytes=disk_bytes, max_processes=max_processes,
                      max_files=_max_files(), audit_hook=True)
        argv = [python, "-I", "-B", str(_BOOT), json.dumps(config)]
        return _supervise(argv, stdin_fd=stdin_fd, pass_fds=(report_w,), close_after_start=(report_w,), owned=fds,
                          report_r=report_r, info_r=None, cwd=d, timeout_s=timeout_s, cpu_s=cpu_s,
                          output_bytes=output_bytes, isolation=UNISOLATED, home=d,
                          address_space=config["memory_bytes"])
    finally:
        _close_all(fds)
        shutil.rmtree(d, ignore_errors=True)


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (OSError, AttributeError):
        return None


def _supervise(argv: list[str], *, stdin_fd: int, pass_fds: tuple, close_after_start: tuple, owned: list[int],
               report_r: int,
               info_r: int | None, cwd: str, timeout_s: float, cpu_s: int, output_bytes: int, isolation: str,
               address_space: int, home: str | None = None) -> ExecResult:
    """Start ``argv``, read its output with a cap and a deadline, kill everything at the end, label the run.

    ``close_after_start`` are closed once the program has started and leave ``owned`` (the caller's
    descriptors to close at the end): a descriptor is closed once, never after its number may have
    gone to another thread."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    own = [out_r, out_w, err_r, err_w]
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    if home is not None:
        env["HOME"] = env["TMPDIR"] = home
    init_pidfd: int | None = None
    sel = selectors.DefaultSelector()
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    try:
        proc = subprocess.Popen(argv, stdin=stdin_fd, stdout=out_w, stderr=err_w, pass_fds=pass_fds, cwd=cwd,
                                env=env, start_new_session=True, close_fds=True)
        for fd in (out_w, err_w):
            own.remove(fd)
            os.close(fd)
        for fd in close_after_start:
            owned.remove(fd)
            os.close(fd)
        bufs = {out_r: bytearray(), err_r: bytearray()}
        total = 0
        report = bytearray()
        info = bytearray()
        for fd in (out_r, err_r, report_r) + ((info_r,) if info_r is not None else ()):
            sel.register(fd, selectors.EVENT_READ)
        killed = None
        grace = False
        while sel.get_map() and killed is None:
            left = deadline - time.monotonic()
            if left <= 0:
                killed = None if grace else "timeout"
                break
            for key, _ in sel.select(min(left, _MAX_WAIT_S)):
                fd = key.fd
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    sel.unregister(fd)
                    if fd == report_r and not grace:
                        # the program has ended: a descendant that still holds its output
                        # gets a moment to finish writing, not the whole deadline
                        grace = True
                        deadline = min(deadline, time.monotonic() + 1.0)
                    continue
                if fd in bufs:
                    keep = max(0, output_bytes - total)
                    bufs[fd] += chunk[:keep]
                    total += len(chunk)
                    if total > output_bytes:
                        killed = "output_limit"
                        break
                elif fd == report_r:
                    if len(report) < 1 << 16:
                        report += chunk
                else:
                    info += chunk
                    if init_pidfd is None:
                        try:
                            init_pidfd = _pidfd(int(json.loads(bytes(info))["child-pid"]))
                        except (ValueError, KeyError, TypeError):
                            pass  # not all of it yet
        if killed is not None or sel.get_map():
            _kill(proc, init_pidfd)
        else:
            if _wait_until(proc, max(deadline, time.monotonic() + 1.0)):
                _reap_namespace(proc, init_pidfd)
            else:
                killed = "timeout"
                _kill(proc, init_pidfd)
        wall = time.monotonic() - t0
    finally:
        sel.close()
        for fd in own:
            try:
                os.close(fd)
            except OSError:
                pass
        if init_pidfd is not None:
            os.close(init_pidfd)
    stdout = bytes(bufs[out_r]).decode("utf-8", "replace")
    stderr = bytes(bufs[err_r]).decode("utf-8", "replace")
    if killed is not None:
        return ExecResult(killed, None, stdout, stderr, wall, isolation)
    try:
        rep = json.loads(bytes(report).decode())
        code, sig, cpu = rep["exit_code"], rep["signal"], float(rep["cpu_s"])
    except (ValueError, KeyError, TypeError):
        return ExecResult("error", None, stdout, stderr, wall, isolation)
    if sig is not None:
        return ExecResult(_signal_status(sig, cpu, cpu_s), -sig, stdout, stderr, wall, isolation, cpu)
    status = "passed" if code == 0 else "memory_limit" if code == MEMORY_EXIT and _held_memory(
        rep.get("vm_peak_kb"), address_space) else "error"
    return ExecResult(status, code, stdout, stderr, wall, isolation, cpu)


def _signal_status(sig: int, cpu: float, cpu_s: float) -> str:
    """``cpu_limit`` for a SIGXCPU or SIGKILL after the program used (about) its CPU time, the only
    time the kernel's RLIMIT_CPU sends them; ``error`` for any other signal, or one sent earlier (by
    the program itself)."""
    used_cpu = cpu >= _CPU_SHARE * cpu_s
    return "cpu_limit" if sig in (signal.SIGXCPU, signal.SIGKILL) and used_cpu else "error"


def _held_memory(vm_peak_kb, address_space: int) -> bool:
    """Whether the program's peak address space, as the kernel counted it, shows that an allocation
    was refused under ``RLIMIT_AS``: at least half of it (a request that would have doubled what
    it held); an exit with the memory code and no such peak is the program's own."""
    return isinstance(vm_peak_kb, int) and vm_peak_kb * 1024 >= address_space // 2


def _wait_until(proc: subprocess.Popen, deadline: float) -> bool:
    """Wait for ``proc`` until the monotonic ``deadline`` (any finite one); whether it ended."""
    while True:
        left = deadline - time.monotonic()
        try:
            proc.wait(timeout=max(0.0, min(left, _MAX_WAIT_S)))
            return True
        except subprocess.TimeoutExpired:
            if left <= _MAX_WAIT_S:
                return False


def _kill(proc: subprocess.Popen, init_pidfd: int | None) -> None:
    """SIGKILL the pid namespace's init (which ends every process in it) and the process group; wait."""
    if init_pidfd is not None:
        try:
            signal.pidfd_send_signal(init_pidfd, signal.SIGKILL)
        except (ProcessLookupError, PermissionError, OSError):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    _reap_namespace(proc, init_pidfd)


def _reap_namespace(proc: subprocess.Popen, init_pidfd: int | None) -> None:
    """Kill the namespace's init (bubblewrap has exited: nothing in it is needed any more) and return
    only once it is gone, which is once every process of the namespace is gone."""
    if init_pidfd is None:
        return
    try:
        signal.pidfd_send_signal(init_pidfd, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        pass
    select.select([init_pidfd], [], [], 10.0)


# ------------------------------------------------------------------ judging


def outputs_match(got: str, expected: str) -> bool:
    """Equal up to trailing whitespace on each line and trailing blank lines (the usual judge rule)."""
    norm = lambda s: "\n".join(line.rstrip() for line in s.strip().splitlines())  # noqa: E731
    return norm(got) == norm(expected)


def passes_tests(code: str, tests: list, **limits) -> bool:
    """True when the program prints the expected output on every test (status ``passed`` each time).

    ``tests``: a list of ``{"input": str, "output": str}`` dicts or ``(input, output)`` pairs.
    Stops at the first failure. ``limits``: keyword arguments of `run_program`.
    """
    if not tests:
        raise MrtInputError("passes_tests needs at least one test")
    for t in tests:
        try:
            inp, exp = (t["input"], t["output"]) if isinstance(t, dict) else t
        except (KeyError, TypeError, ValueError):
            raise MrtInputError(f"a test must be {{'input': str, 'output': str}} or (input, output), got {t!r:.200}") \
                from None
        if not run_program(code, str(inp), expected_output=str(exp), **limits).ok:
            return False
    return True


def extract_code(text: str) -> str:
    """The first fenced code block of a model response (```python ... ```), else the whole text."""
    import re

    m = re.search(r"```(?:python|py|python3)?[^\n]*\n(.*?)```", text, re.S)
    return m.group(1) if m else text
