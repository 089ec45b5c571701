//! The embeddings argument of the batched entry points: one C-contiguous 2-d
//! float32 or float16 array, or a list of them (row blocks of one dtype and
//! width, read in place in that order).

use half::f16;
use numpy::{PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyList;

use super::{input_error, slice2};
use crate::embeddings::Embeddings;

/// The arrays behind an embeddings argument, held (and so borrowed read-only)
/// while the core reads them.
pub(super) enum Held<'py> {
    F32(Vec<PyReadonlyArray2<'py, f32>>),
    F16(Vec<PyReadonlyArray2<'py, f16>>),
}

const WHAT: &str = "embeddings must be a C-contiguous 2-d float32 or float16 array, or a list of them";

impl<'py> Held<'py> {
    pub(super) fn of(data: &Bound<'py, PyAny>) -> PyResult<Self> {
        let items: Vec<Bound<'py, PyAny>> = match data.cast::<PyList>() {
            Ok(l) => l.iter().collect(),
            Err(_) => vec![data.clone()],
        };
        if items.is_empty() {
            return Err(input_error("embeddings: an empty list of blocks", None, None, None));
        }
        if let Ok(a) = items[0].extract::<PyReadonlyArray2<'py, f32>>() {
            let mut v = vec![a];
            for it in &items[1..] {
                v.push(it.extract().map_err(|_| input_error(&format!("{WHAT} of one dtype"), None, None, None))?);
            }
            return Ok(Held::F32(v));
        }
        if let Ok(a) = items[0].extract::<PyReadonlyArray2<'py, f16>>() {
            let mut v = vec![a];
            for it in &items[1..] {
                v.push(it.extract().map_err(|_| input_error(&format!("{WHAT} of one dtype"), None, None, None))?);
            }
            return Ok(Held::F16(v));
        }
        Err(input_error(WHAT, None, None, None))
    }

    /// The blocks as one matrix (each must have the first block's width).
    pub(super) fn view(&self) -> PyResult<Embeddings<'_>> {
        fn blocks<'a, T: numpy::Element>(v: &'a [PyReadonlyArray2<'_, T>]) -> PyResult<(Vec<&'a [T]>, usize)> {
            let d = v[0].shape()[1];
            let mut out = Vec::with_capacity(v.len());
            for (i, a) in v.iter().enumerate() {
                let (s, _, c) = slice2(a, "embeddings")?;
                if c != d {
                    return Err(input_error(
                        &format!("embeddings: block {i} has {c} columns, block 0 has {d}"),
                        None,
                        None,
                        None,
                    ));
                }
                out.push(s);
            }
            Ok((out, d))
        }
        let m = match self {
            Held::F32(v) => blocks(v).and_then(|(b, d)| Embeddings::f32_blocks(b, d).map_err(super::to_py)),
            Held::F16(v) => blocks(v).and_then(|(b, d)| Embeddings::f16_blocks(b, d).map_err(super::to_py)),
        }?;
        Ok(m)
    }
}
