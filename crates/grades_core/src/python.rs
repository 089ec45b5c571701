//! PyO3 bindings (cargo feature `python`). The only file that knows Python.
//!
//! Every entry point validates its arrays, releases the GIL for the work, and
//! turns core errors into `ValueError` and any internal panic into
//! `RuntimeError`, so nothing unwinds into the interpreter.

use std::panic::{catch_unwind, AssertUnwindSafe};

use numpy::{PyArray1, PyReadonlyArray1, PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::error::Error;
use crate::facility::{self, FlResult, Optimizer, Params};
use crate::kernel::{self, Kernel};
use crate::pools::{Layout, Pools};
use crate::sampling::{self, Picks};

fn to_py(e: Error) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// Run `f` without the GIL; map errors and panics to Python exceptions.
fn run<T: Send, F: FnOnce() -> crate::Result<T> + Send>(py: Python<'_>, f: F) -> PyResult<T> {
    py.detach(|| match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(to_py(e)),
        Err(p) => {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown".into());
            Err(PyRuntimeError::new_err(format!("internal error in mrt_fast core: {msg}")))
        }
    })
}

fn slice1<'a, T: numpy::Element>(a: &'a PyReadonlyArray1<'_, T>, name: &str) -> PyResult<&'a [T]> {
    a.as_slice().map_err(|_| PyValueError::new_err(format!("{name} must be a contiguous 1-d array")))
}

fn slice2<'a, T: numpy::Element>(a: &'a PyReadonlyArray2<'_, T>, name: &str) -> PyResult<(&'a [T], usize, usize)> {
    let sh = a.shape();
    let (r, c) = (sh[0], sh[1]);
    let s = a.as_slice().map_err(|_| PyValueError::new_err(format!("{name} must be a C-contiguous 2-d array")))?;
    Ok((s, r, c))
}

fn params(k: usize, alpha: f64, eps: f64, k_max: Option<usize>, optimizer: &str) -> PyResult<Params> {
    let p = Params { k, alpha, eps, k_max, optimizer: Optimizer::parse(optimizer).map_err(to_py)? };
    p.validate().map_err(to_py)?;
    Ok(p)
}

fn single_result<'py>(py: Python<'py>, r: FlResult) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    let idx: Vec<u64> = r.indices.iter().map(|&i| i as u64).collect();
    d.set_item("indices", PyArray1::from_vec(py, idx))?;
    d.set_item("gains", PyArray1::from_vec(py, r.gains))?;
    d.set_item("objective", r.objective)?;
    d.set_item("upper_bound", r.upper_bound)?;
    Ok(d)
}

/// Facility location over a ragged batch of pools.
/// Returns dict(indices, offsets, gains, objective, upper_bound): pool p's picks
/// are indices[offsets[p]:offsets[p+1]] (positions within the pool).
#[pyfunction]
#[pyo3(signature = (data, offsets, k, *, rows=None, rewards=None, alpha=0.0, eps=1e-6, k_max=None, kernel="shift", optimizer="lazy"))]
#[allow(clippy::too_many_arguments)]
fn fl_batch<'py>(
    py: Python<'py>,
    data: PyReadonlyArray2<'py, f32>,
    offsets: PyReadonlyArray1<'py, u64>,
    k: usize,
    rows: Option<PyReadonlyArray1<'py, u64>>,
    rewards: Option<PyReadonlyArray1<'py, f64>>,
    alpha: f64,
    eps: f64,
    k_max: Option<usize>,
    kernel: &str,
    optimizer: &str,
) -> PyResult<Bound<'py, PyDict>> {
    let (x, _, d) = slice2(&data, "embeddings")?;
    let off = slice1(&offsets, "offsets")?;
    let rows_s = match &rows {
        Some(r) => Some(slice1(r, "rows")?),
        None => None,
    };
    let rew = match &rewards {
        Some(r) => Some(slice1(r, "rewards")?),
        None => None,
    };
    let p = params(k, alpha, eps, k_max, optimizer)?;
    let kern = Kernel::parse(kernel).map_err(to_py)?;
    let res = run(py, || {
        let pools = Pools::new(x, d, off, rows_s)?;
        facility::facility_location_batch(&pools, rew, &p, kern)
    })?;
    let mut out_off = Vec::with_capacity(res.len() + 1);
    out_off.push(0u64);
    let mut idx = Vec::new();
    let mut gains = Vec::new();
    let mut obj = Vec::with_capacity(res.len());
    let mut ub = Vec::with_capacity(res.len());
    for r in res {
        idx.extend(r.indices.iter().map(|&i| i as u64));
        gains.extend_from_slice(&r.gains);
        out_off.push(idx.len() as u64);
        obj.push(r.objective);
        ub.push(r.upper_bound);
    }
    let dct = PyDict::new(py);
    dct.set_item("indices", PyArray1::from_vec(py, idx))?;
    dct.set_item("offsets", PyArray1::from_vec(py, out_off))?;
    dct.set_item("gains", PyArray1::from_vec(py, gains))?;
    dct.set_item("objective", PyArray1::from_vec(py, obj))?;
    dct.set_item("upper_bound", PyArray1::from_vec(py, ub))?;
    Ok(dct)
}

