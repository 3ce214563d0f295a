//! The shared-memory transport between processes of one host: the
//! connection a VI drives (`conn`), over the rings, caches, lanes and bells
//! of `via-shm`.

pub mod conn;

pub use conn::Conn;
