//! Facility-location bindings: a ragged batch of pools, or one pool given by
//! a dense, a sparse (CSR) or an on-demand similarity. Every entry point takes
//! the shared parameters as one [`PyFlParams`].

use numpy::{PyArray1, PyReadonlyArray1, PyReadonlyArray2};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::embeddings::Held;
use super::{input_error, run, slice1, slice2, to_py};
use crate::facility::{self, FlResult, Optimizer, Params};
use crate::kernel::{self, Kernel};
use crate::pools::Pools;

/// The parameters every facility-location entry point shares (k, alpha, eps,
/// k_max, optimizer), checked once when made.
#[pyclass(name = "FlParams", module = "mrt_fast._grades_core", frozen)]
struct PyFlParams {
    inner: Params,
}

#[pymethods]
impl PyFlParams {
    #[new]
    #[pyo3(signature = (k, *, alpha, eps, k_max=None, optimizer="lazy"))]
    fn new(k: usize, alpha: f64, eps: f64, k_max: Option<usize>, optimizer: &str) -> PyResult<Self> {
        let inner = Params { k, alpha, eps, k_max, optimizer: Optimizer::parse(optimizer).map_err(to_py)? };
        inner.validate().map_err(to_py)?;
        Ok(Self { inner })
    }
}

fn single_result<'py>(py: Python<'py>, r: FlResult) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    let idx: Vec<u64> = r.indices.iter().map(|&i| i as u64).collect();
    d.set_item("indices", PyArray1::from_vec(py, idx))?;
    d.set_item("gains", PyArray1::from_vec(py, r.gains))?;
    d.set_item("objective", r.objective)?;
    d.set_item("upper_bound", r.upper_bound)?;
    d.set_item("ties", r.ties)?;
    d.set_item("zero_gain", r.zero_gain)?;
    d.set_item("dup_skipped", r.dup_skipped)?;
    Ok(d)
}

fn opt1<'a, T: numpy::Element>(a: &'a Option<PyReadonlyArray1<'_, T>>, name: &str) -> PyResult<Option<&'a [T]>> {
    a.as_ref().map(|x| slice1(x, name)).transpose()
}

/// Facility location over a ragged batch of pools. A pool whose n x n
/// similarity would take more than `dense_limit` bytes (default
/// `DENSE_LIMIT_BYTES`, 2 GiB) runs with columns recomputed on demand.
/// Returns dict(indices, offsets, gains, objective, upper_bound): pool p's picks
/// are indices[offsets[p]:offsets[p+1]] (positions within the pool).
#[pyfunction]
#[pyo3(signature = (data, offsets, params, *, rows=None, rewards=None, kernel, dense_limit=None, text=None, ordered=false))]
#[allow(clippy::too_many_arguments)]
fn fl_batch<'py>(
    py: Python<'py>,
    data: &Bound<'py, PyAny>,
    offsets: PyReadonlyArray1<'py, u64>,
    params: PyRef<'py, PyFlParams>,
    rows: Option<PyReadonlyArray1<'py, u64>>,
    rewards: Option<PyReadonlyArray1<'py, f64>>,
    kernel: &str,
    dense_limit: Option<usize>,
    text: Option<PyReadonlyArray1<'py, u64>>,
    ordered: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let held = Held::of(data)?;
    let x = held.view()?;
    let text_s = opt1(&text, "text")?;
    let off = slice1(&offsets, "offsets")?;
    let rows_s = opt1(&rows, "rows")?;
    let rew = opt1(&rewards, "rewards")?;
    let p = params.inner;
    let kern = Kernel::parse(kernel).map_err(to_py)?;
    let limit = dense_limit.unwrap_or(facility::DENSE_LIMIT_BYTES);
    let res = run(py, || {
        let pools = Pools::over(x, off, rows_s)?;
        facility::facility_location_batch_keyed(&pools, rew, text_s, ordered, &p, kern, limit)
    })?;
    let mut out_off = Vec::with_capacity(res.len() + 1);
    out_off.push(0u64);
    let mut idx = Vec::new();
    let mut gains = Vec::new();
    let mut obj = Vec::with_capacity(res.len());
    let mut ub = Vec::with_capacity(res.len());
    let mut counts = [Vec::with_capacity(res.len()), Vec::with_capacity(res.len()), Vec::with_capacity(res.len())];
    for r in res {
        counts[0].push(r.ties as u64);
        counts[1].push(r.zero_gain as u64);
        counts[2].push(r.dup_skipped as u64);
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
    let [ties, zero, dups] = counts;
    dct.set_item("ties", PyArray1::from_vec(py, ties))?;
    dct.set_item("zero_gain", PyArray1::from_vec(py, zero))?;
    dct.set_item("dup_skipped", PyArray1::from_vec(py, dups))?;
    Ok(dct)
}

