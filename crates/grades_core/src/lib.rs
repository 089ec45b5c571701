//! `grades_core`: the Rust core of `mrt_fast`.
//!
//! Pure Rust. Python bindings live only in the `python` folder, behind the
//! `python` cargo feature.
//!
//! * [`pools`]: a ragged batch of pools (offsets into one contiguous f32 matrix).
//! * [`kernel`]: cosine similarity mapped into [0, 1]; dense Gram blocks and CSR graphs.
//! * [`facility`]: the (quality-weighted) facility-location objective, naive and
//!   lazy greedy, and a certified upper bound on the optimum.
//! * [`sampling`]: random-K, top-K and mode-stratified selection.
//! * [`variance`]: streaming, mergeable prompt/response variance accumulators.

pub mod error;
pub mod facility;
pub mod kernel;
pub mod kmeans;
pub mod pools;
pub mod sampling;
pub mod simd;
pub mod variance;

#[cfg(feature = "python")]
mod python;

pub use error::{Error, Result};
