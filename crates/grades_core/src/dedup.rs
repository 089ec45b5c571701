//! Near-duplicate removal inside pools, as semantic deduplication does: each
//! pool's candidates are visited by quality (reward, highest first; then an
//! order key; then a content key, so the row order plays no part) and one is
//! dropped when its cosine with a candidate kept before it is at least the
//! threshold. Rows that are not finite or have zero norm are kept and
//! compared with nothing (selection refuses them by name).

use std::cmp::Ordering;

use rayon::prelude::*;

use crate::error::{invalid, Result};
use crate::keys::per_row_lengths;
use crate::pools::Pools;

/// What each pool's candidates are visited by, one entry per row of the
/// matrix: `rewards` (highest first; none: all equal), then `order`
/// (ascending), then `content` (ascending; none: all equal).
#[derive(Debug, Clone, Copy)]
pub struct Visit<'a> {
    pub rewards: Option<&'a [f64]>,
    pub order: &'a [u64],
    pub content: Option<&'a [u64]>,
}

/// A keep flag for every row of the matrix: false for the rows of a pool
/// within `threshold` (cosine, in float64) of one kept before them in the
/// pool's visiting order; rows in no pool are kept. Pools run in parallel.
pub fn near_duplicates(pools: &Pools<'_>, visit: &Visit<'_>, threshold: f64) -> Result<Vec<bool>> {
    let lay = &pools.layout;
    let n_rows = lay.n_rows();
    per_row_lengths(
        n_rows,
        &[
            ("rewards", visit.rewards.map(<[f64]>::len)),
            ("order keys", Some(visit.order.len())),
            ("content keys", visit.content.map(<[u64]>::len)),
        ],
    )?;
    if !(threshold > -1.0 && threshold <= 1.0) {
        return invalid(format!("the near-duplicate threshold must be a cosine in (-1, 1], got {threshold}"));
    }
    let d = pools.dim;
    let dropped: Vec<Vec<usize>> = (0..lay.n_pools())
        .into_par_iter()
        .map(|p| {
            let n = lay.len(p);
            let mut raw = Vec::with_capacity(n * d);
            let mut rows = Vec::with_capacity(n);
            for i in 0..n {
                let r = lay.row(p, i);
                rows.push(r);
                pools.extend_row(r, &mut raw);
            }
            // unit rows in float64; a row that is not finite or has zero norm takes no part
            let mut unit = vec![0f64; n * d];
            let mut ok = Vec::with_capacity(n);
            for i in 0..n {
                let v = &raw[i * d..(i + 1) * d];
                let norm = v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
                if norm.is_finite() && norm > 0.0 {
                    for (u, &x) in unit[i * d..(i + 1) * d].iter_mut().zip(v) {
                        *u = x as f64 / norm;
                    }
                    ok.push(i);
                }
            }
            ok.sort_by(|&a, &b| {
                let (ra, rb) = (rows[a], rows[b]);
                let by_reward = match visit.rewards {
                    Some(w) => w[rb].partial_cmp(&w[ra]).unwrap_or(Ordering::Equal),
                    None => Ordering::Equal,
                };
                by_reward
                    .then(visit.order[ra].cmp(&visit.order[rb]))
                    .then(visit.content.map_or(Ordering::Equal, |c| c[ra].cmp(&c[rb])))
            });
            let mut kept: Vec<usize> = Vec::with_capacity(ok.len());
            let mut out = Vec::new();
            for &i in &ok {
                let ui = &unit[i * d..(i + 1) * d];
                let close = kept.iter().any(|&j| {
                    let dot: f64 = ui.iter().zip(&unit[j * d..(j + 1) * d]).map(|(a, b)| a * b).sum();
                    dot >= threshold
                });
                if close {
                    out.push(rows[i]);
                } else {
                    kept.push(i);
                }
            }
            out
        })
        .collect();
    let mut keep = vec![true; n_rows];
    for r in dropped.into_iter().flatten() {
        keep[r] = false;
    }
    Ok(keep)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(x: &[f32], d: usize, offsets: &[u64], rewards: Option<&[f64]>, threshold: f64) -> Vec<bool> {
        let n = x.len() / d;
        let order: Vec<u64> = (0..n as u64).collect();
        let pools = Pools::new(x, d, offsets, None).unwrap();
        near_duplicates(&pools, &Visit { rewards, order: &order, content: None }, threshold).unwrap()
    }

    #[test]
    fn drops_the_lower_reward_of_two_close_rows() {
        // rows 0 and 1 point the same way; row 2 is orthogonal
        let x = [1.0, 0.0, 2.0, 0.01, 0.0, 1.0];
        assert_eq!(run(&x, 2, &[0, 3], Some(&[0.1, 0.9, 0.5]), 0.95), vec![false, true, true]);
        assert_eq!(run(&x, 2, &[0, 3], Some(&[0.9, 0.1, 0.5]), 0.95), vec![true, false, true]);
        // in different pools nothing is compared
        assert_eq!(run(&x, 2, &[0, 1, 3], Some(&[0.1, 0.9, 0.5]), 0.95), vec![true, true, true]);
    }

    #[test]
    fn a_dropped_row_removes_nothing_itself() {
        // b is close to a and to c, a and c are not close: visiting a, b, c keeps a and c
        let x = [1.0, 0.0, 0.9397, 0.342, 0.766, 0.6428];
        assert_eq!(run(&x, 2, &[0, 3], Some(&[3.0, 2.0, 1.0]), 0.9), vec![true, false, true]);
    }

    #[test]
    fn zero_and_non_finite_rows_are_kept_and_compared_with_nothing() {
        let x = [0.0, 0.0, 1.0, 0.0, f32::NAN, 1.0, 1.0, 0.0];
        assert_eq!(run(&x, 2, &[0, 4], None, 0.99), vec![true, true, true, false]);
    }

    #[test]
    fn bad_arguments_are_refused() {
        let x = [1.0f32, 0.0];
        let pools = Pools::new(&x, 2, &[0, 1], None).unwrap();
        let v = Visit { rewards: None, order: &[0, 1], content: None };
        assert!(near_duplicates(&pools, &v, 0.9).is_err());
        let v = Visit { rewards: None, order: &[0], content: None };
        assert!(near_duplicates(&pools, &v, 1.5).is_err());
        assert!(near_duplicates(&pools, &v, f64::NAN).is_err());
    }
}
