//! Greedy on small symmetric dense pools: every gain at every step in one
//! sweep over the rows, bit-identical to naive greedy.

use super::certificate::{top_k_sum, top_k_sum_small};
use super::column::{column_cover, column_gain_w};
use super::dense::DenseSource;
use super::params::FlResult;
use super::ties::{Picker, Ties};

/// Pools up to this size run [`greedy_sweep`] in the batched path when K is
/// small next to the pool (see [`use_sweep`]).
pub const SWEEP_MAX_N: usize = 128;

/// Whether a pool of `n` candidates with `k` picks takes [`greedy_sweep`]:
/// every gain each step costs less than a heap and its stale re-evaluations
/// while K is small, but the sweep's cost grows as K n^2. Measured crossover
/// (64 and 128 candidates, 384 dims): K of about 0.35 n and 0.15 n.
pub fn use_sweep(n: usize, k: usize) -> bool {
    n <= SWEEP_MAX_N && (k <= 4 || 6 * k <= n)
}

/// Columns per block of [`sweep_gains`] (two AVX2 vectors of f64).
const SWEEP_COLS: usize = 8;

/// The gains of every column of a symmetric dense similarity at once,
/// sweeping rows: row `i` is column `i`, so the terms of all columns for one
/// `i` are contiguous in `s`. The term of row `i` for column `j` is
/// `w_i max(0, w_j S_ij - c_i)`, with `w_j S_ij` formed in f64 as
/// `column_gain` forms it. Each column's terms go into the same 16 partial
/// sums (by `i mod 16`), added in the same order and reduced in the same
/// tree, as in `column_gain`: the same bits. With `UNIT` (every weight is
/// 1.0) the multiplications by 1.0 are left out, which changes no bit.
#[inline(always)]
fn sweep_gains<const UNIT: bool>(s: &[f32], n: usize, w: &[f64], c: &[f64], out: &mut [f64]) {
    let mut j0 = 0;
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 is available (checked just above).
            j0 = unsafe { sweep_gains_avx2::<UNIT>(s, n, w, c, out) };
        }
    }
    // the remaining columns one by one: column j is row j (symmetric), so
    // this is naive greedy's own column gain
    for j in j0..n {
        out[j] = column_gain_w::<UNIT>(&s[j * n..(j + 1) * n], w[j], &w[..n], &c[..n]);
    }
}

/// [`sweep_gains`] in AVX2 intrinsics for the blocks of [`SWEEP_COLS`]
/// whole columns; returns the first column it left to the caller. The four
/// partials of one level of the tree (`q, q + 4, q + 8, q + 12`) are formed
/// together, two vectors of columns each, so eight independent sums hide the
/// add latency; each lane does the portable version's operations in the
/// same order (no fused multiply-add): the same bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sweep_gains_avx2<const UNIT: bool>(s: &[f32], n: usize, w: &[f64], c: &[f64], out: &mut [f64]) -> usize {
    use std::arch::x86_64::*;
    assert!(s.len() >= n * n && out.len() >= n && w.len() >= n && c.len() >= n);
    let zero = _mm256_setzero_pd();
    let (sp, wp, cp, op) = (s.as_ptr(), w.as_ptr(), c.as_ptr(), out.as_mut_ptr());
    let add = |x: [__m256d; 2], y: [__m256d; 2]| [_mm256_add_pd(x[0], y[0]), _mm256_add_pd(x[1], y[1])];
    let full = n - n % SWEEP_COLS;
    for j0 in (0..full).step_by(SWEEP_COLS) {
        // SAFETY (all pointer reads below): i < n and j0 + 8 <= n, inside
        // the n x n block and the weights (asserted above)
        let (wj0, wj1) = (_mm256_loadu_pd(wp.add(j0)), _mm256_loadu_pd(wp.add(j0 + 4)));
        let mut lvl = [[zero; 2]; 4];
        for (q, lq) in lvl.iter_mut().enumerate() {
            let mut a = [[zero; 2]; 4];
            let mut m = 0;
            while m < n {
                for (r, ar) in a.iter_mut().enumerate() {
                    let i = m + q + 4 * r;
                    if i < n {
                        let row = sp.add(i * n + j0);
                        let mut v0 = _mm256_cvtps_pd(_mm_loadu_ps(row));
                        let mut v1 = _mm256_cvtps_pd(_mm_loadu_ps(row.add(4)));
                        if !UNIT {
                            v0 = _mm256_mul_pd(wj0, v0);
                            v1 = _mm256_mul_pd(wj1, v1);
                        }
                        let ci = _mm256_set1_pd(*cp.add(i));
                        let mut t0 = _mm256_max_pd(_mm256_sub_pd(v0, ci), zero);
                        let mut t1 = _mm256_max_pd(_mm256_sub_pd(v1, ci), zero);
                        if !UNIT {
                            let wi = _mm256_set1_pd(*wp.add(i));
                            t0 = _mm256_mul_pd(wi, t0);
                            t1 = _mm256_mul_pd(wi, t1);
                        }
                        ar[0] = _mm256_add_pd(ar[0], t0);
                        ar[1] = _mm256_add_pd(ar[1], t1);
                    }
                }
                m += 16;
            }
            *lq = add(add(a[0], a[1]), add(a[2], a[3]));
        }
        let g = add(add(lvl[0], lvl[1]), add(lvl[2], lvl[3]));
        _mm256_storeu_pd(op.add(j0), g[0]);
        _mm256_storeu_pd(op.add(j0 + 4), g[1]);
    }
    full
}

