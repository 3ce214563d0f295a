//! The shared-memory transport between processes of one host: the
//! connection a VI drives (`conn`), over the rings, caches, lanes and bells
//! of `via-shm`; the VI's side of it (`path`); RDMA reads through the
//! ring where cross-memory attach is refused (`ring_read`, the protocol,
//! and `read_path`, the VI's side); making a connection once the host
//! agent has introduced the two processes (`setup`).

pub mod conn;
mod path;
mod read_path;
pub(crate) mod ring_read;
pub(crate) mod setup;

pub use conn::Conn;
