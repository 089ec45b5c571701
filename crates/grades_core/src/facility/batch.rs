//! Facility location over a ragged batch of pools, in parallel over pools: a
//! pool's Gram block while it fits the dense size limit, similarity columns
//! on demand above it.

use std::sync::Mutex;

use rayon::prelude::*;

use super::dense::DenseSource;
use super::greedy::greedy_with;
use super::on_demand::OnDemandSource;
use super::params::{need_rewards_error, FlResult, Optimizer, Params};
use super::sweep::{greedy_sweep_with, use_sweep, SweepScratch};
use super::ties::{Content, Ties};
use super::weights::{ground_set, remap, weights_for};
use crate::error::{invalid, Result};
use crate::kernel::{cosine_gram_with, gather_normalized, gather_rows, Kernel};
use crate::pools::Pools;

/// Bytes of the n x n float32 similarity block of a pool of `n` candidates.
pub fn dense_bytes(n: usize) -> usize {
    n.saturating_mul(n).saturating_mul(std::mem::size_of::<f32>())
}

/// A pool whose n x n similarity block would take more bytes than this (2 GiB,
/// n > 23,170) is solved with similarity columns recomputed on demand.
pub const DENSE_LIMIT_BYTES: usize = 2 << 30;

/// Facility location on every pool of a ragged batch, in parallel over pools.
/// `rewards`, when given, is indexed by matrix row (like the embeddings).
/// Pools above [`DENSE_LIMIT_BYTES`] run on demand, as in
/// [`facility_location_batch_within`].
pub fn facility_location_batch(
    pools: &Pools<'_>,
    rewards: Option<&[f64]>,
    params: &Params,
    kernel: Kernel,
) -> Result<Vec<FlResult>> {
    facility_location_batch_within(pools, rewards, params, kernel, DENSE_LIMIT_BYTES)
}

/// [`facility_location_batch`] holding a pool's n x n similarity block only
/// while it takes at most `dense_limit` bytes; a larger pool (its ground set,
/// after `k_max`) runs with similarity columns recomputed on demand (memory
/// O(n d), as [`facility_location_on_demand`](super::facility_location_on_demand)).
pub fn facility_location_batch_within(
    pools: &Pools<'_>,
    rewards: Option<&[f64]>,
    params: &Params,
    kernel: Kernel,
    dense_limit: usize,
) -> Result<Vec<FlResult>> {
    facility_location_batch_keyed(pools, rewards, None, false, params, kernel, dense_limit)
}

/// [`facility_location_batch_within`] with `text` keys (by matrix row: rows
/// with equal keys are duplicates, as rows with equal embeddings are) and
/// `ordered` (each pool's rows come in the order of a caller's key, so
/// positions are the last tie-break; otherwise a hash of each candidate's
/// embedding, reward and text key is). See [`super::ties`].
pub fn facility_location_batch_keyed(
    pools: &Pools<'_>,
    rewards: Option<&[f64]>,
    text: Option<&[u64]>,
    ordered: bool,
    params: &Params,
    kernel: Kernel,
    dense_limit: usize,
) -> Result<Vec<FlResult>> {
    params.validate()?;
    if let Some(t) = text {
        if t.len() != pools.layout.n_rows() {
            return invalid(format!(
                "text keys have {} entries but embeddings have {} rows",
                t.len(),
                pools.layout.n_rows()
            ));
        }
    }
    if params.needs_rewards() && rewards.is_none() {
        return Err(need_rewards_error());
    }
    if let Some(r) = rewards {
        if r.len() != pools.layout.n_rows() {
            return invalid(format!(
                "rewards has {} entries but embeddings have {} rows",
                r.len(),
                pools.layout.n_rows()
            ));
        }
    }
    // one set of buffers per thread for the whole call (rayon's `map_init` makes
    // new ones for every piece of work it splits off, and a large pool's
    // block is then faulted in again); a pool run while its thread's set is
    // in use (stolen inside a nested parallel step) gets its own
    let sets: Vec<Mutex<Scratch>> = (0..rayon::current_num_threads()).map(|_| Mutex::default()).collect();
    let out: Vec<Result<FlResult>> = (0..pools.layout.n_pools())
        .into_par_iter()
        .map(|p| {
            let mut own = rayon::current_thread_index().and_then(|t| sets.get(t)).and_then(|m| m.try_lock().ok());
            let mut fresh = Scratch::default(); // holds nothing until a pool grows it
            let sc = own.as_deref_mut().unwrap_or(&mut fresh);
            run_pool(pools, p, rewards, (text, ordered), params, kernel, dense_limit, sc)
        })
        .collect();
    // the first failing pool, deterministically
    out.into_iter().collect()
}

/// Prefetch the rows (and rewards) of pool `p` (a hint).
fn prefetch_pool(pools: &Pools<'_>, p: usize, rewards: Option<&[f64]>) {
    for i in 0..pools.layout.len(p) {
        let row = pools.layout.row(p, i);
        pools.data.prefetch_row(row);
        if let Some(r) = rewards {
            crate::embeddings::prefetch(&r[row..row + 1]);
        }
    }
}

