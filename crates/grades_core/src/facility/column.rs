//! The gain and cover of one similarity column: the kernels the dense and
//! on-demand sources and the sweep share, portable and AVX2 (the same bits).

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
pub(super) fn column_gain_w<const UNIT: bool>(col: &[f32], wj: f64, w: &[f64], c: &[f64]) -> f64 {
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
pub(super) fn column_cover(col: &[f32], wj: f64, c: &mut [f64]) {
    for (&s, ci) in col.iter().zip(c.iter_mut()) {
        let v = wj * s as f64;
        // a select and a plain store (vectorises without masked stores)
        *ci = if v > *ci { v } else { *ci };
    }
}

/// [`column_gain_w`] in AVX2 intrinsics: partial sum `l` is lane `l % 4` of
/// vector `l / 4`, each lane does the scalar version's operations in the
/// same order (no fused multiply-add), and the tail and the tree are the
/// same: the same bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn column_gain_avx2<const UNIT: bool>(col: &[f32], wj: f64, w: &[f64], c: &[f64]) -> f64 {
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
pub(super) fn column_gain_fast(col: &[f32], wj: f64, w: &[f64], c: &[f64]) -> f64 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 is available (checked just above).
            return unsafe { column_gain_avx2::<false>(col, wj, w, c) };
        }
    }
    column_gain(col, wj, w, c)
}
