//! Quality-weighted facility location ("GRADES") and its greedy optimisers.
//!
//! Objective over a ground set `U` with weights `w_i = q_i^alpha` and
//! similarities `S_ij` in [0, 1]:
//!
//! ```text
//! F(S) = sum_{i in U} w_i * max_{j in S} w_j * S_ij      (max over {} = 0)
//! gain(j | S) = sum_i w_i * max(0, w_j * S_ij - c_i),    c_i = current cover of i
//! ```
//!
//! F is normalised, monotone and submodular for w >= 0 and S >= 0, so greedy
//! is within (1 - 1/e) of the best K-subset. Both optimisers pick the largest
//! gain with ties going to the lower index; lazy greedy (Minoux) re-evaluates
//! only stale heap tops and returns exactly what naive greedy returns.
//!
//! **Certificate.** For any greedy prefix `S_t`, `OPT <= F(S_t) + (sum of the K
//! largest marginal gains w.r.t. S_t)`. Each result carries the minimum of that
//! bound over the prefixes examined (every prefix for naive greedy and for
//! lazy greedy on pools of at most 4096 candidates; prefixes 0, 1, 2, 4, 8, ...
//! and K otherwise), using exact gains where known and, for lazy greedy, the
//! heap's stale gains, which are valid upper bounds by submodularity.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use rayon::prelude::*;

use crate::error::{invalid, try_zeroed, Error, Result};
use crate::kernel::{cosine_gram, gather_normalized, gather_rows, gemm_abt, Csr, CsrRef, Idx, Kernel};
use crate::pools::Pools;

/// Which greedy runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Optimizer {
    Naive,
    Lazy,
}

impl Optimizer {
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "naive" => Ok(Optimizer::Naive),
            "lazy" => Ok(Optimizer::Lazy),
            other => invalid(format!("optimizer must be 'lazy' or 'naive', got {other:?}")),
        }
    }
}

/// Parameters shared by every facility-location entry point.
#[derive(Debug, Clone, Copy)]
pub struct Params {
    /// Number of candidates to keep per pool (>= 1).
    pub k: usize,
    /// Quality exponent (>= 0); 0 ignores rewards (plain diversity).
    pub alpha: f64,
    /// Smoothing in the quality normalisation (> 0).
    pub eps: f64,
    /// Keep only the `k_max` best-quality candidates as the ground set.
    pub k_max: Option<usize>,
    pub optimizer: Optimizer,
}

impl Params {
    pub fn validate(&self) -> Result<()> {
        if self.k < 1 {
            return invalid(format!("k must be >= 1, got {}", self.k));
        }
        if !self.alpha.is_finite() || self.alpha < 0.0 {
            return invalid(format!("alpha must be a finite number >= 0, got {}", self.alpha));
        }
        if !self.eps.is_finite() || self.eps <= 0.0 {
            return invalid(format!("eps must be a finite number > 0, got {}", self.eps));
        }
        if let Some(km) = self.k_max {
            if km < self.k {
                return invalid(format!("k_max must be >= k, got k_max = {km} < k = {}", self.k));
            }
        }
        Ok(())
    }

    fn needs_rewards(&self) -> bool {
        self.alpha > 0.0 || self.k_max.is_some()
    }
}

/// The outcome of one pool.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FlResult {
    /// Chosen candidates (indices within the pool), in pick order.
    pub indices: Vec<usize>,
    /// Marginal gain of each pick, in pick order.
    pub gains: Vec<f64>,
    /// F(S) of the chosen set.
    pub objective: f64,
    /// Certified upper bound on the best K-subset's F.
    pub upper_bound: f64,
}

impl FlResult {
    /// objective / upper_bound (1 when both are 0).
    pub fn ratio(&self) -> f64 {
        if self.upper_bound > 0.0 {
            self.objective / self.upper_bound
        } else {
            1.0
        }
    }
}

/// GRADES quality `q_j = eps + (r_j - min r) / (max r - min r + eps)`.
///
/// Finite rewards whose range `max r - min r` overflows float64 are halved
/// (numerator and denominator alike) before the division, which gives the
/// same quotient without an infinite range (and so without NaN weights).
pub fn quality(rewards: &[f64], eps: f64) -> Vec<f64> {
    if rewards.is_empty() {
        return Vec::new();
    }
    let (lo, hi) = rewards.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &r| (lo.min(r), hi.max(r)));
    if (hi - lo).is_finite() {
        let den = hi - lo + eps;
        rewards.iter().map(|&r| eps + (r - lo) / den).collect()
    } else {
        let den = (hi / 2.0 - lo / 2.0) + eps / 2.0;
        rewards.iter().map(|&r| eps + (r / 2.0 - lo / 2.0) / den).collect()
    }
}

/// Positions of the `k_max` largest qualities, ties to the lower index,
/// returned in ascending index order (so later ties still go to the lower index).
pub fn prefilter(q: &[f64], k_max: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..q.len()).collect();
    if k_max < q.len() {
        order.sort_by(|&a, &b| q[b].partial_cmp(&q[a]).unwrap_or(Ordering::Equal).then(a.cmp(&b)));
        order.truncate(k_max);
        order.sort_unstable();
    }
    order
}

/// A source of similarities that greedy can query.
pub trait Source {
    /// Size of the ground set.
    fn n(&self) -> usize;
    /// `sum_i w_i * max(0, w_j * S_ij - c_i)` for each `j` in `js`.
    fn gains(&mut self, js: &[usize], w: &[f64], c: &[f64], out: &mut [f64]);
    /// `c_i = max(c_i, w_j * S_ij)` for every i.
    fn cover(&mut self, j: usize, w: &[f64], c: &mut [f64]);
    /// Upper bounds on every gain with an empty cover (default: exact).
    fn initial_bounds(&mut self, w: &[f64], out: &mut [f64]) {
        let n = self.n();
        let all: Vec<usize> = (0..n).collect();
        let c = vec![0.0; n];
        self.gains(&all, w, &c, out);
    }
    /// How many stale heap tops lazy greedy re-evaluates at once, at most.
    fn batch(&self) -> usize {
        1
    }
    /// The fewest stale tops re-evaluated at once once a step needed few
    /// (default: 1/16 of `batch`).
    fn batch_min(&self) -> usize {
        (self.batch() / 16).max(1)
    }
    /// Called once with the weights before greedy starts (a source may
    /// specialise on them).
    fn prepare(&mut self, _w: &[f64]) {}
}

