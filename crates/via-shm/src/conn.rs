//! The connection segment: one shared region per connection holding, for
//! each direction, a [`Ring`] and the [`RecvCache`] of that direction's
//! receiver.
//!
//! Layout: a header (version, one `closed` flag and one `copying` count
//! per side, and per side the line of counters it writes as messages
//! move), then the hot parts of the two rings and of the two receive
//! caches (a ring's control block and its hot slots' heads, a cache's hot
//! entries' heads), all in the first three pages: a connection whose
//! consumers keep up touches only these (and the payload lines of
//! messages longer than a head holds), so at a thousand connections each
//! costs three entries of the TLB.  Then the rest of the A->B
//! block and of the B->A block, each a ring's lap and bodies followed by
//! those of the receive-queue cache published by the ring's consumer.
//!
//! # Fences
//!
//! A side copies into or out of its peer's memory (cross-memory attach)
//! only between [`ConnSegment::begin_copy`], which raises its `copying`
//! count and then checks that the peer has not closed, and the drop of
//! the guard.  A side that closes, or that deregisters memory (after
//! invalidating the region in its table), waits for the peer's count to
//! fall to zero ([`ConnSegment::wait_for_peer_copies`]): once it returns,
//! no copy of that peer lands in or reads its memory.  The count is the
//! peer's to write, so the wait is bounded; a peer that holds it longer is
//! broken, and so is its connection.

use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering::*};
use std::time::{Duration, Instant};

#[cfg(test)]
use crate::layout::HOT;
use crate::layout::{align_up, at, CacheLine, Counters};
#[cfg(test)]
use crate::recv::HEAD_BYTES as ENTRY_HEAD_BYTES;
pub use crate::recv::{RecvCache, RecvEntry, RecvSeg, MAX_SEGS, RECV_ENTRIES};
use crate::recv::{CACHE_HOT_BYTES, CACHE_REST_BYTES};
#[cfg(test)]
use crate::ring::HEAD_BYTES;
pub use crate::ring::{
    Ring, SlotHeader, INLINE_MAX, RING_SLOTS, SLOT_BYTES, SLOT_ERROR, SLOT_RDMA_WRITE_IMM, SLOT_SEND,
};
use crate::ring::{RING_HOT_BYTES, RING_REST_BYTES};
use crate::{SharedRegion, ShmError};

/// Layout version stored in the header by the first side to attach; a
/// new layout takes a new version, so that processes of two layouts (two
/// builds of openvia) refuse each other's segment instead of misreading it.
pub const CONN_VERSION: u32 = 5;

/// Where the hot parts start: after the header's lines.  Each part
/// starts a pair of lines (see [`LinePair`]).
const HOT_AT: usize = align_up(std::mem::size_of::<ConnHeader>(), 128);
/// The hot part of the ring of direction `d` (0: A->B, 1: B->A).
const fn ring_hot(d: usize) -> usize {
    HOT_AT + d * align_up(RING_HOT_BYTES, 128)
}
/// The hot part of the receive cache of direction `d`.
const fn cache_hot(d: usize) -> usize {
    ring_hot(2) + d * align_up(CACHE_HOT_BYTES, 128)
}
/// The header and the hot parts, in whole pages.
const HEADER_BYTES: usize = align_up(cache_hot(2), 4096);
const DIR_BYTES: usize = align_up(RING_REST_BYTES + CACHE_REST_BYTES, 64);
/// The rest of the ring of direction `d`.
const fn ring_rest(d: usize) -> usize {
    HEADER_BYTES + d * DIR_BYTES
}
/// The rest of the receive cache of direction `d`.
const fn cache_rest(d: usize) -> usize {
    ring_rest(d) + RING_REST_BYTES
}
/// Size of a connection segment.
pub const CONN_SEGMENT_BYTES: usize = align_up(HEADER_BYTES + 2 * DIR_BYTES, 4096);

const _: () = assert!(cache_hot(2) <= 3 * 4096, "the hot parts fit in three pages");

#[repr(C)]
struct ConnHeader {
    version: CacheLine<AtomicU32>,
    closed: [CacheLine<AtomicU32>; 2],
    /// Copies a side has under way into or out of the other side's memory.
    copying: [CacheLine<AtomicU32>; 2],
    /// Per side, the counters it writes as messages move.
    counters: [LinePair<SideCounters>; 2],
}

