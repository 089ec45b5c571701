//! Similarity: cosine mapped into [0, 1], as dense Gram blocks (GEMM) or a
//! sparse CSR graph.
//!
//! The facility-location objective needs `S_ij` in `[0, 1]`. Cosine `c` lies in
//! `[-1, 1]`; the [`Kernel`] says how it is mapped:
//! * [`Kernel::Clip`]: `max(0, c)` (negative similarity counts as none);
//! * [`Kernel::Shift`]: `(1 + c) / 2` (the paper's code uses this).

use crate::error::{invalid, try_zeroed, Error, Result};
use crate::pools::Pools;

/// How a cosine in [-1, 1] becomes a similarity in [0, 1].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// `max(0, c)`
    Clip,
    /// `(1 + c) / 2`
    Shift,
}

impl Kernel {
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "clip" => Ok(Kernel::Clip),
            "shift" => Ok(Kernel::Shift),
            other => invalid(format!("kernel must be 'clip' or 'shift', got {other:?}")),
        }
    }

    /// Map a cosine to a similarity in [0, 1] (the cosine is clamped to
    /// [-1, 1] first so rounding never leaves the range).
    #[inline(always)]
    pub fn apply(self, c: f32) -> f32 {
        let c = c.clamp(-1.0, 1.0);
        match self {
            Kernel::Clip => c.max(0.0),
            Kernel::Shift => 0.5 * (1.0 + c),
        }
    }

    /// [`Kernel::apply`] to every value of `v`, one loop per kernel (so each
    /// vectorises with no branch inside): the same values.
    pub fn apply_all(self, v: &mut [f32]) {
        match self {
            Kernel::Clip => v.iter_mut().for_each(|x| *x = Kernel::Clip.apply(*x)),
            Kernel::Shift => v.iter_mut().for_each(|x| *x = Kernel::Shift.apply(*x)),
        }
    }
}

/// Names row `i` of a block in errors: (pool, row of the caller's matrix,
/// a description such as "candidate 3 (row 17)").
pub type RowName<'a> = dyn Fn(usize) -> (usize, usize, String) + 'a;

/// Copy the rows of the candidates `which` of pool `p` into `out`
/// (row-major, `which.len() x dim`), each scaled to unit norm. Fails as
/// [`normalize_rows`] does, naming the pool and candidate.
pub fn gather_normalized(pools: &Pools<'_>, p: usize, which: &[usize], out: &mut Vec<f32>) -> Result<()> {
    gather_rows(pools, p, which, out);
    let name = |k: usize| {
        let row = pools.layout.row(p, which[k]);
        (p, row, format!("candidate {} (row {row})", which[k]))
    };
    normalize_rows(out, which.len(), pools.dim, &name)
}

/// Scale the `n` rows of `x` (`n x d`, row-major) to unit norm in place:
/// each norm in f64, then the row times `1 / norm` as a float32 (or, for a
/// norm whose inverse is not a normal float32, very small or very large
/// rows, times the f64 inverse before rounding: every finite row with a
/// nonzero norm gets its direction). Fails, before changing anything, on the
/// first row (in order) that holds a non-finite value or has zero norm,
/// naming it by `name(i)` (pool, row, description). Rows are done in
/// parallel when there are many; the result does not depend on it.
pub fn normalize_rows(x: &mut [f32], n: usize, d: usize, name: &RowName<'_>) -> Result<()> {
    use rayon::prelude::*;
    let x = &mut x[..n * d];
    let ss_of = |row: &[f32]| row.iter().map(|&v| v as f64 * v as f64).sum::<f64>();
    // (no d = 0 chunks: every row then has norm 0)
    let par = n * d >= 1 << 16;
    let ss: Vec<f64> = match d {
        0 => vec![0.0; n],
        _ if par => x.par_chunks(d).map(ss_of).collect(),
        _ => x.chunks(d).map(ss_of).collect(),
    };
    if let Some(i) = (0..n).position(|i| !(ss[i].is_finite() && ss[i] > 0.0)) {
        let row = &x[i * d..(i + 1) * d];
        let (pool, at, what) = name(i);
        if let Some(v) = row.iter().find(|v| !v.is_finite()) {
            return Err(Error::at(pool, "embeddings", at, format!("embedding of {what} holds a non-finite value {v}")));
        }
        return Err(Error::at(
            pool,
            "embeddings",
            at,
            format!("embedding of {what} has zero norm; cosine similarity is undefined"),
        ));
    }
    let scale = |(row, &ss): (&mut [f32], &f64)| {
        let inv = 1.0 / ss.sqrt();
        if (inv as f32).is_normal() {
            let inv = inv as f32;
            row.iter_mut().for_each(|v| *v *= inv);
        } else {
            row.iter_mut().for_each(|v| *v = (*v as f64 * inv) as f32);
        }
    };
    match d {
        0 => {}
        _ if par => x.par_chunks_mut(d).zip(&ss).for_each(scale),
        _ => x.chunks_mut(d).zip(&ss).for_each(scale),
    }
    Ok(())
}

