//! Completion-queue inboxes: one bounded queue of u64 entries per CQ
//! index, pushed by several threads (multi-producer, lock-free) and popped
//! by the owner.
//!
//! A process has one private inbox for the completions its own threads
//! make, and one *lane* per peer process it is connected to: an inbox
//! segment that only it and that peer map, into which the peer pushes the
//! completions it makes for this process.  A peer can so write nothing but
//! its own lane: forge, stall or corrupt entries there, never another
//! peer's or this process's own.  Nobody sleeps on an inbox itself: the
//! owner sleeps on its [`Bell`](crate::bell::Bell), which a producer rings
//! when the queue it pushed into says the owner may be asleep.
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

use crate::bell::Bell;
use crate::layout::{at, CacheLine};
use crate::SharedRegion;

/// Queues per segment: one per CQ index.
pub const INBOXES: usize = 256;
/// Entries per queue.
pub const INBOX_ENTRIES: usize = 4096;

#[repr(C)]
struct InboxCtl {
    enqueue: CacheLine<AtomicU64>,
    /// Threads of the owner that may be asleep on this queue's bell.
    sleeping: CacheLine<AtomicU32>,
    overflow: CacheLine<AtomicU32>,
}

#[repr(C)]
struct Cell {
    seq: AtomicU64,
    data: AtomicU64,
}

const CTL_BYTES: usize = size_of::<InboxCtl>();
/// Bytes of one queue: its control lines (the enqueue position first), then its cells.
pub const QUEUE_BYTES: usize = CTL_BYTES + INBOX_ENTRIES * size_of::<Cell>();
/// Size of an inbox segment.
pub const INBOX_SEGMENT_BYTES: usize = INBOXES * QUEUE_BYTES;
/// Bound on a producer's retries against a segment that keeps changing.
const PUSH_RETRIES: usize = 1 << 20;

const _: () = assert!(INBOX_ENTRIES.is_power_of_two() && QUEUE_BYTES.is_multiple_of(64));
const _: () = assert!(INBOX_SEGMENT_BYTES.is_multiple_of(4096));

/// A mapped inbox segment (the private inbox or a lane), as its owner or as a producer.
pub struct Inbox {
    region: SharedRegion,
    /// The owner's read positions, one per queue.
    dequeue: Box<[AtomicU64]>,
}

impl Inbox {
    /// Creates and maps a fresh private inbox (its fd is never handed to
    /// anyone).  Its pages are allocated queue by queue, when a CQ claims
    /// its index: [`Inbox::reset`] writes the whole queue then, so the
    /// data path takes no page fault, and a NIC with a few CQs holds a few
    /// queues' pages rather than all 16 MiB.
    pub fn create() -> io::Result<Inbox> {
        Self::wrap(SharedRegion::create_lazy("openvia-inbox", INBOX_SEGMENT_BYTES)?)
    }

    /// Creates a lane, for one peer to push into: its pages are allocated
    /// as the queues of the CQs that exist are used.
    pub fn create_lane() -> io::Result<Inbox> {
        Self::wrap(SharedRegion::create_lazy("openvia-lane", INBOX_SEGMENT_BYTES)?)
    }

