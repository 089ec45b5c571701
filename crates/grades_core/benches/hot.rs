//! Criterion benches of the core's hot loops: many small pools (Gram blocks +
//! lazy greedy) and one sparse pool.
use criterion::{criterion_group, criterion_main, Criterion};
use grades_core::facility::{facility_location_batch, facility_location_sparse, Optimizer, Params};
use grades_core::kernel::{Csr, Kernel};
use grades_core::pools::Pools;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn data(n: usize, d: usize, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n * d).map(|_| rng.random::<f32>() - 0.5).collect()
}

fn bench_small_pools(c: &mut Criterion) {
    let (pools, n, d) = (1024usize, 64usize, 384usize);
    let x = data(pools * n, d, 1);
    let offsets: Vec<u64> = (0..=pools).map(|p| (p * n) as u64).collect();
    let rewards: Vec<f64> = data(pools * n, 1, 2).iter().map(|&v| v as f64).collect();
    let pl = Pools::new(&x, d, &offsets, None).unwrap();
    let params = Params { k: 4, alpha: 0.75, eps: 1e-6, k_max: None, optimizer: Optimizer::Lazy };
    c.bench_function("grades_1024x64x384_k4", |b| {
        b.iter(|| facility_location_batch(&pl, Some(&rewards), &params, Kernel::Clip).unwrap())
    });
}

fn bench_sparse(c: &mut Criterion) {
    let (n, deg) = (20_000usize, 16usize);
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let mut indptr = vec![0i64];
    let mut indices = Vec::new();
    let mut vals = Vec::new();
    for i in 0..n {
        indices.push(i as i64);
        vals.push(1.0f32);
        for _ in 0..deg {
            indices.push(rng.random_range(0..n) as i64);
            vals.push(rng.random::<f32>());
        }
        indptr.push(indices.len() as i64);
    }
    let g = Csr::new(n, &indptr, &indices, &vals).unwrap();
    let params = Params { k: 200, alpha: 0.0, eps: 1e-6, k_max: None, optimizer: Optimizer::Lazy };
    c.bench_function("sparse_20000_deg16_k200", |b| {
        b.iter(|| facility_location_sparse(&g.as_ref(), false, None, &params).unwrap())
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10);
    targets = bench_small_pools, bench_sparse
}
criterion_main!(benches);
