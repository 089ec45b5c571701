//! One error type for every bad input the core can see. Nothing in the core
//! panics on user data: every check returns an [`Error`] with a message that
//! names the argument, the pool and the offending value.

/// A bad input detected by the core.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// An argument is out of its domain (k < 1, alpha < 0, unknown kernel...).
    #[error("{0}")]
    Invalid(String),
    /// A value inside one pool is unusable (NaN reward, zero-norm embedding...).
    #[error("pool {pool}: {msg}")]
    Pool { pool: usize, msg: String },
}

pub type Result<T> = std::result::Result<T, Error>;

pub(crate) fn invalid<T>(msg: impl Into<String>) -> Result<T> {
    Err(Error::Invalid(msg.into()))
}
