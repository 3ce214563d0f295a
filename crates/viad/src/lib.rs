//! openvia host agent (the VI kernel agent of VIA 1.0).
//!
//! One `viad` runs per host (per network namespace) on an abstract Unix
//! socket.  It resolves device names, counts sessions, and pairs connection
//! requests by discriminator, handing both sides the same connection segment,
//! socket pair and each other's CQ inbox.  Only the control path uses it.

#![warn(missing_docs)]

pub mod agent;
pub mod client;
pub mod device;
mod launch;
pub mod proto;
pub mod sock;
