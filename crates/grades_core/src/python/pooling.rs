//! Bindings of `pooling`: a static model's sentence embeddings from token ids.

use numpy::{PyArray1, PyReadonlyArray1, PyReadonlyArray2};
use pyo3::prelude::*;

use super::{run, slice1, slice2};
use crate::pooling;

/// Unit-norm embeddings (flat, texts x dim) of texts given as token ids:
/// text t holds `ids[starts[t]:starts[t+1]]`; each row is its tokens' vectors
/// summed and normalised, then re-centred on `center` and normalised again
/// when one is given.
#[pyfunction]
#[pyo3(signature = (vectors, ids, starts, center=None))]
fn static_embed<'py>(
    py: Python<'py>,
    vectors: PyReadonlyArray2<'py, f32>,
    ids: PyReadonlyArray1<'py, i64>,
    starts: PyReadonlyArray1<'py, i64>,
    center: Option<PyReadonlyArray1<'py, f32>>,
) -> PyResult<Bound<'py, PyArray1<f32>>> {
    let (v, _, dim) = slice2(&vectors, "vectors")?;
    let (ids, starts) = (slice1(&ids, "ids")?, slice1(&starts, "starts")?);
    let center = center.as_ref().map(|c| slice1(c, "center")).transpose()?;
    let out = run(py, || {
        let mut out = vec![0f32; starts.len() * dim];
        pooling::static_embed(v, dim, ids, starts, center, &mut out)?;
        Ok(out)
    })?;
    Ok(PyArray1::from_vec(py, out))
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(static_embed, m)?)?;
    Ok(())
}
