//! PyO3 bindings (cargo feature `python`): the only code that knows Python.
//!
//! One thin file per area; each validates its arrays, releases the GIL for
//! the work through [`run`], and registers its functions in [`_grades_core`].
//! Core errors become `ValueError` and any internal panic `RuntimeError`, so
//! nothing unwinds into the interpreter.
//!
//! * `facility`: facility location over a batch, a dense, a sparse or an
//!   on-demand similarity.
//! * `gram`: the similarity matrix of one pool.
//! * `sampling`: random-K, top-K and mode-stratified K.
//! * `keys`: 64-bit keys of prompt ids.
//! * `kmeans`: modes of every pool by k-means.
//! * `variance`: streaming variance accumulators.

use std::panic::{catch_unwind, AssertUnwindSafe};

use numpy::{PyReadonlyArray1, PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use crate::error::Error;

mod facility;
mod gram;
mod keys;
mod kmeans;
mod sampling;
mod variance;

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

/// Number of threads the core's pool uses.
#[pyfunction]
fn num_threads() -> usize {
    rayon::current_num_threads()
}

#[pymodule]
fn _grades_core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    facility::register(m)?;
    gram::register(m)?;
    sampling::register(m)?;
    keys::register(m)?;
    m.add_function(wrap_pyfunction!(num_threads, m)?)?;
    kmeans::register(m)?;
    variance::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
