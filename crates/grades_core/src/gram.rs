//! The symmetric Gram product `out = X X^T` of a pool's rows: a hand-vectorised
//! kernel for small blocks (AVX2 + FMA on x86-64, chosen at run time, with a
//! portable fallback) and a blocked parallel one for large blocks; and the
//! general product `C = A B^T` ([`gemm_abt`]) they and the on-demand
//! similarity blocks use. The similarity kernel ([`crate::kernel`]) maps the
//! products into [0, 1].

/// `c (m x n) = a (m x d) * b (n x d)^T`, all row-major, single-threaded GEMM.
#[inline]
pub fn gemm_abt(a: &[f32], m: usize, b: &[f32], n: usize, d: usize, c: &mut [f32]) {
    assert!(a.len() >= m * d && b.len() >= n * d && c.len() >= m * n, "gemm_abt: buffers too small");
    // SAFETY: sizes asserted just above; row stride n for c.
    unsafe { gemm_abt_raw(a, m, b, n, d, c.as_mut_ptr(), n) }
}

/// `c = a b^T` into `m x n` at `c` with row stride `ldc`, single-threaded
/// (the `gemm` crate: packed, cache-blocked, runtime SIMD dispatch).
///
/// # Safety
/// `a` holds `m x d` and `b` holds `n x d` row-major floats; `c` is valid for
/// writes of rows `0..m`, columns `0..n` at row stride `ldc`, and no other
/// thread touches that region during the call.
pub unsafe fn gemm_abt_raw(a: &[f32], m: usize, b: &[f32], n: usize, d: usize, c: *mut f32, ldc: usize) {
    debug_assert!(a.len() >= m * d && b.len() >= n * d);
    if m == 0 || n == 0 {
        return;
    }
    if d == 0 {
        for i in 0..m {
            std::ptr::write_bytes(c.add(i * ldc), 0, n);
        }
        return;
    }
    // dst (m x n): col stride 1, row stride ldc; lhs = a (m x d): col stride
    // 1, row stride d; rhs = b^T (d x n): col stride d, row stride 1.
    // dst = 1 * (a b^T), not read first.
    gemm::gemm(
        m,
        n,
        d,
        c,
        1,
        ldc as isize,
        false,
        a.as_ptr(),
        1,
        d as isize,
        b.as_ptr(),
        d as isize,
        1,
        0.0f32,
        1.0f32,
        false,
        false,
        false,
        gemm::Parallelism::None,
    );
}

/// `out (n x n, row-major) = x x^T` for row-major `x (n x d)`; symmetric to
/// the bit.
/// `next` is memory the caller reads next (the following pool's rows): it is
/// prefetched into L2 a little per tile while this product computes, so that
/// the next call does not start by waiting on DRAM. A hint only.
pub fn syrk(x: &[f32], n: usize, d: usize, out: &mut [f32], next: &[u8]) {
    assert!(x.len() >= n * d && out.len() >= n * n, "syrk: buffers too small");
    #[cfg(target_arch = "x86_64")]
    {
        if d >= 8 && std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU supports AVX2 and FMA (checked just above);
            // buffer sizes are asserted above.
            unsafe { syrk_avx2(x, n, d, out, next) };
            return;
        }
    }
    let _ = next;
    gemm_abt(x, n, x, n, d, out);
    mirror_upper(out, n);
}

/// `out[i][j] = out[j][i]` for `j < i`: the lower triangle copied from the
/// upper, so the result is symmetric to the bit whatever the GEMM did.
fn mirror_upper(out: &mut [f32], n: usize) {
    for i in 1..n {
        for j in 0..i {
            out[i * n + j] = out[j * n + i];
        }
    }
}

