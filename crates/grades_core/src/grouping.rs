//! Rows grouped by integer prompt id: the pools of a table, in order of first
//! appearance, each pool's rows in row order (what a stable group-by gives).

use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use crate::error::{invalid, Result};
use crate::variance::accumulator::KeyHasher;

/// Pools of a table: pool `p` holds rows `rows[offsets[p]..offsets[p + 1]]`
/// (ascending), and its id is first seen at row `firsts[p]`; pools come in
/// order of first appearance. `identity`: `rows` is `0..n` (every pool's rows
/// already together).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grouping {
    pub firsts: Vec<u64>,
    pub offsets: Vec<u64>,
    pub rows: Vec<u64>,
    pub identity: bool,
}

/// Rows at least this many are grouped by several threads at once
/// ([`group_ints`]); fewer, by one.
pub const PARALLEL_ROWS: usize = 1 << 20;

type IdMap = HashMap<i64, u32, BuildHasherDefault<KeyHasher>>;

/// The pools of one run of consecutive rows, as if it were the whole table:
/// `pool_of` (by row of the run), and by pool in order of first appearance
/// its id, first row (of the table: the run starts at `at`) and count.
struct RunPools {
    pool_of: Vec<u32>,
    ids: Vec<i64>,
    firsts: Vec<u64>,
    counts: Vec<u64>,
    identity: bool,
}

/// One pass through a hash map of the ids (a row with the same id as the
/// row before skips it).
fn run_pools(ids: &[i64], at: usize) -> Result<RunPools> {
    let mut map = IdMap::default();
    let mut r = RunPools {
        pool_of: Vec::with_capacity(ids.len()),
        ids: Vec::new(),
        firsts: Vec::new(),
        counts: Vec::new(),
        identity: true,
    };
    let mut last: Option<(i64, u32)> = None;
    for (i, &k) in ids.iter().enumerate() {
        let p = match last {
            Some((prev, p)) if prev == k => p,
            _ => {
                let fresh = r.firsts.len();
                let p = *map.entry(k).or_insert(fresh as u32);
                if p as usize == fresh {
                    if fresh == u32::MAX as usize {
                        return too_many();
                    }
                    r.ids.push(k);
                    r.firsts.push((at + i) as u64);
                    r.counts.push(0);
                } else {
                    r.identity = false; // a pool seen before, after another: its rows are apart
                }
                last = Some((k, p));
                p
            }
        };
        r.counts[p as usize] += 1;
        r.pool_of.push(p);
    }
    Ok(r)
}

fn too_many<T>() -> Result<T> {
    invalid(format!("more than {} distinct prompt ids in one table", u32::MAX - 1))
}

fn offsets_of(counts: &[u64]) -> Vec<u64> {
    let mut offsets = Vec::with_capacity(counts.len() + 1);
    let mut at = 0u64;
    offsets.push(0);
    for c in counts {
        at += c;
        offsets.push(at);
    }
    offsets
}

/// A raw pointer to the rows being placed; every thread writes its own slots.
#[derive(Clone, Copy)]
struct Slots(*mut u64);
// SAFETY: the threads of `group_ints` write disjoint slots of one buffer.
unsafe impl Send for Slots {}
unsafe impl Sync for Slots {}

impl Slots {
    /// Write `v` at slot `i`.
    ///
    /// # Safety
    /// `i` is inside the buffer and no other thread writes slot `i`.
    unsafe fn put(self, i: usize, v: u64) {
        *self.0.add(i) = v;
    }
}

/// The pools of several runs (in row order) as pools of the table, in order
/// of first appearance: their first rows, counts, whether the table is in
/// runs of one id (the identity), and each run's pools' numbers in the table.
type Merged = (Vec<u64>, Vec<u64>, bool, Vec<Vec<u32>>);

fn merge_runs(runs: &[RunPools]) -> Result<Merged> {
    let mut map = IdMap::default();
    let (mut firsts, mut counts) = (Vec::new(), Vec::new());
    let mut identity = true;
    let mut last_pool: Option<u32> = None;
    let mut global: Vec<Vec<u32>> = Vec::with_capacity(runs.len());
    for r in runs {
        identity &= r.identity;
        let mut g = Vec::with_capacity(r.ids.len());
        for (lp, &k) in r.ids.iter().enumerate() {
            let fresh = firsts.len();
            let p = *map.entry(k).or_insert(fresh as u32);
            if p as usize == fresh {
                if fresh == u32::MAX as usize {
                    return too_many();
                }
                firsts.push(r.firsts[lp]);
                counts.push(0u64);
            } else if !(lp == 0 && last_pool == Some(p)) {
                // seen in an earlier run, and not as the pool that run ended with
                identity = false;
            }
            counts[p as usize] += r.counts[lp];
            g.push(p);
        }
        if let Some(&p) = g.last() {
            last_pool = Some(p);
        }
        global.push(g);
    }
    Ok((firsts, counts, identity, global))
}

