//! Bindings of `progress`: the count of picks made, read while a selection runs.

use pyo3::prelude::*;

/// Facility-location picks made by this process so far (it only grows).
#[pyfunction]
fn picks_made() -> u64 {
    crate::progress::picks_made()
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(picks_made, m)?)?;
    Ok(())
}
