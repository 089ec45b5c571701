//! PyO3 bindings (cargo feature `python`): the only code that knows Python.
//!
//! One thin file per area; each validates its arrays, releases the GIL for
//! the work through [`run`], and registers its functions in [`_grades_core`].
//! Core errors become `mrt_fast.errors.MrtInputError` (with `pool`, `column`
//! and `row` attributes where known) and any internal panic `RuntimeError`,
//! so nothing unwinds into the interpreter.
//!
//! * `convert`: float16 embeddings widened to f32.
//! * `embeddings`: the embeddings argument, one array or a list of row blocks.
//! * `facility`: facility location over a batch, a dense, a sparse or an
//!   on-demand similarity.
//! * `gram`: the similarity matrix of one pool.
//! * `sampling`: random-K, top-K and mode-stratified K.
//! * `keys`: 64-bit keys of prompt ids.
//! * `dedup`: near-duplicates inside pools.
//! * `grouping`: rows grouped by integer prompt id.
//! * `pooling`: a static model's sentence embeddings from token ids.
//! * `progress`: the count of picks made.
//! * `kmeans`: modes of every pool by k-means.
//! * `variance`: streaming variance accumulators.

use std::panic::{catch_unwind, AssertUnwindSafe};

use numpy::{PyReadonlyArray1, PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::error::Error;

mod convert;
mod dedup;
mod embeddings;
mod facility;
mod gram;
mod grouping;
mod keys;
mod kmeans;
mod pooling;
mod progress;
mod sampling;
mod variance;

/// `mrt_fast.errors.MrtInputError(msg, pool=, column=, row=)`: the class is
/// imported from the package, so Python code catches the one class whether
/// Python or Rust raised it (a plain `ValueError` if it cannot be imported).
fn input_error(msg: &str, pool: Option<usize>, column: Option<&str>, row: Option<usize>) -> PyErr {
    Python::attach(|py| {
        let make = || -> PyResult<PyErr> {
            let cls = py.import("mrt_fast.errors")?.getattr("MrtInputError")?;
            let kw = PyDict::new(py);
            kw.set_item("pool", pool)?;
            kw.set_item("column", column)?;
            kw.set_item("row", row)?;
            Ok(PyErr::from_value(cls.call((msg,), Some(&kw))?))
        };
        make().unwrap_or_else(|_| PyValueError::new_err(msg.to_string()))
    })
}

/// A core error as an `MrtInputError` carrying the pool index, the argument
/// (as `column`) and the row where the core knows them.
fn to_py(e: Error) -> PyErr {
    input_error(&e.to_string(), e.pool(), e.arg(), e.row())
}

/// Run `f` without the GIL; map errors to `MrtInputError` and panics to
/// `RuntimeError`.
fn run<T: Send, F: FnOnce() -> crate::Result<T> + Send>(py: Python<'_>, f: F) -> PyResult<T> {
    match py.detach(|| catch_unwind(AssertUnwindSafe(f))) {
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
    }
}

fn slice1<'a, T: numpy::Element>(a: &'a PyReadonlyArray1<'_, T>, name: &str) -> PyResult<&'a [T]> {
    a.as_slice().map_err(|_| input_error(&format!("{name} must be a contiguous 1-d array"), None, None, None))
}

fn slice2<'a, T: numpy::Element>(a: &'a PyReadonlyArray2<'_, T>, name: &str) -> PyResult<(&'a [T], usize, usize)> {
    let sh = a.shape();
    let (r, c) = (sh[0], sh[1]);
    let s =
        a.as_slice().map_err(|_| input_error(&format!("{name} must be a C-contiguous 2-d array"), None, None, None))?;
    Ok((s, r, c))
}

#[pymodule]
fn _grades_core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    convert::register(m)?;
    dedup::register(m)?;
    facility::register(m)?;
    progress::register(m)?;
    gram::register(m)?;
    grouping::register(m)?;
    sampling::register(m)?;
    keys::register(m)?;
    kmeans::register(m)?;
    pooling::register(m)?;
    variance::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
