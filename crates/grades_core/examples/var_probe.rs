use grades_core::variance::Accumulator;
use std::time::Instant;
fn mix(mut z: u64) -> u64 { z = z.wrapping_add(0x9E3779B97F4A7C15); z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9); z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB); z ^ (z >> 31) }
fn main() {
    let n = 10_000_000usize; let k = 16;
    let keys: Vec<u64> = (0..n).map(|i| mix((i / k) as u64)).collect();
    let x: Vec<f64> = (0..n).map(|i| ((i * 7919) % 1000) as f64 * 0.001).collect();
    for _ in 0..8 {
        let t = Instant::now();
        let s: f64 = x.iter().sum::<f64>() + keys.iter().fold(0u64, |a, b| a.wrapping_add(*b)) as f64;
        let tf = t.elapsed();
        let t = Instant::now();
        let mut acc = Accumulator::new();
        for (kc, xc) in keys.chunks(1 << 20).zip(x.chunks(1 << 20)) { acc.update(kc, xc).unwrap(); }
        let ta = t.elapsed();
        let t = Instant::now(); let r: f64 = keys.chunks(1<<20).zip(x.chunks(1<<20)).map(|(a,b)| runs_only(a,b)).sum(); let tr = t.elapsed(); println!("runs only {:?} {}", tr, r > 0.0);
        println!("floor {:?} acc {:?} ({} prompts) {}", tf, ta, acc.len(), s > 0.0);
    }
}
#[allow(dead_code)]
fn runs_only(keys: &[u64], losses: &[f64]) -> f64 {
    let n = keys.len(); let mut i = 0; let mut tot = 0.0;
    while i < n { let k = keys[i]; let sh = losses[i]; let (mut s1, mut s2) = (0.0, 0.0); let mut j = i + 1;
        while j < n && keys[j] == k { let d = losses[j] - sh; s1 += d; s2 += d * d; j += 1; }
        tot += s1 + s2; i = j; }
    tot
}
