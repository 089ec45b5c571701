//! Modes of a pool: seeded greedy k-means++ and Lloyd iterations on unit vectors,
//! over a ragged batch of pools, in parallel over pools.
//!
//! Every pool's rows are scaled to unit norm first (so squared Euclidean
//! distance is `2 - 2 cos`). A pool's generator is seeded from
//! `(seed, key)` exactly as the random selectors are, so its labels do not
//! depend on row order of other pools, sharding or the number of threads.
//!
//! Labels are canonical: clusters are numbered in order of first appearance
//! inside the pool (candidate 0 is always in mode 0), and empty clusters are
//! dropped, so a pool's label set is always `0..n_modes`.
//!
//! The number of modes is either given (capped at the pool size) or chosen
//! per pool by the silhouette rule: among `m` in `2..=min(m_max, n - 1)` take
//! the `m` with the largest mean silhouette (ties to the smaller `m`); if that
//! silhouette is below `min_silhouette` the pool is one mode. Kaufman and
//! Rousseeuw read a mean silhouette at or below 0.25 as "no substantial
//! structure", the default threshold.

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

use crate::error::{invalid, Result};
use crate::kernel::gather_normalized;
use crate::pools::Pools;
use crate::sampling::pool_rng;

/// How modes are found.
#[derive(Debug, Clone, Copy)]
pub struct KmeansParams {
    /// A fixed number of modes per pool (capped at the pool size), or `None`
    /// to choose it by the silhouette rule.
    pub n_modes: Option<usize>,
    /// Largest number of modes tried by the silhouette rule.
    pub m_max: usize,
    /// Silhouette below which a pool is one mode.
    pub min_silhouette: f64,
    /// Lloyd iterations at most.
    pub max_iter: usize,
}

impl Default for KmeansParams {
    fn default() -> Self {
        Self { n_modes: None, m_max: 8, min_silhouette: 0.25, max_iter: 100 }
    }
}

impl KmeansParams {
    pub fn validate(&self) -> Result<()> {
        if let Some(m) = self.n_modes {
            if m < 1 {
                return invalid(format!("n_modes must be >= 1, got {m}"));
            }
        }
        if self.m_max < 1 {
            return invalid(format!("m_max must be >= 1, got {}", self.m_max));
        }
        if !self.min_silhouette.is_finite() || !(-1.0..=1.0).contains(&self.min_silhouette) {
            return invalid(format!("min_silhouette must be in [-1, 1], got {}", self.min_silhouette));
        }
        if self.max_iter < 1 {
            return invalid(format!("max_iter must be >= 1, got {}", self.max_iter));
        }
        Ok(())
    }
}

/// Modes of every pool of a batch.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Modes {
    /// Label of every position (pool-major, in the layout's order).
    pub labels: Vec<u32>,
    /// Number of modes of each pool.
    pub n_modes: Vec<u32>,
    /// Sum of squared distances to the assigned centre, per pool.
    pub inertia: Vec<f64>,
    /// Mean silhouette of the final labelling, per pool (0 for one mode).
    pub silhouette: Vec<f64>,
}

/// An index drawn with probability proportional to `w` (`total` its sum, > 0); never a
/// point of weight 0 (rounding at the end of the sum).
fn draw_by_weight(w: &[f64], total: f64, rng: &mut ChaCha8Rng) -> usize {
    let n = w.len();
    let mut u = rng.random::<f64>() * total;
    let mut pick = n - 1;
    for (i, &wi) in w.iter().enumerate() {
        if u < wi {
            pick = i;
            break;
        }
        u -= wi;
    }
    if w[pick] == 0.0 {
        pick = w.iter().enumerate().rev().find(|(_, &x)| x > 0.0).map(|(i, _)| i).unwrap_or(pick);
    }
    pick
}