/// A value alone in an aligned pair of cache lines: a CPU that fetches
/// lines in pairs (the adjacent-line prefetcher) brings no word of the
/// other side with it.  For the lines that move with every message.
#[repr(C, align(128))]
struct LinePair<T>(T);

/// The shared counters one side writes, together in one line: a message
/// moves this line on each side instead of four.  The peer reads them
/// rarely (when the places it knows to be free run out), so the line stays
/// with its writer.
#[repr(C)]
struct SideCounters {
    /// The head of the ring this side produces.
    sent: AtomicU64,
    /// The tail of the ring this side consumes.
    received: AtomicU64,
    /// `published` of this side's receive cache.
    published: AtomicU64,
    /// `taken` of the peer's receive cache.
    taken: AtomicU64,
}

/// The two ends of a connection, owning mirror-image halves of the segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// Sends on the A->B ring, receives on the B->A ring.
    A,
    /// Sends on the B->A ring, receives on the A->B ring.
    B,
}

impl Side {
    /// The other end.
    pub fn peer(self) -> Side {
        match self {
            Side::A => Side::B,
            Side::B => Side::A,
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// One side's view of a connection segment.
pub struct ConnSegment {
    tx: Ring,
    rx: Ring,
    my_recvs: RecvCache,
    peer_recvs: RecvCache,
    side: Side,
    // Declared last: the rings and caches point into it.
    region: SharedRegion,
}

impl ConnSegment {
    /// Attaches to a segment as `side`.  `TooSmall` if the region is smaller
    /// than [`CONN_SEGMENT_BYTES`], `Corrupt` if it carries another version.
    ///
    /// Counters start at zero: each side attaches once to a fresh segment.
    pub fn new(region: SharedRegion, side: Side) -> Result<ConnSegment, ShmError> {
        if region.len() < CONN_SEGMENT_BYTES {
            return Err(ShmError::TooSmall);
        }
        let base = region.as_ptr();
        // SAFETY: the header is at the start of a mapping of sufficient size.
        let hdr: &ConnHeader = unsafe { at(base, 0) };
        match hdr.version.compare_exchange(0, CONN_VERSION, AcqRel, Acquire) {
            Ok(_) | Err(CONN_VERSION) => {}
            Err(_) => return Err(ShmError::Corrupt("segment version")),
        }
        let (out, inn) = (side.index(), side.peer().index());
        let (mine, theirs) = (&hdr.counters[out].0, &hdr.counters[inn].0);
        // SAFETY: every part lies inside the region (checked above), apart
        // from the others, 64-byte aligned, and lives as long as `region`,
        // owned by self; so do the header's counters.
        unsafe {
            let ring = |d: usize| (base.add(ring_hot(d)), base.add(ring_rest(d)));
            let cache = |d: usize| (base.add(cache_hot(d)), base.add(cache_rest(d)));
            let ((tx_hot, tx_rest), (rx_hot, rx_rest)) = (ring(out), ring(inn));
            // A direction's cache is published by the ring's consumer.
            let ((mine_hot, mine_rest), (peers_hot, peers_rest)) = (cache(inn), cache(out));
            Ok(ConnSegment {
                tx: Ring::new(tx_hot, tx_rest, true, Counters::new(&mine.sent, &theirs.received)),
                rx: Ring::new(rx_hot, rx_rest, false, Counters::new(&theirs.sent, &mine.received)),
                my_recvs: RecvCache::new(mine_hot, mine_rest, true, Counters::new(&mine.published, &theirs.taken)),
                peer_recvs: RecvCache::new(peers_hot, peers_rest, false, Counters::new(&theirs.published, &mine.taken)),
                side,
                region,
            })
        }
    }

    /// The ring I produce and the peer consumes.
    pub fn tx(&self) -> &Ring {
        &self.tx
    }

    /// The ring the peer produces and I consume.
    pub fn rx(&self) -> &Ring {
        &self.rx
    }

    /// The segment's control lines that this side's messages move
    /// through (its counters, the peer's sleep flag, its ring's `lapped`),
    /// for a caller to prefetch before a message: at a thousand
    /// connections they are out of the caches.
    pub fn control_lines(&self) -> [*const u8; 3] {
        let counters = &self.header().counters[self.side.index()].0 as *const SideCounters as *const u8;
        [counters, self.tx.control_line(), self.rx.control_line()]
    }

    /// The cache where I publish my posted receives (the peer takes them).
    pub fn my_recvs(&self) -> &RecvCache {
        &self.my_recvs
    }

    /// The cache of the peer's posted receives, which my sends take.
    pub fn peer_recvs(&self) -> &RecvCache {
        &self.peer_recvs
    }

    /// Which side this is.
    pub fn side(&self) -> Side {
        self.side
    }

    /// The underlying region.
    pub fn region(&self) -> &SharedRegion {
        &self.region
    }

    /// Sets my `closed` flag in the header.
    pub fn mark_closed(&self) {
        self.header().closed[self.side.index()].store(1, SeqCst);
    }

    /// Announces a cross-memory copy into or out of the peer's memory;
    /// `None` when the peer has closed its end, and nothing may be copied.
    /// The peer's fences wait until the guard is dropped.
    pub fn begin_copy(&self) -> Option<CopyGuard<'_>> {
        let count = &self.header().copying[self.side.index()].0;
        count.fetch_add(1, SeqCst);
        // The count is visible before the peer's state is read: a peer
        // that closes (or invalidates a region) after this sees it.
        fence(SeqCst);
        if self.peer_closed() {
            count.fetch_sub(1, Release);
            return None;
        }
        Some(CopyGuard { count })
    }

    /// Waits until the peer has no copy into or out of this process's
    /// memory under way, for at most `limit`.  Call after closing or after
    /// invalidating a region.  False if the peer still copies: it is
    /// broken (or hostile), and the caller breaks the connection.
    pub fn wait_for_peer_copies(&self, limit: Duration) -> bool {
        fence(SeqCst);
        let count = &self.header().copying[self.side.peer().index()].0;
        let start = Instant::now();
        let mut spins = 0u32;
        while count.load(SeqCst) != 0 {
            if start.elapsed() >= limit {
                return false;
            }
            spins += 1;
            match spins {
                0..64 => std::hint::spin_loop(),
                64..128 => std::thread::yield_now(),
                _ => std::thread::sleep(Duration::from_micros(50)),
            }
        }
        true
    }

    /// Whether the peer has a copy into or out of this process's memory
    /// under way just now: what it copies arrives soon.
    pub fn peer_copying(&self) -> bool {
        self.header().copying[self.side.peer().index()].0.load(Relaxed) != 0
    }

    /// True once the peer has set its `closed` flag.
    pub fn peer_closed(&self) -> bool {
        self.header().closed[self.side.peer().index()].load(SeqCst) != 0
    }

    fn header(&self) -> &ConnHeader {
        // SAFETY: checked in `new`; the header is at the start of the region.
        unsafe { at(self.region.as_ptr(), 0) }
    }
}

/// A cross-memory copy under way (see [`ConnSegment::begin_copy`]).
pub struct CopyGuard<'a> {
    count: &'a AtomicU32,
}

impl Drop for CopyGuard<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn a_close_waits_for_the_peers_copy_and_refuses_later_ones() {
        let (a, b) = pair();
        let copy = a.begin_copy().unwrap();
        b.mark_closed();
        // B's fence waits for A's copy under way ...
        assert!(!b.wait_for_peer_copies(Duration::from_millis(20)));
        std::thread::scope(|s| {
            let waiter = s.spawn(|| b.wait_for_peer_copies(Duration::from_secs(10)));
            std::thread::sleep(Duration::from_millis(20));
            assert!(!waiter.is_finished());
            drop(copy);
            assert!(waiter.join().unwrap());
        });
        // ... and A starts no copy after B closed.
        assert!(a.begin_copy().is_none());
        assert!(b.wait_for_peer_copies(Duration::ZERO));
        // B's own copies are not A's: B may still copy until A closes.
        assert!(b.begin_copy().is_some());
    }

