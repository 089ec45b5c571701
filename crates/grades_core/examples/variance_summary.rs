//! Times `summary()` and `per_prompt()` of a variance accumulator holding
//! 6.25M prompts x 16 responses (for profiling with perf).
use grades_core::variance::Accumulator;
use std::time::Instant;
fn main() {
    let n = 6_250_000u64;
    let mut s = 88172645463325252u64;
    let mut acc = Accumulator::with_capacity(n as usize).unwrap();
    let (mut k, mut x) = (Vec::new(), Vec::new());
    for p in 0..n {
        let key = p.wrapping_mul(0x9E3779B97F4A7C15) ^ 12345;
        for _ in 0..16 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            k.push(key);
            x.push((s >> 11) as f64 / 9e15);
        }
        if k.len() >= 1 << 20 {
            acc.update(&k, &x).unwrap();
            k.clear();
            x.clear();
        }
    }
    acc.update(&k, &x).unwrap();
    for _ in 0..3 {
        let t = Instant::now();
        let sm = acc.summary().unwrap();
        println!("summary {:?} {}", t.elapsed(), sm.v_x);
        let t = Instant::now();
        let pp = acc.per_prompt();
        println!("per_prompt {:?} {}", t.elapsed(), pp.0.len());
    }
}