/// [`Grouping`] of rows by their integer id. Up to [`PARALLEL_ROWS`] rows
/// (or on one thread): [`run_pools`] over the table, then every row placed
/// in its pool. More: the rows cut into one run per thread, each run's pools
/// found at once, the runs' pools merged in run order (a pool's first
/// appearance is in the first run that holds it, so the order of first
/// appearance is kept), and every run's rows placed at once, each run's
/// rows of a pool after those of the runs before: the same grouping.
pub fn group_ints(ids: &[i64]) -> Result<Grouping> {
    group_ints_from(ids, PARALLEL_ROWS)
}

/// [`group_ints`] on several threads from `parallel_rows` rows on.
fn group_ints_from(ids: &[i64], parallel_rows: usize) -> Result<Grouping> {
    use rayon::prelude::*;

    let n = ids.len();
    let threads = rayon::current_num_threads();
    let per = if n < parallel_rows.max(threads) || threads < 2 { n.max(1) } else { n.div_ceil(threads) };
    let mut runs: Vec<RunPools> =
        ids.par_chunks(per).enumerate().map(|(c, run)| run_pools(run, c * per)).collect::<Result<_>>()?;
    if runs.is_empty() {
        runs.push(run_pools(ids, 0)?);
    }
    let (firsts, counts, identity, global) = if runs.len() == 1 {
        let r = &mut runs[0];
        let pools = (0..r.ids.len() as u32).collect();
        (std::mem::take(&mut r.firsts), r.counts.clone(), r.identity, vec![pools])
    } else {
        merge_runs(&runs)?
    };
    let offsets = offsets_of(&counts);
    if identity {
        return Ok(Grouping { firsts, offsets, rows: (0..n as u64).collect(), identity });
    }
    // where each run's rows of each of its pools start
    let mut next = offsets[..counts.len()].to_vec();
    let starts: Vec<Vec<u64>> = runs
        .iter()
        .zip(&global)
        .map(|(r, g)| {
            g.iter()
                .zip(&r.counts)
                .map(|(&p, &c)| {
                    let s = next[p as usize];
                    next[p as usize] += c;
                    s
                })
                .collect()
        })
        .collect();
    let mut rows = vec![0u64; n];
    let out = Slots(rows.as_mut_ptr());
    runs.par_iter().zip(starts.into_par_iter()).enumerate().for_each(|(c, (r, mut next))| {
        for (i, &lp) in r.pool_of.iter().enumerate() {
            let slot = &mut next[lp as usize];
            // SAFETY: slot < n; the slots of this run's rows of a pool are its
            // own range of that pool's (the starts above), written by no
            // other thread
            unsafe { out.put(*slot as usize, (c * per + i) as u64) };
            *slot += 1;
        }
    });
    Ok(Grouping { firsts, offsets, rows, identity })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The grouping by its definition: pools in order of first appearance, rows ascending.
    fn reference(ids: &[i64]) -> Grouping {
        let mut order: Vec<i64> = Vec::new();
        for &k in ids {
            if !order.contains(&k) {
                order.push(k);
            }
        }
        let mut firsts = Vec::new();
        let mut offsets = vec![0u64];
        let mut rows = Vec::new();
        for k in order {
            firsts.push(ids.iter().position(|&x| x == k).unwrap() as u64);
            rows.extend(ids.iter().enumerate().filter(|(_, &x)| x == k).map(|(i, _)| i as u64));
            offsets.push(rows.len() as u64);
        }
        let identity = rows.iter().enumerate().all(|(i, &r)| i as u64 == r);
        Grouping { firsts, offsets, rows, identity }
    }

    proptest! {
        #[test]
        fn equals_the_definition(ids in prop::collection::vec(prop_oneof![-3i64..4, any::<i64>()], 0..200)) {
            prop_assert_eq!(group_ints(&ids).unwrap(), reference(&ids));
        }

        #[test]
        fn threads_group_by_the_definition(ids in prop::collection::vec(prop_oneof![-3i64..4, any::<i64>()], 0..200),
                                           runs in prop::collection::vec(1usize..9, 0..40),
                                           threads in 2usize..6) {
            // shuffled ids, and runs of one id (the identity, or nearly:
            // runs cut across the threads' rows, an id back after another)
            let runs: Vec<i64> = runs.iter().enumerate()
                .flat_map(|(p, &s)| std::iter::repeat_n((p % 13) as i64, s)).collect();
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            for ids in [ids, runs] {
                prop_assert_eq!(pool.install(|| group_ints_from(&ids, 0)).unwrap(), reference(&ids));
            }
        }

        #[test]
        fn runs_of_ids_are_the_identity(sizes in prop::collection::vec(1usize..6, 0..30)) {
            let ids: Vec<i64> = sizes.iter().enumerate().flat_map(|(p, &s)| std::iter::repeat_n(p as i64 * 7919, s)).collect();
            let g = group_ints(&ids).unwrap();
            prop_assert!(g.identity);
            prop_assert_eq!(g.offsets.len(), sizes.len() + 1);
        }
    }
}
