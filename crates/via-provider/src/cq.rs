//! Completion queues, in the two designs of `VIA_CQ`.
//!
//! CQ1 (default): a CQ is one queue index of the NIC's inboxes.  Whoever
//! completes a descriptor of a queue attached to the CQ pushes one entry:
//! this process into its private inbox, a peer process that delivered a
//! message into its own lane ([`crate::lane`]).  `VipCQDone` pops in O(1)
//! whatever the number of VIs (one queue per peer process, not per VI), and
//! takes an entry from a lane only if it names a VI connected through it.
//!
//! CQ2: nobody writes entries; `VipCQDone` polls the work queues attached
//! to the CQ in turn, from where the last call stopped, and reports a
//! queue that has a completion it has not reported yet.  Its cost grows
//! with the number of queues; posting and delivering cost nothing extra.
//! `VipCQWait` has nothing to sleep on then: it scans again every
//! `SCAN_NAP` once its spin is over.  Polling and waiting are in `cq_wait`.

use crate::handles::{Handle, ThreadCache};
use crate::nic::{ErrorEvent, Nic};
use crate::tuning::CqMode;
use crate::{provider, Provider};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use via_core::consts::limits;
use via_core::consts::{error_code, resource_code};
use via_core::error::{ViaError, ViaResult};
use via_shm::inbox::INBOX_ENTRIES;

pub use crate::lane::CqEntry;

/// A completion queue.
pub struct Cq {
    /// This CQ's handle.
    pub handle: Handle,
    /// Its NIC.
    pub nic: Arc<Nic>,
    /// Its inbox index.
    pub index: usize,
    /// Work queues attached.
    pub users: AtomicUsize,
    /// Entries requested.
    pub capacity: AtomicUsize,
    /// Set when destroyed, for notify threads.
    pub destroyed: std::sync::atomic::AtomicBool,
    /// The work queues attached (VI, receive queue?); CQ2 scans them from
    /// `cursor`.
    pub(crate) members: Mutex<Vec<(Handle, bool)>>,
    pub(crate) cursor: AtomicUsize,
    /// The member a wait asks next whether a message is arriving.
    pub(crate) arrival_cursor: AtomicUsize,
    /// CQ1: the lane to look at first.
    pub(crate) lane_cursor: AtomicUsize,
}

thread_local! {
    /// The CQs this thread polled recently ([`Cq::with`]).
    static CQS: ThreadCache<Cq> = const { ThreadCache::new() };
}

impl Cq {
    /// `VipCreateCQ`.
    pub fn create(nic: &Arc<Nic>, entries: usize) -> ViaResult<Handle> {
        if entries == 0 {
            return Err(ViaError::InvalidParameter);
        }
        if entries > INBOX_ENTRIES.min(limits::MAX_CQ_ENTRIES) {
            return Err(ViaError::Resource);
        }
        let index = nic.claim_cq_slot()?;
        match nic.provider.cqs.insert(|handle| {
            Arc::new(Cq {
                handle,
                nic: nic.clone(),
                index,
                users: AtomicUsize::new(0),
                capacity: AtomicUsize::new(entries),
                destroyed: Default::default(),
                members: Mutex::new(Vec::new()),
                cursor: AtomicUsize::new(0),
                arrival_cursor: AtomicUsize::new(0),
                lane_cursor: AtomicUsize::new(0),
            })
        }) {
            Some((h, _)) => Ok(h),
            None => {
                nic.release_cq_slot(index);
                Err(ViaError::Resource)
            }
        }
    }

    /// Looks up a CQ handle of the process's provider.
    pub fn get(handle: Handle) -> ViaResult<Arc<Cq>> {
        Cq::get_in(provider(), handle)
    }

    /// Looks up a CQ handle of `provider`.
    pub fn get_in(provider: &Provider, handle: Handle) -> ViaResult<Arc<Cq>> {
        provider.cqs.get(handle).ok_or(ViaError::InvalidParameter)
    }

    /// Runs `f` on the CQ of `handle`, through the thread's cache
    /// ([`handles::Table::with`](crate::handles::Table::with)).
    pub fn with<R>(handle: Handle, f: impl FnOnce(&Arc<Cq>) -> ViaResult<R>) -> ViaResult<R> {
        provider().cqs.with(&CQS, handle, f).unwrap_or(Err(ViaError::InvalidParameter))
    }

    /// `VipDestroyCQ`: only when no work queue uses it.
    pub fn destroy(handle: Handle) -> ViaResult<()> {
        Cq::destroy_in(provider(), handle)
    }

    /// `VipDestroyCQ` of a CQ of `provider`.
    pub fn destroy_in(provider: &Provider, handle: Handle) -> ViaResult<()> {
        let cq = Cq::get_in(provider, handle)?;
        if cq.users.load(Ordering::Acquire) > 0 {
            return Err(ViaError::InvalidState);
        }
        provider.cqs.remove(handle);
        cq.destroyed.store(true, Ordering::Release);
        cq.nic.bell.ring(cq.index);
        cq.nic.release_cq_slot(cq.index);
        Ok(())
    }

    /// `VipResizeCQ`.
    pub fn resize(&self, entries: usize) -> ViaResult<()> {
        if entries == 0 {
            return Err(ViaError::InvalidParameter);
        }
        if entries > INBOX_ENTRIES.min(limits::MAX_CQ_ENTRIES) {
            return Err(ViaError::Resource);
        }
        self.capacity.store(entries, Ordering::Release);
        Ok(())
    }

    /// Attaches a work queue of `vi` (`VipCreateVi`).
    pub(crate) fn attach(&self, vi: Handle, recv: bool) {
        self.users.fetch_add(1, Ordering::AcqRel);
        self.members.lock().push((vi, recv));
    }

    /// Detaches a work queue of `vi` (`VipDestroyVi`).
    pub(crate) fn detach(&self, vi: Handle, recv: bool) {
        self.users.fetch_sub(1, Ordering::AcqRel);
        self.members.lock().retain(|&(h, r)| r != recv || h != vi);
    }

    /// Pushes a completion made in this process (CQ1; CQ2 writes no entries).
    pub fn push_local(&self, entry: CqEntry) {
        if self.nic.tuning.cq == CqMode::Scan {
            return;
        }
        if !self.nic.inbox.push_and_ring(&self.nic.bell, self.index, entry.encode()) {
            self.overflowed();
        }
    }

    /// The CQ lost entries: a catastrophic error, reported to the callback.
    pub(crate) fn overflowed(&self) {
        let event = ErrorEvent {
            nic: self.nic.handle,
            vi: 0,
            cq: self.handle,
            descriptor: 0,
            resource: resource_code::CQ,
            code: error_code::CATASTROPHIC,
        };
        let nic = self.nic.clone();
        crate::progress::defer(Box::new(move || nic.report(event)));
    }
}
