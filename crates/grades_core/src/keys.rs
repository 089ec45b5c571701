//! Stable 64-bit keys of prompt ids. Every per-prompt operation (the random
//! draw of a pool, the variance accumulators) finds a prompt by its key, so a
//! key depends only on the id's value: never on the other ids of a batch,
//! their dtype, the row order or the number of threads.
//!
//! * an integer id `v` that fits an int64: xxh3 of its 8 little-endian bytes;
//! * an integer above the int64 range (a uint64 >= 2^63): xxh3 of its decimal
//!   text, as the text id of the same digits;
//! * any other id: xxh3 of its UTF-8 text.

use rayon::prelude::*;

use crate::embeddings::Embeddings;
use crate::error::{invalid, Result};

/// Content key of one candidate: xxh3 of its embedding's bits (-0.0 as
/// 0.0), then its reward's and its text key's, where given. Rows with the
/// same content have the same key wherever they sit.
pub fn content_key(row: &[f32], reward: Option<f64>, text: Option<u64>) -> u64 {
    content_key_of(row.iter().copied(), reward, text)
}

/// [`content_key`] of a row given as its values in order.
#[inline]
pub fn content_key_of(row: impl Iterator<Item = f32>, reward: Option<f64>, text: Option<u64>) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for v in row {
        h.update(&(v + 0.0).to_bits().to_le_bytes());
    }
    if let Some(r) = reward {
        h.update(&(r + 0.0).to_bits().to_le_bytes());
    }
    if let Some(t) = text {
        h.update(&t.to_le_bytes());
    }
    h.digest()
}

/// Refuses a per-row argument (`(name, length)`, absent: `None`) whose length
/// is not the `n` rows of the embeddings.
pub fn per_row_lengths(n: usize, args: &[(&str, Option<usize>)]) -> Result<()> {
    for &(name, len) in args {
        if let Some(len) = len {
            if len != n {
                return invalid(format!("{name} have {len} entries but embeddings have {n} rows"));
            }
        }
    }
    Ok(())
}

/// [`content_key`] of every row of `x` (`d` columns), in parallel.
pub fn content_keys(x: &[f32], d: usize, rewards: Option<&[f64]>, text: Option<&[u64]>) -> Result<Vec<u64>> {
    let n = x.len().checked_div(d).unwrap_or(0);
    if d == 0 || x.len() != n * d {
        return invalid(format!("embeddings have {} floats, not a whole number of rows of {d}", x.len()));
    }
    per_row_lengths(n, &[("rewards", rewards.map(<[f64]>::len)), ("text keys", text.map(<[u64]>::len))])?;
    Ok((0..n)
        .into_par_iter()
        .map(|i| content_key(&x[i * d..(i + 1) * d], rewards.map(|r| r[i]), text.map(|t| t[i])))
        .collect())
}

/// [`content_key`] of every row of `x` (float32 or float16, in blocks: a
/// float16 row is widened to the same f32 values first), in parallel.
pub fn embedding_content_keys(x: &Embeddings<'_>, rewards: Option<&[f64]>, text: Option<&[u64]>) -> Result<Vec<u64>> {
    let n = x.n_rows();
    per_row_lengths(n, &[("rewards", rewards.map(<[f64]>::len)), ("text keys", text.map(<[u64]>::len))])?;
    Ok((0..n)
        .into_par_iter()
        .map_init(Vec::new, |row, i| {
            row.clear();
            x.extend_row(i, row);
            content_key(row, rewards.map(|r| r[i]), text.map(|t| t[i]))
        })
        .collect())
}

/// Stable 64-bit key of a prompt id given as bytes (xxh3).
pub fn key_of_bytes(b: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(b)
}

/// Stable 64-bit key of an integer prompt id.
pub fn key_of_int(v: i64) -> u64 {
    key_of_bytes(&v.to_le_bytes())
}

/// Rows per parallel piece of the key functions below.
const KEY_PIECE: usize = 1 << 16;

/// [`key_of_int`] of every id, in parallel. A run of equal ids (the usual
/// layout: a prompt's responses together) is hashed once.
pub fn keys_of_ints(ids: &[i64]) -> Vec<u64> {
    let mut out = vec![0u64; ids.len()];
    out.par_chunks_mut(KEY_PIECE).zip(ids.par_chunks(KEY_PIECE)).for_each(|(o, v)| {
        let mut last: Option<(i64, u64)> = None;
        for (o, &x) in o.iter_mut().zip(v) {
            *o = match last {
                Some((p, k)) if p == x => k,
                _ => {
                    let k = key_of_int(x);
                    last = Some((x, k));
                    k
                }
            };
        }
    });
    out
}

/// [`key_of_bytes`] of every string `data[offsets[i]..offsets[i + 1]]`, in
/// parallel; the first bad pair of offsets is an error.
pub fn keys_of_strings(offsets: &[i64], data: &[u8]) -> Result<Vec<u64>> {
    let n = offsets.len().saturating_sub(1);
    let mut out = vec![0u64; n];
    let bad = out
        .par_chunks_mut(KEY_PIECE)
        .enumerate()
        .filter_map(|(c, o)| {
            let base = c * KEY_PIECE;
            for (i, o) in o.iter_mut().enumerate() {
                let (s, e) = (offsets[base + i], offsets[base + i + 1]);
                if s < 0 || e < s || e as usize > data.len() {
                    return Some((base + i, s, e));
                }
                *o = key_of_bytes(&data[s as usize..e as usize]);
            }
            None
        })
        .min();
    match bad {
        Some((_, s, e)) => invalid(format!("bad string offsets {s}..{e}")),
        None => Ok(out),
    }
}