/// Gather the raw rows of the candidates `which` of pool `p` into `out`
/// (row-major), without normalising.
pub fn gather_rows(pools: &Pools<'_>, p: usize, which: &[usize], out: &mut Vec<f32>) {
    let d = pools.dim;
    out.clear();
    out.reserve(which.len() * d);
    for &i in which {
        pools.extend_row(pools.layout.row(p, i), out);
    }
}

/// Cosine similarity block of raw rows `x` (`n x d`, any norms) mapped by
/// `kernel`: one GEMM on the raw rows, norms read off the Gram diagonal, then
/// one fused scale + kernel pass. The block is symmetric to the bit.
/// The block is the first `n * n` entries of `out` (row-major); a reused
/// `out` may be longer, and is never made shorter.
/// `name(i)` names row i in errors (pool, row, description).
/// `next` is memory the caller reads next, prefetched while the product
/// computes (a hint; may be empty). Fails on a non-finite value or a
/// zero-norm row. A row whose squared norm is not a normal float32 (too
/// small or too large for the raw product) sends the block through
/// [`normalize_rows`] first: the cosines of any finite, nonzero rows.
#[allow(clippy::too_many_arguments)] // scratch buffers and hints, all positional in the hot path
pub fn cosine_gram(
    x: &[f32],
    n: usize,
    d: usize,
    kernel: Kernel,
    out: &mut Vec<f32>,
    inv: &mut Vec<f32>,
    name: &RowName<'_>,
    next: &[u8],
) -> Result<()> {
    cosine_gram_with(x, n, d, kernel, out, inv, name, next, None)
}

/// [`cosine_gram`]; with `sums` (weights `w` and a vector), a block computed
/// in stripes (more than [`STRIPE`](crate::gram::STRIPE) rows) also leaves
/// `sum_i w_i S_ij` for every column `j` in the vector (see
/// [`crate::gram::syrk_large`]), and a smaller block leaves it empty.
#[allow(clippy::too_many_arguments)] // cosine_gram's, and the sums
pub fn cosine_gram_with(
    x: &[f32],
    n: usize,
    d: usize,
    kernel: Kernel,
    out: &mut Vec<f32>,
    inv: &mut Vec<f32>,
    name: &RowName<'_>,
    next: &[u8],
    mut sums: Option<(&[f64], &mut Vec<f64>)>,
) -> Result<()> {
    // every entry is written below: a reused buffer is neither cleared nor
    // cut (a smaller block uses its start; cutting it would have the next
    // larger one zero the rest again)
    block_for(out, n)?;
    if let Some((_, dst)) = &mut sums {
        dst.clear();
    }
    if n > crate::gram::STRIPE {
        return cosine_gram_large(x, n, d, kernel, out, name, sums);
    }
    crate::gram::syrk(x, n, d, out, next);
    inv.clear();
    for i in 0..n {
        let g = out[i * n + i];
        if !g.is_normal() {
            // slow path: a bad row is named; a norm outside the raw
            // product's range is scaled away (cosines do not depend on it)
            return cosine_gram_large(x, n, d, kernel, out, name, sums);
        }
        inv.push(1.0 / g.sqrt());
    }
    scale_block_dispatch(out, n, inv, kernel);
    Ok(())
}

