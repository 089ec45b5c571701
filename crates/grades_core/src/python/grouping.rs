//! Grouping binding: rows grouped by integer prompt id.

use numpy::{PyArray1, PyReadonlyArray1};
use pyo3::prelude::*;

use super::{run, slice1};
use crate::grouping;

type Grouped<'py> = (Bound<'py, PyArray1<u64>>, Bound<'py, PyArray1<u64>>, Bound<'py, PyArray1<u64>>, bool);

/// Rows grouped by integer id, pools in order of first appearance:
/// `(firsts, offsets, rows, identity)` (see the core's `Grouping`).
#[pyfunction]
fn group_ints<'py>(py: Python<'py>, ids: PyReadonlyArray1<'py, i64>) -> PyResult<Grouped<'py>> {
    let v = slice1(&ids, "ids")?;
    let g = run(py, || grouping::group_ints(v))?;
    Ok((
        PyArray1::from_vec(py, g.firsts),
        PyArray1::from_vec(py, g.offsets),
        PyArray1::from_vec(py, g.rows),
        g.identity,
    ))
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(group_ints, m)?)?;
    Ok(())
}
