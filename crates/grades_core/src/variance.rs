//! Streaming, mergeable prompt/response variance accumulators for the
//! variance-budget law.
//!
//! One pass over `(prompt key, loss)` rows, in any order, keeps for every
//! prompt its response count, mean loss and sum of squared deviations `M2`
//! (Welford). Two accumulators merge exactly with Chan et al.'s parallel
//! update, so shards processed by different workers combine into the same
//! statistics as a single pass (up to floating-point rounding).
//!
//! Rows whose key repeats the previous row's key (the usual layout: the
//! responses of a prompt stored together) are folded as a run: the run's own
//! mean and `M2` are computed in one pass and merged into the table once, so
//! the table is touched once per run rather than once per row; the table
//! slots of upcoming runs are prefetched so that cache misses overlap.
//!
//! From the per-prompt statistics, [`Accumulator::summary`] gives the
//! estimators of the paper's decomposition `Var = V_x / Np + V_y|x / (Np K)`:
//!
//! * `V_y|x = mean_i s_i^2` over prompts with at least two responses, where
//!   `s_i^2 = M2_i / (K_i - 1)` is the unbiased within-prompt variance;
//! * `V_x = max(0, var_i(g_i) - mean_i(s_i^2 / K_i))`, where `g_i` is the mean
//!   loss of prompt `i` and `var_i` is the *unbiased* (ddof = 1) variance of the
//!   prompt means. With `K_i` independent of the prompt, each `g_i` has
//!   variance `V_x + sigma_i^2 / K_i` around the common mean, and for
//!   independent variables with a common mean the ddof = 1 sample variance is
//!   unbiased for the average of their variances, i.e. for
//!   `V_x + mean_i(sigma_i^2 / K_i)`; `s_i^2 / K_i` is unbiased for
//!   `sigma_i^2 / K_i`, so the difference is unbiased for `V_x` before the clip
//!   at 0, also when the `K_i` differ. (The population variance, ddof = 0,
//!   would be biased low by a factor `(P - 1) / P`.)
//!
//! Prompts with a single response carry no within-prompt information; they
//! are left out of both estimators and counted in
//! [`Summary::n_single_response_prompts`] so the caller can report them.

use crate::error::{invalid, Error, Result};

/// Per-prompt running statistics.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Stats {
    /// Number of responses (rows) seen.
    pub count: u64,
    /// Mean loss.
    pub mean: f64,
    /// Sum of squared deviations from the mean.
    pub m2: f64,
}

impl Stats {
    /// Statistics of a slice of finite values (two passes over the slice,
    /// which is in cache: more accurate than a one-pass update).
    pub fn of_slice(x: &[f64]) -> Stats {
        if x.is_empty() {
            return Stats::default();
        }
        let n = x.len() as f64;
        let mean = x.iter().sum::<f64>() / n;
        let m2 = x.iter().map(|&v| (v - mean) * (v - mean)).sum::<f64>();
        Stats { count: x.len() as u64, mean, m2 }
    }

    /// Welford update with one value.
    #[inline]
    pub fn push(&mut self, x: f64) {
        self.count += 1;
        let d = x - self.mean;
        self.mean += d / self.count as f64;
        self.m2 += d * (x - self.mean);
    }

    /// Chan et al.'s exact merge of two sets of statistics.
    #[inline]
    pub fn merge(&mut self, o: &Stats) {
        if o.count == 0 {
            return;
        }
        if self.count == 0 {
            *self = *o;
            return;
        }
        let (na, nb) = (self.count as f64, o.count as f64);
        let n = na + nb;
        let d = o.mean - self.mean;
        self.mean += d * (nb / n);
        self.m2 += o.m2 + d * d * (na * nb / n);
        self.count += o.count;
    }

    /// Unbiased variance `M2 / (count - 1)`; `None` below two values.
    pub fn sample_variance(&self) -> Option<f64> {
        (self.count >= 2).then(|| self.m2 / (self.count - 1) as f64)
    }
}

/// Open-addressing (linear probing) table from prompt key to [`Stats`].
/// A slot is empty when its count is 0; the home slot is the top bits of a
/// multiplicative hash. [`Accumulator::update`] prefetches the slots of the
/// runs a few steps ahead so that cache misses overlap.
#[derive(Debug, Clone)]
struct Table {
    slots: Vec<(u64, Stats)>,
    len: usize,
    bits: u32,
}

