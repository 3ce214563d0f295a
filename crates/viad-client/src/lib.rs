//! What a VIA process and the host agent `viad` share: the agent's protocol
//! ([`proto`]) and its Unix socket ([`sock`]), the client a process talks to
//! the agent with ([`client`], which starts an agent on demand, [`launch`]),
//! and the host facts both read: device names ([`device`]), aliases
//! ([`aliases`]) and this host's interfaces ([`netif`]).
//!
//! The agent itself (its event loop and the connection manager between
//! hosts) is the `viad` crate, which `libvipl` does not link.

#![warn(missing_docs)]

pub mod aliases;
pub mod client;
pub mod device;
mod launch;
pub mod netif;
pub mod proto;
pub mod sock;
