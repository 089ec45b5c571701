//! A sparse (CSR) similarity held column by column.

use super::source::Source;
use crate::kernel::{CsrRef, Idx};

/// A sparse similarity held column by column (row `j` of `cols` lists the
/// `i` with a stored `S_ij`).
pub struct SparseSource<'a, P: Idx, I: Idx> {
    pub cols: CsrRef<'a, P, I>,
}

impl<P: Idx, I: Idx> Source for SparseSource<'_, P, I> {
    fn n(&self) -> usize {
        self.cols.n
    }
    fn gains(&mut self, js: &[usize], w: &[f64], c: &[f64], out: &mut [f64]) {
        let m = &self.cols;
        for (o, &j) in out.iter_mut().zip(js) {
            let wj = w[j];
            let mut acc = 0.0f64;
            for e in m.row(j) {
                let i = m.indices[e].ix();
                let t = wj * m.data[e] as f64 - c[i];
                if t > 0.0 {
                    acc += w[i] * t;
                }
            }
            *o = acc;
        }
    }
    fn cover(&mut self, j: usize, w: &[f64], c: &mut [f64]) {
        let m = &self.cols;
        let wj = w[j];
        for e in m.row(j) {
            let i = m.indices[e].ix();
            let v = wj * m.data[e] as f64;
            if v > c[i] {
                c[i] = v;
            }
        }
    }
}
