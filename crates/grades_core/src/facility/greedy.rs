//! Naive and lazy (Minoux) greedy over any similarity [`Source`].

use std::collections::BinaryHeap;

use super::certificate::{certify_at, top_k_sum};
use super::params::{FlResult, Optimizer};
use super::source::Source;

/// Heap entry: larger gain first, then lower index. The gain is kept as a
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
pub fn greedy<S: Source + ?Sized>(src: &mut S, w: &[f64], k: usize, opt: Optimizer) -> FlResult {
    let n = src.n();
    let k = k.min(n);
    let mut res = FlResult::default();
    if n == 0 {
        return res;
    }
    src.prepare(w);
    let mut c = vec![0f64; n];
    let mut chosen = vec![false; n];
    let mut f = 0.0f64;
    let mut ub = f64::INFINITY;
    let mut scratch: Vec<f64> = Vec::with_capacity(n);
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
                // argmax, ties to the lower index (js is ascending)
                let mut best = js[0];
                for &j in &js[1..] {
                    if g[j] > g[best] {
                        best = j;
                    }
                }
                chosen[best] = true;
                f += g[best];
                src.cover(best, w, &mut c);
                res.indices.push(best);
                res.gains.push(g[best]);
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
            let mut vals = vec![0f64; b_max];
            for t in 0..k {
                if t > 0 && certify_at(t, k, n) {
                    scratch.clear();
                    scratch.extend(heap.iter().map(|e| e.g()));
                    ub = ub.min(f + top_k_sum(&mut scratch, k));
                }
                let mut evals = 0usize;
                loop {
                    let top = *heap.peek().expect("heap holds every unchosen element");
                    if fresh[top.j()] == t {
                        heap.pop();
                        chosen[top.j()] = true;
                        f += top.g();
                        src.cover(top.j(), w, &mut c);
                        res.indices.push(top.j());
                        res.gains.push(top.g());
                        b = (evals / 2).clamp(b_min, b_max);
                        break;
                    }
                    stale.clear();
                    keep.clear();
                    while stale.len() < b {
                        match heap.peek() {
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
            }
            scratch.clear();
            scratch.extend(heap.iter().map(|e| e.g()));
            ub = ub.min(f + top_k_sum(&mut scratch, k));
        }
    }
    // F(S) from the final cover, not the running sum of gains.
    res.objective = c.iter().zip(w).map(|(&ci, &wi)| wi * ci).sum();
    res.upper_bound = ub.max(res.objective);
    res
}
