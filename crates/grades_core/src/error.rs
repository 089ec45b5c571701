//! One error type for every bad input the core can see. Nothing in the core
//! panics on user data: every check returns an [`Error`] with a message that
//! names the argument, the pool and the offending value, and carries the
//! pool, the argument and the row as fields where they are known, so the
//! bindings can hand them on without parsing the message.

/// A bad input detected by the core.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// An argument is out of its domain (k < 1, alpha < 0, unknown kernel...).
    #[error("{0}")]
    Invalid(String),
    /// A value inside one pool is unusable (NaN reward, zero-norm embedding...).
    #[error("pool {pool}: {msg}")]
    Pool {
        /// Index of the pool in the batch.
        pool: usize,
        msg: String,
        /// The argument holding the value ("embeddings", "rewards", "modes").
        arg: Option<&'static str>,
        /// Row of that argument (row of the caller's matrix or array).
        row: Option<usize>,
    },
    /// A value at one row of the caller's rows is unusable (a NaN loss...).
    #[error("{msg}")]
    Row {
        /// The row, counted from the first row the caller's object has seen.
        row: u64,
        msg: String,
    },
    /// A buffer the input needs cannot be allocated.
    #[error("{}cannot allocate {bytes} bytes for {what}", pool.map(|p| format!("pool {p}: ")).unwrap_or_default())]
    Memory { pool: Option<usize>, bytes: usize, what: String },
}

impl Error {
    /// A bad value in pool `pool`, held by argument `arg` at row `row`.
    pub fn at(pool: usize, arg: &'static str, row: usize, msg: impl Into<String>) -> Self {
        Error::Pool { pool, msg: msg.into(), arg: Some(arg), row: Some(row) }
    }

    /// The error, said of pool `p` where it names no pool yet.
    pub fn in_pool(self, p: usize) -> Self {
        match self {
            Error::Memory { pool: None, bytes, what } => Error::Memory { pool: Some(p), bytes, what },
            e => e,
        }
    }

    /// The pool the error is about, if any.
    pub fn pool(&self) -> Option<usize> {
        match self {
            Error::Invalid(_) | Error::Row { .. } => None,
            Error::Pool { pool, .. } => Some(*pool),
            Error::Memory { pool, .. } => *pool,
        }
    }

    /// The argument holding the bad value, if known.
    pub fn arg(&self) -> Option<&'static str> {
        match self {
            Error::Pool { arg, .. } => *arg,
            _ => None,
        }
    }

    /// The row of [`Error::arg`] holding the bad value, if known.
    pub fn row(&self) -> Option<usize> {
        match self {
            Error::Pool { row, .. } => *row,
            Error::Row { row, .. } => usize::try_from(*row).ok(),
            _ => None,
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

pub(crate) fn invalid<T>(msg: impl Into<String>) -> Result<T> {
    Err(Error::Invalid(msg.into()))
}

pub(crate) fn at_row<T>(row: u64, msg: impl Into<String>) -> Result<T> {
    Err(Error::Row { row, msg: msg.into() })
}

/// Plain numbers whose all-zero bytes are the value zero: a vector of them
/// can come zeroed from the allocator ([`try_zeroed`]).
///
/// # Safety
/// Every bit pattern of zeros must be a valid value of the type.
pub unsafe trait Zeroable: Copy {}
// SAFETY: all-zero bytes are 0 (integers) and +0.0 (floats).
unsafe impl Zeroable for f32 {}
unsafe impl Zeroable for f64 {}
unsafe impl Zeroable for u32 {}
unsafe impl Zeroable for u64 {}
unsafe impl Zeroable for usize {}

/// A zeroed vector of `n` values, allocated fallibly: an allocation failure
/// is an [`Error::Memory`] naming `what` (and the pool), never an abort. The
/// memory comes zeroed from the allocator (a large block is fresh pages,
/// zeroed by the system when first written, not written over here).
pub fn try_zeroed<T: Zeroable>(n: usize, pool: Option<usize>, what: &str) -> Result<Vec<T>> {
    let fail = || Error::Memory { pool, bytes: n.saturating_mul(std::mem::size_of::<T>()), what: what.to_string() };
    let layout = std::alloc::Layout::array::<T>(n).map_err(|_| fail())?;
    if layout.size() == 0 {
        return Ok(vec![]);
    }
    // SAFETY: the layout has a non-zero size; a non-null pointer from
    // `alloc_zeroed` holds `n` zeroed values of T, valid (`Zeroable`), with
    // the global allocator's layout for a Vec of capacity n.
    unsafe {
        let p = std::alloc::alloc_zeroed(layout) as *mut T;
        if p.is_null() {
            return Err(fail());
        }
        Ok(Vec::from_raw_parts(p, n, n))
    }
}
