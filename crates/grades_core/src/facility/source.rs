//! The interface through which greedy queries similarities.

/// A source of similarities that greedy can query.
pub trait Source {
    /// Size of the ground set.
    fn n(&self) -> usize;
    /// `sum_i w_i * max(0, w_j * S_ij - c_i)` for each `j` in `js`.
    fn gains(&mut self, js: &[usize], w: &[f64], c: &[f64], out: &mut [f64]);
    /// `c_i = max(c_i, w_j * S_ij)` for every i.
    fn cover(&mut self, j: usize, w: &[f64], c: &mut [f64]);
    /// Upper bounds on every gain with an empty cover (default: exact).
    fn initial_bounds(&mut self, w: &[f64], out: &mut [f64]) {
        empty_cover_gains(self, w, out)
    }
    /// How many stale heap tops lazy greedy re-evaluates at once, at most.
    fn batch(&self) -> usize {
        1
    }
    /// The fewest stale tops re-evaluated at once once a step needed few
    /// (default: 1/16 of `batch`).
    fn batch_min(&self) -> usize {
        (self.batch() / 16).max(1)
    }
    /// Called once with the weights before greedy starts (a source may
    /// specialise on them).
    fn prepare(&mut self, _w: &[f64]) {}
    /// Whether [`Source::gain_drops`] is worth calling: a source whose gains
    /// cost far more than the rows a pick changes (columns recomputed from
    /// embeddings) says so, and lazy greedy then lowers every stale bound
    /// after each pick instead of re-evaluating them one by one.
    fn tracks_drops(&self) -> bool {
        false
    }
    /// Lower bounds on how much every gain fell when the cover rose from
    /// `old` to `c` on `rows` (the rows where it rose): `drop[j] <=
    /// sum_{i in rows} w_i (max(0, w_j S_ij - old_i) - max(0, w_j S_ij - c_i))`,
    /// for every `j`. Any lower bound keeps lazy greedy exact (its picks are
    /// always re-evaluated by `gains`); false where the source does not.
    fn gain_drops(&mut self, _rows: &[usize], _old: &[f64], _c: &[f64], _w: &[f64], _drop: &mut [f64]) -> bool {
        false
    }
}

/// Every gain of `src` with an empty cover, exactly: the default initial bounds.
pub(super) fn empty_cover_gains<S: Source + ?Sized>(src: &mut S, w: &[f64], out: &mut [f64]) {
    let n = src.n();
    let all: Vec<usize> = (0..n).collect();
    let c = vec![0.0; n];
    src.gains(&all, w, &c, out);
}
