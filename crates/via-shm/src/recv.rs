//! The receive-queue cache: the data segments of every receive descriptor a
//! process posted, published for the remote sender to take in order.
//!
//! Single producer (the receiver, `published`) and single consumer (the
//! remote sender, `taken`); like the ring, each side trusts only its own
//! counter and validates the other's, and reads it only when what it saw
//! last is used up, so a message moves only the writer's own line of
//! counters (in the segment's header, `layout::Counters`) and never the peer's.
//! A sender that needs only a posted receive, not its buffers (an inline
//! send, an immediate), takes it without reading the entry
//! ([`RecvCache::take_seq`]).
//!
//! Entries are placed as a ring's messages are ([`Place`]): in a few hot
//! entries while the sender keeps up, else in the lap of `RECV_ENTRIES`.
//! Like a ring's slots, an entry is a *head* of one cache line (its stamp,
//! its count and its first `HEAD_SEGS` segments), with the heads together,
//! and a *body* with the rest of its segments: a connection whose receives
//! have a segment or three touches half a page of hot heads.

use std::mem::size_of;
use std::ptr::{self, addr_of, addr_of_mut, NonNull};
use std::sync::atomic::{AtomicU64, Ordering::*};

use crate::layout::{align_up, Consumed, Counters, Place, HOT};
use crate::ShmError;

/// Receives a cache holds (the entries of its lap); at least the deepest
/// receive queue (1024).
pub const RECV_ENTRIES: usize = 1024;
/// Most data segments of one receive descriptor.
pub const MAX_SEGS: usize = 32;

/// One data segment of a posted receive: an address in the receiver.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecvSeg {
    /// Virtual address in the receiving process.
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// The receiver's memory handle of the region it lies in: a sender
    /// checks it against the receiver's published registry before it
    /// copies, so that a region deregistered since the post gets nothing.
    pub handle: u32,
}

/// A validated copy of a published receive.
#[derive(Clone, Copy, Debug)]
pub struct RecvEntry {
    /// Sequence number: the n-th receive published on this cache.
    pub seq: u64,
    /// The segments; only the first `nsegs` are meaningful.
    pub segs: [RecvSeg; MAX_SEGS],
    /// Number of segments (at most `MAX_SEGS`).
    pub nsegs: u32,
    /// Sum of the segment lengths.
    pub total: u64,
}

impl RecvEntry {
    /// The meaningful segments.
    pub fn segs(&self) -> &[RecvSeg] {
        &self.segs[..(self.nsegs as usize).min(MAX_SEGS)]
    }
}

#[repr(C)]
struct RawSeg {
    addr: u64,
    len: u32,
    handle: u32,
}

/// Segments in an entry's head.
const HEAD_SEGS: usize = 3;

/// An entry's head: one cache line.
#[repr(C)]
struct RawHead {
    /// The entry's sequence number + 1, so that no zeroed entry is one.
    stamp: u64,
    nsegs: u32,
    _pad: u32,
    segs: [RawSeg; HEAD_SEGS],
}

/// An entry's body: the segments after its head's.
type RawBody = [RawSeg; MAX_SEGS - HEAD_SEGS];

pub(crate) const HEAD_BYTES: usize = size_of::<RawHead>();
const BODY_BYTES: usize = align_up(size_of::<RawBody>(), 64);
/// Entries of a cache: the hot ones, then the lap ([`Place::index`]).
const ENTRIES: usize = HOT + RECV_ENTRIES;
/// Bytes of a cache's hot part, which a connection keeps with the other
/// hot parts in the first pages of its segment: the hot entries' heads.
pub(crate) const CACHE_HOT_BYTES: usize = HOT * HEAD_BYTES;
/// Where the bodies start in the rest: after the lap's heads.
const BODIES: usize = RECV_ENTRIES * HEAD_BYTES;
/// Bytes of the rest of a cache: the heads of the lap, then every entry's
/// body, the hot ones first.  (Its two counters are in the segment's
/// header, `layout::Counters`.)
pub(crate) const CACHE_REST_BYTES: usize = BODIES + ENTRIES * BODY_BYTES;

const _: () = assert!(RECV_ENTRIES.is_power_of_two());
const _: () = assert!(HEAD_BYTES == 64);