    /// Both sides of one segment, through two mappings of the same memfd.
    fn pair() -> (ConnSegment, ConnSegment) {
        let r = SharedRegion::create("conn-test", CONN_SEGMENT_BYTES).unwrap();
        let r2 = SharedRegion::map(r.fd().try_clone_to_owned().unwrap()).unwrap();
        let a = ConnSegment::new(r, Side::A).unwrap();
        (a, ConnSegment::new(r2, Side::B).unwrap())
    }

    #[test]
    fn what_follows_a_push_sees_the_message_stamped() {
        let (a, b) = pair();
        let mut seen = None;
        let payload: [&[u8]; 1] = [b"ping"];
        a.tx()
            .push_gather_then(&hdr(SLOT_SEND, 7), payload.into_iter(), || seen = Some(b.rx().peek().unwrap()))
            .unwrap();
        assert_eq!(seen.flatten().map(|h| (h.aux, h.inline_len)), Some((7, 4)));
        // A push that fails runs nothing after it.
        for i in 1..RING_SLOTS as u64 {
            a.tx().push(&hdr(SLOT_SEND, i), &[]).unwrap();
        }
        let mut ran = false;
        assert!(matches!(
            a.tx().push_gather_then(&hdr(SLOT_SEND, 0), [].into_iter(), || ran = true),
            Err(ShmError::Full)
        ));
        assert!(!ran);
    }