/// Facility location on one pool with a precomputed dense similarity in [0, 1].
#[pyfunction]
#[pyo3(signature = (sim, k, *, rewards=None, alpha=0.0, eps=1e-6, k_max=None, optimizer="lazy"))]
#[allow(clippy::too_many_arguments)]
fn fl_dense<'py>(
    py: Python<'py>,
    sim: PyReadonlyArray2<'py, f32>,
    k: usize,
    rewards: Option<PyReadonlyArray1<'py, f64>>,
    alpha: f64,
    eps: f64,
    k_max: Option<usize>,
    optimizer: &str,
) -> PyResult<Bound<'py, PyDict>> {
    let (s, r, c) = slice2(&sim, "similarity")?;
    if r != c {
        return Err(PyValueError::new_err(format!("similarity must be square, got {r} x {c}")));
    }
    let rew = match &rewards {
        Some(x) => Some(slice1(x, "rewards")?),
        None => None,
    };
    let p = params(k, alpha, eps, k_max, optimizer)?;
    let res = run(py, || facility::facility_location_dense(s, r, rew, &p))?;
    single_result(py, res)
}

/// An int32 or int64 index array, borrowed without a copy.
enum IdxArr<'py> {
    I32(PyReadonlyArray1<'py, i32>),
    I64(PyReadonlyArray1<'py, i64>),
}

fn idx_arr<'py>(a: &Bound<'py, PyAny>, name: &str) -> PyResult<IdxArr<'py>> {
    if let Ok(v) = a.extract::<PyReadonlyArray1<'py, i32>>() {
        return Ok(IdxArr::I32(v));
    }
    if let Ok(v) = a.extract::<PyReadonlyArray1<'py, i64>>() {
        return Ok(IdxArr::I64(v));
    }
    Err(PyValueError::new_err(format!("{name} must be a 1-d int32 or int64 array")))
}

#[allow(clippy::too_many_arguments)]
fn sparse_run<P: kernel::Idx, I: kernel::Idx>(
    py: Python<'_>,
    n: usize,
    ip: &[P],
    ix: &[I],
    dv: &[f32],
    symmetric: bool,
    rew: Option<&[f64]>,
    p: &Params,
) -> PyResult<FlResult> {
    run(py, || {
        let g = kernel::CsrRef::new(n, ip, ix, dv)?;
        facility::facility_location_sparse(&g, symmetric, rew, p)
    })
}

