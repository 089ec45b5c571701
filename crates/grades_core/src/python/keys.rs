//! Prompt-id key bindings: stable 64-bit keys of string and integer ids.

use numpy::{PyArray1, PyReadonlyArray1, PyReadonlyArray2};
use pyo3::prelude::*;

use super::{run, slice1, slice2};
use crate::keys;

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
    let keys = run(py, || keys::keys_of_strings(off, b))?;
    Ok(PyArray1::from_vec(py, keys))
}

/// Stable 64-bit keys of integer prompt ids.
#[pyfunction]
fn keys_from_ints<'py>(py: Python<'py>, ids: PyReadonlyArray1<'py, i64>) -> PyResult<Bound<'py, PyArray1<u64>>> {
    let v = slice1(&ids, "ids")?;
    let keys = py.detach(|| keys::keys_of_ints(v));
    Ok(PyArray1::from_vec(py, keys))
}

/// Stable 64-bit keys of unsigned integer prompt ids: the `keys_from_ints`
/// key of every value that fits an int64, the text key of the others.
#[pyfunction]
fn keys_from_uints<'py>(py: Python<'py>, ids: PyReadonlyArray1<'py, u64>) -> PyResult<Bound<'py, PyArray1<u64>>> {
    let v = slice1(&ids, "ids")?;
    let keys = py.detach(|| keys::keys_of_uints(v));
    Ok(PyArray1::from_vec(py, keys))
}

/// Content keys of candidates: xxh3 of each embedding row, its reward and
/// its text key (where given); the keys ties and random draws are decided by.
#[pyfunction]
#[pyo3(signature = (x, *, rewards=None, text=None))]
fn content_keys<'py>(
    py: Python<'py>,
    x: PyReadonlyArray2<'py, f32>,
    rewards: Option<PyReadonlyArray1<'py, f64>>,
    text: Option<PyReadonlyArray1<'py, u64>>,
) -> PyResult<Bound<'py, PyArray1<u64>>> {
    let (v, _, d) = slice2(&x, "embeddings")?;
    let r = rewards.as_ref().map(|a| slice1(a, "rewards")).transpose()?;
    let t = text.as_ref().map(|a| slice1(a, "text")).transpose()?;
    let keys = run(py, || keys::content_keys(v, d.max(1), r, t))?;
    Ok(PyArray1::from_vec(py, keys))
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(keys_from_strings, m)?)?;
    m.add_function(wrap_pyfunction!(keys_from_ints, m)?)?;
    m.add_function(wrap_pyfunction!(keys_from_uints, m)?)?;
    m.add_function(wrap_pyfunction!(content_keys, m)?)?;
    Ok(())
}
