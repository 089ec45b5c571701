"""How the `mrt` process starts and ends (the ``mrt`` script and ``python -m mrt_fast.cli``).

A command's own work is the same as when ``app`` is called in a Python process; what this adds is what a
short-lived process can skip:

* NumPy's OpenBLAS starts its worker threads when NumPy is imported and, by default, lets each spin for
  about 2^28 cycles before it sleeps: on a 2-core machine a tenth of a CPU-second taken from the job right
  when it starts reading. ``OPENBLAS_THREAD_TIMEOUT`` (unless the caller set it) lets idle threads sleep at
  once; a BLAS call wakes them as before.
* The modules a command loads are hundreds of thousands of long-lived objects; the cyclic collector's
  default first threshold (700 allocations) makes it walk them again and again while they load. A first
  threshold of 50,000 keeps collections rare; garbage with cycles is still collected.
* At the end, the interpreter tears those modules down, with more collections (a tenth of a second or more
  after a 1M-candidate job). Every file the job writes is closed, and its output committed, before the
  command returns, so the process flushes its standard streams, runs its exit handlers (``atexit``, which
  also runs ``weakref.finalize`` callbacks and ``logging``'s flush) and exits with the command's code,
  skipping the teardown. Where a non-daemon thread still runs, or the code is not an exit code, it exits
  the ordinary way.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
import threading

#: the cyclic collector's first threshold in the `mrt` process (CPython's default: 700)
GC_FIRST_THRESHOLD = 50_000


def main() -> None:
    """Run the `mrt` command line in this process and end it."""
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")  # OpenBLAS's least: idle threads sleep at once
    _, second, third = gc.get_threshold()
    gc.set_threshold(GC_FIRST_THRESHOLD, second, third)
    from mrt_fast.cli import app

    try:
        app()
    except SystemExit as e:
        end(e.code)
    end(0)


def end(code: object) -> None:
    """Exit with ``code`` (an ``int``, ``None`` for 0), skipping the interpreter's teardown where that is safe."""
    run_exit_handlers = getattr(atexit, "_run_exitfuncs", None)
    others = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon and t.is_alive()]
    if not (code is None or isinstance(code, int)) or others or run_exit_handlers is None:
        sys.exit(code)
    run_exit_handlers()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing more can be said on it
            pass
    os._exit(code or 0)