    fn pattern(seed: u64, len: usize) -> Vec<u8> {
        (0..len as u64).map(|i| (seed * 31 + i * 7) as u8).collect()
    }

    fn hdr(kind: u32, aux: u64) -> SlotHeader {
        SlotHeader { kind, aux, ..Default::default() }
    }

    fn corrupt<T>(r: Result<T, ShmError>) -> bool {
        matches!(r, Err(ShmError::Corrupt(_)))
    }

    fn recv(ring: &Ring) -> (SlotHeader, Vec<u8>) {
        let h = ring.peek().unwrap().expect("a slot");
        let mut buf = vec![0u8; h.inline_len as usize];
        assert_eq!(ring.read_payload(&mut [&mut buf[..]]), buf.len());
        ring.pop();
        (h, buf)
    }

    /// A ring's control block (`sleeping`, `futex`, `lapped`), before its heads.
    const RING_CTL: usize = 192;

    /// Where `side`'s counter `i` (sent, received, published, taken) is.
    fn counter(side: Side, i: usize) -> usize {
        384 + side.index() * 128 + i * 8
    }

    /// The shared word at `offset` in the segment.
    fn word<T>(seg: &ConnSegment, offset: usize) -> &T {
        // SAFETY: tests only pass aligned offsets of integer words inside the segment.
        unsafe { at(seg.region().as_ptr(), offset) }
    }

    #[test]
    fn every_payload_size_arrives_in_order() {
        let (a, b) = pair();
        let mut expect = 0;
        for len in 0..=INLINE_MAX {
            let h = SlotHeader { length: len as u32, ..hdr(SLOT_SEND, len as u64) };
            a.tx().push(&h, &[&pattern(len as u64, len)]).unwrap();
            // Drain at odd points so sizes land on many slot indices.
            if a.tx().len() == 300 || len == INLINE_MAX {
                while !b.rx().is_empty() {
                    let (h, data) = recv(b.rx());
                    let want = (SLOT_SEND, expect as u64, expect as u32, expect as u32);
                    assert_eq!((h.kind, h.aux, h.length, h.inline_len), want);
                    assert_eq!(data, pattern(expect as u64, expect));
                    expect += 1;
                }
            }
        }
        assert_eq!(expect, INLINE_MAX + 1);
        assert!(b.rx().peek().unwrap().is_none());
        // The other direction is independent.
        assert!(a.rx().is_empty());
        b.tx().push(&hdr(SLOT_ERROR, 0), &[]).unwrap();
        assert_eq!(recv(a.rx()).0.kind, SLOT_ERROR);
    }