/// Buffers of [`greedy_sweep_with`], reused from pool to pool.
#[derive(Default)]
pub struct SweepScratch {
    c: Vec<f64>,
    g: Vec<f64>,
    chosen: Vec<bool>,
    top: Vec<f64>,
    tied: Vec<(usize, f64)>,
}

/// Greedy over a **symmetric** dense `n x n` similarity `s`, evaluating every
/// gain at every step with one sweep over the rows. It returns exactly what
/// [`greedy`](fn@super::greedy) returns with
/// [`Optimizer::Naive`](super::Optimizer::Naive) on `DenseSource::new(s, n)`:
/// the same picks, gains, objective and certificate, to the bit. On small
/// pools this is faster than lazy greedy, whose heap work and stale
/// re-evaluations (often half the pool per step) cost more than the sweep.
pub fn greedy_sweep(s: &[f32], n: usize, w: &[f64], k: usize) -> FlResult {
    greedy_sweep_with(s, n, w, k, &mut SweepScratch::default(), &Ties::none())
}

/// [`greedy_sweep`] with caller-held buffers and ties decided by `ties`
/// (as [`greedy_with`](fn@super::greedy_with) decides them).
pub fn greedy_sweep_with(s: &[f32], n: usize, w: &[f64], k: usize, sc: &mut SweepScratch, ties: &Ties<'_>) -> FlResult {
    assert!(s.len() >= n * n && w.len() >= n, "greedy_sweep: buffers too small");
    let unit = w[..n].iter().all(|&v| v == 1.0);
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 is available (checked just above).
            return unsafe {
                if unit {
                    greedy_sweep_avx2::<true>(s, n, w, k, sc, ties)
                } else {
                    greedy_sweep_avx2::<false>(s, n, w, k, sc, ties)
                }
            };
        }
    }
    if unit {
        greedy_sweep_impl::<true>(s, n, w, k, sc, ties)
    } else {
        greedy_sweep_impl::<false>(s, n, w, k, sc, ties)
    }
}

/// The same code compiled for AVX2 (lane-wise: the same bits).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn greedy_sweep_avx2<const UNIT: bool>(
    s: &[f32],
    n: usize,
    w: &[f64],
    k: usize,
    sc: &mut SweepScratch,
    ties: &Ties<'_>,
) -> FlResult {
    greedy_sweep_impl::<UNIT>(s, n, w, k, sc, ties)
}

#[inline(always)]
fn greedy_sweep_impl<const UNIT: bool>(
    s: &[f32],
    n: usize,
    w: &[f64],
    k: usize,
    sc: &mut SweepScratch,
    ties: &Ties<'_>,
) -> FlResult {
    let k = k.min(n);
    let mut res = FlResult::default();
    if n == 0 {
        return res;
    }
    res.indices.reserve(k);
    res.gains.reserve(k);
    let w = &w[..n];
    sc.c.clear();
    sc.c.resize(n, 0.0);
    sc.g.resize(n, 0.0);
    sc.chosen.clear();
    sc.chosen.resize(n, false);
    let (c, g, chosen, top, tied) = (&mut sc.c, &mut sc.g, &mut sc.chosen, &mut sc.top, &mut sc.tied);
    let mut pk = Picker::new(ties, n, w);
    let (mut f, mut ub) = (0.0f64, f64::INFINITY);
    for t in 0..=k {
        sweep_gains::<UNIT>(s, n, w, c, g);
        // a chosen column's gain is exactly +0.0 (its own cover dominates
        // every term), and adding zeros after the k largest changes no bit:
        // the sum over all columns is naive greedy's sum over the unchosen
        let best_k = if k <= 8 {
            top_k_sum_small(g, k)
        } else {
            top.clear();
            top.extend_from_slice(g);
            top_k_sum(top, k)
        };
        ub = ub.min(f + best_k);
        if t == k {
            break;
        }
        // the largest eligible gain (unchosen, not set aside), then every
        // eligible gain tied with it, as naive greedy finds them
        let mut gmax = f64::NEG_INFINITY;
        for j in 0..n {
            if !chosen[j] && !pk.aside(j) && g[j] > gmax {
                gmax = g[j];
            }
        }
        let thr = pk.threshold(gmax);
        tied.clear();
        tied.extend((0..n).filter(|&j| !chosen[j] && !pk.aside(j) && g[j] >= thr).map(|j| (j, g[j])));
        let (best, gb) = if tied.len() == 1 { tied[0] } else { pk.resolve(&mut DenseSource::new(s, n), tied) };
        chosen[best] = true;
        f += gb;
        column_cover(&s[best * n..(best + 1) * n], w[best], c);
        pk.picked(best, gb, chosen);
        res.indices.push(best);
        crate::progress::picked();
        res.gains.push(gb);
    }
    res.objective = c.iter().zip(w).map(|(&ci, &wi)| wi * ci).sum();
    res.upper_bound = ub.max(res.objective);
    res.ties = pk.n_ties;
    res.zero_gain = pk.n_zero;
    res.dup_skipped = pk.n_skipped(chosen);
    res
}