/// `sum_i w_i max(0, w_j s_i - c_i)`: branch-free, 16 partial sums (four
/// vectors of four lanes, so four independent add chains) reduced in a fixed
/// tree: the same inputs always give the same bits, vectorised or not.
#[inline(always)]
fn column_gain(col: &[f32], wj: f64, w: &[f64], c: &[f64]) -> f64 {
    column_gain_w::<false>(col, wj, w, c)
}

/// [`column_gain`]; with `UNIT` (every weight is 1.0) the multiplications by
/// 1.0 and the loads of `w` are left out, which changes no bit.
#[inline(always)]
fn column_gain_w<const UNIT: bool>(col: &[f32], wj: f64, w: &[f64], c: &[f64]) -> f64 {
    #[inline(always)]
    fn term<const UNIT: bool>(s: f32, wj: f64, wi: f64, ci: f64) -> f64 {
        let t = if UNIT { s as f64 } else { wj * s as f64 } - ci;
        // `t > 0 ? t : 0` (maxpd semantics; inputs are never NaN)
        let t = if t > 0.0 { t } else { 0.0 };
        if UNIT {
            t
        } else {
            wi * t
        }
    }
    const L: usize = 16;
    let n = col.len().min(w.len()).min(c.len());
    let (col, w, c) = (&col[..n], &w[..n], &c[..n]);
    let mut acc = [0.0f64; L];
    let (cs, ws, xs) = (col.chunks_exact(L), w.chunks_exact(L), c.chunks_exact(L));
    let tail = (cs.remainder(), ws.remainder(), xs.remainder());
    if UNIT {
        for (s16, c16) in cs.zip(xs) {
            for l in 0..L {
                acc[l] += term::<true>(s16[l], 1.0, 1.0, c16[l]);
            }
        }
    } else {
        for ((s16, w16), c16) in cs.zip(ws).zip(xs) {
            for l in 0..L {
                acc[l] += term::<false>(s16[l], wj, w16[l], c16[l]);
            }
        }
    }
    for (l, ((&s, &wi), &ci)) in tail.0.iter().zip(tail.1).zip(tail.2).enumerate() {
        acc[l] += term::<UNIT>(s, wj, wi, ci);
    }
    let mut a = [0.0f64; 4];
    for l in 0..4 {
        a[l] = (acc[l] + acc[l + 4]) + (acc[l + 8] + acc[l + 12]);
    }
    (a[0] + a[1]) + (a[2] + a[3])
}

#[inline(always)]
fn column_cover(col: &[f32], wj: f64, c: &mut [f64]) {
    for (&s, ci) in col.iter().zip(c.iter_mut()) {
        let v = wj * s as f64;
        // a select and a plain store (vectorises without masked stores)
        *ci = if v > *ci { v } else { *ci };
    }
}

/// A dense similarity held column by column: column `j` (the `S_ij` for all
/// i) is `s[j*n .. (j+1)*n]`. A symmetric row-major matrix qualifies as is.
pub struct DenseSource<'a> {
    s: &'a [f32],
    n: usize,
    /// every weight is 1.0 (set by `prepare`)
    unit: bool,
}

impl<'a> DenseSource<'a> {
    pub fn new(s: &'a [f32], n: usize) -> Self {
        assert!(s.len() >= n * n, "DenseSource: {} entries for n = {n}", s.len());
        DenseSource { s, n, unit: false }
    }
}

#[inline(always)]
fn dense_gains<const UNIT: bool>(s: &[f32], n: usize, js: &[usize], w: &[f64], c: &[f64], out: &mut [f64]) {
    for (o, &j) in out.iter_mut().zip(js) {
        *o = column_gain_w::<UNIT>(&s[j * n..(j + 1) * n], w[j], w, c);
    }
}

/// [`column_gain_w`] in AVX2 intrinsics: partial sum `l` is lane `l % 4` of
/// vector `l / 4`, each lane does the scalar version's operations in the
/// same order (no fused multiply-add), and the tail and the tree are the
/// same: the same bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn column_gain_avx2<const UNIT: bool>(col: &[f32], wj: f64, w: &[f64], c: &[f64]) -> f64 {
    use std::arch::x86_64::*;
    const L: usize = 16;
    let n = col.len().min(w.len()).min(c.len());
    let full = n - n % L;
    let (sp, wp, cp) = (col.as_ptr(), w.as_ptr(), c.as_ptr());
    let (zero, wjv) = (_mm256_setzero_pd(), _mm256_set1_pd(wj));
    let mut acc = [_mm256_setzero_pd(); 4];
    let mut i = 0;
    while i < full {
        // one 64-byte line of the column per iteration: fetch 2 KiB ahead
        // (a hint; never faults)
        _mm_prefetch::<_MM_HINT_T0>(sp.wrapping_add(i + 512) as *const i8);
        for (q, a) in acc.iter_mut().enumerate() {
            let o = i + 4 * q;
            // SAFETY: o + 4 <= full <= n, within all three slices
            let sv = _mm256_cvtps_pd(_mm_loadu_ps(sp.add(o)));
            let x = if UNIT { sv } else { _mm256_mul_pd(wjv, sv) };
            let t = _mm256_sub_pd(x, _mm256_loadu_pd(cp.add(o)));
            // maxpd(t, 0) = t > 0 ? t : 0, as in the scalar term
            let t = _mm256_max_pd(t, zero);
            let t = if UNIT { t } else { _mm256_mul_pd(_mm256_loadu_pd(wp.add(o)), t) };
            *a = _mm256_add_pd(*a, t);
        }
        i += L;
    }
    let mut part = [0f64; L];
    for (q, a) in acc.iter().enumerate() {
        _mm256_storeu_pd(part.as_mut_ptr().add(4 * q), *a);
    }
    for l in 0..n - full {
        let (sv, ci, wi) = (col[full + l], c[full + l], w[full + l]);
        let t = if UNIT { sv as f64 } else { wj * sv as f64 } - ci;
        let t = if t > 0.0 { t } else { 0.0 };
        part[l] += if UNIT { t } else { wi * t };
    }
    let a: [f64; 4] = std::array::from_fn(|l| (part[l] + part[l + 4]) + (part[l + 8] + part[l + 12]));
    (a[0] + a[1]) + (a[2] + a[3])
}

