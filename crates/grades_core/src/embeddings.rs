//! The caller's embedding matrix, read where it lies: float32 or float16
//! values, in one block or in several (an Arrow column read from several
//! files comes in chunks).
//!
//! Rows are numbered across the blocks in order; a row never spans two
//! blocks. Float16 rows are widened to f32 only as a pool's rows are
//! gathered (with the CPU's conversion instructions where it has them), so
//! the matrix is never copied or widened as a whole.

use half::f16;
use half::slice::HalfFloatSliceExt;

use crate::error::{invalid, Result};

/// Row-major blocks of one element type, `dim` values a row.
#[derive(Debug, Clone)]
pub struct Blocks<'a, T> {
    blocks: Vec<&'a [T]>,
    /// first row of each block, then the number of rows
    starts: Vec<usize>,
    dim: usize,
}

impl<'a, T> Blocks<'a, T> {
    fn new(blocks: Vec<&'a [T]>, dim: usize) -> Result<Self> {
        if dim == 0 {
            return invalid("embedding dimension must be >= 1");
        }
        let mut starts = Vec::with_capacity(blocks.len() + 1);
        let mut n = 0usize;
        for (i, b) in blocks.iter().enumerate() {
            if !b.len().is_multiple_of(dim) {
                return invalid(format!(
                    "embedding block {i} holds {} values, not a whole number of rows of {dim}",
                    b.len()
                ));
            }
            starts.push(n);
            n += b.len() / dim;
        }
        starts.push(n);
        // blocks without rows are dropped: a row's block is then the last one
        // starting at or before it
        let keep: Vec<bool> = blocks.iter().map(|b| !b.is_empty()).collect();
        let blocks: Vec<&[T]> = blocks.into_iter().zip(&keep).filter(|(_, &k)| k).map(|(b, _)| b).collect();
        let mut s: Vec<usize> =
            starts[..starts.len() - 1].iter().zip(&keep).filter(|(_, &k)| k).map(|(&s, _)| s).collect();
        s.push(n);
        Ok(Self { blocks, starts: s, dim })
    }

    fn n_rows(&self) -> usize {
        *self.starts.last().unwrap()
    }

    /// Row `row` as it is stored.
    #[inline]
    fn row(&self, row: usize) -> &'a [T] {
        let b = if self.blocks.len() == 1 { 0 } else { self.starts.partition_point(|&s| s <= row) - 1 };
        let at = (row - self.starts[b]) * self.dim;
        &self.blocks[b][at..at + self.dim]
    }

    /// Rows `first..first + n` as stored, when they lie in one block.
    fn span(&self, first: usize, n: usize) -> Option<&'a [T]> {
        if n == 0 || first + n > self.n_rows() {
            return None;
        }
        let b = self.starts.partition_point(|&s| s <= first) - 1;
        let end = self.starts[b + 1];
        (first + n <= end)
            .then(|| &self.blocks[b][(first - self.starts[b]) * self.dim..(first + n - self.starts[b]) * self.dim])
    }
}

/// An `n_rows x dim` embedding matrix in float32 or float16 blocks.
#[derive(Debug, Clone)]
pub enum Embeddings<'a> {
    F32(Blocks<'a, f32>),
    F16(Blocks<'a, f16>),
}

impl<'a> Embeddings<'a> {
    /// One row-major float32 block.
    pub fn f32(data: &'a [f32], dim: usize) -> Result<Self> {
        Self::f32_blocks(vec![data], dim)
    }

    /// Row-major float32 blocks, their rows numbered in order.
    pub fn f32_blocks(blocks: Vec<&'a [f32]>, dim: usize) -> Result<Self> {
        Ok(Self::F32(Blocks::new(blocks, dim)?))
    }

    /// Row-major float16 blocks, their rows numbered in order.
    pub fn f16_blocks(blocks: Vec<&'a [f16]>, dim: usize) -> Result<Self> {
        Ok(Self::F16(Blocks::new(blocks, dim)?))
    }

    pub fn dim(&self) -> usize {
        match self {
            Self::F32(b) => b.dim,
            Self::F16(b) => b.dim,
        }
    }

    pub fn n_rows(&self) -> usize {
        match self {
            Self::F32(b) => b.n_rows(),
            Self::F16(b) => b.n_rows(),
        }
    }

    /// Append row `row`, as f32, to `out`.
    #[inline]
    pub fn extend_row(&self, row: usize, out: &mut Vec<f32>) {
        match self {
            Self::F32(b) => out.extend_from_slice(b.row(row)),
            Self::F16(b) => {
                let at = out.len();
                out.resize(at + b.dim, 0.0);
                b.row(row).convert_to_f32_slice(&mut out[at..]);
            }
        }
    }

    /// Rows `first..first + n` read in place: float32 rows lying in one block.
    pub fn f32_span(&self, first: usize, n: usize) -> Option<&'a [f32]> {
        match self {
            Self::F32(b) => b.span(first, n),
            Self::F16(_) => None,
        }
    }

    /// Rows `first..first + n` as stored (for a prefetch hint), when they lie in one block.
    pub fn bytes_of(&self, first: usize, n: usize) -> &'a [u8] {
        fn bytes<T>(s: Option<&[T]>) -> &[u8] {
            // SAFETY: any initialised f32 / f16 slice is a valid byte slice of its size
            s.map_or(&[], |s| unsafe { std::slice::from_raw_parts(s.as_ptr() as *const u8, std::mem::size_of_val(s)) })
        }
        match self {
            Self::F32(b) => bytes(b.span(first, n)),
            Self::F16(b) => bytes(b.span(first, n)),
        }
    }

    /// Ask the CPU to bring row `row` into its caches (a hint: it never
    /// faults and changes nothing), so that a gather that follows does not
    /// wait on memory row after row.
    #[inline]
    pub fn prefetch_row(&self, row: usize) {
        match self {
            Self::F32(b) => prefetch(b.row(row)),
            Self::F16(b) => prefetch(b.row(row)),
        }
    }

    /// The content key of row `row` ([`crate::keys::content_key`] of its f32 values).
    pub fn content_key(&self, row: usize, reward: Option<f64>, text: Option<u64>) -> u64 {
        match self {
            Self::F32(b) => crate::keys::content_key_of(b.row(row).iter().copied(), reward, text),
            Self::F16(b) => crate::keys::content_key_of(b.row(row).iter().map(|v| v.to_f32()), reward, text),
        }
    }

    /// Whether rows `a` and `b` are equal value for value (as f32: 0 and -0
    /// are equal, NaN equals nothing).
    pub fn same_rows(&self, a: usize, b: usize) -> bool {
        match self {
            Self::F32(m) => m.row(a).iter().zip(m.row(b)).all(|(p, q)| p == q),
            Self::F16(m) => m.row(a).iter().zip(m.row(b)).all(|(p, q)| p == q),
        }
    }
}

