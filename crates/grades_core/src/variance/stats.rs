//! Per-prompt statistics and the estimators built from them.

use crate::error::{invalid, Result};

/// Per-prompt running statistics.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Stats {
    /// Number of responses (rows) seen.
    pub count: u64,
    /// Mean loss.
    pub mean: f64,
    /// Sum of squared deviations from the mean.
    pub m2: f64,
}

impl Stats {
    /// Statistics of a slice of values, by two passes (a reference).
    pub fn of_slice(x: &[f64]) -> Stats {
        if x.is_empty() {
            return Stats::default();
        }
        let n = x.len() as f64;
        let mean = x.iter().sum::<f64>() / n;
        let m2 = x.iter().map(|&v| (v - mean) * (v - mean)).sum::<f64>();
        Stats { count: x.len() as u64, mean, m2 }
    }

    /// Welford's update with one value.
    #[inline]
    pub fn push(&mut self, x: f64) {
        self.count += 1;
        let d = x - self.mean;
        self.mean += d / self.count as f64;
        self.m2 += d * (x - self.mean);
    }

    /// Chan et al.'s exact merge of two sets of statistics.
    #[inline]
    pub fn merge(&mut self, o: &Stats) {
        if o.count == 0 {
            return;
        }
        if self.count == 0 {
            *self = *o;
            return;
        }
        let (na, nb) = (self.count as f64, o.count as f64);
        let n = na + nb;
        let d = o.mean - self.mean;
        self.mean += d * (nb / n);
        self.m2 += o.m2 + d * d * (na * nb / n);
        self.count += o.count;
    }

    /// Unbiased variance `M2 / (count - 1)`; `None` below two values.
    pub fn sample_variance(&self) -> Option<f64> {
        (self.count >= 2).then(|| self.m2 / (self.count - 1) as f64)
    }

    /// Whether the mean and `M2` are finite numbers.
    pub fn is_finite(&self) -> bool {
        self.mean.is_finite() && self.m2.is_finite()
    }
}

/// Per-prompt statistics as three columns of the same length.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StatsColumns {
    pub count: Vec<u64>,
    pub mean: Vec<f64>,
    pub m2: Vec<f64>,
}

impl StatsColumns {
    /// The columns of a list of statistics.
    pub fn of(stats: &[Stats]) -> StatsColumns {
        StatsColumns {
            count: stats.iter().map(|s| s.count).collect(),
            mean: stats.iter().map(|s| s.mean).collect(),
            m2: stats.iter().map(|s| s.m2).collect(),
        }
    }
}

/// Count, mean and covariance of 4-vectors, built one vector at a time
/// (Welford) and merged exactly (Chan et al.); `cov` holds the co-moments
/// (sums of products of deviations) until `finish` divides them by `n - 1`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Moments {
    /// Number of vectors.
    pub n: u64,
    /// Their mean.
    pub mean: [f64; 4],
    /// Their covariance (co-moments before `finish`).
    pub cov: [[f64; 4]; 4],
}

impl Moments {
    pub(crate) fn push(&mut self, v: [f64; 4]) {
        self.n += 1;
        let inv = 1.0 / self.n as f64;
        let d: [f64; 4] = std::array::from_fn(|i| v[i] - self.mean[i]);
        for (m, di) in self.mean.iter_mut().zip(&d) {
            *m += di * inv;
        }
        let e: [f64; 4] = std::array::from_fn(|j| v[j] - self.mean[j]);
        for (row, di) in self.cov.iter_mut().zip(&d) {
            for (c, ej) in row.iter_mut().zip(&e) {
                *c += di * ej;
            }
        }
    }

    pub(crate) fn merge(&mut self, o: &Moments) {
        if o.n == 0 {
            return;
        }
        if self.n == 0 {
            *self = *o;
            return;
        }
        let (na, nb) = (self.n as f64, o.n as f64);
        let n = na + nb;
        let d: [f64; 4] = std::array::from_fn(|i| o.mean[i] - self.mean[i]);
        for (m, di) in self.mean.iter_mut().zip(&d) {
            *m += di * (nb / n);
        }
        for ((row, orow), di) in self.cov.iter_mut().zip(&o.cov).zip(&d) {
            for ((c, oc), dj) in row.iter_mut().zip(orow).zip(&d) {
                *c += oc + di * dj * (na * nb / n);
            }
        }
        self.n += o.n;
    }

