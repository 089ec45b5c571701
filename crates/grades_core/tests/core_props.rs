//! Property tests of the selection core (no Python).
use grades_core::facility::{
    facility_location_batch, facility_location_batch_within, facility_location_dense, facility_location_on_demand,
    facility_location_sparse, greedy, greedy_sweep, objective_dense, quality, use_sweep, DenseSource, OnDemandSource,
    Optimizer, Params, Source,
};
use grades_core::kernel::{cosine_gram, cosine_gram_with, Csr, Kernel};
use grades_core::pools::Pools;
use grades_core::sampling::{largest_remainder, random_k, stratified_k, top_k};
use proptest::prelude::*;

fn params(k: usize, alpha: f64, opt: Optimizer) -> Params {
    Params { k, alpha, eps: 1e-6, k_max: None, optimizer: opt }
}

/// Random symmetric similarity in [0, 1] with unit diagonal, column-major == row-major.
fn sym(n: usize, vals: &[f32]) -> Vec<f32> {
    let mut s = vec![0f32; n * n];
    let mut t = 0;
    for i in 0..n {
        s[i * n + i] = 1.0;
        for j in (i + 1)..n {
            let v = vals[t % vals.len()];
            t += 1;
            s[i * n + j] = v;
            s[j * n + i] = v;
        }
    }
    s
}

fn brute_opt(s: &[f32], n: usize, w: &[f64], k: usize) -> f64 {
    let mut best = 0.0f64;
    for mask in 0u32..(1 << n) {
        if mask.count_ones() as usize != k {
            continue;
        }
        let set: Vec<usize> = (0..n).filter(|&j| mask >> j & 1 == 1).collect();
        best = best.max(objective_dense(s, n, w, &set));
    }
    best
}

