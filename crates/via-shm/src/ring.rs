//! A single-producer single-consumer ring of fixed-size slots in a
//! connection segment: one direction of a connection.
//!
//! `head` (written by the producer) and `tail` (written by the consumer) are
//! monotonically increasing u64 counters, each in its side's line of
//! counters in the segment's header (`layout::Counters`).  Each side keeps its
//! own counter in process memory and only trusts that copy; the peer's
//! counter is validated on every read.
//!
//! Message `n` goes to hot slot `n % HOT` while the consumer keeps up, else
//! to slot `n % RING_SLOTS` of the lap ([`Place`]): a connection in
//! ping-pong reuses a few slots that stay in cache.
//!
//! A message moves in one cache line when it is small: the consumer polls
//! the *stamp* at the end of the hot slot's header (message number + 1,
//! written last), and the first payload bytes share that line, the slot's
//! *head*.  The heads lie together, apart from the slots' *bodies* (the rest
//! of their payload): the 32 hot heads of a direction fill half a page, so
//! that a connection exchanging small messages touches one page of each
//! ring, not the nine its hot slots would span whole, and a thousand such
//! connections stay within the TLB's reach.  Neither
//! side reads the other's counter on the way: the producer looks at `tail`
//! only when the hot slots it knows to be free run out, and the consumer
//! never reads `head`: when the hot slot has nothing, it looks at `lapped`,
//! which only a message put in the lap changes.

use std::mem::size_of;
use std::ptr::{self, NonNull};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering::*};
use std::time::Duration;

use crate::futex::{futex_wait, futex_wake};
use crate::layout::{at, CacheLine, Consumed, Counters, Place, HOT};
use crate::ShmError;

/// Messages a ring holds (the slots of its lap); at least the deepest
/// receive queue (1024).
pub const RING_SLOTS: usize = 1024;
/// Bytes per slot: its head (a 48-byte header and 16 payload bytes) and
/// its body (the rest of `INLINE_MAX` payload bytes, rounded up).
pub const SLOT_BYTES: usize = HEAD_BYTES + BODY_BYTES;
/// Largest payload carried inline in a slot.
pub const INLINE_MAX: usize = 1024;
/// Slot kind: a send, its payload inline or already written by CMA.
pub const SLOT_SEND: u32 = 1;
/// Slot kind: an RDMA write with immediate data, consuming a receive.
pub const SLOT_RDMA_WRITE_IMM: u32 = 2;
/// Slot kind: an error report to the peer.
pub const SLOT_ERROR: u32 = 3;
/// Slot kind: a later piece of a send carried through the ring, `aux`
/// bytes into the message (its first piece is a `SLOT_SEND`).  Used where
/// the sender may not cross-memory attach to the receiver.
pub const SLOT_SEND_PIECE: u32 = 4;
/// Slot kind: the header of an RDMA write carried through the ring, where
/// the initiator may not cross-memory attach to the target.  `length` is
/// the write's length; its payload names the target's memory (address and
/// memory handle, [`RDMA_TARGET_BYTES`]), which the target checks against
/// its own registry.  With immediate data it consumes receive `recv_seq`.
pub const SLOT_RDMA_WRITE: u32 = 5;
/// Slot kind: a piece of the data of an RDMA write carried through the
/// ring, `aux` bytes into the write (after its `SLOT_RDMA_WRITE`).
pub const SLOT_RDMA_PIECE: u32 = 6;
/// Slot kind: an RDMA read request carried through the ring, where the
/// initiator may not cross-memory attach to the target.  `length` is the
/// read's length, `recv_seq` the initiator's number for it; its payload
/// names the target's memory as a `SLOT_RDMA_WRITE`'s does
/// ([`RDMA_TARGET_BYTES`]), which the target checks against its own
/// registry.  The target answers through its own ring.
pub const SLOT_RDMA_READ: u32 = 7;
/// Slot kind: a piece of the answer to a `SLOT_RDMA_READ`, in the target's
/// ring: `recv_seq` and `length` are the request's, `aux` how far into the
/// read the piece is.  With `status` 0 the payload is the bytes (none only
/// for a read of 0 bytes); with `status` `VIP_STATUS_RDMA_PROT_ERROR` and
/// no payload the target refused the rest, and the answer ends.
pub const SLOT_RDMA_READ_PIECE: u32 = 8;
/// Payload bytes of a `SLOT_RDMA_WRITE` slot: the remote address (`u64`)
/// then the remote memory handle (`u32`), little-endian.
pub const RDMA_TARGET_BYTES: usize = 12;

