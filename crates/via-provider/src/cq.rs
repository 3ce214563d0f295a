//! Completion queues.
//!
//! A CQ is one inbox of the NIC's inbox segment.  Whoever completes a
//! descriptor of a queue attached to the CQ (this process, or the peer that
//! delivered a message) pushes one entry, so `VipCQDone` pops in O(1)
//! whatever the number of VIs.

use crate::handles::{Handle, Kind};
use crate::nic::{error_code, resource_code, ErrorEvent, Nic};
use crate::timeout::{spin_window, Deadline};
use crate::{provider, Vi};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use via_core::consts::limits;
use via_core::error::{ViaError, ViaResult};
use via_shm::inbox::INBOX_ENTRIES;

/// One completion: which VI, which queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CqEntry {
    /// The VI handle.
    pub vi: Handle,
    /// True for the receive queue.
    pub recv: bool,
}

impl CqEntry {
    /// The inbox word: the VI handle without its kind byte, the queue in the top bit.
    pub fn encode(&self) -> u64 {
        (self.vi & 0x00FF_FFFF_FFFF_FFFF) | ((self.recv as u64) << 63)
    }
    /// Parses an inbox word (untrusted: the VI is looked up before use).
    pub fn decode(word: u64) -> CqEntry {
        CqEntry { vi: (word & 0x00FF_FFFF_FFFF_FFFF) | ((Kind::Vi as u64) << 56), recv: word >> 63 == 1 }
    }
}

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
        match provider().cqs.insert(|handle| {
            Arc::new(Cq {
                handle,
                nic: nic.clone(),
                index,
                users: AtomicUsize::new(0),
                capacity: AtomicUsize::new(entries),
                destroyed: Default::default(),
            })
        }) {
            Some((h, _)) => Ok(h),
            None => {
                nic.release_cq_slot(index);
                Err(ViaError::Resource)
            }
        }
    }

    /// Looks up a CQ handle.
    pub fn get(handle: Handle) -> ViaResult<Arc<Cq>> {
        provider().cqs.get(handle).ok_or(ViaError::InvalidParameter)
    }

    /// `VipDestroyCQ`: only when no work queue uses it.
    pub fn destroy(handle: Handle) -> ViaResult<()> {
        let cq = Cq::get(handle)?;
        if cq.users.load(Ordering::Acquire) > 0 {
            return Err(ViaError::InvalidState);
        }
        provider().cqs.remove(handle);
        cq.destroyed.store(true, Ordering::Release);
        cq.nic.inbox.wake(cq.index);
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

    /// Pushes a completion made in this process.
    pub fn push_local(&self, entry: CqEntry) {
        if !self.nic.inbox.push(self.index, entry.encode()) {
            self.overflowed();
        }
    }

    fn overflowed(&self) {
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

    /// `VipCQDone`: the next completion, if any.
    pub fn done(&self) -> ViaResult<CqEntry> {
        self.nic.poll_net();
        if self.nic.inbox.take_overflow(self.index) {
            self.overflowed();
        }
        while let Some(word) = self.nic.inbox.pop(self.index) {
            let entry = CqEntry::decode(word);
            // Entries may come from another process: only VIs of this CQ count.
            if let Ok(vi) = Vi::get(entry.vi) {
                let mine = if entry.recv { &vi.recv_cq } else { &vi.send_cq };
                if mine.as_ref().is_some_and(|c| c.handle == self.handle) {
                    return Ok(entry);
                }
            }
        }
        Err(ViaError::NotDone)
    }

    /// `VipCQWait`.
    pub fn wait(&self, timeout_ms: u64) -> ViaResult<CqEntry> {
        let deadline = Deadline::after_ms(timeout_ms);
        let spin_until = Instant::now() + spin_window();
        loop {
            if let Ok(e) = self.done() {
                return Ok(e);
            }
            if deadline.passed() || self.destroyed.load(Ordering::Acquire) {
                return Err(ViaError::Timeout);
            }
            if Instant::now() < spin_until {
                std::hint::spin_loop();
                continue;
            }
            self.nic.inbox.wait(self.index, Some(deadline.next_sleep(Duration::from_millis(50))));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip() {
        let vi = ((Kind::Vi as u64) << 56) | (0x12_3456 << 32) | 77;
        for recv in [false, true] {
            assert_eq!(CqEntry::decode(CqEntry { vi, recv }.encode()), CqEntry { vi, recv });
        }
    }
}