/// GRADES weights `q^alpha` from rewards.
fn weights(rewards: &[f64], alpha: f64) -> Vec<f64> {
    quality(rewards, 1e-6).iter().map(|v| v.powf(alpha)).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn lazy_equals_naive_and_bounds_hold(n in 2usize..10, k in 1usize..6,
                                         vals in prop::collection::vec(0f32..=1.0, 1..64),
                                         rw in prop::collection::vec(-3f64..3.0, 10),
                                         alpha in prop::sample::select(vec![0.0, 0.5, 0.75, 2.0])) {
        let s = sym(n, &vals);
        let w = weights(&rw[..n], alpha);
        let mut src = DenseSource::new(&s, n);
        let a = greedy(&mut src, &w, k, Optimizer::Naive);
        let b = greedy(&mut src, &w, k, Optimizer::Lazy);
        prop_assert_eq!(&a.indices, &b.indices);
        prop_assert_eq!(&a.gains, &b.gains);
        let kk = k.min(n);
        let opt = brute_opt(&s, n, &w, kk);
        let tol = 1e-9 * (1.0 + opt);
        // greedy within (1 - 1/e) of OPT; certificate >= OPT >= greedy
        prop_assert!(a.objective >= (1.0 - (-1.0f64).exp()) * opt - tol);
        prop_assert!(a.upper_bound + tol >= opt, "naive bound {} < opt {}", a.upper_bound, opt);
        prop_assert!(b.upper_bound + tol >= opt, "lazy bound {} < opt {}", b.upper_bound, opt);
        prop_assert!(a.objective <= opt + tol);
        // objective equals F of the chosen set and the sum of gains
        prop_assert!((a.objective - objective_dense(&s, n, &w, &a.indices)).abs() <= tol);
        prop_assert!((a.objective - a.gains.iter().sum::<f64>()).abs() <= tol);
        // gains are non-increasing (submodularity along the greedy path)
        for g in a.gains.windows(2) { prop_assert!(g[1] <= g[0] + 1e-12); }
    }

    #[test]
    fn sweep_equals_naive_to_the_bit(n in 1usize..70, k in 1usize..12,
                                     // repeated values: tied and all-zero gains
                                     vals in prop::collection::vec(
                                         prop_oneof![0f32..=1.0, Just(0.0), Just(0.5), Just(1.0)], 1..200),
                                     rw in prop::collection::vec(-3f64..3.0, 70),
                                     alpha in prop::sample::select(vec![0.0, 0.5, 0.75, 2.0])) {
        let s = sym(n, &vals);
        let w = weights(&rw[..n], alpha);
        let a = greedy(&mut DenseSource::new(&s, n), &w, k, Optimizer::Naive);
        let b = greedy_sweep(&s, n, &w, k);
        prop_assert_eq!(&a.indices, &b.indices);
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        prop_assert_eq!(bits(&a.gains), bits(&b.gains));
        prop_assert_eq!(a.objective.to_bits(), b.objective.to_bits());
        prop_assert_eq!(a.upper_bound.to_bits(), b.upper_bound.to_bits());
        // and lazy picks the same
        let c = greedy(&mut DenseSource::new(&s, n), &w, k, Optimizer::Lazy);
        prop_assert_eq!(&a.indices, &c.indices);
    }

    #[test]
    fn cosine_gram_is_symmetric_to_the_bit(n in 1usize..300, d in 1usize..40, seed in 0u64..1000,
                                          kernel in prop::sample::select(vec![Kernel::Clip, Kernel::Shift])) {
        let x: Vec<f32> = (0..n * d).map(|t| {
            let z = (t as u64 + 1).wrapping_mul(6364136223846793005).wrapping_add(seed.wrapping_mul(1442695040888963407));
            ((z >> 33) as f32 / (1u64 << 31) as f32) - 0.5 + if t % d == 0 { 1e-2 } else { 0.0 }
        }).collect();
        let (mut s, mut inv) = (Vec::new(), Vec::new());
        cosine_gram(&x, n, d, kernel, &mut s, &mut inv, &|i| (0, i, format!("{i}")), &[]).unwrap();
        for i in 0..n {
            for j in 0..i {
                prop_assert_eq!(s[i * n + j].to_bits(), s[j * n + i].to_bits(), "({}, {}) of {}", i, j, n);
            }
        }
    }

    #[test]
    fn sparse_and_dense_agree(n in 2usize..12, k in 1usize..5, vals in prop::collection::vec(0f32..=1.0, 1..80)) {
        let s = sym(n, &vals);
        let mut indptr = vec![0i64];
        let mut indices = vec![];
        let mut data = vec![];
        for i in 0..n {
            for j in 0..n {
                if s[i * n + j] > 0.0 { indices.push(j as i64); data.push(s[i * n + j]); }
            }
            indptr.push(indices.len() as i64);
        }
        let g = Csr::new(n, &indptr, &indices, &data).unwrap();
        let p = params(k, 0.0, Optimizer::Lazy);
        let a = facility_location_sparse(&g.as_ref(), false, None, &p).unwrap();
        let b = facility_location_dense(&s, n, None, &p).unwrap();
        // the graph is symmetric: using rows as columns in place gives the same
        let c = facility_location_sparse(&g.as_ref(), true, None, &p).unwrap();
        prop_assert_eq!(&a.indices, &c.indices);
        prop_assert_eq!(&a.gains, &c.gains);
        prop_assert_eq!(a.indices, b.indices);
        prop_assert!((a.objective - b.objective).abs() < 1e-9);
    }

    #[test]
    fn on_demand_lazy_equals_naive(n in 2usize..40, d in 1usize..8, k in 1usize..8, seed in 0u64..1000,
                                   kernel in prop::sample::select(vec![Kernel::Clip, Kernel::Shift])) {
        let x: Vec<f32> = (0..n * d).map(|t| {
            let z = (t as u64 + 1).wrapping_mul(6364136223846793005).wrapping_add(seed.wrapping_mul(1442695040888963407));
            ((z >> 33) as f32 / (1u64 << 31) as f32) - 0.5 + if t % d == 0 { 1e-3 } else { 0.0 }
        }).collect();
        let a = facility_location_on_demand(&x, n, d, None, &params(k, 0.0, Optimizer::Naive), kernel).unwrap();
        let b = facility_location_on_demand(&x, n, d, None, &params(k, 0.0, Optimizer::Lazy), kernel).unwrap();
        prop_assert_eq!(&a.indices, &b.indices);
        prop_assert_eq!(&a.gains, &b.gains);
        // and the on-demand objective matches the dense Gram path closely
        let off = [0u64, n as u64];
        let pools = Pools::new(&x, d, &off, None).unwrap();
        let c = facility_location_batch(&pools, None, &params(k, 0.0, Optimizer::Lazy), kernel).unwrap();
        // the two paths' similarities round apart in float32: where two gains tie within that rounding
        // they may part ways, each pick then within rounding of the other's best
        match c[0].indices.iter().zip(&b.indices).position(|(x, y)| x != y) {
            Some(t) => prop_assert!((c[0].gains[t] - b.gains[t]).abs() <= 1e-6 * (1.0 + b.gains[t].abs()),
                                    "step {}: dense gain {} against {} on demand", t, c[0].gains[t], b.gains[t]),
            None => prop_assert!((c[0].objective - b.objective).abs() <= 1e-4 * (1.0 + b.objective.abs())),
        }
    }

    #[test]
    fn largest_remainder_sums_to_k(counts in prop::collection::vec(1usize..20, 1..8), k in 1usize..40) {
        let n: usize = counts.iter().sum();
        let a = largest_remainder(&counts, k);
        prop_assert_eq!(a.iter().sum::<usize>(), k.min(n));
        for (m, &c) in counts.iter().enumerate() {
            let exact = k.min(n) as f64 * c as f64 / n as f64;
            prop_assert!((a[m] as f64 - exact).abs() < 1.0 + 1e-9);
            prop_assert!(a[m] <= c);
        }
    }
}

#[test]
fn block_similarity_covers_every_mode_first() {
    // 3 modes x 4 members; S = 1 inside a mode, 0.3 across; alpha = 0
    let (m, per) = (3usize, 4usize);
    let n = m * per;
    let mut s = vec![0.3f32; n * n];
    for i in 0..n {
        for j in 0..n {
            if i / per == j / per {
                s[i * n + j] = 1.0;
            }
        }
    }
    let r = facility_location_dense(&s, n, None, &params(5, 0.0, Optimizer::Lazy)).unwrap();
    let first: Vec<usize> = r.indices[..m].iter().map(|&i| i / per).collect();
    let mut sorted = first.clone();
    sorted.sort();
    assert_eq!(sorted, vec![0, 1, 2], "first picks {:?}", r.indices);
}

