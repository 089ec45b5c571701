//! Criterion benches of the core's hot loops: many small pools (Gram blocks +
//! lazy greedy), the small-pool sweep greedy alone, one large clustered pool
//! held dense and run on demand, and one sparse pool.
use criterion::{criterion_group, criterion_main, Criterion};
use grades_core::facility::{
    facility_location_batch, facility_location_batch_within, facility_location_sparse, greedy_sweep_with, Optimizer,
    Params, SweepScratch, Ties,
};
use grades_core::kernel::{cosine_gram, Csr, Kernel};
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

fn bench_ragged_pools(c: &mut Criterion) {
    // the dataset benchmarks' shape: pools of 8 to 128 candidates, 32 dims, K = 4
    let d = 32usize;
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let mut offsets = vec![0u64];
    while offsets.len() <= 4096 {
        offsets.push(offsets.last().unwrap() + rng.random_range(8..=128u64));
    }
    let rows = *offsets.last().unwrap() as usize;
    let x = data(rows, d, 5);
    let rewards: Vec<f64> = data(rows, 1, 6).iter().map(|&v| v as f64).collect();
    let pl = Pools::new(&x, d, &offsets, None).unwrap();
    let params = Params { k: 4, alpha: 0.75, eps: 1e-6, k_max: None, optimizer: Optimizer::Lazy };
    c.bench_function("grades_4096x8-128x32_k4", |b| {
        b.iter(|| facility_location_batch(&pl, Some(&rewards), &params, Kernel::Clip).unwrap())
    });
}

fn bench_big_pools(c: &mut Criterion) {
    // pools of 1,000-10,000 candidates (the dataset benchmarks' large-pool shape), 32 dims, K = 4
    let d = 32usize;
    let sizes = [1500u64, 5500, 9000];
    let mut offsets = vec![0u64];
    for s in sizes {
        offsets.push(offsets.last().unwrap() + s);
    }
    let rows = *offsets.last().unwrap() as usize;
    let x = data(rows, d, 7);
    let rewards: Vec<f64> = data(rows, 1, 8).iter().map(|&v| v as f64).collect();
    let pl = Pools::new(&x, d, &offsets, None).unwrap();
    let params = Params { k: 4, alpha: 0.75, eps: 1e-6, k_max: None, optimizer: Optimizer::Lazy };
    c.bench_function("grades_3_pools_1500-9000x32_k4", |b| {
        b.iter(|| facility_location_batch(&pl, Some(&rewards), &params, Kernel::Clip).unwrap())
    });
}

fn bench_sweep(c: &mut Criterion) {
    // the sweep greedy alone on one cached 64 x 64 block, K = 4
    let (n, d, k) = (64usize, 384usize, 4usize);
    let x: Vec<f32> = data(n, d, 3).iter().map(|v| v + 0.2).collect();
    let (mut s, mut inv) = (Vec::new(), Vec::new());
    cosine_gram(&x, n, d, Kernel::Clip, &mut s, &mut inv, &|i| (0, i, format!("{i}")), &[]).unwrap();
    let w = vec![1.0; n];
    let mut sc = SweepScratch::default();
    c.bench_function("sweep_64x384_k4", |b| {
        b.iter(|| greedy_sweep_with(&s, n, &w, k, &mut sc, &Ties::none()).objective)
    });
}

fn bench_large_pool(c: &mut Criterion) {
    // one clustered pool of 4,000 x 384, K = 100: its 64 MB block held dense,
    // and the same pool with similarity columns on demand (a budget below it)
    let (n, d, k, clusters) = (4000usize, 384usize, 100usize, 40usize);
    let mut rng = ChaCha8Rng::seed_from_u64(3);
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
    let mut g = c.benchmark_group("one_pool_4000x384_k100");
    g.bench_function("dense", |b| {
        b.iter(|| facility_location_batch_within(&pools, None, &params, Kernel::Clip, usize::MAX).unwrap())
    });
    g.bench_function("on_demand", |b| {
        b.iter(|| facility_location_batch_within(&pools, None, &params, Kernel::Clip, 0).unwrap())
    });
    g.finish();
}

fn bench_sparse(c: &mut Criterion) {
    let (n, deg) = (20_000usize, 16usize);
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let mut indptr = vec![0i64];
    let mut indices = Vec::new();
    let mut vals = Vec::new();
    for i in 0..n {
        // the self loop and `deg` random neighbours, each (i, j) once
        let mut row = vec![(i as i64, 1.0f32)];
        for _ in 0..deg {
            row.push((rng.random_range(0..n) as i64, rng.random::<f32>()));
        }
        row.sort_by_key(|e| e.0);
        row.dedup_by_key(|e| e.0);
        for (j, v) in row {
            indices.push(j);
            vals.push(v);
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
    targets = bench_small_pools, bench_ragged_pools, bench_big_pools, bench_sweep, bench_large_pool, bench_sparse
}
criterion_main!(benches);
