//! Near-duplicate binding: which candidates of each pool are kept.

use numpy::{PyArray1, PyReadonlyArray1};
use pyo3::prelude::*;

use super::embeddings::Held;
use super::{run, slice1};
use crate::dedup::{near_duplicates as near, Visit};
use crate::pools::Pools;

/// A keep flag per row of `data` (embeddings as `fl_batch` takes them): false
/// for a row within `threshold` (cosine) of one kept before it in its pool,
/// each pool visited by `rewards` (highest first), then `order`, then
/// `content`. Pool p holds rows `rows[offsets[p]:offsets[p+1]]`.
#[pyfunction]
#[pyo3(signature = (data, offsets, threshold, *, order, rows=None, rewards=None, content=None))]
#[allow(clippy::too_many_arguments)]
fn near_duplicates<'py>(
    py: Python<'py>,
    data: &Bound<'py, PyAny>,
    offsets: PyReadonlyArray1<'py, u64>,
    threshold: f64,
    order: PyReadonlyArray1<'py, u64>,
    rows: Option<PyReadonlyArray1<'py, u64>>,
    rewards: Option<PyReadonlyArray1<'py, f64>>,
    content: Option<PyReadonlyArray1<'py, u64>>,
) -> PyResult<Bound<'py, PyArray1<bool>>> {
    let held = Held::of(data)?;
    let x = held.view()?;
    let off = slice1(&offsets, "offsets")?;
    let rows_s = match &rows {
        Some(r) => Some(slice1(r, "rows")?),
        None => None,
    };
    let visit = Visit {
        rewards: match &rewards {
            Some(r) => Some(slice1(r, "rewards")?),
            None => None,
        },
        order: slice1(&order, "order")?,
        content: match &content {
            Some(c) => Some(slice1(c, "content")?),
            None => None,
        },
    };
    let keep = run(py, || {
        let pools = Pools::over(x, off, rows_s)?;
        near(&pools, &visit, threshold)
    })?;
    Ok(PyArray1::from_vec(py, keep))
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(near_duplicates, m)?)?;
    Ok(())
}
