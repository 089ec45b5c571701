//! How many gain evaluations lazy greedy needs on one dense pool.
use grades_core::facility::{greedy, DenseSource, Optimizer, Source};
use grades_core::kernel::{cosine_gram, Kernel};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr_free::normal;

mod rand_distr_free {
    use rand::Rng;
    pub fn normal(rng: &mut impl Rng) -> f32 {
        // Box-Muller
        let (u, v): (f64, f64) = (rng.random::<f64>().max(1e-300), rng.random());
        ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()) as f32
    }
}

struct Counting<'a> {
    inner: DenseSource<'a>,
    evals: usize,
}
impl Source for Counting<'_> {
    fn n(&self) -> usize {
        self.inner.n()
    }
    fn gains(&mut self, js: &[usize], w: &[f64], c: &[f64], out: &mut [f64]) {
        self.evals += js.len();
        self.inner.gains(js, w, c, out)
    }
    fn cover(&mut self, j: usize, w: &[f64], c: &mut [f64]) {
        self.inner.cover(j, w, c)
    }
    fn prepare(&mut self, w: &[f64]) {
        self.inner.prepare(w)
    }
}

fn main() {
    let n: usize = std::env::var("N").map(|v| v.parse().unwrap()).unwrap_or(5000);
    let d = 384;
    let k: usize = std::env::var("K").map(|v| v.parse().unwrap()).unwrap_or(100);
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let clusters: usize = std::env::var("CLUSTERS").map(|v| v.parse().unwrap()).unwrap_or(0);
    let x: Vec<f32> = if clusters == 0 {
        (0..n * d).map(|_| normal(&mut rng)).collect()
    } else {
        use rand::Rng;
        let c: Vec<f32> = (0..clusters * d).map(|_| normal(&mut rng)).collect();
        let mut x = Vec::with_capacity(n * d);
        for _ in 0..n {
            let m = rng.random_range(0..clusters);
            for t in 0..d {
                x.push(c[m * d + t] + 0.6 * normal(&mut rng));
            }
        }
        x
    };
    let (mut s, mut inv) = (Vec::new(), Vec::new());
    for kernel in [Kernel::Clip, Kernel::Shift] {
        cosine_gram(&x, n, d, kernel, &mut s, &mut inv, &|i| (0, format!("{i}")), &[]).unwrap();
        let w = vec![1.0; n];
        let mut src = Counting { inner: DenseSource::new(&s, n), evals: 0 };
        let r = greedy(&mut src, &w, k, Optimizer::Lazy);
        let first: Vec<f64> = r.gains.iter().take(5).copied().collect();
        println!("first gains {first:?}");
        println!(
            "{kernel:?}: n = {n}, k = {k}: {} evaluations after the initial pass ({:.1} per step), ratio {:.4}",
            src.evals - n,
            (src.evals - n) as f64 / k as f64,
            r.ratio()
        );
    }
}