/// [`column_gain`] through the AVX2 version where the CPU has it (the same
/// bits either way).
fn column_gain_fast(col: &[f32], wj: f64, w: &[f64], c: &[f64]) -> f64 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 is available (checked just above).
            return unsafe { column_gain_avx2::<false>(col, wj, w, c) };
        }
    }
    column_gain(col, wj, w, c)
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

/// Dense pools from this size evaluate columns in parallel, in batches.
const DENSE_PAR_N: usize = 4096;

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
}

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

/// Rows per chunk when a column block is computed in parallel.
const CHUNK: usize = 512;

/// A bounded cache of similarity columns, least recently used out.
struct ColumnCache {
    n: usize,
    slots: Vec<f32>,
    slot_of: Vec<u32>,
    owner: Vec<usize>,
    last: Vec<u64>,
    clock: u64,
}

impl ColumnCache {
    fn new(n: usize, cap: usize) -> Self {
        Self {
            n,
            slots: Vec::new(),
            slot_of: vec![u32::MAX; n],
            owner: Vec::with_capacity(cap),
            last: Vec::with_capacity(cap),
            clock: 0,
        }
    }
    fn cap(&self) -> usize {
        self.owner.capacity()
    }
    fn get(&self, j: usize) -> Option<&[f32]> {
        let s = self.slot_of[j];
        (s != u32::MAX).then(|| &self.slots[s as usize * self.n..(s as usize + 1) * self.n])
    }
    fn touch(&mut self, j: usize) {
        let s = self.slot_of[j];
        if s != u32::MAX {
            self.last[s as usize] = self.clock;
        }
    }
    /// A slot for column j: a free one, else the least recently used one not
    /// touched at the current clock.
    fn insert(&mut self, j: usize, col: &[f32]) {
        let n = self.n;
        let s = if self.owner.len() < self.cap() {
            self.owner.push(j);
            self.last.push(self.clock);
            self.slots.extend_from_slice(col);
            self.owner.len() - 1
        } else {
            let s = (0..self.owner.len()).min_by_key(|&s| self.last[s]).expect("cache has slots");
            self.slot_of[self.owner[s]] = u32::MAX;
            self.owner[s] = j;
            self.last[s] = self.clock;
            self.slots[s * n..(s + 1) * n].copy_from_slice(col);
            s
        };
        self.slot_of[j] = s as u32;
    }
}

/// Similarity columns recomputed on demand from unit-norm embeddings, never
/// the n x n matrix: missing columns of a batch are one GEMM (row chunks in
/// parallel) and recent columns are kept in a bounded LRU cache of at most
/// `8 d` columns, so memory stays O(n d) (at most 8x the embeddings).
pub struct OnDemandSource {
    x: Vec<f32>,
    n: usize,
    d: usize,
    kernel: Kernel,
    batch: usize,
    cache: ColumnCache,
}

impl OnDemandSource {
    /// `x` must hold unit-norm rows (see [`crate::kernel::gather_normalized`]).
    pub fn new(x: Vec<f32>, n: usize, d: usize, kernel: Kernel) -> Self {
        const BATCH: usize = 64;
        let cap = (8 * d).max(BATCH).min(n.max(1));
        Self { x, n, d, kernel, batch: BATCH.min(cap), cache: ColumnCache::new(n, cap) }
    }

    /// Columns `js` (`b x n`, row r = column js[r]) by one GEMM in row chunks.
    fn columns(&self, js: &[usize]) -> Vec<f32> {
        let (n, d, kernel) = (self.n, self.d, self.kernel);
        let b = js.len();
        let mut xb = Vec::with_capacity(b * d);
        for &j in js {
            xb.extend_from_slice(&self.x[j * d..(j + 1) * d]);
        }
        // (n x b) blocks per row chunk, then transposed into (b x n)
        let blocks: Vec<Vec<f32>> = (0..n.div_ceil(CHUNK))
            .into_par_iter()
            .map(|ci| {
                let r0 = ci * CHUNK;
                let rows = CHUNK.min(n - r0);
                let mut blk = vec![0f32; rows * b];
                gemm_abt(&self.x[r0 * d..(r0 + rows) * d], rows, &xb, b, d, &mut blk);
                blk
            })
            .collect();
        let mut out = vec![0f32; b * n];
        for (ci, blk) in blocks.iter().enumerate() {
            let r0 = ci * CHUNK;
            for (ii, row) in blk.chunks_exact(b).enumerate() {
                for (r, &v) in row.iter().enumerate() {
                    out[r * n + r0 + ii] = kernel.apply(v);
                }
            }
        }
        for (r, &j) in js.iter().enumerate() {
            out[r * n + j] = kernel.apply(1.0);
        }
        out
    }

    /// Make every column of `js` (at most the cache's size) resident.
    fn ensure(&mut self, js: &[usize]) {
        self.cache.clock += 1;
        for &j in js {
            self.cache.touch(j);
        }
        let missing: Vec<usize> = js.iter().copied().filter(|&j| self.cache.get(j).is_none()).collect();
        if missing.is_empty() {
            return;
        }
        let cols = self.columns(&missing);
        let n = self.n;
        for (r, &j) in missing.iter().enumerate() {
            self.cache.insert(j, &cols[r * n..(r + 1) * n]);
        }
    }
}

