//! Quality-weighted facility location ("GRADES") and its greedy optimisers.
//!
//! Objective over a ground set `U` with weights `w_i = q_i^alpha` and
//! similarities `S_ij` in [0, 1]:
//!
//! ```text
//! F(S) = sum_{i in U} w_i * max_{j in S} w_j * S_ij      (max over {} = 0)
//! gain(j | S) = sum_i w_i * max(0, w_j * S_ij - c_i),    c_i = current cover of i
//! ```
//!
//! F is normalised, monotone and submodular for w >= 0 and S >= 0, so greedy
//! is within (1 - 1/e) of the best K-subset. Both optimisers pick the largest
//! gain, with gains equal within rounding decided by the rule of `ties`
//! (quality, coverage, content; never the row position) and duplicates of a
//! kept candidate set aside; lazy greedy (Minoux) re-evaluates only stale
//! heap tops and returns exactly what naive greedy returns.
//!
//! **Certificate.** For any greedy prefix `S_t`, `OPT <= F(S_t) + (sum of the K
//! largest marginal gains w.r.t. S_t)`. Each result carries the minimum of that
//! bound over the prefixes examined (every prefix for naive greedy and for
//! lazy greedy on pools of at most 4096 candidates; prefixes 0, 1, 2, 4, 8, ...
//! and K otherwise), using exact gains where known and, for lazy greedy, the
//! heap's stale gains, which are valid upper bounds by submodularity.
//!
//! * `params`: the shared parameters, the choice of optimizer, one pool's result;
//! * `weights`: rewards to qualities, the `k_max` ground set and the weights,
//!   with their checks;
//! * `source`: the similarity interface greedy queries, implemented by
//!   `dense`, `sparse` and `on_demand` (columns recomputed from embeddings);
//! * `column`: one column's gain and cover, portable and AVX2;
//! * `greedy`: naive and lazy greedy over any source;
//! * `sweep`: greedy for small symmetric dense pools, one row sweep a step;
//! * `ties`: how tied gains and duplicates are decided;
//! * `certificate`: the certified upper bound on the optimum;
//! * `batch`: many pools in parallel and the dense size limit;
//! * `single`: one pool given by a dense, a sparse or an on-demand similarity.

mod batch;
mod certificate;
mod column;
mod dense;
mod greedy;
mod on_demand;
mod params;
mod single;
mod source;
mod sparse;
mod sweep;
mod ties;
mod weights;

#[cfg(test)]
mod tests;

pub use batch::{
    dense_bytes, facility_location_batch, facility_location_batch_keyed, facility_location_batch_within,
    DENSE_LIMIT_BYTES,
};
pub use dense::{objective_dense, DenseSource};
pub use greedy::{greedy, greedy_with};
pub use on_demand::OnDemandSource;
pub use params::{FlResult, Optimizer, Params};
pub use single::{facility_location_dense, facility_location_on_demand, facility_location_sparse};
pub use source::Source;
pub use sparse::SparseSource;
pub use sweep::{greedy_sweep, greedy_sweep_with, use_sweep, SweepScratch, SWEEP_MAX_N};
pub use ties::{Content, Ties, TIE_RTOL};
pub use weights::{prefilter, quality};
