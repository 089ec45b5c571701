"""Running untrusted generated programs: a subprocess with limits and no network.

Each run gets a fresh temporary directory (its cwd and HOME, removed after),
a minimal environment, and these limits, set in the child before it starts:

* CPU time: ``RLIMIT_CPU`` (the kernel sends SIGXCPU, then SIGKILL);
* memory: ``RLIMIT_AS`` (allocations beyond it fail: Python raises MemoryError);
* output: stdout/stderr go to files capped by ``RLIMIT_FSIZE``;
* wall clock: the parent kills the child's whole process group after ``timeout_s``;
* no core dumps (``RLIMIT_CORE`` 0).

Network: when the ``unshare`` tool can make a network namespace here
(``unshare -n``, or ``unshare -rn`` for an unprivileged user), the child runs in
a fresh one with no interfaces but loopback down, so nothing is reachable. In
every case the child also runs under a Python audit hook that raises
``PermissionError`` on socket creation/connection/name lookup and on starting
processes (subprocess, os.system, exec*, fork, spawn), so the block holds where
namespaces are unavailable too. The program runs as ``python -I`` (isolated:
no user site, no PYTHON* variables).
"""

from __future__ import annotations

import functools
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from .errors import MrtInputError

_BOOT = r'''
import sys
_BLOCKED_NET = {"socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo",
                "socket.gethostbyname", "socket.gethostbyaddr", "socket.sendto", "socket.sendmsg"}
_BLOCKED_PROC = {"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                 "os.forkpty", "pty.spawn"}
def _hook(event, args):
    if event in _BLOCKED_NET:
        raise PermissionError("network access is blocked in the sandbox (%s)" % event)
    if event in _BLOCKED_PROC:
        raise PermissionError("starting processes is blocked in the sandbox (%s)" % event)
sys.addaudithook(_hook)
del _hook
import runpy
sys.argv = ["program.py"]
runpy.run_path("program.py", run_name="__main__")
'''

STATUSES = ("ok", "error", "timeout", "cpu_limit", "memory_limit", "output_limit")


@dataclass
class ExecResult:
    """What a sandboxed run did. ``status``: ok | error | timeout | cpu_limit | memory_limit | output_limit."""

    status: str
    returncode: int | None
    stdout: str
    stderr: str
    wall_s: float
    network_namespace: bool

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@functools.lru_cache(maxsize=1)
def network_namespace_prefix() -> tuple[str, ...]:
    """The command prefix that runs a child in a new network namespace here, or () if none works."""
    exe = shutil.which("unshare")
    if not exe:
        return ()
    for flags in (("-n",), ("-rn",)):
        try:
            r = subprocess.run([exe, *flags, "true"], capture_output=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            continue
        if r.returncode == 0:
            return (exe, *flags)
    return ()


def run_program(
    code: str,
    stdin: str = "",
    *,
    timeout_s: float = 10.0,
    cpu_s: int = 5,
    memory_mb: int = 512,
    output_mb: int = 16,
    python: str | None = None,
    use_namespace: bool = True,
) -> ExecResult:
    """Run Python source ``code`` with ``stdin`` in the sandbox; never raises for what the program does."""
    if not isinstance(code, str):
        raise MrtInputError(f"code must be a str, got {type(code).__name__}")
    if timeout_s <= 0 or cpu_s < 1 or memory_mb < 16 or output_mb < 1:
        raise MrtInputError("timeout_s > 0, cpu_s >= 1, memory_mb >= 16 and output_mb >= 1 are required")
    python = python or sys.executable
    prefix = network_namespace_prefix() if use_namespace else ()
    mem = int(memory_mb) * 1024 * 1024
    fsize = int(output_mb) * 1024 * 1024

    def limits():  # runs in the child between fork and exec
        resource.setrlimit(resource.RLIMIT_CPU, (int(cpu_s), int(cpu_s) + 1))
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    with tempfile.TemporaryDirectory(prefix="mrt-sandbox-") as d:
        with open(os.path.join(d, "program.py"), "w") as f:
            f.write(code)
        with open(os.path.join(d, "_boot.py"), "w") as f:
            f.write(_BOOT)
        with open(os.path.join(d, "stdin"), "w") as f:
            f.write(stdin)
        env = {"PATH": "/usr/bin:/bin", "HOME": d, "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}
        t0 = time.monotonic()
        with open(os.path.join(d, "stdin")) as fin, open(os.path.join(d, "stdout"), "wb") as fout, \
                open(os.path.join(d, "stderr"), "wb") as ferr:
            proc = subprocess.Popen(
                [*prefix, python, "-I", "_boot.py"], cwd=d, env=env, stdin=fin, stdout=fout, stderr=ferr,
                preexec_fn=limits, start_new_session=True,
            )
            timed_out = False
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
        wall = time.monotonic() - t0
        out = open(os.path.join(d, "stdout"), "rb").read().decode("utf-8", "replace")
        err = open(os.path.join(d, "stderr"), "rb").read().decode("utf-8", "replace")
    rc = proc.returncode
    if timed_out:
        status = "timeout"
    elif rc in (-signal.SIGXCPU, -signal.SIGKILL) and wall >= 0.5 * cpu_s:
        status = "cpu_limit"
    elif rc == -signal.SIGXFSZ:
        status = "output_limit"
    elif rc != 0 and "MemoryError" in err:
        status = "memory_limit"
    elif rc == 0:
        status = "ok"
    else:
        status = "error"
    return ExecResult(status, rc, out, err, wall, bool(prefix))


def outputs_match(got: str, expected: str) -> bool:
    """Equal up to trailing whitespace on each line and trailing blank lines (the usual judge rule)."""
    norm = lambda s: "\n".join(line.rstrip() for line in s.strip().splitlines())  # noqa: E731
    return norm(got) == norm(expected)


def passes_tests(code: str, tests: list, **limits) -> bool:
    """True when the program prints the expected output on every test.

    ``tests``: a list of ``{"input": str, "output": str}`` dicts or ``(input, output)`` pairs.
    Stops at the first failure.
    """
    if not tests:
        raise MrtInputError("passes_tests needs at least one test")
    for t in tests:
        inp, exp = (t["input"], t["output"]) if isinstance(t, dict) else t
        r = run_program(code, inp, **limits)
        if not (r.ok and outputs_match(r.stdout, exp)):
            return False
    return True


def extract_code(text: str) -> str:
    """The first fenced code block of a model response (```python ... ```), else the whole text."""
    import re

    m = re.search(r"```(?:python|py|python3)?[^\n]*\n(.*?)```", text, re.S)
    return m.group(1) if m else text