/// Facility location on one pool with a sparse CSR similarity graph in [0, 1]
/// (int32 or int64 indices, used in place). `symmetric=True` promises S = S^T
/// and skips the transpose.
#[pyfunction]
#[pyo3(signature = (n, indptr, indices, data, k, *, rewards=None, alpha=0.0, eps=1e-6, k_max=None, optimizer="lazy", symmetric=false))]
#[allow(clippy::too_many_arguments)]
fn fl_sparse<'py>(
    py: Python<'py>,
    n: usize,
    indptr: &Bound<'py, PyAny>,
    indices: &Bound<'py, PyAny>,
    data: PyReadonlyArray1<'py, f32>,
    k: usize,
    rewards: Option<PyReadonlyArray1<'py, f64>>,
    alpha: f64,
    eps: f64,
    k_max: Option<usize>,
    optimizer: &str,
    symmetric: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let (ipa, ixa) = (idx_arr(indptr, "indptr")?, idx_arr(indices, "indices")?);
    let dv = slice1(&data, "data")?;
    let rew = match &rewards {
        Some(x) => Some(slice1(x, "rewards")?),
        None => None,
    };
    let p = params(k, alpha, eps, k_max, optimizer)?;
    let res = match (&ipa, &ixa) {
        (IdxArr::I32(a), IdxArr::I32(b)) => {
            sparse_run(py, n, slice1(a, "indptr")?, slice1(b, "indices")?, dv, symmetric, rew, &p)
        }
        (IdxArr::I32(a), IdxArr::I64(b)) => {
            sparse_run(py, n, slice1(a, "indptr")?, slice1(b, "indices")?, dv, symmetric, rew, &p)
        }
        (IdxArr::I64(a), IdxArr::I32(b)) => {
            sparse_run(py, n, slice1(a, "indptr")?, slice1(b, "indices")?, dv, symmetric, rew, &p)
        }
        (IdxArr::I64(a), IdxArr::I64(b)) => {
            sparse_run(py, n, slice1(a, "indptr")?, slice1(b, "indices")?, dv, symmetric, rew, &p)
        }
    }?;
    single_result(py, res)
}

/// Facility location on one large pool; similarity columns recomputed on
/// demand, memory O(n d).
#[pyfunction]
#[pyo3(signature = (x, k, *, rewards=None, alpha=0.0, eps=1e-6, k_max=None, kernel="shift", optimizer="lazy"))]
#[allow(clippy::too_many_arguments)]
fn fl_on_demand<'py>(
    py: Python<'py>,
    x: PyReadonlyArray2<'py, f32>,
    k: usize,
    rewards: Option<PyReadonlyArray1<'py, f64>>,
    alpha: f64,
    eps: f64,
    k_max: Option<usize>,
    kernel: &str,
    optimizer: &str,
) -> PyResult<Bound<'py, PyDict>> {
    let (xs, n, d) = slice2(&x, "embeddings")?;
    let rew = match &rewards {
        Some(v) => Some(slice1(v, "rewards")?),
        None => None,
    };
    let p = params(k, alpha, eps, k_max, optimizer)?;
    let kern = Kernel::parse(kernel).map_err(to_py)?;
    let res = run(py, || facility::facility_location_on_demand(xs, n, d, rew, &p, kern))?;
    single_result(py, res)
}

/// Cosine similarity of the rows of `x`, mapped into [0, 1] by `kernel`: the
/// same Gram path (`cosine_gram`) that selection runs on each pool.
#[pyfunction]
#[pyo3(signature = (x, kernel="shift"))]
fn similarity<'py>(
    py: Python<'py>,
    x: PyReadonlyArray2<'py, f32>,
    kernel: &str,
) -> PyResult<Bound<'py, PyArray1<f32>>> {
    let (xs, n, d) = slice2(&x, "embeddings")?;
    let kern = Kernel::parse(kernel).map_err(to_py)?;
    let out = run(py, || {
        let (mut s, mut inv) = (Vec::new(), Vec::new());
        kernel::cosine_gram(xs, n, d, kern, &mut s, &mut inv, &|i| (0, format!("row {i}")), &[])?;
        Ok(s)
    })?;
    Ok(PyArray1::from_vec(py, out))
}