    /// Maps a lane received from its owner (to push into it); anything but
    /// a sealed memfd of exactly [`INBOX_SEGMENT_BYTES`] is refused before
    /// it is mapped.
    pub fn map(fd: OwnedFd) -> io::Result<Inbox> {
        Self::wrap(SharedRegion::map_exact_lazy(fd, INBOX_SEGMENT_BYTES)?)
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

    /// Pushes `entry` into queue `index` and rings `bell` if the owner may
    /// be asleep on it.  Returns false when the queue is full (and then
    /// sets its overflow flag, and rings), when `index` is out of range, or
    /// when the segment is corrupt.
    pub fn push_and_ring(&self, bell: &Bell, index: usize, entry: u64) -> bool {
        let pushed = self.push(index, entry);
        self.ring_if_asleep(bell, index);
        pushed
    }

    /// Rings `bell` if the owner may be asleep on queue `index`, after
    /// entries were pushed with [`Inbox::push`]; the pair of the two is
    /// [`Inbox::push_and_ring`].
    pub fn ring_if_asleep(&self, bell: &Bell, index: usize) {
        if let Some(ctl) = self.ctl(index) {
            // Pairs with the fence in `begin_sleep`: either we see the
            // sleeper or it sees the entry.
            fence(SeqCst);
            if ctl.sleeping.load(SeqCst) != 0 {
                bell.ring(index);
            }
        }
    }

    /// Pushes `entry` into queue `index`, as [`Inbox::push_and_ring`] but
    /// ringing nothing.
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
                        return true;
                    }
                    Err(now) => pos = now,
                }
            } else if diff < 0 {
                // The cell still holds an entry from the previous lap.
                ctl.overflow.store(1, SeqCst);
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

    /// Owner: reads and clears the overflow flag of queue `index`.  Read
    /// first: a poll asks on every call, and only a set flag is worth the
    /// atomic exchange.
    pub fn take_overflow(&self, index: usize) -> bool {
        self.ctl(index).is_some_and(|c| c.overflow.load(Acquire) != 0 && c.overflow.swap(0, SeqCst) != 0)
    }

    /// Owner: says that a thread may sleep on queue `index`'s bell, so
    /// that producers ring it.  Then check [`Inbox::ready`] before sleeping,
    /// and call [`Inbox::end_sleep`] after.
    pub fn begin_sleep(&self, index: usize) {
        if let Some(ctl) = self.ctl(index) {
            ctl.sleeping.fetch_add(1, SeqCst);
        }
        fence(SeqCst);
    }

    /// Owner: the thread of [`Inbox::begin_sleep`] is awake again.
    pub fn end_sleep(&self, index: usize) {
        if let Some(ctl) = self.ctl(index) {
            ctl.sleeping.fetch_sub(1, SeqCst);
        }
    }

    /// Owner: whether an entry or an overflow waits in queue `index`.
    pub fn ready(&self, index: usize) -> bool {
        let Some(ctl) = self.ctl(index) else { return false };
        let pos = self.dequeue[index].load(Relaxed);
        let (cell, i) = self.cell(index, pos);
        cell.seq.load(SeqCst).wrapping_add(i) == pos.wrapping_add(1) || ctl.overflow.load(SeqCst) != 0
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
        ctl.sleeping.store(0, Relaxed);
        self.dequeue[index].store(0, Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

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
        inbox.begin_sleep(INBOXES);
        inbox.end_sleep(INBOXES);
        assert!(!inbox.ready(INBOXES));
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
    fn a_push_rings_the_bell_only_while_the_owner_may_sleep() {
        let owner = Inbox::create_lane().unwrap();
        let producer = Inbox::map(owner.fd().try_clone_to_owned().unwrap()).unwrap();
        let bell = Bell::create().unwrap();
        let rung = |bell: &Bell, before: u32| bell.seq(1) != before;
        let before = bell.seq(1);
        assert!(producer.push_and_ring(&bell, 1, 3));
        assert!(!rung(&bell, before), "nobody sleeps: no ring");
        assert!(owner.ready(1));
        assert_eq!(owner.pop(1), Some(3));
        assert!(!owner.ready(1));
        owner.begin_sleep(1);
        let before = bell.seq(1);
        assert!(producer.push_and_ring(&bell, 1, 4));
        assert!(rung(&bell, before));
        owner.end_sleep(1);
        // A full queue rings too, and says so.
        owner.begin_sleep(2);
        for i in 0..INBOX_ENTRIES as u64 {
            assert!(producer.push(2, i));
        }
        let before = bell.seq(2);
        assert!(!producer.push_and_ring(&bell, 2, 9));
        assert!(rung(&bell, before));
        assert!(owner.take_overflow(2));
        owner.end_sleep(2);
    }

    #[test]
    fn the_owner_sleeps_until_a_producer_rings() {
        let owner = Inbox::create_lane().unwrap();
        let producer = Inbox::map(owner.fd().try_clone_to_owned().unwrap()).unwrap();
        let bell = Bell::create().unwrap();
        let peer_bell = Bell::map(bell.fd().try_clone_to_owned().unwrap()).unwrap();
        let t = std::time::Instant::now();
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(50));
                producer.push_and_ring(&peer_bell, 5, 1);
            });
            loop {
                let seq = bell.seq(5);
                owner.begin_sleep(5);
                if !owner.ready(5) {
                    bell.wait(5, seq, Some(Duration::from_secs(10)));
                }
                owner.end_sleep(5);
                if let Some(v) = owner.pop(5) {
                    assert_eq!(v, 1);
                    break;
                }
            }
        });
        assert!(t.elapsed() < Duration::from_secs(5));
    }
}
