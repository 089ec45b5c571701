//! k-means mode bindings.

use numpy::{PyArray1, PyReadonlyArray1};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::embeddings::Held;
use super::{run, slice1};
use crate::pools::Pools;

/// Modes of every pool by k-means on unit-normalised embeddings (`data`: one
/// float32 or float16 matrix, or a list of row blocks, as `fl_batch` takes;
/// float16 rows are widened as a pool is gathered).
/// `n_modes=None` chooses the number per pool by the silhouette rule.
/// Returns dict(labels (per position), n_modes, inertia, silhouette (per pool)).
#[pyfunction]
#[pyo3(signature = (data, offsets, keys, seed, *, rows=None, n_modes=None, m_max=8, min_silhouette=0.25, max_iter=100))]
#[allow(clippy::too_many_arguments)]
fn kmeans_modes<'py>(
    py: Python<'py>,
    data: &Bound<'py, PyAny>,
    offsets: PyReadonlyArray1<'py, u64>,
    keys: PyReadonlyArray1<'py, u64>,
    seed: u64,
    rows: Option<PyReadonlyArray1<'py, u64>>,
    n_modes: Option<usize>,
    m_max: usize,
    min_silhouette: f64,
    max_iter: usize,
) -> PyResult<Bound<'py, PyDict>> {
    let held = Held::of(data)?;
    let x = held.view()?;
    let off = slice1(&offsets, "offsets")?;
    let ks = slice1(&keys, "keys")?;
    let rows_s = match &rows {
        Some(r) => Some(slice1(r, "rows")?),
        None => None,
    };
    let params = crate::kmeans::KmeansParams { n_modes, m_max, min_silhouette, max_iter };
    let res = run(py, || {
        let pools = Pools::over(x, off, rows_s)?;
        crate::kmeans::modes_batch(&pools, ks, seed, &params)
    })?;
    let dct = PyDict::new(py);
    dct.set_item("labels", PyArray1::from_vec(py, res.labels))?;
    dct.set_item("n_modes", PyArray1::from_vec(py, res.n_modes))?;
    dct.set_item("inertia", PyArray1::from_vec(py, res.inertia))?;
    dct.set_item("silhouette", PyArray1::from_vec(py, res.silhouette))?;
    Ok(dct)
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(kmeans_modes, m)?)?;
    Ok(())
}
