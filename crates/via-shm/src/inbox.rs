//! The per-process completion-queue inbox segment: one bounded queue of u64
//! entries per CQ index, pushed by any process (multi-producer, lock-free)
//! and popped by the owner.  Only queues live here: what peers may only
//! read (the registry's table) has a segment of its own
//! ([`crate::table`]), since every holder of this fd may map it writable.
//!
//! Each queue is Vyukov's bounded MPMC queue: every cell carries a sequence
//! number telling producers and the consumer whose turn it is.  Cell `i`
//! stores `sequence - i`, so an all-zero segment is a valid set of empty
//! queues and pages are only touched when used.  The owner's read position
//! lives in its own memory, not in the segment, so producers cannot move it.

use std::io;
use std::mem::size_of;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering::*};
use std::time::Duration;

use crate::futex::{futex_wait, futex_wake};
use crate::layout::{at, CacheLine};
use crate::SharedRegion;

/// Queues per segment: one per CQ index.
pub const INBOXES: usize = 256;
/// Entries per queue.
pub const INBOX_ENTRIES: usize = 4096;

#[repr(C)]
struct InboxCtl {
    enqueue: CacheLine<AtomicU64>,
    futex: CacheLine<AtomicU32>,
    sleeping: CacheLine<AtomicU32>,
    overflow: CacheLine<AtomicU32>,
}

#[repr(C)]
struct Cell {
    seq: AtomicU64,
    data: AtomicU64,
}

const CTL_BYTES: usize = size_of::<InboxCtl>();
const QUEUE_BYTES: usize = CTL_BYTES + INBOX_ENTRIES * size_of::<Cell>();
/// Size of an inbox segment.
pub const INBOX_SEGMENT_BYTES: usize = INBOXES * QUEUE_BYTES;
/// Bound on a producer's retries against a segment that keeps changing.
const PUSH_RETRIES: usize = 1 << 20;

const _: () = assert!(INBOX_ENTRIES.is_power_of_two() && QUEUE_BYTES.is_multiple_of(64));
const _: () = assert!(INBOX_SEGMENT_BYTES.is_multiple_of(4096));

/// A mapped inbox segment, as its owner or as a producer.
pub struct Inbox {
    region: SharedRegion,
    /// The owner's read positions, one per queue.
    dequeue: Box<[AtomicU64]>,
}

impl Inbox {
    /// Creates and maps a fresh segment (for its owner).
    pub fn create() -> io::Result<Inbox> {
        Self::wrap(SharedRegion::create("openvia-inbox", INBOX_SEGMENT_BYTES)?)
    }

    /// Maps a segment received from its owner (to push into it); anything
    /// but a sealed memfd of exactly [`INBOX_SEGMENT_BYTES`] is refused
    /// before it is mapped.
    pub fn map(fd: OwnedFd) -> io::Result<Inbox> {
        Self::wrap(SharedRegion::map_exact(fd, INBOX_SEGMENT_BYTES)?)
    }

