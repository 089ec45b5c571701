//! A ragged batch of pools: one prompt's candidates form a pool; many pools are
//! passed at once as one embedding matrix plus offsets.
//!
//! Pool `p` holds the positions `offsets[p]..offsets[p+1]`. A position maps to a
//! row of the matrix either directly or through `rows` (a permutation or any
//! gather list), so a table whose groups are not contiguous is never copied.

use crate::embeddings::Embeddings;
use crate::error::{invalid, Result};

/// Offsets (and an optional row gather list) describing many pools.
#[derive(Debug, Clone, Copy)]
pub struct Layout<'a> {
    offsets: &'a [u64],
    rows: Option<&'a [u64]>,
    n_rows: usize,
}

impl<'a> Layout<'a> {
    /// `offsets` must start at 0, never decrease and end at the number of
    /// positions (`rows.len()` if given, else `n_rows`). Every `rows` entry
    /// must be `< n_rows`.
    pub fn new(offsets: &'a [u64], rows: Option<&'a [u64]>, n_rows: usize) -> Result<Self> {
        if offsets.is_empty() {
            return invalid("offsets must hold at least one entry (0)");
        }
        if offsets[0] != 0 {
            return invalid(format!("offsets must start at 0, got {}", offsets[0]));
        }
        for (p, w) in offsets.windows(2).enumerate() {
            if w[1] < w[0] {
                return invalid(format!(
                    "offsets must not decrease: offsets[{}] = {} > offsets[{}] = {}",
                    p,
                    w[0],
                    p + 1,
                    w[1]
                ));
            }
        }
        let total = *offsets.last().unwrap() as usize;
        match rows {
            Some(r) => {
                if total != r.len() {
                    return invalid(format!("offsets end at {} but the row list has {} entries", total, r.len()));
                }
                if let Some((i, &bad)) = r.iter().enumerate().find(|(_, &x)| x as usize >= n_rows) {
                    return invalid(format!("rows[{}] = {} is out of range for {} rows", i, bad, n_rows));
                }
            }
            None => {
                if total != n_rows {
                    return invalid(format!("offsets end at {} but there are {} rows", total, n_rows));
                }
            }
        }
        Ok(Self { offsets, rows, n_rows })
    }

    /// A single pool over all `n_rows` rows.
    pub fn single(offsets: &'a [u64; 2]) -> Self {
        Self { offsets, rows: None, n_rows: offsets[1] as usize }
    }

    pub fn n_pools(&self) -> usize {
        self.offsets.len() - 1
    }

    pub fn n_rows(&self) -> usize {
        self.n_rows
    }

    /// Total number of positions (candidates) over all pools.
    pub fn n_positions(&self) -> usize {
        *self.offsets.last().unwrap() as usize
    }

    /// First position of pool `p`.
    #[inline]
    pub fn start(&self, p: usize) -> usize {
        self.offsets[p] as usize
    }

    /// Number of candidates in pool `p`.
    #[inline]
    pub fn len(&self, p: usize) -> usize {
        (self.offsets[p + 1] - self.offsets[p]) as usize
    }

    /// Row of the matrix holding candidate `i` of pool `p`.
    #[inline]
    pub fn row(&self, p: usize, i: usize) -> usize {
        let pos = self.offsets[p] as usize + i;
        match self.rows {
            Some(r) => r[pos] as usize,
            None => pos,
        }
    }
}

/// A ragged batch of pools over an `n_rows x dim` embedding matrix (float32
/// or float16, in one block or several: see [`Embeddings`]).
#[derive(Debug, Clone)]
pub struct Pools<'a> {
    pub data: Embeddings<'a>,
    pub dim: usize,
    pub layout: Layout<'a>,
}

impl<'a> Pools<'a> {
    /// Pools over one row-major f32 matrix of `dim` columns.
    pub fn new(data: &'a [f32], dim: usize, offsets: &'a [u64], rows: Option<&'a [u64]>) -> Result<Self> {
        if dim == 0 {
            return invalid("embedding dimension must be >= 1");
        }
        if !data.len().is_multiple_of(dim) {
            return invalid(format!("embedding buffer of {} floats is not a multiple of dim = {}", data.len(), dim));
        }
        Self::over(Embeddings::f32(data, dim)?, offsets, rows)
    }

    /// Pools over any [`Embeddings`].
    pub fn over(data: Embeddings<'a>, offsets: &'a [u64], rows: Option<&'a [u64]>) -> Result<Self> {
        let layout = Layout::new(offsets, rows, data.n_rows())?;
        Ok(Self { dim: data.dim(), data, layout })
    }

    /// Append row `row` of the matrix, as f32, to `out`.
    #[inline]
    pub fn extend_row(&self, row: usize, out: &mut Vec<f32>) {
        self.data.extend_row(row, out)
    }
}
