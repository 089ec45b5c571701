//! `grades_core`: the Rust core of `mrt_fast`.
//!
//! Pure Rust. Python bindings live only in the `python` folder, behind the
//! `python` cargo feature.
//!
//! * [`convert`]: float16 embeddings widened to f32.
//! * [`embeddings`]: the caller's embedding matrix read in place (float32 or float16, in blocks).
//! * [`error`]: the one error type, carrying pool / argument / row where known.
//! * [`pools`]: a ragged batch of pools (offsets into one embedding matrix).
//! * [`gram`]: the symmetric Gram product `X X^T` (AVX2/FMA with a portable path)
//!   and the general product `A B^T`.
//! * [`kernel`]: cosine similarity mapped into [0, 1]; dense Gram blocks and CSR graphs.
//! * [`facility`]: the (quality-weighted) facility-location objective, naive and
//!   lazy greedy, and a certified upper bound on the optimum.
//! * [`keys`]: stable 64-bit keys of prompt ids (by value).
//! * [`dedup`]: near-duplicates inside pools, by a cosine threshold.
//! * [`grouping`]: rows grouped by integer prompt id, in order of first appearance.
//! * [`pooling`]: static (model2vec-style) sentence embeddings from token ids.
//! * [`progress`]: a count of picks made, for progress displays.
//! * [`sampling`]: random-K, top-K and mode-stratified selection.
//! * [`kmeans`]: modes of a pool by k-means with a silhouette rule.
//! * [`variance`]: streaming, mergeable prompt/response variance accumulators.

pub mod convert;
pub mod dedup;
pub mod embeddings;
pub mod error;
pub mod facility;
pub mod gram;
pub mod grouping;
pub mod kernel;
pub mod keys;
pub mod kmeans;
pub mod pooling;
pub mod pools;
pub mod progress;
pub mod sampling;
pub mod variance;

#[cfg(feature = "python")]
mod python;

pub use error::{Error, Result};
