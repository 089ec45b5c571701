//! Static (model2vec-style) sentence embeddings: each text's token vectors
//! summed, normalised, optionally re-centred and normalised again.
//!
//! This is the whole of a static model's inference once the text is
//! tokenised. Summing straight into the output row, texts in parallel, never
//! builds the (tokens x dim) matrix of gathered rows that `vectors[ids]`
//! followed by a segmented sum would.

use rayon::prelude::*;

use crate::error::Error;

/// Texts per parallel task.
const TEXTS_PER_TASK: usize = 256;

/// Embeddings of texts from a (vocabulary x `dim`) table of token `vectors`.
///
/// Text `t` holds the token ids `ids[starts[t]..starts[t + 1]]` (the last text
/// runs to the end of `ids`). Its row of `out` (texts x `dim`) is the sum of
/// its tokens' vectors (summed in token order, in f32), scaled to unit norm;
/// with a `center`, the centre is then subtracted and the row scaled to unit
/// norm again. A row of norm 0 (no tokens, or tokens of zero vectors) is left
/// as it is at that step. Errors name the first bad id or offset.
pub fn static_embed(
    vectors: &[f32],
    dim: usize,
    ids: &[i64],
    starts: &[i64],
    center: Option<&[f32]>,
    out: &mut [f32],
) -> crate::Result<()> {
    if dim == 0 || !vectors.len().is_multiple_of(dim) {
        return Err(Error::Invalid(format!("token vectors: {} values do not make rows of {dim}", vectors.len())));
    }
    let vocab = vectors.len() / dim;
    let n = starts.len();
    if out.len() != n * dim {
        return Err(Error::Invalid(format!("output: {} places for {n} texts of {dim} values", out.len())));
    }
    if let Some(c) = center {
        if c.len() != dim {
            return Err(Error::Invalid(format!("center: {} values, the vectors have {dim}", c.len())));
        }
    }
    let end = |t: usize| if t + 1 < n { starts[t + 1] } else { ids.len() as i64 };
    for (t, &a) in starts.iter().enumerate() {
        let b = end(t);
        if a < 0 || a > b || b > ids.len() as i64 {
            return Err(Error::Invalid(format!(
                "token offsets: text {t} runs from {a} to {b}, outside 0..{} or backwards",
                ids.len()
            )));
        }
    }
    if let Some((i, &id)) = ids.iter().enumerate().find(|&(_, &id)| id < 0 || id as u64 >= vocab as u64) {
        return Err(Error::Invalid(format!("token id {id} at position {i} is outside the vocabulary of {vocab}")));
    }
    out.par_chunks_mut(TEXTS_PER_TASK * dim).enumerate().for_each(|(ci, block)| {
        for (r, row) in block.chunks_exact_mut(dim).enumerate() {
            let t = ci * TEXTS_PER_TASK + r;
            row.fill(0.0);
            for &id in &ids[starts[t] as usize..end(t) as usize] {
                let v = &vectors[id as usize * dim..(id as usize + 1) * dim];
                for (o, &x) in row.iter_mut().zip(v) {
                    *o += x;
                }
            }
            unit(row);
            if let Some(c) = center {
                for (o, &x) in row.iter_mut().zip(c) {
                    *o -= x;
                }
                unit(row);
            }
        }
    });
    Ok(())
}

/// Scale `row` to unit norm (its norm taken in f64); a zero row stays zero.
fn unit(row: &mut [f32]) {
    let norm = row.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    if norm > 0.0 {
        let inv = (1.0 / norm) as f32;
        for x in row.iter_mut() {
            *x *= inv;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The definition, one text at a time, in f64.
    fn reference(vectors: &[f32], dim: usize, ids: &[i64], starts: &[i64], center: Option<&[f32]>) -> Vec<f64> {
        let mut out = Vec::new();
        for t in 0..starts.len() {
            let b = if t + 1 < starts.len() { starts[t + 1] } else { ids.len() as i64 };
            let mut v = vec![0f64; dim];
            for &id in &ids[starts[t] as usize..b as usize] {
                for (o, &x) in v.iter_mut().zip(&vectors[id as usize * dim..(id as usize + 1) * dim]) {
                    *o += x as f64;
                }
            }
            let scale = |v: &mut Vec<f64>| {
                let n = v.iter().map(|x| x * x).sum::<f64>().sqrt();
                if n > 0.0 {
                    v.iter_mut().for_each(|x| *x /= n);
                }
            };
            scale(&mut v);
            if let Some(c) = center {
                v.iter_mut().zip(c).for_each(|(x, &m)| *x -= m as f64);
                scale(&mut v);
            }
            out.extend(v);
        }
        out
    }

    proptest! {
        /// Every row is the normalised (and re-centred) sum of its tokens'
        /// vectors, to f32 rounding, whatever the texts' lengths.
        #[test]
        fn rows_are_normalised_sums(
            dim in 1usize..9,
            vocab in 1usize..20,
            lens in proptest::collection::vec(0usize..12, 0..600),
            seed in any::<u64>(),
            centred in any::<bool>(),
        ) {
            let mut s = seed | 1;
            let mut next = move || { s ^= s << 13; s ^= s >> 7; s ^= s << 17; s };
            let vectors: Vec<f32> = (0..vocab * dim).map(|_| (next() % 2001) as f32 / 1000.0 - 1.0).collect();
            let center: Vec<f32> = (0..dim).map(|_| (next() % 201) as f32 / 1000.0 - 0.1).collect();
            let mut starts = Vec::new();
            let mut ids = Vec::new();
            for &l in &lens {
                starts.push(ids.len() as i64);
                ids.extend((0..l).map(|_| (next() % vocab as u64) as i64));
            }
            let c = centred.then_some(center.as_slice());
            let mut out = vec![f32::NAN; lens.len() * dim];
            static_embed(&vectors, dim, &ids, &starts, c, &mut out).unwrap();
            let want = reference(&vectors, dim, &ids, &starts, c);
            for (i, (&y, &x)) in out.iter().zip(&want).enumerate() {
                // f32 sums of up to 12 terms of size <= 1, then scaled by the norm
                prop_assert!((y as f64 - x).abs() <= 1e-4, "value {i}: {y} vs {x}");
            }
        }
    }

    #[test]
    fn bad_ids_and_offsets_are_errors() {
        let v = vec![1.0f32; 6]; // 3 tokens of 2
        let mut out = vec![0f32; 2];
        assert!(static_embed(&v, 2, &[3], &[0], None, &mut out).unwrap_err().to_string().contains("token id 3"));
        assert!(static_embed(&v, 2, &[-1], &[0], None, &mut out).is_err());
        assert!(static_embed(&v, 2, &[0], &[2], None, &mut out).unwrap_err().to_string().contains("text 0"));
        assert!(static_embed(&v, 4, &[0], &[0], None, &mut [0f32; 4]).is_err()); // 6 values, rows of 4
        assert!(static_embed(&v, 2, &[0], &[0], Some(&[0.0]), &mut out).is_err());
        let mut two = vec![0f32; 4];
        assert!(static_embed(&v, 2, &[0, 1], &[1, 0], None, &mut two).is_err());
        // backwards
    }

    #[test]
    fn a_text_without_tokens_is_zero() {
        let v = vec![3.0f32, 4.0];
        let mut out = vec![9f32; 4];
        static_embed(&v, 2, &[0], &[0, 1], None, &mut out).unwrap();
        assert_eq!(out, vec![0.6, 0.8, 0.0, 0.0]);
    }
}
