"""The user documents point only at files and tests that exist, and the benchmark page matches its results."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# [text](target) links and `path/like/this.ext` mentions of repository files
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
PATH = re.compile(r"(?<![\w/.~$-])((?:bench|configs|crates|docs|python|tests|tools)/[A-Za-z0-9_./-]*[A-Za-z0-9_]\.[a-z]{1,5})\b")


def _targets(doc: Path):
    text = doc.read_text()
    for m in LINK.finditer(text):
        t = m.group(1)
        if "://" in t or t.startswith("mailto:"):
            continue
        yield t, (doc.parent / t).resolve()
    for m in PATH.finditer(text):
        t = m.group(1)
        if "*" in t or "<" in t:
            continue
        yield t, (ROOT / t).resolve()


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_links_point_at_files(doc):
    dead = [t for t, p in _targets(doc) if not p.exists()]
    assert not dead, f"{doc.relative_to(ROOT)} points at missing files: {dead}"


def test_code_points_at_existing_docs():
    dead = []
    for py in sorted((ROOT / "python").rglob("*.py")):
        for m in PATH.finditer(py.read_text()):
            t = m.group(1)
            if t.startswith(("docs/", "configs/")) and not (ROOT / t).exists():
                dead.append(f"{py.relative_to(ROOT)}: {t}")
    assert not dead, dead


def test_link_checker_sees_a_dead_link(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("see [here](nowhere.md) and `python/mrt_fast/nothing_here.py`")
    assert [t for t, p in _targets(doc) if not p.exists()] == ["nowhere.md", "python/mrt_fast/nothing_here.py"]


def test_benchmark_page_is_generated_from_results():
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "perf" / "benchmarks_doc.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_guarantees_name_existing_tests():
    text = (ROOT / "docs" / "reference" / "guarantees.md").read_text()
    refs = re.findall(r"`(tests/[\w/]+\.py)(?:::(\w+))?`", text)
    assert refs
    missing = []
    for path, name in refs:
        f = ROOT / path
        if not f.is_file() or (name and not re.search(rf"^(async )?def {name}\(", f.read_text(), re.M)):
            missing.append(f"{path}::{name}" if name else path)
    assert not missing, f"docs/reference/guarantees.md names tests that do not exist: {missing}"
