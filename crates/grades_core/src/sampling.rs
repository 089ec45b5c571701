//! Content-blind and reward-only selectors over a ragged batch of pools:
//! random-K (RKoN), top-K (BKoN) and mode-stratified K.
//!
//! Random draws are seeded per pool from `(seed, key)`, where `key` is the
//! 64-bit key of the pool's prompt id ([`crate::keys`]), so a pool's draw does
//! not depend on the other pools, sharding or the number of threads. Given
//! per-row content keys ([`crate::keys::content_key`]), each candidate draws
//! its own priority from `(seed, key, content)` and the smallest priorities
//! are kept: a uniform draw without replacement that does not depend on the
//! order of the pool's rows either (rows with equal content are
//! interchangeable). Top-K breaks equal rewards by content key the same way.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

use crate::error::{invalid, Error, Result};
use crate::pools::Layout;

// (the key functions live in `keys`; kept reachable here for existing callers)
pub use crate::keys::{key_of_bytes, key_of_int, keys_of_ints, keys_of_strings};

/// SplitMix64 finaliser.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The generator of one pool.
pub fn pool_rng(seed: u64, key: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(mix(mix(seed) ^ key))
}

/// `k` of `n` positions uniformly without replacement (partial Fisher-Yates),
/// in draw order. `k >= n` returns a random permutation of all `n`.
pub fn sample_without_replacement(rng: &mut ChaCha8Rng, n: usize, k: usize) -> Vec<usize> {
    let k = k.min(n);
    let mut v: Vec<usize> = (0..n).collect();
    for i in 0..k {
        let j = rng.random_range(i..n);
        v.swap(i, j);
    }
    v.truncate(k);
    v
}

/// The priority of a candidate with content key `content` in the pool drawn
/// from `(seed, key)`.
#[inline]
fn priority(seed: u64, key: u64, content: u64) -> u64 {
    mix(mix(mix(seed) ^ key) ^ content)
}

/// Every one of `members` (positions in the pool) by increasing priority
/// (then content key, then position).
fn order_by_content(members: &[usize], content: &dyn Fn(usize) -> u64, seed: u64, key: u64) -> Vec<usize> {
    let mut v: Vec<(u64, u64, usize)> = members
        .iter()
        .map(|&i| {
            let c = content(i);
            (priority(seed, key, c), c, i)
        })
        .collect();
    v.sort_unstable();
    v.into_iter().map(|t| t.2).collect()
}

/// The first `k` of `order` whose duplicate class (`class`, None: every row
/// distinct) is not taken yet; rows that repeat a taken class come last, in
/// their order, when fewer than `k` classes exist. Also: how many repeats
/// were passed over.
fn distinct_first(order: Vec<usize>, k: usize, class: Option<&dyn Fn(usize) -> u64>) -> (Vec<usize>, u64) {
    let Some(class) = class else {
        let mut o = order;
        o.truncate(k);
        return (o, 0);
    };
    let mut seen = std::collections::HashSet::new();
    let (mut out, mut rest) = (Vec::with_capacity(k), Vec::new());
    for i in order {
        if out.len() == k {
            break;
        }
        if seen.insert(class(i)) {
            out.push(i);
        } else {
            rest.push(i);
        }
    }
    let skipped = rest.len() as u64;
    let fill = k - out.len();
    out.extend(rest.into_iter().take(fill));
    (out, skipped - fill.min(skipped as usize) as u64)
}

/// Selected candidates of many pools: `indices[offsets[p]..offsets[p+1]]` are
/// pool p's picks (positions within the pool), in pick order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Picks {
    pub offsets: Vec<u64>,
    pub indices: Vec<u64>,
    /// Per pick weight (stratified only; 1 elsewhere).
    pub weights: Vec<f64>,
    /// Per pool: number of modes present in the pool that received no pick.
    pub modes_missed: Vec<u64>,
    /// Per pool: candidates passed over because they repeat a kept one.
    pub dup_skipped: Vec<u64>,
}

impl Picks {
    fn from_pools(per_pool: Vec<(Vec<usize>, Vec<f64>, u64, u64)>) -> Self {
        let mut out = Picks { offsets: vec![0], ..Default::default() };
        for (idx, w, missed, skipped) in per_pool {
            out.dup_skipped.push(skipped);
            out.indices.extend(idx.iter().map(|&i| i as u64));
            out.weights.extend(w);
            out.offsets.push(out.indices.len() as u64);
            out.modes_missed.push(missed);
        }
        out
    }
}

fn check_keys(layout: &Layout<'_>, keys: &[u64]) -> Result<()> {
    if keys.len() != layout.n_pools() {
        return invalid(format!("keys has {} entries but there are {} pools", keys.len(), layout.n_pools()));
    }
    Ok(())
}

fn check_k(k: usize) -> Result<()> {
    if k < 1 {
        return invalid(format!("k must be >= 1, got {k}"));
    }
    Ok(())
}

