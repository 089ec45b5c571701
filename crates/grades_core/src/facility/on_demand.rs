//! Similarity columns recomputed on demand from embeddings (memory O(n d)),
//! the recent ones kept in a bounded LRU cache; after each pick, the drop of
//! every gain from the rows the pick covered better (lazy greedy's bounds
//! lowered by it, so few gains are recomputed).

use rayon::prelude::*;

use super::column::{column_cover, column_gain_fast};
use super::source::Source;
use crate::gram::{gemm_abt, gemm_abt_raw};
use crate::kernel::Kernel;

/// Rows per chunk when a column block is computed in parallel.
const CHUNK: usize = 512;
/// Block pairs whose partial sums are held at once by the initial bounds.
const GROUP: usize = 256;

/// `dst[t] += wi * min(max(wj[t] * s[t] - lo, 0), rise)` for every `t`: one
/// row's terms of the gains' drops, along its stretch of columns. Compiled
/// for AVX2 where the CPU has it (lane-wise, no fused multiply-add: the same
/// bits).
fn add_drop_row(dst: &mut [f64], s: &[f32], wj: &[f64], lo: f64, rise: f64, wi: f64) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 is available (checked just above).
            return unsafe { add_drop_row_avx2(dst, s, wj, lo, rise, wi) };
        }
    }
    add_drop_row_impl(dst, s, wj, lo, rise, wi)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn add_drop_row_avx2(dst: &mut [f64], s: &[f32], wj: &[f64], lo: f64, rise: f64, wi: f64) {
    add_drop_row_impl(dst, s, wj, lo, rise, wi)
}

#[inline(always)]
fn add_drop_row_impl(dst: &mut [f64], s: &[f32], wj: &[f64], lo: f64, rise: f64, wi: f64) {
    for ((d, &sv), &wjv) in dst.iter_mut().zip(s).zip(wj) {
        let v = (wjv * sv as f64 - lo).max(0.0).min(rise);
        *d += wi * v;
    }
}

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
/// `8 d` columns, so memory stays O(n d) (at most 8x the embeddings), and
/// within a byte budget where one is given ([`OnDemandSource::within`]).
pub struct OnDemandSource {
    x: Vec<f32>,
    n: usize,
    d: usize,
    kernel: Kernel,
    batch: usize,
    /// rows of S per block when the gains' drops are computed: a larger
    /// GEMM than a batch of gains, from the budget the cache leaves
    drop_batch: usize,
    cache: ColumnCache,
    /// the columns of the last batch computed, reused by the next
    scratch: Vec<f32>,
}

/// The start of a column batch being written by parallel tasks, each at its
/// own rows (a method, so closures take the whole wrapper, which is `Sync`).
struct Dst(*mut f32);
// SAFETY: tasks write disjoint regions through it (see `columns_into`).
unsafe impl Sync for Dst {}
impl Dst {
    /// # Safety
    /// `off` lies within the buffer.
    unsafe fn at(&self, off: usize) -> *mut f32 {
        self.0.add(off)
    }
}

impl OnDemandSource {
    /// `x` must hold unit-norm rows (see [`crate::kernel::gather_normalized`]).
    pub fn new(x: Vec<f32>, n: usize, d: usize, kernel: Kernel) -> Self {
        Self::within(x, n, d, kernel, usize::MAX)
    }

    /// [`OnDemandSource::new`] whose columns (the cache, and room for two
    /// batches beside it) take at most about `bytes`: fewer cached columns
    /// and smaller batches under a small budget, never fewer than one column
    /// in the cache and a batch of one. The picks do not depend on it.
    pub fn within(x: Vec<f32>, n: usize, d: usize, kernel: Kernel, bytes: usize) -> Self {
        const BATCH: usize = 64;
        let cols = bytes / (4 * n.max(1)); // columns the budget holds in all
        let batch = (cols / 4).clamp(1, BATCH);
        let cap = cols.saturating_sub(2 * batch).clamp(batch, (8 * d).max(BATCH)).min(n.max(1));
        let batch = batch.min(cap);
        // the drops' blocks take the batch buffer; half of what the cache
        // leaves, up to 4 batches (a GEMM of 64 rows packs the embeddings
        // for too few of them)
        let drop_batch = (cols.saturating_sub(cap) / 2).clamp(batch, 4 * BATCH);
        Self { x, n, d, kernel, batch, drop_batch, cache: ColumnCache::new(n, cap), scratch: Vec::new() }
    }

