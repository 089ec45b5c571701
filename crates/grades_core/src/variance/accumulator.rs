//! The streaming accumulator: per-prompt statistics in hash maps.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use rayon::prelude::*;

use super::stats::{Moments, Partial, Stats, StatsColumns, Summary};
use crate::error::{at_row, invalid, Result};

/// The prompts are split over this many hash maps by their key (so that
/// each map is small enough to stay in cache and the maps can be filled in
/// parallel); a fixed number, so the results never depend on the threads.
pub(crate) const SHARDS: usize = 256;
const SHARD_BITS: u32 = SHARDS.trailing_zeros();
/// Rows partitioned over the maps at a time (the partition stays in cache).
const STRETCH: usize = 1 << 19;
/// Rows per parallel task of the partition.
const PIECE: usize = 1 << 15;

/// Losses up to this magnitude, and statistics within [`tame`], can be
/// folded without any sum overflowing f64 (with a margin of about 1e8 for
/// up to 2^64 rows). Beyond it, updates and merges check every statistic
/// they touch and undo themselves on an overflow.
const TAME: f64 = 1e140;

/// Statistics no tame update or merge can make overflow: `|mean| <= TAME`
/// and `M2 <= 4 TAME^2 count` (what losses within `TAME` give).
pub(crate) fn tame(s: &Stats) -> bool {
    s.mean.abs() <= TAME && s.m2 <= s.count as f64 * (4.0 * TAME * TAME)
}

/// The order prompts are summed and listed in: a bijective mix of the key
/// (an xorshift and a multiplication by an odd constant), so distinct keys
/// have distinct places and the order depends on the set of keys alone.
pub(crate) fn order_of(k: u64) -> u64 {
    (k ^ (k >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// The map a key lives in: the top bits of its place in the order, so the
/// maps in turn, each in order, are the whole order.
pub(crate) fn shard_of(k: u64) -> usize {
    (order_of(k) >> (64 - SHARD_BITS)) as usize
}

/// The maps' hash of a key: the murmur3 finaliser (every bit of the key
/// reaches every bit of the hash).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(self.0 ^ u64::from(b));
        }
    }

    fn write_u64(&mut self, k: u64) {
        let mut z = k ^ self.0.rotate_left(31);
        z = (z ^ (z >> 33)).wrapping_mul(0xff51_afd7_ed55_8ccd);
        z = (z ^ (z >> 33)).wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        self.0 = z ^ (z >> 33);
    }
}

pub(crate) type Map = HashMap<u64, Stats, BuildHasherDefault<KeyHasher>>;

/// Streaming, mergeable per-prompt loss statistics.
///
/// Every prompt's `(count, mean, M2)` lives in one of [`SHARDS`] hash maps,
/// chosen by its key. Rows are folded by Welford's update in row order, so
/// the statistics of a given sequence of rows are the same bits however it
/// is cut into updates and whatever the number of threads; accumulators
/// merge by Chan et al.'s update. Results list and sum the prompts in the
/// order of [`order_of`] their key, whatever order they came in.
#[derive(Debug, Clone)]
pub struct Accumulator {
    pub(crate) shards: Vec<Map>,
    pub(crate) rows: u64,
    /// Some statistic may be outside [`tame`]: updates and merges then
    /// check what they touch for overflow.
    pub(crate) wild: bool,
}

impl Default for Accumulator {
    fn default() -> Self {
        Accumulator { shards: (0..SHARDS).map(|_| Map::default()).collect(), rows: 0, wild: false }
    }
}

/// A key and its statistics before a change (`None`: the key was new).
type Undo = Vec<(u64, Option<Stats>)>;

impl Accumulator {
    /// An empty accumulator.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of distinct prompts seen.
    pub fn len(&self) -> usize {
        self.shards.iter().map(Map::len).sum()
    }

    /// True when no prompt has been seen.
    pub fn is_empty(&self) -> bool {
        self.shards.iter().all(Map::is_empty)
    }

    /// Total rows seen.
    pub fn n_rows(&self) -> u64 {
        self.rows
    }

    /// Statistics of one prompt.
    pub fn get(&self, key: u64) -> Option<Stats> {
        self.shards[shard_of(key)].get(&key).copied()
    }

    /// Add rows `(keys[i], losses[i])`. All-or-nothing: a NaN or infinite
    /// loss, or losses whose statistics overflow f64, are reported with the
    /// row (counted from the first row this accumulator has seen, and within
    /// this call) and nothing is added.
    pub fn update(&mut self, keys: &[u64], losses: &[f64]) -> Result<()> {
        self.update_with(keys, |k| k, losses)
    }

    /// [`Accumulator::update`] with integer prompt ids, each filed under
    /// [`crate::keys::key_of_int`] (the keys the rest of the library
    /// gives integer ids).
    pub fn update_int_ids(&mut self, ids: &[i64], losses: &[f64]) -> Result<()> {
        self.update_with(ids, crate::keys::key_of_int, losses)
    }

