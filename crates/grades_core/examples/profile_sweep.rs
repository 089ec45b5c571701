//! The sweep greedy alone on one cached pool, single thread (for A/B timing
//! of the small-pool greedy): N candidates x 384 dims, K picks, REPS calls.
use grades_core::facility::{greedy_sweep_with, SweepScratch};
use grades_core::kernel::{cosine_gram, Kernel};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::time::Instant;

fn main() {
    let env = |k: &str, d: usize| std::env::var(k).map(|v| v.parse().unwrap()).unwrap_or(d);
    let (n, k, reps, d) = (env("N", 64), env("K", 4), env("REPS", 200_000), 384);
    let alpha: f64 = std::env::var("ALPHA").map(|v| v.parse().unwrap()).unwrap_or(0.0);
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let x: Vec<f32> = (0..n * d).map(|_| rng.random::<f32>() - 0.3).collect();
    let (mut s, mut inv) = (Vec::new(), Vec::new());
    let name = |i: usize| (i, String::new());
    cosine_gram(&x, n, d, Kernel::Clip, &mut s, &mut inv, &name, &[]).unwrap();
    let w: Vec<f64> = (0..n).map(|_| if alpha > 0.0 { rng.random::<f64>().powf(alpha) } else { 1.0 }).collect();
    let mut sc = SweepScratch::default();
    let mut best = f64::INFINITY;
    let mut sink = 0.0;
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..reps {
            sink += greedy_sweep_with(&s, n, &w, k, &mut sc).objective;
        }
        best = best.min(t.elapsed().as_secs_f64());
    }
    println!("{:.3} us per pool (n {n}, k {k}, alpha {alpha}; checksum {sink:.3})", best * 1e6 / reps as f64);
}
