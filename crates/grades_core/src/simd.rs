//! Hand-vectorised kernels with runtime CPU dispatch (AVX2 + FMA on x86-64),
//! each with a portable fallback. Results of a kernel do not depend on which
//! path runs only where stated.

/// `out (n x n, row-major) = x x^T` for row-major `x (n x d)`; symmetric.
pub fn syrk(x: &[f32], n: usize, d: usize, out: &mut [f32]) {
    assert!(x.len() >= n * d && out.len() >= n * n, "syrk: buffers too small");
    #[cfg(target_arch = "x86_64")]
    {
        if d >= 8 && std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU supports AVX2 and FMA (checked just above);
            // buffer sizes are asserted above.
            unsafe { syrk_avx2(x, n, d, out) };
            return;
        }
    }
    crate::kernel::gemm_abt(x, n, x, n, d, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn hsum(v: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps(v, 1);
    let s = _mm_add_ps(lo, hi);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}

/// Tiles of 3 rows x 4 rows over the upper triangle; dot products along d
/// in 8-wide FMA lanes, the tail in scalar.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn syrk_avx2(x: &[f32], n: usize, d: usize, out: &mut [f32]) {
    use std::arch::x86_64::*;
    const TI: usize = 3;
    const TJ: usize = 4;
    let d8 = d - d % 8;
    let p = x.as_ptr();
    let mut i0 = 0;
    while i0 < n {
        let ni = TI.min(n - i0);
        // rows of the i tile (repeat the last row to fill a partial tile)
        let ri: [usize; TI] = std::array::from_fn(|a| i0 + a.min(ni - 1));
        let mut j0 = i0;
        while j0 < n {
            let nj = TJ.min(n - j0);
            let rj: [usize; TJ] = std::array::from_fn(|b| j0 + b.min(nj - 1));
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
            for t in 0..ni {
                for b in 0..nj {
                    let mut s = hsum(acc[t][b]);
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
