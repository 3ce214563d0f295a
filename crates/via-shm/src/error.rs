//! The error type of the shared-memory transport.

use std::io;

/// Errors of the shared-memory transport.
#[derive(Debug, thiserror::Error)]
pub enum ShmError {
    /// The ring or receive-queue cache has no free entry.
    #[error("shared queue full")]
    Full,
    /// A value read from shared memory is impossible: the peer is broken or lying.
    #[error("corrupt shared memory: {0}")]
    Corrupt(&'static str),
    /// More data segments than [`MAX_SEGS`](crate::MAX_SEGS).
    #[error("too many data segments")]
    TooManySegments,
    /// A region is smaller than its layout, or a payload does not fit a slot.
    #[error("shared region or slot too small")]
    TooSmall,
    /// A system call failed.
    #[error(transparent)]
    Io(#[from] io::Error),
}
