"""Every test named in docs/guarantees.md exists (a renamed or removed test breaks the doc)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_guarantees_name_existing_tests():
    text = (ROOT / "docs" / "guarantees.md").read_text()
    refs = re.findall(r"`(tests/[\w/]+\.py)(?:::(\w+))?`", text)
    assert refs
    for path, name in refs:
        f = ROOT / path
        assert f.is_file(), path
        if name:
            assert re.search(rf"^(async )?def {name}\(", f.read_text(), re.M), f"{path}::{name}"
