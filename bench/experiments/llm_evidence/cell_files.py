"""Result files of the evidence runs: each written atomically (a stopped run never leaves half a file), readable
by everyone, and redone only when the settings it was written with differ."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def write_atomic(path: Path, obj: dict | str) -> None:
    """Write ``obj`` (a dict as indented JSON, or text) to ``path`` through a temporary file and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        if isinstance(obj, str):
            f.write(obj)
        else:
            json.dump(obj, f, indent=1)
    os.chmod(tmp, 0o644)  # mkstemp makes the file private; results are plain readable files
    os.replace(tmp, path)


def is_done(path: Path, key: str, settings: dict) -> bool:
    """Whether ``path`` holds a result whose ``key`` entry equals ``settings`` (compared as JSON)."""
    path = Path(path)
    if not path.exists():
        return False
    try:
        old = json.loads(path.read_text()).get(key)
    except (OSError, ValueError):
        return False
    return old == json.loads(json.dumps(settings))