    fn wrap(region: SharedRegion) -> io::Result<Inbox> {
        if region.len() < INBOX_SEGMENT_BYTES {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "inbox segment too small"));
        }
        let dequeue = (0..INBOXES).map(|_| AtomicU64::new(0)).collect();
        Ok(Inbox { region, dequeue })
    }

    /// The memfd, to hand to producers.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.region.fd()
    }

    fn ctl(&self, index: usize) -> Option<&InboxCtl> {
        // SAFETY: index < INBOXES keeps the queue inside the checked region.
        (index < INBOXES).then(|| unsafe { at(self.region.as_ptr(), index * QUEUE_BYTES) })
    }

    /// The cell for position `pos` of queue `index` (< INBOXES) and its slot number.
    fn cell(&self, index: usize, pos: u64) -> (&Cell, u64) {
        let i = pos & (INBOX_ENTRIES as u64 - 1);
        let off = index * QUEUE_BYTES + CTL_BYTES + i as usize * size_of::<Cell>();
        // SAFETY: index < INBOXES and i < INBOX_ENTRIES keep the cell inside the region.
        (unsafe { at(self.region.as_ptr(), off) }, i)
    }

    /// Pushes `entry` into queue `index`.  Returns false when the queue is
    /// full (and then sets its overflow flag), when `index` is out of range,
    /// or when the segment is corrupt.  Wakes a sleeping owner.
    pub fn push(&self, index: usize, entry: u64) -> bool {
        let Some(ctl) = self.ctl(index) else {
            return false;
        };
        let mut pos = ctl.enqueue.load(Relaxed);
        for _ in 0..PUSH_RETRIES {
            let (cell, i) = self.cell(index, pos);
            let diff = cell.seq.load(Acquire).wrapping_add(i).wrapping_sub(pos) as i64;
            if diff == 0 {
                match ctl.enqueue.compare_exchange_weak(pos, pos.wrapping_add(1), Relaxed, Relaxed) {
                    Ok(_) => {
                        cell.data.store(entry, Relaxed);
                        cell.seq.store(pos.wrapping_add(1).wrapping_sub(i), Release);
                        notify(ctl);
                        return true;
                    }
                    Err(now) => pos = now,
                }
            } else if diff < 0 {
                // The cell still holds an entry from the previous lap.
                ctl.overflow.store(1, SeqCst);
                notify(ctl);
                return false;
            } else {
                let now = ctl.enqueue.load(Relaxed);
                if now == pos {
                    // A cell ahead of a position nobody claimed: corrupt.
                    return false;
                }
                pos = now;
            }
        }
        false
    }

    /// Owner: pops the next entry of queue `index`, `None` if empty (or if a
    /// producer stalled or corrupted the next cell).
    pub fn pop(&self, index: usize) -> Option<u64> {
        self.ctl(index)?;
        let deq = &self.dequeue[index];
        let mut pos = deq.load(Relaxed);
        loop {
            let (cell, i) = self.cell(index, pos);
            let diff = cell.seq.load(Acquire).wrapping_add(i).wrapping_sub(pos.wrapping_add(1)) as i64;
            if diff == 0 {
                match deq.compare_exchange_weak(pos, pos.wrapping_add(1), Relaxed, Relaxed) {
                    Ok(_) => {
                        let v = cell.data.load(Relaxed);
                        let next_lap = pos.wrapping_add(INBOX_ENTRIES as u64);
                        cell.seq.store(next_lap.wrapping_sub(i), Release);
                        return Some(v);
                    }
                    Err(now) => pos = now,
                }
            } else if diff < 0 {
                return None;
            } else {
                // Only our own threads move `deq`; if it did not move, the cell lies.
                let now = deq.load(Relaxed);
                if now == pos {
                    return None;
                }
                pos = now;
            }
        }
    }

    /// Owner: reads and clears the overflow flag of queue `index`.
    pub fn take_overflow(&self, index: usize) -> bool {
        self.ctl(index).is_some_and(|c| c.overflow.swap(0, SeqCst) != 0)
    }

    /// Owner: sleeps until something is pushed into queue `index`, `wake` is
    /// called or `timeout` passes.  Returns at once if an entry or an
    /// overflow is waiting; spurious returns are possible.
    pub fn wait(&self, index: usize, timeout: Option<Duration>) {
        let Some(ctl) = self.ctl(index) else { return };
        ctl.sleeping.fetch_add(1, SeqCst);
        fence(SeqCst);
        let seq = ctl.futex.load(SeqCst);
        let pos = self.dequeue[index].load(Relaxed);
        let (cell, i) = self.cell(index, pos);
        let ready = cell.seq.load(SeqCst).wrapping_add(i) == pos.wrapping_add(1);
        if !ready && ctl.overflow.load(SeqCst) == 0 {
            futex_wait(&ctl.futex, seq, timeout);
        }
        ctl.sleeping.fetch_sub(1, SeqCst);
    }

    /// Wakes every thread sleeping in `wait` on queue `index`.
    pub fn wake(&self, index: usize) {
        if let Some(ctl) = self.ctl(index) {
            ctl.futex.fetch_add(1, SeqCst);
            futex_wake(&ctl.futex, i32::MAX);
        }
    }

    /// Owner: empties queue `index` and clears its overflow flag, for a CQ
    /// index being reused.  Only valid while no producer knows the index.
    pub fn reset(&self, index: usize) {
        let Some(ctl) = self.ctl(index) else { return };
        for pos in 0..INBOX_ENTRIES as u64 {
            let (cell, _) = self.cell(index, pos);
            cell.seq.store(0, Relaxed);
            cell.data.store(0, Relaxed);
        }
        ctl.enqueue.store(0, Relaxed);
        ctl.overflow.store(0, Relaxed);
        self.dequeue[index].store(0, Release);
    }
}