/// Per-thread buffers for the batched path.
#[derive(Default)]
struct Scratch {
    x: Vec<f32>,
    s: Vec<f32>,
    r: Vec<f64>,
    inv: Vec<f32>,
    /// a striped block's column sums (lazy greedy's initial bounds)
    sums: Vec<f64>,
    sweep: SweepScratch,
}

#[allow(clippy::too_many_arguments)]
fn run_pool(
    pools: &Pools<'_>,
    p: usize,
    rewards: Option<&[f64]>,
    (text, ordered): (Option<&[u64]>, bool),
    params: &Params,
    kernel: Kernel,
    dense_limit: usize,
    sc: &mut Scratch,
) -> Result<FlResult> {
    let n = pools.layout.len(p);
    if n == 0 {
        return Ok(FlResult::default());
    }
    let pool_rewards = match rewards {
        Some(r) => {
            sc.r.clear();
            sc.r.extend((0..n).map(|i| r[pools.layout.row(p, i)]));
            Some(&sc.r[..])
        }
        None => None,
    };
    let (q, u) = ground_set(p, &|i| pools.layout.row(p, i), n, pool_rewards, params)?;
    let m = u.len();
    let d = pools.dim;
    let quality = q.as_ref().map(|q| u.iter().map(|&i| q[i]).collect());
    let rows_of_u = || u.iter().map(|&i| pools.layout.row(p, i)).collect();
    if dense_bytes(m) > dense_limit {
        let ties = Ties { quality, content: Content::new(&pools.data, rows_of_u(), rewards, text, ordered) };
        // too large for its n x n block: similarity columns on demand
        let mut xn = Vec::new();
        gather_normalized(pools, p, &u, &mut xn)?;
        let w = weights_for(p, q.as_deref(), &u, params)?;
        // its columns within the same budget as the block it does not hold
        let mut src = OnDemandSource::within(xn, m, d, kernel, dense_limit);
        return Ok(remap(greedy_with(&mut src, &w, params.k, params.optimizer, &ties), &u));
    }
    // the pool's rows straight from the caller's matrix when they are
    // contiguous and all in the ground set; a gathered copy otherwise
    let first = pools.layout.row(p, 0);
    let contiguous = m == n && (0..n).all(|i| pools.layout.row(p, i) == first + i);
    let x: &[f32] = match pools.data.f32_span(first, n) {
        Some(x) if contiguous => x,
        _ => {
            gather_rows(pools, p, &u, &mut sc.x);
            &sc.x
        }
    };
    // ties read the pool's own rows, which are in cache now
    let ties = Ties { quality, content: Content::of_block(x, d, rows_of_u(), rewards, text, ordered) };
    let name = |i: usize| {
        let row = pools.layout.row(p, u[i]);
        (p, row, format!("candidate {} (row {row})", u[i]))
    };
    // the next pool's rows (when contiguous), prefetched while this one computes
    let next: &[u8] = if p + 1 < pools.layout.n_pools() && pools.layout.len(p + 1) > 0 {
        let (f, len) = (pools.layout.row(p + 1, 0), pools.layout.len(p + 1));
        if pools.layout.row(p + 1, len - 1) == f + len - 1 {
            pools.data.bytes_of(f, len)
        } else {
            // rows spread over the matrix (a table not ordered by prompt): each row
            // and reward asked for now, while this pool's block computes, so the
            // next pool's gather finds them in cache
            prefetch_pool(pools, p + 1, rewards);
            &[]
        }
    } else {
        &[]
    };
    let w = weights_for(p, q.as_deref(), &u, params)?;
    // the sweep evaluates every gain; lazy greedy starts from bounds, which a
    // block made in stripes gives from its column sums, summed while made
    let sweep = use_sweep(m, params.k);
    let sums = (!sweep && params.optimizer == Optimizer::Lazy).then_some((&w[..], &mut sc.sums));
    cosine_gram_with(x, m, d, kernel, &mut sc.s, &mut sc.inv, &name, next, sums).map_err(|e| e.in_pool(p))?;
    // the Gram block is exactly symmetric: small pools with a small K take
    // the sweep, which gives what naive (and so lazy) greedy gives
    let mut res = if sweep {
        greedy_sweep_with(&sc.s, m, &w, params.k, &mut sc.sweep, &ties)
    } else {
        let mut src = if sc.sums.len() == m && params.optimizer == Optimizer::Lazy {
            DenseSource::with_sums(&sc.s, m, &sc.sums)
        } else {
            DenseSource::new(&sc.s, m)
        };
        greedy_with(&mut src, &w, params.k, params.optimizer, &ties)
    };
    for i in res.indices.iter_mut() {
        *i = u[*i];
    }
    Ok(res)
}
