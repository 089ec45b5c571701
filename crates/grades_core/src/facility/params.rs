//! The parameters every entry point shares, the choice of optimizer and the
//! outcome of one pool.

use crate::error::{invalid, Error, Result};

/// Which greedy runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Optimizer {
    Naive,
    Lazy,
}

impl Optimizer {
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "naive" => Ok(Optimizer::Naive),
            "lazy" => Ok(Optimizer::Lazy),
            other => invalid(format!("optimizer must be 'lazy' or 'naive', got {other:?}")),
        }
    }
}

/// Parameters shared by every facility-location entry point.
#[derive(Debug, Clone, Copy)]
pub struct Params {
    /// Number of candidates to keep per pool (>= 1).
    pub k: usize,
    /// Quality exponent (>= 0); 0 ignores rewards (plain diversity).
    pub alpha: f64,
    /// Smoothing in the quality normalisation (> 0).
    pub eps: f64,
    /// Keep only the `k_max` best-quality candidates as the ground set.
    pub k_max: Option<usize>,
    pub optimizer: Optimizer,
}

impl Params {
    pub fn validate(&self) -> Result<()> {
        if self.k < 1 {
            return invalid(format!("k must be >= 1, got {}", self.k));
        }
        if !self.alpha.is_finite() || self.alpha < 0.0 {
            return invalid(format!("alpha must be a finite number >= 0, got {}", self.alpha));
        }
        if !self.eps.is_finite() || self.eps <= 0.0 {
            return invalid(format!("eps must be a finite number > 0, got {}", self.eps));
        }
        if let Some(km) = self.k_max {
            if km < self.k {
                return invalid(format!("k_max must be >= k, got k_max = {km} < k = {}", self.k));
            }
        }
        Ok(())
    }

    pub(super) fn needs_rewards(&self) -> bool {
        self.alpha > 0.0 || self.k_max.is_some()
    }
}

/// The outcome of one pool.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FlResult {
    /// Chosen candidates (indices within the pool), in pick order.
    pub indices: Vec<usize>,
    /// Marginal gain of each pick, in pick order.
    pub gains: Vec<f64>,
    /// F(S) of the chosen set.
    pub objective: f64,
    /// Certified upper bound on the best K-subset's F.
    pub upper_bound: f64,
    /// Picks decided by the tie rule (several distinct candidates' gains
    /// equal within rounding; a tie among exact duplicates is not counted).
    pub ties: usize,
    /// Picks whose gain is zero (within rounding of the pool's first gain).
    pub zero_gain: usize,
    /// Candidates not kept because they repeat a kept one (same embedding or text).
    pub dup_skipped: usize,
}

impl FlResult {
    /// objective / upper_bound (1 when both are 0).
    pub fn ratio(&self) -> f64 {
        if self.upper_bound > 0.0 {
            self.objective / self.upper_bound
        } else {
            1.0
        }
    }
}

pub(super) fn need_rewards_error() -> Error {
    Error::Invalid("alpha > 0 or k_max needs rewards; pass rewards or use alpha = 0".into())
}
