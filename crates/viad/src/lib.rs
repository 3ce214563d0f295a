//! openvia host agent (the VI kernel agent of VIA 1.0).
//!
//! One `viad` runs per host (per network namespace) on an abstract Unix
//! socket; a user that finds that name held by another non-root user runs
//! an agent of its own beside it (see [`client`] for which agent a client
//! trusts, and [`agent`] for what the agent allows each uid).  It resolves device names, counts sessions, and pairs connection
//! requests by discriminator, handing both sides of a same-host connection
//! the same connection segment, socket pair and each other's bell.  It is
//! also the host's connection manager: on UDP port [`via_wire::cm::CM_PORT`]
//! it exchanges the CM messages of [`via_wire::cm`] with the agents of other
//! hosts, so that processes on different hosts connect by discriminator too
//! (see [`agent`] and [`cm`]).  Only the control path uses it.

#![warn(missing_docs)]

pub mod agent;
pub mod cm;
mod udp;

// The protocol, the client and the host facts, shared with VIA processes.
pub use viad_client::{aliases, client, device, netif, proto, sock};
