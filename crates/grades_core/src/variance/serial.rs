//! The accumulator as bytes.
//!
//! Layout (all little-endian): magic `MRTVACC\0`, u32 version, u32 zero,
//! u64 rows, u64 prompts, then per prompt in increasing key order u64 key,
//! u64 count, f64 mean, f64 m2, and last the xxh3-64 checksum of every byte
//! before it. Equal states give equal bytes.

use rayon::prelude::*;

use super::accumulator::{shard_of, tame, Accumulator, Map, SHARDS};
use super::stats::Stats;
use crate::error::{invalid, Result};

const MAGIC: &[u8; 8] = b"MRTVACC\0";
const VERSION: u32 = 2;
const HEADER: usize = 8 + 4 + 4 + 8 + 8;
const ENTRY: usize = 32;
const CHECKSUM: usize = 8;

fn checksum(b: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(b)
}

impl Accumulator {
    /// Serialise (see the module docs for the layout).
    pub fn to_bytes(&self) -> Vec<u8> {
        let (keys, stats) = self.per_prompt();
        let mut out = Vec::with_capacity(HEADER + ENTRY * keys.len() + CHECKSUM);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&self.rows.to_le_bytes());
        out.extend_from_slice(&(keys.len() as u64).to_le_bytes());
        for (k, s) in keys.iter().zip(&stats) {
            out.extend_from_slice(&k.to_le_bytes());
            out.extend_from_slice(&s.count.to_le_bytes());
            out.extend_from_slice(&s.mean.to_le_bytes());
            out.extend_from_slice(&s.m2.to_le_bytes());
        }
        out.extend_from_slice(&checksum(&out).to_le_bytes());
        out
    }

    /// Inverse of [`Accumulator::to_bytes`]. Refuses, naming what is wrong,
    /// bytes that are not a serialised accumulator of this version, that
    /// are truncated or padded, whose checksum does not match, or whose
    /// entries are not valid statistics in increasing key order summing to
    /// the rows.
    pub fn from_bytes(b: &[u8]) -> Result<Accumulator> {
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        if b.len() < 8 || &b[..8] != MAGIC {
            return invalid("not a serialised variance accumulator (bad magic)");
        }
        if b.len() < HEADER + CHECKSUM {
            return invalid(format!("truncated variance accumulator: {} bytes, less than a header", b.len()));
        }
        let version = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes"));
        if version != VERSION {
            return invalid(format!(
                "unsupported variance accumulator format version {version} (this build reads {VERSION})"
            ));
        }
        let (rows, n) = (u64_at(16), u64_at(24));
        let expect = u128::from(n) * ENTRY as u128 + (HEADER + CHECKSUM) as u128;
        if expect != b.len() as u128 {
            return invalid(format!(
                "truncated or padded variance accumulator: the header says {n} prompts ({expect} bytes), got {} bytes",
                b.len()
            ));
        }
        let end = b.len() - CHECKSUM;
        if checksum(&b[..end]) != u64_at(end) {
            return invalid("corrupt variance accumulator: the checksum does not match the contents");
        }
        let mut parts: Vec<Vec<(u64, Stats)>> = vec![Vec::new(); SHARDS];
        let (mut total, mut last) = (0u64, None);
        for (i, e) in b[HEADER..end].chunks_exact(ENTRY).enumerate() {
            let at = |j: usize| u64::from_le_bytes(e[j..j + 8].try_into().expect("8 bytes"));
            let st = Stats { count: at(8), mean: f64::from_bits(at(16)), m2: f64::from_bits(at(24)) };
            let key = at(0);
            if st.count == 0 || !st.is_finite() || st.m2 < 0.0 {
                return invalid(format!(
                    "corrupt variance accumulator: prompt entry {i} has count {}, mean {}, m2 {}",
                    st.count, st.mean, st.m2
                ));
            }
            if let Some(l) = last.filter(|&l| l >= key) {
                return invalid(format!(
                    "corrupt variance accumulator: prompt entry {i} has key {key}, not above the previous key {l} \
                     (entries are in increasing key order, each key once)"
                ));
            }
            last = Some(key);
            let Some(t) = total.checked_add(st.count) else {
                return invalid(format!("corrupt variance accumulator: the counts overflow at prompt entry {i}"));
            };
            total = t;
            parts[shard_of(key)].push((key, st));
        }
        if total != rows {
            return invalid(format!(
                "corrupt variance accumulator: counts sum to {total}, the header says {rows} rows"
            ));
        }
        let shards: Vec<Map> = parts.into_par_iter().map(|p| p.into_iter().collect()).collect();
        let mut acc = Accumulator { shards, rows, wild: false };
        acc.wild = acc.shards.iter().flat_map(|m| m.values()).any(|s| !tame(s));
        Ok(acc)
    }
}