    #[test]
    fn gathers_and_scatters_across_slices() {
        let (a, b) = pair();
        let data = pattern(9, 1000);
        let pieces: [&[u8]; 4] = [&data[..10], &[], &data[10..700], &data[700..]];
        a.tx().push(&hdr(SLOT_SEND, 0), &pieces).unwrap();
        let too_big = a.tx().push(&hdr(SLOT_SEND, 0), &[&data, &data[..25]]);
        assert!(matches!(too_big, Err(ShmError::TooSmall)));
        assert_eq!(b.rx().peek().unwrap().unwrap().inline_len, 1000);
        let (mut x, mut y, mut z) = (vec![0u8; 3], vec![0u8; 600], vec![0u8; 500]);
        assert_eq!(b.rx().read_payload(&mut [&mut x, &mut y, &mut z]), 1000);
        assert_eq!([&x[..], &y[..], &z[..397]].concat(), data);
        // A short destination gets a prefix.
        let mut short = vec![0u8; 100];
        assert_eq!(b.rx().read_payload(&mut [&mut short]), 100);
        assert_eq!(short, data[..100]);
        b.rx().pop();
        assert!(b.rx().is_empty());
        assert_eq!(b.rx().read_payload(&mut [&mut short]), 0);
    }

    #[test]
    fn payloads_split_between_a_slots_head_and_body_at_any_point() {
        let (a, b) = pair();
        let data = pattern(3, 64);
        // Pieces that end before, at and after the head's 16 payload bytes.
        for cut in 0..=40 {
            let (x, y) = data.split_at(cut);
            a.tx().push(&hdr(SLOT_SEND, cut as u64), &[x, &[], y]).unwrap();
            let (mut p, mut q) = (vec![0u8; 40 - cut], vec![0u8; 24 + cut]);
            b.rx().peek().unwrap().unwrap();
            assert_eq!(b.rx().read_payload(&mut [&mut p, &mut [], &mut q]), 64);
            assert_eq!([p, q].concat(), data, "cut at {cut}");
            b.rx().pop();
        }
    }

    #[test]
    fn a_message_in_the_head_is_read_whole_or_left_to_the_general_read() {
        let (a, b) = pair();
        let data = pattern(5, 40);
        // Up to 16 bytes, gathered from pieces, lie in the head: one copy
        // into a buffer long enough, nothing copied into a shorter one.
        for len in 0..=16 {
            let (x, y) = data[..len].split_at(len / 3);
            a.tx().push(&hdr(SLOT_SEND, len as u64), &[x, &[], y]).unwrap();
            b.rx().peek().unwrap().unwrap();
            if len > 0 {
                let mut short = vec![0xEEu8; len - 1];
                assert_eq!(b.rx().read_small(&mut short), None, "{len} bytes into {}", len - 1);
                assert!(short.iter().all(|&v| v == 0xEE), "{len} bytes: a refused read wrote");
            }
            let mut dst = vec![0u8; len + 3];
            assert_eq!(b.rx().read_small(&mut dst), Some(len));
            assert_eq!(&dst[..len], &data[..len]);
            assert!(dst[len..].iter().all(|&v| v == 0), "{len} bytes: wrote past the payload");
            b.rx().pop();
        }
        // Past the head: the general read's.
        a.tx().push(&hdr(SLOT_SEND, 17), &[&data[..17]]).unwrap();
        b.rx().peek().unwrap().unwrap();
        assert_eq!(b.rx().read_small(&mut [0u8; 64]), None);
        let mut whole = vec![0u8; 17];
        assert_eq!(b.rx().read_payload(&mut [&mut whole]), 17);
        assert_eq!(whole, data[..17]);
        b.rx().pop();
        // Nothing peeked: nothing to read.
        assert_eq!(b.rx().read_small(&mut [0u8; 64]), None);
    }