#[test]
fn bad_inputs_are_errors_not_panics() {
    let x = vec![1.0f32, 0.0, 0.0, 0.0, 1.0, 0.0];
    let off = [0u64, 3];
    let pools = Pools::new(&x, 2, &off, None).unwrap();
    let e = facility_location_batch(&pools, None, &params(1, 0.0, Optimizer::Lazy), Kernel::Clip).unwrap_err();
    assert!(e.to_string().contains("zero norm"), "{e}");
    assert!(Pools::new(&x, 4, &off, None).is_err());
    assert!(Pools::new(&x, 2, &[0, 2], None).is_err());
    let good = vec![1.0f32, 0.0, 0.0, 1.0, 1.0, 1.0];
    let pools = Pools::new(&good, 2, &off, None).unwrap();
    let p = Params { k: 0, ..params(1, 0.0, Optimizer::Lazy) };
    assert!(facility_location_batch(&pools, None, &p, Kernel::Clip).is_err());
    let p = params(2, 0.75, Optimizer::Lazy);
    assert!(facility_location_batch(&pools, None, &p, Kernel::Clip).unwrap_err().to_string().contains("rewards"));
    let r = [1.0, f64::NAN, 0.0];
    let e = facility_location_batch(&pools, Some(&r), &p, Kernel::Clip).unwrap_err();
    assert!(e.to_string().contains("candidate 1"), "{e}");
    assert!(Csr::new(2, &[0, 1, 2], &[0, 5], &[1.0, 1.0]).is_err());
    assert!(Csr::new(2, &[0, 1, 2], &[0, 1], &[1.0, 1.5]).is_err());
}

#[test]
fn errors_carry_pool_argument_and_row() {
    // pool 1 = rows 3..6 of a gathered layout; its candidate 1 is row 5
    let mut x: Vec<f32> = (0..12).map(|i| (i % 5) as f32 + 1.0).collect();
    x[5 * 2] = f32::NAN;
    let off = [0u64, 3, 6];
    let rows = [0u64, 1, 2, 3, 5, 4];
    let pools = Pools::new(&x, 2, &off, Some(&rows)).unwrap();
    let e = facility_location_batch(&pools, None, &params(1, 0.0, Optimizer::Lazy), Kernel::Clip).unwrap_err();
    assert_eq!((e.pool(), e.arg(), e.row()), (Some(1), Some("embeddings"), Some(5)), "{e}");
    assert!(e.to_string().starts_with("pool 1: embedding of candidate 1 (row 5)"), "{e}");
    x[5 * 2] = 1.0;
    let pools = Pools::new(&x, 2, &off, Some(&rows)).unwrap();
    let r = [0.0, 1.0, 2.0, 3.0, f64::INFINITY, 5.0];
    let e = top_k(&pools.layout, &r, 1, None, None).unwrap_err();
    assert_eq!((e.pool(), e.arg(), e.row()), (Some(1), Some("rewards"), Some(4)), "{e}");
    let e = facility_location_batch(&pools, Some(&r), &params(1, 0.5, Optimizer::Lazy), Kernel::Clip).unwrap_err();
    assert_eq!((e.pool(), e.arg(), e.row()), (Some(1), Some("rewards"), Some(4)), "{e}");
}

#[test]
fn a_duplicate_csr_entry_is_refused() {
    let e = Csr::new(3, &[0, 2, 3, 4], &[1, 1, 0, 2], &[0.5, 0.4, 0.3, 1.0]).unwrap_err().to_string();
    assert!(e.contains("entry (0, 1) more than once"), "{e}");
    // the same column in different rows is fine
    assert!(Csr::new(3, &[0, 1, 2, 3], &[1, 1, 1], &[0.5, 0.4, 0.3]).is_ok());
}

#[test]
fn quality_of_rewards_whose_range_overflows_is_finite() {
    let r = [-1.5e308, 0.0, 1.5e308];
    let q = quality(&r, 1e-6);
    assert!(q.iter().all(|v| v.is_finite()), "{q:?}");
    assert!((q[0] - 1e-6).abs() < 1e-15 && (q[1] - (1e-6 + 0.5)).abs() < 1e-12 && (q[2] - (1.0 + 1e-6)).abs() < 1e-12);
    // rewards in range keep their exact formula
    assert_eq!(quality(&[0.0, 1.0], 1e-6), vec![1e-6, 1e-6 + 1.0 / (1.0 + 1e-6)]);
}

#[test]
fn pools_over_the_dense_budget_run_on_demand_with_the_same_picks() {
    for seed in 0..4u64 {
        let sizes = [30usize, 140, 12, 90];
        let n: usize = sizes.iter().sum();
        let d = 16;
        let x: Vec<f32> =
            (0..n * d).map(|i| ((i as u64 * 2654435761 + seed * 97) % 1000) as f32 / 500.0 - 1.0).collect();
        let mut off = vec![0u64];
        for s in sizes {
            off.push(off.last().unwrap() + s as u64);
        }
        let pools = Pools::new(&x, d, &off, None).unwrap();
        let r: Vec<f64> = (0..n).map(|i| ((i * 7 + seed as usize) % 13) as f64).collect();
        let p = params(6, 0.75, Optimizer::Lazy);
        let dense = facility_location_batch(&pools, Some(&r), &p, Kernel::Shift).unwrap();
        // pools above 64 candidates over the budget
        let lean = facility_location_batch_within(&pools, Some(&r), &p, Kernel::Shift, 64 * 64 * 4).unwrap();
        for (a, b) in dense.iter().zip(&lean) {
            assert_eq!(a.indices, b.indices);
            assert!((a.objective - b.objective).abs() <= 1e-5 * a.objective.abs());
        }
    }
}

