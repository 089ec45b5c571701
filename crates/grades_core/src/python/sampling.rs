//! Content-blind and reward-only selector bindings: random-K, top-K and
//! mode-stratified K.

use numpy::{PyArray1, PyReadonlyArray1};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::{run, slice1};
use crate::pools::Layout;
use crate::sampling::{self, Picks};

fn layout_args<'a>(offsets: &'a [u64], rows: Option<&'a [u64]>, n_rows: usize) -> crate::Result<Layout<'a>> {
    Layout::new(offsets, rows, n_rows)
}

fn opt<'a>(a: &'a Option<PyReadonlyArray1<'_, u64>>, name: &str) -> PyResult<Option<&'a [u64]>> {
    a.as_ref().map(|x| slice1(x, name)).transpose()
}

fn picks_dict<'py>(py: Python<'py>, p: Picks) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("indices", PyArray1::from_vec(py, p.indices))?;
    d.set_item("offsets", PyArray1::from_vec(py, p.offsets))?;
    d.set_item("weights", PyArray1::from_vec(py, p.weights))?;
    d.set_item("modes_missed", PyArray1::from_vec(py, p.modes_missed))?;
    d.set_item("dup_skipped", PyArray1::from_vec(py, p.dup_skipped))?;
    Ok(d)
}

/// Random-K per pool, seeded per pool from (seed, key).
#[pyfunction]
#[pyo3(signature = (offsets, keys, k, seed, *, rows=None, n_rows=None, content=None, dups=None))]
#[allow(clippy::too_many_arguments)]
fn random_k<'py>(
    py: Python<'py>,
    offsets: PyReadonlyArray1<'py, u64>,
    keys: PyReadonlyArray1<'py, u64>,
    k: usize,
    seed: u64,
    rows: Option<PyReadonlyArray1<'py, u64>>,
    n_rows: Option<usize>,
    content: Option<PyReadonlyArray1<'py, u64>>,
    dups: Option<PyReadonlyArray1<'py, u64>>,
) -> PyResult<Bound<'py, PyDict>> {
    let content_s = opt(&content, "content")?;
    let dups_s = opt(&dups, "dups")?;
    let off = slice1(&offsets, "offsets")?;
    let ks = slice1(&keys, "keys")?;
    let rows_s = match &rows {
        Some(r) => Some(slice1(r, "rows")?),
        None => None,
    };
    let nr = n_rows.unwrap_or_else(|| off.last().copied().unwrap_or(0) as usize);
    let p = run(py, || sampling::random_k(&layout_args(off, rows_s, nr)?, ks, k, seed, content_s, dups_s))?;
    picks_dict(py, p)
}

/// Top-K rewards per pool, ties to the lower index.
#[pyfunction]
#[pyo3(signature = (offsets, rewards, k, *, rows=None, content=None, dups=None))]
#[allow(clippy::too_many_arguments)]
fn top_k<'py>(
    py: Python<'py>,
    offsets: PyReadonlyArray1<'py, u64>,
    rewards: PyReadonlyArray1<'py, f64>,
    k: usize,
    rows: Option<PyReadonlyArray1<'py, u64>>,
    content: Option<PyReadonlyArray1<'py, u64>>,
    dups: Option<PyReadonlyArray1<'py, u64>>,
) -> PyResult<Bound<'py, PyDict>> {
    let content_s = opt(&content, "content")?;
    let dups_s = opt(&dups, "dups")?;
    let off = slice1(&offsets, "offsets")?;
    let r = slice1(&rewards, "rewards")?;
    let rows_s = match &rows {
        Some(x) => Some(slice1(x, "rows")?),
        None => None,
    };
    let p = run(py, || sampling::top_k(&layout_args(off, rows_s, r.len())?, r, k, content_s, dups_s))?;
    picks_dict(py, p)
}

/// Mode-stratified K per pool (largest remainder allocation, uniform draws).
#[pyfunction]
#[pyo3(signature = (offsets, modes, keys, k, seed, *, rows=None, content=None, dups=None))]
#[allow(clippy::too_many_arguments)]
fn stratified_k<'py>(
    py: Python<'py>,
    offsets: PyReadonlyArray1<'py, u64>,
    modes: PyReadonlyArray1<'py, i64>,
    keys: PyReadonlyArray1<'py, u64>,
    k: usize,
    seed: u64,
    rows: Option<PyReadonlyArray1<'py, u64>>,
    content: Option<PyReadonlyArray1<'py, u64>>,
    dups: Option<PyReadonlyArray1<'py, u64>>,
) -> PyResult<Bound<'py, PyDict>> {
    let content_s = opt(&content, "content")?;
    let dups_s = opt(&dups, "dups")?;
    let off = slice1(&offsets, "offsets")?;
    let m = slice1(&modes, "modes")?;
    let ks = slice1(&keys, "keys")?;
    let rows_s = match &rows {
        Some(x) => Some(slice1(x, "rows")?),
        None => None,
    };
    let p = run(py, || sampling::stratified_k(&layout_args(off, rows_s, m.len())?, m, ks, k, seed, content_s, dups_s))?;
    picks_dict(py, p)
}

/// Largest-remainder allocation of k over strata sizes.
#[pyfunction]
fn largest_remainder(counts: Vec<usize>, k: usize) -> Vec<usize> {
    sampling::largest_remainder(&counts, k)
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(random_k, m)?)?;
    m.add_function(wrap_pyfunction!(top_k, m)?)?;
    m.add_function(wrap_pyfunction!(stratified_k, m)?)?;
    m.add_function(wrap_pyfunction!(largest_remainder, m)?)?;
    Ok(())
}