/// One receive-queue cache.  The publisher serializes `publish`; the taker
/// serializes `take`.
pub struct RecvCache {
    /// The hot part (`CACHE_HOT_BYTES`).
    hot: NonNull<u8>,
    /// The rest (`CACHE_REST_BYTES`).
    rest: NonNull<u8>,
    publisher: bool,
    /// The shared `published` (produced) and `taken` (consumed).
    counters: Counters,
    /// The publisher's own count.
    published: AtomicU64,
    /// The taker's own count.
    taken: AtomicU64,
    /// Taker side: the publisher's count as last read and validated.
    seen: AtomicU64,
    /// Publisher side: the taker's count as last read.
    consumed: Consumed,
}

// SAFETY: `hot` and `rest` point into a mapping owned by the ConnSegment
// that owns this cache; shared words are atomics and entries are volatile copies.
unsafe impl Send for RecvCache {}
// SAFETY: as above.
unsafe impl Sync for RecvCache {}

impl RecvCache {
    /// # Safety
    /// `hot` must point to `CACHE_HOT_BYTES` and `rest` to
    /// `CACHE_REST_BYTES` of a mapping, 64-byte aligned, apart, that
    /// outlive the cache, as must the words of `counters`.
    pub(crate) unsafe fn new(hot: *mut u8, rest: *mut u8, publisher: bool, counters: Counters) -> RecvCache {
        RecvCache {
            hot: NonNull::new_unchecked(hot),
            rest: NonNull::new_unchecked(rest),
            publisher,
            counters,
            published: AtomicU64::new(0),
            taken: AtomicU64::new(0),
            seen: AtomicU64::new(0),
            consumed: Consumed::new(),
        }
    }

    /// The head of the entry at `index` ([`Place::index`]).
    fn head(&self, index: usize) -> *mut RawHead {
        let index = index.min(ENTRIES - 1);
        // SAFETY: a hot entry's head is in the hot part, a lap entry's
        // (index - HOT < RECV_ENTRIES) at the start of the rest.
        unsafe {
            match index < HOT {
                true => self.hot.as_ptr().add(index * HEAD_BYTES).cast(),
                false => self.rest.as_ptr().add((index - HOT) * HEAD_BYTES).cast(),
            }
        }
    }

    /// Segment `i` (< `MAX_SEGS`) of the entry at `index`: in its head or
    /// its body.
    fn seg(&self, index: usize, i: usize) -> *mut RawSeg {
        let head = self.head(index);
        if i < HEAD_SEGS {
            // SAFETY: `head` is a head inside the cache, `i` indexes its segments.
            return unsafe { addr_of_mut!((*head).segs[i]) };
        }
        // SAFETY: index < ENTRIES: a body after the heads; i - HEAD_SEGS <
        // MAX_SEGS - HEAD_SEGS indexes its segments.
        unsafe {
            let body: *mut RawBody = self.rest.as_ptr().add(BODIES + index.min(ENTRIES - 1) * BODY_BYTES).cast();
            addr_of_mut!((*body)[i - HEAD_SEGS])
        }
    }

    /// Receiver side: publishes one posted receive; returns its sequence
    /// number.  Errors: `TooManySegments`, `Full` when `RECV_ENTRIES` are
    /// outstanding, `Corrupt` when the peer's `taken` is impossible.
    pub fn publish<I>(&self, segs: I) -> Result<u64, ShmError>
    where
        I: IntoIterator<Item = RecvSeg>,
        I::IntoIter: ExactSizeIterator,
    {
        let segs = segs.into_iter();
        if segs.len() > MAX_SEGS {
            return Err(ShmError::TooManySegments);
        }
        let seq = self.published.load(Relaxed);
        let taken = || self.counters.consumed().load(Acquire);
        let place = self.consumed.place(seq, RECV_ENTRIES, taken, "receive cache taken")?;
        let index = place.index();
        let e = self.head(index);
        // SAFETY: `e` is a head inside the cache; at most MAX_SEGS are written.
        unsafe {
            addr_of_mut!((*e).stamp).write_volatile(seq.wrapping_add(1));
            let mut n = 0;
            for (i, s) in segs.take(MAX_SEGS).enumerate() {
                let raw = self.seg(index, i);
                addr_of_mut!((*raw).addr).write_volatile(s.addr);
                addr_of_mut!((*raw).len).write_volatile(s.len);
                addr_of_mut!((*raw).handle).write_volatile(s.handle);
                n = i + 1;
            }
            addr_of_mut!((*e).nsegs).write_volatile(n as u32);
        }
        let next = seq.wrapping_add(1);
        self.published.store(next, Relaxed);
        self.counters.produced().store(next, Release);
        Ok(seq)
    }

