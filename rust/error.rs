//! The one error type of the core. Every fallible operation returns `Result<T>`; an `Err`
//! always means nothing was changed. The bindings map each variant to one Python exception
//! class under `gpumm.GpummError` (see `python/gpumm/errors.py`).

use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// No memory could be found for a request that is otherwise valid.
    OutOfMemory(String),
    /// A size that is zero, negative, too large, or not allowed here (not in a size mask).
    InvalidSize(String),
    /// A free that cannot be: double free, free of a split parent, foreign or interior pointer.
    InvalidFree(String),
    /// An operation that the object's current state forbids (unpin of an unpinned chunk...).
    InvalidState(String),
    /// A handle that names no live object: unknown, stale (freed and reused) or foreign.
    InvalidHandle(String),
    /// Any other argument that is out of range or malformed.
    InvalidArgument(String),
}

impl Error {
    /// The name of the Python exception class this variant becomes.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::OutOfMemory(_) => "OutOfMemoryError",
            Error::InvalidSize(_) => "InvalidSizeError",
            Error::InvalidFree(_) => "InvalidFreeError",
            Error::InvalidState(_) => "InvalidStateError",
            Error::InvalidHandle(_) => "InvalidHandleError",
            Error::InvalidArgument(_) => "InvalidArgumentError",
        }
    }

    pub fn message(&self) -> &str {
        match self {
            Error::OutOfMemory(m)
            | Error::InvalidSize(m)
            | Error::InvalidFree(m)
            | Error::InvalidState(m)
            | Error::InvalidHandle(m)
            | Error::InvalidArgument(m) => m,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind(), self.message())
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;