#[test]
fn samplers_basic() {
    let off = [0u64, 5, 7, 17];
    let layout = grades_core::pools::Layout::new(&off, None, 17).unwrap();
    let keys = [11u64, 22, 33];
    let a = random_k(&layout, &keys, 3, 7, None, None).unwrap();
    assert_eq!(a.offsets, vec![0, 3, 5, 8]);
    let b = random_k(&layout, &keys, 3, 7, None, None).unwrap();
    assert_eq!(a, b);
    let rewards: Vec<f64> = (0..17).map(|i| (i % 4) as f64).collect();
    let t = top_k(&layout, &rewards, 2, None, None).unwrap();
    assert_eq!(&t.indices[..2], &[3, 2]);
    let modes: Vec<i64> = (0..17).map(|i| (i % 3) as i64).collect();
    let s = stratified_k(&layout, &modes, &keys, 3, 1, None, None).unwrap();
    assert_eq!(s.offsets.last().copied(), Some(8));
    let mut bad = rewards.clone();
    bad[6] = f64::INFINITY;
    assert!(top_k(&layout, &bad, 2, None, None).unwrap_err().to_string().contains("pool 1"));
}

#[test]
fn large_gram_blocks_match_cosines_and_name_bad_rows() {
    // above the stripe size, so the blocked large path runs
    let (n, d) = (300usize, 8usize);
    let mut x: Vec<f32> = (0..n * d).map(|t| ((t * 7919 % 1013) as f32 / 1013.0) - 0.45).collect();
    let (mut s, mut inv) = (Vec::new(), Vec::new());
    for kernel in [Kernel::Clip, Kernel::Shift] {
        cosine_gram(&x, n, d, kernel, &mut s, &mut inv, &|i| (0, i, format!("row {i}")), &[]).unwrap();
        for i in (0..n).step_by(7) {
            for j in (0..n).step_by(5) {
                let (a, b) = (&x[i * d..(i + 1) * d], &x[j * d..(j + 1) * d]);
                let dot: f64 = a.iter().zip(b).map(|(&p, &q)| p as f64 * q as f64).sum();
                let na: f64 = a.iter().map(|&p| p as f64 * p as f64).sum::<f64>().sqrt();
                let nb: f64 = b.iter().map(|&p| p as f64 * p as f64).sum::<f64>().sqrt();
                let c = if i == j { 1.0 } else { (dot / (na * nb)).clamp(-1.0, 1.0) };
                let want = match kernel {
                    Kernel::Clip => c.max(0.0),
                    Kernel::Shift => 0.5 * (1.0 + c),
                };
                assert!((s[i * n + j] as f64 - want).abs() < 1e-5, "({i}, {j}): {} vs {want}", s[i * n + j]);
            }
        }
    }
    x[123 * d..124 * d].fill(0.0);
    x[200 * d + 3] = f32::NAN;
    let e = cosine_gram(&x, n, d, Kernel::Clip, &mut s, &mut inv, &|i| (0, i, format!("row {i}")), &[]).unwrap_err();
    assert!(e.to_string().contains("row 123") && e.to_string().contains("zero norm"), "{e}");
    x[123 * d] = 1.0;
    let e = cosine_gram(&x, n, d, Kernel::Clip, &mut s, &mut inv, &|i| (0, i, format!("row {i}")), &[]).unwrap_err();
    assert!(e.to_string().contains("row 200") && e.to_string().contains("non-finite"), "{e}");
    // a norm whose inverse is not a normal float32 keeps the row's direction, never NaN cosines
    x[200 * d + 3] = 0.0;
    x[50 * d..51 * d].fill(1e-44);
    cosine_gram(&x, n, d, Kernel::Shift, &mut s, &mut inv, &|i| (0, i, format!("row {i}")), &[]).unwrap();
    let mut ones = x.clone();
    ones[50 * d..51 * d].fill(1.0);
    let (mut want, mut inv1) = (Vec::new(), Vec::new());
    cosine_gram(&ones, n, d, Kernel::Shift, &mut want, &mut inv1, &|i| (0, i, format!("row {i}")), &[]).unwrap();
    for j in 0..n {
        assert!(
            (s[50 * n + j] - want[50 * n + j]).abs() < 1e-6,
            "(50, {j}): {} vs {}",
            s[50 * n + j],
            want[50 * n + j]
        );
    }
}

#[test]
fn sweep_only_for_small_pools_with_a_small_k() {
    assert!(use_sweep(64, 4) && use_sweep(64, 10) && use_sweep(128, 21) && use_sweep(3, 4));
    assert!(!use_sweep(64, 11) && !use_sweep(128, 22) && !use_sweep(129, 1));
}