/// The rows of `x` (`n x d`) by dimension: `d x n`, float64. The loops below
/// run over rows innermost (many rows at once in vector registers), each
/// row's sum still taken dimension by dimension in order, so every sum is
/// rounded exactly as when one row is done at a time.
fn by_dimension(x: &[f32], n: usize, d: usize) -> Vec<f64> {
    let mut xt = vec![0f64; n * d];
    for i in 0..n {
        for (j, &v) in x[i * d..(i + 1) * d].iter().enumerate() {
            xt[j * n + i] = v as f64;
        }
    }
    xt
}

/// Squared distance of every row of `xt` (`d x n`, see [`by_dimension`]) to
/// `c`, into `out`: `sum_j (x_ij - c_j)^2`, dimension by dimension.
fn sqdists(xt: &[f64], n: usize, c: &[f64], out: &mut [f64]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 is available (checked just above).
            return unsafe { sqdists_avx2(xt, n, c, out) };
        }
    }
    sqdists_body(xt, n, c, out)
}

/// [`sqdists`] compiled for AVX2 (the same lane-wise operations, no fused
/// multiply-add: the same bits).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sqdists_avx2(xt: &[f64], n: usize, c: &[f64], out: &mut [f64]) {
    sqdists_body(xt, n, c, out)
}

#[inline(always)]
fn sqdists_body(xt: &[f64], n: usize, c: &[f64], out: &mut [f64]) {
    out[..n].fill(0.0);
    for (j, &cj) in c.iter().enumerate() {
        for (o, &v) in out[..n].iter_mut().zip(&xt[j * n..(j + 1) * n]) {
            let t = v - cj;
            *o += t * t;
        }
    }
}

/// `acc[i] += row[i]` for every i (vectorised; each entry's sum in the caller's order).
fn add_row(acc: &mut [f64], row: &[f64]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 is available (checked just above).
            return unsafe { add_row_avx2(acc, row) };
        }
    }
    add_row_body(acc, row)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn add_row_avx2(acc: &mut [f64], row: &[f64]) {
    add_row_body(acc, row)
}

#[inline(always)]
fn add_row_body(acc: &mut [f64], row: &[f64]) {
    for (a, &v) in acc.iter_mut().zip(row) {
        *a += v;
    }
}

