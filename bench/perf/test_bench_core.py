"""pytest-benchmark suite over the selection core's hot calls.

Run with ``python -m pytest bench/perf/ --benchmark-only`` (the normal test run,
``pytest`` with ``testpaths = tests``, does not collect this directory).
Compare runs with ``--benchmark-autosave`` / ``--benchmark-compare`` to see
regressions. Sizes are reduced versions of ``run_select_bench.py``'s
workloads so the whole suite takes a minute or two on a small machine.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy_reference as ref  # noqa: E402

mrt_fast = pytest.importorskip("mrt_fast")

POOLS, N, D, K = 1_000, 64, 384, 4
ROUNDS = 5


def _pools(pools: int, n: int, d: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    centre = rng.standard_normal((pools, 1, d), dtype=np.float32)
    mode = rng.standard_normal((pools, 4, d), dtype=np.float32)
    which = rng.integers(0, 4, size=(pools, n))
    x = centre + 0.8 * np.take_along_axis(mode, which[:, :, None], axis=1)
    x += 0.6 * rng.standard_normal((pools, n, d), dtype=np.float32)
    return np.ascontiguousarray(x.reshape(pools * n, d)), rng.random(pools * n)


@pytest.fixture(scope="module")
def w1():
    x, r = _pools(POOLS, N, D)
    return x, r, np.arange(POOLS + 1, dtype=np.int64) * N


@pytest.fixture(scope="module")
def single_pool():
    rng = np.random.default_rng(1)
    c = rng.standard_normal((40, D), dtype=np.float32)
    x = c[rng.integers(0, 40, 4_000)] + 0.7 * rng.standard_normal((4_000, D), dtype=np.float32)
    return np.ascontiguousarray(x)


@pytest.fixture(scope="module")
def sparse_graph():
    """A symmetric clipped-cosine 16-NN-like graph over 20,000 points."""
    sp = pytest.importorskip("scipy.sparse")
    rng = np.random.default_rng(2)
    n, d, kn = 20_000, 64, 16
    c = rng.standard_normal((200, d), dtype=np.float32)
    lab = rng.integers(0, 200, n)
    xn = ref.normalize(c[lab] + 0.7 * rng.standard_normal((n, d), dtype=np.float32))
    order = np.argsort(lab, kind="stable")
    # neighbours: kn random members of the same cluster (cheap, no index)
    starts = np.searchsorted(lab[order], np.arange(200))
    sizes = np.bincount(lab, minlength=200)
    nb = order[starts[lab][:, None] + (rng.random((n, kn)) * sizes[lab][:, None]).astype(np.int64)]
    rows = np.repeat(np.arange(n), kn)
    vals = np.maximum(np.einsum("id,ikd->ik", xn, xn[nb]).ravel(), 0)
    cols = nb.ravel()
    keep = (cols != rows) & (vals > 0)
    _, first = np.unique(rows[keep] * n + cols[keep], return_index=True)  # drop repeated pairs
    r_, c_, v_ = rows[keep][first], cols[keep][first], vals[keep][first]
    g = sp.csr_matrix((v_, (r_, c_)), shape=(n, n), dtype=np.float32)
    g = g.maximum(g.T).tocsr()
    g = (g + sp.identity(n, dtype=np.float32, format="csr")).tocsr()
    g.sort_indices()
    return g


@pytest.fixture(scope="module")
def table():
    pl = pytest.importorskip("polars")
    rng = np.random.default_rng(3)
    rows, n, d = 100_000, 64, 32
    emb = rng.standard_normal((rows, d), dtype=np.float32)
    return pl.DataFrame(
        {
            "prompt_id": np.arange(rows) // n,
            "reward": rng.random(rows),
            "mode": rng.integers(0, 4, rows),
            "embedding": emb,
        }
    )


def _run(benchmark, fn, *a, **kw):
    return benchmark.pedantic(fn, args=a, kwargs=kw, rounds=ROUNDS, iterations=1, warmup_rounds=1)


# ---- W1 at reduced size: many small pools ---------------------------------


@pytest.mark.parametrize("alpha", [0.0, 0.75], ids=["diverse", "grades"])
def test_w1_small_pools(benchmark, w1, alpha):
    x, r, off = w1
    res = _run(benchmark, mrt_fast.facility_location, x, K, offsets=off, rewards=r, alpha=alpha, kernel="clip")
    picks, _ = ref.batched_facility_location(x[: 50 * N], N, K, rewards=r[: 50 * N], alpha=alpha)
    assert (np.stack(res.indices[:50]) == picks).all()


def test_w1_numpy_reference(benchmark, w1):
    """The batched NumPy reference on the same data, for a ratio in one run."""
    x, _, _ = w1
    picks, obj = _run(benchmark, ref.batched_facility_location, x, N, K, workers=2)
    assert picks.shape == (POOLS, K) and np.all(obj > 0)


# ---- one pool: on-demand vs dense ------------------------------------------


@pytest.mark.parametrize("memory", ["on_demand", "dense"])
def test_single_pool(benchmark, single_pool, memory):
    res = _run(benchmark, mrt_fast.facility_location, single_pool, 50, kernel="clip", memory=memory)
    assert len(res.indices) == 50 and len(set(res.indices.tolist())) == 50
    assert res.upper_bound >= res.objective > 0


# ---- one sparse pool ---------------------------------------------------------


def test_sparse_pool(benchmark, sparse_graph):
    res = _run(benchmark, mrt_fast.facility_location, similarity=sparse_graph, k=200, symmetric=True)
    picks, obj = ref.sparse_lazy_greedy(sparse_graph, 200)
    assert np.array_equal(res.indices, picks)
    assert res.objective == pytest.approx(obj, rel=1e-5)


# ---- table-level selection on 1e5 rows -----------------------------------------


@pytest.mark.parametrize("method", ["random", "top", "stratified", "grades"])
def test_select_table(benchmark, table, method):
    out = _run(benchmark, mrt_fast.select, table, 4, method=method, kernel="clip")
    assert out.height == 4 * table["prompt_id"].n_unique()
    assert out.group_by("prompt_id").len()["len"].max() == 4


# ---- variance accumulator: 1e7 rows streamed in chunks of 2^20 ----------------

VROWS, VK, VCHUNK = 10_000_000, 16, 1 << 20


@pytest.fixture(scope="module", params=["sorted", "grouped", "shuffled"])
def variance_rows(request):
    """(ids, losses) chunks: integer ids in order, grouped prompts (mixed
    64-bit keys), or rows in random order."""
    rng = np.random.default_rng(3)
    idx = np.arange(VROWS, dtype=np.int64) // VK
    if request.param == "shuffled":
        rng.shuffle(idx)
    if request.param == "sorted":
        ids = idx
    else:
        ids = (idx.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) ^ np.uint64(12345)
    x = rng.normal(size=VROWS)
    chunks = [(ids[s : s + VCHUNK], x[s : s + VCHUNK]) for s in range(0, VROWS, VCHUNK)]
    return request.param, chunks


def test_variance_read_floor(benchmark, variance_rows):
    """The floor the stream is compared with: one pass that reads the rows."""
    _, chunks = variance_rows
    benchmark(lambda: sum(float(np.sum(i)) + float(np.sum(x)) for i, x in chunks))


def _stream(chunks):
    acc = mrt_fast._grades_core.VarianceAccumulator()
    up = acc.update_int_ids if chunks[0][0].dtype == np.int64 else acc.update
    for i, x in chunks:
        up(i, x)
    return acc


def test_variance_stream(benchmark, variance_rows):
    _, chunks = variance_rows
    acc = benchmark.pedantic(_stream, args=(chunks,), rounds=ROUNDS, iterations=1)
    assert len(acc) == VROWS // VK and acc.n_rows == VROWS


def test_variance_stream_and_summary(benchmark, variance_rows):
    _, chunks = variance_rows
    s = benchmark.pedantic(lambda: _stream(chunks).summary(), rounds=ROUNDS, iterations=1)
    assert s["n_prompts"] == VROWS // VK and s["v_y_given_x"] == pytest.approx(1.0, rel=0.01)
