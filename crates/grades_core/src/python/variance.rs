//! Variance bindings: streaming, mergeable per-prompt loss accumulators.

use numpy::{PyArray1, PyReadonlyArray1};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::{run, slice1};

use pyo3::types::PyBytes;

use crate::variance::{Accumulator as VarAcc, Summary as VarSummary};

fn var_summary_dict<'py>(py: Python<'py>, s: &VarSummary) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("n_rows", s.n_rows)?;
    d.set_item("n_prompts", s.n_prompts)?;
    d.set_item("n_single_response_prompts", s.n_single_response_prompts)?;
    d.set_item("n_used_prompts", s.n_used_prompts)?;
    d.set_item("n_used_rows", s.n_used_rows)?;
    d.set_item("v_y_given_x", s.v_y_given_x)?;
    d.set_item("var_of_means", s.var_of_means)?;
    d.set_item("within_leak", s.within_leak)?;
    d.set_item("v_x_raw", s.v_x_raw)?;
    d.set_item("v_x", s.v_x)?;
    d.set_item("grand_mean", s.grand_mean)?;
    d.set_item("mean_k", s.mean_k)?;
    Ok(d)
}

/// Per-prompt statistics as dict(count, mean, m2) of NumPy arrays (the
/// columns moved, not copied).
fn stats_dict<'py>(py: Python<'py>, c: crate::variance::StatsColumns) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("count", PyArray1::from_vec(py, c.count))?;
    d.set_item("mean", PyArray1::from_vec(py, c.mean))?;
    d.set_item("m2", PyArray1::from_vec(py, c.m2))?;
    Ok(d)
}

/// Streaming, mergeable per-prompt loss statistics (count, mean, M2).
#[pyclass(name = "VarianceAccumulator", module = "mrt_fast._grades_core")]
#[derive(Default)]
struct PyVarianceAccumulator {
    inner: VarAcc,
}

#[pymethods]
impl PyVarianceAccumulator {
    #[new]
    fn new() -> Self {
        Self::default()
    }

    /// Add rows (keys[i], losses[i]); all-or-nothing on a non-finite loss.
    fn update(
        &mut self,
        py: Python<'_>,
        keys: PyReadonlyArray1<'_, u64>,
        losses: PyReadonlyArray1<'_, f64>,
    ) -> PyResult<()> {
        let k = slice1(&keys, "keys")?;
        let x = slice1(&losses, "losses")?;
        let acc = &mut self.inner;
        run(py, || acc.update(k, x))
    }

    /// Add rows with integer prompt ids (keyed as `keys_from_ints` keys
    /// them, once per run of equal ids, inside the scan).
    fn update_int_ids(
        &mut self,
        py: Python<'_>,
        ids: PyReadonlyArray1<'_, i64>,
        losses: PyReadonlyArray1<'_, f64>,
    ) -> PyResult<()> {
        let k = slice1(&ids, "ids")?;
        let x = slice1(&losses, "losses")?;
        let acc = &mut self.inner;
        run(py, || acc.update_int_ids(k, x))
    }

    /// Fold `other` into this accumulator; an accumulator merged with
    /// itself counts every row twice.
    fn merge(slf: &Bound<'_, Self>, other: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let copy = if slf.is(other) { Some(slf.borrow().inner.clone()) } else { None };
        let o = if copy.is_none() { Some(other.borrow()) } else { None };
        let mut me = slf.borrow_mut();
        let acc = &mut me.inner;
        let from = copy.as_ref().or(o.as_ref().map(|o| &o.inner)).expect("one of the two");
        run(py, || acc.merge(from))
    }

    fn copy(&self) -> Self {
        Self { inner: self.inner.clone() }
    }

    fn to_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.inner.to_bytes())
    }

    #[staticmethod]
    fn from_bytes(py: Python<'_>, data: &[u8]) -> PyResult<Self> {
        let inner = run(py, || VarAcc::from_bytes(data))?;
        Ok(Self { inner })
    }

    fn __len__(&self, py: Python<'_>) -> usize {
        let acc = &self.inner;
        py.detach(|| acc.len())
    }

    #[getter]
    fn n_rows(&self) -> u64 {
        self.inner.n_rows()
    }

    /// Per-prompt arrays sorted by key: dict(key, count, mean, m2).
    fn per_prompt<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let acc = &self.inner;
        let (keys, cols) = py.detach(|| {
            let (keys, stats) = acc.per_prompt();
            (keys, crate::variance::StatsColumns::of(&stats))
        });
        let d = stats_dict(py, cols)?;
        d.set_item("key", PyArray1::from_vec(py, keys))?;
        Ok(d)
    }

    /// Statistics of the prompts with two or more responses, in key-hash
    /// order: dict(count, mean, m2).
    fn used_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let acc = &self.inner;
        let c = py.detach(|| acc.used_stats());
        stats_dict(py, c)
    }

    /// Mean (4) and ddof=1 covariance (4 x 4, as nested lists) over the
    /// prompts used of (s2, s2/K, g - gbar, (g - gbar)^2), and their count;
    /// `gbar` is the summary's grand mean unless given.
    #[allow(clippy::type_complexity)]
    #[pyo3(signature = (gbar=None))]
    fn used_moments(&self, py: Python<'_>, gbar: Option<f64>) -> PyResult<(u64, Vec<f64>, Vec<Vec<f64>>)> {
        let acc = &self.inner;
        let m = run(py, || match gbar {
            Some(g) => acc.used_moments_about(g),
            None => acc.used_moments(),
        })?;
        Ok((m.n, m.mean.to_vec(), m.cov.iter().map(|r| r.to_vec()).collect()))
    }

    /// The decomposition's estimators as a dict (see the Rust docs).
    fn summary<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let acc = &self.inner;
        let s = run(py, || acc.summary())?;
        var_summary_dict(py, &s)
    }
}

/// Estimators from per-prompt arrays (count, mean, m2), in the given order.
#[pyfunction]
fn variance_summary<'py>(
    py: Python<'py>,
    count: PyReadonlyArray1<'py, u64>,
    mean: PyReadonlyArray1<'py, f64>,
    m2: PyReadonlyArray1<'py, f64>,
) -> PyResult<Bound<'py, PyDict>> {
    let (c, mu, q) = (slice1(&count, "count")?, slice1(&mean, "mean")?, slice1(&m2, "m2")?);
    if c.len() != mu.len() || c.len() != q.len() {
        return Err(PyValueError::new_err("count, mean and m2 must have the same length"));
    }
    let s = run(py, || {
        let stats: Vec<crate::variance::Stats> =
            c.iter().zip(mu).zip(q).map(|((&count, &mean), &m2)| crate::variance::Stats { count, mean, m2 }).collect();
        let rows = c.iter().sum();
        crate::variance::summarize(&stats, rows)
    })?;
    var_summary_dict(py, &s)
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyVarianceAccumulator>()?;
    m.add_function(wrap_pyfunction!(variance_summary, m)?)?;
    Ok(())
}