/// Lane `k` of the result is the sum of `v[k]`'s eight lanes, added as
/// `((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7))`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn hsum8(v: [std::arch::x86_64::__m256; 8]) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let t0 = _mm256_hadd_ps(v[0], v[1]);
    let t1 = _mm256_hadd_ps(v[2], v[3]);
    let t2 = _mm256_hadd_ps(v[4], v[5]);
    let t3 = _mm256_hadd_ps(v[6], v[7]);
    // lanes 0-3: low-half sums of v[0..4], lanes 4-7: their high-half sums
    let u0 = _mm256_hadd_ps(t0, t1);
    let u1 = _mm256_hadd_ps(t2, t3);
    let lo = _mm256_permute2f128_ps(u0, u1, 0x20);
    let hi = _mm256_permute2f128_ps(u0, u1, 0x31);
    _mm256_add_ps(lo, hi)
}

/// [`hsum8`] for four vectors (the same addition tree).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn hsum4(v: [std::arch::x86_64::__m256; 4]) -> std::arch::x86_64::__m128 {
    use std::arch::x86_64::*;
    let t0 = _mm256_hadd_ps(v[0], v[1]);
    let t1 = _mm256_hadd_ps(v[2], v[3]);
    let u = _mm256_hadd_ps(t0, t1);
    _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1))
}

/// Tiles of 3 rows x 4 rows over the upper triangle; dot products along d
/// in 8-wide FMA lanes, the tail in scalar.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn syrk_avx2(x: &[f32], n: usize, d: usize, out: &mut [f32], next: &[u8]) {
    use std::arch::x86_64::*;
    const TI: usize = 3;
    const TJ: usize = 4;
    let d8 = d - d % 8;
    let p = x.as_ptr();
    // spread the prefetch of `next` (64-byte lines) evenly over the tiles
    let tiles = n.div_ceil(TI) * (n.div_ceil(TJ) + 1) / 2 + 1;
    let lines = std::mem::size_of_val(next).div_ceil(64);
    let per_tile = lines.div_ceil(tiles);
    let (npf, mut pf) = (next.as_ptr() as *const i8, 0usize);
    let mut i0 = 0;
    while i0 < n {
        let ni = TI.min(n - i0);
        // rows of the i tile (repeat the last row to fill a partial tile)
        let ri: [usize; TI] = std::array::from_fn(|a| i0 + a.min(ni - 1));
        let mut j0 = i0;
        while j0 < n {
            let nj = TJ.min(n - j0);
            let rj: [usize; TJ] = std::array::from_fn(|b| j0 + b.min(nj - 1));
            for _ in 0..per_tile {
                if pf < lines {
                    // a hint: never faults; the address is inside `next`
                    _mm_prefetch::<_MM_HINT_T1>(npf.add(pf * 64));
                    pf += 1;
                }
            }
            let mut acc = [[_mm256_setzero_ps(); TJ]; TI];
            let mut k = 0;
            while k < d8 {
                let a: [__m256; TI] = std::array::from_fn(|t| _mm256_loadu_ps(p.add(ri[t] * d + k)));
                for b in 0..TJ {
                    let bv = _mm256_loadu_ps(p.add(rj[b] * d + k));
                    for t in 0..TI {
                        acc[t][b] = _mm256_fmadd_ps(a[t], bv, acc[t][b]);
                    }
                }
                k += 8;
            }
            // horizontal sums of all 12 accumulators at once (lane b of
            // row t in `sums[t * 4 + b]`): the same tree for every one
            let mut sums = [0f32; TI * TJ];
            let h01 = hsum8([acc[0][0], acc[0][1], acc[0][2], acc[0][3], acc[1][0], acc[1][1], acc[1][2], acc[1][3]]);
            _mm256_storeu_ps(sums.as_mut_ptr(), h01);
            _mm_storeu_ps(sums.as_mut_ptr().add(8), hsum4([acc[2][0], acc[2][1], acc[2][2], acc[2][3]]));
            for t in 0..ni {
                for b in 0..nj {
                    let mut s = sums[t * TJ + b];
                    for kk in d8..d {
                        s += *p.add(ri[t] * d + kk) * *p.add(rj[b] * d + kk);
                    }
                    let (i, j) = (ri[t], rj[b]);
                    *out.get_unchecked_mut(i * n + j) = s;
                    *out.get_unchecked_mut(j * n + i) = s;
                }
            }
            j0 += TJ;
        }
        i0 += TI;
    }
}

