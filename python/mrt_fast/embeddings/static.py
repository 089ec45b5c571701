"""A static embedding model distilled from a sentence transformer, on first use.

The method is model2vec's distillation (Tulkens & van Dongen, "Model2Vec:
fast state-of-the-art static embeddings", 2024; the ``model2vec`` package's
``distill``), done here with torch and NumPy so that it runs offline on the
bundled all-MiniLM-L6-v2 and with the transformers version installed:

1. every token of the source model's vocabulary (less ``[unused*]``) goes
   through the transformer alone, as ``[CLS] token [SEP]``; its vector is the
   mean of the output hidden states;
2. PCA of those vectors to ``pca_dims`` dimensions (centred, eigenvectors of
   the covariance, sign fixed so that each component's largest score is
   positive);
3. each token's vector is scaled by a SIF weight ``a / (a + p)`` where ``p`` is
   the token's Zipf probability estimated from its rank in the vocabulary;
4. the vectors are then fitted to the source model's own sentence embeddings
   (mean-pooled, normalised) of ``TRAIN_TEXTS`` texts read from the docstrings
   of installed packages (:mod:`mrt_fast.embeddings.static_corpus`,
   :mod:`mrt_fast.embeddings.static_train`, after model2vec's "tokenlearn"); embedding
   that corpus with the source model is most of the first use's cost;
5. the mean static embedding of the corpus is kept as a centre.

Inference tokenises a batch with the model's fast (Rust) tokenizer, without
special tokens, sums the rows of the token vectors of each text
(``np.add.reduceat``), L2-normalises, subtracts the centre and normalises
again: there is no network to run.

The distilled vectors, the tokenizer and how they were made are kept in one
``.npz`` file under the embedding cache directory, named after the source
model's weight hash and the distillation parameters, written atomically. A
second call (or process) loads it in well under a second.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from mrt_fast.errors import MissingDependencyError, MrtInputError

#: names that select the static tier distilled from the bundled MiniLM
STATIC_ALIASES = frozenset({"static", "static-minilm", "minilm-static"})
#: ``static:PATH`` distils from a local sentence-transformers directory instead
STATIC_PREFIX = "static:"
PCA_DIMS = 256
SIF_COEFFICIENT = 1e-4
#: tokens per text read at inference (the rest of a longer text is dropped)
MAX_TOKENS = 512
#: corpus texts the token vectors are fitted on (0: distillation only)
TRAIN_TEXTS = 8_000
#: tokens per corpus text read by the source model when embedding the corpus
TRAIN_MAX_TOKENS = 256
#: subtract the mean static embedding of the corpus from each embedding (then normalise again)
CENTER = True
#: version of the file layout and of the distillation steps (part of the file name)
FORMAT_VERSION = 2
_REMOVE = re.compile(r"\[unused\d+\]")


def is_static(model) -> bool:
    """Whether ``model`` names the static tier."""
    return model is not None and (str(model) in STATIC_ALIASES or str(model).startswith(STATIC_PREFIX))


def _source(model) -> tuple[Path, str, str]:
    """(source model directory, source weights sha256, readable name) of a static model name."""
    from mrt_fast.embeddings.tiers import tier_source

    return tier_source(model, STATIC_ALIASES, STATIC_PREFIX, "static")


@dataclass
class StaticModel:
    """Token vectors (vocabulary x dim, float32) and the tokenizer that indexes them."""

    vectors: np.ndarray
    tokenizer_json: str
    meta: dict = field(default_factory=dict)
    #: subtracted from each normalised sum before the final normalisation (``None``: nothing)
    center: np.ndarray | None = None

    def __post_init__(self) -> None:
        from tokenizers import Tokenizer

        self.vectors = np.ascontiguousarray(self.vectors, dtype=np.float32)
        if self.center is not None:
            self.center = np.ascontiguousarray(self.center, dtype=np.float32).reshape(self.vectors.shape[1])
        tok = Tokenizer.from_str(self.tokenizer_json)
        tok.no_padding()
        tok.enable_truncation(MAX_TOKENS)
        self._tok = tok
        unk = self.meta.get("unk_id")
        self._unk = int(unk) if unk is not None else 0

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])

    @property
    def model_id(self) -> str:
        """Identity of the vectors, for the embedding cache (source hash and distillation parameters)."""
        m = self.meta
        return (f"static:{m['source_name']}@{m['source_sha256'][:16]}/pca{m['pca_dims']}-sif{m['sif_coefficient']:g}"
                f"-tl{m.get('train_texts', 0)}-v{m['format']}")

    def token_ids(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(flat token ids, start offset of each text) of a batch; a text without tokens gets ``[UNK]``."""
        from itertools import chain

        enc = getattr(self._tok, "encode_batch_fast", self._tok.encode_batch)(list(texts), add_special_tokens=False)
        ids = [e.ids or [self._unk] for e in enc]
        lens = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        starts = np.zeros(len(ids), dtype=np.int64)
        np.cumsum(lens[:-1], out=starts[1:])
        flat = np.fromiter(chain.from_iterable(ids), dtype=np.int64, count=int(lens.sum()))
        return flat, starts

    def encode(self, texts: Sequence[str], batch_size: int = 4096) -> np.ndarray:
        """Unit-norm float32 embeddings, shape (len(texts), dim): each text's token vectors summed and
        normalised, then (with a centre) re-centred and normalised again, by the core, texts in parallel."""
        from mrt_fast import _grades_core as core

        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for s in range(0, len(texts), batch_size):
            flat, starts = self.token_ids(texts[s : s + batch_size])
            out[s : s + len(starts)] = core.static_embed(self.vectors, flat, starts, self.center).reshape(-1, self.dim)
        return out


