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
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
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
    /// The connections that hold it ([`LaneHold`]): with none, the next
    /// connection made drops it from the NIC's list.
    holds: AtomicUsize,
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

    /// How many connections hold it.
    fn holds(&self) -> usize {
        self.holds.load(Ordering::Acquire)
    }
}

/// A connection's hold on its lane, which keeps the lane in its NIC's list.
pub struct LaneHold(Arc<Lane>);

impl LaneHold {
    fn new(lane: &Arc<Lane>) -> LaneHold {
        lane.holds.fetch_add(1, Ordering::AcqRel);
        LaneHold(lane.clone())
    }
}

impl std::ops::Deref for LaneHold {
    type Target = Lane;
    fn deref(&self) -> &Lane {
        &self.0
    }
}

impl Drop for LaneHold {
    fn drop(&mut self) {
        self.0.holds.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A NIC's lanes.
///
/// `VipCQDone` looks at every lane on every call.  Under a read lock, each
/// poll wrote the lock's word twice with atomic operations: most of the
/// time of an empty poll, and a line every polling thread of the process
/// writes.  So each thread keeps the list it last saw, with its version,
/// and takes the lock only when the version moved (a lane added or
/// dropped).  The lanes of that list stay mapped until the thread looks
/// again, closes the NIC or ends.
pub struct Lanes {
    /// Unique in the process, to tell the lists of different NICs apart.
    id: u64,
    list: RwLock<Arc<[Arc<Lane>]>>,
    /// Bumped after every change of `list`.
    version: AtomicU64,
}

/// The lanes list a thread last saw.
struct Seen {
    lanes: u64,
    version: u64,
    list: Arc<[Arc<Lane>]>,
}

thread_local! {
    static SEEN: RefCell<Option<Seen>> = const { RefCell::new(None) };
}

impl Default for Lanes {
    fn default() -> Lanes {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Lanes {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            list: RwLock::new(Arc::from(Vec::new())),
            version: AtomicU64::new(0),
        }
    }
}

impl Lanes {
    /// The lane of peer process `pid`: the one a live connection to it
    /// already uses, or a new one.
    pub fn for_peer(&self, pid: i32) -> std::io::Result<LaneHold> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let mut list = self.list.write();
        let unheld = list.iter().any(|l| l.holds() == 0);
        let (hold, new) = match list.iter().find(|l| pid != 0 && l.pid == pid && l.live() && l.holds() > 0) {
            Some(lane) => (LaneHold::new(lane), None),
            None => {
                let lane = Arc::new(Lane {
                    id: NEXT.fetch_add(1, Ordering::Relaxed),
                    pid,
                    queues: Inbox::create_lane()?,
                    dead: AtomicBool::new(false),
                    holds: AtomicUsize::new(0),
                });
                (LaneHold::new(&lane), Some(lane))
            }
        };
        if unheld || new.is_some() {
            // Lanes no connection holds any more are dropped here.
            *list = list.iter().filter(|l| l.holds() > 0).cloned().chain(new).collect();
            self.version.fetch_add(1, Ordering::Release);
        }
        Ok(hold)
    }

    /// Runs `f` over the lanes as they are now: a lane added or dropped
    /// meanwhile counts from the next call.
    pub fn with<R>(&self, f: impl FnOnce(&[Arc<Lane>]) -> R) -> R {
        let version = self.version.load(Ordering::Acquire);
        SEEN.with(|seen| {
            if let Ok(mut seen) = seen.try_borrow_mut() {
                if !seen.as_ref().is_some_and(|s| s.lanes == self.id && s.version == version) {
                    // The version was read first: a list newer than it is
                    // only read again at the next call.
                    let list = self.list.read().clone();
                    *seen = Some(Seen { lanes: self.id, version, list });
                }
            }
            match seen.try_borrow() {
                Ok(s) if s.as_ref().is_some_and(|s| s.lanes == self.id && s.version == version) => {
                    f(&s.as_ref().expect("checked").list)
                }
                // Called from inside `f` while the list was being replaced.
                _ => f(&self.list.read()),
            }
        })
    }

    /// The live lanes now, for a thread about to sleep.
    pub fn snapshot(&self) -> Vec<Arc<Lane>> {
        self.list.read().iter().filter(|l| l.live()).cloned().collect()
    }

    /// Empties queue `index` of every lane, for a CQ index being reused.
    pub fn reset(&self, index: usize) {
        for lane in self.list.read().iter() {
            lane.queues.reset(index);
        }
    }

    /// Forgets the list this thread saw, as its NIC closes: its lanes are
    /// unmapped once no thread holds them.
    pub fn forget_here(&self) {
        SEEN.with(|seen| {
            if let Ok(mut seen) = seen.try_borrow_mut() {
                if seen.as_ref().is_some_and(|s| s.lanes == self.id) {
                    *seen = None;
                }
            }
        });
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

    #[test]
    fn a_thread_sees_each_nics_list_as_it_is_now() {
        let (one, two) = (Lanes::default(), Lanes::default());
        let held = [one.for_peer(1).unwrap(), two.for_peer(2).unwrap(), two.for_peer(3).unwrap()];
        // By turns, each NIC's own list.
        for _ in 0..2 {
            assert_eq!(one.with(|l| l.iter().map(|l| l.pid).collect::<Vec<_>>()), [1]);
            assert_eq!(two.with(|l| l.iter().map(|l| l.pid).collect::<Vec<_>>()), [2, 3]);
        }
        // A lane added while a call runs over the list: a call inside it sees the new one.
        let added = one.with(|before| {
            let hold = one.for_peer(4).unwrap();
            (before.len(), one.with(|l| l.len()), hold)
        });
        assert_eq!((added.0, added.1), (1, 2));
        assert_eq!(one.with(|l| l.len()), 2);
        // Another thread reads the same list.
        std::thread::scope(|s| {
            s.spawn(|| assert_eq!(one.with(|l| l.iter().map(|l| l.pid).collect::<Vec<_>>()), [1, 4]));
        });
        // Dropped lanes go from the list at the next connection, and from what this thread saw.
        drop(added);
        drop(held);
        let last = one.for_peer(5).unwrap();
        assert_eq!(one.with(|l| l.iter().map(|l| l.pid).collect::<Vec<_>>()), [5]);
        one.forget_here();
        assert_eq!(one.with(|l| l[0].id), last.id);
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
