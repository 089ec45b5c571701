use super::accumulator::{order_of, SHARDS};
use super::*;
use proptest::prelude::*;
use std::collections::HashMap;

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol * (1.0 + a.abs().max(b.abs()))
}

/// Per-prompt Welford in row order: the accumulator's statistics, bit for bit.
fn welford(keys: &[u64], x: &[f64]) -> HashMap<u64, Stats> {
    let mut m: HashMap<u64, Stats> = HashMap::new();
    for (k, v) in keys.iter().zip(x) {
        m.entry(*k).or_default().push(*v);
    }
    m
}

/// Two-pass reference per key.
fn reference(keys: &[u64], x: &[f64]) -> HashMap<u64, Stats> {
    let mut groups: HashMap<u64, Vec<f64>> = HashMap::new();
    for (k, v) in keys.iter().zip(x) {
        groups.entry(*k).or_default().push(*v);
    }
    groups.into_iter().map(|(k, v)| (k, Stats::of_slice(&v))).collect()
}

fn bits(a: &Accumulator) -> String {
    format!("{:?} {:?} {:?} {:?}", a.to_bytes(), a.summary(), a.used_moments(), a.used_stats())
}

fn same(a: &Accumulator, b: &Accumulator) -> bool {
    let ((ka, sa), (kb, sb)) = (a.per_prompt(), b.per_prompt());
    a.n_rows() == b.n_rows()
        && ka == kb
        && sa.iter().zip(&sb).all(|(s, t)| s.count == t.count && close(s.mean, t.mean, 1e-9) && close(s.m2, t.m2, 1e-7))
}

fn lcg(s: &mut u64) -> u64 {
    *s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    *s >> 33
}

/// `n` rows over about `prompts` prompts, grouped in runs or shuffled.
fn rows(n: usize, prompts: u64, shuffled: bool, seed: u64) -> (Vec<u64>, Vec<f64>) {
    let mut s = seed;
    let mut keys: Vec<u64> =
        (0..n as u64).map(|i| (i * prompts / n as u64).wrapping_mul(0x2545_F491_4F6C_DD1D)).collect();
    if shuffled {
        for i in (1..n).rev() {
            keys.swap(i, lcg(&mut s) as usize % (i + 1));
        }
    }
    let x = keys.iter().map(|k| (k % 1000) as f64 / 100.0 + (lcg(&mut s) % 1000) as f64 / 250.0).collect();
    (keys, x)
}

#[test]
fn welford_matches_two_pass() {
    let x = [1.0, 2.0, 4.0, 7.0, 11.0];
    let mut s = Stats::default();
    x.iter().for_each(|&v| s.push(v));
    assert_eq!(s.count, 5);
    assert!(close(s.mean, 5.0, 1e-12) && close(s.m2, 66.0, 1e-12));
    assert!(close(s.sample_variance().unwrap(), 16.5, 1e-12));
}

#[test]
fn summary_by_hand() {
    // prompt a: {1, 3} (mean 2, s2 2); prompt b: {5, 7, 9} (mean 7, s2 4); prompt c: {4}.
    let mut acc = Accumulator::new();
    acc.update(&[1, 1, 2, 3, 2, 2], &[1.0, 3.0, 5.0, 4.0, 7.0, 9.0]).unwrap();
    let s = acc.summary().unwrap();
    assert_eq!((s.n_rows, s.n_prompts, s.n_single_response_prompts, s.n_used_prompts, s.n_used_rows), (6, 3, 1, 2, 5));
    assert!(close(s.v_y_given_x, 3.0, 1e-12));
    assert!(close(s.var_of_means, 12.5, 1e-12));
    assert!(close(s.within_leak, (2.0 / 2.0 + 4.0 / 3.0) / 2.0, 1e-12));
    assert!(close(s.v_x, 12.5 - 7.0 / 6.0, 1e-12));
    assert!(close(s.grand_mean, 4.5, 1e-12) && close(s.mean_k, 2.5, 1e-12));
    // the free function over the same statistics in the same order
    let c = acc.used_stats();
    let used: Vec<Stats> = (0..2).map(|i| Stats { count: c.count[i], mean: c.mean[i], m2: c.m2[i] }).collect();
    let t = summarize(&used, 5).unwrap();
    assert_eq!((t.v_x_raw, t.v_y_given_x), (s.v_x_raw, s.v_y_given_x));
}