/// A slot's head: the header, then the stamp (`u64`), then the first
/// `HEAD_PAYLOAD` bytes of the payload; its body holds the rest.
const STAMP_OFFSET: usize = 40;
const SLOT_HEADER_BYTES: usize = 48;
pub(crate) const HEAD_BYTES: usize = 64;
const HEAD_PAYLOAD: usize = HEAD_BYTES - SLOT_HEADER_BYTES;
const BODY_BYTES: usize = 1024;
/// `peeked` value when no slot has been peeked.
const NOT_PEEKED: u32 = u32::MAX;

/// The header of a slot.  The transport only interprets `inline_len`; the
/// other fields carry the provider's meaning.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotHeader {
    /// What the slot is (`SLOT_*`).
    pub kind: u32,
    /// Status to report with the completion.
    pub status: u32,
    /// Total bytes of the message (inline or moved by CMA).
    pub length: u32,
    /// Immediate data.
    pub imm: u32,
    /// Sequence number of the receive entry the message consumed.
    pub recv_seq: u64,
    /// Payload bytes inline in the slot; set by [`Ring::push`].
    pub inline_len: u32,
    /// Provider flags.
    pub flags: u32,
    /// Provider data.
    pub aux: u64,
}

/// The ring's control block, each word on its own cache line: the words
/// written when a side sleeps or wakes, or a message goes in the lap (the
/// counters, written by every message, are in the segment's header).
#[repr(C)]
struct RingCtl {
    /// Number of consumer threads asleep in `wait` (a flag for one consumer).
    sleeping: CacheLine<AtomicU32>,
    /// Bumped by the producer on every push; the consumer sleeps on it.
    futex: CacheLine<AtomicU32>,
    /// The number + 1 of the last message put in the lap, written after
    /// its stamp.
    lapped: CacheLine<AtomicU64>,
}

const CTL_BYTES: usize = size_of::<RingCtl>();
/// Slots of a ring: the hot ones, then the lap ([`Place::index`]).
const SLOTS: usize = HOT + RING_SLOTS;
/// Bytes of a ring's hot part, which a connection keeps with the other
/// hot parts in the first pages of its segment: the control block and
/// the hot slots' heads.
pub(crate) const RING_HOT_BYTES: usize = CTL_BYTES + HOT * HEAD_BYTES;
/// Where the bodies start in the rest: after the lap's heads.
const BODIES: usize = RING_SLOTS * HEAD_BYTES;
/// Bytes of the rest of a ring: the lap's heads, then every slot's body,
/// the hot ones first.
pub(crate) const RING_REST_BYTES: usize = BODIES + SLOTS * BODY_BYTES;

const _: () = assert!(RING_SLOTS.is_power_of_two());
const _: () = assert!(RING_HOT_BYTES.is_multiple_of(64) && BODIES.is_multiple_of(64) && BODY_BYTES.is_multiple_of(64));
const _: () = assert!(HEAD_PAYLOAD + BODY_BYTES >= INLINE_MAX);
const _: () = assert!(size_of::<SlotHeader>() <= STAMP_OFFSET && STAMP_OFFSET + 8 == SLOT_HEADER_BYTES);

/// One direction of a connection.  Callers serialize the producer side
/// (`push`) and the consumer side (`peek`, `read_payload`, `pop`).
pub struct Ring {
    /// The hot part (`RING_HOT_BYTES`).
    hot: NonNull<u8>,
    /// The rest (`RING_REST_BYTES`).
    rest: NonNull<u8>,
    producer: bool,
    /// The shared head (produced) and tail (consumed).
    counters: Counters,
    /// The producer's own head.
    head: AtomicU64,
    /// The consumer's own tail.
    tail: AtomicU64,
    /// Producer side: the consumer's tail as last read.
    consumed: Consumed,
    /// `inline_len` of the slot validated by the last `peek`.
    peeked: AtomicU32,
    /// Where that slot is ([`Place::index`]).
    peeked_at: AtomicU32,
}