fn layout_args<'a>(offsets: &'a [u64], rows: Option<&'a [u64]>, n_rows: usize) -> crate::Result<Layout<'a>> {
    Layout::new(offsets, rows, n_rows)
}

fn picks_dict<'py>(py: Python<'py>, p: Picks) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("indices", PyArray1::from_vec(py, p.indices))?;
    d.set_item("offsets", PyArray1::from_vec(py, p.offsets))?;
    d.set_item("weights", PyArray1::from_vec(py, p.weights))?;
    d.set_item("modes_missed", PyArray1::from_vec(py, p.modes_missed))?;
    Ok(d)
}

/// Random-K per pool, seeded per pool from (seed, key).
#[pyfunction]
#[pyo3(signature = (offsets, keys, k, seed, *, rows=None, n_rows=None))]
fn random_k<'py>(
    py: Python<'py>,
    offsets: PyReadonlyArray1<'py, u64>,
    keys: PyReadonlyArray1<'py, u64>,
    k: usize,
    seed: u64,
    rows: Option<PyReadonlyArray1<'py, u64>>,
    n_rows: Option<usize>,
) -> PyResult<Bound<'py, PyDict>> {
    let off = slice1(&offsets, "offsets")?;
    let ks = slice1(&keys, "keys")?;
    let rows_s = match &rows {
        Some(r) => Some(slice1(r, "rows")?),
        None => None,
    };
    let nr = n_rows.unwrap_or_else(|| off.last().copied().unwrap_or(0) as usize);
    let p = run(py, || sampling::random_k(&layout_args(off, rows_s, nr)?, ks, k, seed))?;
    picks_dict(py, p)
}

/// Top-K rewards per pool, ties to the lower index.
#[pyfunction]
#[pyo3(signature = (offsets, rewards, k, *, rows=None))]
fn top_k<'py>(
    py: Python<'py>,
    offsets: PyReadonlyArray1<'py, u64>,
    rewards: PyReadonlyArray1<'py, f64>,
    k: usize,
    rows: Option<PyReadonlyArray1<'py, u64>>,
) -> PyResult<Bound<'py, PyDict>> {
    let off = slice1(&offsets, "offsets")?;
    let r = slice1(&rewards, "rewards")?;
    let rows_s = match &rows {
        Some(x) => Some(slice1(x, "rows")?),
        None => None,
    };
    let p = run(py, || sampling::top_k(&layout_args(off, rows_s, r.len())?, r, k))?;
    picks_dict(py, p)
}

/// Mode-stratified K per pool (largest remainder allocation, uniform draws).
#[pyfunction]
#[pyo3(signature = (offsets, modes, keys, k, seed, *, rows=None))]
fn stratified_k<'py>(
    py: Python<'py>,
    offsets: PyReadonlyArray1<'py, u64>,
    modes: PyReadonlyArray1<'py, i64>,
    keys: PyReadonlyArray1<'py, u64>,
    k: usize,
    seed: u64,
    rows: Option<PyReadonlyArray1<'py, u64>>,
) -> PyResult<Bound<'py, PyDict>> {
    let off = slice1(&offsets, "offsets")?;
    let m = slice1(&modes, "modes")?;
    let ks = slice1(&keys, "keys")?;
    let rows_s = match &rows {
        Some(x) => Some(slice1(x, "rows")?),
        None => None,
    };
    let p = run(py, || sampling::stratified_k(&layout_args(off, rows_s, m.len())?, m, ks, k, seed))?;
    picks_dict(py, p)
}

/// Largest-remainder allocation of k over strata sizes.
#[pyfunction]
fn largest_remainder(counts: Vec<usize>, k: usize) -> Vec<usize> {
    sampling::largest_remainder(&counts, k)
}

