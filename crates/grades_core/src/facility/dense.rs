//! A dense similarity held column by column, and the naive reference
//! objective over one.

use rayon::prelude::*;

#[cfg(target_arch = "x86_64")]
use super::column::column_gain_avx2;
use super::column::{column_cover, column_gain_w};
use super::source::{empty_cover_gains, Source};

/// A dense similarity held column by column: column `j` (the `S_ij` for all
/// i) is `s[j*n .. (j+1)*n]`. A symmetric row-major matrix qualifies as is.
pub struct DenseSource<'a> {
    s: &'a [f32],
    n: usize,
    /// every weight is 1.0 (set by `prepare`)
    unit: bool,
    /// `sum_i w_i S_ij` for every column, computed while the block was made
    sums: Option<&'a [f64]>,
}

impl<'a> DenseSource<'a> {
    pub fn new(s: &'a [f32], n: usize) -> Self {
        assert!(s.len() >= n * n, "DenseSource: {} entries for n = {n}", s.len());
        DenseSource { s, n, unit: false, sums: None }
    }

    /// [`DenseSource::new`] whose initial bounds come from `sums[j] = sum_i
    /// w_i S_ij` (the weights greedy will be given; see
    /// [`crate::kernel::cosine_gram_with`]) instead of a pass over the block.
    pub fn with_sums(s: &'a [f32], n: usize, sums: &'a [f64]) -> Self {
        assert!(sums.len() >= n, "DenseSource: {} sums for n = {n}", sums.len());
        DenseSource { sums: Some(sums), ..Self::new(s, n) }
    }
}

/// Relative room of an initial bound formed from column sums over a gain
/// formed term by term: both add the same non-negative products in another
/// order and rounding, so they lie within about `2 n` units in the last
/// place of each other (1e-10 relative at half a million candidates, more
/// than any n x n block in memory holds), below this.
const SUMS_ROOM: f64 = 1e-9;

/// Dense pools from this size evaluate columns in parallel, in batches.
const DENSE_PAR_N: usize = 4096;

impl Source for DenseSource<'_> {
    fn n(&self) -> usize {
        self.n
    }
    fn gains(&mut self, js: &[usize], w: &[f64], c: &[f64], out: &mut [f64]) {
        let (s, n, unit) = (self.s, self.n, self.unit);
        if n >= DENSE_PAR_N && js.len() > 1 {
            // each column is a long independent sum: one task per few columns
            // (the same function per column, so the same bits)
            out[..js.len()]
                .par_chunks_mut(4)
                .zip(js.par_chunks(4))
                .for_each(|(o, j)| dense_gains_dispatch(unit, s, n, j, w, c, o));
        } else {
            dense_gains_dispatch(unit, s, n, js, w, c, out)
        }
    }
    fn batch(&self) -> usize {
        if self.n >= DENSE_PAR_N {
            32 * rayon::current_num_threads()
        } else {
            1
        }
    }
    fn cover(&mut self, j: usize, w: &[f64], c: &mut [f64]) {
        let n = self.n;
        column_cover(&self.s[j * n..(j + 1) * n], w[j], c);
    }
    fn prepare(&mut self, w: &[f64]) {
        self.unit = w[..self.n].iter().all(|&v| v == 1.0);
    }
    fn initial_bounds(&mut self, w: &[f64], out: &mut [f64]) {
        let n = self.n;
        match self.sums {
            // gain(j | {}) = sum_i w_i w_j S_ij; any bound at or above it keeps
            // lazy greedy exact (a pick is always evaluated by `gains`)
            Some(sums) => {
                for ((o, &sj), &wj) in out[..n].iter_mut().zip(sums).zip(w) {
                    *o = (wj * sj).max(0.0) * (1.0 + SUMS_ROOM) + f64::MIN_POSITIVE;
                }
            }
            None => empty_cover_gains(self, w, out),
        }
    }
}

#[allow(clippy::too_many_arguments)] // the hot loop's inputs, positional
fn dense_gains_dispatch(unit: bool, s: &[f32], n: usize, js: &[usize], w: &[f64], c: &[f64], out: &mut [f64]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 is available (checked just above).
            unsafe {
                if unit {
                    dense_gains_avx2::<true>(s, n, js, w, c, out)
                } else {
                    dense_gains_avx2::<false>(s, n, js, w, c, out)
                }
            };
            return;
        }
    }
    if unit {
        dense_gains::<true>(s, n, js, w, c, out)
    } else {
        dense_gains::<false>(s, n, js, w, c, out)
    }
}

#[inline(always)]
fn dense_gains<const UNIT: bool>(s: &[f32], n: usize, js: &[usize], w: &[f64], c: &[f64], out: &mut [f64]) {
    for (o, &j) in out.iter_mut().zip(js) {
        *o = column_gain_w::<UNIT>(&s[j * n..(j + 1) * n], w[j], w, c);
    }
}

/// Column gains compiled for AVX2 (see [`column_gain_avx2`]: the same bits
/// as the portable version).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dense_gains_avx2<const UNIT: bool>(s: &[f32], n: usize, js: &[usize], w: &[f64], c: &[f64], out: &mut [f64]) {
    for (o, &j) in out.iter_mut().zip(js) {
        *o = column_gain_avx2::<UNIT>(&s[j * n..(j + 1) * n], w[j], w, c);
    }
}

/// Naive reference objective (for tests): F(S) over a dense column-major source.
pub fn objective_dense(s: &[f32], n: usize, w: &[f64], set: &[usize]) -> f64 {
    (0..n)
        .map(|i| {
            let best = set.iter().map(|&j| w[j] * s[j * n + i] as f64).fold(0.0f64, f64::max);
            w[i] * best
        })
        .sum()
}