// SAFETY: `hot` and `rest` point into a mapping owned by the ConnSegment
// that owns this ring; shared words are atomics and payloads are raw copies.
unsafe impl Send for Ring {}
// SAFETY: as above.
unsafe impl Sync for Ring {}

/// A slot's payload, `HEAD_PAYLOAD` bytes in its head and the rest in its
/// body, written or read in order.
struct SlotPayload {
    head: *mut u8,
    body: *mut u8,
    /// Payload bytes written or read so far.
    at: usize,
}

impl SlotPayload {
    fn new(head: *mut u8, body: *mut u8) -> SlotPayload {
        SlotPayload { head, body, at: 0 }
    }

    /// Where the next `n` bytes go: the rest of the head, the body.
    fn next(&mut self, n: usize) -> [(*mut u8, usize); 2] {
        let in_head = n.min(HEAD_PAYLOAD.saturating_sub(self.at));
        let in_head_from = SLOT_HEADER_BYTES + self.at.min(HEAD_PAYLOAD);
        let in_body_from = (self.at + in_head).saturating_sub(HEAD_PAYLOAD);
        self.at += n;
        [(self.head.wrapping_add(in_head_from), in_head), (self.body.wrapping_add(in_body_from), n - in_head)]
    }

    /// Appends `src`.
    ///
    /// # Safety
    /// The payload written so far and `src` are at most `INLINE_MAX` bytes.
    unsafe fn write(&mut self, src: &[u8]) {
        let mut from = src.as_ptr();
        for (to, n) in self.next(src.len()) {
            copy_bytes(from, to, n);
            from = from.add(n);
        }
    }

    /// Reads the next `dst.len()` bytes.
    ///
    /// # Safety
    /// The payload read so far and `dst` are at most `INLINE_MAX` bytes.
    unsafe fn read(&mut self, dst: &mut [u8]) {
        let mut to = dst.as_mut_ptr();
        for (from, n) in self.next(dst.len()) {
            copy_bytes(from, to, n);
            to = to.add(n);
        }
    }
}

/// `ptr::copy_nonoverlapping`, with the few bytes of a small message moved
/// by two overlapping loads and stores in place of a call into the C
/// library's `memcpy`, whose dispatch costs more than such a copy.
///
/// # Safety
/// As `ptr::copy_nonoverlapping(from, to, n)`.
#[inline(always)]
unsafe fn copy_bytes(from: *const u8, to: *mut u8, n: usize) {
    match n {
        0 => {}
        1..=3 => {
            for i in 0..n {
                *to.add(i) = *from.add(i);
            }
        }
        4..=7 => {
            let (a, b) = (from.cast::<u32>().read_unaligned(), from.add(n - 4).cast::<u32>().read_unaligned());
            to.cast::<u32>().write_unaligned(a);
            to.add(n - 4).cast::<u32>().write_unaligned(b);
        }
        8..=16 => {
            let (a, b) = (from.cast::<u64>().read_unaligned(), from.add(n - 8).cast::<u64>().read_unaligned());
            to.cast::<u64>().write_unaligned(a);
            to.add(n - 8).cast::<u64>().write_unaligned(b);
        }
        _ => ptr::copy_nonoverlapping(from, to, n),
    }
}

impl Ring {
    /// # Safety
    /// `hot` must point to `RING_HOT_BYTES` and `rest` to `RING_REST_BYTES`
    /// of a mapping, 64-byte aligned, apart, that outlive the ring, as must
    /// the words of `counters`.
    pub(crate) unsafe fn new(hot: *mut u8, rest: *mut u8, producer: bool, counters: Counters) -> Ring {
        Ring {
            hot: NonNull::new_unchecked(hot),
            rest: NonNull::new_unchecked(rest),
            producer,
            counters,
            head: AtomicU64::new(0),
            tail: AtomicU64::new(0),
            consumed: Consumed::new(),
            peeked: AtomicU32::new(NOT_PEEKED),
            peeked_at: AtomicU32::new(0),
        }
    }

    fn ctl(&self) -> &RingCtl {
        // SAFETY: the control block is at the start of the hot part (see `new`).
        unsafe { at(self.hot.as_ptr(), 0) }
    }