    /// Sender side: the sequence number of the next published receive, if
    /// there is one (not consumed).
    fn next(&self) -> Result<Option<u64>, ShmError> {
        let seq = self.taken.load(Relaxed);
        let seen = self.seen.load(Relaxed);
        if seq == seen {
            let published = self.counters.produced().load(Acquire);
            let avail = published.wrapping_sub(seq);
            if avail > RECV_ENTRIES as u64 {
                return Err(ShmError::Corrupt("receive cache published"));
            }
            if avail == 0 {
                return Ok(None);
            }
            self.seen.store(published, Relaxed);
        }
        Ok(Some(seq))
    }

    fn consume(&self, seq: u64) {
        let next = seq.wrapping_add(1);
        self.taken.store(next, Relaxed);
        self.counters.consumed().store(next, Release);
    }

    /// Sender side: takes the next published receive without reading its
    /// segments; returns its sequence number, or `None` if there is none.
    pub fn take_seq(&self) -> Result<Option<u64>, ShmError> {
        let Some(seq) = self.next()? else {
            return Ok(None);
        };
        self.consume(seq);
        Ok(Some(seq))
    }

    /// Sender side: takes the next published receive, or `None` if there is
    /// none.  `Corrupt` (and nothing consumed) when the entry is impossible.
    pub fn take(&self) -> Result<Option<RecvEntry>, ShmError> {
        let Some(seq) = self.next()? else {
            return Ok(None);
        };
        // SAFETY: entries inside the cache; `seq` is a plain integer.
        let holds = |i: usize| unsafe { addr_of!((*self.head(i)).stamp).read_volatile() } == seq.wrapping_add(1);
        let [hot, lap] = Place::candidates(seq, RECV_ENTRIES).map(Place::index);
        let index = if holds(hot) {
            hot
        } else if holds(lap) {
            lap
        } else {
            return Err(ShmError::Corrupt("receive entry sequence"));
        };
        let e = self.head(index);
        let mut out = RecvEntry { seq, segs: [RecvSeg::default(); MAX_SEGS], nsegs: 0, total: 0 };
        // SAFETY: `e` is a head inside the cache; fields are plain integers
        // and the segment index is bounded by MAX_SEGS before use.
        unsafe {
            out.nsegs = addr_of!((*e).nsegs).read_volatile();
            if out.nsegs as usize > MAX_SEGS {
                return Err(ShmError::Corrupt("receive entry segment count"));
            }
            for i in 0..out.nsegs as usize {
                let raw = ptr::read_volatile(self.seg(index, i));
                out.segs[i] = RecvSeg { addr: raw.addr, len: raw.len, handle: raw.handle };
                out.total =
                    out.total.checked_add(u64::from(raw.len)).ok_or(ShmError::Corrupt("receive entry length"))?;
            }
        }
        self.consume(seq);
        Ok(Some(out))
    }

    /// Receives published and not yet taken, from this side's view, clamped
    /// to `RECV_ENTRIES`.
    pub fn available(&self) -> u64 {
        self.published().wrapping_sub(self.taken()).min(RECV_ENTRIES as u64)
    }

    /// Receives published so far (the peer's unvalidated count on the taker side).
    pub fn published(&self) -> u64 {
        if self.publisher {
            self.published.load(Relaxed)
        } else {
            self.counters.produced().load(Acquire)
        }
    }

    /// Receives taken so far (the peer's unvalidated count on the publisher side).
    pub fn taken(&self) -> u64 {
        if self.publisher {
            self.counters.consumed().load(Acquire)
        } else {
            self.taken.load(Relaxed)
        }
    }
}
