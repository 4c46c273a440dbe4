//! One error type for the engine; `lib.rs` turns each kind into the matching Python exception.
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file or folder that is not there (Python: `FileNotFoundError`).
    #[error("{path}: {what}")]
    NotFound { path: String, what: String },
    /// Input that is there but wrong: a garbled file, a bad shape, an argument out of range (`ValueError`).
    #[error("{0}")]
    Invalid(String),
    /// A valid checkpoint this engine does not implement, e.g. 8-bit weights (`NotImplementedError`).
    #[error("{0}")]
    Unsupported(String),
    /// The system gave no memory for the weights (`MemoryError`).
    #[error("{0}")]
    OutOfMemory(String),
    /// libtorch refused an operation (`RuntimeError`).
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
    /// A Python exception raised while the engine ran, e.g. `KeyboardInterrupt` from a Ctrl-C; passed on as is.
    #[error("{0}")]
    Python(pyo3::PyErr),
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn not_found(path: &Path, what: impl Into<String>) -> Self {
        Error::NotFound { path: path.display().to_string(), what: what.into() }
    }

    /// A file that could not be read: not there (`FileNotFoundError`), or there and unreadable — a folder, no
    /// permission (`ValueError`).
    pub fn reading(path: &Path, e: std::io::Error) -> Self {
        match e.kind() {
            std::io::ErrorKind::NotFound => Error::not_found(path, e.to_string()),
            _ => Error::Invalid(format!("{}: {e}", path.display())),
        }
    }
}

/// `Error::Invalid` from a format string.
macro_rules! invalid {
    ($($arg:tt)*) => { $crate::error::Error::Invalid(format!($($arg)*)) };
}
pub(crate) use invalid;