    /// The head of the slot at `index` ([`Place::index`], clamped).
    fn head_at(&self, index: usize) -> *mut u8 {
        let index = index.min(SLOTS - 1);
        // SAFETY: a hot slot's head is after the control block, a lap
        // slot's (index - HOT < RING_SLOTS) at the start of the rest.
        unsafe {
            match index < HOT {
                true => self.hot.as_ptr().add(CTL_BYTES + index * HEAD_BYTES),
                false => self.rest.as_ptr().add((index - HOT) * HEAD_BYTES),
            }
        }
    }

    /// The body of the slot at `index` ([`Place::index`], clamped).
    fn body_at(&self, index: usize) -> *mut u8 {
        // SAFETY: index < SLOTS: a body after the lap's heads.
        unsafe { self.rest.as_ptr().add(BODIES + index.min(SLOTS - 1) * BODY_BYTES) }
    }

    fn stamp(&self, place: Place) -> &AtomicU64 {
        self.stamp_in(self.head_at(place.index()))
    }

    /// The stamp in the slot head `head` (one of `head_at`'s).
    fn stamp_in(&self, head: *mut u8) -> &AtomicU64 {
        // SAFETY: the stamp is an aligned u64 inside the head.
        unsafe { at(head, STAMP_OFFSET) }
    }

    /// Consumer side: where message `tail` is, `None` if it has not come.
    /// A message announced by `lapped` with no slot of its stamp is corrupt.
    fn ready(&self, tail: u64) -> Result<Option<Place>, ShmError> {
        let stamped = |place: Place| self.stamp(place).load(Acquire) == tail.wrapping_add(1);
        let [hot, lap] = Place::candidates(tail, RING_SLOTS);
        if stamped(hot) {
            return Ok(Some(hot));
        }
        // Has the producer put this message, or a later one, in the lap?
        let ahead = self.ctl().lapped.load(Acquire).wrapping_sub(tail);
        if ahead == 0 || ahead > u64::MAX / 2 {
            return Ok(None);
        }
        if ahead > RING_SLOTS as u64 {
            return Err(ShmError::Corrupt("ring lapped"));
        }
        // The release of `lapped` covers the stamps of every message before it.
        let place = [hot, lap].into_iter().find(|&place| stamped(place)).ok_or(ShmError::Corrupt("slot stamp"))?;
        Ok(Some(place))
    }

    /// Producer side: copies `hdr` and the gathered `payload` (at most
    /// `INLINE_MAX` bytes in all) into the next slot and publishes it.
    ///
    /// `inline_len` is set to the payload size.  Errors: `Full` when the
    /// consumer is `RING_SLOTS` behind, `TooSmall` for a payload over
    /// `INLINE_MAX`, `Corrupt` when the peer's tail is impossible.
    pub fn push(&self, hdr: &SlotHeader, payload: &[&[u8]]) -> Result<(), ShmError> {
        self.push_gather(hdr, payload.iter().copied())
    }

    /// [`Ring::push`] with the payload's pieces from an iterator, which is
    /// walked twice: a sender gathers straight from its buffers, without a
    /// list of them to build and move first.
    pub fn push_gather<'a, I>(&self, hdr: &SlotHeader, payload: I) -> Result<(), ShmError>
    where
        I: Iterator<Item = &'a [u8]> + Clone,
    {
        self.push_gather_then(hdr, payload, || {})
    }