    #[test]
    fn small_messages_and_receives_touch_only_heads() {
        let (a, b) = pair();
        // A's ring to B is direction 0, and so is B's receive cache; the
        // bodies of each follow the heads of its lap.
        let slot_bodies = ring_rest(0) + RING_SLOTS * HEAD_BYTES;
        let entry_bodies = cache_rest(0) + RECV_ENTRIES * ENTRY_HEAD_BYTES;
        let written = |from: usize, to: usize| {
            (from..to).step_by(8).filter(|&at| word::<AtomicU64>(&b, at).load(Acquire) != 0).count()
        };
        let slot_body_words = || written(slot_bodies, ring_rest(0) + RING_REST_BYTES);
        let entry_body_words = || written(entry_bodies, cache_rest(0) + CACHE_REST_BYTES);
        let segs = |n: u64| (1..=n).map(|i| RecvSeg { addr: i, len: 1, handle: 1 }).collect::<Vec<_>>();
        for i in 0..3 * RING_SLOTS as u64 {
            b.my_recvs().publish(segs(3)).unwrap();
            assert_eq!(a.peer_recvs().take().unwrap().unwrap().segs(), segs(3));
            a.tx().push(&hdr(SLOT_SEND, i), &[&pattern(i, 16)]).unwrap();
            assert_eq!(recv(b.rx()).1, pattern(i, 16));
        }
        assert_eq!(slot_body_words(), 0, "a message of 16 bytes wrote a slot's body");
        assert_eq!(entry_body_words(), 0, "a receive of 3 segments wrote an entry's body");
        a.tx().push(&hdr(SLOT_SEND, 0), &[&[0xff; 17]]).unwrap();
        assert_eq!(recv(b.rx()).1, [0xff; 17]);
        assert_eq!(slot_body_words(), 1, "the 17th byte is in the body");
        b.my_recvs().publish(segs(4)).unwrap();
        assert_eq!(a.peer_recvs().take().unwrap().unwrap().segs(), segs(4));
        assert_eq!(entry_body_words(), 2, "the 4th segment is in the body");
    }

    #[test]
    fn each_side_writes_its_counters_in_one_line_of_the_header() {
        let (a, b) = pair();
        let n = 3 * HOT as u64;
        for i in 0..n {
            b.my_recvs().publish([RecvSeg { addr: i, len: 8, handle: 0 }]).unwrap();
            assert_eq!(a.peer_recvs().take_seq().unwrap(), Some(i));
            a.tx().push(&hdr(SLOT_SEND, i), &[&i.to_le_bytes()]).unwrap();
            assert_eq!(recv(b.rx()).1, i.to_le_bytes());
        }
        let count = |side, i| word::<AtomicU64>(&a, counter(side, i)).load(Acquire);
        // A sent and took n, B received and published n; nothing went the other way.
        assert_eq!([0, 3].map(|i| count(Side::A, i)), [n, n]);
        assert_eq!([1, 2].map(|i| count(Side::B, i)), [n, n]);
        assert_eq!([1, 2].map(|i| count(Side::A, i)), [0, 0]);
        assert_eq!([0, 3].map(|i| count(Side::B, i)), [0, 0]);
        // The ring's control block (no sleeper, nothing lapped) is untouched.
        let ctl_words = (ring_hot(0)..ring_hot(0) + RING_CTL).step_by(8);
        assert!(ctl_words.into_iter().all(|at| word::<AtomicU64>(&a, at).load(Acquire) == 0));
        // What a side prefetches: its counters' line first.
        assert_eq!(a.control_lines()[0] as usize - a.region().as_ptr() as usize, counter(Side::A, 0));
        assert_eq!(b.control_lines()[0] as usize - b.region().as_ptr() as usize, counter(Side::B, 0));
    }

    #[test]
    fn full_at_ring_slots_and_wraps_over_many_laps() {
        let (a, b) = pair();
        let push = |i: u64| a.tx().push(&hdr(SLOT_SEND, i), &[&i.to_le_bytes()]);
        for i in 0..RING_SLOTS as u64 {
            push(i).unwrap();
        }
        assert!(matches!(push(0), Err(ShmError::Full)));
        assert_eq!((a.tx().len(), b.rx().len()), (RING_SLOTS, RING_SLOTS));
        let (mut sent, mut got) = (RING_SLOTS as u64, 0u64);
        // Varying batch sizes so pushes and pops meet at every slot index.
        for batch in (1..40).cycle().take(2000) {
            for _ in 0..batch {
                let (h, d) = recv(b.rx());
                assert_eq!((h.aux, d), (got, got.to_le_bytes().to_vec()));
                got += 1;
            }
            for _ in 0..batch {
                push(sent).unwrap();
                sent += 1;
            }
        }
        assert!(sent > 30 * RING_SLOTS as u64);
        while got < sent {
            assert_eq!(recv(b.rx()).0.aux, got);
            got += 1;
        }
        assert!(b.rx().is_empty() && a.tx().is_empty());
    }