/// k-means++ seeding then Lloyd on the rows of `x` (`n x d`, unit rows).
/// Returns canonical labels and the inertia.
pub fn kmeans_one(x: &[f32], n: usize, d: usize, m: usize, max_iter: usize, rng: &mut ChaCha8Rng) -> (Vec<u32>, f64) {
    let m = m.clamp(1, n.max(1));
    if n == 0 {
        return (Vec::new(), 0.0);
    }
    let xt = by_dimension(x, n, d);
    let row = |i: usize| &x[i * d..(i + 1) * d];
    // greedy k-means++ seeding (Arthur and Vassilvitskii; scikit-learn's default): each new
    // centre is the best, by the potential it leaves, of 2 + ln(m) candidates drawn by D^2
    let mut centres: Vec<f64> = Vec::with_capacity(m * d);
    let first = rng.random_range(0..n);
    centres.extend(row(first).iter().map(|&v| v as f64));
    let mut d2 = vec![0f64; n];
    sqdists(&xt, n, &centres[0..d], &mut d2);
    let trials = 2 + (m as f64).ln().floor() as usize;
    let mut cand_d2 = vec![0f64; n];
    let mut best_d2 = vec![0f64; n];
    for _ in 1..m {
        let total: f64 = d2.iter().sum();
        if total <= 0.0 {
            // all points coincide with a centre: no further distinct centre exists
            break;
        }
        let mut best: Option<(usize, f64)> = None;
        for _ in 0..trials {
            let pick = draw_by_weight(&d2, total, rng);
            let c: Vec<f64> = row(pick).iter().map(|&v| v as f64).collect();
            sqdists(&xt, n, &c, &mut cand_d2);
            let mut potential = 0.0;
            for (cd, &di) in cand_d2.iter_mut().zip(&d2) {
                *cd = cd.min(di);
                potential += *cd;
            }
            if best.is_none_or(|(_, p)| potential < p) {
                best = Some((pick, potential));
                best_d2.copy_from_slice(&cand_d2);
            }
        }
        let (pick, _) = best.expect("at least one trial");
        centres.extend(row(pick).iter().map(|&v| v as f64));
        d2.copy_from_slice(&best_d2);
    }
    let mc = centres.len() / d;
    // Lloyd
    let mut labels = vec![0usize; n];
    let mut dist = vec![0f64; mc * n]; // squared distance of every row to every centre
    let mut assign = |centres: &[f64], labels: &mut [usize]| -> (bool, f64) {
        for c in 0..mc {
            sqdists(&xt, n, &centres[c * d..(c + 1) * d], &mut dist[c * n..(c + 1) * n]);
        }
        let mut changed = false;
        let mut inertia = 0.0;
        for (i, l) in labels.iter_mut().enumerate() {
            let mut best = 0usize;
            let mut bd = f64::INFINITY;
            for c in 0..mc {
                let dd = dist[c * n + i];
                if dd < bd {
                    bd = dd;
                    best = c;
                }
            }
            if *l != best {
                *l = best;
                changed = true;
            }
            inertia += bd;
        }
        (changed, inertia)
    };
    let (_, mut inertia) = assign(&centres, &mut labels);
    for _ in 0..max_iter {
        // update: mean of members; an empty cluster keeps its centre
        let mut sums = vec![0f64; mc * d];
        let mut counts = vec![0usize; mc];
        for (i, &l) in labels.iter().enumerate() {
            counts[l] += 1;
            for (s, &v) in sums[l * d..(l + 1) * d].iter_mut().zip(row(i)) {
                *s += v as f64;
            }
        }
        for c in 0..mc {
            if counts[c] > 0 {
                let inv = 1.0 / counts[c] as f64;
                for (cc, s) in centres[c * d..(c + 1) * d].iter_mut().zip(&sums[c * d..(c + 1) * d]) {
                    *cc = s * inv;
                }
            }
        }
        let (changed, ine) = assign(&centres, &mut labels);
        inertia = ine;
        if !changed {
            break;
        }
    }
    (canonical(&labels), inertia)
}

/// Renumber labels in order of first appearance.
fn canonical(labels: &[usize]) -> Vec<u32> {
    let mut map: Vec<Option<u32>> = vec![None; labels.iter().copied().max().map_or(0, |m| m + 1)];
    let mut next = 0u32;
    labels
        .iter()
        .map(|&l| {
            *map[l].get_or_insert_with(|| {
                next += 1;
                next - 1
            })
        })
        .collect()
}

/// Mean silhouette of `labels` given the symmetric `n x n` distance matrix `dist`.
/// Points alone in their cluster score 0; one cluster scores 0.
pub fn silhouette(dist: &[f64], n: usize, labels: &[u32]) -> f64 {
    let m = labels.iter().copied().max().map_or(0, |v| v as usize + 1);
    if m < 2 || n < 2 {
        return 0.0;
    }
    let mut size = vec![0usize; m];
    for &l in labels {
        size[l as usize] += 1;
    }
    // sums[c * n + i]: the distances of row i to the rows of cluster c, added in row order; the
    // matrix is symmetric, so row j of it gives every row's distance to j (one pass over rows
    // at once for each j: the same additions in the same order as one row at a time)
    let mut sums = vec![0f64; m * n];
    for j in 0..n {
        let c = labels[j] as usize;
        add_row(&mut sums[c * n..(c + 1) * n], &dist[j * n..(j + 1) * n]);
    }
    let mut total = 0.0;
    for i in 0..n {
        let li = labels[i] as usize;
        if size[li] < 2 {
            continue;
        }
        let a = sums[li * n + i] / (size[li] - 1) as f64;
        let b = (0..m)
            .filter(|&c| c != li && size[c] > 0)
            .map(|c| sums[c * n + i] / size[c] as f64)
            .fold(f64::INFINITY, f64::min);
        let den = a.max(b);
        if den > 0.0 && b.is_finite() {
            total += (b - a) / den;
        }
    }
    total / n as f64
}

