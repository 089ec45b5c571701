//! Streams ROWS (prompt key, loss) rows, K per prompt, into a variance
//! accumulator in updates of CHUNK rows (for A/B timing and perf), next to a
//! read-only pass over the same arrays. LAYOUT=grouped|shuffled, RESERVE=1
//! sizes the tables up front, REPS repeats (best kept). The read pass is a
//! vectorised sum of both arrays over the same chunks: the floor of any pass
//! over the rows. LAYOUT=sorted gives the prompts increasing keys (the
//! accumulator then keeps them as a log, with no index).
use grades_core::variance::Accumulator;
use std::time::Instant;

fn main() {
    let env = |k: &str, d: f64| std::env::var(k).map(|v| v.parse::<f64>().unwrap()).unwrap_or(d) as usize;
    let (rows, k, chunk, reps, reserve) =
        (env("ROWS", 1e8), env("K", 16.0), env("CHUNK", 1048576.0), env("REPS", 3.0), env("RESERVE", 0.0));
    let shuffled = std::env::var("LAYOUT").is_ok_and(|v| v == "shuffled");
    let sorted = std::env::var("LAYOUT").is_ok_and(|v| v == "sorted");
    let prompts = rows / k;
    let mix = |mut z: u64| {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
        z ^ (z >> 31)
    };
    let mut s = 88172645463325252u64;
    let keys: Vec<u64> = (0..rows)
        .map(|i| {
            if shuffled {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                mix(s % prompts as u64)
            } else if sorted {
                (i / k) as u64
            } else {
                mix((i / k) as u64)
            }
        })
        .collect();
    let x: Vec<f64> = (0..rows).map(|i| ((mix(i as u64 ^ 77) >> 11) as f64) / 9e15).collect();
    let (mut t_acc, mut t_read) = (f64::INFINITY, f64::INFINITY);
    let mut len = 0;
    for _ in 0..reps {
        let t = Instant::now();
        // eight running sums per array, so the read is not latency-bound
        let (mut sum, mut fs) = ([0u64; 8], [0f64; 8]);
        for (kc, xc) in keys.chunks(chunk).zip(x.chunks(chunk)) {
            // exact chunks so that the loop vectorises (the tail is at most
            // 7 rows)
            for (a, b) in kc.chunks_exact(8).zip(xc.chunks_exact(8)) {
                for l in 0..8 {
                    sum[l] = sum[l].wrapping_add(a[l]);
                    fs[l] += b[l];
                }
            }
            for (l, (a, b)) in kc.chunks_exact(8).remainder().iter().zip(xc.chunks_exact(8).remainder()).enumerate() {
                sum[l] = sum[l].wrapping_add(*a);
                fs[l] += b;
            }
        }
        t_read = t_read.min(t.elapsed().as_secs_f64());
        std::hint::black_box((sum, fs));
        let t = Instant::now();
        let mut acc = if reserve > 0 { Accumulator::with_capacity(prompts).unwrap() } else { Accumulator::new() };
        for (kc, xc) in keys.chunks(chunk).zip(x.chunks(chunk)) {
            acc.update(kc, xc).unwrap();
        }
        t_acc = t_acc.min(t.elapsed().as_secs_f64());
        let t = Instant::now();
        std::hint::black_box(acc.summary().unwrap());
        let t_sum = t.elapsed().as_secs_f64();
        let t2 = Instant::now();
        std::hint::black_box(acc.summary().unwrap());
        eprintln!("  summary again {:.4} s", t2.elapsed().as_secs_f64());
        let t = Instant::now();
        let used = acc.used_stats().count.len();
        eprintln!("  summary {t_sum:.4} s, used_stats {:.4} s ({used} prompts)", t.elapsed().as_secs_f64());
        len = acc.len();
        eprintln!("  indexed {}", acc.is_indexed());
    }
    println!(
        "{rows} rows, {len} prompts, chunk {chunk}, reserve {reserve}: accumulate {:.4} s, read {:.4} s, ratio {:.2}",
        t_acc,
        t_read,
        t_acc / t_read
    );
}