/// Stable 64-bit keys of string prompt ids given as Arrow-style
/// (offsets, utf-8 bytes) buffers.
#[pyfunction]
fn keys_from_strings<'py>(
    py: Python<'py>,
    offsets: PyReadonlyArray1<'py, i64>,
    data: PyReadonlyArray1<'py, u8>,
) -> PyResult<Bound<'py, PyArray1<u64>>> {
    let off = slice1(&offsets, "offsets")?;
    let b = slice1(&data, "data")?;
    let keys = run(py, || sampling::keys_of_strings(off, b))?;
    Ok(PyArray1::from_vec(py, keys))
}

/// Stable 64-bit keys of integer prompt ids.
#[pyfunction]
fn keys_from_ints<'py>(py: Python<'py>, ids: PyReadonlyArray1<'py, i64>) -> PyResult<Bound<'py, PyArray1<u64>>> {
    let v = slice1(&ids, "ids")?;
    let keys = py.detach(|| sampling::keys_of_ints(v));
    Ok(PyArray1::from_vec(py, keys))
}

/// Number of threads the core's pool uses.
#[pyfunction]
fn num_threads() -> usize {
    rayon::current_num_threads()
}

// ---- k-means modes bindings ----

/// Modes of every pool by k-means on unit-normalised embeddings.
/// `n_modes=None` chooses the number per pool by the silhouette rule.
/// Returns dict(labels (per position), n_modes, inertia, silhouette (per pool)).
#[pyfunction]
#[pyo3(signature = (data, offsets, keys, seed, *, rows=None, n_modes=None, m_max=8, min_silhouette=0.25, max_iter=100))]
#[allow(clippy::too_many_arguments)]
fn kmeans_modes<'py>(
    py: Python<'py>,
    data: PyReadonlyArray2<'py, f32>,
    offsets: PyReadonlyArray1<'py, u64>,
    keys: PyReadonlyArray1<'py, u64>,
    seed: u64,
    rows: Option<PyReadonlyArray1<'py, u64>>,
    n_modes: Option<usize>,
    m_max: usize,
    min_silhouette: f64,
    max_iter: usize,
) -> PyResult<Bound<'py, PyDict>> {
    let (x, _, d) = slice2(&data, "embeddings")?;
    let off = slice1(&offsets, "offsets")?;
    let ks = slice1(&keys, "keys")?;
    let rows_s = match &rows {
        Some(r) => Some(slice1(r, "rows")?),
        None => None,
    };
    let params = crate::kmeans::KmeansParams { n_modes, m_max, min_silhouette, max_iter };
    let res = run(py, || {
        let pools = Pools::new(x, d, off, rows_s)?;
        crate::kmeans::modes_batch(&pools, ks, seed, &params)
    })?;
    let dct = PyDict::new(py);
    dct.set_item("labels", PyArray1::from_vec(py, res.labels))?;
    dct.set_item("n_modes", PyArray1::from_vec(py, res.n_modes))?;
    dct.set_item("inertia", PyArray1::from_vec(py, res.inertia))?;
    dct.set_item("silhouette", PyArray1::from_vec(py, res.silhouette))?;
    Ok(dct)
}

// ---- end k-means modes bindings ----

// ---- variance bindings (streaming accumulators) ----

use pyo3::types::PyBytes;

use crate::variance::{Accumulator as VarAcc, Summary as VarSummary};

fn var_summary_dict<'py>(py: Python<'py>, s: &VarSummary) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("n_rows", s.n_rows)?;
    d.set_item("n_prompts", s.n_prompts)?;
    d.set_item("n_single_response_prompts", s.n_single_response_prompts)?;
    d.set_item("n_used_prompts", s.n_used_prompts)?;
    d.set_item("n_used_rows", s.n_used_rows)?;
    d.set_item("v_y_given_x", s.v_y_given_x)?;
    d.set_item("var_of_means", s.var_of_means)?;
    d.set_item("within_leak", s.within_leak)?;
    d.set_item("v_x_raw", s.v_x_raw)?;
    d.set_item("v_x", s.v_x)?;
    d.set_item("grand_mean", s.grand_mean)?;
    d.set_item("mean_k", s.mean_k)?;
    Ok(d)
}