    /// Columns `js` into `out` (`b x n`, row r = column js[r]; grown as
    /// needed and reused call after call, so it is not cleared again): one
    /// GEMM per chunk of rows, in parallel, each writing its rows' segment of
    /// every column straight into place (`x_js x_chunk^T` at row stride n).
    fn columns_into(&self, js: &[usize], out: &mut Vec<f32>) {
        let (n, d, kernel) = (self.n, self.d, self.kernel);
        let b = js.len();
        let mut xb = Vec::with_capacity(b * d);
        for &j in js {
            xb.extend_from_slice(&self.x[j * d..(j + 1) * d]);
        }
        if out.len() < b * n {
            out.resize(b * n, 0.0);
        }
        let dst = Dst(out.as_mut_ptr());
        (0..n.div_ceil(CHUNK)).into_par_iter().for_each(|ci| {
            let r0 = ci * CHUNK;
            let rows = CHUNK.min(n - r0);
            // SAFETY: `out` holds b x n floats; this task alone writes columns
            // r0..r0 + rows of every one of its b rows, and nothing reads
            // them before the parallel loop ends.
            unsafe {
                let p = dst.at(r0);
                gemm_abt_raw(&xb, b, &self.x[r0 * d..(r0 + rows) * d], rows, d, p, n);
                for r in 0..b {
                    kernel.apply_all(std::slice::from_raw_parts_mut(p.add(r * n), rows));
                }
            }
        });
        for (r, &j) in js.iter().enumerate() {
            out[r * n + j] = kernel.apply(1.0);
        }
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
        let mut cols = std::mem::take(&mut self.scratch);
        self.columns_into(&missing, &mut cols);
        let n = self.n;
        for (r, &j) in missing.iter().enumerate() {
            self.cache.insert(j, &cols[r * n..(r + 1) * n]);
        }
        self.scratch = cols;
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
    fn tracks_drops(&self) -> bool {
        true
    }
    fn gain_drops(&mut self, rows: &[usize], old: &[f64], c: &[f64], w: &[f64], drop: &mut [f64]) -> bool {
        // S is symmetric: the rows `rows` of S are the columns `rows`, a batch
        // at a time in the batch buffer (the same memory as a batch of gains)
        let n = self.n;
        drop[..n].iter_mut().for_each(|v| *v = 0.0);
        let mut blk = std::mem::take(&mut self.scratch);
        let mut w_rows = 0.0f64;
        for chunk in rows.chunks(self.drop_batch.max(1)) {
            self.columns_into(chunk, &mut blk);
            let (blk, m) = (&blk[..], chunk.len());
            w_rows += chunk.iter().map(|&i| w[i]).sum::<f64>();
            drop[..n].par_chunks_mut(CHUNK).enumerate().for_each(|(ci, dj)| {
                let j0 = ci * CHUNK;
                let wj = &w[j0..j0 + dj.len()];
                // row by row, each along its contiguous stretch of columns
                for (r, &i) in chunk.iter().enumerate().take(m) {
                    add_drop_row(dj, &blk[r * n + j0..r * n + j0 + dj.len()], wj, old[i], c[i] - old[i], w[i]);
                }
            });
        }
        self.scratch = blk;
        // the gains' columns are the same dot products in another operand
        // order: each S_ij may differ from the gains' by the rounding of a
        // d-term float32 sum, each term of a drop by w_i w_j times that
        let delta = 1e-7 * (self.d as f64 + 16.0);
        for (j, v) in drop[..n].iter_mut().enumerate() {
            *v = (*v * (1.0 - 1e-9) - delta * w[j] * w_rows).max(0.0);
        }
        true
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
                let mut acc = vec![0f64; n];
                // a group of block pairs at a time: the partial sums held at
                // once stay a few MB, however many pairs there are
                for group in pairs.chunks(GROUP) {
                    let parts: Vec<(Vec<f64>, Vec<f64>)> = group
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
                    for (&(a, b), (col, row)) in group.iter().zip(&parts) {
                        for (jj, v) in col.iter().enumerate() {
                            acc[b * B + jj] += v;
                        }
                        for (ii, v) in row.iter().enumerate() {
                            acc[a * B + ii] += v;
                        }
                    }
                }
                for (j, o) in out.iter_mut().enumerate() {
                    *o = pad(j, w[j] * acc[j]);
                }
            }
        }
    }
}
