//! Helpers for laying out structures inside a shared mapping.

use std::ops::Deref;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::ShmError;

/// A value alone on its own 64-byte cache line, so that words written by
/// different processes never share a line.
#[repr(C, align(64))]
pub(crate) struct CacheLine<T>(pub(crate) T);

impl<T> Deref for CacheLine<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// Rounds `n` up to a multiple of `align`.
pub(crate) const fn align_up(n: usize, align: usize) -> usize {
    n.div_ceil(align) * align
}

/// A reference to the `T` at `base + offset`.
///
/// # Safety
/// The bytes must lie inside a live mapping that outlives `'a`, be aligned
/// for `T`, and `T` must be valid for any bit pattern and only mutated
/// through interior mutability (atomics).
pub(crate) unsafe fn at<'a, T>(base: *mut u8, offset: usize) -> &'a T {
    &*base.add(offset).cast::<T>()
}

/// Where the two shared counters of a ring or a receive cache are: the
/// producer's count and the consumer's, each in the line of counters that
/// its side writes as messages move (`conn::SideCounters`), so that a
/// message moves one line of counters on each side, not one per counter.
#[derive(Clone, Copy)]
pub(crate) struct Counters {
    produced: NonNull<AtomicU64>,
    consumed: NonNull<AtomicU64>,
}

impl Counters {
    /// # Safety
    /// Both words must lie in a live mapping that outlives every user of
    /// the counters, 8-byte aligned.
    pub(crate) unsafe fn new(produced: &AtomicU64, consumed: &AtomicU64) -> Counters {
        Counters { produced: NonNull::from(produced), consumed: NonNull::from(consumed) }
    }

    /// The producer's count: a ring's head, a cache's `published`.
    pub(crate) fn produced(&self) -> &AtomicU64 {
        // SAFETY: see `new`.
        unsafe { self.produced.as_ref() }
    }

    /// The consumer's count: a ring's tail, a cache's `taken`.
    pub(crate) fn consumed(&self) -> &AtomicU64 {
        // SAFETY: see `new`.
        unsafe { self.consumed.as_ref() }
    }
}

/// Hot places in front of a ring's lap (and of a receive cache's).
///
/// Item `n` of a ring goes to hot place `n % HOT` while the consumer is
/// fewer than `HOT` items behind, else to its place `n % lap` in the lap.
/// A connection whose consumer keeps up, as in a ping-pong, so reuses a
/// few cache lines and pages instead of sweeping the whole lap (over a
/// megabyte per direction), which 128 connections could not keep in any
/// cache.  Either place is free: everything before `n - HOT` (`n - lap`)
/// has been consumed.
pub(crate) const HOT: usize = 32;

/// Where an item lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Place {
    /// Index among the hot places.
    Hot(usize),
    /// Index in the lap.
    Lap(usize),
}

impl Place {
    /// Producer: where item `n` goes when everything before `consumed` has
    /// been consumed; `None` when the ring holds `lap` items already.
    pub(crate) fn for_item(n: u64, consumed: u64, lap: usize) -> Option<Place> {
        let behind = n.wrapping_sub(consumed);
        if behind < HOT as u64 {
            Some(Place::Hot(n as usize % HOT))
        } else if behind < lap as u64 {
            Some(Place::Lap(n as usize % lap))
        } else {
            None
        }
    }

    /// The two places item `n` may be in, the hot one first.
    pub(crate) fn candidates(n: u64, lap: usize) -> [Place; 2] {
        [Place::Hot(n as usize % HOT), Place::Lap(n as usize % lap)]
    }

    /// The place's index in an array of the `HOT` places followed by the lap.
    pub(crate) fn index(self) -> usize {
        match self {
            Place::Hot(i) => i,
            Place::Lap(i) => HOT + i,
        }
    }
}

/// A producer's view of how far its consumer has got, and where its next
/// item goes: shared by the rings and the receive caches.
pub(crate) struct Consumed {
    /// The consumer's count as last read and validated.
    seen: AtomicU64,
    /// The producer's count at which to look again while the consumer is behind.
    next_look: AtomicU64,
}

impl Consumed {
    pub(crate) const fn new() -> Consumed {
        Consumed { seen: AtomicU64::new(0), next_look: AtomicU64::new(0) }
    }

    /// Where item `n` of a ring with `lap` places goes.  The consumer's
    /// count is read (`read`) only when the hot places known to be free ran
    /// out, and while the consumer stays behind, once per `HOT` items.
    /// Errors: `Corrupt(what)` when that count is impossible, `Full` when
    /// the consumer is `lap` behind.
    pub(crate) fn place(
        &self,
        n: u64,
        lap: usize,
        read: impl FnOnce() -> u64,
        what: &'static str,
    ) -> Result<Place, ShmError> {
        let seen = self.seen.load(Relaxed);
        let behind = n.wrapping_sub(seen);
        if behind < HOT as u64 {
            // The usual case, a consumer that keeps up: a hot place known free.
            return Ok(Place::Hot(n as usize % HOT));
        }
        if behind >= lap as u64 || n >= self.next_look.load(Relaxed) {
            let consumed = read();
            if consumed.wrapping_sub(seen) > behind {
                return Err(ShmError::Corrupt(what));
            }
            self.seen.store(consumed, Relaxed);
            // Still behind: the lap it is, for the next HOT items.
            let still_behind = n.wrapping_sub(consumed) >= HOT as u64;
            self.next_look.store(if still_behind { n.wrapping_add(HOT as u64) } else { n }, Relaxed);
        }
        Place::for_item(n, self.seen.load(Relaxed), lap).ok_or(ShmError::Full)
    }
}
