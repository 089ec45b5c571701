"""Sentence embeddings of response text, offline: MiniLM, its int8 tier and a static tier, cached on disk."""

from __future__ import annotations

from mrt_fast.embeddings.dataset import EmbedReport, embed_dataset
from mrt_fast.embeddings.embed import DEFAULT_MODEL, EmbeddingCache, embed, embed_texts, load_model
from mrt_fast.embeddings.quality import compare_embeddings

__all__ = ["DEFAULT_MODEL", "EmbedReport", "EmbeddingCache", "compare_embeddings", "embed", "embed_dataset",
           "embed_texts", "load_model"]