#[test]
fn on_demand_rows_with_tiny_norms_keep_their_direction() {
    // the same normalisation as the large Gram path: no NaN similarities,
    // the picks of the same rows at a usual scale
    let (n, d) = (5usize, 4usize);
    let mut x: Vec<f32> = (0..n * d).map(|t| 0.1 + (t % 7) as f32 * 0.2).collect();
    let p = params(3, 0.0, Optimizer::Lazy);
    x[2 * d..3 * d].fill(1.0);
    let want = facility_location_on_demand(&x, n, d, None, &p, Kernel::Clip).unwrap();
    x[2 * d..3 * d].fill(1e-44);
    let got = facility_location_on_demand(&x, n, d, None, &p, Kernel::Clip).unwrap();
    assert_eq!(got.indices, want.indices);
    assert!(got.gains.iter().all(|g| g.is_finite()), "{:?}", got.gains);
    // a zero row is still refused by name
    x[2 * d..3 * d].fill(0.0);
    let e = facility_location_on_demand(&x, n, d, None, &p, Kernel::Clip).unwrap_err();
    assert!(e.to_string().contains("candidate 2") && e.to_string().contains("zero norm"), "{e}");
}

#[test]
fn rows_with_norms_beyond_the_raw_product_keep_their_cosines() {
    // a small block (the raw-product path): squared norms that underflow and
    // overflow float32 give the cosines of the same rows at unit scale
    let (n, d) = (5usize, 3usize);
    let base: Vec<f32> =
        (0..n * d).map(|t| 0.2 + ((t * 7) % 5) as f32 * 0.3 - if t % 4 == 0 { 0.9 } else { 0.0 }).collect();
    for (row, scale) in [(1usize, 1e-30f32), (3, 1e-21), (2, 1e25), (4, 1e-36)] {
        let mut x = base.clone();
        x[row * d..(row + 1) * d].iter_mut().for_each(|v| *v *= scale);
        let (mut s, mut inv) = (Vec::new(), Vec::new());
        let (mut want, mut inv0) = (Vec::new(), Vec::new());
        cosine_gram(&x, n, d, Kernel::Shift, &mut s, &mut inv, &|i| (0, i, format!("row {i}")), &[]).unwrap();
        cosine_gram(&base, n, d, Kernel::Shift, &mut want, &mut inv0, &|i| (0, i, format!("row {i}")), &[]).unwrap();
        for (a, b) in s.iter().zip(&want) {
            assert!((a - b).abs() < 1e-5, "scale {scale}: {a} vs {b}");
        }
        // and selection on them runs, as on demand does
        let off = [0u64, n as u64];
        let pools = Pools::new(&x, d, &off, None).unwrap();
        let got = facility_location_batch(&pools, None, &params(2, 0.0, Optimizer::Lazy), Kernel::Shift).unwrap();
        let od = facility_location_on_demand(&x, n, d, None, &params(2, 0.0, Optimizer::Lazy), Kernel::Shift).unwrap();
        assert_eq!(got[0].indices, od.indices);
    }
    // subnormal values: the row's direction, as at unit scale
    let mut x = base.clone();
    x[2 * d..3 * d].fill(1e-44);
    let mut y = base.clone();
    y[2 * d..3 * d].fill(1.0);
    let (mut s, mut inv, mut want, mut inv0) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    cosine_gram(&x, n, d, Kernel::Shift, &mut s, &mut inv, &|i| (0, i, format!("row {i}")), &[]).unwrap();
    cosine_gram(&y, n, d, Kernel::Shift, &mut want, &mut inv0, &|i| (0, i, format!("row {i}")), &[]).unwrap();
    for (a, b) in s.iter().zip(&want) {
        assert!((a - b).abs() < 1e-6, "{a} vs {b}");
    }
    // a zero row is refused by name
    x[2 * d..3 * d].fill(0.0);
    let e = cosine_gram(&x, n, d, Kernel::Shift, &mut s, &mut inv, &|i| (0, i, format!("row {i}")), &[]).unwrap_err();
    assert!(e.to_string().contains("row 2") && e.to_string().contains("zero norm"), "{e}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn extreme_alpha_or_eps_gives_finite_gains_or_a_named_refusal(
        n in 1usize..8, k in 1usize..5, seed in 0u64..1000,
        alpha in prop::sample::select(vec![0.75, 2.0, 60.0, 1e3, 1e200, 1e308]),
        eps in prop::sample::select(vec![1e-300, 1e-200, 1e-6, 1.0, 1e150, 1e300, f64::MAX]),
        spread in prop::sample::select(vec![0.0, 0.5, 1.0, 10.0]),
    ) {
        let d = 3;
        let x: Vec<f32> = (0..2 * n * d).map(|t| {
            let z = (t as u64 + 1).wrapping_mul(6364136223846793005).wrapping_add(seed);
            ((z >> 40) as f32 / (1u64 << 24) as f32) - 0.3
        }).collect();
        let r: Vec<f64> = (0..2 * n).map(|i| spread * ((i as u64 * 2654435761 + seed) % 97) as f64 / 97.0).collect();
        let off = [0u64, n as u64, 2 * n as u64];
        let pools = Pools::new(&x, d, &off, None).unwrap();
        let p = Params { k, alpha, eps, k_max: None, optimizer: Optimizer::Lazy };
        let s = sym(n, &[0.3, 0.9, 0.1, 0.6]);
        let outcomes = [
            facility_location_batch(&pools, Some(&r), &p, Kernel::Shift).map(|v| v[1].clone()),
            facility_location_on_demand(&x[n * d..], n, d, Some(&r[n..]), &p, Kernel::Shift),
            facility_location_dense(&s, n, Some(&r[n..]), &p),
        ];
        for got in outcomes {
            match got {
                Ok(res) => {
                    prop_assert!(res.gains.iter().all(|g| g.is_finite()), "{:?}", res.gains);
                    prop_assert!(res.objective.is_finite() && res.upper_bound.is_finite());
                    prop_assert!(res.upper_bound >= res.objective);
                    // weights within the normal range: the picks follow the gains
                    prop_assert!(res.objective > 0.0);
                }
                Err(e) => {
                    let m = e.to_string();
                    prop_assert!(m.contains("alpha = ") && m.contains(" with eps = "), "{}", m);
                    prop_assert!(m.contains("overflow") || m.contains("underflow"), "{}", m);
                    prop_assert_eq!(e.arg(), Some("rewards"));
                    prop_assert!(e.pool().is_some());
                }
            }
        }
    }
}