/// `out[i][j] = kernel(out[i][j] inv_i inv_j)`, diagonal `kernel(1)`: the
/// dot products of a Gram block turned into similarities. `inv_i * inv_j`
/// is formed first, so a symmetric block stays symmetric to the bit.
#[inline(always)]
fn scale_block(out: &mut [f32], n: usize, inv: &[f32], kernel: Kernel) {
    // one loop per kernel, so each vectorises without a branch inside
    match kernel {
        Kernel::Clip => scale_rows(out, n, inv, |c| Kernel::Clip.apply(c)),
        Kernel::Shift => scale_rows(out, n, inv, |c| Kernel::Shift.apply(c)),
    }
}

#[inline(always)]
fn scale_rows<F: Fn(f32) -> f32>(out: &mut [f32], n: usize, inv: &[f32], f: F) {
    let one = f(1.0);
    for (i, row) in out[..n * n].chunks_exact_mut(n).enumerate() {
        let a = inv[i];
        for (v, &b) in row.iter_mut().zip(inv.iter()) {
            *v = f(*v * (a * b));
        }
        row[i] = one;
    }
}

/// [`scale_block`] compiled for AVX2 (the same lane-wise operations: the
/// same bits).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn scale_block_avx2(out: &mut [f32], n: usize, inv: &[f32], kernel: Kernel) {
    scale_block(out, n, inv, kernel)
}

fn scale_block_dispatch(out: &mut [f32], n: usize, inv: &[f32], kernel: Kernel) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 is available (checked just above).
            return unsafe { scale_block_avx2(out, n, inv, kernel) };
        }
    }
    scale_block(out, n, inv, kernel)
}

/// [`cosine_gram`] for a large block: rows scaled to unit norm first (the
/// embeddings are small next to the block), then one pass that computes the
/// cosines and maps them while each block is in cache; no scaling pass over
/// the n x n result.
fn cosine_gram_large(
    x: &[f32],
    n: usize,
    d: usize,
    kernel: Kernel,
    out: &mut [f32],
    name: &RowName<'_>,
    sums: Option<(&[f64], &mut Vec<f64>)>,
) -> Result<()> {
    let mut xn = x[..n * d].to_vec();
    normalize_rows(&mut xn, n, d, name)?;
    let w = sums.as_ref().map(|(w, _)| *w);
    // one closure per kernel, so the map over each block vectorises with no branch inside
    let got = match kernel {
        Kernel::Clip => crate::gram::syrk_large(&xn, n, d, out, |c| Kernel::Clip.apply(c), w),
        Kernel::Shift => crate::gram::syrk_large(&xn, n, d, out, |c| Kernel::Shift.apply(c), w),
    };
    let one = kernel.apply(1.0);
    for i in 0..n {
        out[i * n + i] = one;
    }
    if let Some((w, dst)) = sums {
        // the diagonal's own term
        dst.clear();
        dst.extend(got.iter().zip(w).map(|(&v, &wj)| v + wj * one as f64));
    }
    Ok(())
}

/// Make `out` hold at least an `n x n` block: kept as it is when it does
/// (never cut, never cleared), else replaced by a fresh zeroed one,
/// allocated fallibly: a failure is an error, not an abort.
fn block_for(out: &mut Vec<f32>, n: usize) -> Result<()> {
    if out.len() >= n * n {
        return Ok(());
    }
    *out = Vec::new(); // (the old block freed before the new one is made)
    *out = try_zeroed(n * n, None, &format!("the {n} x {n} similarity block"))?;
    advise_huge_pages(out);
    Ok(())
}