impl Source for OnDemandSource {
    fn n(&self) -> usize {
        self.n
    }
    fn batch(&self) -> usize {
        self.batch
    }
    fn batch_min(&self) -> usize {
        // a batch of columns is one GEMM streaming all the embeddings: more
        // columns per batch cost little more than fewer
        self.batch
    }
    fn gains(&mut self, js: &[usize], w: &[f64], c: &[f64], out: &mut [f64]) {
        let step = self.batch.max(1);
        for (jb, ob) in js.chunks(step).zip(out.chunks_mut(step)) {
            self.ensure(jb);
            let cache = &self.cache;
            ob.par_iter_mut().zip(jb.par_iter()).for_each(|(o, &j)| {
                *o = column_gain_fast(cache.get(j).expect("column was just made resident"), w[j], w, c);
            });
        }
    }
    fn cover(&mut self, j: usize, w: &[f64], c: &mut [f64]) {
        self.ensure(&[j]);
        column_cover(self.cache.get(j).expect("column was just made resident"), w[j], c);
    }
    fn initial_bounds(&mut self, w: &[f64], out: &mut [f64]) {
        // Upper bounds on the empty-cover gains `w_j sum_i w_i S_ij`, computed
        // another way than `gains` (so they may differ in the last bits) and
        // padded: any valid bound keeps lazy greedy exact, because a pick is
        // always re-evaluated by `gains` first.
        let (n, d) = (self.n, self.d);
        let sw: f64 = w.iter().sum();
        let pad = |j: usize, v: f64| v.max(0.0) * (1.0 + 1e-5) + 1e-5 * w[j] * sw + 1e-12;
        match self.kernel {
            Kernel::Shift => {
                // sum_i w_i (1 + x_i.x_j)/2 = (sum w + x_j . sum_i w_i x_i) / 2
                let mut m = vec![0f64; d];
                for (i, row) in self.x.chunks_exact(d).enumerate() {
                    for (a, &v) in m.iter_mut().zip(row) {
                        *a += w[i] * v as f64;
                    }
                }
                for (j, o) in out.iter_mut().enumerate() {
                    let row = &self.x[j * d..(j + 1) * d];
                    let dot: f64 = row.iter().zip(&m).map(|(&a, &b)| a as f64 * b).sum();
                    *o = pad(j, w[j] * 0.5 * (sw + dot));
                }
            }
            Kernel::Clip => {
                // one pass over the upper block triangle of S (half the flops
                // of the full matrix, one stripe x stripe block at a time),
                // partial sums reduced in a fixed order
                const B: usize = crate::gram::STRIPE;
                let nb = n.div_ceil(B);
                let pairs: Vec<(usize, usize)> = (0..nb).flat_map(|a| (a..nb).map(move |b| (a, b))).collect();
                let (x, kernel) = (&self.x, self.kernel);
                let parts: Vec<(Vec<f64>, Vec<f64>)> = pairs
                    .par_iter()
                    .map(|&(a, b)| {
                        let (i0, j0) = (a * B, b * B);
                        let (mi, mj) = (B.min(n - i0), B.min(n - j0));
                        let mut blk = vec![0f32; mi * mj];
                        gemm_abt(&x[i0 * d..(i0 + mi) * d], mi, &x[j0 * d..(j0 + mj) * d], mj, d, &mut blk);
                        let mut col = vec![0f64; mj]; // sum_i w_i S_ij for j in block b
                        let mut row = vec![0f64; mi]; // sum_j w_j S_ij for i in block a (a != b)
                        for (ii, r) in blk.chunks_exact(mj).enumerate() {
                            let i = i0 + ii;
                            let mut rs = 0f64;
                            for (jj, &v) in r.iter().enumerate() {
                                let j = j0 + jj;
                                let s = if i == j { kernel.apply(1.0) } else { kernel.apply(v) } as f64;
                                col[jj] += w[i] * s;
                                rs += w[j] * s;
                            }
                            row[ii] = rs;
                        }
                        if a == b {
                            row.clear();
                        }
                        (col, row)
                    })
                    .collect();
                let mut acc = vec![0f64; n];
                for (&(a, b), (col, row)) in pairs.iter().zip(&parts) {
                    for (jj, v) in col.iter().enumerate() {
                        acc[b * B + jj] += v;
                    }
                    for (ii, v) in row.iter().enumerate() {
                        acc[a * B + ii] += v;
                    }
                }
                for (j, o) in out.iter_mut().enumerate() {
                    *o = pad(j, w[j] * acc[j]);
                }
            }
        }
    }
}

/// [`top_k_sum`] for `1 <= k <= 8` and `k <= vals.len()`, without reordering
/// `vals`. For `k <= 4` each of four lanes keeps its four largest values by
/// compare-exchange (no branches, so it vectorises); the 16 survivors and the
/// tail then go through the small insertion below. The k largest values are
/// one multiset however they are found, and they are added in descending
/// order: the same bits.
fn top_k_sum_small(vals: &[f64], k: usize) -> f64 {
    debug_assert!((1..=8).contains(&k) && k <= vals.len());
    let mut top = [f64::NEG_INFINITY; 8];
    let mut insert = |v: f64| {
        if v > top[k - 1] {
            let mut i = k - 1;
            while i > 0 && top[i - 1] < v {
                top[i] = top[i - 1];
                i -= 1;
            }
            top[i] = v;
        }
    };
    let rest = if k <= 4 && vals.len() >= 16 {
        let mut lanes = [[f64::NEG_INFINITY; 4]; 4];
        let ch = vals.chunks_exact(4);
        let rest = ch.remainder();
        for c in ch {
            let mut v = [c[0], c[1], c[2], c[3]];
            for rank in lanes.iter_mut() {
                for l in 0..4 {
                    let (a, b) = (rank[l], v[l]);
                    rank[l] = if b > a { b } else { a };
                    v[l] = if b > a { a } else { b };
                }
            }
        }
        lanes.iter().flatten().for_each(|&v| insert(v));
        rest
    } else {
        vals
    };
    rest.iter().for_each(|&v| insert(v));
    top[..k].iter().sum()
}

/// Sum of the `k` largest values (all of them if fewer), added in
/// descending order so that the result depends only on the values, not on
/// the order they come in.
fn top_k_sum(vals: &mut [f64], k: usize) -> f64 {
    let k = k.min(vals.len());
    if k == 0 {
        return 0.0;
    }
    if k <= 8 {
        return top_k_sum_small(vals, k);
    }
    if vals.len() > k {
        vals.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
    }
    let top = &mut vals[..k];
    top.sort_unstable_by(|a, b| b.total_cmp(a));
    top.iter().sum()
}

/// Whether the certificate is evaluated after `t` picks.
fn certify_at(t: usize, k: usize, n: usize) -> bool {
    n <= 4096 || t == k || t.is_power_of_two() || t == 0
}

/// Heap entry: larger gain first, then lower index. The gain is kept as a
/// u64 whose integer order is the float order (sign flipped for
/// non-negatives, all bits for negatives; -0.0 is taken as +0.0), so heap
/// comparisons are two integer compares.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Entry {
    key: u64,
    /// `usize::MAX - j`: lower indices first among equal gains
    rj: usize,
}

