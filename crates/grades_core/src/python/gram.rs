//! The similarity matrix of one pool (the Gram path selection runs).

use numpy::{PyArray1, PyReadonlyArray2};
use pyo3::prelude::*;

use super::{run, slice2, to_py};
use crate::kernel::{self, Kernel};

/// Cosine similarity of the rows of `x`, mapped into [0, 1] by `kernel`: the
/// same Gram path (`cosine_gram`) that selection runs on each pool.
#[pyfunction]
#[pyo3(signature = (x, kernel))]
fn similarity<'py>(
    py: Python<'py>,
    x: PyReadonlyArray2<'py, f32>,
    kernel: &str,
) -> PyResult<Bound<'py, PyArray1<f32>>> {
    let (xs, n, d) = slice2(&x, "embeddings")?;
    let kern = Kernel::parse(kernel).map_err(to_py)?;
    let out = run(py, || {
        let (mut s, mut inv) = (Vec::new(), Vec::new());
        kernel::cosine_gram(xs, n, d, kern, &mut s, &mut inv, &|i| (0, i, format!("row {i}")), &[])?;
        s.truncate(n * n);
        Ok(s)
    })?;
    Ok(PyArray1::from_vec(py, out))
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(similarity, m)?)?;
    Ok(())
}