/// Per-prompt statistics as dict(count, mean, m2) of NumPy arrays (the
/// columns moved, not copied).
fn stats_dict<'py>(py: Python<'py>, c: crate::variance::StatsColumns) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("count", PyArray1::from_vec(py, c.count))?;
    d.set_item("mean", PyArray1::from_vec(py, c.mean))?;
    d.set_item("m2", PyArray1::from_vec(py, c.m2))?;
    Ok(d)
}

/// Streaming, mergeable per-prompt loss statistics (count, mean, M2).
#[pyclass(name = "VarianceAccumulator", module = "mrt_fast._grades_core")]
#[derive(Default)]
struct PyVarianceAccumulator {
    inner: VarAcc,
}

#[pymethods]
impl PyVarianceAccumulator {
    #[new]
    #[pyo3(signature = (expected_prompts=0))]
    fn new(py: Python<'_>, expected_prompts: usize) -> PyResult<Self> {
        let inner = run(py, || VarAcc::with_capacity(expected_prompts))?;
        Ok(Self { inner })
    }

    /// Make room for about `prompts` more distinct prompts (a sizing hint).
    fn reserve(&mut self, py: Python<'_>, prompts: usize) -> PyResult<()> {
        let acc = &mut self.inner;
        run(py, || acc.reserve(prompts))
    }

    /// Add rows (keys[i], losses[i]); all-or-nothing on a non-finite loss.
    fn update(
        &mut self,
        py: Python<'_>,
        keys: PyReadonlyArray1<'_, u64>,
        losses: PyReadonlyArray1<'_, f64>,
    ) -> PyResult<()> {
        let k = slice1(&keys, "keys")?;
        let x = slice1(&losses, "losses")?;
        let acc = &mut self.inner;
        run(py, || acc.update(k, x))
    }

    /// Add rows with integer prompt ids (keyed as `keys_from_ints` keys
    /// them, once per run of equal ids, inside the scan).
    fn update_int_ids(
        &mut self,
        py: Python<'_>,
        ids: PyReadonlyArray1<'_, i64>,
        losses: PyReadonlyArray1<'_, f64>,
    ) -> PyResult<()> {
        let k = slice1(&ids, "ids")?;
        let x = slice1(&losses, "losses")?;
        let acc = &mut self.inner;
        run(py, || acc.update_int_ids(k, x))
    }

    /// Fold `other` into this accumulator.
    fn merge(&mut self, py: Python<'_>, other: PyRef<'_, PyVarianceAccumulator>) -> PyResult<()> {
        let o = &other.inner;
        let acc = &mut self.inner;
        run(py, || {
            acc.merge(o);
            Ok(())
        })
    }

    fn copy(&self) -> Self {
        Self { inner: self.inner.clone() }
    }

