//! Many small pools (clustered like the benchmark's) through the batched entry point (for profiling with
//! callgrind/perf): NP pools x 64 candidates x 384 dims, K = 4
//! (env: NP, N, K, ALPHA, REPS).
use grades_core::facility::{facility_location_batch, Optimizer, Params};
use grades_core::kernel::Kernel;
use grades_core::pools::Pools;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::time::Instant;

fn main() {
    let np: usize = std::env::var("NP").map(|v| v.parse().unwrap()).unwrap_or(2000);
    let alpha: f64 = std::env::var("ALPHA").map(|v| v.parse().unwrap()).unwrap_or(0.0);
    let n: usize = std::env::var("N").map(|v| v.parse().unwrap()).unwrap_or(64);
    let d = 384usize;
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    // like the benchmark's pools: prompt centre + one of 4 mode offsets +
    // noise (approximate normals from sums of uniforms)
    let mut normal = move || (0..4).map(|_| rng.random::<f32>()).sum::<f32>() * 1.732 - 3.464;
    let mut x = vec![0f32; np * n * d];
    for pool in x.chunks_mut(n * d) {
        let centre: Vec<f32> = (0..d).map(|_| normal()).collect();
        let modes: Vec<f32> = (0..4 * d).map(|_| normal()).collect();
        for (i, row) in pool.chunks_mut(d).enumerate() {
            let m = &modes[(i * 7 % 4) * d..][..d];
            for (l, v) in row.iter_mut().enumerate() {
                *v = centre[l] + 0.8 * m[l] + 0.6 * normal();
            }
        }
    }
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let r: Vec<f64> = (0..np * n).map(|_| rng.random::<f64>()).collect();
    let off: Vec<u64> = (0..=np).map(|p| (p * n) as u64).collect();
    let pools = Pools::new(&x, d, &off, None).unwrap();
    let k: usize = std::env::var("K").map(|v| v.parse().unwrap()).unwrap_or(4);
    let params = Params { k, alpha, eps: 1e-6, k_max: None, optimizer: Optimizer::Lazy };
    let reps: usize = std::env::var("REPS").map(|v| v.parse().unwrap()).unwrap_or(1);
    let mut dt = f64::INFINITY;
    let mut res = Vec::new();
    for _ in 0..reps {
        let t = Instant::now();
        res = facility_location_batch(&pools, Some(&r), &params, Kernel::Clip).unwrap();
        dt = dt.min(t.elapsed().as_secs_f64());
    }
    let mean_ratio: f64 = res.iter().map(|r| r.ratio()).sum::<f64>() / np as f64;
    println!(
        "{:.4} ms/pool (best of {reps}) over {} threads, mean certified ratio {:.4}",
        dt * 1e3 / np as f64,
        rayon::current_num_threads(),
        mean_ratio
    );
}