/// Facility location on one pool with a precomputed dense similarity in [0, 1].
#[pyfunction]
#[pyo3(signature = (sim, params, *, rewards=None))]
fn fl_dense<'py>(
    py: Python<'py>,
    sim: PyReadonlyArray2<'py, f32>,
    params: PyRef<'py, PyFlParams>,
    rewards: Option<PyReadonlyArray1<'py, f64>>,
) -> PyResult<Bound<'py, PyDict>> {
    let (s, r, c) = slice2(&sim, "similarity")?;
    if r != c {
        return Err(input_error(&format!("similarity must be square, got {r} x {c}"), None, None, None));
    }
    let rew = opt1(&rewards, "rewards")?;
    let p = params.inner;
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
    Err(input_error(&format!("{name} must be a 1-d int32 or int64 array"), None, None, None))
}

fn sparse_run<P: kernel::Idx, I: kernel::Idx>(
    py: Python<'_>,
    (n, ip, ix, dv): (usize, &[P], &[I], &[f32]),
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
#[pyo3(signature = (n, indptr, indices, data, params, *, rewards=None, symmetric=false))]
#[allow(clippy::too_many_arguments)]
fn fl_sparse<'py>(
    py: Python<'py>,
    n: usize,
    indptr: &Bound<'py, PyAny>,
    indices: &Bound<'py, PyAny>,
    data: PyReadonlyArray1<'py, f32>,
    params: PyRef<'py, PyFlParams>,
    rewards: Option<PyReadonlyArray1<'py, f64>>,
    symmetric: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let (ipa, ixa) = (idx_arr(indptr, "indptr")?, idx_arr(indices, "indices")?);
    let dv = slice1(&data, "data")?;
    let rew = opt1(&rewards, "rewards")?;
    let p = params.inner;
    let res = match (&ipa, &ixa) {
        (IdxArr::I32(a), IdxArr::I32(b)) => {
            sparse_run(py, (n, slice1(a, "indptr")?, slice1(b, "indices")?, dv), symmetric, rew, &p)
        }
        (IdxArr::I32(a), IdxArr::I64(b)) => {
            sparse_run(py, (n, slice1(a, "indptr")?, slice1(b, "indices")?, dv), symmetric, rew, &p)
        }
        (IdxArr::I64(a), IdxArr::I32(b)) => {
            sparse_run(py, (n, slice1(a, "indptr")?, slice1(b, "indices")?, dv), symmetric, rew, &p)
        }
        (IdxArr::I64(a), IdxArr::I64(b)) => {
            sparse_run(py, (n, slice1(a, "indptr")?, slice1(b, "indices")?, dv), symmetric, rew, &p)
        }
    }?;
    single_result(py, res)
}

/// Facility location on one large pool; similarity columns recomputed on
/// demand, memory O(n d).
#[pyfunction]
#[pyo3(signature = (x, params, *, rewards=None, kernel))]
fn fl_on_demand<'py>(
    py: Python<'py>,
    x: PyReadonlyArray2<'py, f32>,
    params: PyRef<'py, PyFlParams>,
    rewards: Option<PyReadonlyArray1<'py, f64>>,
    kernel: &str,
) -> PyResult<Bound<'py, PyDict>> {
    let (xs, n, d) = slice2(&x, "embeddings")?;
    let rew = opt1(&rewards, "rewards")?;
    let p = params.inner;
    let kern = Kernel::parse(kernel).map_err(to_py)?;
    let res = run(py, || facility::facility_location_on_demand(xs, n, d, rew, &p, kern))?;
    single_result(py, res)
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // the one definition of the dense size limit; Python reads it from here
    m.add("DENSE_LIMIT_BYTES", facility::DENSE_LIMIT_BYTES)?;
    m.add_class::<PyFlParams>()?;
    m.add_function(wrap_pyfunction!(fl_batch, m)?)?;
    m.add_function(wrap_pyfunction!(fl_dense, m)?)?;
    m.add_function(wrap_pyfunction!(fl_sparse, m)?)?;
    m.add_function(wrap_pyfunction!(fl_on_demand, m)?)?;
    Ok(())
}
