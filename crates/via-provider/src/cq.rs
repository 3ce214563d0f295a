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
//! `SCAN_NAP` once its spin is over.

use crate::counters::{Counter, StageTimer};
use crate::handles::{Handle, ThreadCache};
use crate::nic::{ErrorEvent, Nic};
use crate::timeout::{done_first, poll_answer, Deadline, SpinWait};
use crate::tuning::{tuning, CqMode};
use crate::{provider, Vi};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;
use via_core::consts::limits;
use via_core::consts::{error_code, resource_code};
use via_core::error::{ViaError, ViaResult};
use via_shm::inbox::INBOX_ENTRIES;

pub use crate::lane::CqEntry;
use crate::lane::PROGRESS;

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
    /// CQ2: the work queues attached (VI, receive queue?), scanned from `cursor`.
    members: Mutex<Vec<(Weak<Vi>, bool)>>,
    cursor: AtomicUsize,
    /// CQ1: the lane to look at first.
    lane_cursor: AtomicUsize,
}

thread_local! {
    /// The CQs this thread polled recently ([`Cq::with`]).
    static CQS: ThreadCache<Cq> = const { ThreadCache::new() };
}

/// CQ2: how long `VipCQWait` sleeps between scans once its spin is over.
const SCAN_NAP: Duration = Duration::from_micros(200);

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
                members: Mutex::new(Vec::new()),
                cursor: AtomicUsize::new(0),
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

    /// Looks up a CQ handle.
    pub fn get(handle: Handle) -> ViaResult<Arc<Cq>> {
        provider().cqs.get(handle).ok_or(ViaError::InvalidParameter)
    }

    /// Runs `f` on the CQ of `handle`, through the thread's cache
    /// ([`handles::Table::with`](crate::handles::Table::with)).
    pub fn with<R>(handle: Handle, f: impl FnOnce(&Arc<Cq>) -> ViaResult<R>) -> ViaResult<R> {
        provider().cqs.with(&CQS, handle, f).unwrap_or(Err(ViaError::InvalidParameter))
    }

    /// `VipDestroyCQ`: only when no work queue uses it.
    pub fn destroy(handle: Handle) -> ViaResult<()> {
        let cq = Cq::get(handle)?;
        if cq.users.load(Ordering::Acquire) > 0 {
            return Err(ViaError::InvalidState);
        }
        provider().cqs.remove(handle);
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
    pub(crate) fn attach(&self, vi: &Arc<Vi>, recv: bool) {
        self.users.fetch_add(1, Ordering::AcqRel);
        self.members.lock().push((Arc::downgrade(vi), recv));
    }

    /// Detaches a work queue of `vi` (`VipDestroyVi`).
    pub(crate) fn detach(&self, vi: &Vi, recv: bool) {
        self.users.fetch_sub(1, Ordering::AcqRel);
        self.members.lock().retain(|(w, r)| *r != recv || w.upgrade().is_some_and(|v| v.handle != vi.handle));
    }

    /// Pushes a completion made in this process (CQ1; CQ2 writes no entries).
    pub fn push_local(&self, entry: CqEntry) {
        if tuning().cq == CqMode::Scan {
            return;
        }
        if !self.nic.inbox.push_and_ring(&self.nic.bell, self.index, entry.encode()) {
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
        let timer = StageTimer::start();
        crate::vi::progress_nic(&self.nic);
        let find = || match tuning().cq {
            CqMode::Entries => self.pop_entry(),
            CqMode::Scan => self.scan(),
        };
        let found = done_first(self.nic.has_port(), || self.nic.poll_net(), find);
        timer.stop(&self.nic.counters, Counter::CqDoneNs, Some(Counter::CqDoneCalls));
        poll_answer(found)
    }

    /// CQ1: the next entry that names a queue of this CQ: this process's
    /// own first, then the peers' lanes, from the one after the lane that
    /// gave the last entry (no lane starves the others).
    fn pop_entry(&self) -> Option<CqEntry> {
        if self.nic.inbox.take_overflow(self.index) {
            self.overflowed();
        }
        if let Some(entry) = self.pop_from(&self.nic.inbox, None) {
            return Some(entry);
        }
        self.nic.lanes.with(|lanes| {
            let start = self.lane_cursor.load(Ordering::Relaxed);
            for k in 0..lanes.len() {
                let at = (start + k) % lanes.len();
                let lane = &lanes[at];
                if !lane.live() {
                    continue;
                }
                if lane.queues.take_overflow(self.index) && lane.kill() {
                    lane_overflowed(&self.nic, lane.id);
                    continue;
                }
                if let Some(entry) = self.pop_from(&lane.queues, Some(lane.id)) {
                    self.lane_cursor.store(at + 1, Ordering::Relaxed);
                    return Some(entry);
                }
            }
            None
        })
    }

    /// The next entry of `queues` that names a queue of this CQ; from a
    /// lane (`lane`: its id), only one that names a VI connected through it.
    fn pop_from(&self, queues: &via_shm::Inbox, lane: Option<u64>) -> Option<CqEntry> {
        while let Some(word) = queues.pop(self.index) {
            let entry = CqEntry::decode(word);
            // Through the thread's last VI: the caller's next call is on this one.
            let mine = Vi::with(entry.vi, |vi| {
                let cq = if entry.recv { &vi.recv_cq } else { &vi.send_cq };
                let mine = cq.as_ref().is_some_and(|c| c.handle == self.handle)
                    && lane.is_none_or(|id| vi.lane.load(Ordering::Acquire) == id);
                if mine && word & PROGRESS != 0 {
                    // Room for the rest of a message; its completion comes as an entry of its own.
                    vi.ring_progress();
                    return Ok(false);
                }
                if mine && entry.recv {
                    vi.prefetch_received();
                }
                Ok(mine)
            });
            if mine == Ok(true) {
                return Some(entry);
            }
        }
        None
    }

    /// CQ2: the first attached work queue, from the cursor on, with a
    /// completion not reported yet.
    fn scan(&self) -> Option<CqEntry> {
        let members = self.members.lock();
        let n = members.len();
        let start = self.cursor.load(Ordering::Relaxed);
        for i in 0..n {
            let k = (start + i) % n;
            let (vi, recv) = &members[k];
            let Some(vi) = vi.upgrade() else { continue };
            if vi.report_unseen(*recv) {
                self.cursor.store(k + 1, Ordering::Relaxed);
                return Some(CqEntry { vi: vi.handle, recv: *recv });
            }
        }
        None
    }

    /// `VipCQWait`.
    pub fn wait(&self, timeout_ms: u64) -> ViaResult<CqEntry> {
        let deadline = Deadline::after_ms(timeout_ms);
        let mut spin = SpinWait::start(&deadline);
        loop {
            if let Ok(e) = self.done() {
                spin.done();
                return Ok(e);
            }
            if self.destroyed.load(Ordering::Acquire) {
                // Another thread destroyed the CQ: its handle is no longer valid.
                return Err(ViaError::InvalidParameter);
            }
            if spin.spin() {
                continue;
            }
            if deadline.passed() {
                return Err(ViaError::Timeout);
            }
            let nap = match tuning().cq {
                CqMode::Entries => Duration::from_millis(50),
                CqMode::Scan => SCAN_NAP,
            };
            let _port = self.nic.sleep_on_port();
            self.sleep(deadline.next_sleep(nap));
        }
    }
}

impl Cq {
    /// Sleeps until a producer rings this CQ's bell, a lane is added or
    /// `nap` passes: says so in the private inbox and in every lane, so
    /// that whoever pushes next rings, then checks them all once more.
    fn sleep(&self, nap: Duration) {
        let (nic, index) = (&self.nic, self.index);
        let lanes = nic.lanes.snapshot();
        let seq = nic.bell.seq(index);
        nic.inbox.begin_sleep(index);
        lanes.iter().for_each(|l| l.queues.begin_sleep(index));
        let ready = nic.inbox.ready(index) || lanes.iter().any(|l| l.queues.ready(index));
        if !ready && !self.destroyed.load(Ordering::Acquire) {
            nic.bell.wait(index, seq, Some(nap));
        }
        nic.inbox.end_sleep(index);
        lanes.iter().for_each(|l| l.queues.end_sleep(index));
    }
}

/// A lane overflowed: its peer made more completions for a CQ than the
/// lane holds (or claims to have).  Entries were lost, so the connections
/// through that lane break, and the lane is dead: nothing its peer still
/// writes there is read or woken for.  The CQ and other peers' connections
/// go on.
fn lane_overflowed(nic: &Arc<Nic>, lane: u64) {
    tracing::warn!(lane, "a peer's completion lane overflowed: its connections break");
    let vis: Vec<Handle> = nic
        .shm_conns
        .lock()
        .iter()
        .filter(|(_, conn)| conn.upgrade().is_some_and(|c| c.lane_in.id == lane))
        .map(|(vi, _)| *vi)
        .collect();
    crate::progress::defer(Box::new(move || {
        for vi in vis.into_iter().filter_map(|h| Vi::get(h).ok()) {
            vi.break_connection(crate::vi::Break { mine: error_code::CONN_LOST, theirs: error_code::CONN_LOST });
        }
    }));
}
