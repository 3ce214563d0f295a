//! A VI's attributes, readable on the data path without a lock.

use crate::handles::Handle;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};

/// The attributes of a VI (`VIP_VI_ATTRIBUTES`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ViAttrs {
    /// Reliability level.
    pub reliability: u16,
    /// Maximum transfer size.
    pub max_transfer: u64,
    /// Protection tag handle.
    pub ptag: Handle,
    /// Accept RDMA writes.
    pub rdma_write: bool,
    /// Accept RDMA reads.
    pub rdma_read: bool,
}

/// Attributes as one atomic per field.  They are stored only while the
/// writer holds both work-queue locks, so a reader holding either lock sees
/// one consistent set, and a post pays plain loads instead of a lock.
pub(crate) struct AttrCell {
    reliability: AtomicU16,
    max_transfer: AtomicU64,
    ptag: AtomicU64,
    rdma_write: AtomicBool,
    rdma_read: AtomicBool,
}

impl AttrCell {
    pub fn new(a: &ViAttrs) -> AttrCell {
        AttrCell {
            reliability: AtomicU16::new(a.reliability),
            max_transfer: AtomicU64::new(a.max_transfer),
            ptag: AtomicU64::new(a.ptag),
            rdma_write: AtomicBool::new(a.rdma_write),
            rdma_read: AtomicBool::new(a.rdma_read),
        }
    }

    pub fn load(&self) -> ViAttrs {
        ViAttrs {
            reliability: self.reliability.load(Ordering::Acquire),
            max_transfer: self.max_transfer.load(Ordering::Acquire),
            ptag: self.ptag.load(Ordering::Acquire),
            rdma_write: self.rdma_write.load(Ordering::Acquire),
            rdma_read: self.rdma_read.load(Ordering::Acquire),
        }
    }

    /// The caller holds both work-queue locks of the VI.
    pub fn store(&self, a: &ViAttrs) {
        self.reliability.store(a.reliability, Ordering::Release);
        self.max_transfer.store(a.max_transfer, Ordering::Release);
        self.ptag.store(a.ptag, Ordering::Release);
        self.rdma_write.store(a.rdma_write, Ordering::Release);
        self.rdma_read.store(a.rdma_read, Ordering::Release);
    }
}
