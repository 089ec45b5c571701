"""Outputs kept apart from inputs: no command writes over what it reads.

Every command calls :func:`check_apart` before any work with its inputs and
all its outputs (side outputs such as ``--json``, ``--plot`` or
``--allocation`` included; a dataset job checks its main output itself,
:class:`mrt_fast.datasets.job.Job`). An output that is an input, holds one
(a directory above it), lies inside an input directory or matches an input
glob, whether named directly, through ``..``, a symbolic or a hard link, is
refused in one line; so is an output named twice. An input that is a local
path but no table (a model, tokenizer or adapter folder) is checked by its
path: an output that is it, lies inside it or holds it is refused too. An
input that cannot be found is left to the command's own reading, which says why.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mrt_fast.datasets import sources, storage
from mrt_fast.errors import MrtInputError, PartialOutputWarning

__all__ = ["check_apart"]


def _where(p: Any) -> str:
    """Where an output lands: its URL, or its real path."""
    return str(p).rstrip("/") if storage.is_url(p) else os.path.realpath(p)


def check_apart(inputs: Sequence[tuple[str, Any]], outputs: Sequence[tuple[str, Any]]) -> None:
    """Refuse an output that would write over an input, or over another output (see the module
    doc). ``inputs`` and ``outputs``: ``(what it is, path)`` pairs, such as ``("--json", path)``;
    a path of None is not given and skipped."""
    outs = [(what, o) for what, o in outputs if o is not None]
    seen: dict[str, str] = {}
    for what, o in outs:
        key = _where(o)
        if key in seen:
            raise MrtInputError(f"{what} {str(o)!r} is also {seen[key]}: give each output its own path")
        seen[key] = what
    for in_what, i in inputs:
        if i is None:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", PartialOutputWarning)
                ds = i if isinstance(i, sources.Dataset) else sources.discover(i, allow_partial=True)
        except MrtInputError:  # no table: a model or adapter folder is still kept apart by its path
            for what, o in outs:
                if _over_path(o, i):
                    raise MrtInputError(f"{what} {str(o)!r} would write over the {in_what} {str(i)!r} (it is that "
                                        "path, holds it or lies inside it); write it elsewhere") from None
            continue  # not there, or not readable: the command's own reading says so
        for what, o in outs:
            if sources.output_inside_input(o, ds):
                raise MrtInputError(f"{what} {str(o)!r} would write over the {in_what} {ds.source!r} (it is that "
                                    "path, holds it or lies inside it); write it elsewhere")


def _over_path(out: Any, inp: Any) -> bool:
    """Whether the local output ``out`` is the existing local path ``inp``, lies inside it or holds
    it (through ``..`` and symbolic links; a hard link of a file is that file)."""
    if "://" in str(out) or "://" in str(inp) or not os.path.exists(inp):
        return False
    if os.path.isfile(out) and os.path.isfile(inp) and os.path.samefile(out, inp):
        return True
    outs = {Path(os.path.abspath(out)), Path(os.path.realpath(out))}
    ins = {Path(os.path.abspath(inp)), Path(os.path.realpath(inp))}
    return any(o == i or i in o.parents or o in i.parents for o in outs for i in ins)