def static_path(model, cache_dir: str | os.PathLike | None = None) -> Path:
    """Where the distilled model of ``model`` is (or will be) stored."""
    from mrt_fast.embeddings.tiers import tier_path

    return tier_path(model, STATIC_ALIASES, STATIC_PREFIX, "static", cache_dir,
                     f"pca{PCA_DIMS}-sif{SIF_COEFFICIENT:g}-tl{TRAIN_TEXTS}-v{FORMAT_VERSION}.npz")


_LOADED: dict[str, StaticModel] = {}


def load_static(model="static", cache_dir: str | os.PathLike | None = None, *, device: str | None = None,
                progress: bool = True) -> StaticModel:
    """The static model, from its file if it exists, else distilled now and saved (atomically)."""
    path = static_path(model, cache_dir)
    key = str(path)
    if key in _LOADED:
        return _LOADED[key]
    m = _read(path)
    if m is None:
        src, sha, name = _source(model)
        m = distill(src, source_sha256=sha, source_name=name, device=device, progress=progress,
                    train_texts=TRAIN_TEXTS)
        _write(m, path)
    _LOADED[key] = m
    return m


def _read(path: Path) -> StaticModel | None:
    """The model in ``path``; ``None`` if it is missing or unreadable (then it is distilled again)."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(bytes(z["meta"]).decode())
            vectors = z["vectors"]
            tok = bytes(z["tokenizer"]).decode()
            center = z["center"] if "center" in z.files else None
        digest = _digest(vectors, center)
        if meta.get("format") != FORMAT_VERSION or meta.get("vectors_sha256") != digest:
            return None
        return StaticModel(vectors, tok, meta, center)
    except Exception:  # noqa: BLE001 - a damaged file is rebuilt, not trusted
        return None


def _write(m: StaticModel, path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        from mrt_fast._util.files import atomic_path

        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            extra = {"center": m.center} if m.center is not None else {}
            np.savez(f, vectors=m.vectors, tokenizer=np.frombuffer(m.tokenizer_json.encode(), dtype=np.uint8),
                     meta=np.frombuffer(json.dumps(m.meta).encode(), dtype=np.uint8), **extra)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise MrtInputError(f"cannot save the static embedding model to {str(path)!r}: {e}") from None


def _digest(vectors: np.ndarray, center: np.ndarray | None) -> str:
    """sha256 of the vectors (and of the centre, when there is one)."""
    h = hashlib.sha256(np.ascontiguousarray(vectors, dtype=np.float32).tobytes())
    if center is not None:
        h.update(np.ascontiguousarray(center, dtype=np.float32).tobytes())
    return h.hexdigest()


def sif_weights(n: int, sif_coefficient: float = SIF_COEFFICIENT) -> np.ndarray:
    """``a / (a + p_r)`` with ``p_r`` the Zipf probability of rank ``r`` (1/(r+1), normalised), r = 1..n."""
    inv = 1.0 / np.arange(2, n + 2, dtype=np.float64)
    p = inv / inv.sum()
    return sif_coefficient / (sif_coefficient + p)


def pca(x: np.ndarray, dims: int) -> np.ndarray:
    """Scores of ``x`` on its first ``dims`` principal components (float64 covariance, fixed signs)."""
    x = np.asarray(x, dtype=np.float64)
    xc = x - x.mean(axis=0)
    cov = (xc.T @ xc) / max(len(x) - 1, 1)
    vals, vecs = np.linalg.eigh(cov)
    comps = vecs[:, ::-1][:, : min(dims, x.shape[1])]
    scores = xc @ comps
    big = np.argmax(np.abs(scores), axis=0)
    signs = np.sign(scores[big, np.arange(scores.shape[1])])
    signs[signs == 0] = 1.0
    return scores * signs


def distill(src: str | os.PathLike, *, source_sha256: str, source_name: str, pca_dims: int = PCA_DIMS,
            sif_coefficient: float = SIF_COEFFICIENT, device: str | None = None, batch_size: int = 1024,
            progress: bool = True, train_texts: int = 0, seed: int = 0) -> StaticModel:
    """Distil a static model from the sentence transformer in directory ``src`` (offline)."""
    try:
        import torch
        from transformers import AutoModel
    except ImportError:
        raise MissingDependencyError("distilling the static model needs torch and transformers (pip install 'mrt_fast[embed]')") \
            from None
    from tqdm.auto import tqdm

    from mrt_fast._util.device import resolve_device

    src = Path(src)
    tok_json = (src / "tokenizer.json").read_text(encoding="utf-8")
    vocab: dict[str, int] = json.loads(tok_json)["model"]["vocab"]
    special = json.loads(tok_json).get("added_tokens", [])
    by_content = {t["content"]: t["id"] for t in special}
    cls_id, sep_id = by_content.get("[CLS]"), by_content.get("[SEP]")
    unk_id = by_content.get("[UNK]")
    n_vocab = max(vocab.values()) + 1
    keep = np.array(sorted(i for t, i in vocab.items() if not _REMOVE.fullmatch(t)), dtype=np.int64)
    dev = resolve_device(device)
    import logging
    import warnings

    level = logging.getLogger("transformers").level
    logging.getLogger("transformers").setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            net = AutoModel.from_pretrained(str(src), local_files_only=True).to(dev).eval()
    except Exception as e:  # noqa: BLE001
        raise MrtInputError(f"cannot load {str(src)!r} to distil a static model: {type(e).__name__}: {e}") from None
    finally:
        logging.getLogger("transformers").setLevel(level)
    pre = [cls_id] if cls_id is not None else []
    post = [sep_id] if sep_id is not None else []
    seq = np.array([[*pre, int(t), *post] for t in keep], dtype=np.int64)
    out = np.empty((len(keep), net.config.hidden_size), dtype=np.float32)
    with torch.inference_mode(), tqdm(total=len(keep), desc="distilling static embeddings", unit="token",
                                      disable=not progress) as bar:
        for s in range(0, len(seq), batch_size):
            ids = torch.from_numpy(seq[s : s + batch_size]).to(dev)
            h = net(input_ids=ids, attention_mask=torch.ones_like(ids), token_type_ids=torch.zeros_like(ids))
            out[s : s + len(ids)] = h.last_hidden_state.float().mean(dim=1).cpu().numpy()
            bar.update(len(ids))
    out = np.nan_to_num(out)
    red = pca(out, pca_dims) * sif_weights(len(keep), sif_coefficient)[:, None]
    vectors = np.zeros((n_vocab, red.shape[1]), dtype=np.float32)
    vectors[keep] = red.astype(np.float32)
    fit: dict = {"train_texts": 0}
    center = None
    if train_texts:
        vectors, center, fit = _fit_to_corpus(net, dev, tok_json, vectors, train_texts, seed=seed, progress=progress)
    meta = {
        "format": FORMAT_VERSION, "method": "model2vec distillation (mean pooling, PCA, Zipf SIF weights)"
        + (", token vectors fitted to the source's sentence embeddings of a corpus (tokenlearn)" if train_texts else ""),
        **fit,
        "source_name": source_name, "source_sha256": source_sha256, "pca_dims": int(red.shape[1]),
        "sif_coefficient": float(sif_coefficient), "vocab_size": int(n_vocab), "tokens_distilled": int(len(keep)),
        "unk_id": unk_id, "max_tokens": MAX_TOKENS, "vectors_sha256": _digest(vectors, center),
    }
    return StaticModel(vectors, tok_json, meta, center)


def source_sentence_embeddings(net, dev, tok_json: str, texts: Sequence[str], *, max_tokens: int = TRAIN_MAX_TOKENS,
                               batch_size: int = 64, progress: bool = True) -> np.ndarray:
    """The source model's sentence embeddings of ``texts``: mean of the output states over the tokens, normalised.

    This is all-MiniLM-L6-v2's own pipeline (sentence-transformers: mean pooling, then normalisation),
    with texts cut at ``max_tokens`` tokens (its ``max_seq_length``); batches are sorted by length.
    """
    import torch
    from tokenizers import Tokenizer
    from tqdm.auto import tqdm

    from mrt_fast.embeddings.tiers import padded_batch

    tok = Tokenizer.from_str(tok_json)
    limit = min(max_tokens, int(getattr(net.config, "max_position_embeddings", max_tokens)))
    tok.enable_truncation(limit)
    tok.no_padding()
    enc = [e.ids for e in getattr(tok, "encode_batch_fast", tok.encode_batch)(list(texts), add_special_tokens=True)]
    order = np.argsort([-len(e) for e in enc], kind="stable")
    out = np.empty((len(texts), net.config.hidden_size), dtype=np.float32)
    with torch.inference_mode(), tqdm(total=len(texts), desc="embedding the fitting corpus", unit="text",
                                      disable=not progress) as bar:
        for s in range(0, len(order), batch_size):
            rows = order[s : s + batch_size]
            ids, mask = padded_batch(enc, rows)
            ids_t, mask_t = torch.from_numpy(ids).to(dev), torch.from_numpy(mask).to(dev)
            h = net(input_ids=ids_t, attention_mask=mask_t, token_type_ids=torch.zeros_like(ids_t)).last_hidden_state
            m = mask_t.unsqueeze(-1).to(h.dtype)
            v = (h * m).sum(dim=1) / m.sum(dim=1).clamp(min=1e-9)
            out[rows] = torch.nn.functional.normalize(v.float(), dim=1).cpu().numpy()
            bar.update(len(rows))
    return out


def _fit_to_corpus(net, dev, tok_json: str, vectors: np.ndarray, n_texts: int, *, seed: int,
                   progress: bool) -> tuple[np.ndarray, np.ndarray | None, dict]:
    """Vectors fitted on ``n_texts`` corpus texts, their centre (or ``None``), and what to record of the fit."""
    from mrt_fast.embeddings.static_corpus import corpus_texts
    from mrt_fast.embeddings.static_train import fit_token_vectors

    if progress:
        print(f"reading {n_texts} texts from installed packages' docstrings to fit the static model", file=sys.stderr)
    texts = corpus_texts(n_texts)
    if len(texts) < 100:
        raise MrtInputError(
            f"fitting the static model needs at least 100 texts from the installed packages' docstrings; found {len(texts)}"
        )
    y = source_sentence_embeddings(net, dev, tok_json, texts, progress=progress)
    m = StaticModel(vectors, tok_json, {})
    flat, starts = m.token_ids(texts)
    fitted, report = fit_token_vectors(vectors, flat, starts, y, seed=seed, progress=progress)
    center = None
    if CENTER:
        center = StaticModel(fitted, tok_json, {}).encode(texts).astype(np.float64).mean(axis=0).astype(np.float32)
    digest = hashlib.sha256("\n".join(texts).encode("utf-8", "surrogatepass")).hexdigest()
    return fitted, center, {"train_texts": int(n_texts), "train_texts_found": len(texts), "train_corpus_sha256": digest,
                    "fit": report.as_dict()}
