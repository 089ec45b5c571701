//! From rewards to a pool's ground set and weights: the GRADES quality, the
//! `k_max` prefilter, and the checks on the rewards and on the weights.

use std::cmp::Ordering;

use super::params::{FlResult, Params};
use crate::error::{Error, Result};

/// GRADES quality `q_j = eps + (r_j - min r) / (max r - min r + eps)`.
///
/// Finite rewards whose range `max r - min r` overflows float64 are halved
/// (numerator and denominator alike) before the division, which gives the
/// same quotient without an infinite range (and so without NaN weights).
pub fn quality(rewards: &[f64], eps: f64) -> Vec<f64> {
    if rewards.is_empty() {
        return Vec::new();
    }
    let (lo, hi) = rewards.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &r| (lo.min(r), hi.max(r)));
    if (hi - lo).is_finite() {
        let den = hi - lo + eps;
        rewards.iter().map(|&r| eps + (r - lo) / den).collect()
    } else {
        let den = (hi / 2.0 - lo / 2.0) + eps / 2.0;
        rewards.iter().map(|&r| eps + (r / 2.0 - lo / 2.0) / den).collect()
    }
}

/// Positions of the `k_max` largest qualities, ties to the lower index,
/// returned in ascending index order (so later ties still go to the lower index).
pub fn prefilter(q: &[f64], k_max: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..q.len()).collect();
    if k_max < q.len() {
        order.sort_by(|&a, &b| q[b].partial_cmp(&q[a]).unwrap_or(Ordering::Equal).then(a.cmp(&b)));
        order.truncate(k_max);
        order.sort_unstable();
    }
    order
}

/// Quality and ground set of one pool (all candidates unless k_max prefilters).
pub(super) fn ground_set(
    pool: usize,
    row_of: &dyn Fn(usize) -> usize,
    n: usize,
    rewards: Option<&[f64]>,
    params: &Params,
) -> Result<(Option<Vec<f64>>, Vec<usize>)> {
    let q = match rewards {
        Some(r) => {
            check_rewards(pool, r, row_of)?;
            Some(quality(r, params.eps))
        }
        None => None,
    };
    let u = match (params.k_max, &q) {
        (Some(km), Some(q)) => prefilter(q, km),
        _ => (0..n).collect(),
    };
    Ok((q, u))
}

/// Check rewards are finite; name the pool, the candidate and its row
/// (`row_of(i)`: the row of the caller's rewards holding candidate `i`).
fn check_rewards(pool: usize, r: &[f64], row_of: &dyn Fn(usize) -> usize) -> Result<()> {
    if let Some((i, &v)) = r.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        return Err(Error::at(
            pool,
            "rewards",
            row_of(i),
            format!("reward of candidate {i} is {v}; rewards must be finite"),
        ));
    }
    Ok(())
}

/// Quality weights `q^alpha` for the ground set `u` of pool `pool`, given the
/// pool's qualities (None: all weights 1). Fails where the weights leave
/// float64's room for the gains (see [`check_weights`]).
pub(super) fn weights_for(pool: usize, q: Option<&[f64]>, u: &[usize], params: &Params) -> Result<Vec<f64>> {
    match q {
        Some(q) if params.alpha > 0.0 => {
            let w: Vec<f64> = u.iter().map(|&i| q[i].powf(params.alpha)).collect();
            check_weights(pool, &w, params)?;
            Ok(w)
        }
        _ => Ok(vec![1.0; u.len()]),
    }
}

/// Every gain, `F` and its certified bound is a sum of at most `m (k + 1)`
/// terms `w_i w_j S_ij <= w_max^2`: the weights are refused when that sum
/// can overflow float64 (inf or NaN gains), or when `w_max^2` is below the
/// normal range (every gain would round to 0 and the picks would follow the
/// row order, not the objective). Only extreme `alpha` or `eps` get there.
fn check_weights(pool: usize, w: &[f64], params: &Params) -> Result<()> {
    let top = w.iter().fold(0.0f64, |a, &v| a.max(v));
    let terms = w.len() as f64 * (params.k.min(w.len()) as f64 + 1.0);
    let (alpha, eps) = (params.alpha, params.eps);
    let problem = if !(top * top * terms).is_finite() {
        format!("gives quality weights q^alpha up to {top:e}, whose gains overflow float64; use a smaller alpha or eps")
    } else if top * top < f64::MIN_POSITIVE {
        format!(
            "gives quality weights q^alpha of at most {top:e}, whose gains underflow float64; \
             use a smaller alpha or a larger eps"
        )
    } else {
        return Ok(());
    };
    let msg = format!("alpha = {} with eps = {} {problem}", short(alpha), short(eps));
    Err(Error::Pool { pool, msg, arg: Some("rewards"), row: None })
}

/// A parameter as people write it: plain between 1e-4 and 1e6, else in
/// scientific notation (`1e308`, not 309 digits).
fn short(v: f64) -> String {
    if v == 0.0 || (1e-4..1e6).contains(&v.abs()) {
        format!("{v}")
    } else {
        format!("{v:e}")
    }
}

/// `res` with its indices mapped from positions in the ground set `u` back
/// to positions in the pool.
pub(super) fn remap(mut res: FlResult, u: &[usize]) -> FlResult {
    for i in res.indices.iter_mut() {
        *i = u[*i];
    }
    res
}
