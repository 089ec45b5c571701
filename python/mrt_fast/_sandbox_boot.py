"""The first program inside the sandbox: it runs the generated program and reports how it ended.

Run as ``python -I -B _sandbox_boot.py CONFIG_JSON`` with the generated program in
``program.py`` of the working directory and the report pipe on ``report_fd``.
It is not imported by mrt_fast; `mrt_fast.sandbox` passes its source in.

It forks once. The child becomes the generated program: it drops to the
program's own user id (when started as root), sets the resource limits and
runs ``program.py`` as ``__main__``. The parent (the supervisor) waits for it
with ``wait4`` and writes one JSON line to the report pipe: exit code or
signal, and the CPU time of the program and its reaped descendants. The
program never holds the report pipe, and the supervisor runs under another
user id than the program (or, when both share one, is not dumpable), so the
program cannot write or forge the report; killing the supervisor only loses
it, which the caller reads as ``error``.
"""

import json
import os
import resource
import sys

# exit code of a program whose MemoryError reached the top level (RLIMIT_AS hit)
MEMORY_EXIT = 86
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
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))


def _exit_flushed(code: int) -> None:
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001 - an unflushable stream ends like Python's own (120)
        os._exit(120 if code == 0 else code)
    os._exit(code)


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
            os._exit(MEMORY_EXIT)
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
            os._exit(MEMORY_EXIT)
        finally:
            _exit_flushed(1)
    _exit_flushed(0)


def main() -> None:
    cfg = json.loads(sys.argv[1])
    report_fd = int(cfg["report_fd"])
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
    while True:
        try:
            _, status, ru = os.wait4(pid, 0)
            break
        except InterruptedError:
            continue
    report = {
        "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        "cpu_s": ru.ru_utime + ru.ru_stime,
        "maxrss_kb": ru.ru_maxrss,
    }
    os.write(report_fd, (json.dumps(report) + "\n").encode())
    os._exit(0)


if __name__ == "__main__":
    main()