fn check_content(layout: &Layout<'_>, content: Option<&[u64]>, dups: Option<&[u64]>) -> Result<()> {
    for (name, v) in [("content keys", content), ("duplicate classes", dups)] {
        if let Some(c) = v {
            if c.len() != layout.n_rows() {
                return invalid(format!("{name} have {} entries but there are {} rows", c.len(), layout.n_rows()));
            }
        }
    }
    Ok(())
}

/// Random-K: `min(k, n)` uniformly without replacement in every pool; by
/// content priorities when `content` (per row) is given, else by position.
/// With `dups` (a duplicate class per row), no class is kept twice while
/// another class is left.
pub fn random_k(
    layout: &Layout<'_>,
    keys: &[u64],
    k: usize,
    seed: u64,
    content: Option<&[u64]>,
    dups: Option<&[u64]>,
) -> Result<Picks> {
    check_k(k)?;
    check_keys(layout, keys)?;
    check_content(layout, content, dups)?;
    let per: Vec<_> = (0..layout.n_pools())
        .into_par_iter()
        .map(|p| {
            let n = layout.len(p);
            let order = match content {
                Some(c) => {
                    let all: Vec<usize> = (0..n).collect();
                    order_by_content(&all, &|i| c[layout.row(p, i)], seed, keys[p])
                }
                None => sample_without_replacement(&mut pool_rng(seed, keys[p]), n, if dups.is_some() { n } else { k }),
            };
            let class = dups.map(|d| move |i: usize| d[layout.row(p, i)]);
            let (idx, skipped) = distinct_first(order, k.min(n), class.as_ref().map(|f| f as &dyn Fn(usize) -> u64));
            let w = vec![1.0; idx.len()];
            (idx, w, 0u64, skipped)
        })
        .collect();
    Ok(Picks::from_pools(per))
}

/// Top-K: the `min(k, n)` largest rewards of every pool, equal rewards by
/// the smaller content key when `content` (per row) is given, then the lower
/// index. `rewards` is indexed by row.
pub fn top_k(
    layout: &Layout<'_>,
    rewards: &[f64],
    k: usize,
    content: Option<&[u64]>,
    dups: Option<&[u64]>,
) -> Result<Picks> {
    check_k(k)?;
    check_content(layout, content, dups)?;
    if rewards.len() != layout.n_rows() {
        return invalid(format!("rewards has {} entries but there are {} rows", rewards.len(), layout.n_rows()));
    }
    let per: Result<Vec<_>> = (0..layout.n_pools())
        .into_par_iter()
        .map(|p| {
            let n = layout.len(p);
            let r: Vec<f64> = (0..n).map(|i| rewards[layout.row(p, i)]).collect();
            if let Some((i, v)) = r.iter().enumerate().find(|(_, v)| !v.is_finite()) {
                return Err(Error::at(
                    p,
                    "rewards",
                    layout.row(p, i),
                    format!("reward of candidate {i} is {v}; rewards must be finite"),
                ));
            }
            let mut idx: Vec<usize> = (0..n).collect();
            // finite values (checked above); -0.0 and 0.0 tie, as they compare equal
            let ck = |i: usize| content.map_or(0, |c| c[layout.row(p, i)]);
            idx.sort_by(|&a, &b| r[b].partial_cmp(&r[a]).unwrap_or(std::cmp::Ordering::Equal).then(ck(a).cmp(&ck(b))));
            let class = dups.map(|d| move |i: usize| d[layout.row(p, i)]);
            let (idx, skipped) = distinct_first(idx, k.min(n), class.as_ref().map(|f| f as &dyn Fn(usize) -> u64));
            let w = vec![1.0; idx.len()];
            Ok((idx, w, 0u64, skipped))
        })
        .collect();
    Ok(Picks::from_pools(per?))
}

/// Largest-remainder allocation of `k` over strata of sizes `counts`
/// (`k <= sum counts`): `k_m = floor(k p_m)` plus one for the largest
/// remainders; remainder ties go to the larger stratum, then the earlier one.
pub fn largest_remainder(counts: &[usize], k: usize) -> Vec<usize> {
    let n: usize = counts.iter().sum();
    if n == 0 {
        return vec![0; counts.len()];
    }
    let k = k.min(n);
    // exact integer arithmetic: k * c_m = q_m * n + rem_m
    let mut alloc: Vec<usize> = counts.iter().map(|&c| (k * c) / n).collect();
    let given: usize = alloc.iter().sum();
    let mut order: Vec<usize> = (0..counts.len()).collect();
    order.sort_by(|&a, &b| {
        let ra = (k * counts[a]) % n;
        let rb = (k * counts[b]) % n;
        rb.cmp(&ra).then(counts[b].cmp(&counts[a])).then(a.cmp(&b))
    });
    for &m in order.iter().take(k - given) {
        alloc[m] += 1;
    }
    alloc
}

