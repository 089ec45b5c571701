//! One dense pool through the batched entry point, the benchmark's W2 shape
//! (a Gaussian mixture, N x 384, K = 100), timed as a whole and by phase
//! (Gram block, then greedy). Env: N, K, CLUSTERS, REPS.
use grades_core::facility::{facility_location_batch, greedy, DenseSource, Optimizer, Params};
use grades_core::kernel::{cosine_gram, Kernel};
use grades_core::pools::Pools;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::time::Instant;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).map(|v| v.parse().unwrap()).unwrap_or(default)
}

fn main() {
    let (n, d, k) = (env("N", 20_000), 384usize, env("K", 100));
    let clusters = env("CLUSTERS", (n / 100).max(10));
    let reps = env("REPS", 3);
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    // approximate normals from sums of uniforms
    let mut normal = move || (0..4).map(|_| rng.random::<f32>()).sum::<f32>() * 1.732 - 3.464;
    let centres: Vec<f32> = (0..clusters * d).map(|_| normal()).collect();
    let mut x = vec![0f32; n * d];
    for (i, row) in x.chunks_mut(d).enumerate() {
        let c = &centres[(i * 7919 % clusters) * d..][..d];
        for (v, &m) in row.iter_mut().zip(c) {
            *v = m + 0.7 * normal();
        }
    }
    let off = [0u64, n as u64];
    let pools = Pools::new(&x, d, &off, None).unwrap();
    let params = Params { k, alpha: 0.0, eps: 1e-6, k_max: None, optimizer: Optimizer::Lazy };
    let (mut total, mut gram, mut sel) = (f64::INFINITY, f64::INFINITY, f64::INFINITY);
    for _ in 0..reps {
        let t = Instant::now();
        let r = facility_location_batch(&pools, None, &params, Kernel::Clip).unwrap();
        total = total.min(t.elapsed().as_secs_f64());
        assert_eq!(r[0].indices.len(), k);
        let t = Instant::now();
        let (mut s, mut inv) = (Vec::new(), Vec::new());
        cosine_gram(&x, n, d, Kernel::Clip, &mut s, &mut inv, &|i| (0, format!("{i}")), &[]).unwrap();
        gram = gram.min(t.elapsed().as_secs_f64());
        let t = Instant::now();
        let w = vec![1.0; n];
        let r2 = greedy(&mut DenseSource::new(&s, n), &w, k, Optimizer::Lazy);
        sel = sel.min(t.elapsed().as_secs_f64());
        assert_eq!(r2.indices, r[0].indices);
    }
    println!(
        "n = {n}, K = {k}, {} threads, best of {reps}: total {total:.3} s; Gram {gram:.3} s, greedy {sel:.3} s",
        rayon::current_num_threads()
    );
}