    fn to_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.inner.to_bytes())
    }

    #[staticmethod]
    fn from_bytes(py: Python<'_>, data: &[u8]) -> PyResult<Self> {
        let inner = run(py, || VarAcc::from_bytes(data))?;
        Ok(Self { inner })
    }

    fn __len__(&self, py: Python<'_>) -> usize {
        // (a log whose prompts have several runs counts them by its hash order)
        let acc = &self.inner;
        py.detach(|| acc.len())
    }

    #[getter]
    fn n_rows(&self) -> u64 {
        self.inner.n_rows()
    }

    /// False while the prompts are kept as a log in row order (grouped
    /// rows), with no hash index.
    #[getter]
    fn is_indexed(&self) -> bool {
        self.inner.is_indexed()
    }

    /// Build the hash index of a log now (a no-op once indexed).
    fn build_index(&mut self, py: Python<'_>) {
        let acc = &mut self.inner;
        py.detach(|| acc.build_index());
    }

    /// Per-prompt arrays sorted by key: dict(key, count, mean, m2).
    fn per_prompt<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let acc = &self.inner;
        let (keys, cols) = py.detach(|| {
            let (keys, stats) = acc.per_prompt();
            (keys, crate::variance::StatsColumns::of(&stats))
        });
        let d = stats_dict(py, cols)?;
        d.set_item("key", PyArray1::from_vec(py, keys))?;
        Ok(d)
    }

    /// Statistics of the prompts with two or more responses, in key-hash
    /// order: dict(count, mean, m2).
    fn used_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let acc = &self.inner;
        let c = py.detach(|| acc.used_stats());
        stats_dict(py, c)
    }

    /// Mean (4) and ddof=1 covariance (4 x 4, as nested lists) over the
    /// prompts used of (s2, s2/K, g - gbar, (g - gbar)^2), and their count;
    /// `gbar` is the summary's grand mean unless given.
    #[allow(clippy::type_complexity)]
    #[pyo3(signature = (gbar=None))]
    fn used_moments(&self, py: Python<'_>, gbar: Option<f64>) -> PyResult<(u64, Vec<f64>, Vec<Vec<f64>>)> {
        let acc = &self.inner;
        let m = run(py, || match gbar {
            Some(g) => acc.used_moments_about(g),
            None => acc.used_moments(),
        })?;
        Ok((m.n, m.mean.to_vec(), m.cov.iter().map(|r| r.to_vec()).collect()))
    }

    /// The decomposition's estimators as a dict (see the Rust docs).
    fn summary<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let acc = &self.inner;
        let s = run(py, || acc.summary())?;
        var_summary_dict(py, &s)
    }
}

/// Estimators from per-prompt arrays (count, mean, m2), in the given order.
#[pyfunction]
fn variance_summary<'py>(
    py: Python<'py>,
    count: PyReadonlyArray1<'py, u64>,
    mean: PyReadonlyArray1<'py, f64>,
    m2: PyReadonlyArray1<'py, f64>,
) -> PyResult<Bound<'py, PyDict>> {
    let (c, mu, q) = (slice1(&count, "count")?, slice1(&mean, "mean")?, slice1(&m2, "m2")?);
    if c.len() != mu.len() || c.len() != q.len() {
        return Err(PyValueError::new_err("count, mean and m2 must have the same length"));
    }
    let s = run(py, || {
        let stats: Vec<crate::variance::Stats> =
            c.iter().zip(mu).zip(q).map(|((&count, &mean), &m2)| crate::variance::Stats { count, mean, m2 }).collect();
        let rows = c.iter().sum();
        crate::variance::summarize(&stats, rows)
    })?;
    var_summary_dict(py, &s)
}

#[pymodule]
fn _grades_core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(fl_batch, m)?)?;
    m.add_function(wrap_pyfunction!(fl_dense, m)?)?;
    m.add_function(wrap_pyfunction!(fl_sparse, m)?)?;
    m.add_function(wrap_pyfunction!(fl_on_demand, m)?)?;
    m.add_function(wrap_pyfunction!(similarity, m)?)?;
    m.add_function(wrap_pyfunction!(random_k, m)?)?;
    m.add_function(wrap_pyfunction!(top_k, m)?)?;
    m.add_function(wrap_pyfunction!(stratified_k, m)?)?;
    m.add_function(wrap_pyfunction!(largest_remainder, m)?)?;
    m.add_function(wrap_pyfunction!(keys_from_strings, m)?)?;
    m.add_function(wrap_pyfunction!(keys_from_ints, m)?)?;
    m.add_function(wrap_pyfunction!(num_threads, m)?)?;
    // === variance bindings (streaming accumulators) register below ===
    m.add_function(wrap_pyfunction!(kmeans_modes, m)?)?;
    m.add_class::<PyVarianceAccumulator>()?;
    m.add_function(wrap_pyfunction!(variance_summary, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