    /// As [`Ring::push_gather`], running `then` once the message is
    /// stamped and before the fence that looks for a sleeping consumer:
    /// stores `then` makes (the completion entry that names this message)
    /// travel beside the stamp instead of after it reached the consumer.
    /// Not run when the push fails.
    pub fn push_gather_then<'a, I>(&self, hdr: &SlotHeader, payload: I, then: impl FnOnce()) -> Result<(), ShmError>
    where
        I: Iterator<Item = &'a [u8]> + Clone,
    {
        let total = payload
            .clone()
            .try_fold(0usize, |acc, p| acc.checked_add(p.len()))
            .filter(|&t| t <= INLINE_MAX)
            .ok_or(ShmError::TooSmall)?;
        let ctl = self.ctl();
        let head = self.head.load(Relaxed);
        let place = self.consumed.place(head, RING_SLOTS, || self.counters.consumed().load(Acquire), "ring tail")?;
        let slot_head = self.head_at(place.index());
        let hdr = SlotHeader { inline_len: total as u32, ..*hdr };
        // SAFETY: the head has room for the header; head and body together
        // for INLINE_MAX >= total payload bytes.  A plain write: the stamp's
        // release below publishes it, as it does the payload.
        unsafe {
            ptr::write(slot_head.cast::<SlotHeader>(), hdr);
            if total <= HEAD_PAYLOAD {
                // The usual small message: all in the head's line.
                let mut to = slot_head.add(SLOT_HEADER_BYTES);
                for p in payload {
                    copy_bytes(p.as_ptr(), to, p.len());
                    to = to.add(p.len());
                }
            } else {
                let mut to = SlotPayload::new(slot_head, self.body_at(place.index()));
                for p in payload {
                    to.write(p);
                }
            }
        }
        let next = head.wrapping_add(1);
        self.stamp_in(slot_head).store(next, Release);
        self.head.store(next, Relaxed);
        self.counters.produced().store(next, Release);
        if let Place::Lap(_) = place {
            ctl.lapped.store(next, Release);
        }
        then();
        // Pairs with the fence in `wait`: either we see the sleeper or it sees the stamp.
        fence(SeqCst);
        if ctl.sleeping.load(SeqCst) != 0 {
            ctl.futex.fetch_add(1, SeqCst);
            futex_wake(&ctl.futex, i32::MAX);
        }
        Ok(())
    }

    /// Consumer side: the address of the slot where the next message most
    /// likely lands (its hot slot), to prefetch; nothing is read.
    pub fn next_slot(&self) -> *const u8 {
        self.hot_head(self.tail.load(Relaxed))
    }

    /// Producer side: the head of the slot where the next message most
    /// likely goes (its hot slot), to prefetch; nothing is read.
    pub fn next_push_slot(&self) -> *const u8 {
        self.hot_head(self.head.load(Relaxed))
    }

    /// The head of message `n`'s hot slot.
    fn hot_head(&self, n: u64) -> *const u8 {
        let [hot, _] = Place::candidates(n, RING_SLOTS);
        self.head_at(hot.index())
    }

    /// The control line a message reads on this side, besides the
    /// counters: the consumer's `sleeping` for the producer, `lapped` for
    /// the consumer; for a caller to prefetch.
    pub fn control_line(&self) -> *const u8 {
        let ctl = self.ctl();
        match self.producer {
            true => &*ctl.sleeping as *const AtomicU32 as *const u8,
            false => &*ctl.lapped as *const AtomicU64 as *const u8,
        }
    }

    /// Consumer side: a validated copy of the next slot's header, without
    /// consuming it; `None` when the ring is empty.
    pub fn peek(&self) -> Result<Option<SlotHeader>, ShmError> {
        let tail = self.tail.load(Relaxed);
        let Some(place) = self.ready(tail)? else {
            return Ok(None);
        };
        // SAFETY: the slot is inside the ring; any bit pattern is a valid header.
        let hdr = unsafe { ptr::read_volatile(self.head_at(place.index()).cast::<SlotHeader>()) };
        if hdr.inline_len as usize > INLINE_MAX {
            return Err(ShmError::Corrupt("slot inline length"));
        }
        self.peeked.store(hdr.inline_len, Relaxed);
        self.peeked_at.store(place.index() as u32, Relaxed);
        Ok(Some(hdr))
    }

    /// Copies the inline payload of the slot returned by `peek` into `dst`,
    /// filling the slices in order; returns the bytes copied
    /// (`min(inline_len, total of dst)`, 0 if nothing was peeked).
    pub fn read_payload(&self, dst: &mut [&mut [u8]]) -> usize {
        self.read_payload_into(dst.iter_mut().map(|d| &mut **d))
    }