/// Ask for transparent huge pages over a fresh, not yet written buffer of
/// 8 MiB or more (a hint; ignored where unsupported): an n x n block then
/// takes far fewer page faults and TLB misses.
fn advise_huge_pages(buf: &mut [f32]) {
    #[cfg(target_os = "linux")]
    {
        const PAGE: usize = 4096;
        let start = buf.as_mut_ptr() as usize;
        let end = start + std::mem::size_of_val(buf);
        let (a, e) = (start.div_ceil(PAGE) * PAGE, end / PAGE * PAGE);
        if e >= a + (8 << 20) {
            // SAFETY: [a, e) is page aligned and lies inside `buf`; madvise
            // only changes how the kernel backs those pages (errors ignored).
            unsafe { libc::madvise(a as *mut libc::c_void, e - a, libc::MADV_HUGEPAGE) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = buf;
}

/// An integer type usable as a CSR index (int32 or int64 from NumPy/scipy,
/// or the core's own u32/usize).
pub trait Idx: Copy + Send + Sync + 'static {
    fn ix(self) -> usize;
    /// Whether the value is a valid index below `n` (non-negative too).
    fn below(self, n: usize) -> bool;
    fn show(self) -> i128;
}
macro_rules! idx_signed {
    ($($t:ty),*) => {$(impl Idx for $t {
        #[inline(always)] fn ix(self) -> usize { self as usize }
        #[inline(always)] fn below(self, n: usize) -> bool { self >= 0 && (self as u64) < n as u64 }
        fn show(self) -> i128 { self as i128 }
    })*};
}
macro_rules! idx_unsigned {
    ($($t:ty),*) => {$(impl Idx for $t {
        #[inline(always)] fn ix(self) -> usize { self as usize }
        #[inline(always)] fn below(self, n: usize) -> bool { (self as u64) < n as u64 }
        fn show(self) -> i128 { self as i128 }
    })*};
}
idx_signed!(i32, i64);
idx_unsigned!(u32, usize);

/// A borrowed, validated sparse similarity graph in compressed-sparse-row
/// form: row `i` lists the `j` with a stored `S_ij` (absent entries are 0).
/// Validation reads the caller's arrays in place; nothing is copied.
#[derive(Debug, Clone, Copy)]
pub struct CsrRef<'a, P: Idx, I: Idx> {
    pub n: usize,
    pub indptr: &'a [P],
    pub indices: &'a [I],
    pub data: &'a [f32],
}

impl<'a, P: Idx, I: Idx> CsrRef<'a, P, I> {
    /// Validate: indptr has n + 1 non-decreasing entries from 0 to nnz,
    /// indices are in [0, n), values are finite and in [0, 1] (map cosines
    /// with a [`Kernel`] first), and no (i, j) is stored twice (gains and the
    /// objective would otherwise combine the copies differently).
    pub fn new(n: usize, indptr: &'a [P], indices: &'a [I], data: &'a [f32]) -> Result<Self> {
        if indptr.len() != n + 1 {
            return invalid(format!("indptr has {} entries, expected n + 1 = {}", indptr.len(), n + 1));
        }
        if n > u32::MAX as usize {
            return invalid(format!("a sparse pool holds at most {} candidates, got {n}", u32::MAX));
        }
        if indptr[0].show() != 0 {
            return invalid(format!("indptr must start at 0, got {}", indptr[0].show()));
        }
        if indices.len() != data.len() {
            return invalid(format!("indices ({}) and data ({}) must have the same length", indices.len(), data.len()));
        }
        for (i, w) in indptr.windows(2).enumerate() {
            if w[1].show() < w[0].show() {
                return invalid(format!("indptr decreases at row {i}: {} > {}", w[0].show(), w[1].show()));
            }
        }
        let nnz = indptr[n].show();
        if nnz != indices.len() as i128 {
            return invalid(format!("indptr ends at {nnz} but there are {} stored entries", indices.len()));
        }
        if let Some((e, j)) = indices.iter().enumerate().find(|(_, j)| !j.below(n)) {
            return invalid(format!("indices[{e}] = {} is out of range for n = {n}", j.show()));
        }
        if let Some((e, v)) = data.iter().enumerate().find(|(_, v)| !(v.is_finite() && (0.0..=1.0).contains(*v))) {
            return invalid(format!(
                "similarity data[{e}] = {v} is outside [0, 1]; map cosines with kernel='clip' or 'shift' first"
            ));
        }
        let g = Self { n, indptr, indices, data };
        // one value per (i, j): last_row[j] = 1 + the last row that stored j
        let mut last_row = try_zeroed::<u32>(n, None, "the duplicate-entry check")?;
        for i in 0..n {
            for e in g.row(i) {
                let j = indices[e].ix();
                if last_row[j] == i as u32 + 1 {
                    return invalid(format!(
                        "similarity stores entry ({i}, {j}) more than once (again at indices[{e}]); \
                         keep one value per (i, j)"
                    ));
                }
                last_row[j] = i as u32 + 1;
            }
        }
        Ok(g)
    }

    pub fn nnz(&self) -> usize {
        self.indices.len()
    }

    /// Entries of row `i`: positions into `indices`/`data`.
    #[inline(always)]
    pub fn row(&self, i: usize) -> std::ops::Range<usize> {
        self.indptr[i].ix()..self.indptr[i + 1].ix()
    }

    /// The transpose as an owned graph (row j lists the i with a stored
    /// S_ij), entries in ascending order.
    pub fn transpose(&self) -> Csr {
        let n = self.n;
        let mut counts = vec![0usize; n + 1];
        for &j in self.indices {
            counts[j.ix() + 1] += 1;
        }
        for j in 0..n {
            counts[j + 1] += counts[j];
        }
        let mut next = counts.clone();
        let mut indices = vec![0u32; self.nnz()];
        let mut data = vec![0f32; self.nnz()];
        for i in 0..n {
            for e in self.row(i) {
                let j = self.indices[e].ix();
                let slot = next[j];
                next[j] += 1;
                indices[slot] = i as u32;
                data[slot] = self.data[e];
            }
        }
        Csr { n, indptr: counts, indices, data }
    }
}

/// An owned sparse similarity graph (see [`CsrRef`]).
#[derive(Debug, Clone)]
pub struct Csr {
    pub n: usize,
    pub indptr: Vec<usize>,
    pub indices: Vec<u32>,
    pub data: Vec<f32>,
}

impl Csr {
    /// Validate and copy a CSR graph given with int64 indices.
    pub fn new(n: usize, indptr: &[i64], indices: &[i64], data: &[f32]) -> Result<Self> {
        CsrRef::new(n, indptr, indices, data)?;
        Ok(Csr {
            n,
            indptr: indptr.iter().map(|&v| v as usize).collect(),
            indices: indices.iter().map(|&v| v as u32).collect(),
            data: data.to_vec(),
        })
    }

    pub fn as_ref(&self) -> CsrRef<'_, usize, u32> {
        CsrRef { n: self.n, indptr: &self.indptr, indices: &self.indices, data: &self.data }
    }

    pub fn nnz(&self) -> usize {
        self.indices.len()
    }

    pub fn transpose(&self) -> Csr {
        self.as_ref().transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::Kernel;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn apply_all_is_apply_on_every_value(v in prop::collection::vec(prop_oneof![
            -2f32..2.0, Just(-1.0), Just(0.0), Just(-0.0), Just(1.0), Just(f32::NAN)], 0..80)) {
            for kernel in [Kernel::Clip, Kernel::Shift] {
                let mut got = v.clone();
                kernel.apply_all(&mut got);
                let want: Vec<u32> = v.iter().map(|&c| kernel.apply(c).to_bits()).collect();
                prop_assert_eq!(got.iter().map(|c| c.to_bits()).collect::<Vec<_>>(), want);
            }
        }
    }
}
