//! Streaming, mergeable prompt/response variance accumulators for the
//! variance-budget law.
//!
//! One pass over `(prompt key, loss)` rows, in any order, keeps for every
//! prompt its response count, mean loss and sum of squared deviations `M2`
//! (Welford). Two accumulators merge exactly with Chan et al.'s parallel
//! update, so shards processed by different workers combine into the same
//! statistics as a single pass (up to floating-point rounding).
//!
//! From the per-prompt statistics, [`Accumulator::summary`] gives the
//! estimators of the paper's decomposition `Var = V_x / Np + V_y|x / (Np K)`:
//!
//! * `V_y|x = mean_i s_i^2` over prompts with at least two responses, where
//!   `s_i^2 = M2_i / (K_i - 1)` is the unbiased within-prompt variance;
//! * `V_x = max(0, var_i(g_i) - mean_i(s_i^2 / K_i))`, where `g_i` is the mean
//!   loss of prompt `i` and `var_i` is the *unbiased* (ddof = 1) variance of the
//!   prompt means. With `K_i` independent of the prompt, each `g_i` has
//!   variance `V_x + sigma_i^2 / K_i` around the common mean, and for
//!   independent variables with a common mean the ddof = 1 sample variance is
//!   unbiased for the average of their variances, i.e. for
//!   `V_x + mean_i(sigma_i^2 / K_i)`; `s_i^2 / K_i` is unbiased for
//!   `sigma_i^2 / K_i`, so the difference is unbiased for `V_x` before the clip
//!   at 0, also when the `K_i` differ.
//!
//! Prompts with a single response carry no within-prompt information; they
//! are left out of both estimators and counted in
//! [`Summary::n_single_response_prompts`] so the caller can report them.
//!
//! * [`stats`]: one prompt's statistics, the estimators and the moments the
//!   normal bootstrap uses;
//! * [`accumulator`]: the hash maps of prompts, updates and merges;
//! * [`serial`]: the accumulator as checksummed bytes.

#![forbid(unsafe_code)]

pub mod accumulator;
pub mod serial;
pub mod stats;

pub use accumulator::Accumulator;
pub use stats::{summarize, Moments, Stats, StatsColumns, Summary};

#[cfg(test)]
mod tests;
