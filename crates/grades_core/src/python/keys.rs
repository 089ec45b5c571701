//! Prompt-id key bindings: stable 64-bit keys of string and integer ids.

use numpy::{PyArray1, PyReadonlyArray1};
use pyo3::prelude::*;

use super::embeddings::Held;
use super::{run, slice1};
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
/// `x`: the embeddings as `fl_batch` takes them (float32 or float16, one
/// array or a list of row blocks; float16 rows hashed as their f32 values).
#[pyfunction]
#[pyo3(signature = (x, *, rewards=None, text=None))]
fn content_keys<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    rewards: Option<PyReadonlyArray1<'py, f64>>,
    text: Option<PyReadonlyArray1<'py, u64>>,
) -> PyResult<Bound<'py, PyArray1<u64>>> {
    let held = Held::of(x)?;
    let m = held.view()?;
    let r = rewards.as_ref().map(|a| slice1(a, "rewards")).transpose()?;
    let t = text.as_ref().map(|a| slice1(a, "text")).transpose()?;
    let keys = run(py, || match m.f32_span(0, m.n_rows()) {
        Some(v) => keys::content_keys(v, m.dim().max(1), r, t),
        None => keys::embedding_content_keys(&m, r, t),
    })?;
    Ok(PyArray1::from_vec(py, keys))
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(keys_from_strings, m)?)?;
    m.add_function(wrap_pyfunction!(keys_from_ints, m)?)?;
    m.add_function(wrap_pyfunction!(keys_from_uints, m)?)?;
    m.add_function(wrap_pyfunction!(content_keys, m)?)?;
    Ok(())
}
