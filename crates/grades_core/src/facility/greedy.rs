//! Naive and lazy (Minoux) greedy over any similarity [`Source`].

use std::collections::BinaryHeap;

use super::certificate::{certify_at, top_k_sum};
use super::params::{FlResult, Optimizer};
use super::source::Source;
use super::ties::{Picker, Ties};

/// Heap entry: larger gain first, then lower index (ties are then decided
/// by [`Picker::resolve`]). The gain is kept as a
/// u64 whose integer order is the float order (sign flipped for
/// non-negatives, all bits for negatives; -0.0 is taken as +0.0), so heap
/// comparisons are two integer compares.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Entry {
    key: u64,
    /// `usize::MAX - j`: lower indices first among equal gains
    rj: usize,
}

impl Entry {
    #[inline(always)]
    fn new(g: f64, j: usize) -> Self {
        let b = (g + 0.0).to_bits();
        let key = if b >> 63 == 0 { b | (1 << 63) } else { !b };
        Entry { key, rj: usize::MAX - j }
    }
    #[inline(always)]
    fn g(self) -> f64 {
        let b = if self.key >> 63 == 1 { self.key & !(1 << 63) } else { !self.key };
        f64::from_bits(b)
    }
    #[inline(always)]
    fn j(self) -> usize {
        usize::MAX - self.rj
    }
}

/// Greedy maximisation of F over `src` with weights `w`, keeping
/// `min(k, n)` elements. Indices are positions in the source's ground set.
/// Ties go by [`Ties::none`]'s rules (coverage, then the lower index).
pub fn greedy<S: Source + ?Sized>(src: &mut S, w: &[f64], k: usize, opt: Optimizer) -> FlResult {
    greedy_with(src, w, k, opt, &Ties::none())
}

