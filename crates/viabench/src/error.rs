//! The one error type of viabench.

use std::fmt;

/// What went wrong, as a message for the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error(pub String);

/// viabench's result type.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An error with `message`.
    pub fn new(message: impl Into<String>) -> Error {
        Error(message.into())
    }
    /// The same error with `what` in front.
    pub fn context(self, what: impl fmt::Display) -> Error {
        Error(format!("{what}: {}", self.0))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Error {
        Error(e.to_string())
    }
}

impl From<crate::vipl_api::VipError> for Error {
    fn from(e: crate::vipl_api::VipError) -> Error {
        Error(e.to_string())
    }
}

impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Error {
        Error(format!("control message: {e}"))
    }
}

/// Returns early with an [`Error`] built from a format string.
#[macro_export]
macro_rules! bail {
    ($($arg:tt)*) => {
        return Err($crate::error::Error(format!($($arg)*)))
    };
}
