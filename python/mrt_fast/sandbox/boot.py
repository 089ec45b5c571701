"""The first program inside the sandbox: it runs the generated program and reports how it ended.

Run as ``python -I -B _sandbox_boot.py CONFIG_JSON`` with the generated program in
``program.py`` of the working directory and the report pipe on ``report_fd``.
It is not imported by mrt_fast; `mrt_fast.sandbox` passes its source in.

In the sandbox (``workdir`` in the config) it first mounts the working
directory, a tmpfs with a size and an inode cap (bubblewrap's ``--tmpfs`` has no
inode cap), copies the program into it, drops the capability that took, and
loads the seccomp filter. Then it forks once. The child becomes the generated program: it drops to the
program's own user id (when started as root), sets the resource limits and
runs ``program.py`` as ``__main__``. The parent (the supervisor) waits for it
with ``wait4`` and writes one JSON line to the report pipe: exit code or
signal, the CPU time of the program and its reaped descendants, and, when the
program stopped itself after a refused allocation, its peak address space (read
from ``/proc`` while it is stopped; then it is continued and exits). The
program never holds the report pipe, and the supervisor runs under another
user id than the program (or, when both share one, is not dumpable), so the
program cannot write or forge the report; killing the supervisor only loses
it, which the caller reads as ``error``.
"""

import json
import os
import resource
import sys

# exit code of a program whose MemoryError reached the top level (RLIMIT_AS hit); the program stops
# itself first (SIGSTOP) so that the supervisor reads its peak address space, the evidence it labels by
MEMORY_EXIT = 86
SIGSTOP, SIGCONT = 19, 18
# exit code when dropping privileges or setting the limits failed (read as ``error``)
SETUP_EXIT = 85


