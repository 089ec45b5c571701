"""Modes and rewards from the answer itself, for verifiable tasks.

For math, multiple choice, extraction into JSON and code, the answer a response
reaches tells which responses are the same mode, and a checker's verdict is its
reward. :func:`answers` adds ``answer`` (the normalised key), ``mode`` (its
integer code) and, given a reference or tests, ``reward`` and ``correct``;
:func:`answers_dataset` runs it as a stage of the dataset job (either layout,
either engine, resumable, ``s3://``). The package itself is callable:
``mrt_fast.answers(table, ...)`` is :func:`answers`.

* :mod:`mrt_fast.answers.keys`: answer keys (light math equivalence; sympy through
  ``math-verify`` where installed);
* :mod:`mrt_fast.answers.extract`: extractors (last number, boxed, answer line,
  choice, JSON path, regex, callable);
* :mod:`mrt_fast.answers.check`: checkers and rewards;
* :mod:`mrt_fast.answers.code`: programs run on test inputs in the sandbox
  (execution modes, pass fraction);
* :mod:`mrt_fast.answers.report`: the report, and the pools with no learning signal.
"""

from __future__ import annotations

import sys
import types

from mrt_fast._util.lazy import lazy_names

_LAZY = {
    "answers": "mrt_fast.answers.table",
    "AnswerOptions": "mrt_fast.answers.table",
    "mode_code": "mrt_fast.answers.table",
    "answers_dataset": "mrt_fast.answers.dataset",
    "AnswerReport": "mrt_fast.answers.report",
    "Extractor": "mrt_fast.answers.extract",
    "extractor": "mrt_fast.answers.extract",
    "Checker": "mrt_fast.answers.check",
    "checker": "mrt_fast.answers.check",
    "Rewards": "mrt_fast.answers.check",
    "canonical": "mrt_fast.answers.keys",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())


class _CallableArea(types.ModuleType):
    """This package, callable as :func:`answers` (``mrt_fast.answers(table, ...)``)."""

    def __call__(self, table, **kw):
        from mrt_fast.answers.table import answers

        return answers(table, **kw)


sys.modules[__name__].__class__ = _CallableArea
