"""Code answers: run each response's program on the test inputs in the sandbox.

A response's program (its first fenced code block, else the whole text:
:func:`mrt_fast.sandbox.extract_code`) runs once per test input under
:func:`mrt_fast.sandbox.run_program`, with its limits (``timeout_s``,
``cpu_s``, ``memory_mb``, ``output_mb``, ...), ``workers`` programs at a time (each
worker a fresh process).

* **Execution mode**: the answer key is the tuple of what the program did on
  the inputs, as compact JSON: its output (trailing whitespace per line and
  trailing blank lines dropped; outputs over :data:`OUTPUT_KEY_CHARS` characters
  by their length and digest) when it exited 0, else its status in angle
  brackets (``"<timeout>"``, ``"<error>"``, ``"<output_limit>"``, ...). Two
  programs that behave the same on the inputs are one mode.
* **Reward**: the fraction of tests whose expected output it printed (status
  ``passed``); tests without an expected output give modes only.

Tests are a list of ``{"input": str, "output": str}`` (``output`` optional)
or ``[input, output]`` pairs, as a list column or a JSON string.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from mrt_fast.errors import MrtInputError

__all__ = ["OUTPUT_KEY_CHARS", "parse_tests", "run_tests"]

#: outputs longer than this enter the key as their length and digest
OUTPUT_KEY_CHARS = 200


def parse_tests(value: Any, row: int, column: str) -> list[tuple[str, str | None]]:
    """The tests of one row as ``(input, expected output or None)`` pairs; bad tests are one line."""
    if value is None:
        return []
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise MrtInputError(f"column {column!r} row {row}: tests are not valid JSON ({e})", column=column,
                                row=row) from None
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise MrtInputError(f"column {column!r} row {row}: tests must be a list of {{'input', 'output'}} or "
                            f"[input, output], got {type(value).__name__}", column=column, row=row)
    out = []
    for t in value:
        if isinstance(t, dict) and "input" in t:
            exp = t.get("output")
            out.append((str(t["input"] if t["input"] is not None else ""), None if exp is None else str(exp)))
        elif isinstance(t, (list, tuple)) and len(t) in (1, 2):
            out.append((str(t[0]), None if len(t) == 1 or t[1] is None else str(t[1])))
        else:
            raise MrtInputError(f"column {column!r} row {row}: a test must be {{'input': str, 'output': str}} "
                                f"or [input, output], got {t!r:.120}", column=column, row=row)
    return out


def _output_key(stdout: str) -> str:
    text = "\n".join(line.rstrip() for line in stdout.strip("\n").splitlines()).rstrip()
    if len(text) <= OUTPUT_KEY_CHARS:
        return text
    return f"<{len(text)} chars {hashlib.blake2b(text.encode(), digest_size=8).hexdigest()}>"


def _run_one(run: tuple[str, str, dict]) -> Any:
    from mrt_fast.sandbox import run_program

    code, stdin, limits = run
    return run_program(code, stdin, **limits)


def run_tests(programs: list[str | None], tests: list[list[tuple[str, str | None]]], *, workers: int = 1,
              limits: dict | None = None) -> list[tuple[str | None, float | None, dict[str, int]]]:
    """Run program ``i`` on the inputs of ``tests[i]``: per program its execution key (None for no
    program or no test), its pass fraction (None when no test has an expected output) and its
    status counts."""
    from mrt_fast.sandbox import outputs_match, require_isolation

    limits = dict(limits or {})
    jobs = [(i, j) for i, (p, ts) in enumerate(zip(programs, tests)) if p is not None and p.strip()
            for j in range(len(ts))]
    if jobs:
        require_isolation(limits.get("isolation"), limits.get("python"))  # before any program runs

    runs = [(programs[i], tests[i][j][0], limits) for i, j in jobs]
    if workers > 1 and len(jobs) > 1:
        # one process per worker (started fresh: no copy of this process's threads or open files)
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=ctx) as ex:
            results = list(ex.map(_run_one, runs, chunksize=max(1, len(runs) // (4 * workers))))
    else:
        results = [_run_one(r) for r in runs]
    by_row: dict[int, list] = {}
    for (i, j), r in zip(jobs, results):
        by_row.setdefault(i, []).append((j, r))
    out = []
    for i, (p, ts) in enumerate(zip(programs, tests)):
        runs = [r for _, r in sorted(by_row.get(i, []), key=lambda x: x[0])]
        if not runs:
            out.append((None, None, {}))
            continue
        keys, passed, graded, counts = [], 0, 0, {}
        for (inp, exp), r in zip(ts, runs):
            keys.append(_output_key(r.stdout) if r.status == "passed" else f"<{r.status}>")
            ok = r.status == "passed" and (exp is None or outputs_match(r.stdout, exp))
            status = r.status if r.status != "passed" else ("passed" if exp is None or ok else "failed")
            counts[status] = counts.get(status, 0) + 1
            if exp is not None:
                graded += 1
                passed += ok
        out.append((json.dumps(keys, ensure_ascii=False, separators=(",", ":")),
                    passed / graded if graded else None, counts))
    return out