#[test]
fn clip_at_zero_and_raw_kept() {
    let mut acc = Accumulator::new();
    acc.update(&[1, 1, 2, 2], &[0.0, 10.0, 10.0, 0.0]).unwrap();
    let s = acc.summary().unwrap();
    assert!(s.v_x_raw < 0.0);
    assert_eq!(s.v_x, 0.0);
}

#[test]
fn bad_losses_are_named_and_nothing_is_added() {
    let mut acc = Accumulator::new();
    acc.update(&[1, 2], &[0.5, 0.25]).unwrap();
    let err = acc.update(&[1, 2, 3], &[0.0, f64::NAN, 1.0]).unwrap_err();
    assert_eq!((err.row(), err.pool(), err.arg()), (Some(3), None, None));
    let e = err.to_string();
    assert!(e.contains("row 3 (row 1 of this update)") && e.contains("NaN"), "{e}");
    assert_eq!((acc.n_rows(), acc.len(), acc.get(1).unwrap().count), (2, 2, 1));
    assert!(acc.update(&[1], &[f64::INFINITY]).is_err());
    assert!(acc.update_int_ids(&[1, 2], &[1.0]).unwrap_err().to_string().contains("same length"));
    assert!(acc.summary().unwrap_err().to_string().contains("at least 2 prompts"));
    // in a large update, the first bad row wins, wherever it is
    let (keys, mut x) = rows(300_000, 20_000, true, 3);
    x[250_001] = f64::NEG_INFINITY;
    x[270_000] = f64::NAN;
    let before = bits(&acc);
    let e = acc.update(&keys, &x).unwrap_err().to_string();
    assert!(e.contains("row 250003 (row 250001 of this update) is -inf"), "{e}");
    assert_eq!(bits(&acc), before);
}

#[test]
fn overflow_in_an_update_is_refused_and_undone() {
    let mut acc = Accumulator::new();
    acc.update(&[1, 1, 2, 2], &[1.0, 2.0, 3.0, 5.0]).unwrap();
    let before = bits(&acc);
    // finite losses whose squared deviations overflow f64
    let err = acc.update(&[7, 2, 9, 9], &[1.0, 4.0, 1e300, -1e300]).unwrap_err();
    assert_eq!(err.row(), Some(7));
    let e = err.to_string();
    assert!(e.contains("row 7 (row 3 of this update)") && e.contains("overflow"), "{e}");
    assert_eq!(bits(&acc), before);
    // large losses that do not overflow are folded exactly as Welford folds them
    let (k, x) = ([4u64, 4, 5, 5, 4], [1e150, 3e150, -2e150, 1e149, 2e150]);
    acc.update(&k, &x).unwrap();
    for (key, st) in welford(&k, &x) {
        assert_eq!(acc.get(key), Some(st));
    }
    // the accumulator now holds large statistics: a later small update that
    // overflows one of them is refused too
    let e = acc.update(&[3, 4], &[0.0, -1e155]).unwrap_err().to_string();
    assert!(e.contains("row 10 (row 1 of this update)"), "{e}");
    assert_eq!(acc.n_rows(), 9);
}

#[test]
fn overflow_in_a_merge_is_refused_and_undone() {
    let (mut a, mut b) = (Accumulator::new(), Accumulator::new());
    a.update(&[1, 1, 2, 2], &[1.0, 2.0, 1e154, 1e154]).unwrap();
    b.update(&[1, 2, 2], &[0.5, -1e154, -1e154]).unwrap();
    let before = bits(&a);
    let e = a.merge(&b).unwrap_err().to_string();
    assert!(e.contains("overflow") && e.contains(&format!("key {}", 2)), "{e}");
    assert_eq!(bits(&a), before);
    // summaries that overflow are refused rather than reported as inf
    let mut c = Accumulator::new();
    c.update(&[1, 1, 2, 2, 3, 3], &[-1e153, 1e153, 3e152, -3e152, 0.0, 1.0]).unwrap();
    assert!(c.summary().is_ok());
    assert!(c.used_moments().unwrap_err().to_string().contains("overflow"));
}

