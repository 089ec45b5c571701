"""Every test hook of the package (an ``MRT_`` environment variable named for a test or a
fault) is listed in the Test hooks section of docs/reference/development.md, and that section lists
no hook the package no longer has."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HOOK = re.compile(r"\bMRT_[A-Z0-9_]*(?:TEST|FAULT)[A-Z0-9_]*\b")


def _section(text: str, title: str) -> str:
    start = text.index(f"### {title}\n")
    end = text.find("\n#", start + 1)
    return text[start:end if end >= 0 else None]


def test_every_hook_in_the_package_is_listed_and_no_other():
    in_package = {m for p in (ROOT / "python" / "mrt_fast").rglob("*.py") for m in HOOK.findall(p.read_text())}
    listed = set(HOOK.findall(_section((ROOT / "docs" / "reference" / "development.md").read_text(), "Test hooks")))
    assert {"MRT_TEST_STOP_AFTER_PARTS", "MRT_RAY_FAULT_ONCE"} <= in_package  # the finder sees the hooks
    assert in_package == listed