    fn update_with<T>(&mut self, ids: &[T], key: impl Fn(T) -> u64 + Sync, losses: &[f64]) -> Result<()>
    where
        T: Copy + PartialEq + Send + Sync,
    {
        if ids.len() != losses.len() {
            return invalid(format!(
                "keys and losses must have the same length, got {} and {}",
                ids.len(),
                losses.len()
            ));
        }
        let Some(rows) = self.rows.checked_add(ids.len() as u64) else {
            return invalid(format!("{} more rows would overflow the row count {}", ids.len(), self.rows));
        };
        let (bad, large) = scan_losses(losses);
        if let Some(i) = bad {
            let row = self.rows + i as u64;
            return at_row(
                row,
                format!("loss at row {row} (row {i} of this update) is {}: losses must be finite", losses[i]),
            );
        }
        if large || self.wild {
            if let Err(i) = self.update_checked(ids, &key, losses) {
                let row = self.rows + i as u64;
                return at_row(
                    row,
                    format!(
                        "loss at row {row} (row {i} of this update) makes the statistics of prompt key {} overflow \
                         f64 (losses too large in magnitude): rescale the losses",
                        key(ids[i])
                    ),
                );
            }
            self.wild = self.shards.par_iter().any(|m| m.values().any(|s| !tame(s)));
        } else if ids.len() < PIECE {
            for (&id, &x) in ids.iter().zip(losses) {
                let k = key(id);
                self.shards[shard_of(k)].entry(k).or_default().push(x);
            }
        } else {
            let mut parts = Vec::new();
            for s in (0..ids.len()).step_by(STRETCH) {
                let e = (s + STRETCH).min(ids.len());
                self.fold_stretch(&ids[s..e], &key, &losses[s..e], &mut parts);
            }
        }
        self.rows = rows;
        Ok(())
    }

    /// Fold a stretch of rows: partition them over the maps in row order
    /// (in parallel pieces), then fold each map's rows (maps in parallel).
    fn fold_stretch<T>(
        &mut self,
        ids: &[T],
        key: &(impl Fn(T) -> u64 + Sync),
        losses: &[f64],
        parts: &mut Vec<Vec<Vec<(u64, f64)>>>,
    ) where
        T: Copy + PartialEq + Send + Sync,
    {
        let n_parts = ids.len().div_ceil(PIECE);
        if parts.len() < n_parts {
            parts.resize_with(n_parts, || vec![Vec::new(); SHARDS]);
        }
        let parts = &mut parts[..n_parts];
        parts.par_iter_mut().zip(ids.par_chunks(PIECE).zip(losses.par_chunks(PIECE))).for_each(|(out, (ids, xs))| {
            out.iter_mut().for_each(Vec::clear);
            // a run of equal ids (a prompt's rows together) is keyed once
            let mut last: Option<(T, u64, usize)> = None;
            for (&id, &x) in ids.iter().zip(xs) {
                let (k, s) = match last {
                    Some((l, k, s)) if l == id => (k, s),
                    _ => {
                        let k = key(id);
                        let s = shard_of(k);
                        last = Some((id, k, s));
                        (k, s)
                    }
                };
                out[s].push((k, x));
            }
        });
        let parts = &*parts;
        self.shards.par_iter_mut().enumerate().for_each(|(s, map)| {
            for rows in parts.iter().map(|p| &p[s]) {
                let mut i = 0;
                while i < rows.len() {
                    let k = rows[i].0;
                    let st = map.entry(k).or_default();
                    while i < rows.len() && rows[i].0 == k {
                        st.push(rows[i].1);
                        i += 1;
                    }
                }
            }
        });
    }

    /// Fold rows one at a time, checking each statistic; at the first that
    /// overflows, undo every change and return its row.
    fn update_checked<T: Copy>(
        &mut self,
        ids: &[T],
        key: &impl Fn(T) -> u64,
        losses: &[f64],
    ) -> std::result::Result<(), usize> {
        let mut undo = Undo::with_capacity(ids.len());
        for (i, (&id, &x)) in ids.iter().zip(losses).enumerate() {
            let k = key(id);
            let st = self.shards[shard_of(k)].entry(k).or_default();
            undo.push((k, (st.count > 0).then_some(*st)));
            st.push(x);
            if !st.is_finite() {
                self.undo(undo);
                return Err(i);
            }
        }
        Ok(())
    }

    fn undo(&mut self, undo: Undo) {
        for (k, old) in undo.into_iter().rev() {
            let map = &mut self.shards[shard_of(k)];
            match old {
                Some(s) => map.insert(k, s),
                None => map.remove(&k),
            };
        }
    }