/// Rows per stripe of the blocked large-matrix paths.
pub const STRIPE: usize = 256;

/// A raw pointer that may cross threads; every use writes disjoint regions.
#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: used only to write disjoint regions of one buffer from rayon tasks
// (see `syrk_large`).
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

/// Columns per GEMM block of a stripe in [`syrk_large`] (256 x 1024 floats,
/// 1 MiB: still in cache when `map` runs over it).
const COL_BLOCK: usize = 1024;

/// `out = map(x x^T)` for a large `x`, entrywise: stripes of rows in
/// parallel, each a series of cache-blocked GEMMs against the rows at or
/// after its own (the upper block triangle), `map` applied to each block
/// while it is in cache, then the lower triangle mirrored from the upper
/// (symmetric to the bit).
///
/// With weights `w`, also returns `sum_{i != j} w_i out[i][j]` for every
/// column `j`, formed from each block while it is in cache (each entry of
/// the upper triangle adds to its column's sum and, by symmetry, to its
/// row's): what a pass over the finished matrix would give, in another
/// order of addition. Without, an empty vector.
pub fn syrk_large<F: Fn(f32) -> f32 + Sync>(
    x: &[f32],
    n: usize,
    d: usize,
    out: &mut [f32],
    map: F,
    w: Option<&[f64]>,
) -> Vec<f64> {
    use rayon::prelude::*;
    assert!(x.len() >= n * d && out.len() >= n * n, "syrk_large: buffers too small");
    assert!(w.is_none_or(|w| w.len() >= n), "syrk_large: too few weights");
    // each stripe's partial sums, for columns r0..n of stripe r0
    let parts: Vec<Vec<f64>> = out[..n * n]
        .par_chunks_mut(STRIPE * n)
        .enumerate()
        .map(|(s, rows)| {
            let r0 = s * STRIPE;
            let m = rows.len() / n;
            let mut part = if w.is_some() { vec![0f64; n - r0] } else { Vec::new() };
            for c0 in (r0..n).step_by(COL_BLOCK) {
                let nc = COL_BLOCK.min(n - c0);
                // SAFETY: a = x[r0..r0 + m] (m x d), b = x[c0..c0 + nc] (nc x
                // d), c = rows[.., c0..c0 + nc] at row stride n: in bounds, and
                // `rows` belongs to this task alone.
                unsafe {
                    gemm_abt_raw(&x[r0 * d..], m, &x[c0 * d..], nc, d, rows.as_mut_ptr().add(c0), n);
                }
                for (ii, row) in rows.chunks_exact_mut(n).enumerate() {
                    let seg = &mut row[c0..c0 + nc];
                    for v in seg.iter_mut() {
                        *v = map(*v);
                    }
                    if let Some(w) = w {
                        // the entries right of the diagonal: (i, j) adds w_i s to
                        // column j and w_j s to column i
                        let i = r0 + ii;
                        let j0 = (i + 1).max(c0);
                        if j0 < c0 + nc {
                            let row_sum = add_weighted(&seg[j0 - c0..], w[i], &w[j0..c0 + nc], &mut part[j0 - r0..]);
                            part[i - r0] += row_sum;
                        }
                    }
                }
            }
            part
        })
        .collect();
    let p = SendPtr(out.as_mut_ptr());
    (0..n.div_ceil(STRIPE)).into_par_iter().for_each(move |s| {
        let p = p;
        let r0 = s * STRIPE;
        let r1 = (r0 + STRIPE).min(n);
        // lower part of stripe s: out[i][j] = out[j][i] for j < i, r0 <= i
        // < r1 (the diagonal block too, so the result is symmetric to the
        // bit). Reads touch only upper parts written in the first phase.
        const T: usize = 32;
        for jb in (0..r1).step_by(T) {
            for i in r0..r1 {
                for j in jb..(jb + T).min(i) {
                    // SAFETY: i, j < n; (i, j) with j < i and r0 <= i < r1 is
                    // written only by this task; (j, i) lies in an upper part,
                    // never written in this phase.
                    unsafe { *p.0.add(i * n + j) = *p.0.add(j * n + i) };
                }
            }
        }
    });
    if w.is_none() {
        return Vec::new();
    }
    // the stripes' parts added in stripe order: the same bits every run
    let mut sums = vec![0f64; n];
    for (s, part) in parts.iter().enumerate() {
        for (a, v) in sums[s * STRIPE..].iter_mut().zip(part) {
            *a += v;
        }
    }
    sums
}

