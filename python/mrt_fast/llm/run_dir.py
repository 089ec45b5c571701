"""Which folders ``mrt run`` may write into: its own, an empty one or a new one.

An out_dir is ``mrt run``'s once it holds ``.mrt/stages.json`` (the records
of `mrt_fast.llm.stage_records`, written before anything else). A non-empty
folder without it is refused (its files are not ``mrt run``'s to replace),
unless it holds only names ``mrt run`` writes, an output of a stage among them
(an out_dir of a version that kept no records; the records check refuses that
one itself): ``config.json`` and ``results.*`` alone are no sign of a run, and
are what a user's own folder may hold. The root folder and the home folder are
refused whatever they hold.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from mrt_fast.errors import MrtInputError

#: what mrt run writes at the top of its out_dir
WRITTEN = {"candidates.parquet", "candidates.parquet.parts", "embedded.parquet",
           "embedded.parquet.parts", "scored.parquet", "scored.parquet.parts", "diagnose",
           "select", "runs", "results.csv", "results.md", "results.png", "config.json", "base_model", ".mrt"}
#: what only a stage of mrt run writes (the rest are names a user's own folder may hold too)
STAGE_OUTPUTS = WRITTEN - {"results.csv", "results.md", "results.png", "config.json", ".mrt"}
#: the temporary file of an atomic write (``.NAME.HOST-PID.RANDOM.tmp``)
_TEMP = re.compile(r"^\..+\.[A-Za-z0-9_-]+-\d+\.[0-9a-f]{8}\.tmp$")


def _few(names: list[str]) -> str:
    return ", ".join(repr(n) for n in names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def check_out_dir(out: str | os.PathLike, records: str | os.PathLike) -> None:
    """Refuse, in one line, an out_dir ``mrt run`` must not write into (``records``: the path of
    the records file inside it, relative to it)."""
    out = Path(out)
    where = out.expanduser().resolve()
    if where == Path(where.anchor):
        raise MrtInputError(f"out_dir {str(out)!r} is the root folder; name a new or empty folder for the run")
    if where == Path.home().resolve():
        raise MrtInputError(f"out_dir {str(out)!r} is the home folder; name a new or empty folder for the run")
    if not out.exists():
        return
    if not out.is_dir():
        raise MrtInputError(f"out_dir {str(out)!r} exists and is not a folder")
    if (out / records).is_file():
        return
    names = sorted(n for n in os.listdir(out) if not _TEMP.match(n))
    foreign = [n for n in names if n not in WRITTEN]
    if foreign:
        raise MrtInputError(f"out_dir {str(out)!r} is not empty and is not an out_dir of mrt run (no {records}): "
                            f"it holds {_few(foreign)}; name a new or empty folder for the run")
    if names and not STAGE_OUTPUTS.intersection(names):
        raise MrtInputError(f"out_dir {str(out)!r} is not empty and is not an out_dir of mrt run (no {records}, "
                            f"no output of a stage): it holds {_few(names)}; name a new or empty folder for the run")
