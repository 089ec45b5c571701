use super::certificate::top_k_sum;
use super::column;
use super::{dense_bytes, DENSE_LIMIT_BYTES};
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
            let a = column::column_gain_w::<false>(&col, wj, w, &c);
            let u = column::column_gain_w::<true>(&col, 1.0, &ones, &c);
            #[cfg(target_arch = "x86_64")]
            if std::is_x86_feature_detected!("avx2") {
                // SAFETY: AVX2 is available (checked just above).
                let b = unsafe { column::column_gain_avx2::<false>(&col, wj, w, &c) };
                prop_assert_eq!(a.to_bits(), b.to_bits());
                let v = unsafe { column::column_gain_avx2::<true>(&col, 1.0, &ones, &c) };
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

/// The one definition of the dense size limit (the bindings export it as
/// `DENSE_LIMIT_BYTES`): 2 GiB, so pools of up to 23,170 candidates are dense.
#[test]
fn dense_limit_is_2_gib() {
    assert_eq!(DENSE_LIMIT_BYTES, 2 * 1024 * 1024 * 1024);
    assert!(dense_bytes(23_170) <= DENSE_LIMIT_BYTES);
    assert!(dense_bytes(23_171) > DENSE_LIMIT_BYTES);
}
