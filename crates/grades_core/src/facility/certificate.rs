//! The approximation certificate: after which picks it is evaluated, and the
//! sum of the K largest gains it adds to F.

/// Whether the certificate is evaluated after `t` picks.
pub(super) fn certify_at(t: usize, k: usize, n: usize) -> bool {
    n <= 4096 || t == k || t.is_power_of_two() || t == 0
}

/// Sum of the `k` largest values (all of them if fewer), added in
/// descending order so that the result depends only on the values, not on
/// the order they come in.
pub(super) fn top_k_sum(vals: &mut [f64], k: usize) -> f64 {
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

/// [`top_k_sum`] for `1 <= k <= 8` and `k <= vals.len()`, without reordering
/// `vals`. For `k <= 4` each of four lanes keeps its four largest values by
/// compare-exchange (no branches, so it vectorises); the 16 survivors and the
/// tail then go through the small insertion below. The k largest values are
/// one multiset however they are found, and they are added in descending
/// order: the same bits.
pub(super) fn top_k_sum_small(vals: &[f64], k: usize) -> f64 {
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