/// Moves picks from strata allocated more than their `distinct` candidates
/// to strata with distinct candidates left, one at a time to the stratum
/// whose share `counts[m] / (alloc[m] + 1)` is largest (then the earlier).
fn cap_to_distinct(alloc: &mut [usize], counts: &[usize], distinct: &[usize]) {
    let mut excess = 0;
    for (a, &c) in alloc.iter_mut().zip(distinct) {
        if *a > c {
            excess += *a - c;
            *a = c;
        }
    }
    while excess > 0 {
        let best = (0..alloc.len())
            .filter(|&m| alloc[m] < distinct[m])
            // counts[a] / (alloc[a] + 1) > counts[b] / (alloc[b] + 1), in integers
            .max_by(|&a, &b| (counts[a] * (alloc[b] + 1)).cmp(&(counts[b] * (alloc[a] + 1))).then(b.cmp(&a)));
        match best {
            Some(m) => alloc[m] += 1,
            None => break,
        }
        excess -= 1;
    }
    // fewer distinct candidates than picks: the rest are repeats, in stratum order
    if excess > 0 {
        for (a, &c) in alloc.iter_mut().zip(counts) {
            let more = (c - *a).min(excess);
            *a += more;
            excess -= more;
        }
    }
}

/// Mode-stratified K. `modes` (indexed by row) labels each candidate's mode.
/// Each pool allocates `k` over its modes by largest remainder of `k p_m`
/// and draws uniformly inside each mode (by content priorities when
/// `content` is given, as [`random_k`]). Each pick carries the weight
/// `k p_m / k_m`, which makes the weighted mean of the picks an unbiased
/// estimate of the pool mean whenever every mode gets a pick; modes that got
/// none are counted in `modes_missed`.
pub fn stratified_k(
    layout: &Layout<'_>,
    modes: &[i64],
    keys: &[u64],
    k: usize,
    seed: u64,
    content: Option<&[u64]>,
    dups: Option<&[u64]>,
) -> Result<Picks> {
    check_k(k)?;
    check_keys(layout, keys)?;
    check_content(layout, content, dups)?;
    if modes.len() != layout.n_rows() {
        return invalid(format!("modes has {} entries but there are {} rows", modes.len(), layout.n_rows()));
    }
    let per: Vec<_> = (0..layout.n_pools())
        .into_par_iter()
        .map(|p| {
            let n = layout.len(p);
            // modes in order of first appearance, with their members
            let mut labels: Vec<i64> = Vec::new();
            let mut members: Vec<Vec<usize>> = Vec::new();
            for i in 0..n {
                let m = modes[layout.row(p, i)];
                match labels.iter().position(|&l| l == m) {
                    Some(s) => members[s].push(i),
                    None => {
                        labels.push(m);
                        members.push(vec![i]);
                    }
                }
            }
            // order strata by label so the draw does not depend on row order
            let mut order: Vec<usize> = (0..labels.len()).collect();
            order.sort_by_key(|&s| labels[s]);
            let members: Vec<Vec<usize>> = order.iter().map(|&s| std::mem::take(&mut members[s])).collect();
            let counts: Vec<usize> = members.iter().map(|m| m.len()).collect();
            let kk = k.min(n);
            let mut alloc = largest_remainder(&counts, kk);
            if let Some(d) = dups {
                // no stratum keeps a repeat while another has a distinct candidate left
                let distinct: Vec<usize> = members
                    .iter()
                    .map(|m| m.iter().map(|&i| d[layout.row(p, i)]).collect::<std::collections::HashSet<_>>().len())
                    .collect();
                cap_to_distinct(&mut alloc, &counts, &distinct);
            }
            let mut rng = pool_rng(seed, keys[p]);
            let mut idx = Vec::with_capacity(kk);
            let mut w = Vec::with_capacity(kk);
            let mut missed = 0u64;
            let mut skipped = 0u64;
            for (s, mem) in members.iter().enumerate() {
                let km = alloc[s];
                if km == 0 {
                    missed += 1;
                    continue;
                }
                let wt = kk as f64 * (mem.len() as f64 / n as f64) / km as f64;
                let order = match content {
                    Some(c) => order_by_content(mem, &|i| c[layout.row(p, i)], seed, keys[p]),
                    None => {
                        let take = if dups.is_some() { mem.len() } else { km };
                        sample_without_replacement(&mut rng, mem.len(), take).into_iter().map(|pos| mem[pos]).collect()
                    }
                };
                let class = dups.map(|d| move |i: usize| d[layout.row(p, i)]);
                let (drawn, sk) = distinct_first(order, km, class.as_ref().map(|f| f as &dyn Fn(usize) -> u64));
                skipped += sk;
                for i in drawn {
                    idx.push(i);
                    w.push(wt);
                }
            }
            (idx, w, missed, skipped)
        })
        .collect();
    Ok(Picks::from_pools(per))
}