#[test]
fn merging_with_a_copy_of_itself_counts_every_row_twice() {
    let (keys, x) = rows(5_000, 300, true, 9);
    let mut a = Accumulator::new();
    a.update(&keys, &x).unwrap();
    let mut twice = Accumulator::new();
    twice.update(&keys, &x).unwrap();
    twice.update(&keys, &x).unwrap();
    let copy = a.clone();
    a.merge(&copy).unwrap();
    assert!(same(&a, &twice));
    for (k, s) in copy.per_prompt().0.iter().zip(copy.per_prompt().1) {
        let d = a.get(*k).unwrap();
        assert_eq!((d.count, d.mean, d.m2), (2 * s.count, s.mean, 2.0 * s.m2));
    }
}

#[test]
fn bytes_round_trip_and_refuse_every_corruption() {
    let mut acc = Accumulator::new();
    acc.update(&[5, 5, 9, 1, 9], &[1.0, 2.0, 3.0, 4.0, 6.5]).unwrap();
    let b = acc.to_bytes();
    assert_eq!(b.len(), 32 + 3 * 32 + 8);
    let back = Accumulator::from_bytes(&b).unwrap();
    assert_eq!(bits(&back), bits(&acc));
    assert_eq!(Accumulator::from_bytes(&Accumulator::new().to_bytes()).unwrap().len(), 0);
    // every single bit flipped, every truncation and any padding is refused
    for i in 0..b.len() {
        for bit in 0..8 {
            let mut c = b.clone();
            c[i] ^= 1 << bit;
            assert!(Accumulator::from_bytes(&c).is_err(), "flip of bit {bit} of byte {i} accepted");
        }
    }
    for n in 0..b.len() {
        assert!(Accumulator::from_bytes(&b[..n]).is_err(), "truncation to {n} bytes accepted");
    }
    let mut padded = b.clone();
    padded.push(0);
    assert!(Accumulator::from_bytes(&padded).unwrap_err().to_string().contains("truncated or padded"));
    let err = |c: &[u8]| Accumulator::from_bytes(c).unwrap_err().to_string();
    assert!(err(b"garbage").contains("magic"));
    let mut c = b.clone();
    c[40] ^= 1;
    assert!(err(&c).contains("checksum"));
    // contents that pass the checksum are still checked field by field
    let seal = |mut c: Vec<u8>| {
        let end = c.len() - 8;
        let h = xxhash_rust::xxh3::xxh3_64(&c[..end]);
        c[end..].copy_from_slice(&h.to_le_bytes());
        c
    };
    let mut c = b.clone();
    c[8] = 1;
    assert!(err(&seal(c)).contains("version 1"));
    let mut c = b.clone();
    c.copy_within(32..40, 64);
    assert!(err(&seal(c)).contains("each key once"));
    let mut c = b.clone();
    c[48..56].copy_from_slice(&f64::NAN.to_le_bytes());
    assert!(err(&seal(c)).contains("entry 0"));
    let mut c = b.clone();
    c[16] = 6;
    assert!(err(&seal(c)).contains("counts sum to 5"));
}

#[test]
fn integer_ids_are_their_keys() {
    let ids = [3i64, -7, 3, i64::MIN, i64::MAX, -7];
    let x = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    let keys: Vec<u64> = ids.iter().map(|&i| crate::keys::key_of_int(i)).collect();
    let (mut a, mut b) = (Accumulator::new(), Accumulator::new());
    a.update_int_ids(&ids, &x).unwrap();
    b.update(&keys, &x).unwrap();
    assert_eq!(a.to_bytes(), b.to_bytes());
    // and in the parallel path, ids in runs (keyed once a run)
    let big: Vec<i64> = (0..200_000i64).map(|i| i / 3 - 5_000).collect();
    let xs: Vec<f64> = (0..big.len()).map(|i| (i % 17) as f64).collect();
    let bk: Vec<u64> = big.iter().map(|&i| crate::keys::key_of_int(i)).collect();
    let (mut a, mut b) = (Accumulator::new(), Accumulator::new());
    a.update_int_ids(&big, &xs).unwrap();
    b.update(&bk, &xs).unwrap();
    assert_eq!(a.to_bytes(), b.to_bytes());
}