impl Entry {
    #[inline(always)]
    fn new(g: f64, j: usize) -> Self {
        let b = (g + 0.0).to_bits();
        let key = if b >> 63 == 0 { b | (1 << 63) } else { !b };
        Entry { key, rj: usize::MAX - j }
    }
    #[inline(always)]
    fn g(self) -> f64 {
        let b = if self.key >> 63 == 1 { self.key & !(1 << 63) } else { !self.key };
        f64::from_bits(b)
    }
    #[inline(always)]
    fn j(self) -> usize {
        usize::MAX - self.rj
    }
}

/// Greedy maximisation of F over `src` with weights `w`, keeping
/// `min(k, n)` elements. Indices are positions in the source's ground set.
pub fn greedy<S: Source + ?Sized>(src: &mut S, w: &[f64], k: usize, opt: Optimizer) -> FlResult {
    let n = src.n();
    let k = k.min(n);
    let mut res = FlResult::default();
    if n == 0 {
        return res;
    }
    src.prepare(w);
    let mut c = vec![0f64; n];
    let mut chosen = vec![false; n];
    let mut f = 0.0f64;
    let mut ub = f64::INFINITY;
    let mut scratch: Vec<f64> = Vec::with_capacity(n);
    match opt {
        Optimizer::Naive => {
            let mut g = vec![0f64; n];
            let mut js: Vec<usize> = (0..n).collect();
            for t in 0..=k {
                js.retain(|&j| !chosen[j]);
                let mut gj = vec![0f64; js.len()];
                src.gains(&js, w, &c, &mut gj);
                for (&j, &v) in js.iter().zip(&gj) {
                    g[j] = v;
                }
                if certify_at(t, k, n) {
                    scratch.clear();
                    scratch.extend_from_slice(&gj);
                    ub = ub.min(f + top_k_sum(&mut scratch, k));
                }
                if t == k {
                    break;
                }
                // argmax, ties to the lower index (js is ascending)
                let mut best = js[0];
                for &j in &js[1..] {
                    if g[j] > g[best] {
                        best = j;
                    }
                }
                chosen[best] = true;
                f += g[best];
                src.cover(best, w, &mut c);
                res.indices.push(best);
                res.gains.push(g[best]);
            }
        }
        Optimizer::Lazy => {
            let mut init = vec![0f64; n];
            src.initial_bounds(w, &mut init);
            scratch.extend_from_slice(&init);
            ub = ub.min(top_k_sum(&mut scratch, k));
            let mut heap: BinaryHeap<Entry> = init.iter().enumerate().map(|(j, &g)| Entry::new(g, j)).collect();
            // step at which each entry's value was computed exactly; initial
            // bounds count as stale so every pick is evaluated by `gains`.
            let mut fresh = vec![usize::MAX; n];
            // re-evaluate up to the source's batch of stale tops at a time (1
            // for sources where a column is cheap, more where columns are
            // evaluated in parallel), adapted to how many the last step
            // needed: a step that re-evaluated few does not pay for a full
            // batch next time
            let b_max = src.batch().max(1);
            let b_min = src.batch_min().clamp(1, b_max);
            let mut b = b_max;
            let mut stale: Vec<usize> = Vec::with_capacity(b_max);
            let mut keep: Vec<Entry> = Vec::with_capacity(b_max);
            let mut vals = vec![0f64; b_max];
            for t in 0..k {
                if t > 0 && certify_at(t, k, n) {
                    scratch.clear();
                    scratch.extend(heap.iter().map(|e| e.g()));
                    ub = ub.min(f + top_k_sum(&mut scratch, k));
                }
                let mut evals = 0usize;
                loop {
                    let top = *heap.peek().expect("heap holds every unchosen element");
                    if fresh[top.j()] == t {
                        heap.pop();
                        chosen[top.j()] = true;
                        f += top.g();
                        src.cover(top.j(), w, &mut c);
                        res.indices.push(top.j());
                        res.gains.push(top.g());
                        b = (evals / 2).clamp(b_min, b_max);
                        break;
                    }
                    stale.clear();
                    keep.clear();
                    while stale.len() < b {
                        match heap.peek() {
                            Some(e) if fresh[e.j()] != t => {
                                stale.push(e.j());
                                heap.pop();
                            }
                            Some(e) if stale.is_empty() => {
                                keep.push(*e);
                                heap.pop();
                            }
                            _ => break,
                        }
                    }
                    src.gains(&stale, w, &c, &mut vals[..stale.len()]);
                    evals += stale.len();
                    for (&j, &g) in stale.iter().zip(&vals) {
                        fresh[j] = t;
                        heap.push(Entry::new(g, j));
                    }
                    heap.extend(keep.drain(..));
                }
            }
            scratch.clear();
            scratch.extend(heap.iter().map(|e| e.g()));
            ub = ub.min(f + top_k_sum(&mut scratch, k));
        }
    }
    // F(S) from the final cover, not the running sum of gains.
    res.objective = c.iter().zip(w).map(|(&ci, &wi)| wi * ci).sum();
    res.upper_bound = ub.max(res.objective);
    res
}

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

/// The largest of non-negative values, 0.0 for none (eight running maxima,
/// so the loop vectorises; the maximum does not depend on the order).
#[inline(always)]
fn max_nonneg(v: &[f64]) -> f64 {
    let mut m = [0.0f64; 8];
    let ch = v.chunks_exact(8);
    for &x in ch.remainder() {
        m[0] = if x > m[0] { x } else { m[0] };
    }
    for c in ch {
        for l in 0..8 {
            m[l] = if c[l] > m[l] { c[l] } else { m[l] };
        }
    }
    m.iter().fold(0.0, |a, &b| if b > a { b } else { a })
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
}

/// Greedy over a **symmetric** dense `n x n` similarity `s`, evaluating every
/// gain at every step with one sweep over the rows. It returns exactly what
/// [`greedy`] returns with [`Optimizer::Naive`] on `DenseSource::new(s, n)`:
/// the same picks, gains, objective and certificate, to the bit. On small
/// pools this is faster than lazy greedy, whose heap work and stale
/// re-evaluations (often half the pool per step) cost more than the sweep.
pub fn greedy_sweep(s: &[f32], n: usize, w: &[f64], k: usize) -> FlResult {
    greedy_sweep_with(s, n, w, k, &mut SweepScratch::default())
}