    /// Fold another accumulator into this one (exact up to rounding; the
    /// result does not depend on the order of merges beyond rounding).
    /// Errors, with this accumulator unchanged, when a merged statistic
    /// overflows f64 or the row count would.
    pub fn merge(&mut self, other: &Accumulator) -> Result<()> {
        let Some(rows) = self.rows.checked_add(other.rows) else {
            return invalid(format!("merging {} rows into {} would overflow the row count", other.rows, self.rows));
        };
        if self.wild || other.wild {
            let mut undo = Undo::new();
            for (k, s) in other.shards.iter().flatten() {
                let st = self.shards[shard_of(*k)].entry(*k).or_default();
                undo.push((*k, (st.count > 0).then_some(*st)));
                st.merge(s);
                if !st.is_finite() {
                    self.undo(undo);
                    return invalid(format!(
                        "merging the accumulators overflows f64 in the statistics of prompt key {k}: the losses \
                         are too large in magnitude; rescale them"
                    ));
                }
            }
            self.wild = self.shards.par_iter().any(|m| m.values().any(|s| !tame(s)));
        } else {
            // tame statistics merge without overflow (see TAME); the result
            // may leave the bounds, which later work then checks
            self.wild = self
                .shards
                .par_iter_mut()
                .zip(&other.shards)
                .map(|(a, b)| {
                    let mut wild = false;
                    for (k, s) in b {
                        let st = a.entry(*k).or_default();
                        st.merge(s);
                        wild |= !tame(st);
                    }
                    wild
                })
                .reduce(|| false, |a, b| a || b);
        }
        self.rows = rows;
        Ok(())
    }

    /// One map's prompts in order: `(order_of(key), stats)` (see [`order_of`]).
    fn shard_in_order(&self, s: usize) -> Vec<(u64, Stats)> {
        let mut v: Vec<(u64, Stats)> = self.shards[s].iter().map(|(k, st)| (order_of(*k), *st)).collect();
        v.sort_unstable_by_key(|e| e.0);
        v
    }

    /// Fold every prompt's statistics in order: each map in parallel, the
    /// maps' results combined in map order (the same bits for any number of
    /// threads).
    fn fold<A: Default + Send>(&self, add: impl Fn(&mut A, &Stats) + Sync, combine: impl Fn(&mut A, &A)) -> A {
        let parts: Vec<A> = (0..SHARDS)
            .into_par_iter()
            .map(|s| {
                let mut a = A::default();
                self.shard_in_order(s).iter().for_each(|(_, st)| add(&mut a, st));
                a
            })
            .collect();
        parts.iter().fold(A::default(), |mut a, p| {
            combine(&mut a, p);
            a
        })
    }

    /// Per-prompt statistics sorted by key: `(keys, stats)`.
    pub fn per_prompt(&self) -> (Vec<u64>, Vec<Stats>) {
        let mut v: Vec<(u64, Stats)> = self.shards.iter().flatten().map(|(k, s)| (*k, *s)).collect();
        v.par_sort_unstable_by_key(|e| e.0);
        v.into_iter().unzip()
    }

    /// The estimators of the decomposition. Errors when fewer than two
    /// prompts have at least two responses, or when an estimate overflows.
    pub fn summary(&self) -> Result<Summary> {
        self.fold(Partial::add, Partial::combine).finish(self.rows)
    }

    /// The statistics of the prompts the estimators use (two or more
    /// responses), in the order [`Accumulator::summary`] sums them (what a
    /// seeded bootstrap over prompts resamples).
    pub fn used_stats(&self) -> StatsColumns {
        let parts: Vec<Vec<Stats>> = (0..SHARDS)
            .into_par_iter()
            .map(|s| self.shard_in_order(s).into_iter().map(|e| e.1).filter(|st| st.count >= 2).collect())
            .collect();
        StatsColumns::of(&parts.concat())
    }

    /// Mean and covariance (ddof = 1) over the prompts the estimators use
    /// of the vector `(s^2, s^2 / K, g - gbar, (g - gbar)^2)` (`g` the
    /// prompt's mean loss, `gbar` the mean of `g`): all the normal
    /// bootstrap needs. Errors like [`Accumulator::summary`].
    pub fn used_moments(&self) -> Result<Moments> {
        self.used_moments_about(self.summary()?.grand_mean)
    }

    /// [`Accumulator::used_moments`] with `gbar` given. Errors when `gbar`
    /// is not finite or a moment overflows.
    pub fn used_moments_about(&self, gbar: f64) -> Result<Moments> {
        if !gbar.is_finite() {
            return invalid(format!("the centre of the prompt means must be finite, got {gbar}"));
        }
        let m = self.fold(
            |m: &mut Moments, st| {
                if let Some(s2) = st.sample_variance() {
                    let d = st.mean - gbar;
                    m.push([s2, s2 / st.count as f64, d, d * d]);
                }
            },
            Moments::merge,
        );
        m.finish()
    }
}

/// The first row whose loss is not finite, and whether any loss is beyond
/// [`TAME`].
fn scan_losses(x: &[f64]) -> (Option<usize>, bool) {
    let one = |(c, xs): (usize, &[f64])| {
        let bad = xs.iter().position(|v| !v.is_finite()).map(|i| c * PIECE + i);
        (bad, xs.iter().any(|v| v.abs() > TAME))
    };
    let both = |a: (Option<usize>, bool), b: (Option<usize>, bool)| (a.0.or(b.0), a.1 || b.1);
    if x.len() <= PIECE {
        return one((0, x));
    }
    // pieces are combined in order, so the first bad row wins
    x.par_chunks(PIECE).enumerate().map(one).reduce(|| (None, false), both)
}