    #[test]
    fn corrupt_counters_are_errors() {
        let (a, b) = pair();
        // The A->B ring: its head is A's `sent`, its tail B's `received`;
        // `lapped` in its control block, then hot slot 0, with inline_len
        // at 24 and the stamp at 40.
        let (head, tail) = (counter(Side::A, 0), counter(Side::B, 1));
        let (lapped, slot0) = (ring_hot(0) + 128, ring_hot(0) + RING_CTL);
        // A stamp that is no message's is not a message.
        word::<AtomicU64>(&a, slot0 + 40).store(77, Release);
        assert!(b.rx().peek().unwrap().is_none());
        // A message announced in the lap and stamped nowhere is corrupt.
        word::<AtomicU64>(&a, lapped).store(1, Release);
        assert!(corrupt(b.rx().peek()));
        word::<AtomicU64>(&a, lapped).store(u64::MAX / 4, Release);
        assert!(corrupt(b.rx().peek()), "a message beyond the lap");
        word::<AtomicU64>(&a, lapped).store(0, Release);
        word::<AtomicU64>(&a, slot0 + 40).store(0, Release);
        assert!(b.rx().peek().unwrap().is_none());
        // The head is not how a message is found.
        word::<AtomicU64>(&a, head).store(u64::MAX / 2, Release);
        assert_eq!(b.rx().len(), RING_SLOTS);
        assert!(b.rx().peek().unwrap().is_none());
        b.rx().pop();
        // The producer reads the tail only once the slots it knows free run out.
        for i in 0..RING_SLOTS as u64 {
            a.tx().push(&hdr(SLOT_SEND, i), &[]).unwrap();
        }
        word::<AtomicU64>(&a, tail).store(12345, Release);
        assert!(corrupt(a.tx().push(&hdr(SLOT_SEND, 0), &[])));
        word::<AtomicU64>(&a, tail).store(0, Release);
        assert!(matches!(a.tx().push(&hdr(SLOT_SEND, 0), &[]), Err(ShmError::Full)));
        word::<AtomicU32>(&a, slot0 + 24).store(5000, Release);
        assert!(corrupt(b.rx().peek()));
        assert_eq!(b.rx().read_payload(&mut [&mut [0u8; 8]]), 0);
        word::<AtomicU32>(&a, slot0 + 24).store(0, Release);
        assert_eq!(recv(b.rx()).0.aux, 0);
        a.tx().push(&hdr(SLOT_SEND, 1024), &[]).unwrap();
    }

    #[test]
    fn a_consumer_that_keeps_up_leaves_the_lap_untouched() {
        let (a, b) = pair();
        // Ping-pong on both the ring and the receive cache, then bursts of
        // up to HOT - 1 messages: all in the hot slots and entries.
        for burst in (1..HOT as u64).chain(std::iter::repeat_n(1, 3 * RING_SLOTS)) {
            for i in 0..burst {
                a.tx().push(&hdr(SLOT_SEND, i), &[&i.to_le_bytes()]).unwrap();
                b.my_recvs().publish([RecvSeg { addr: i, len: 8, handle: 0 }]).unwrap();
            }
            for i in 0..burst {
                assert_eq!(recv(b.rx()).1, i.to_le_bytes());
                assert_eq!(a.peer_recvs().take().unwrap().unwrap().segs()[0].addr, i);
            }
        }
        // Nothing past the header's pages, which hold the hot parts: no
        // lap, no body, in either direction.
        let past_header = (HEADER_BYTES..CONN_SEGMENT_BYTES).step_by(8);
        assert_eq!(past_header.filter(|&at| word::<AtomicU64>(&a, at).load(Acquire) != 0).count(), 0);
        assert_eq!(HEADER_BYTES, 3 * 4096);
        // A consumer further behind finds the rest in the lap.
        for i in 0..HOT as u64 + 5 {
            a.tx().push(&hdr(SLOT_SEND, i), &[]).unwrap();
        }
        for i in 0..HOT as u64 + 5 {
            assert_eq!(recv(b.rx()).0.aux, i);
        }
        assert!(b.rx().is_empty());
    }

