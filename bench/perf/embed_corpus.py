"""Texts for the embedding benchmark, built offline from text Python itself ships.

* :func:`pydoc_pools`: one pool per topic of the interpreter's help
  (``pydoc_data.topics``), its candidates the topic's prose paragraphs;
* :func:`docstring_pools`: one pool per standard-library module, its
  candidates the first paragraphs of the module's function and class
  docstrings;
* :func:`mixed_texts`: ``n`` texts of mixed length (a sentence, a paragraph,
  or two to four paragraphs joined) drawn with a fixed seed from both.

Everything is deterministic for a given Python version; the rewards are a
fixed-seed uniform draw (a stand-in for a reward model, equal for every
embedding, so that only the embedding changes what the selectors keep).
"""

from __future__ import annotations

import importlib
import inspect
import re
import warnings

import numpy as np
import polars as pl

_MODULES = (
    "argparse", "asyncio", "base64", "bisect", "calendar", "collections", "concurrent.futures", "configparser",
    "contextlib", "copy", "csv", "dataclasses", "datetime", "decimal", "difflib", "email", "enum", "fractions",
    "functools", "glob", "gzip", "hashlib", "heapq", "html", "http.client", "imaplib", "inspect", "io",
    "ipaddress", "itertools", "json", "logging", "mailbox", "math", "multiprocessing", "operator", "os",
    "pathlib", "pickle", "platform", "plistlib", "pprint", "queue", "random", "re", "sched", "secrets",
    "selectors", "shlex", "shutil", "smtplib", "socket", "sqlite3", "ssl", "statistics", "string", "struct",
    "subprocess", "tarfile", "tempfile", "textwrap", "threading", "time", "timeit", "tokenize", "traceback",
    "typing", "unittest", "urllib.parse", "urllib.request", "uuid", "warnings", "weakref", "xml.dom.minidom",
    "zipfile", "zlib",
)


def _prose(p: str) -> bool:
    lines = [x for x in p.splitlines() if x.strip()]
    if not lines:
        return False
    code = sum(x.startswith(("   ", ">>>", "...", "$")) or x.strip().startswith(("*", "+", "|")) for x in lines)
    return code == 0 and sum(c.isalpha() for c in p) > 0.6 * len(p)


def _clean(p: str) -> str:
    return re.sub(r"\s+", " ", p).strip()


def _paragraphs() -> dict[str, list[str]]:
    from pydoc_data.topics import topics

    out = {}
    for name in sorted(topics):
        ps = [_clean(p) for p in re.split(r"\n\s*\n", topics[name]) if _prose(p)]
        out[name] = [p for p in dict.fromkeys(ps) if 60 <= len(p) <= 1500]
    return out


def _docstrings() -> dict[str, list[str]]:
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for mod_name in _MODULES:
            try:
                mod = importlib.import_module(mod_name)
            except ImportError:
                continue
            docs = []
            for name in sorted(dir(mod)):
                if name.startswith("_"):
                    continue
                obj = getattr(mod, name, None)
                if not (inspect.isfunction(obj) or inspect.isclass(obj) or inspect.isbuiltin(obj)):
                    continue
                d = inspect.getdoc(obj) or ""
                first = _clean(re.split(r"\n\s*\n", d)[0]) if d else ""
                if 40 <= len(first) <= 1200 and sum(c.isalpha() for c in first) > 0.6 * len(first):
                    docs.append(first)
            out[mod_name] = list(dict.fromkeys(docs))
    return out


def _pools(groups: dict[str, list[str]], source: str, min_size: int, max_size: int, seed: int) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for name, texts in groups.items():
        if len(texts) < min_size:
            continue
        take = texts if len(texts) <= max_size else [texts[i] for i in sorted(rng.choice(len(texts), max_size, replace=False))]
        for j, t in enumerate(take):
            rows.append({"prompt_id": f"{source}:{name}", "response_id": j, "response": t})
    df = pl.DataFrame(rows)
    return df.with_columns(pl.Series("reward", rng.uniform(-1, 1, df.height)))


def pydoc_pools(min_size: int = 6, max_size: int = 16, seed: int = 0) -> pl.DataFrame:
    """Pools of prose paragraphs, one per help topic (columns prompt_id, response_id, response, reward)."""
    return _pools(_paragraphs(), "pydoc", min_size, max_size, seed)


def docstring_pools(min_size: int = 6, max_size: int = 16, seed: int = 1) -> pl.DataFrame:
    """Pools of docstring summaries, one per standard-library module."""
    return _pools(_docstrings(), "doc", min_size, max_size, seed)


def mixed_texts(n: int = 20_000, seed: int = 0) -> list[str]:
    """``n`` texts: 40% one sentence, 40% one paragraph, 20% two to four paragraphs joined.

    Repeats are made distinct by a numbered prefix, so that no text is a
    duplicate of another (a cache or de-duplication cannot skip work).
    """
    paras = [p for ps in _paragraphs().values() for p in ps] + [d for ds in _docstrings().values() for d in ds]
    sents = [s for p in paras for s in re.split(r"(?<=[.!?])\s+", p) if 20 <= len(s) <= 400]
    rng = np.random.default_rng(seed)
    kind = rng.choice(3, size=n, p=[0.4, 0.4, 0.2])
    out = []
    for i, k in enumerate(kind):
        if k == 0:
            t = sents[rng.integers(len(sents))]
        elif k == 1:
            t = paras[rng.integers(len(paras))]
        else:
            t = " ".join(paras[j] for j in rng.integers(len(paras), size=int(rng.integers(2, 5))))
        out.append(t)
    seen: dict[str, int] = {}
    for i, t in enumerate(out):
        c = seen.get(t, 0)
        seen[t] = c + 1
        if c:
            out[i] = f"({c}) {t}"
    return out