#[test]
fn results_are_in_key_hash_order_and_used_moments_match_the_list() {
    let (keys, x) = rows(60_000, 20_000, true, 5);
    let mut acc = Accumulator::new();
    acc.update(&keys, &x).unwrap();
    // used_stats lists the prompts with >= 2 rows in the order of order_of(key)
    let mut used: Vec<(u64, Stats)> = welford(&keys, &x).into_iter().filter(|e| e.1.count >= 2).collect();
    used.sort_by_key(|e| order_of(e.0));
    assert_eq!(acc.used_stats(), StatsColumns::of(&used.iter().map(|e| e.1).collect::<Vec<_>>()));
    let (k, _) = acc.per_prompt();
    assert!(k.windows(2).all(|w| w[0] < w[1]));
    let m = acc.used_moments().unwrap();
    let gbar = acc.summary().unwrap().grand_mean;
    let v: Vec<[f64; 4]> = used
        .iter()
        .map(|(_, s)| {
            let s2 = s.sample_variance().unwrap();
            [s2, s2 / s.count as f64, s.mean - gbar, (s.mean - gbar).powi(2)]
        })
        .collect();
    let p = v.len() as f64;
    let mu: [f64; 4] = std::array::from_fn(|a| v.iter().map(|r| r[a]).sum::<f64>() / p);
    assert_eq!(m.n, v.len() as u64);
    for a in 0..4 {
        assert!(close(m.mean[a], mu[a], 1e-9));
        for b in 0..4 {
            let cov = v.iter().map(|r| (r[a] - mu[a]) * (r[b] - mu[b])).sum::<f64>() / (p - 1.0);
            assert!(close(m.cov[a][b], cov, 1e-9), "{a}{b}: {} {cov}", m.cov[a][b]);
        }
    }
    assert!(acc.used_moments_about(f64::NAN).is_err());
}

#[test]
fn chunking_and_threads_do_not_change_a_bit() {
    // more than one stretch of the parallel path, shuffled and grouped
    for shuffled in [true, false] {
        let (keys, x) = rows(1_200_000, 70_000, shuffled, 11);
        let mut one = Accumulator::new();
        one.update(&keys, &x).unwrap();
        for (k, s) in welford(&keys, &x) {
            assert_eq!(one.get(k), Some(s));
        }
        let want = bits(&one);
        let mut cut = Accumulator::new();
        for (a, b) in [(0, 7), (7, 40_000), (40_000, 40_001), (40_001, 700_000), (700_000, keys.len())] {
            cut.update(&keys[a..b], &x[a..b]).unwrap();
        }
        assert_eq!(bits(&cut), want);
        let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
        let single = pool.install(|| {
            let mut a = Accumulator::new();
            a.update(&keys, &x).unwrap();
            bits(&a)
        });
        assert_eq!(single, want);
        let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap();
        assert_eq!(pool.install(|| bits(&one)), want);
    }
}

#[test]
fn prompts_spread_over_every_map() {
    let (keys, x) = rows(100_000, 50_000, false, 1);
    let mut acc = Accumulator::new();
    acc.update(&keys, &x).unwrap();
    assert_eq!(acc.shards.len(), SHARDS);
    let sizes: Vec<usize> = acc.shards.iter().map(|m| m.len()).collect();
    let mean = acc.len() as f64 / SHARDS as f64;
    assert!(sizes.iter().all(|&s| (s as f64) > 0.5 * mean && (s as f64) < 1.5 * mean), "{sizes:?}");
}

fn small_rows() -> impl Strategy<Value = (Vec<u64>, Vec<f64>)> {
    (1usize..300).prop_flat_map(|n| (prop::collection::vec(0u64..12, n), prop::collection::vec(-50.0f64..50.0, n)))
}