    /// [`Ring::read_payload`] into the slices an iterator gives.
    pub fn read_payload_into<'a>(&self, dst: impl Iterator<Item = &'a mut [u8]>) -> usize {
        let len = self.peeked.load(Relaxed);
        if len == NOT_PEEKED {
            return 0;
        }
        // `len` was validated by peek; the shared copy may have changed since.
        let mut left = len as usize;
        let index = self.peeked_at.load(Relaxed) as usize;
        let mut from = SlotPayload::new(self.head_at(index), self.body_at(index));
        let mut copied = 0;
        for d in dst {
            let n = d.len().min(left);
            // SAFETY: head and body hold INLINE_MAX >= left >= n bytes of payload.
            unsafe { from.read(&mut d[..n]) };
            left -= n;
            copied += n;
        }
        copied
    }

    /// [`Ring::read_payload`] for the usual small message: the payload of
    /// the slot returned by `peek` when it lies in the slot's head (at most
    /// `HEAD_PAYLOAD` bytes, in the line of the header) and fits `dst`,
    /// copied there; `None`, with nothing copied, otherwise.
    pub fn read_small(&self, dst: &mut [u8]) -> Option<usize> {
        let len = self.peeked.load(Relaxed) as usize;
        if len > HEAD_PAYLOAD || len > dst.len() {
            return None;
        }
        let head = self.head_at(self.peeked_at.load(Relaxed) as usize);
        // SAFETY: the head holds HEAD_PAYLOAD >= len bytes of payload after the header.
        unsafe { copy_bytes(head.add(SLOT_HEADER_BYTES), dst.as_mut_ptr(), len) };
        Some(len)
    }

    /// Consumer side: consumes the slot returned by `peek` (no-op if none).
    pub fn pop(&self) {
        // Not a swap: the consumer side is serialized by the caller.
        if self.peeked.load(Relaxed) == NOT_PEEKED {
            return;
        }
        self.peeked.store(NOT_PEEKED, Relaxed);
        let tail = self.tail.load(Relaxed).wrapping_add(1);
        self.tail.store(tail, Relaxed);
        self.counters.consumed().store(tail, Release);
    }

    /// True when no slot is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Slots pushed and not yet popped, from this side's view, clamped to
    /// `RING_SLOTS`.
    pub fn len(&self) -> usize {
        let used = if self.producer {
            self.head.load(Relaxed).wrapping_sub(self.counters.consumed().load(Acquire))
        } else {
            self.counters.produced().load(Acquire).wrapping_sub(self.tail.load(Relaxed))
        };
        used.min(RING_SLOTS as u64) as usize
    }

    /// Consumer side: sleeps until the producer pushes, `wake` is called or
    /// `timeout` passes.  Returns at once if a slot is waiting; spurious
    /// returns are possible.
    pub fn wait(&self, timeout: Option<Duration>) {
        let ctl = self.ctl();
        ctl.sleeping.fetch_add(1, SeqCst);
        fence(SeqCst);
        let seq = ctl.futex.load(SeqCst);
        if matches!(self.ready(self.tail.load(Relaxed)), Ok(None)) {
            futex_wait(&ctl.futex, seq, timeout);
        }
        ctl.sleeping.fetch_sub(1, SeqCst);
    }

    /// Producer side: wakes a consumer asleep in `wait` although no slot
    /// came (it waits for room in its own ring, which this side just made);
    /// no system call when none sleeps.  A consumer going to sleep just now
    /// may miss it and sleep until its timeout.
    pub fn nudge(&self) {
        let ctl = self.ctl();
        fence(SeqCst);
        if ctl.sleeping.load(SeqCst) != 0 {
            ctl.futex.fetch_add(1, SeqCst);
            futex_wake(&ctl.futex, i32::MAX);
        }
    }

    /// Wakes every thread sleeping in `wait` on this ring (on disconnect or
    /// peer death).
    pub fn wake(&self) {
        let ctl = self.ctl();
        ctl.futex.fetch_add(1, SeqCst);
        futex_wake(&ctl.futex, i32::MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::copy_bytes;

    #[test]
    fn small_copies_move_exactly_their_bytes() {
        let src: Vec<u8> = (1..=64).collect();
        for n in 0..=40 {
            for at in 0..3 {
                let mut dst = [0u8; 48];
                // SAFETY: `at + n` <= 43 bytes of both buffers.
                unsafe { copy_bytes(src.as_ptr().add(at), dst.as_mut_ptr().add(at), n) };
                assert_eq!(&dst[at..at + n], &src[at..at + n], "{n} bytes at {at}");
                assert!(dst[..at].iter().chain(&dst[at + n..]).all(|&b| b == 0), "{n} bytes at {at}: wrote outside");
            }
        }
    }
}
