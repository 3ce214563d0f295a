//! The shared-memory transport of openvia: the "VI NIC" for connections
//! between processes of one host.
//!
//! This crate is mechanism only; the provider decides policy.  It offers
//! memfd-backed [`SharedRegion`]s, shared futexes, cross-memory attach
//! ([`cma`]), the per-connection [`ConnSegment`] (two [`Ring`]s and two
//! [`RecvCache`]s), the completion-queue [`Inbox`]es (one private, one lane
//! per peer) and the [`Bell`] their owner sleeps on, and the registry's
//! [`TableSegment`].
//!
//! Memory shared with another process is untrusted: every index, length,
//! count and kind read from it is validated before use, so a lying peer can
//! make these functions return errors or lose messages, but never make them
//! access memory out of bounds or panic.  Linux only.

#![deny(missing_docs)]

pub mod bell;
pub mod cma;
pub mod conn;
mod error;
pub mod futex;
pub mod inbox;
mod layout;
pub mod recv;
pub mod region;
pub mod ring;
pub mod stats;
pub mod table;

pub use bell::{Bell, BELL_SEGMENT_BYTES};
pub use conn::{ConnSegment, CopyGuard, Side, CONN_SEGMENT_BYTES, CONN_VERSION};
pub use error::ShmError;
pub use futex::{futex_wait, futex_wake};
pub use inbox::{Inbox, INBOXES, INBOX_ENTRIES, INBOX_SEGMENT_BYTES};
pub use recv::{RecvCache, RecvEntry, RecvSeg, MAX_SEGS, RECV_ENTRIES};
pub use region::SharedRegion;
pub use ring::{
    Ring, SlotHeader, INLINE_MAX, RDMA_TARGET_BYTES, RING_SLOTS, SLOT_BYTES, SLOT_ERROR, SLOT_RDMA_PIECE,
    SLOT_RDMA_READ, SLOT_RDMA_READ_PIECE, SLOT_RDMA_WRITE, SLOT_RDMA_WRITE_IMM, SLOT_SEND, SLOT_SEND_PIECE,
};
pub use table::{TableSegment, TABLE_SEGMENT_BYTES};