    #[test]
    fn recv_cache_publishes_in_order_and_fills() {
        let (a, b) = pair();
        let segs: Vec<RecvSeg> =
            (0..MAX_SEGS as u32).map(|i| RecvSeg { addr: 0x1000 * u64::from(i), len: i + 1, handle: 0 }).collect();
        let too_many = a.my_recvs().publish([&segs[..], &segs[..1]].concat());
        assert!(matches!(too_many, Err(ShmError::TooManySegments)));
        for i in 0..RECV_ENTRIES {
            assert_eq!(a.my_recvs().publish(segs[..i % MAX_SEGS].iter().copied()).unwrap(), i as u64);
        }
        assert!(matches!(a.my_recvs().publish([]), Err(ShmError::Full)));
        assert_eq!(b.peer_recvs().available(), RECV_ENTRIES as u64);
        for i in 0..RECV_ENTRIES {
            let e = b.peer_recvs().take().unwrap().unwrap();
            let n = i % MAX_SEGS;
            let want = (i as u64, &segs[..n], (n * (n + 1) / 2) as u64);
            assert_eq!((e.seq, e.segs(), e.total), want);
        }
        assert!(b.peer_recvs().take().unwrap().is_none());
        let a_view = (a.my_recvs().available(), a.my_recvs().taken());
        assert_eq!(a_view, (0, RECV_ENTRIES as u64));
        b.my_recvs().publish(segs[..1].iter().copied()).unwrap();
        assert_eq!(a.peer_recvs().take().unwrap().unwrap().segs(), &segs[..1]);
    }

    #[test]
    fn corrupt_recv_entries_are_errors() {
        let (a, b) = pair();
        a.my_recvs().publish([RecvSeg { addr: 1, len: 2, handle: 0 }]).unwrap();
        // A's receives are the cache of the B->A direction, hot entry 0 first:
        // seq u64, then nsegs u32.  Its `published` is A's counter.
        let cache = cache_hot(1);
        let (seq, nsegs, published) = (cache, cache + 8, counter(Side::A, 2));
        word::<AtomicU32>(&a, nsegs).store(MAX_SEGS as u32 + 1, Release);
        assert!(corrupt(b.peer_recvs().take()));
        word::<AtomicU32>(&a, nsegs).store(1, Release);
        word::<AtomicU64>(&a, seq).store(77, Release);
        assert!(corrupt(b.peer_recvs().take()));
        word::<AtomicU64>(&a, published).store(1 << 40, Release);
        assert!(corrupt(b.peer_recvs().take()));
        assert_eq!(b.peer_recvs().available(), RECV_ENTRIES as u64);
        // The published count is read when the receives seen are used up.
        let (a, b) = pair();
        word::<AtomicU64>(&a, published).store(1 << 40, Release);
        assert!(corrupt(b.peer_recvs().take_seq()));
        assert!(corrupt(b.peer_recvs().take()));
        word::<AtomicU64>(&a, published).store(0, Release);
        assert!(b.peer_recvs().take_seq().unwrap().is_none());
    }

    #[test]
    fn take_seq_consumes_in_order_with_take() {
        let (a, b) = pair();
        for i in 0..5u32 {
            a.my_recvs().publish([RecvSeg { addr: u64::from(i), len: i, handle: 0 }]).unwrap();
        }
        assert_eq!(b.peer_recvs().take_seq().unwrap(), Some(0));
        assert_eq!(b.peer_recvs().take().unwrap().unwrap().segs(), &[RecvSeg { addr: 1, len: 1, handle: 0 }]);
        assert_eq!(b.peer_recvs().take_seq().unwrap(), Some(2));
        assert_eq!(b.peer_recvs().take().unwrap().unwrap().seq, 3);
        assert_eq!(b.peer_recvs().take_seq().unwrap(), Some(4));
        assert!(b.peer_recvs().take_seq().unwrap().is_none());
        assert_eq!(a.my_recvs().taken(), 5);
    }

    #[test]
    fn header_and_size_checks() {
        let small = SharedRegion::create("small", CONN_SEGMENT_BYTES - 1).unwrap();
        let small = ConnSegment::new(small, Side::A);
        assert!(matches!(small, Err(ShmError::TooSmall)));
        let (a, b) = pair();
        assert!(!b.peer_closed());
        a.mark_closed();
        assert!(b.peer_closed() && !a.peer_closed());
        word::<AtomicU32>(&a, 0).store(99, Release);
        let other = SharedRegion::map(a.region().fd().try_clone_to_owned().unwrap()).unwrap();
        assert!(corrupt(ConnSegment::new(other, Side::B)));
    }
}
