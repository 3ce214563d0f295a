//! A process's doorbells: one futex word per CQ index, in a segment that
//! every connected peer maps writable, on which the owner's threads sleep
//! in `VipCQWait`.
//!
//! The entries themselves travel in inboxes ([`crate::inbox`]), one per
//! producer; the bell only says "look again".  A peer that scribbles on a
//! word can only wake the owner for nothing: the owner re-checks its
//! inboxes after every wake-up and sleeps with a bound.

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::time::Duration;

use crate::futex::{futex_wait, futex_wake};
use crate::inbox::INBOXES;
use crate::layout::{at, CacheLine};
use crate::SharedRegion;

/// Size of a bell segment: one cache line per CQ index.
pub const BELL_SEGMENT_BYTES: usize = INBOXES * std::mem::size_of::<CacheLine<AtomicU32>>();

const _: () = assert!(BELL_SEGMENT_BYTES.is_multiple_of(4096));

/// A mapped bell segment, as its owner or as a peer.
pub struct Bell {
    region: SharedRegion,
}

impl Bell {
    /// Creates and maps a fresh segment (for its owner).
    pub fn create() -> io::Result<Bell> {
        Ok(Bell { region: SharedRegion::create("openvia-bell", BELL_SEGMENT_BYTES)? })
    }

    /// Maps a peer's segment; anything but a sealed memfd of exactly
    /// [`BELL_SEGMENT_BYTES`] is refused before it is mapped.
    pub fn map(fd: OwnedFd) -> io::Result<Bell> {
        Ok(Bell { region: SharedRegion::map_exact(fd, BELL_SEGMENT_BYTES)? })
    }

    /// The memfd, to hand to peers.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.region.fd()
    }

    fn word(&self, index: usize) -> Option<&AtomicU32> {
        // SAFETY: index < INBOXES keeps the cache line inside the checked region.
        (index < INBOXES).then(|| unsafe { &at::<CacheLine<AtomicU32>>(self.region.as_ptr(), index * 64).0 })
    }

    /// The word's value now: read it before checking the inboxes, then
    /// [`Bell::wait`] with it.
    pub fn seq(&self, index: usize) -> u32 {
        self.word(index).map_or(0, |w| w.load(SeqCst))
    }

    /// Bumps the word of `index` and wakes every thread sleeping on it.
    pub fn ring(&self, index: usize) {
        if let Some(w) = self.word(index) {
            w.fetch_add(1, SeqCst);
            futex_wake(w, i32::MAX);
        }
    }

    /// Sleeps until the word of `index` moves from `seq`, it is rung, or
    /// `timeout` passes; spurious returns are possible.
    pub fn wait(&self, index: usize, seq: u32, timeout: Option<Duration>) {
        if let Some(w) = self.word(index) {
            futex_wait(w, seq, timeout);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_ends_a_wait_and_out_of_range_is_nothing() {
        let bell = Bell::create().unwrap();
        let t = std::time::Instant::now();
        bell.wait(3, bell.seq(3), Some(Duration::from_millis(30)));
        assert!(t.elapsed() >= Duration::from_millis(25));
        let seq = bell.seq(3);
        bell.ring(3);
        let t = std::time::Instant::now();
        bell.wait(3, seq, Some(Duration::from_secs(10)));
        assert!(t.elapsed() < Duration::from_secs(5));
        bell.ring(INBOXES);
        bell.wait(INBOXES, 0, Some(Duration::from_secs(10)));
        assert_eq!(bell.seq(INBOXES), 0);
        let other = SharedRegion::create("t", BELL_SEGMENT_BYTES + 4096).unwrap();
        assert!(Bell::map(other.fd().try_clone_to_owned().unwrap()).is_err());
    }
}
