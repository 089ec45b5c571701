"""Typed stubs of the Rust core (`crates/grades_core/src/python/`).

Every function validates its arrays, releases the GIL for the work, raises
mrt_fast.errors.MrtInputError (with .pool, .column, .row where known) on bad
input and RuntimeError (never a panic) on an internal error.
Arrays must be C-contiguous with the dtypes shown (the Python layer converts).
The defaults of selection (kernel, alpha, eps) live in Python
(mrt_fast.selection.options): the core has none and takes them from every caller.
"""

from typing import Any, Optional, TypedDict, Union

import numpy as np
import numpy.typing as npt

__version__: str
# Bytes of a pool's n x n float32 similarity above which fl_batch computes
# columns on demand (2 GiB: pools of more than 23,170 candidates).
DENSE_LIMIT_BYTES: int

class FlBatch(TypedDict):
    indices: npt.NDArray[np.uint64]  # positions within each pool, pick order
    offsets: npt.NDArray[np.uint64]  # pool p's picks: indices[offsets[p]:offsets[p+1]]
    gains: npt.NDArray[np.float64]
    objective: npt.NDArray[np.float64]  # per pool
    upper_bound: npt.NDArray[np.float64]  # per pool
    ties: npt.NDArray[np.uint64]  # per pool: picks decided by the tie rule
    zero_gain: npt.NDArray[np.uint64]  # per pool: picks with zero gain
    dup_skipped: npt.NDArray[np.uint64]  # per pool: duplicates of a kept candidate left out

class FlSingle(TypedDict):
    indices: npt.NDArray[np.uint64]
    gains: npt.NDArray[np.float64]
    objective: float
    upper_bound: float
    ties: int
    zero_gain: int
    dup_skipped: int

class Picks(TypedDict):
    indices: npt.NDArray[np.uint64]
    offsets: npt.NDArray[np.uint64]
    weights: npt.NDArray[np.float64]
    modes_missed: npt.NDArray[np.uint64]  # per pool
    dup_skipped: npt.NDArray[np.uint64]  # per pool: repeats of a kept candidate passed over

class Modes(TypedDict):
    labels: npt.NDArray[np.uint32]  # per position
    n_modes: npt.NDArray[np.uint32]  # per pool
    inertia: npt.NDArray[np.float64]
    silhouette: npt.NDArray[np.float64]

class FlParams:
    """Parameters shared by every facility-location entry point; checked when made
    (MrtInputError on k < 1, alpha < 0, eps <= 0, k_max < k, an unknown optimizer)."""

    def __init__(
        self, k: int, *, alpha: float, eps: float, k_max: Optional[int] = None, optimizer: str = "lazy"
    ) -> None: ...

def fl_batch(
    data: Union[npt.NDArray[np.float32], npt.NDArray[np.float16],
                list[npt.NDArray[np.float32]], list[npt.NDArray[np.float16]]],
    offsets: npt.NDArray[np.uint64],
    params: FlParams,
    *,
    rows: Optional[npt.NDArray[np.uint64]] = None,
    rewards: Optional[npt.NDArray[np.float64]] = None,
    kernel: str,
    dense_limit: Optional[int] = None,
    text: Optional[npt.NDArray[np.uint64]] = None,
    ordered: bool = False,
) -> FlBatch:
    """`data`: one C-contiguous (n, d) float32 or float16 matrix, or a list of such row blocks of one
    dtype (rows numbered across them in order), read in place; float16 rows are widened as each pool's
    rows are gathered. A pool whose n x n block exceeds dense_limit bytes (default DENSE_LIMIT_BYTES)
    runs on demand."""
def fl_dense(
    sim: npt.NDArray[np.float32],
    params: FlParams,
    *,
    rewards: Optional[npt.NDArray[np.float64]] = None,
) -> FlSingle: ...
def fl_sparse(
    n: int,
    indptr: npt.NDArray[np.int32] | npt.NDArray[np.int64],
    indices: npt.NDArray[np.int32] | npt.NDArray[np.int64],
    data: npt.NDArray[np.float32],
    params: FlParams,
    *,
    rewards: Optional[npt.NDArray[np.float64]] = None,
    symmetric: bool = False,
) -> FlSingle:
    """CSR arrays are used in place; symmetric=True promises S = S^T (no transpose);
    an (i, j) stored twice is an error."""
def fl_on_demand(
    x: npt.NDArray[np.float32],
    params: FlParams,
    *,
    rewards: Optional[npt.NDArray[np.float64]] = None,
    kernel: str,
) -> FlSingle: ...
def similarity(x: npt.NDArray[np.float32], kernel: str) -> npt.NDArray[np.float32]:
    """Flattened (n*n) cosine similarity of the rows of x mapped into [0, 1]."""
