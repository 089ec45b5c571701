//! Bindings of `convert`: float16 embeddings widened into an f32 buffer.

use numpy::{PyReadonlyArray1, PyReadwriteArray1};
use pyo3::prelude::*;

use super::{input_error, run, slice1};
use crate::convert;

/// Widen float16 values (their bits, uint16) into the float32 array `out`
/// of the same length, in place.
#[pyfunction]
fn widen_f16(py: Python<'_>, bits: PyReadonlyArray1<'_, u16>, mut out: PyReadwriteArray1<'_, f32>) -> PyResult<()> {
    let src = slice1(&bits, "bits")?;
    let dst = out
        .as_slice_mut()
        .map_err(|_| input_error("out must be a contiguous, writable 1-d float32 array", None, None, None))?;
    run(py, || convert::widen_f16(src, dst))
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(widen_f16, m)?)?;
    Ok(())
}
