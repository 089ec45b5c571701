//! Facility location on one pool given by a dense, a sparse or an on-demand
//! similarity.

use rayon::prelude::*;

use super::dense::DenseSource;
use super::greedy::greedy_with;
use super::on_demand::OnDemandSource;
use super::params::{need_rewards_error, FlResult, Params};
use super::sparse::SparseSource;
use super::ties::{Content, Ties};
use super::weights::{ground_set, remap, weights_for};
use crate::embeddings::Embeddings;
use crate::error::{invalid, try_zeroed, Result};
use crate::kernel::{gather_normalized, Csr, CsrRef, Idx, Kernel};
use crate::pools::Pools;

/// Ties of a single pool: its qualities on the ground set `u` (content as given).
fn ties_of<'a>(q: Option<Vec<f64>>, u: &[usize], content: Content<'a>) -> Ties<'a> {
    Ties { quality: q.map(|q| u.iter().map(|&i| q[i]).collect()), content }
}

/// Ground set and weights of a single pool.
type Setup = (Option<Vec<f64>>, Vec<usize>, Vec<f64>);

fn single_pool_setup(n: usize, rewards: Option<&[f64]>, params: &Params) -> Result<Setup> {
    params.validate()?;
    if params.needs_rewards() && rewards.is_none() {
        return Err(need_rewards_error());
    }
    if let Some(r) = rewards {
        if r.len() != n {
            return invalid(format!("rewards has {} entries but the pool has {} candidates", r.len(), n));
        }
    }
    let (q, u) = ground_set(0, &|i| i, n, rewards, params)?;
    let w = weights_for(0, q.as_deref(), &u, params)?;
    Ok((q, u, w))
}

/// Facility location on one pool with a precomputed dense similarity
/// (row-major `n x n`, values in [0, 1]; need not be symmetric).
pub fn facility_location_dense(sim: &[f32], n: usize, rewards: Option<&[f64]>, params: &Params) -> Result<FlResult> {
    if sim.len() != n * n {
        return invalid(format!("similarity has {} entries, expected n * n = {}", sim.len(), n * n));
    }
    // the first bad entry in row-major order (rows checked in parallel)
    let bad = |v: f32| !v.is_finite() || !(0.0..=1.0).contains(&v);
    let first_bad = sim
        .par_chunks(n.max(1))
        .enumerate()
        .find_first(|(_, row)| row.iter().any(|&v| bad(v)))
        .map(|(i, row)| (i, row.iter().position(|&v| bad(v)).unwrap_or(0)));
    if let Some((i, j)) = first_bad {
        return invalid(format!(
            "similarity[{i}, {j}] = {} is outside [0, 1]; map cosines with kernel='clip' or 'shift' first",
            sim[i * n + j]
        ));
    }
    let (q, u, w) = single_pool_setup(n, rewards, params)?;
    let ties = ties_of(q, &u, Content::none());
    let m = u.len();
    // column-major copy of the ground-set block: col j holds S_ij, i in U;
    // in parallel over columns, 64 at a time (so the row-major reads of a
    // tile share cache lines)
    let mut cols = try_zeroed::<f32>(m * m, None, "the similarity block")?;
    const T: usize = 64;
    cols.par_chunks_mut(T * m.max(1)).enumerate().for_each(|(b, block)| {
        let j0 = b * T;
        let nj = block.len() / m.max(1);
        for i0 in (0..m).step_by(T) {
            for (ii, &i) in u[i0..(i0 + T).min(m)].iter().enumerate() {
                let row = &sim[i * n..(i + 1) * n];
                for jj in 0..nj {
                    block[jj * m + i0 + ii] = row[u[j0 + jj]];
                }
            }
        }
    });
    let mut src = DenseSource::new(&cols, m);
    Ok(remap(greedy_with(&mut src, &w, params.k, params.optimizer, &ties), &u))
}

/// Facility location on one pool with a sparse similarity graph. With
/// `symmetric` (the caller promises S = S^T, as for a symmetrised kNN graph)
/// rows serve as columns and the graph is used in place; otherwise it is
/// transposed once (memory O(nnz)).
pub fn facility_location_sparse<P: Idx, I: Idx>(
    graph: &CsrRef<'_, P, I>,
    symmetric: bool,
    rewards: Option<&[f64]>,
    params: &Params,
) -> Result<FlResult> {
    let n = graph.n;
    let (q, u, w) = single_pool_setup(n, rewards, params)?;
    let ties = ties_of(q, &u, Content::none());
    if u.len() == n {
        if symmetric {
            let mut src = SparseSource { cols: *graph };
            return Ok(greedy_with(&mut src, &w, params.k, params.optimizer, &ties));
        }
        let cols = graph.transpose();
        let mut src = SparseSource { cols: cols.as_ref() };
        return Ok(greedy_with(&mut src, &w, params.k, params.optimizer, &ties));
    }
    // restrict to the ground set, renumbered 0..m
    let mut pos = vec![u32::MAX; n];
    for (k, &i) in u.iter().enumerate() {
        pos[i] = k as u32;
    }
    let mut indptr = vec![0usize];
    let mut indices = Vec::new();
    let mut data = Vec::new();
    for &i in &u {
        for e in graph.row(i) {
            let j = graph.indices[e].ix();
            if pos[j] != u32::MAX {
                indices.push(pos[j]);
                data.push(graph.data[e]);
            }
        }
        indptr.push(indices.len());
    }
    let sub = Csr { n: u.len(), indptr, indices, data };
    let cols = if symmetric { sub } else { sub.transpose() };
    let mut src = SparseSource { cols: cols.as_ref() };
    Ok(remap(greedy_with(&mut src, &w, params.k, params.optimizer, &ties), &u))
}

/// Facility location on one large pool of embeddings without ever holding the
/// n x n similarity: columns are recomputed on demand (memory O(n d)).
pub fn facility_location_on_demand(
    x: &[f32],
    n: usize,
    d: usize,
    rewards: Option<&[f64]>,
    params: &Params,
    kernel: Kernel,
) -> Result<FlResult> {
    if d == 0 || x.len() != n * d {
        return invalid(format!("embeddings have {} floats, expected n * d = {} * {}", x.len(), n, d));
    }
    let (q, u, w) = single_pool_setup(n, rewards, params)?;
    let emb = Embeddings::f32(x, d)?;
    let ties = ties_of(q, &u, Content::new(&emb, u.clone(), rewards, None, false));
    let offsets = [0u64, n as u64];
    let layout = crate::pools::Layout::single(&offsets);
    let pools = Pools { data: emb.clone(), dim: d, layout };
    let mut xn = Vec::new();
    gather_normalized(&pools, 0, &u, &mut xn)?;
    let mut src = OnDemandSource::new(xn, u.len(), d, kernel);
    Ok(remap(greedy_with(&mut src, &w, params.k, params.optimizer, &ties), &u))
}
