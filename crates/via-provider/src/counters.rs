//! The provider's counters, published in a page that `viad --stats` reads
//! (see `via_shm::stats`): what was sent, received, retransmitted, and
//! dropped with the reason.

use std::sync::Arc;
use via_shm::stats::StatsPage;

/// One counter of a NIC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum Counter {
    /// Messages sent (sends and RDMA writes with immediate data).
    MsgsSent,
    /// Messages received into receive descriptors.
    MsgsReceived,
    /// Payload bytes sent.
    BytesSent,
    /// Payload bytes received.
    BytesReceived,
    /// Sends copied inline through a shared-memory ring.
    InlineSends,
    /// Single copies by cross-memory attach.
    CmaCopies,
    /// RDMA writes carried out.
    RdmaWrites,
    /// RDMA reads carried out.
    RdmaReads,
    /// RDMA requests refused by a protection check.
    RdmaRefused,
    /// Messages dropped on unreliable VIs because no receive was posted.
    DroppedNoRecv,
    /// Connections established.
    Connects,
    /// Connections broken (errors, peer loss).
    Breaks,
    /// UDP packets sent.
    PacketsSent,
    /// UDP packets handed to a VI.
    PacketsReceived,
    /// Packets retransmitted.
    Retransmits,
    /// Duplicate packets dropped.
    Duplicates,
    /// Packets dropped for a wrong key or VI.
    BadKey,
    /// Datagrams dropped as malformed (checksum, length, version).
    Malformed,
    /// Packets dropped for an unknown VI.
    UnknownVi,
}

/// Names, in the order of [`Counter`].
pub const NAMES: [&str; 19] = [
    "msgs_sent",
    "msgs_received",
    "bytes_sent",
    "bytes_received",
    "inline_sends",
    "cma_copies",
    "rdma_writes",
    "rdma_reads",
    "rdma_refused",
    "dropped_no_recv",
    "connects",
    "breaks",
    "packets_sent",
    "packets_received",
    "retransmits",
    "duplicates",
    "dropped_bad_key",
    "dropped_malformed",
    "dropped_unknown_vi",
];

/// The counters of one NIC.
#[derive(Clone)]
pub struct Counters(Option<Arc<StatsPage>>);

impl Counters {
    /// A page labelled with the device name; without one (no memfd) counting is off.
    pub fn new(device: &str) -> Counters {
        Counters(StatsPage::create(device, &NAMES).ok().map(Arc::new))
    }

    /// Adds `n` to `c`.
    pub fn add(&self, c: Counter, n: u64) {
        if let Some(p) = &self.0 {
            p.add(c as usize, n);
        }
    }

    /// The current value of `c`.
    pub fn get(&self, c: Counter) -> u64 {
        self.0.as_ref().map_or(0, |p| p.get(c as usize))
    }

    /// The page, to hand to the host agent.
    pub fn page(&self) -> Option<&StatsPage> {
        self.0.as_deref()
    }
}