#[test]
fn weights_beyond_float64_gains_are_refused_in_one_line() {
    let x: Vec<f32> = vec![1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 2.0];
    let off = [0u64, 4];
    let pools = Pools::new(&x, 2, &off, None).unwrap();
    let r = [0.0, 1.0, 2.0, 3.0];
    // q_max slightly above 1: q^1e308 = inf
    let p = Params { k: 2, alpha: 1e308, eps: 1e-6, k_max: None, optimizer: Optimizer::Lazy };
    let e = facility_location_batch(&pools, Some(&r), &p, Kernel::Shift).unwrap_err();
    assert_eq!(
        e.to_string(),
        "pool 0: alpha = 1e308 with eps = 1e-6 gives quality weights q^alpha up to inf, \
        whose gains overflow float64; use a smaller alpha or eps"
    );
    // equal rewards: q = eps for every candidate, q^alpha below the normal range
    let p = Params { k: 2, alpha: 1.0, eps: 1e-200, k_max: None, optimizer: Optimizer::Lazy };
    let e = facility_location_batch(&pools, Some(&[1.0; 4]), &p, Kernel::Shift).unwrap_err();
    assert!(e.to_string().contains("underflow float64"), "{e}");
    // the usual parameters are untouched
    let p = Params { k: 2, alpha: 0.75, eps: 1e-6, k_max: None, optimizer: Optimizer::Lazy };
    assert!(facility_location_batch(&pools, Some(&r), &p, Kernel::Shift).is_ok());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(60))]
    /// A pool run on demand picks the same candidates within any byte budget
    /// for its columns, down to none (a cache of one column, batches of one),
    /// as with its full cache.
    #[test]
    fn on_demand_picks_do_not_depend_on_its_memory_budget(
        seed in 0u64..1000, n in 2usize..160, d in 1usize..12, k in 1usize..8,
        budget in prop_oneof![Just(0usize), 1usize..4096, 4096usize..200_000], shift in any::<bool>(),
    ) {
        let x: Vec<f32> = (0..n * d)
            // never exactly 0: a row of d = 1 would have no direction
            .map(|i| (((i as u64).wrapping_mul(2654435761) ^ seed.wrapping_mul(40503)) % 997) as f32 / 498.0 - 0.999)
            .collect();
        let off = [0u64, n as u64];
        let pools = Pools::new(&x, d, &off, None).unwrap();
        let r: Vec<f64> = (0..n).map(|i| ((i as u64 * 31 + seed) % 17) as f64).collect();
        let p = params(k, 0.5, Optimizer::Lazy);
        let kernel = if shift { Kernel::Shift } else { Kernel::Clip };
        let full = facility_location_on_demand(&x, n, d, Some(&r), &p, kernel).unwrap();
        // a budget below the pool's n x n block: on demand, its columns within the budget
        let lean = facility_location_batch_within(&pools, Some(&r), &p, kernel, budget.min(n * n * 4 - 1)).unwrap();
        prop_assert_eq!(&full.indices, &lean[0].indices);
        prop_assert!((full.objective - lean[0].objective).abs() <= 1e-5 * full.objective.abs().max(1e-12));
    }
}

#[test]
fn every_pick_is_counted_for_progress() {
    let (n, d, k) = (50usize, 4usize, 7usize);
    let x: Vec<f32> = (0..n * d).map(|i| ((i * 37 % 101) as f32) / 50.0 - 1.0).collect();
    let before = grades_core::progress::picks_made();
    let r = facility_location_on_demand(&x, n, d, None, &params(k, 0.0, Optimizer::Lazy), Kernel::Clip).unwrap();
    assert_eq!(r.indices.len(), k);
    // other tests pick in parallel: the count grows by at least this selection's picks
    assert!(grades_core::progress::picks_made() >= before + k as u64);
}

/// A dense symmetric similarity whose gains are plain f64 sums and which lowers
/// lazy greedy's bounds by exact drops: lazy greedy's handling of the drops,
/// apart from any source's rounding.
struct Tracked {
    s: Vec<f32>,
    n: usize,
}

