//! Completion lanes: where connected peer processes push the completions
//! they make for this process's CQs.
//!
//! A peer that delivers a message into one of our receive queues pushes an
//! entry naming that VI into the CQ's queue.  Each peer process gets a lane
//! of its own (an inbox segment only it and we map), so a peer can forge,
//! stall or corrupt entries only where nobody else writes: `VipCQDone`
//! takes an entry from a lane only if it names a VI connected through that
//! lane, and a lane that overflows breaks its own connections, never a CQ.
//! One lane per peer *process*, not per connection, keeps `VipCQDone` O(1)
//! in the number of VIs: 128 VIs to one peer share one lane.

use crate::handles::{Handle, Kind};
use parking_lot::RwLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use via_shm::inbox::Inbox;

/// One peer process's lane into this NIC's CQs.
pub struct Lane {
    /// This lane's number, unique in the process (never 0: 0 is "no lane").
    pub id: u64,
    /// The peer process, as the kernel named it (0: a process the kernel
    /// could not name in our pid namespace, which shares its lane with nobody).
    pub pid: i32,
    /// The queues, one per CQ index.
    pub queues: Inbox,
    /// Set once the lane overflowed and its connections broke: nothing is
    /// taken from it, waited on or reused any more, whatever its peer
    /// still writes into it.
    pub dead: AtomicBool,
}

impl Lane {
    /// Whether entries are still taken from this lane.
    pub fn live(&self) -> bool {
        !self.dead.load(Ordering::Acquire)
    }

    /// Marks the lane dead; true for the caller that did it first.
    pub fn kill(&self) -> bool {
        !self.dead.swap(true, Ordering::AcqRel)
    }
}

/// A NIC's lanes.
#[derive(Default)]
pub struct Lanes(RwLock<Vec<Arc<Lane>>>);

impl Lanes {
    /// The lane of peer process `pid`: the one a live connection to it
    /// already uses, or a new one.
    pub fn for_peer(&self, pid: i32) -> std::io::Result<Arc<Lane>> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let mut lanes = self.0.write();
        // Lanes no connection holds any more are dropped here.
        lanes.retain(|l| Arc::strong_count(l) > 1);
        if let Some(lane) = lanes.iter().find(|l| pid != 0 && l.pid == pid && l.live()) {
            return Ok(lane.clone());
        }
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        let lane = Arc::new(Lane { id, pid, queues: Inbox::create_lane()?, dead: AtomicBool::new(false) });
        lanes.push(lane.clone());
        Ok(lane)
    }

    /// Runs `f` over the lanes while no lane is added or dropped.
    pub fn with<R>(&self, f: impl FnOnce(&[Arc<Lane>]) -> R) -> R {
        f(&self.0.read())
    }

    /// The live lanes now, for a thread about to sleep.
    pub fn snapshot(&self) -> Vec<Arc<Lane>> {
        self.0.read().iter().filter(|l| l.live()).cloned().collect()
    }

    /// Empties queue `index` of every lane, for a CQ index being reused.
    pub fn reset(&self, index: usize) {
        for lane in self.0.read().iter() {
            lane.queues.reset(index);
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

    #[test]
    fn one_lane_per_live_peer_process() {
        let lanes = Lanes::default();
        let a = lanes.for_peer(100).unwrap();
        let again = lanes.for_peer(100).unwrap();
        assert_eq!(a.id, again.id, "a second connection to a peer shares its lane");
        let b = lanes.for_peer(200).unwrap();
        assert_ne!(a.id, b.id);
        // A process the kernel could not name shares with nobody.
        let (x, y) = (lanes.for_peer(0).unwrap(), lanes.for_peer(0).unwrap());
        assert_ne!(x.id, y.id);
        lanes.with(|l| assert_eq!(l.len(), 4));
        // Once no connection holds a lane, the next connection to that pid gets a new one.
        let old = a.id;
        drop((a, again, x, y));
        let fresh = lanes.for_peer(100).unwrap();
        assert_ne!(fresh.id, old);
        lanes.with(|l| assert_eq!(l.len(), 2));
        assert!(fresh.queues.push(3, 9));
        lanes.reset(3);
        assert_eq!(fresh.queues.pop(3), None);
        // A dead lane is neither waited on nor given to the next connection.
        assert!(fresh.kill() && !fresh.kill());
        assert!(lanes.snapshot().iter().all(|l| l.id != fresh.id));
        assert_ne!(lanes.for_peer(100).unwrap().id, fresh.id);
    }
}

/// One completion: which VI, which queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CqEntry {
    /// The VI handle.
    pub vi: Handle,
    /// True for the receive queue.
    pub recv: bool,
}

/// The bit of an inbox word that asks the CQ to drain the VI's ring rather
/// than report a completion: a message sent through the ring in pieces
/// waits for room, and its receiver may be waiting on this CQ only.
pub(crate) const PROGRESS: u64 = 1 << 62;

impl CqEntry {
    /// The inbox word: the VI handle without its kind byte, the queue in the top bit.
    pub fn encode(&self) -> u64 {
        (self.vi & 0x00FF_FFFF_FFFF_FFFF) | ((self.recv as u64) << 63)
    }

    /// The inbox word that asks for the VI's ring to be drained ([`PROGRESS`]).
    pub fn encode_progress(&self) -> u64 {
        self.encode() | PROGRESS
    }
    /// Parses an inbox word (untrusted: the VI is looked up before use).
    pub fn decode(word: u64) -> CqEntry {
        CqEntry { vi: (word & 0x00FF_FFFF_FFFF_FFFF) | ((Kind::Vi as u64) << 56), recv: word >> 63 == 1 }
    }
}