#[inline]
fn hash(k: u64) -> u64 {
    (k ^ (k >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

impl Default for Table {
    fn default() -> Self {
        Table::with_bits(4)
    }
}

impl Table {
    fn with_bits(bits: u32) -> Self {
        Table { slots: vec![(0, Stats::default()); 1usize << bits], len: 0, bits }
    }

    #[inline]
    fn home(&self, h: u64) -> usize {
        (h >> (64 - self.bits)) as usize
    }

    fn reserve(&mut self, additional: usize) {
        let need = self.len + additional;
        if need * 10 <= self.slots.len() * 7 {
            return;
        }
        let mut bits = self.bits;
        while need * 10 > (1usize << bits) * 7 {
            bits += 1;
        }
        let old = std::mem::replace(self, Table::with_bits(bits));
        for (k, st) in old.slots {
            if st.count != 0 {
                self.merge_in(k, hash(k), &st);
            }
        }
    }

    /// Merge `st` into key's slot (inserting it). Capacity must be reserved.
    #[inline]
    fn merge_in(&mut self, key: u64, h: u64, st: &Stats) -> bool {
        let mask = self.slots.len() - 1;
        let mut i = self.home(h);
        loop {
            let slot = &mut self.slots[i];
            if slot.1.count == 0 {
                *slot = (key, *st);
                self.len += 1;
                return false;
            }
            if slot.0 == key {
                slot.1.merge(st);
                return true;
            }
            i = (i + 1) & mask;
        }
    }

    #[inline]
    fn upsert(&mut self, key: u64, h: u64, st: &Stats) -> bool {
        self.reserve(1);
        self.merge_in(key, h, st)
    }

    /// Hint the CPU to fetch the home slot of hash `h` (no effect on results).
    #[inline(always)]
    fn prefetch(&self, h: u64) {
        #[cfg(target_arch = "x86_64")]
        {
            let p = self.slots.as_ptr().wrapping_add(self.home(h)) as *const i8;
            // SAFETY: prefetch is a hint; it never faults, even on a bad address.
            unsafe { std::arch::x86_64::_mm_prefetch(p, std::arch::x86_64::_MM_HINT_T0) }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = h;
    }

    fn get(&self, key: u64) -> Option<&Stats> {
        let mask = self.slots.len() - 1;
        let mut i = self.home(hash(key));
        loop {
            let slot = &self.slots[i];
            if slot.1.count == 0 {
                return None;
            }
            if slot.0 == key {
                return Some(&slot.1);
            }
            i = (i + 1) & mask;
        }
    }

    fn iter(&self) -> impl Iterator<Item = (u64, &Stats)> {
        self.slots.iter().filter(|s| s.1.count != 0).map(|s| (s.0, &s.1))
    }
}

/// Rows per block of [`Accumulator::update`]: a block's runs are folded
/// first, then merged into the table with software prefetching.
const BLOCK: usize = 1 << 18;
/// Below this many slots (about 1 MiB) the table is in cache; no prefetching.
const PREFETCH_MIN_SLOTS: usize = 1 << 15;
/// How many runs ahead the table slot is prefetched.
const PREFETCH: usize = 16;

/// Streaming accumulator of per-prompt loss statistics.
#[derive(Debug, Clone, Default)]
pub struct Accumulator {
    map: Table,
    rows: u64,
}

/// The decomposition estimated from an accumulator.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// Total rows seen.
    pub n_rows: u64,
    /// Distinct prompts seen.
    pub n_prompts: u64,
    /// Prompts with exactly one response (left out of the estimators).
    pub n_single_response_prompts: u64,
    /// Prompts used by the estimators (two or more responses).
    pub n_used_prompts: u64,
    /// Rows of the prompts used.
    pub n_used_rows: u64,
    /// `mean_i s_i^2`.
    pub v_y_given_x: f64,
    /// Unbiased (ddof = 1) variance of the prompt means.
    pub var_of_means: f64,
    /// `mean_i s_i^2 / K_i`: the within-prompt noise in `var_of_means`.
    pub within_leak: f64,
    /// `var_of_means - within_leak`, before the clip at 0 (may be negative).
    pub v_x_raw: f64,
    /// `max(0, v_x_raw)`.
    pub v_x: f64,
    /// Mean of the prompt means.
    pub grand_mean: f64,
    /// Mean number of responses over the prompts used.
    pub mean_k: f64,
}

const MAGIC: &[u8; 8] = b"MRTVACC\0";
const VERSION: u32 = 1;
const HEADER: usize = 8 + 4 + 4 + 8 + 8;
const ENTRY: usize = 32;

#[inline]
fn first_non_finite(x: &[f64]) -> Option<usize> {
    // Integer test on the exponent bits: vectorises, unlike an early-exit scan.
    const EXP: u64 = 0x7ff0_0000_0000_0000;
    let mut base = 0;
    for chunk in x.chunks(1024) {
        let bad = chunk.iter().fold(0u64, |a, v| a | ((v.to_bits() & EXP == EXP) as u64));
        if bad != 0 {
            return chunk.iter().position(|v| !v.is_finite()).map(|p| base + p);
        }
        base += chunk.len();
    }
    None
}

impl Accumulator {
    /// An empty accumulator.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of distinct prompts seen.
    pub fn len(&self) -> usize {
        self.map.len
    }

    /// True when no row has been seen.
    pub fn is_empty(&self) -> bool {
        self.map.len == 0
    }

    /// Total rows seen.
    pub fn n_rows(&self) -> u64 {
        self.rows
    }

    /// Statistics of one prompt.
    pub fn get(&self, key: u64) -> Option<&Stats> {
        self.map.get(key)
    }

    /// Add rows `(keys[i], losses[i])`. All-or-nothing: a NaN or infinite loss
    /// is reported with its row index (counted from the first row this
    /// accumulator has seen, and within this call) and nothing is added.
    pub fn update(&mut self, keys: &[u64], losses: &[f64]) -> Result<()> {
        if keys.len() != losses.len() {
            return invalid(format!(
                "keys and losses must have the same length, got {} and {}",
                keys.len(),
                losses.len()
            ));
        }
        if let Some(i) = first_non_finite(losses) {
            return Err(Error::Invalid(format!(
                "loss at row {} (row {} of this update) is {}: losses must be finite",
                self.rows + i as u64,
                i,
                losses[i]
            )));
        }
        let mut runs: Vec<(u64, u64, Stats)> = Vec::new();
        for (kb, xb) in keys.chunks(BLOCK).zip(losses.chunks(BLOCK)) {
            runs.clear();
            let n = kb.len();
            let mut i = 0;
            while i < n {
                // One fused pass over a run of equal keys: sums of deviations
                // from the run's first value (the shifted-data algorithm, stable
                // because the shift is a sample of the run).
                let k = kb[i];
                let shift = xb[i];
                let (mut s1, mut s2) = (0.0f64, 0.0f64);
                let mut j = i + 1;
                while j < n && kb[j] == k {
                    let d = xb[j] - shift;
                    s1 += d;
                    s2 += d * d;
                    j += 1;
                }
                let c = (j - i) as u64;
                let md = s1 / c as f64;
                runs.push((hash(k), k, Stats { count: c, mean: shift + md, m2: (s2 - s1 * md).max(0.0) }));
                i = j;
            }
            if self.map.slots.len() >= PREFETCH_MIN_SLOTS && runs.len() >= 1024 {
                // Reserve first so that the home slots stay valid while prefetching.
                self.map.reserve(runs.len());
                for r in 0..runs.len() {
                    if let Some(ahead) = runs.get(r + PREFETCH) {
                        self.map.prefetch(ahead.0);
                    }
                    let (h, k, st) = &runs[r];
                    self.map.merge_in(*k, *h, st);
                }
            } else {
                for (h, k, st) in &runs {
                    self.map.upsert(*k, *h, st);
                }
            }
        }
        self.rows += keys.len() as u64;
        Ok(())
    }

    /// Fold another accumulator into this one (exact, order-free up to rounding).
    pub fn merge(&mut self, other: &Accumulator) {
        // other's slots are in hash order already: a forward sweep here too
        for (k, s) in other.map.iter() {
            self.map.upsert(k, hash(k), s);
        }
        self.rows += other.rows;
    }

    /// Per-prompt statistics sorted by key: `(keys, stats)`.
    pub fn per_prompt(&self) -> (Vec<u64>, Vec<Stats>) {
        let mut v: Vec<(u64, Stats)> = self.map.iter().map(|(k, s)| (k, *s)).collect();
        v.sort_unstable_by_key(|e| e.0);
        v.into_iter().unzip()
    }

    /// The estimators of the decomposition. Deterministic for a given state
    /// (prompts are visited in key order). Errors when fewer than two prompts
    /// have at least two responses.
    pub fn summary(&self) -> Result<Summary> {
        let (_, stats) = self.per_prompt();
        summarize(&stats, self.rows)
    }

    /// Serialise: magic `MRTVACC\0`, u32 version, u32 reserved, u64 rows,
    /// u64 entries, then per prompt in key order u64 key, u64 count, f64 mean,
    /// f64 m2; all little-endian. Equal states give equal bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let (keys, stats) = self.per_prompt();
        let mut out = Vec::with_capacity(HEADER + ENTRY * keys.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&self.rows.to_le_bytes());
        out.extend_from_slice(&(keys.len() as u64).to_le_bytes());
        for (k, s) in keys.iter().zip(&stats) {
            out.extend_from_slice(&k.to_le_bytes());
            out.extend_from_slice(&s.count.to_le_bytes());
            out.extend_from_slice(&s.mean.to_le_bytes());
            out.extend_from_slice(&s.m2.to_le_bytes());
        }
        out
    }

    /// Inverse of [`Accumulator::to_bytes`]; every field is checked.
    pub fn from_bytes(b: &[u8]) -> Result<Accumulator> {
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        if b.len() < HEADER || &b[..8] != MAGIC {
            return invalid("not a serialised variance accumulator (bad magic or too short)");
        }
        let ver = u32::from_le_bytes(b[8..12].try_into().unwrap());
        if ver != VERSION {
            return invalid(format!("unsupported variance accumulator format version {ver} (this build reads {VERSION})"));
        }
        let rows = u64_at(16);
        let n = u64_at(24);
        let expect = (n as u128) * ENTRY as u128 + HEADER as u128;
        if expect != b.len() as u128 {
            return invalid(format!(
                "truncated or padded variance accumulator: header says {n} prompts ({expect} bytes), got {} bytes",
                b.len()
            ));
        }
        let mut map = Table::default();
        map.reserve((n as usize).min(b.len() / ENTRY));
        let mut total = 0u64;
        for i in 0..n as usize {
            let o = HEADER + i * ENTRY;
            let key = u64_at(o);
            let count = u64_at(o + 8);
            let mean = f64::from_bits(u64_at(o + 16));
            let m2 = f64::from_bits(u64_at(o + 24));
            if count == 0 || !mean.is_finite() || !m2.is_finite() || m2 < 0.0 {
                return invalid(format!(
                    "corrupt variance accumulator: prompt entry {i} has count {count}, mean {mean}, m2 {m2}"
                ));
            }
            total = total.saturating_add(count);
            if map.upsert(key, hash(key), &Stats { count, mean, m2 }) {
                return invalid(format!("corrupt variance accumulator: key {key} appears twice"));
            }
        }
        if total != rows {
            return invalid(format!("corrupt variance accumulator: counts sum to {total}, header says {rows} rows"));
        }
        Ok(Accumulator { map, rows })
    }
}

/// Estimators from per-prompt statistics (in a fixed order).
pub fn summarize(stats: &[Stats], n_rows: u64) -> Result<Summary> {
    let n_prompts = stats.len() as u64;
    let single = stats.iter().filter(|s| s.count == 1).count() as u64;
    let used: Vec<&Stats> = stats.iter().filter(|s| s.count >= 2).collect();
    let p = used.len();
    if p < 2 {
        return invalid(format!(
            "need at least 2 prompts with >= 2 responses to separate V_x from V_y|x; got {p} \
             ({n_prompts} prompt(s), {single} with a single response)"
        ));
    }
    let pf = p as f64;
    let (mut s2_sum, mut leak_sum, mut g_sum, mut k_sum, mut rows_used) = (0.0, 0.0, 0.0, 0.0, 0u64);
    for s in &used {
        let s2 = s.m2 / (s.count - 1) as f64;
        s2_sum += s2;
        leak_sum += s2 / s.count as f64;
        g_sum += s.mean;
        k_sum += s.count as f64;
        rows_used += s.count;
    }
    let grand = g_sum / pf;
    let ss: f64 = used.iter().map(|s| (s.mean - grand) * (s.mean - grand)).sum();
    let var_of_means = ss / (pf - 1.0);
    let v_y = s2_sum / pf;
    let leak = leak_sum / pf;
    let raw = var_of_means - leak;
    Ok(Summary {
        n_rows,
        n_prompts,
        n_single_response_prompts: single,
        n_used_prompts: p as u64,
        n_used_rows: rows_used,
        v_y_given_x: v_y,
        var_of_means,
        within_leak: leak,
        v_x_raw: raw,
        v_x: raw.max(0.0),
        grand_mean: grand,
        mean_k: k_sum / pf,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol * (1.0 + a.abs().max(b.abs()))
    }

    fn same(a: &Accumulator, b: &Accumulator) -> bool {
        if a.len() != b.len() || a.n_rows() != b.n_rows() {
            return false;
        }
        a.map.iter().all(|(k, s)| match b.get(k) {
            Some(t) => s.count == t.count && close(s.mean, t.mean, 1e-9) && close(s.m2, t.m2, 1e-7),
            None => false,
        })
    }

    /// Two-pass reference per key.
    fn reference(keys: &[u64], x: &[f64]) -> HashMap<u64, Stats> {
        let mut groups: HashMap<u64, Vec<f64>> = HashMap::new();
        for (k, v) in keys.iter().zip(x) {
            groups.entry(*k).or_default().push(*v);
        }
        groups.into_iter().map(|(k, v)| (k, Stats::of_slice(&v))).collect()
    }

    #[test]
    fn welford_matches_two_pass() {
        let x = [1.0, 2.0, 4.0, 7.0, 11.0];
        let mut s = Stats::default();
        for v in x {
            s.push(v);
        }
        let r = Stats::of_slice(&x);
        assert_eq!(s.count, 5);
        assert!(close(s.mean, 5.0, 1e-12) && close(s.mean, r.mean, 1e-12));
        assert!(close(s.m2, 66.0, 1e-12) && close(s.m2, r.m2, 1e-12));
        assert!(close(s.sample_variance().unwrap(), 16.5, 1e-12));
    }

    #[test]
    fn summary_by_hand() {
        // prompt a: {1, 3} (mean 2, s2 2); prompt b: {5, 7, 9} (mean 7, s2 4); prompt c: {4}.
        let mut acc = Accumulator::new();
        acc.update(&[1, 1, 2, 3, 2, 2], &[1.0, 3.0, 5.0, 4.0, 7.0, 9.0]).unwrap();
        let s = acc.summary().unwrap();
        assert_eq!((s.n_rows, s.n_prompts, s.n_single_response_prompts, s.n_used_prompts), (6, 3, 1, 2));
        assert!(close(s.v_y_given_x, 3.0, 1e-12));
        assert!(close(s.var_of_means, 12.5, 1e-12)); // (2-4.5)^2+(7-4.5)^2 over 1
        assert!(close(s.within_leak, (2.0 / 2.0 + 4.0 / 3.0) / 2.0, 1e-12));
        assert!(close(s.v_x, 12.5 - 7.0 / 6.0, 1e-12));
    }

    #[test]
    fn clip_at_zero_and_raw_kept() {
        let mut acc = Accumulator::new();
        // equal means, large within variance -> raw negative
        acc.update(&[1, 1, 2, 2], &[0.0, 10.0, 10.0, 0.0]).unwrap();
        let s = acc.summary().unwrap();
        assert!(s.v_x_raw < 0.0);
        assert_eq!(s.v_x, 0.0);
    }

    #[test]
    fn errors() {
        let mut acc = Accumulator::new();
        acc.update(&[1, 2], &[0.5, 0.25]).unwrap();
        let e = acc.update(&[1, 2, 3], &[0.0, f64::NAN, 1.0]).unwrap_err().to_string();
        assert!(e.contains("row 3") && e.contains("NaN"), "{e}");
        assert_eq!(acc.n_rows(), 2, "failed update must add nothing");
        assert_eq!(acc.get(1).unwrap().count, 1);
        assert!(acc.update(&[1], &[f64::INFINITY]).is_err());
        assert!(acc.update(&[1, 2], &[1.0]).is_err());
        let e = acc.summary().unwrap_err().to_string();
        assert!(e.contains("at least 2 prompts"), "{e}");
    }

    #[test]
    fn bytes_reject_garbage() {
        let mut acc = Accumulator::new();
        acc.update(&[3, 3, 9], &[1.0, 2.0, 3.0]).unwrap();
        let b = acc.to_bytes();
        assert!(Accumulator::from_bytes(&b[..b.len() - 1]).is_err());
        assert!(Accumulator::from_bytes(b"nonsense").is_err());
        let mut bad = b.clone();
        bad[8] = 7; // version
        assert!(Accumulator::from_bytes(&bad).unwrap_err().to_string().contains("version"));
        let mut bad = b.clone();
        bad[16] = 99; // rows
        assert!(Accumulator::from_bytes(&bad).is_err());
        let r = Accumulator::from_bytes(&b).unwrap();
        assert!(same(&acc, &r));
        assert_eq!(r.to_bytes(), b);
    }

    fn rows() -> impl Strategy<Value = (Vec<u64>, Vec<f64>)> {
        (1usize..300).prop_flat_map(|n| {
            (prop::collection::vec(0u64..12, n), prop::collection::vec(-50.0f64..50.0, n))
        })
    }

    proptest! {
        #[test]
        fn any_split_and_merge_order_equals_one_pass(
            (keys, x) in rows(),
            cuts in prop::collection::vec(0usize..300, 0..6),
            perm_seed in any::<u64>(),
        ) {
            let mut one = Accumulator::new();
            one.update(&keys, &x).unwrap();
            // reference
            let r = reference(&keys, &x);
            prop_assert_eq!(one.len(), r.len());
            for (k, s) in &r {
                let t = one.get(*k).unwrap();
                prop_assert_eq!(s.count, t.count);
                prop_assert!(close(s.mean, t.mean, 1e-9) && close(s.m2, t.m2, 1e-7));
            }
            // shards
            let n = keys.len();
            let mut c: Vec<usize> = cuts.into_iter().map(|v| v % (n + 1)).collect();
            c.push(0); c.push(n); c.sort_unstable(); c.dedup();
            let mut shards: Vec<Accumulator> = c.windows(2).map(|w| {
                let mut a = Accumulator::new();
                a.update(&keys[w[0]..w[1]], &x[w[0]..w[1]]).unwrap();
                a
            }).collect();
            // merge in a scrambled order, as a tree
            let mut s = perm_seed;
            while shards.len() > 1 {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let i = (s >> 33) as usize % shards.len();
                let a = shards.swap_remove(i);
                let j = (s >> 17) as usize % shards.len();
                shards[j].merge(&a);
            }
            let merged = shards.pop().unwrap();
            prop_assert!(same(&one, &merged));
            // and a serialised round trip
            let back = Accumulator::from_bytes(&merged.to_bytes()).unwrap();
            prop_assert!(same(&merged, &back));
            if let (Ok(a), Ok(b)) = (one.summary(), merged.summary()) {
                prop_assert!(close(a.v_x_raw, b.v_x_raw, 1e-7) && close(a.v_y_given_x, b.v_y_given_x, 1e-7));
            }
        }

        #[test]
        fn row_order_does_not_matter((keys, x) in rows(), seed in any::<u64>()) {
            let mut idx: Vec<usize> = (0..keys.len()).collect();
            let mut s = seed;
            for i in (1..idx.len()).rev() {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                idx.swap(i, (s >> 33) as usize % (i + 1));
            }
            let k2: Vec<u64> = idx.iter().map(|&i| keys[i]).collect();
            let x2: Vec<f64> = idx.iter().map(|&i| x[i]).collect();
            let mut a = Accumulator::new();
            a.update(&keys, &x).unwrap();
            let mut b = Accumulator::new();
            b.update(&k2, &x2).unwrap();
            prop_assert!(same(&a, &b));
        }
    }
}