fn pool_modes(x: &[f32], n: usize, d: usize, p: &KmeansParams, rng: &mut ChaCha8Rng) -> (Vec<u32>, f64, f64) {
    if let Some(m) = p.n_modes {
        let (labels, inertia) = kmeans_one(x, n, d, m.min(n), p.max_iter, rng);
        let sil = if n <= 256 { silhouette(&distances(x, n, d), n, &labels) } else { f64::NAN };
        return (labels, inertia, sil);
    }
    let (one, inertia1) = kmeans_one(x, n, d, 1, 1, rng);
    let hi = p.m_max.min(n.saturating_sub(1));
    if hi < 2 {
        return (one, inertia1, 0.0);
    }
    let dist = distances(x, n, d);
    let mut best: Option<(Vec<u32>, f64, f64)> = None;
    for m in 2..=hi {
        let (labels, inertia) = kmeans_one(x, n, d, m, p.max_iter, rng);
        let s = silhouette(&dist, n, &labels);
        if best.as_ref().is_none_or(|b| s > b.2) {
            best = Some((labels, inertia, s));
        }
    }
    match best {
        Some(b) if b.2 >= p.min_silhouette => b,
        _ => (one, inertia1, 0.0),
    }
}

/// Euclidean distances between the rows of `x` (`n x n`), each squared
/// distance summed dimension by dimension (rows by dimension, as in
/// [`kmeans_one`]).
fn distances(x: &[f32], n: usize, d: usize) -> Vec<f64> {
    let xt = by_dimension(x, n, d);
    let mut out = vec![0f64; n * n];
    let mut acc = vec![0f64; n];
    let mut centre = vec![0f64; d];
    for i in 0..n {
        // row i as a centre: the rows after it, squared distances dimension by dimension
        // (x_j - x_i)^2 = (x_i - x_j)^2 to the bit
        for (k, c) in centre.iter_mut().enumerate() {
            *c = xt[k * n + i];
        }
        sqdists(&xt, n, &centre, &mut acc);
        let rest = &acc[i + 1..n];
        for (j, &s) in (i + 1..n).zip(rest.iter()) {
            let v = s.sqrt();
            out[i * n + j] = v;
            out[j * n + i] = v;
        }
    }
    out
}

