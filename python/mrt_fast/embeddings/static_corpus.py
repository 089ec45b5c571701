"""Texts to train the static tier on, read from the docstrings of installed packages.

The static tier's token vectors are fitted so that a text's mean token vector
points where the source sentence transformer puts the text
(:mod:`mrt_fast.embeddings.static_train`). The texts come from what every install able to
distil the static model already has: the source code of torch and transformers
(and of sentence-transformers and huggingface_hub when present). Files are
parsed with :mod:`ast`, never imported; each docstring gives its prose
paragraphs (code, tables, parameter lists and section headers dropped).

Files are visited in the order of a hash of their path inside the package and
the texts are kept in the order of a hash of their content, so the corpus is a
fixed function of the installed package versions (its sha256 is recorded with
the model).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import re
from pathlib import Path
from typing import Iterable, Iterator

#: packages whose docstrings make the corpus (those installed are read, in this order of preference)
PACKAGES = ("torch", "transformers", "sentence_transformers", "huggingface_hub")
MIN_CHARS = 40
MAX_CHARS = 1500
_SECTION = re.compile(
    r"^(args|arguments|parameters|params|returns?|yields?|raises?|examples?|example usage|note|notes|warning|"
    r"attributes|see also|references?|shape|inputs?|outputs?|kwargs|keyword arguments|todo)\s*:?\s*$",
    re.IGNORECASE,
)


def _prose(p: str) -> bool:
    lines = [x for x in p.splitlines() if x.strip()]
    if not lines or _SECTION.match(lines[0].strip()):
        return False
    codeish = sum(
        x.startswith(("    ", "\t", ">>>", "...", "$")) or x.strip().startswith(("*", "+", "|", "-", "=", "`", ":", "#"))
        for x in lines
    )
    return codeish == 0 and sum(c.isalpha() for c in p) > 0.6 * len(p) and " " in p.strip()


def _clean(p: str) -> str:
    return re.sub(r"\s+", " ", p).strip()


def docstring_paragraphs(doc: str, max_paragraphs: int = 3) -> list[str]:
    """The first ``max_paragraphs`` prose paragraphs of a docstring, whitespace collapsed, before any section."""
    out = []
    for p in re.split(r"\n\s*\n", doc):
        first = next((x.strip() for x in p.splitlines() if x.strip()), "")
        if _SECTION.match(first) or first.endswith("::"):
            break
        if _prose(p):
            c = _clean(p)
            if MIN_CHARS <= len(c) <= MAX_CHARS:
                out.append(c)
        if len(out) >= max_paragraphs:
            break
    return out


def _key(s: str) -> bytes:
    return hashlib.sha256(s.encode("utf-8", "surrogatepass")).digest()


def package_dirs(packages: Iterable[str] = PACKAGES) -> list[tuple[str, Path]]:
    """(name, source directory) of the installed packages among ``packages`` (found without importing them)."""
    out = []
    for name in packages:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is not None and spec.submodule_search_locations:
            out.append((name, Path(next(iter(spec.submodule_search_locations)))))
    return out


def _file_texts(path: Path) -> Iterator[str]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, OSError, ValueError):
        return
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc:
                yield from docstring_paragraphs(doc)


def corpus_texts(n: int, packages: Iterable[str] = PACKAGES, exclude: Iterable[str] = ()) -> list[str]:
    """Up to ``n`` distinct prose paragraphs from the docstrings of the installed ``packages``.

    Files are read in hash order until ``2 n`` distinct candidates (or all files) are seen; the ``n``
    with the smallest content hash are returned, in that order. Texts in ``exclude`` are left out.
    """
    files = []
    for name, root in package_dirs(packages):
        files += [(f"{name}/{p.relative_to(root).as_posix()}", p) for p in root.rglob("*.py")]
    files.sort(key=lambda rp: _key(rp[0]))
    skip = set(exclude)
    seen: dict[str, None] = {}
    for _, p in files:
        for t in _file_texts(p):
            if t not in skip:
                seen.setdefault(t, None)
        if len(seen) >= 2 * n:
            break
    return sorted(seen, key=_key)[:n]
