//! `VipCQDone` and `VipCQWait`: finding a completion on a CQ, in the two
//! designs of `VIA_CQ` (`cq`).  A CQ polls the VIs whose work queues it
//! holds, so this sits above `vi`, which only pushes entries into CQs.

use crate::counters::{Counter, StageTimer};
use crate::cq::{Cq, CqEntry};
use crate::handles::Handle;
use crate::lane::PROGRESS;
use crate::nic::Nic;
use crate::timeout::{done_first, poll_answer, Deadline, SpinWait};
use crate::tuning::CqMode;
use crate::vi::{Break, Vi};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use via_core::consts::error_code;
use via_core::error::{ViaError, ViaResult};

/// CQ2: how long `VipCQWait` sleeps between scans once its spin is over.
const SCAN_NAP: Duration = Duration::from_micros(200);

impl Cq {
    /// `VipCQDone`: the next completion, if any.
    pub fn done(&self) -> ViaResult<CqEntry> {
        let timer = StageTimer::start();
        crate::vi::progress_nic(&self.nic);
        let find = || match self.nic.tuning.cq {
            CqMode::Entries => self.pop_entry(),
            CqMode::Scan => self.scan(),
        };
        let found = done_first(|| self.nic.poll_net(), find);
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
            let n = lanes.len();
            // No division per poll: the cursor is at most one past the end.
            let start = self.lane_cursor.load(Ordering::Relaxed);
            let start = if start < n { start } else { 0 };
            for k in 0..n {
                let at = if start + k < n { start + k } else { start + k - n };
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
    #[inline]
    fn pop_from(&self, queues: &via_shm::Inbox, lane: Option<u64>) -> Option<CqEntry> {
        // An empty queue, what most polls find, costs no call.
        let word = queues.pop(self.index)?;
        self.take_entry(queues, lane, word)
    }

    /// [`Cq::pop_from`] once it popped `first`: that entry, or the next
    /// one of `queues` that names a queue of this CQ.
    #[inline(never)]
    fn take_entry(&self, queues: &via_shm::Inbox, lane: Option<u64>, first: u64) -> Option<CqEntry> {
        let mut next = Some(first);
        while let Some(word) = next.take() {
            let entry = CqEntry::decode(word);
            // Through the thread's last VI: the caller's next call is on this one.
            let mine = Vi::with_in(&self.nic.provider, entry.vi, |vi| {
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
            next = queues.pop(self.index);
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
            let (vi, recv) = members[k];
            if Vi::with_in(&self.nic.provider, vi, |vi| Ok(vi.report_unseen(recv))) == Ok(true) {
                self.cursor.store(k + 1, Ordering::Relaxed);
                return Some(CqEntry { vi, recv });
            }
        }
        None
    }

    /// Whether a message is arriving for one of the receive queues
    /// attached (`Vi::arriving`), asked of the next `ARRIVAL_LOOK` of them
    /// only, in turn: a look costs as much with 1,024 VIs as with a few.
    fn arriving(&self) -> bool {
        let members = self.members.lock();
        let n = members.len();
        let start = self.arrival_cursor.fetch_add(ARRIVAL_LOOK, Ordering::Relaxed);
        (0..ARRIVAL_LOOK.min(n)).any(|i| {
            let (vi, recv) = members[(start + i) % n];
            recv && Vi::with_in(&self.nic.provider, vi, |vi| Ok(vi.arriving())) == Ok(true)
        })
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
            if spin.spin_while(|| self.arriving()) {
                continue;
            }
            if deadline.passed() {
                return Err(ViaError::Timeout);
            }
            let nap = match self.nic.tuning.cq {
                CqMode::Entries => Duration::from_millis(50),
                CqMode::Scan => SCAN_NAP,
            };
            let nap = deadline.next_sleep(nap);
            if crate::clock::simulated_sleep(nap) {
                continue;
            }
            let _port = self.nic.sleep_on_port();
            self.sleep(nap);
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

/// Members a CQ wait asks at each look whether a message is arriving.
const ARRIVAL_LOOK: usize = 8;

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
    let provider = nic.provider.clone();
    crate::progress::defer(Box::new(move || {
        for vi in vis.into_iter().filter_map(|h| Vi::get_in(&provider, h).ok()) {
            vi.break_connection(Break { mine: error_code::CONN_LOST, theirs: error_code::CONN_LOST });
        }
    }));
}