/// Stable 64-bit key of an unsigned integer prompt id: [`key_of_int`] of the
/// value where it fits an int64, else [`key_of_bytes`] of its decimal text.
pub fn key_of_uint(v: u64) -> u64 {
    match i64::try_from(v) {
        Ok(i) => key_of_int(i),
        Err(_) => key_of_bytes(v.to_string().as_bytes()),
    }
}

/// [`key_of_uint`] of every id, in parallel; a run of equal ids is hashed once.
pub fn keys_of_uints(ids: &[u64]) -> Vec<u64> {
    let mut out = vec![0u64; ids.len()];
    out.par_chunks_mut(KEY_PIECE).zip(ids.par_chunks(KEY_PIECE)).for_each(|(o, v)| {
        let mut last: Option<(u64, u64)> = None;
        for (o, &x) in o.iter_mut().zip(v) {
            *o = match last {
                Some((p, k)) if p == x => k,
                _ => {
                    let k = key_of_uint(x);
                    last = Some((x, k));
                    k
                }
            };
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn float16_blocks_hash_as_their_float32_values(
            vals in proptest::collection::vec(-4i32..4, 1..120),
            d in 1usize..5,
            cut in 0usize..40,
        ) {
            // signed zeros and repeats; float16 rows in two blocks
            let n = vals.len() / d;
            prop_assume!(n > 0);
            let h: Vec<half::f16> = vals[..n * d].iter().map(|&v| half::f16::from_f32(if v == 0 { -0.0 } else { v as f32 * 0.5 })).collect();
            let f: Vec<f32> = h.iter().map(|v| v.to_f32()).collect();
            let r: Vec<f64> = (0..n).map(|i| (i % 3) as f64).collect();
            let c = cut.min(n) * d;
            let x = Embeddings::f16_blocks(vec![&h[..c], &h[c..]], d).unwrap();
            prop_assert_eq!(embedding_content_keys(&x, Some(&r), None).unwrap(), content_keys(&f, d, Some(&r), None).unwrap());
            prop_assert!(embedding_content_keys(&x, Some(&r[1..]), None).is_err());
        }

        #[test]
        fn batched_keys_equal_one_at_a_time(
            runs in prop::collection::vec((any::<i64>(), 1usize..40), 0..300),
            len in prop::sample::select(vec![0usize, 10, KEY_PIECE + 100, 2 * KEY_PIECE + 3]),
        ) {
            // runs of equal ids, repeated to `len` rows (across pieces)
            let one: Vec<i64> = runs.iter().flat_map(|&(v, n)| std::iter::repeat_n(v, n)).collect();
            let ids: Vec<i64> = one.iter().cycle().take(if one.is_empty() { 0 } else { len }).copied().collect();
            let want: Vec<u64> = ids.iter().map(|&x| key_of_int(x)).collect();
            prop_assert_eq!(keys_of_ints(&ids), want);
            // the same ids as text
            let text: Vec<String> = ids.iter().map(|x| x.to_string()).collect();
            let mut offsets = vec![0i64];
            let mut data = Vec::new();
            for t in &text {
                data.extend_from_slice(t.as_bytes());
                offsets.push(data.len() as i64);
            }
            let want: Vec<u64> = text.iter().map(|t| key_of_bytes(t.as_bytes())).collect();
            prop_assert_eq!(keys_of_strings(&offsets, &data).unwrap(), want);
        }
    }

    proptest! {
        #[test]
        fn a_uint_key_depends_only_on_the_value(ids in prop::collection::vec(any::<u64>(), 0..200), big in any::<bool>()) {
            // one id above the int64 range in the batch changes no other key
            let mut with = ids.clone();
            if big {
                with.push(u64::MAX - 3);
            }
            let keys = keys_of_uints(&with);
            for (i, &v) in ids.iter().enumerate() {
                prop_assert_eq!(keys[i], key_of_uint(v));
                if v <= i64::MAX as u64 {
                    prop_assert_eq!(keys[i], key_of_int(v as i64));
                } else {
                    prop_assert_eq!(keys[i], key_of_bytes(v.to_string().as_bytes()));
                }
            }
        }
    }

    #[test]
    fn the_first_bad_offsets_are_named() {
        let n = 3 * KEY_PIECE;
        let mut offsets: Vec<i64> = (0..=n as i64).collect();
        let data = vec![b'x'; n];
        offsets[2 * KEY_PIECE + 5] = -1; // in the third piece
        offsets[KEY_PIECE + 7] = n as i64 + 9; // in the second: reported
        let e = keys_of_strings(&offsets, &data).unwrap_err().to_string();
        assert_eq!(e, format!("bad string offsets {}..{}", KEY_PIECE + 6, n + 9));
        assert!(keys_of_strings(&[], &[]).unwrap().is_empty());
    }
}