/// [`greedy`] with ties and duplicates decided by `ties` (see [`super::ties`]).
pub fn greedy_with<S: Source + ?Sized>(src: &mut S, w: &[f64], k: usize, opt: Optimizer, ties: &Ties<'_>) -> FlResult {
    let n = src.n();
    let k = k.min(n);
    let mut res = FlResult::default();
    if n == 0 {
        return res;
    }
    src.prepare(w);
    let mut pk = Picker::new(ties, n, w);
    let mut c = vec![0f64; n];
    let mut chosen = vec![false; n];
    let mut f = 0.0f64;
    let mut ub = f64::INFINITY;
    let mut scratch: Vec<f64> = Vec::with_capacity(n);
    let mut tied: Vec<(usize, f64)> = Vec::new();
    match opt {
        Optimizer::Naive => {
            let mut g = vec![0f64; n];
            let mut js: Vec<usize> = (0..n).collect();
            for t in 0..=k {
                js.retain(|&j| !chosen[j]);
                let mut gj = vec![0f64; js.len()];
                src.gains(&js, w, &c, &mut gj);
                for (&j, &v) in js.iter().zip(&gj) {
                    g[j] = v;
                }
                if certify_at(t, k, n) {
                    scratch.clear();
                    scratch.extend_from_slice(&gj);
                    ub = ub.min(f + top_k_sum(&mut scratch, k));
                }
                if t == k {
                    break;
                }
                // the largest eligible gain, then every eligible gain tied with it
                let gmax = js.iter().filter(|&&j| !pk.aside(j)).fold(f64::NEG_INFINITY, |a, &j| a.max(g[j]));
                let thr = pk.threshold(gmax);
                tied.clear();
                tied.extend(js.iter().filter(|&&j| !pk.aside(j) && g[j] >= thr).map(|&j| (j, g[j])));
                let (best, gb) = pk.resolve(src, &tied);
                chosen[best] = true;
                f += gb;
                src.cover(best, w, &mut c);
                pk.picked(best, gb, &chosen);
                res.indices.push(best);
                crate::progress::picked();
                res.gains.push(gb);
            }
        }
        Optimizer::Lazy => {
            let mut init = vec![0f64; n];
            src.initial_bounds(w, &mut init);
            scratch.extend_from_slice(&init);
            ub = ub.min(top_k_sum(&mut scratch, k));
            let mut heap: BinaryHeap<Entry> = init.iter().enumerate().map(|(j, &g)| Entry::new(g, j)).collect();
            // step at which each entry's value was computed exactly; initial
            // bounds count as stale so every pick is evaluated by `gains`.
            let mut fresh = vec![usize::MAX; n];
            // re-evaluate up to the source's batch of stale tops at a time (1
            // for sources where a column is cheap, more where columns are
            // evaluated in parallel), adapted to how many the last step
            // needed: a step that re-evaluated few does not pay for a full
            // batch next time
            let b_max = src.batch().max(1);
            let b_min = src.batch_min().clamp(1, b_max);
            let mut b = b_max;
            let mut stale: Vec<usize> = Vec::with_capacity(b_max);
            let mut keep: Vec<Entry> = Vec::with_capacity(b_max);
            let mut held: Vec<Entry> = Vec::new();
            let mut vals = vec![0f64; b_max];
            // a source whose gains are dear lowers every bound by its gain's
            // drop after each pick, from the rows the pick's cover raised
            let track = src.tracks_drops();
            let (mut c_old, mut rows, mut drop) = (Vec::new(), Vec::new(), Vec::new());
            if track {
                c_old.resize(n, 0.0);
                drop.resize(n, 0.0);
            }
            for t in 0..k {
                if t > 0 && certify_at(t, k, n) {
                    scratch.clear();
                    scratch.extend(heap.iter().map(|e| e.g()));
                    ub = ub.min(f + top_k_sum(&mut scratch, k));
                }
                let mut evals = 0usize;
                held.clear();
                // the largest eligible gain: re-evaluate stale tops until a fresh one leads
                loop {
                    let top = *heap.peek().expect("heap holds every unchosen element");
                    if pk.aside(top.j()) {
                        held.push(top);
                        heap.pop();
                        continue;
                    }
                    if fresh[top.j()] == t {
                        break;
                    }
                    stale.clear();
                    keep.clear();
                    while stale.len() < b {
                        match heap.peek() {
                            Some(e) if pk.aside(e.j()) => {
                                held.push(*e);
                                heap.pop();
                            }
                            Some(e) if fresh[e.j()] != t => {
                                stale.push(e.j());
                                heap.pop();
                            }
                            Some(e) if stale.is_empty() => {
                                keep.push(*e);
                                heap.pop();
                            }
                            _ => break,
                        }
                    }
                    src.gains(&stale, w, &c, &mut vals[..stale.len()]);
                    evals += stale.len();
                    for (&j, &g) in stale.iter().zip(&vals) {
                        fresh[j] = t;
                        heap.push(Entry::new(g, j));
                    }
                    heap.extend(keep.drain(..));
                }
                // every eligible gain tied with it: stale bounds at or above
                // the threshold are evaluated (a bound of 0 is exact: gains
                // are never negative)
                let top = heap.pop().expect("a fresh top");
                let thr = pk.threshold(top.g());
                tied.clear();
                tied.push((top.j(), top.g()));
                while let Some(&e) = heap.peek() {
                    if e.g() < thr {
                        break;
                    }
                    heap.pop();
                    if pk.aside(e.j()) {
                        held.push(e);
                    } else if fresh[e.j()] == t || e.g() == 0.0 {
                        tied.push((e.j(), e.g()));
                    } else {
                        let mut v = [0f64];
                        src.gains(&[e.j()], w, &c, &mut v);
                        evals += 1;
                        fresh[e.j()] = t;
                        heap.push(Entry::new(v[0], e.j()));
                    }
                }
                let (best, gb) = pk.resolve(src, &tied);
                for &(j, g) in tied.iter() {
                    if j != best {
                        heap.push(Entry::new(g, j));
                    }
                }
                heap.extend(held.drain(..));
                chosen[best] = true;
                f += gb;
                if track {
                    c_old.copy_from_slice(&c);
                }
                src.cover(best, w, &mut c);
                if track && t + 1 < k {
                    rows.clear();
                    rows.extend((0..n).filter(|&i| c[i] > c_old[i]));
                    if !rows.is_empty() && src.gain_drops(&rows, &c_old, &c, w, &mut drop) {
                        // a bound stays above its gain: the drop is a lower bound, and the
                        // margin covers the f64 rounding of gains summed in another order;
                        // a bound of 0 stays 0 (exact), none other becomes 0
                        let lowered: Vec<Entry> = heap
                            .drain()
                            .map(|e| {
                                let g = e.g();
                                let v = if g > 0.0 { (g - drop[e.j()]).max(0.0) + 1e-11 * g } else { 0.0 };
                                Entry::new(v, e.j())
                            })
                            .collect();
                        heap = BinaryHeap::from(lowered);
                    }
                }
                pk.picked(best, gb, &chosen);
                res.indices.push(best);
                crate::progress::picked();
                res.gains.push(gb);
                b = (evals / 2).clamp(b_min, b_max);
            }
            scratch.clear();
            scratch.extend(heap.iter().map(|e| e.g()));
            ub = ub.min(f + top_k_sum(&mut scratch, k));
        }
    }
    // F(S) from the final cover, not the running sum of gains.
    res.objective = c.iter().zip(w).map(|(&ci, &wi)| wi * ci).sum();
    res.upper_bound = ub.max(res.objective);
    res.ties = pk.n_ties;
    res.zero_gain = pk.n_zero;
    res.dup_skipped = pk.n_skipped(&chosen);
    res
}