/// [`greedy_sweep`] with caller-held buffers.
pub fn greedy_sweep_with(s: &[f32], n: usize, w: &[f64], k: usize, sc: &mut SweepScratch) -> FlResult {
    assert!(s.len() >= n * n && w.len() >= n, "greedy_sweep: buffers too small");
    let unit = w[..n].iter().all(|&v| v == 1.0);
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 is available (checked just above).
            return unsafe {
                if unit {
                    greedy_sweep_avx2::<true>(s, n, w, k, sc)
                } else {
                    greedy_sweep_avx2::<false>(s, n, w, k, sc)
                }
            };
        }
    }
    if unit {
        greedy_sweep_impl::<true>(s, n, w, k, sc)
    } else {
        greedy_sweep_impl::<false>(s, n, w, k, sc)
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
) -> FlResult {
    greedy_sweep_impl::<UNIT>(s, n, w, k, sc)
}

#[inline(always)]
fn greedy_sweep_impl<const UNIT: bool>(s: &[f32], n: usize, w: &[f64], k: usize, sc: &mut SweepScratch) -> FlResult {
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
    let (c, g, chosen, top) = (&mut sc.c, &mut sc.g, &mut sc.chosen, &mut sc.top);
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
        // argmax over the unchosen, ties to the lower index: chosen gains
        // are +0.0 and no gain is below it, so a positive maximum over all
        // columns is first reached by an unchosen one; a zero maximum
        // leaves every unchosen gain at zero, and the first unchosen wins
        let gmax = max_nonneg(g);
        let best = if gmax > 0.0 { g.iter().position(|&v| v == gmax) } else { chosen.iter().position(|&ch| !ch) }
            .expect("an unchosen column remains while t < k <= n");
        chosen[best] = true;
        f += g[best];
        column_cover(&s[best * n..(best + 1) * n], w[best], c);
        res.indices.push(best);
        res.gains.push(g[best]);
    }
    res.objective = c.iter().zip(w).map(|(&ci, &wi)| wi * ci).sum();
    res.upper_bound = ub.max(res.objective);
    res
}

/// Quality weights `q^alpha` for the ground set `u` of pool `pool`, given the
/// pool's qualities (None: all weights 1). Fails where the weights leave
/// float64's room for the gains (see [`check_weights`]).
fn weights_for(pool: usize, q: Option<&[f64]>, u: &[usize], params: &Params) -> Result<Vec<f64>> {
    match q {
        Some(q) if params.alpha > 0.0 => {
            let w: Vec<f64> = u.iter().map(|&i| q[i].powf(params.alpha)).collect();
            check_weights(pool, &w, params)?;
            Ok(w)
        }
        _ => Ok(vec![1.0; u.len()]),
    }
}

/// Every gain, `F` and its certified bound is a sum of at most `m (k + 1)`
/// terms `w_i w_j S_ij <= w_max^2`: the weights are refused when that sum
/// can overflow float64 (inf or NaN gains), or when `w_max^2` is below the
/// normal range (every gain would round to 0 and the picks would follow the
/// row order, not the objective). Only extreme `alpha` or `eps` get there.
fn check_weights(pool: usize, w: &[f64], params: &Params) -> Result<()> {
    let top = w.iter().fold(0.0f64, |a, &v| a.max(v));
    let terms = w.len() as f64 * (params.k.min(w.len()) as f64 + 1.0);
    let (alpha, eps) = (params.alpha, params.eps);
    let problem = if !(top * top * terms).is_finite() {
        format!("gives quality weights q^alpha up to {top:e}, whose gains overflow float64; use a smaller alpha or eps")
    } else if top * top < f64::MIN_POSITIVE {
        format!(
            "gives quality weights q^alpha of at most {top:e}, whose gains underflow float64; \
             use a smaller alpha or a larger eps"
        )
    } else {
        return Ok(());
    };
    let msg = format!("alpha = {} with eps = {} {problem}", short(alpha), short(eps));
    Err(Error::Pool { pool, msg, arg: Some("rewards"), row: None })
}

/// A parameter as people write it: plain between 1e-4 and 1e6, else in
/// scientific notation (`1e308`, not 309 digits).
fn short(v: f64) -> String {
    if v == 0.0 || (1e-4..1e6).contains(&v.abs()) {
        format!("{v}")
    } else {
        format!("{v:e}")
    }
}

/// Check rewards are finite; name the pool, the candidate and its row
/// (`row_of(i)`: the row of the caller's rewards holding candidate `i`).
fn check_rewards(pool: usize, r: &[f64], row_of: &dyn Fn(usize) -> usize) -> Result<()> {
    if let Some((i, &v)) = r.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        return Err(Error::at(
            pool,
            "rewards",
            row_of(i),
            format!("reward of candidate {i} is {v}; rewards must be finite"),
        ));
    }
    Ok(())
}

/// Quality and ground set of one pool (all candidates unless k_max prefilters).
fn ground_set(
    pool: usize,
    row_of: &dyn Fn(usize) -> usize,
    n: usize,
    rewards: Option<&[f64]>,
    params: &Params,
) -> Result<(Option<Vec<f64>>, Vec<usize>)> {
    let q = match rewards {
        Some(r) => {
            check_rewards(pool, r, row_of)?;
            Some(quality(r, params.eps))
        }
        None => None,
    };
    let u = match (params.k_max, &q) {
        (Some(km), Some(q)) => prefilter(q, km),
        _ => (0..n).collect(),
    };
    Ok((q, u))
}

fn need_rewards_error() -> Error {
    Error::Invalid("alpha > 0 or k_max needs rewards; pass rewards or use alpha = 0".into())
}

/// Per-thread buffers for the batched path.
#[derive(Default)]
struct Scratch {
    x: Vec<f32>,
    s: Vec<f32>,
    r: Vec<f64>,
    inv: Vec<f32>,
    sweep: SweepScratch,
}

