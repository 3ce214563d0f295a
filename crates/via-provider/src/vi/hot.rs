//! The lines a VI's next message touches, kept as addresses so that a CQ
//! poll that names the VI starts fetching them all at once, before the
//! application calls `VipRecvDone` and `VipPostSend`.
//!
//! With a few VIs these lines stay in the caches.  With a thousand on one
//! CQ they are out of them, and the receive and the answer would walk
//! them one miss after another (the VI, its queues' items, the ring, the
//! segment's counters, the counter row, the receive's descriptor and
//! buffer); fetched together the misses overlap.  The addresses are
//! hints: a prefetch reads nothing and never faults, so a stale one (a
//! queue grown, a segment unmapped, a buffer deregistered) costs a wasted
//! fetch, never a wrong result.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// Where a line of a connected VI is for its whole connection.
#[derive(Clone, Copy)]
pub(crate) enum Fixed {
    /// The shared-memory connection (`transport::shm::Conn`).
    Conn,
    /// Its segment's view (`via_shm::conn::ConnSegment`).
    Segment,
    /// The segment's control lines (`ConnSegment::control_lines`).
    Control0,
    Control1,
    Control2,
    /// The VI's counter row, which both work queues add to.
    Row,
}

const FIXED: usize = Fixed::Row as usize + 1;

/// A VI's hot lines: the four that move with every message first.
#[derive(Default)]
#[repr(C)]
pub(crate) struct HotLines {
    /// The ring slot of the next message (`Ring::next_slot`).
    pub rx_slot: AtomicUsize,
    /// The ring slot the VI's next send writes (`Ring::next_push_slot`):
    /// an application that took a message on a VI often answers on it.
    pub tx_slot: AtomicUsize,
    /// The receive queue's first pending item, which the next message completes.
    pub recv_front: AtomicUsize,
    /// That receive's descriptor and first buffer, in the application's
    /// memory: the completion is written into the one, the bytes into the
    /// other, and the application reads both next.
    pub recv_desc: AtomicUsize,
    pub recv_buffer: AtomicUsize,
    /// Where the send queue's next item goes.
    pub send_back: AtomicUsize,
    fixed: [AtomicUsize; FIXED],
}

impl HotLines {
    /// Records where `line` is (0: nowhere).
    pub fn set(&self, line: Fixed, addr: *const u8) {
        self.fixed[line as usize].store(addr as usize, Relaxed);
    }

    /// Where `line` is (0: nowhere).
    #[cfg(test)]
    pub fn get(&self, line: Fixed) -> usize {
        self.fixed[line as usize].load(Relaxed)
    }

    /// Records the segment's control lines.
    pub fn set_control(&self, lines: [*const u8; 3]) {
        let places = [Fixed::Control0, Fixed::Control1, Fixed::Control2];
        for (place, addr) in places.into_iter().zip(lines) {
            self.set(place, addr);
        }
    }

    /// Forgets the connection's lines.
    pub fn clear_connection(&self) {
        self.rx_slot.store(0, Relaxed);
        self.tx_slot.store(0, Relaxed);
        for w in &self.fixed[..Fixed::Row as usize] {
            w.store(0, Relaxed);
        }
    }

    /// Starts fetching the `len` bytes of the VI at `vi` and every line
    /// recorded.
    pub fn prefetch(&self, vi: *const u8, len: usize) {
        for offset in (0..len).step_by(64) {
            prefetch(vi.wrapping_add(offset) as usize);
        }
        prefetch(self.rx_slot.load(Relaxed));
        prefetch(self.tx_slot.load(Relaxed));
        // A queue item may straddle two lines.
        for item in [self.recv_front.load(Relaxed), self.send_back.load(Relaxed)] {
            if item != 0 {
                prefetch(item);
                prefetch(item.wrapping_add(64));
            }
        }
        prefetch(self.recv_desc.load(Relaxed));
        prefetch(self.recv_buffer.load(Relaxed));
        for w in &self.fixed {
            prefetch(w.load(Relaxed));
        }
    }
}

/// Starts fetching the line at `addr` (nothing for 0).
#[inline(always)]
fn prefetch(addr: usize) {
    #[cfg(target_arch = "x86_64")]
    if addr != 0 {
        // SAFETY: a prefetch reads nothing and never faults.
        unsafe { core::arch::x86_64::_mm_prefetch(addr as *const i8, core::arch::x86_64::_MM_HINT_T0) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addr;
}