proptest! {
    #[test]
    fn any_split_and_merge_order_equals_one_pass(
        (keys, x) in small_rows(),
        cuts in prop::collection::vec(0usize..300, 0..6),
        seed in any::<u64>(),
    ) {
        let mut one = Accumulator::new();
        one.update(&keys, &x).unwrap();
        let r = reference(&keys, &x);
        prop_assert_eq!(one.len(), r.len());
        for (k, s) in &r {
            let t = one.get(*k).unwrap();
            prop_assert!(s.count == t.count && close(s.mean, t.mean, 1e-9) && close(s.m2, t.m2, 1e-7));
        }
        let n = keys.len();
        let mut c: Vec<usize> = cuts.into_iter().map(|v| v % (n + 1)).collect();
        c.extend([0, n]);
        c.sort_unstable();
        c.dedup();
        // the pieces in order: the bits of one update
        let mut cut = Accumulator::new();
        for w in c.windows(2) {
            cut.update(&keys[w[0]..w[1]], &x[w[0]..w[1]]).unwrap();
        }
        prop_assert_eq!(bits(&cut), bits(&one));
        // the pieces merged in a scrambled order, some through bytes
        let mut shards: Vec<Accumulator> = c.windows(2).map(|w| {
            let mut a = Accumulator::new();
            a.update(&keys[w[0]..w[1]], &x[w[0]..w[1]]).unwrap();
            if w[0] % 2 == 1 { Accumulator::from_bytes(&a.to_bytes()).unwrap() } else { a }
        }).collect();
        let mut s = seed;
        while shards.len() > 1 {
            let a = shards.swap_remove(lcg(&mut s) as usize % shards.len());
            let j = lcg(&mut s) as usize % shards.len();
            shards[j].merge(&a).unwrap();
        }
        let merged = shards.pop().unwrap();
        prop_assert!(same(&one, &merged));
        let back = Accumulator::from_bytes(&merged.to_bytes()).unwrap();
        prop_assert_eq!(bits(&back), bits(&merged));
        if let (Ok(a), Ok(b)) = (one.summary(), merged.summary()) {
            prop_assert!(close(a.v_x_raw, b.v_x_raw, 1e-7) && close(a.v_y_given_x, b.v_y_given_x, 1e-7));
        }
    }

    #[test]
    fn row_order_does_not_matter((keys, x) in small_rows(), seed in any::<u64>()) {
        let mut idx: Vec<usize> = (0..keys.len()).collect();
        let mut s = seed;
        for i in (1..idx.len()).rev() {
            idx.swap(i, lcg(&mut s) as usize % (i + 1));
        }
        let k2: Vec<u64> = idx.iter().map(|&i| keys[i]).collect();
        let x2: Vec<f64> = idx.iter().map(|&i| x[i]).collect();
        let (mut a, mut b) = (Accumulator::new(), Accumulator::new());
        a.update(&keys, &x).unwrap();
        b.update(&k2, &x2).unwrap();
        prop_assert!(same(&a, &b));
        // the order of the prompts in the results does not follow the rows
        prop_assert_eq!(a.used_stats().count, b.used_stats().count);
    }

    #[test]
    fn a_bad_loss_is_reported_with_its_row(
        (keys, x) in small_rows(),
        at in any::<prop::sample::Index>(),
        bad in prop::sample::select(vec![f64::NAN, f64::INFINITY, f64::NEG_INFINITY]),
        seen in 0usize..5,
    ) {
        let mut acc = Accumulator::new();
        acc.update(&vec![1; seen], &vec![0.5; seen]).unwrap();
        let before = bits(&acc);
        let mut x = x;
        let i = at.index(x.len());
        x[i] = bad;
        let err = acc.update(&keys, &x).unwrap_err();
        prop_assert_eq!(err.row(), Some(seen + i));
        let e = err.to_string();
        let want = format!("row {} (row {i} of this update)", seen + i);
        prop_assert!(e.contains(&want), "{}", e);
        prop_assert_eq!(bits(&acc), before);
    }
}