/// Modes of every pool: k-means per pool on unit-normalised embeddings, in
/// parallel over pools. `keys` (one per pool) seed each pool's generator.
pub fn modes_batch(pools: &Pools<'_>, keys: &[u64], seed: u64, params: &KmeansParams) -> Result<Modes> {
    params.validate()?;
    let lay = &pools.layout;
    if keys.len() != lay.n_pools() {
        return invalid(format!("keys has {} entries but there are {} pools", keys.len(), lay.n_pools()));
    }
    let d = pools.dim;
    let per: Vec<Result<(Vec<u32>, f64, f64)>> = (0..lay.n_pools())
        .into_par_iter()
        .map(|p| {
            let n = lay.len(p);
            let which: Vec<usize> = (0..n).collect();
            let mut x = Vec::new();
            gather_normalized(pools, p, &which, &mut x)?;
            let mut rng = pool_rng(seed, keys[p]);
            Ok(pool_modes(&x, n, d, params, &mut rng))
        })
        .collect();
    let mut out = Modes::default();
    for r in per {
        let (labels, inertia, sil) = r?;
        out.n_modes.push(labels.iter().copied().max().map_or(0, |m| m + 1));
        out.labels.extend(labels);
        out.inertia.push(inertia);
        out.silhouette.push(sil);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_distr_free::normal;

    // The vectorised loops against the row-at-a-time definitions, to the bit.
    fn sqdist_ref(a: &[f32], b: &[f64]) -> f64 {
        a.iter().map(|&x| x as f64).zip(b).map(|(x, &c)| (x - c) * (x - c)).sum()
    }

    fn silhouette_ref(dist: &[f64], n: usize, labels: &[u32]) -> f64 {
        let m = labels.iter().copied().max().map_or(0, |v| v as usize + 1);
        if m < 2 || n < 2 {
            return 0.0;
        }
        let mut size = vec![0usize; m];
        labels.iter().for_each(|&l| size[l as usize] += 1);
        let mut total = 0.0;
        for i in 0..n {
            let mut sum = vec![0f64; m];
            for j in 0..n {
                sum[labels[j] as usize] += dist[i * n + j];
            }
            let li = labels[i] as usize;
            if size[li] < 2 {
                continue;
            }
            let a = sum[li] / (size[li] - 1) as f64;
            let b = (0..m)
                .filter(|&c| c != li && size[c] > 0)
                .map(|c| sum[c] / size[c] as f64)
                .fold(f64::INFINITY, f64::min);
            let den = a.max(b);
            if den > 0.0 && b.is_finite() {
                total += (b - a) / den;
            }
        }
        total / n as f64
    }

    proptest::proptest! {
        #[test]
        fn vectorised_sums_equal_one_row_at_a_time(
            vals in proptest::collection::vec(-1000i32..1000, 1..400),
            d in 1usize..10,
            labels in proptest::collection::vec(0u32..4, 40),
        ) {
            let n = vals.len() / d;
            proptest::prop_assume!(n > 0);
            let x: Vec<f32> = vals[..n * d].iter().map(|&v| v as f32 / 337.0).collect();
            let xt = by_dimension(&x, n, d);
            let c: Vec<f64> = x[..d].iter().map(|&v| v as f64 * 0.7 + 0.1).collect();
            let mut out = vec![0f64; n];
            sqdists(&xt, n, &c, &mut out);
            for i in 0..n {
                proptest::prop_assert_eq!(out[i].to_bits(), sqdist_ref(&x[i * d..(i + 1) * d], &c).to_bits());
            }
            let dist = distances(&x, n, d);
            for i in 0..n {
                for j in 0..n {
                    let r: Vec<f64> = x[j * d..(j + 1) * d].iter().map(|&v| v as f64).collect();
                    let want = if i == j { 0.0 } else { sqdist_ref(&x[i * d..(i + 1) * d], &r).sqrt() };
                    proptest::prop_assert_eq!(dist[i * n + j].to_bits(), want.to_bits());
                }
            }
            let lab = &labels[..n.min(labels.len())];
            let m = lab.len();
            let sub: Vec<f64> = (0..m).flat_map(|i| (0..m).map(move |j| (i, j))).map(|(i, j)| dist[i * n + j]).collect();
            proptest::prop_assert_eq!(silhouette(&sub, m, lab).to_bits(), silhouette_ref(&sub, m, lab).to_bits());
        }
    }

    /// Tiny Box-Muller so the tests need no extra crate.
    mod rand_distr_free {
        use rand::Rng;
        pub fn normal(rng: &mut impl Rng) -> f32 {
            let u1: f64 = rng.random::<f64>().max(1e-12);
            let u2: f64 = rng.random();
            ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
        }
    }

    /// `m` planted clusters of `per` points in `d` dims, tight around random centres.
    fn planted(m: usize, per: usize, d: usize, noise: f32, seed: u64) -> (Vec<f32>, Vec<usize>) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let centres: Vec<Vec<f32>> = (0..m).map(|_| (0..d).map(|_| normal(&mut rng)).collect()).collect();
        let mut x = Vec::new();
        let mut truth = Vec::new();
        for i in 0..m * per {
            let c = i % m;
            x.extend(centres[c].iter().map(|&v| v + noise * normal(&mut rng)));
            truth.push(c);
        }
        (x, truth)
    }

    fn same_partition(a: &[u32], b: &[usize]) -> bool {
        let n = a.len();
        (0..n).all(|i| (0..n).all(|j| (a[i] == a[j]) == (b[i] == b[j])))
    }

    #[test]
    fn recovers_planted_clusters_fixed_and_auto() {
        let (x, truth) = planted(3, 10, 16, 0.05, 7);
        let off = [0u64, 30];
        let pools = Pools::new(&x, 16, &off, None).unwrap();
        let fixed = modes_batch(&pools, &[1], 0, &KmeansParams { n_modes: Some(3), ..Default::default() }).unwrap();
        assert!(same_partition(&fixed.labels, &truth));
        let auto = modes_batch(&pools, &[1], 0, &KmeansParams::default()).unwrap();
        assert_eq!(auto.n_modes, vec![3]);
        assert!(same_partition(&auto.labels, &truth));
        assert!(auto.silhouette[0] > 0.8);
    }

    #[test]
    fn structureless_pool_is_one_mode() {
        // points spread evenly: no substantial structure
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let x: Vec<f32> = (0..40 * 32).map(|_| normal(&mut rng)).collect();
        let off = [0u64, 40];
        let pools = Pools::new(&x, 32, &off, None).unwrap();
        let auto = modes_batch(&pools, &[9], 0, &KmeansParams::default()).unwrap();
        assert_eq!(auto.n_modes, vec![1]);
        assert!(auto.labels.iter().all(|&l| l == 0));
    }

    #[test]
    fn deterministic_per_pool_and_independent_of_batch() {
        let (x, _) = planted(2, 6, 8, 0.3, 11);
        let (y, _) = planted(4, 5, 8, 0.3, 12);
        let mut both = x.clone();
        both.extend_from_slice(&y);
        let off = [0u64, 12, 32];
        let pools = Pools::new(&both, 8, &off, None).unwrap();
        let p = KmeansParams { n_modes: Some(3), ..Default::default() };
        let a = modes_batch(&pools, &[5, 6], 42, &p).unwrap();
        let b = modes_batch(&pools, &[5, 6], 42, &p).unwrap();
        assert_eq!(a, b);
        let off2 = [0u64, 20];
        let alone = Pools::new(&y, 8, &off2, None).unwrap();
        let c = modes_batch(&alone, &[6], 42, &p).unwrap();
        assert_eq!(&a.labels[12..], &c.labels[..]);
    }

    #[test]
    fn labels_canonical_and_bounded() {
        let (x, _) = planted(5, 3, 4, 0.5, 2);
        let off = [0u64, 15];
        let pools = Pools::new(&x, 4, &off, None).unwrap();
        for m in 1..=20 {
            let r = modes_batch(&pools, &[0], 1, &KmeansParams { n_modes: Some(m), ..Default::default() }).unwrap();
            assert_eq!(r.labels[0], 0);
            let k = r.n_modes[0] as usize;
            assert!(k <= m.min(15));
            let mut seen = vec![false; k];
            for &l in &r.labels {
                seen[l as usize] = true;
            }
            assert!(seen.iter().all(|&s| s));
        }
    }

    #[test]
    fn duplicates_and_bad_input() {
        let x = vec![1.0f32, 0.0, 1.0, 0.0, 1.0, 0.0];
        let off = [0u64, 3];
        let pools = Pools::new(&x, 2, &off, None).unwrap();
        let r = modes_batch(&pools, &[0], 0, &KmeansParams { n_modes: Some(3), ..Default::default() }).unwrap();
        assert_eq!(r.n_modes, vec![1]);
        let z = vec![0.0f32, 0.0, 1.0, 0.0];
        let off = [0u64, 2];
        let pools = Pools::new(&z, 2, &off, None).unwrap();
        let e = modes_batch(&pools, &[0], 0, &KmeansParams::default()).unwrap_err();
        assert!(e.to_string().contains("pool 0"));
        assert!(modes_batch(&pools, &[0, 1], 0, &KmeansParams::default()).is_err());
        assert!(KmeansParams { n_modes: Some(0), ..Default::default() }.validate().is_err());
    }
}
