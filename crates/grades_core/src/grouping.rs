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

/// [`Grouping`] of rows by their integer id: one pass through a hash map of
/// the ids (a row with the same id as the row before skips it), then every
/// row placed in its pool.
pub fn group_ints(ids: &[i64]) -> Result<Grouping> {
    let n = ids.len();
    let mut map: HashMap<i64, u32, BuildHasherDefault<KeyHasher>> = HashMap::default();
    let mut pool_of: Vec<u32> = Vec::with_capacity(n);
    let mut firsts: Vec<u64> = Vec::new();
    let mut counts: Vec<u64> = Vec::new();
    let mut identity = true;
    let mut last: Option<(i64, u32)> = None;
    for (i, &k) in ids.iter().enumerate() {
        let p = match last {
            Some((prev, p)) if prev == k => p,
            _ => {
                let fresh = firsts.len();
                let p = *map.entry(k).or_insert(fresh as u32);
                if p as usize == fresh {
                    if fresh == u32::MAX as usize {
                        return invalid(format!("more than {} distinct prompt ids in one table", u32::MAX - 1));
                    }
                    firsts.push(i as u64);
                    counts.push(0);
                } else {
                    identity = false; // a pool seen before, after another: its rows are apart
                }
                last = Some((k, p));
                p
            }
        };
        counts[p as usize] += 1;
        pool_of.push(p);
    }
    drop(map);
    let mut offsets = Vec::with_capacity(counts.len() + 1);
    let mut at = 0u64;
    offsets.push(0);
    for c in &counts {
        at += c;
        offsets.push(at);
    }
    let rows = if identity {
        (0..n as u64).collect()
    } else {
        let mut next = offsets[..counts.len()].to_vec();
        let mut rows = vec![0u64; n];
        for (i, &p) in pool_of.iter().enumerate() {
            let slot = &mut next[p as usize];
            rows[*slot as usize] = i as u64;
            *slot += 1;
        }
        rows
    };
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
        fn runs_of_ids_are_the_identity(sizes in prop::collection::vec(1usize..6, 0..30)) {
            let ids: Vec<i64> = sizes.iter().enumerate().flat_map(|(p, &s)| std::iter::repeat_n(p as i64 * 7919, s)).collect();
            let g = group_ints(&ids).unwrap();
            prop_assert!(g.identity);
            prop_assert_eq!(g.offsets.len(), sizes.len() + 1);
        }
    }
}