impl Source for Tracked {
    fn n(&self) -> usize {
        self.n
    }
    fn gains(&mut self, js: &[usize], w: &[f64], c: &[f64], out: &mut [f64]) {
        for (o, &j) in out.iter_mut().zip(js) {
            *o = (0..self.n).map(|i| w[i] * (w[j] * self.s[i * self.n + j] as f64 - c[i]).max(0.0)).sum();
        }
    }
    fn cover(&mut self, j: usize, w: &[f64], c: &mut [f64]) {
        for (i, ci) in c.iter_mut().enumerate() {
            *ci = ci.max(w[j] * self.s[i * self.n + j] as f64);
        }
    }
    fn tracks_drops(&self) -> bool {
        true
    }
    fn gain_drops(&mut self, rows: &[usize], old: &[f64], c: &[f64], w: &[f64], drop: &mut [f64]) -> bool {
        for (j, dj) in drop.iter_mut().enumerate() {
            let full: f64 = rows
                .iter()
                .map(|&i| w[i] * (w[j] * self.s[i * self.n + j] as f64 - old[i]).max(0.0).min(c[i] - old[i]))
                .sum();
            // summed in another order than the gains: a lower bound by a margin
            *dj = (full * (1.0 - 1e-9) - 1e-12).max(0.0);
        }
        true
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(80))]
    /// Lazy greedy that lowers every stale bound by its gain's drop after each
    /// pick picks what naive greedy (every gain evaluated at every step) picks,
    /// gain for gain to the bit: repeated values (ties, zero gains), weights.
    #[test]
    fn lazy_greedy_with_lowered_bounds_equals_naive(
        n in 2usize..60, k in 1usize..16,
        vals in prop::collection::vec(prop_oneof![0f32..=1.0, Just(0.0), Just(0.5), Just(1.0)], 1..200),
        rw in prop::collection::vec(-3f64..3.0, 60), alpha in prop::sample::select(vec![0.0, 0.5, 2.0]),
    ) {
        let s = sym(n, &vals);
        let w = weights(&rw[..n], alpha);
        let a = greedy(&mut Tracked { s: s.clone(), n }, &w, k, Optimizer::Naive);
        let b = greedy(&mut Tracked { s, n }, &w, k, Optimizer::Lazy);
        prop_assert_eq!(&a.indices, &b.indices);
        let bits = |v: &[f64]| v.iter().map(|g| g.to_bits()).collect::<Vec<_>>();
        prop_assert_eq!(bits(&a.gains), bits(&b.gains));
        prop_assert!(b.upper_bound >= b.objective);
    }

    /// The on-demand source's drops are lower bounds on the true drops (its
    /// columns' dot products rounded in another order included), and close to
    /// them, whatever the budget that cuts its rows into blocks.
    #[test]
    fn on_demand_gain_drops_are_lower_bounds(
        n in 2usize..120, d in 1usize..40, picks in 1usize..6, seed in 0u64..1000, shift in any::<bool>(),
        rw in prop::collection::vec(0.1f64..3.0, 120),
        budget in prop_oneof![Just(usize::MAX), 0usize..4096, 4096usize..200_000],
    ) {
        let h = |t: u64| {
            let z = (t + 1).wrapping_mul(6364136223846793005).wrapping_add(seed.wrapping_mul(1442695040888963407));
            ((z >> 33) as f32 / (1u64 << 31) as f32) - 0.5
        };
        let mut x: Vec<f32> = (0..n * d).map(|t| h(t as u64) + if t % d == 0 { 0.3 } else { 0.0 }).collect();
        for row in x.chunks_exact_mut(d) {
            let norm = row.iter().map(|v| v * v).sum::<f32>().sqrt();
            row.iter_mut().for_each(|v| *v /= norm);
        }
        let kernel = if shift { Kernel::Shift } else { Kernel::Clip };
        let w = &rw[..n];
        // the true similarities in f64
        let sim = |i: usize, j: usize| {
            let dot: f64 = (0..d).map(|a| x[i * d + a] as f64 * x[j * d + a] as f64).sum();
            kernel.apply(dot as f32) as f64
        };
        let mut src = OnDemandSource::within(x.clone(), n, d, kernel, budget);
        let mut c = vec![0f64; n];
        for p in 0..picks {
            let j = (seed as usize * 7 + p * 13) % n;
            let old = c.clone();
            src.cover(j, w, &mut c);
            let rows: Vec<usize> = (0..n).filter(|&i| c[i] > old[i]).collect();
            let mut drop = vec![0f64; n];
            prop_assert!(src.gain_drops(&rows, &old, &c, w, &mut drop));
            for (q, &dq) in drop.iter().enumerate() {
                let truth: f64 = rows.iter().map(|&i| w[i] * (w[q] * sim(i, q) - old[i]).max(0.0).min(c[i] - old[i])).sum();
                let scale = 1e-3 * w[q] * rows.iter().map(|&i| w[i]).sum::<f64>();
                prop_assert!(dq <= truth + 1e-12, "drop {} above the true drop {}", dq, truth);
                prop_assert!(dq >= truth - scale, "drop {} far below the true drop {}", dq, truth);
            }
        }
    }
}

/// A pool where two candidates' first gains tie within float32 rounding (3e-8 apart): the dense and
/// on-demand paths may take one each, each pick then within rounding of the other's.
#[test]
fn dense_and_on_demand_may_part_ways_only_within_rounding() {
    let (n, d, k, seed) = (27usize, 6usize, 2usize, 698u64);
    let x: Vec<f32> = (0..n * d)
        .map(|t| {
            let z =
                (t as u64 + 1).wrapping_mul(6364136223846793005).wrapping_add(seed.wrapping_mul(1442695040888963407));
            ((z >> 33) as f32 / (1u64 << 31) as f32) - 0.5 + if t % d == 0 { 1e-3 } else { 0.0 }
        })
        .collect();
    let p = params(k, 0.0, Optimizer::Lazy);
    let b = facility_location_on_demand(&x, n, d, None, &p, Kernel::Shift).unwrap();
    let off = [0u64, n as u64];
    let c = facility_location_batch(&Pools::new(&x, d, &off, None).unwrap(), None, &p, Kernel::Shift).unwrap();
    // on this machine's GEMM they part at the first pick; elsewhere the rounding may fall either way
    match c[0].indices.iter().zip(&b.indices).position(|(x, y)| x != y) {
        Some(t) => assert!((c[0].gains[t] - b.gains[t]).abs() <= 1e-6 * (1.0 + b.gains[t].abs())),
        None => assert!((c[0].objective - b.objective).abs() <= 1e-4 * (1.0 + b.objective.abs())),
    }
}