/// Bumps the queue's futex word and wakes the owner if it sleeps.
fn notify(ctl: &InboxCtl) {
    ctl.futex.fetch_add(1, SeqCst);
    // Pairs with the fence in `wait`: either we see the sleeper or it sees the entry.
    fence(SeqCst);
    if ctl.sleeping.load(SeqCst) != 0 {
        futex_wake(&ctl.futex, i32::MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_overflow_and_reset() {
        let owner = Inbox::create().unwrap();
        let producer = Inbox::map(owner.fd().try_clone_to_owned().unwrap()).unwrap();
        for lap in 0..3u64 {
            for i in 0..INBOX_ENTRIES as u64 {
                assert!(producer.push(7, lap << 32 | i));
            }
            assert!(!owner.take_overflow(7));
            assert!(!producer.push(7, 1));
            assert!(owner.take_overflow(7));
            assert!(!owner.take_overflow(7));
            for i in 0..INBOX_ENTRIES as u64 {
                assert_eq!(owner.pop(7), Some(lap << 32 | i));
            }
            assert_eq!(owner.pop(7), None);
        }
        assert_eq!(owner.pop(8), None);
        assert!(producer.push(7, 5) && producer.push(7, 6));
        owner.reset(7);
        assert_eq!(owner.pop(7), None);
        assert!(producer.push(7, 8));
        assert_eq!(owner.pop(7), Some(8));
    }

    #[test]
    fn out_of_range_and_corrupt_cells_do_not_panic() {
        let inbox = Inbox::create().unwrap();
        assert!(!inbox.push(INBOXES, 1));
        assert_eq!(inbox.pop(INBOXES), None);
        assert!(!inbox.take_overflow(usize::MAX));
        inbox.wait(INBOXES, Some(Duration::ZERO));
        inbox.wake(INBOXES);
        inbox.reset(INBOXES);
        // A cell claiming to be several laps ahead.
        let (cell, _) = inbox.cell(3, 0);
        cell.seq.store(9 * INBOX_ENTRIES as u64, Relaxed);
        assert!(!inbox.push(3, 1));
        assert_eq!(inbox.pop(3), None);
        // A wild enqueue position is only a full or stuck queue.
        inbox.ctl(4).unwrap().enqueue.store(u64::MAX - 3, Relaxed);
        assert!(!inbox.push(4, 1));
        inbox.reset(3);
        assert!(inbox.push(3, 2));
        assert_eq!(inbox.pop(3), Some(2));
    }

    #[test]
    fn a_segment_of_another_size_is_refused() {
        let big = SharedRegion::create("t", INBOX_SEGMENT_BYTES + 4096).unwrap();
        assert!(Inbox::map(big.fd().try_clone_to_owned().unwrap()).is_err());
        let owner = Inbox::create().unwrap();
        let producer = Inbox::map(owner.fd().try_clone_to_owned().unwrap()).unwrap();
        assert!(producer.push(0, 9));
        assert_eq!(owner.pop(0), Some(9));
    }

    #[test]
    fn wait_times_out_and_returns_for_entries() {
        let inbox = Inbox::create().unwrap();
        let t = std::time::Instant::now();
        inbox.wait(1, Some(Duration::from_millis(50)));
        assert!(t.elapsed() >= Duration::from_millis(45));
        inbox.push(1, 3);
        let t = std::time::Instant::now();
        inbox.wait(1, Some(Duration::from_secs(10)));
        assert!(t.elapsed() < Duration::from_secs(5));
    }
}