/// Prefetch the cache lines of `s` (a hint).
#[inline]
pub fn prefetch<T>(s: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let p = s.as_ptr() as *const i8;
        let mut at = 0;
        while at < std::mem::size_of_val(s) {
            // SAFETY: a prefetch never faults; the address lies inside `s`
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.add(at)) };
            at += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = s;
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn halves(v: &[f32]) -> Vec<f16> {
        v.iter().map(|&x| f16::from_f32(x)).collect()
    }

    proptest! {
        /// Cut into blocks anywhere between rows, in float32 or float16, every row
        /// reads as the same f32 values as from the one widened matrix, and keys
        /// and equality agree with it.
        #[test]
        fn blocks_read_as_one_matrix(
            n in 1usize..40, d in 1usize..6, cuts in proptest::collection::vec(0usize..40, 0..5),
            seed in any::<u64>(),
        ) {
            let mut s = seed | 1;
            let vals: Vec<f32> = (0..n * d).map(|_| {
                s ^= s << 13; s ^= s >> 7; s ^= s << 17;
                ((s % 7) as f32 - 3.0) * 0.5
            }).collect();
            let h = halves(&vals);
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (n + 1)).collect();
            cuts.push(0);
            cuts.push(n);
            cuts.sort();
            let f32_blocks: Vec<&[f32]> = cuts.windows(2).map(|w| &vals[w[0] * d..w[1] * d]).collect();
            let f16_blocks: Vec<&[f16]> = cuts.windows(2).map(|w| &h[w[0] * d..w[1] * d]).collect();
            let one = Embeddings::f32(&vals, d).unwrap();
            for m in [Embeddings::f32_blocks(f32_blocks, d).unwrap(), Embeddings::f16_blocks(f16_blocks, d).unwrap()] {
                prop_assert_eq!(m.n_rows(), n);
                for r in 0..n {
                    let (mut a, mut b) = (Vec::new(), Vec::new());
                    m.extend_row(r, &mut a);
                    one.extend_row(r, &mut b);
                    prop_assert_eq!(&a, &b);
                    prop_assert_eq!(m.content_key(r, Some(1.0), None), one.content_key(r, Some(1.0), None));
                    for q in 0..n {
                        prop_assert_eq!(m.same_rows(r, q), one.same_rows(r, q));
                    }
                }
            }
        }
    }

    #[test]
    fn spans_stay_in_one_block() {
        let v: Vec<f32> = (0..12).map(|i| i as f32).collect();
        let m = Embeddings::f32_blocks(vec![&v[..4], &[], &v[4..]], 2).unwrap();
        assert_eq!(m.f32_span(0, 2), Some(&v[..4]));
        assert_eq!(m.f32_span(2, 3), Some(&v[4..10]));
        assert_eq!(m.f32_span(1, 2), None);
        assert_eq!(m.f32_span(5, 2), None);
        assert_eq!(m.bytes_of(1, 2).len(), 0);
        assert_eq!(m.bytes_of(2, 2).len(), 16);
    }

    #[test]
    fn zero_and_minus_zero_are_the_same_row() {
        let h = [f16::from_f32(0.0), f16::from_f32(-0.0)];
        let m = Embeddings::f16_blocks(vec![&h], 1).unwrap();
        assert!(m.same_rows(0, 1));
        assert_eq!(m.content_key(0, None, None), m.content_key(1, None, None));
    }

    #[test]
    fn a_block_of_part_of_a_row_is_refused() {
        let v = [1.0f32; 5];
        assert!(Embeddings::f32_blocks(vec![&v[..4], &v[4..]], 2).is_err());
        assert!(Embeddings::f32(&v, 0).is_err());
    }
}