#[test]
fn a_batch_gives_each_pool_what_it_gives_alone_on_any_number_of_threads() {
    // pools large enough for the nested parallel steps (column gains of pools
    // of 4,096 and more, blocks above a stripe), small ones between them: the
    // buffers each thread reuses, and those a pool stolen inside a nested step
    // gets, change no pick
    let d = 6usize;
    let sizes = [5000usize, 3, 300, 4200, 70, 1, 600, 4100];
    let mut offsets = vec![0u64];
    for s in sizes {
        offsets.push(offsets.last().unwrap() + s as u64);
    }
    let rows = *offsets.last().unwrap() as usize;
    let x: Vec<f32> = (0..rows * d)
        .map(|t| ((t as u64 + 7).wrapping_mul(6364136223846793005) >> 40) as f32 / (1u64 << 24) as f32 - 0.5)
        .collect();
    let rewards: Vec<f64> = (0..rows).map(|i| ((i * 7919) % 1000) as f64 / 1000.0).collect();
    let p = params(3, 0.75, Optimizer::Lazy);
    let alone: Vec<_> = (0..sizes.len())
        .map(|q| {
            let (a, b) = (offsets[q] as usize, offsets[q + 1] as usize);
            let off = [0u64, (b - a) as u64];
            let one = Pools::new(&x[a * d..b * d], d, &off, None).unwrap();
            facility_location_batch(&one, Some(&rewards[a..b]), &p, Kernel::Clip).unwrap().remove(0)
        })
        .collect();
    let pools = Pools::new(&x, d, &offsets, None).unwrap();
    for threads in 1..=4 {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        let got = pool.install(|| facility_location_batch(&pools, Some(&rewards), &p, Kernel::Clip).unwrap());
        for (g, a) in got.iter().zip(&alone) {
            assert_eq!(g.indices, a.indices, "{threads} threads");
            assert_eq!(
                g.gains.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                a.gains.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Lazy greedy on a block made in stripes starts from the column sums
    /// summed while the block was made: the same picks and gains, to the
    /// bit, as naive greedy on the same pool, and the sums are those of the
    /// finished block within rounding.
    #[test]
    fn striped_blocks_start_lazy_greedy_from_their_column_sums(
        n in 257usize..700, d in 2usize..10, k in 1usize..7, seed in 0u64..1000,
        alpha in prop::sample::select(vec![0.0, 0.75, 2.0]), shift in any::<bool>(),
    ) {
        let kernel = if shift { Kernel::Shift } else { Kernel::Clip };
        let x: Vec<f32> = (0..n * d)
            .map(|t| (((t as u64 + 1) * 2654435761 + seed * 7919) % 2000) as f32 / 1000.0 - 1.0)
            .collect();
        let r: Vec<f64> = (0..n).map(|i| ((i as u64 * 31 + seed) % 17) as f64 / 4.0).collect();
        let off = [0u64, n as u64];
        let pools = Pools::new(&x, d, &off, None).unwrap();
        let lazy = facility_location_batch(&pools, Some(&r), &params(k, alpha, Optimizer::Lazy), kernel).unwrap();
        let naive = facility_location_batch(&pools, Some(&r), &params(k, alpha, Optimizer::Naive), kernel).unwrap();
        prop_assert_eq!(&lazy[0].indices, &naive[0].indices);
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        prop_assert_eq!(bits(&lazy[0].gains), bits(&naive[0].gains));
        prop_assert!(lazy[0].upper_bound >= lazy[0].objective);

        // the sums against a pass over the finished block
        let w = weights(&r, alpha);
        let (mut s, mut inv, mut sums) = (Vec::new(), Vec::new(), Vec::new());
        cosine_gram_with(&x, n, d, kernel, &mut s, &mut inv, &|i| (0, i, format!("{i}")), &[], Some((&w, &mut sums)))
            .unwrap();
        prop_assert_eq!(sums.len(), n);
        let mut exact = vec![0f64; n];
        let mut src = DenseSource::new(&s, n);
        src.gains(&(0..n).collect::<Vec<_>>(), &w, &vec![0.0; n], &mut exact);
        let mut bounds = vec![0f64; n];
        DenseSource::with_sums(&s, n, &sums).initial_bounds(&w, &mut bounds);
        for j in 0..n {
            let direct: f64 = (0..n).map(|i| w[i] * s[i * n + j] as f64).sum();
            prop_assert!((sums[j] - direct).abs() <= 1e-12 * direct.abs() + 1e-300, "column {}", j);
            prop_assert!(bounds[j] >= exact[j], "bound {} < gain {} (column {})", bounds[j], exact[j], j);
            prop_assert!(bounds[j] <= exact[j] * (1.0 + 1e-8) + 1e-300, "bound {} far above gain {}", bounds[j], exact[j]);
        }
    }
}
