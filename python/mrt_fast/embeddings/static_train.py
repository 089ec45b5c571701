"""Fit static token vectors to a sentence transformer's embeddings of a corpus.

The distilled token vectors (:mod:`mrt_fast.embeddings.static`) see each token
alone; a text's static embedding (the normalised sum of its tokens' vectors)
then points somewhat away from where the sentence transformer puts the text.
This step, after model2vec's "tokenlearn" (Tulkens & van Dongen), fits the
vectors to the transformer's embeddings ``Y`` of a corpus of texts:

1. the targets are ``Y`` (unit rows) projected on their first ``dims`` right
   singular vectors, *uncentred*, so that cosines between targets stay those
   of the transformer (a centred PCA would change them);
2. a ridge regression maps the normalised static embeddings of the corpus to
   the targets, and is applied to every token vector (a text's embedding is
   linear in its tokens' vectors, so the map is folded into them);
3. the token vectors are then trained with Adam on the cosine loss
   ``1 - cos(sum of the text's token vectors, target)``, exactly the
   embedding the static tier computes, on mini-batches, keeping the epoch
   with the lowest loss on a held-out part of the corpus.

Everything is seeded; on the CPU with a fixed number of threads the result is
the same bits on every run.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

RIDGE = 1e-5
EPOCHS = 4
LEARNING_RATE = 3e-3
BATCH_SIZE = 128
VAL_FRACTION = 0.1


@dataclass
class FitReport:
    """Held-out cosine loss after the linear map alone and after training."""

    texts_train: int
    texts_heldout: int
    loss_linear: float
    loss_trained: float
    epochs: int
    best_epoch: int

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def target_basis(y: np.ndarray, dims: int) -> np.ndarray:
    """(d, dims): the first ``dims`` right singular vectors of ``y`` (uncentred), each signed to sum >= 0."""
    y = np.asarray(y, dtype=np.float64)
    _, _, vt = np.linalg.svd(y, full_matrices=False)
    basis = vt[: min(dims, y.shape[1])].T
    signs = np.sign(basis.sum(axis=0))
    signs[signs == 0] = 1.0
    return basis * signs


def _unit(x: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(x, axis=1, keepdims=True)
    n[n == 0] = 1.0
    return x / n


def text_sums(vectors: np.ndarray, flat: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Sum of the token vectors of each text (texts given as flat ids and start offsets)."""
    return np.add.reduceat(vectors[flat], starts, axis=0)


def cosine_loss(vectors: np.ndarray, flat: np.ndarray, starts: np.ndarray, targets: np.ndarray) -> float:
    """Mean ``1 - cos(static embedding, target)`` over the texts."""
    x = _unit(text_sums(np.asarray(vectors, dtype=np.float64), flat, starts))
    return float(np.mean(1.0 - np.sum(x * _unit(np.asarray(targets, dtype=np.float64)), axis=1)))


def _subset(flat: np.ndarray, starts: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ends = np.append(starts[1:], len(flat))
    lens = ends[rows] - starts[rows]
    new_starts = np.zeros(len(rows), dtype=np.int64)
    np.cumsum(lens[:-1], out=new_starts[1:])
    new_flat = np.concatenate([flat[s:e] for s, e in zip(starts[rows], ends[rows])]) if len(rows) else flat[:0]
    return new_flat.astype(np.int64), new_starts


def fit_token_vectors(vectors: np.ndarray, flat: np.ndarray, starts: np.ndarray, y: np.ndarray, *,
                      epochs: int = EPOCHS, lr: float = LEARNING_RATE, batch_size: int = BATCH_SIZE,
                      ridge: float = RIDGE, val_fraction: float = VAL_FRACTION, seed: int = 0,
                      progress: bool = True) -> tuple[np.ndarray, FitReport]:
    """Token vectors fitted so that each text's summed, normalised vector approaches its row of ``y``.

    ``vectors``: (vocabulary, dims) distilled vectors; ``flat``, ``starts``: the token ids of the
    corpus texts (flat, start offset of each text); ``y``: (texts, d) the transformer's embeddings of
    them, d >= dims. Returns the new (vocabulary, dims) float32 vectors and the held-out losses.
    """
    import torch
    from tqdm.auto import tqdm

    vectors = np.asarray(vectors, dtype=np.float64)
    n, dims = len(starts), vectors.shape[1]
    rng = np.random.default_rng(seed)
    order = rng.permutation(n)
    n_val = max(1, int(round(val_fraction * n))) if n > 1 else 0
    val_rows, tr_rows = np.sort(order[:n_val]), np.sort(order[n_val:])
    y = _unit(np.asarray(y, dtype=np.float64))
    basis = target_basis(y[tr_rows], dims)
    t = y @ basis
    ftr, str_ = _subset(flat, starts, tr_rows)
    fva, sva = _subset(flat, starts, val_rows)

    # 2. ridge map from the normalised static embeddings to the targets, folded into the vectors
    x = _unit(text_sums(vectors, ftr, str_))
    w = np.linalg.solve(x.T @ x + ridge * len(x) * np.eye(dims), x.T @ t[tr_rows])
    vectors = vectors @ w
    vectors *= 1.0 / max(float(np.median(np.linalg.norm(vectors[np.unique(ftr)], axis=1))), 1e-12)
    loss1 = cosine_loss(vectors, fva, sva, t[val_rows]) if n_val else float("nan")

    # 3. Adam on the cosine loss of the summed vectors
    torch.manual_seed(seed)
    emb = torch.nn.EmbeddingBag.from_pretrained(torch.tensor(vectors, dtype=torch.float32), freeze=False, mode="sum")
    opt = torch.optim.Adam(emb.parameters(), lr=lr)
    ends_tr = np.append(str_[1:], len(ftr))
    tt = torch.tensor(t[tr_rows], dtype=torch.float32)
    best, best_epoch, best_w = loss1, 0, vectors.astype(np.float32)
    steps = epochs * ((len(tr_rows) + batch_size - 1) // batch_size)
    with tqdm(total=steps, desc="fitting static embeddings", unit="batch", disable=not progress) as bar:
        for ep in range(1, epochs + 1):
            perm = rng.permutation(len(tr_rows))
            for s in range(0, len(perm), batch_size):
                b = perm[s : s + batch_size]
                ids = np.concatenate([ftr[str_[i] : ends_tr[i]] for i in b])
                lens = ends_tr[b] - str_[b]
                offs = np.zeros(len(b), dtype=np.int64)
                np.cumsum(lens[:-1], out=offs[1:])
                out = emb(torch.from_numpy(ids), torch.from_numpy(offs))
                loss = (1.0 - torch.nn.functional.cosine_similarity(out, tt[b], dim=1)).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                bar.update(1)
            cur = emb.weight.detach().numpy()
            val = cosine_loss(cur, fva, sva, t[val_rows]) if n_val else -ep
            bar.set_postfix(heldout_loss=f"{val:.4f}")
            if val < best:
                best, best_epoch, best_w = val, ep, cur.copy()
    report = FitReport(len(tr_rows), n_val, loss1, best, epochs, best_epoch)
    return np.ascontiguousarray(best_w, dtype=np.float32), report