    /// Co-moments divided by `n - 1` (the sample covariance); an error when
    /// a value overflowed.
    pub(crate) fn finish(mut self) -> Result<Moments> {
        let k = 1.0 / (self.n.max(2) - 1) as f64;
        self.cov.iter_mut().flatten().for_each(|c| *c *= k);
        if !self.mean.iter().chain(self.cov.iter().flatten()).all(|v| v.is_finite()) {
            return invalid(
                "the moments of the per-prompt statistics overflow f64 (losses too large in magnitude): rescale the losses",
            );
        }
        Ok(self)
    }
}

/// The decomposition estimated from per-prompt statistics.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// Total rows seen.
    pub n_rows: u64,
    /// Distinct prompts seen.
    pub n_prompts: u64,
    /// Prompts with exactly one response (left out of the estimators).
    pub n_single_response_prompts: u64,
    /// Prompts used by the estimators (two or more responses).
    pub n_used_prompts: u64,
    /// Rows of the prompts used.
    pub n_used_rows: u64,
    /// `mean_i s_i^2`.
    pub v_y_given_x: f64,
    /// Unbiased (ddof = 1) variance of the prompt means.
    pub var_of_means: f64,
    /// `mean_i s_i^2 / K_i`: the within-prompt noise in `var_of_means`.
    pub within_leak: f64,
    /// `var_of_means - within_leak`, before the clip at 0 (may be negative).
    pub v_x_raw: f64,
    /// `max(0, v_x_raw)`.
    pub v_x: f64,
    /// Mean of the prompt means.
    pub grand_mean: f64,
    /// Mean number of responses over the prompts used.
    pub mean_k: f64,
}

/// Estimators from per-prompt statistics, summed in the order given.
pub fn summarize(stats: &[Stats], n_rows: u64) -> Result<Summary> {
    // in pieces, combined in order (as the accumulator sums its shards)
    let mut all = Partial::default();
    for piece in stats.chunks(1 << 12) {
        let mut p = Partial::default();
        piece.iter().for_each(|s| p.add(s));
        all.combine(&p);
    }
    all.finish(n_rows)
}

/// The sums behind the estimators over a set of prompts; two sets combine
/// exactly (counts and sums add, the prompt means' statistics merge by
/// Chan et al.), so the prompts can be summed in pieces.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Partial {
    prompts: u64,
    single: u64,
    rows_used: u64,
    /// Sums over the prompts used (two or more responses) of `s^2`,
    /// `s^2 / K` and `K`.
    s2: f64,
    leak: f64,
    k: f64,
    /// Count, mean and M2 of the prompt means (prompts used only).
    g: Stats,
}

impl Partial {
    pub(crate) fn add(&mut self, s: &Stats) {
        self.prompts += 1;
        if s.count == 1 {
            self.single += 1;
        } else if s.count >= 2 {
            let s2 = s.m2 / (s.count - 1) as f64;
            self.s2 += s2;
            self.leak += s2 / s.count as f64;
            self.k += s.count as f64;
            self.rows_used += s.count;
            self.g.push(s.mean);
        }
    }

    pub(crate) fn combine(&mut self, o: &Partial) {
        self.prompts += o.prompts;
        self.single += o.single;
        self.rows_used += o.rows_used;
        self.s2 += o.s2;
        self.leak += o.leak;
        self.k += o.k;
        self.g.merge(&o.g);
    }

    pub(crate) fn finish(&self, n_rows: u64) -> Result<Summary> {
        let p = self.g.count;
        if p < 2 {
            return invalid(format!(
                "need at least 2 prompts with >= 2 responses to separate V_x from V_y|x; got {p} \
                 ({} prompt(s), {} with a single response)",
                self.prompts, self.single
            ));
        }
        let pf = p as f64;
        let var_of_means = self.g.m2 / (pf - 1.0);
        let leak = self.leak / pf;
        let raw = var_of_means - leak;
        let s = Summary {
            n_rows,
            n_prompts: self.prompts,
            n_single_response_prompts: self.single,
            n_used_prompts: p,
            n_used_rows: self.rows_used,
            v_y_given_x: self.s2 / pf,
            var_of_means,
            within_leak: leak,
            v_x_raw: raw,
            v_x: raw.max(0.0),
            grand_mean: self.g.mean,
            mean_k: self.k / pf,
        };
        if ![s.v_y_given_x, s.var_of_means, s.within_leak, s.v_x_raw, s.grand_mean].iter().all(|v| v.is_finite()) {
            return invalid(format!(
                "the variance estimates overflow f64 (V_y|x = {}, variance of the prompt means = {}): \
                 the losses are too large in magnitude; rescale them",
                s.v_y_given_x, s.var_of_means
            ));
        }
        Ok(s)
    }
}