def _not_dumpable() -> None:
    """No ptrace and no /proc/<pid>/fd access by a process of the same user id."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
    except Exception:  # noqa: BLE001 - best effort: without it the report can still only be lost
        pass


def _drop_to(uid: int) -> None:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


def _libc():
    import ctypes

    return ctypes, ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        import ctypes

        e = ctypes.get_errno()
        raise OSError(e, "%s: %s" % (what, os.strerror(e)))


def _mount_workdir(wd: dict) -> None:
    """A private tmpfs of ``size`` bytes and ``nr_inodes`` files at ``target``, holding the program."""
    ctypes, libc = _libc()
    with open(wd["program"], "rb") as f:
        code = f.read()
    opts = "mode=1777,size=%d,nr_inodes=%d" % (int(wd["size"]), int(wd["nr_inodes"]))
    ms_nosuid, ms_nodev = 2, 4
    _check(libc.mount(b"tmpfs", wd["target"].encode(), b"tmpfs", ctypes.c_ulong(ms_nosuid | ms_nodev),
                      opts.encode()), "mount tmpfs")
    os.chdir(wd["target"])
    fd = os.open("program.py", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(code)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def _keep_only_caps(caps: list) -> None:
    """Effective and permitted capabilities become ``caps``; no inheritable or ambient ones."""
    ctypes, libc = _libc()
    _check(libc.prctl(47, 4, 0, 0, 0), "clear ambient capabilities")  # PR_CAP_AMBIENT, _CLEAR_ALL
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()
    for cap in caps:
        data[3 * (cap // 32)] |= 1 << (cap % 32)  # effective
        data[3 * (cap // 32) + 1] |= 1 << (cap % 32)  # permitted
    _check(libc.capset(header, data), "capset")


def _load_seccomp(path: str) -> None:
    """Install the classic BPF filter in ``path`` (bubblewrap has set no_new_privs)."""
    ctypes, libc = _libc()
    with open(path, "rb") as f:
        prog = f.read()

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

    fprog = SockFprog(len(prog) // 8, prog)
    _check(libc.prctl(22, 2, ctypes.byref(fprog), 0, 0), "seccomp")  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER


def _audit_hook() -> None:
    """Best-effort guard for the unisolated mode only (ctypes and other ways get past it)."""
    blocked_net = {"socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo",
                   "socket.gethostbyname", "socket.gethostbyaddr", "socket.sendto", "socket.sendmsg"}
    blocked_proc = {"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                    "os.forkpty", "pty.spawn"}

    def hook(event, args):
        if event in blocked_net:
            raise PermissionError("network access is blocked in the sandbox (%s)" % event)
        if event in blocked_proc:
            raise PermissionError("starting processes is blocked in the sandbox (%s)" % event)

    sys.addaudithook(hook)


def _limits(cfg: dict) -> None:
    cpu = int(cfg["cpu_s"])
    mem = int(cfg["memory_bytes"])
    fsize = int(cfg["file_bytes"])
    nproc = int(cfg["max_processes"])
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    nofile = int(cfg.get("max_files", 256))
    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))


def _exit_flushed(code: int) -> None:
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001 - an unflushable stream ends like Python's own (120)
        os._exit(120 if code == 0 else code)
    os._exit(code)


def _memory_exit() -> None:
    """End after a refused allocation: stop until the supervisor has read the peak, then exit."""
    try:
        os.kill(os.getpid(), SIGSTOP)
    finally:
        os._exit(MEMORY_EXIT)


def _vm_peak_kb(pid: int):
    """The most address space process ``pid`` has held (VmPeak, kB), or None."""
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmPeak:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _run_program(cfg: dict) -> None:
    """In the child: become the program. Never returns."""
    try:
        if cfg.get("uid") is not None:
            _drop_to(int(cfg["uid"]))
        _limits(cfg)
        if cfg.get("audit_hook"):
            _audit_hook()
        sys.argv = ["program.py"]
    except BaseException as e:  # noqa: BLE001
        os.write(2, ("sandbox setup failed: %r\n" % (e,)).encode())
        os._exit(SETUP_EXIT)
    import runpy

    try:
        runpy.run_path("program.py", run_name="__main__")
    except MemoryError:
        try:
            os.write(2, b"MemoryError\n")
        finally:
            _memory_exit()
    except SystemExit as e:
        code = e.code
        if code is None:
            _exit_flushed(0)
        if isinstance(code, int):
            _exit_flushed(code & 0xFF)
        try:
            print(code, file=sys.stderr)
        finally:
            _exit_flushed(1)
    except BaseException:  # noqa: BLE001 - the program's own error
        try:
            import traceback

            traceback.print_exc()
        except MemoryError:
            _memory_exit()
        finally:
            _exit_flushed(1)
    _exit_flushed(0)


def main() -> None:
    cfg = json.loads(sys.argv[1])
    report_fd = int(cfg["report_fd"])
    if cfg.get("workdir"):
        try:
            _mount_workdir(cfg["workdir"])
            _keep_only_caps(cfg["workdir"]["keep_caps"])
            if cfg.get("seccomp"):
                _load_seccomp(cfg["seccomp"])
        except BaseException as e:  # noqa: BLE001
            os.write(2, ("sandbox setup failed: %r\n" % (e,)).encode())
            os._exit(SETUP_EXIT)
    # nothing but the standard streams and the report pipe goes on (bwrap's data fds included)
    os.closerange(3, report_fd)
    os.closerange(report_fd + 1, 1 << 16)
    pid = os.fork()
    if pid == 0:
        os.close(report_fd)
        _run_program(cfg)
    # the supervisor
    if cfg.get("supervisor_uid") is not None:
        _drop_to(int(cfg["supervisor_uid"]))
    _not_dumpable()
    os.close(0)
    os.close(1)
    os.close(2)
    vm_peak = None
    while True:
        try:
            _, status, ru = os.wait4(pid, os.WUNTRACED)
        except InterruptedError:
            continue
        if not os.WIFSTOPPED(status):
            break
        vm_peak = _vm_peak_kb(pid)  # the kernel's figure, read while the program is stopped
        try:
            os.kill(pid, SIGCONT)
        except OSError:
            pass
    report = {
        "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        "cpu_s": ru.ru_utime + ru.ru_stime,
        "maxrss_kb": ru.ru_maxrss,
        "vm_peak_kb": vm_peak,
    }
    os.write(report_fd, (json.dumps(report) + "\n").encode())
    os._exit(0)


if __name__ == "__main__":
    main()