def random_k(
    offsets: npt.NDArray[np.uint64],
    keys: npt.NDArray[np.uint64],
    k: int,
    seed: int,
    *,
    rows: Optional[npt.NDArray[np.uint64]] = None,
    n_rows: Optional[int] = None,
    content: Optional[npt.NDArray[np.uint64]] = None,
    dups: Optional[npt.NDArray[np.uint64]] = None,
) -> Picks: ...
def top_k(
    offsets: npt.NDArray[np.uint64],
    rewards: npt.NDArray[np.float64],
    k: int,
    *,
    rows: Optional[npt.NDArray[np.uint64]] = None,
    content: Optional[npt.NDArray[np.uint64]] = None,
    dups: Optional[npt.NDArray[np.uint64]] = None,
) -> Picks: ...
def stratified_k(
    offsets: npt.NDArray[np.uint64],
    modes: npt.NDArray[np.int64],
    keys: npt.NDArray[np.uint64],
    k: int,
    seed: int,
    *,
    rows: Optional[npt.NDArray[np.uint64]] = None,
    content: Optional[npt.NDArray[np.uint64]] = None,
    dups: Optional[npt.NDArray[np.uint64]] = None,
) -> Picks: ...
def largest_remainder(counts: list[int], k: int) -> list[int]: ...
def keys_from_strings(offsets: npt.NDArray[np.int64], data: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint64]: ...
def keys_from_ints(ids: npt.NDArray[np.int64]) -> npt.NDArray[np.uint64]: ...
def group_ints(
    ids: npt.NDArray[np.int64],
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64], npt.NDArray[np.uint64], bool]:
    """Rows grouped by integer id, pools in order of first appearance: (first row of each pool,
    offsets, rows, whether rows is 0..n)."""
def picks_made() -> int:
    """Facility-location picks made by this process so far (it only grows)."""
def widen_f16(bits: npt.NDArray[np.uint16], out: npt.NDArray[np.float32]) -> None:
    """Float16 values (their bits) widened into the float32 array ``out`` of the same length."""
def static_embed(
    vectors: npt.NDArray[np.float32],
    ids: npt.NDArray[np.int64],
    starts: npt.NDArray[np.int64],
    center: npt.NDArray[np.float32] | None = None,
) -> npt.NDArray[np.float32]:
    """Unit-norm embeddings (flat, texts x dim) of texts given as token ids (text t: ``ids[starts[t]:starts[t+1]]``):
    each the sum of its tokens' rows of ``vectors``, normalised, then re-centred on ``center`` and normalised again."""
def keys_from_uints(ids: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """keys_from_ints of every value that fits an int64; the text key of the others."""
def content_keys(
    x: npt.NDArray[np.float32],
    *,
    rewards: Optional[npt.NDArray[np.float64]] = None,
    text: Optional[npt.NDArray[np.uint64]] = None,
) -> npt.NDArray[np.uint64]:
    """xxh3 of each embedding row, its reward and its text key: the key ties and draws are decided by."""
def near_duplicates(
    data: Union[npt.NDArray[np.float32], npt.NDArray[np.float16],
                list[npt.NDArray[np.float32]], list[npt.NDArray[np.float16]]],
    offsets: npt.NDArray[np.uint64],
    threshold: float,
    *,
    order: npt.NDArray[np.uint64],
    rows: Optional[npt.NDArray[np.uint64]] = None,
    rewards: Optional[npt.NDArray[np.float64]] = None,
    content: Optional[npt.NDArray[np.uint64]] = None,
) -> npt.NDArray[np.bool_]: ...


def kmeans_modes(
    data: Union[npt.NDArray[np.float32], npt.NDArray[np.float16],
                list[npt.NDArray[np.float32]], list[npt.NDArray[np.float16]]],
    offsets: npt.NDArray[np.uint64],
    keys: npt.NDArray[np.uint64],
    seed: int,
    *,
    rows: Optional[npt.NDArray[np.uint64]] = None,
    n_modes: Optional[int] = None,
    m_max: int = 8,
    min_silhouette: float = 0.25,
    max_iter: int = 100,
) -> Modes: ...
def variance_summary(
    count: npt.NDArray[np.uint64], mean: npt.NDArray[np.float64], m2: npt.NDArray[np.float64]
) -> dict[str, Any]:
    """Estimators (v_x, v_y_given_x, ...) from per-prompt (count, mean, M2) arrays."""

class VarianceAccumulator:
    """Per-prompt count/mean/M2 (Welford), mergeable exactly (Chan)."""

    def __init__(self) -> None: ...
    def update(self, keys: npt.NDArray[np.uint64], losses: npt.NDArray[np.float64]) -> None: ...
    def update_int_ids(self, ids: npt.NDArray[np.int64], losses: npt.NDArray[np.float64]) -> None: ...
    def merge(self, other: "VarianceAccumulator") -> None: ...
    def copy(self) -> "VarianceAccumulator": ...
    def to_bytes(self) -> bytes: ...
    @staticmethod
    def from_bytes(data: bytes) -> "VarianceAccumulator": ...
    def summary(self) -> dict[str, Any]: ...
    def per_prompt(self) -> dict[str, npt.NDArray[Any]]: ...
    def used_stats(self) -> dict[str, npt.NDArray[Any]]: ...
    def used_moments(self, gbar: float | None = None) -> tuple[int, list[float], list[list[float]]]: ...
    @property
    def n_rows(self) -> int: ...
    def __len__(self) -> int: ...