fn run_pool(
    pools: &Pools<'_>,
    p: usize,
    rewards: Option<&[f64]>,
    params: &Params,
    kernel: Kernel,
    dense_limit: usize,
    sc: &mut Scratch,
) -> Result<FlResult> {
    let n = pools.layout.len(p);
    if n == 0 {
        return Ok(FlResult::default());
    }
    let pool_rewards = match rewards {
        Some(r) => {
            sc.r.clear();
            sc.r.extend((0..n).map(|i| r[pools.layout.row(p, i)]));
            Some(&sc.r[..])
        }
        None => None,
    };
    let (q, u) = ground_set(p, &|i| pools.layout.row(p, i), n, pool_rewards, params)?;
    let m = u.len();
    let d = pools.dim;
    if dense_bytes(m) > dense_limit {
        // too large for its n x n block: similarity columns on demand
        let mut xn = Vec::new();
        gather_normalized(pools, p, &u, &mut xn)?;
        let w = weights_for(p, q.as_deref(), &u, params)?;
        let mut src = OnDemandSource::new(xn, m, d, kernel);
        return Ok(remap(greedy(&mut src, &w, params.k, params.optimizer), &u));
    }
    // the pool's rows straight from the caller's matrix when they are
    // contiguous and all in the ground set; a gathered copy otherwise
    let first = pools.layout.row(p, 0);
    let contiguous = m == n && (0..n).all(|i| pools.layout.row(p, i) == first + i);
    let x: &[f32] = if contiguous {
        &pools.data[first * d..(first + n) * d]
    } else {
        gather_rows(pools, p, &u, &mut sc.x);
        &sc.x
    };
    let name = |i: usize| {
        let row = pools.layout.row(p, u[i]);
        (p, row, format!("candidate {} (row {row})", u[i]))
    };
    // the next pool's rows (when contiguous), prefetched while this one computes
    let next: &[f32] = if p + 1 < pools.layout.n_pools() && pools.layout.len(p + 1) > 0 {
        let (f, len) = (pools.layout.row(p + 1, 0), pools.layout.len(p + 1));
        if pools.layout.row(p + 1, len - 1) == f + len - 1 {
            &pools.data[f * d..(f + len) * d]
        } else {
            &[]
        }
    } else {
        &[]
    };
    cosine_gram(x, m, d, kernel, &mut sc.s, &mut sc.inv, &name, next).map_err(|e| e.in_pool(p))?;
    let w = weights_for(p, q.as_deref(), &u, params)?;
    // the Gram block is exactly symmetric: small pools with a small K take
    // the sweep, which gives what naive (and so lazy) greedy gives
    let mut res = if use_sweep(m, params.k) {
        greedy_sweep_with(&sc.s, m, &w, params.k, &mut sc.sweep)
    } else {
        let mut src = DenseSource::new(&sc.s, m);
        greedy(&mut src, &w, params.k, params.optimizer)
    };
    for i in res.indices.iter_mut() {
        *i = u[*i];
    }
    Ok(res)
}

/// Bytes of the n x n float32 similarity block of a pool of `n` candidates.
pub fn dense_bytes(n: usize) -> usize {
    n.saturating_mul(n).saturating_mul(std::mem::size_of::<f32>())
}

/// A pool whose n x n similarity block would take more bytes than this (2 GiB,
/// n > 23,170) is solved with similarity columns recomputed on demand.
pub const DENSE_LIMIT_BYTES: usize = 2 << 30;

/// Facility location on every pool of a ragged batch, in parallel over pools.
/// `rewards`, when given, is indexed by matrix row (like the embeddings).
/// Pools above [`DENSE_LIMIT_BYTES`] run on demand, as in
/// [`facility_location_batch_within`].
pub fn facility_location_batch(
    pools: &Pools<'_>,
    rewards: Option<&[f64]>,
    params: &Params,
    kernel: Kernel,
) -> Result<Vec<FlResult>> {
    facility_location_batch_within(pools, rewards, params, kernel, DENSE_LIMIT_BYTES)
}

/// [`facility_location_batch`] holding a pool's n x n similarity block only
/// while it takes at most `dense_limit` bytes; a larger pool (its ground set,
/// after `k_max`) runs with similarity columns recomputed on demand (memory
/// O(n d), as [`facility_location_on_demand`]).
pub fn facility_location_batch_within(
    pools: &Pools<'_>,
    rewards: Option<&[f64]>,
    params: &Params,
    kernel: Kernel,
    dense_limit: usize,
) -> Result<Vec<FlResult>> {
    params.validate()?;
    if params.needs_rewards() && rewards.is_none() {
        return Err(need_rewards_error());
    }
    if let Some(r) = rewards {
        if r.len() != pools.layout.n_rows() {
            return invalid(format!(
                "rewards has {} entries but embeddings have {} rows",
                r.len(),
                pools.layout.n_rows()
            ));
        }
    }
    let out: Vec<Result<FlResult>> = (0..pools.layout.n_pools())
        .into_par_iter()
        .map_init(Scratch::default, |sc, p| run_pool(pools, p, rewards, params, kernel, dense_limit, sc))
        .collect();
    // the first failing pool, deterministically
    out.into_iter().collect()
}

/// Ground set and weights of a single pool.
type Setup = (Option<Vec<f64>>, Vec<usize>, Vec<f64>);

fn single_pool_setup(n: usize, rewards: Option<&[f64]>, params: &Params) -> Result<Setup> {
    params.validate()?;
    if params.needs_rewards() && rewards.is_none() {
        return Err(need_rewards_error());
    }
    if let Some(r) = rewards {
        if r.len() != n {
            return invalid(format!("rewards has {} entries but the pool has {} candidates", r.len(), n));
        }
    }
    let (q, u) = ground_set(0, &|i| i, n, rewards, params)?;
    let w = weights_for(0, q.as_deref(), &u, params)?;
    Ok((q, u, w))
}

fn remap(mut res: FlResult, u: &[usize]) -> FlResult {
    for i in res.indices.iter_mut() {
        *i = u[*i];
    }
    res
}