/// `col[t] += wi * s[t]` for every `t`, and returns `sum_t wj[t] * s[t]`
/// (four partial sums, added in a fixed order): one row segment of the
/// upper triangle into the column sums and its row's sum. Compiled for AVX2
/// where the CPU has it (lane-wise, no fused multiply-add: the same bits).
fn add_weighted(s: &[f32], wi: f64, wj: &[f64], col: &mut [f64]) -> f64 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 is available (checked just above).
            return unsafe { add_weighted_avx2(s, wi, wj, col) };
        }
    }
    add_weighted_impl(s, wi, wj, col)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn add_weighted_avx2(s: &[f32], wi: f64, wj: &[f64], col: &mut [f64]) -> f64 {
    add_weighted_impl(s, wi, wj, col)
}

#[inline(always)]
fn add_weighted_impl(s: &[f32], wi: f64, wj: &[f64], col: &mut [f64]) -> f64 {
    let len = s.len().min(wj.len()).min(col.len());
    let (s, wj, col) = (&s[..len], &wj[..len], &mut col[..len]);
    let mut acc = [0f64; 4];
    let full = len - len % 4;
    for ((s4, w4), c4) in s[..full].chunks_exact(4).zip(wj[..full].chunks_exact(4)).zip(col[..full].chunks_exact_mut(4))
    {
        for l in 0..4 {
            let v = s4[l] as f64;
            c4[l] += wi * v;
            acc[l] += w4[l] * v;
        }
    }
    for t in full..len {
        let v = s[t] as f64;
        col[t] += wi * v;
        acc[t - full] += wj[t] * v;
    }
    (acc[0] + acc[1]) + (acc[2] + acc[3])
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    /// `len` values in [-0.5, 0.5) from `seed`.
    fn values(len: usize, seed: u64) -> Vec<f32> {
        (0..len)
            .map(|t| {
                ((t as u64 + 1).wrapping_mul(6364136223846793005).wrapping_add(seed) >> 40) as f32 / (1u64 << 24) as f32
                    - 0.5
            })
            .collect()
    }

    proptest! {
        #[test]
        fn syrk_is_x_xt_and_symmetric_to_the_bit(n in 1usize..70, d in 1usize..60, seed in 0u64..1000) {
            let x = values(n * d, seed);
            let mut out = vec![f32::NAN; n * n];
            super::syrk(&x, n, d, &mut out, &[]);
            for i in 0..n {
                for j in 0..n {
                    prop_assert_eq!(out[i * n + j].to_bits(), out[j * n + i].to_bits());
                    let want: f64 = (0..d).map(|k| x[i * d + k] as f64 * x[j * d + k] as f64).sum();
                    prop_assert!((out[i * n + j] as f64 - want).abs() <= 1e-5 * (1.0 + d as f64), "({i}, {j})");
                }
            }
        }

        #[test]
        fn syrk_large_is_x_xt_and_symmetric_to_the_bit(n in 1usize..700, d in 1usize..40, seed in 0u64..1000) {
            // several stripes and column blocks, partial ones
            let x = values(n * d, seed);
            let mut out = vec![f32::NAN; n * n];
            super::syrk_large(&x, n, d, &mut out, |c| 2.0 * c, None);
            for i in 0..n {
                for j in 0..n {
                    prop_assert_eq!(out[i * n + j].to_bits(), out[j * n + i].to_bits(), "({}, {})", i, j);
                    let want: f64 = (0..d).map(|k| x[i * d + k] as f64 * x[j * d + k] as f64).sum();
                    prop_assert!((out[i * n + j] as f64 / 2.0 - want).abs() <= 1e-5 * (1.0 + d as f64), "({i}, {j})");
                }
            }
        }
    }
}
