"""Fitting the static tier's token vectors to sentence embeddings, and the corpus it is fitted on."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.embed  # torch comes with the embed extra

from mrt_fast.embeddings.static_corpus import corpus_texts, docstring_paragraphs  # noqa: E402
from mrt_fast.embeddings.static_train import fit_token_vectors, target_basis  # noqa: E402


def _bag_problem(seed: int, n_texts: int = 1500, vocab: int = 120, dim: int = 16, out: int = 24):
    """Texts of random tokens whose targets are a fixed map of their bag of words (learnable by a static model)."""
    true = np.random.default_rng(0).normal(size=(vocab, out))  # the same map for every seed
    rng = np.random.default_rng(seed + 1)
    start = rng.normal(size=(vocab, dim))  # unrelated to the truth: the fit has to find it
    lens = rng.integers(3, 12, size=n_texts)
    flat = rng.integers(0, vocab, size=int(lens.sum()))
    starts = np.zeros(n_texts, dtype=np.int64)
    np.cumsum(lens[:-1], out=starts[1:])
    y = np.add.reduceat(true[flat], starts, axis=0)
    y /= np.linalg.norm(y, axis=1, keepdims=True)
    return start, flat, starts, y


def test_fitting_reduces_the_heldout_loss():
    v0, flat, starts, y = _bag_problem(0)
    v, rep = fit_token_vectors(v0, flat, starts, y, epochs=6, lr=3e-2, batch_size=64, progress=False)
    assert v.shape == v0.shape and v.dtype == np.float32
    assert rep.texts_heldout == 150 and rep.texts_train == 1350
    # training helps over the linear map alone, on held-out texts
    assert rep.loss_trained < 0.5 * rep.loss_linear
    # on fresh texts of the same kind, pairwise cosines follow the targets' far better than before
    _, flat2, starts2, _ = _bag_problem(1, n_texts=300)
    true = np.random.default_rng(0).normal(size=(120, 24))  # the same map as _bag_problem(0)
    y2 = _unit(np.add.reduceat(true[flat2], starts2, axis=0))

    def agreement(vectors):
        x = _unit(np.add.reduceat(vectors[flat2], starts2, axis=0))
        iu = np.triu_indices(len(x), 1)
        return np.corrcoef((x @ x.T)[iu], (y2 @ y2.T)[iu])[0, 1]

    assert agreement(v) > 0.9 > agreement(v0) + 0.3


def _unit(x):
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_fitting_is_deterministic_given_the_seed():
    v0, flat, starts, y = _bag_problem(2, n_texts=400)
    kw = dict(epochs=2, lr=1e-2, batch_size=32, progress=False)
    a, ra = fit_token_vectors(v0, flat, starts, y, seed=3, **kw)
    b, rb = fit_token_vectors(v0, flat, starts, y, seed=3, **kw)
    c, _ = fit_token_vectors(v0, flat, starts, y, seed=4, **kw)
    assert np.array_equal(a, b) and ra == rb
    assert not np.array_equal(a, c)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.integers(6, 12), st.integers(0, 2**31 - 1))
def test_target_basis_keeps_the_cosines(rank, dims, seed):
    """Projected on the basis, targets of rank <= dims keep their pairwise cosines (no centring)."""
    rng = np.random.default_rng(seed)
    y = rng.normal(size=(30, rank)) @ rng.normal(size=(rank, 16)) + 0.0
    y /= np.linalg.norm(y, axis=1, keepdims=True)
    p = y @ target_basis(y, dims)
    p /= np.linalg.norm(p, axis=1, keepdims=True)
    np.testing.assert_allclose(p @ p.T, y @ y.T, atol=1e-8)


def test_docstring_paragraphs_keep_prose_only():
    doc = (
        "Compute the weighted mean of a tensor along a dimension.\n\n"
        "The weights are broadcast against the input and need not sum to one.\n\n"
        ">>> x = torch.ones(3)\n>>> weighted_mean(x)\n\n"
        "Args:\n    x: the input tensor, of any shape whatsoever really.\n"
    )
    got = docstring_paragraphs(doc)
    assert got == ["Compute the weighted mean of a tensor along a dimension.",
                   "The weights are broadcast against the input and need not sum to one."]
    assert docstring_paragraphs("Short.") == []
    assert docstring_paragraphs("Args:\n    x: a long enough description of a parameter here.") == []


def test_corpus_is_fixed_distinct_and_excludes(tmp_path, monkeypatch):
    pkg = tmp_path / "fakepkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""The fake package reads tables of numbers from many different files."""\n')
    body = "\n".join(
        f'def f{i}():\n    """Function number {i} turns a list of words into a sorted table of counts."""\n'
        for i in range(30)
    )
    (pkg / "sub" / "mod.py").write_text(body + '\nclass C:\n    """Function number 3 turns a list of words into a sorted '
                                        'table of counts."""\n')
    (pkg / "broken.py").write_text("def (:\n")  # unparsable files are skipped
    monkeypatch.syspath_prepend(str(tmp_path))
    a = corpus_texts(12, packages=("fakepkg", "no_such_package_here"))
    b = corpus_texts(12, packages=("fakepkg",))
    assert a == b and len(a) == 12 and len(set(a)) == 12
    assert all(40 <= len(t) <= 1500 for t in a)
    everything = corpus_texts(1000, packages=("fakepkg",))
    assert len(everything) == 31  # 30 functions and the package docstring; the class repeats one
    c = corpus_texts(1000, packages=("fakepkg",), exclude=a[:5])
    assert set(c) == set(everything) - set(a[:5])