/// Facility location on one pool with a precomputed dense similarity
/// (row-major `n x n`, values in [0, 1]; need not be symmetric).
pub fn facility_location_dense(sim: &[f32], n: usize, rewards: Option<&[f64]>, params: &Params) -> Result<FlResult> {
    if sim.len() != n * n {
        return invalid(format!("similarity has {} entries, expected n * n = {}", sim.len(), n * n));
    }
    // the first bad entry in row-major order (rows checked in parallel)
    let bad = |v: f32| !v.is_finite() || !(0.0..=1.0).contains(&v);
    let first_bad = sim
        .par_chunks(n.max(1))
        .enumerate()
        .find_first(|(_, row)| row.iter().any(|&v| bad(v)))
        .map(|(i, row)| (i, row.iter().position(|&v| bad(v)).unwrap_or(0)));
    if let Some((i, j)) = first_bad {
        return invalid(format!(
            "similarity[{i}, {j}] = {} is outside [0, 1]; map cosines with kernel='clip' or 'shift' first",
            sim[i * n + j]
        ));
    }
    let (_, u, w) = single_pool_setup(n, rewards, params)?;
    let m = u.len();
    // column-major copy of the ground-set block: col j holds S_ij, i in U;
    // in parallel over columns, 64 at a time (so the row-major reads of a
    // tile share cache lines)
    let mut cols = try_zeroed::<f32>(m * m, None, "the similarity block")?;
    const T: usize = 64;
    cols.par_chunks_mut(T * m.max(1)).enumerate().for_each(|(b, block)| {
        let j0 = b * T;
        let nj = block.len() / m.max(1);
        for i0 in (0..m).step_by(T) {
            for (ii, &i) in u[i0..(i0 + T).min(m)].iter().enumerate() {
                let row = &sim[i * n..(i + 1) * n];
                for jj in 0..nj {
                    block[jj * m + i0 + ii] = row[u[j0 + jj]];
                }
            }
        }
    });
    let mut src = DenseSource::new(&cols, m);
    Ok(remap(greedy(&mut src, &w, params.k, params.optimizer), &u))
}

/// Facility location on one pool with a sparse similarity graph. With
/// `symmetric` (the caller promises S = S^T, as for a symmetrised kNN graph)
/// rows serve as columns and the graph is used in place; otherwise it is
/// transposed once (memory O(nnz)).
pub fn facility_location_sparse<P: Idx, I: Idx>(
    graph: &CsrRef<'_, P, I>,
    symmetric: bool,
    rewards: Option<&[f64]>,
    params: &Params,
) -> Result<FlResult> {
    let n = graph.n;
    let (_, u, w) = single_pool_setup(n, rewards, params)?;
    if u.len() == n {
        if symmetric {
            let mut src = SparseSource { cols: *graph };
            return Ok(greedy(&mut src, &w, params.k, params.optimizer));
        }
        let cols = graph.transpose();
        let mut src = SparseSource { cols: cols.as_ref() };
        return Ok(greedy(&mut src, &w, params.k, params.optimizer));
    }
    // restrict to the ground set, renumbered 0..m
    let mut pos = vec![u32::MAX; n];
    for (k, &i) in u.iter().enumerate() {
        pos[i] = k as u32;
    }
    let mut indptr = vec![0usize];
    let mut indices = Vec::new();
    let mut data = Vec::new();
    for &i in &u {
        for e in graph.row(i) {
            let j = graph.indices[e].ix();
            if pos[j] != u32::MAX {
                indices.push(pos[j]);
                data.push(graph.data[e]);
            }
        }
        indptr.push(indices.len());
    }
    let sub = Csr { n: u.len(), indptr, indices, data };
    let cols = if symmetric { sub } else { sub.transpose() };
    let mut src = SparseSource { cols: cols.as_ref() };
    Ok(remap(greedy(&mut src, &w, params.k, params.optimizer), &u))
}

/// Facility location on one large pool of embeddings without ever holding the
/// n x n similarity: columns are recomputed on demand (memory O(n d)).
pub fn facility_location_on_demand(
    x: &[f32],
    n: usize,
    d: usize,
    rewards: Option<&[f64]>,
    params: &Params,
    kernel: Kernel,
) -> Result<FlResult> {
    if d == 0 || x.len() != n * d {
        return invalid(format!("embeddings have {} floats, expected n * d = {} * {}", x.len(), n, d));
    }
    let (_, u, w) = single_pool_setup(n, rewards, params)?;
    let offsets = [0u64, n as u64];
    let layout = crate::pools::Layout::single(&offsets);
    let pools = Pools { data: x, dim: d, layout };
    let mut xn = Vec::new();
    gather_normalized(&pools, 0, &u, &mut xn)?;
    let mut src = OnDemandSource::new(xn, u.len(), d, kernel);
    Ok(remap(greedy(&mut src, &w, params.k, params.optimizer), &u))
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

#[cfg(test)]
mod tests {
    use super::top_k_sum;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn column_gain_avx2_has_the_portable_bits(
            n in 0usize..100,
            seed in 0u64..1000,
            wj in 0.0f64..2.0,
        ) {
            let r = |t: usize| ((t as u64 + 1).wrapping_mul(6364136223846793005).wrapping_add(seed) >> 40) as f64 / (1u64 << 24) as f64;
            let col: Vec<f32> = (0..n).map(|i| r(3 * i) as f32).collect();
            let w: Vec<f64> = (0..n).map(|i| 0.1 + r(3 * i + 1)).collect();
            let c: Vec<f64> = (0..n).map(|i| r(3 * i + 2) * 0.8).collect();
            let ones = vec![1.0; n];
            for (w, wj) in [(&w, wj), (&ones, 1.0)] {
                let a = super::column_gain_w::<false>(&col, wj, w, &c);
                let u = super::column_gain_w::<true>(&col, 1.0, &ones, &c);
                #[cfg(target_arch = "x86_64")]
                if std::is_x86_feature_detected!("avx2") {
                    // SAFETY: AVX2 is available (checked just above).
                    let b = unsafe { super::column_gain_avx2::<false>(&col, wj, w, &c) };
                    prop_assert_eq!(a.to_bits(), b.to_bits());
                    let v = unsafe { super::column_gain_avx2::<true>(&col, 1.0, &ones, &c) };
                    prop_assert_eq!(u.to_bits(), v.to_bits());
                }
                if wj == 1.0 {
                    // the unit variant is the weighted one with weights 1
                    prop_assert_eq!(a.to_bits(), u.to_bits());
                }
            }
        }

        #[test]
        fn top_k_sum_is_the_sum_of_the_k_largest_in_descending_order(
            vals in proptest::collection::vec(prop_oneof![0.0f64..10.0, Just(1.5), Just(0.0)], 0..80),
            k in 0usize..20,
        ) {
            let mut sorted = vals.clone();
            sorted.sort_unstable_by(|a, b| b.total_cmp(a));
            // (+0.0: an empty f64 sum is -0.0)
            let want: f64 = sorted.iter().take(k).sum::<f64>() + 0.0;
            let mut v = vals.clone();
            // same bits: the same values added in the same (descending) order
            prop_assert_eq!((top_k_sum(&mut v, k) + 0.0).to_bits(), want.to_bits());
        }
    }
}
