//! RDMA reads through the ring, where the kernel does not let the
//! initiator cross-memory attach to the target (processes of different
//! users, Yama `ptrace_scope` 2 or 3: `Conn::attach` is false).
//!
//! The initiator pushes a `SLOT_RDMA_READ` naming the target's memory
//! (address, memory handle, length) and keeps the descriptor in flight on
//! its send queue ([`RingRead`]).  The target, when it drains its ring,
//! reads the request's fields once, from a copy, checks them against its
//! own registry, the VI's tag and RDMA read enable ([`Vi::ring_read_allowed`])
//! and owes an [`Answer`]: `SLOT_RDMA_READ_PIECE` slots through its own
//! ring, each piece's range checked again as it is copied out (a region
//! deregistered meanwhile gives no more bytes), or a refusal.  Answers go
//! out as the ring has room, never waiting for it: a side that answers
//! goes on draining its own ring, so two processes reading from each other
//! at once do not wait on each other.  The initiator checks every piece
//! against the read it asked for ([`check_piece`]), copies it into the
//! descriptor's local buffers (checked again where a region went since the
//! post) and completes the descriptor once the last piece is in.  A
//! refusal completes it with `VIP_STATUS_RDMA_PROT_ERROR` and breaks the
//! connection (`VIP_ERROR_RDMAR_PROT` at the target, `VIP_ERROR_CONN_LOST`
//! at the initiator); an answer nobody
//! asked for, or one that does not match, breaks it as a peer that wrote
//! something impossible.  A target that sends no piece for
//! [`RING_ROOM_LIMIT`] loses the connection.
//!
//! Polling the send queue (`VipSendDone`, `VipSendWait`, its CQ) drains
//! the ring while a read is in flight, so a program that only waits for
//! its read completes; the target answers when it drains its ring (when it
//! polls or waits on its receive queue, or polls a CQ, or waits for a read
//! of its own).

use super::shm_path::{push_room, scattered, RING_ROOM_LIMIT};
use super::{Break, RecvQueue, SendItem, SendQueue, Vi};
use crate::counters::Counter;
use crate::nic::Nic;
use crate::queue_lock::QueueGuard;
use crate::transport::shm::Conn;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;
use via_core::consts::error_code;
use via_core::consts::*;
use via_core::descriptor::{buffers_registered, DescPtr, Rules, Segs, WorkRequest};
use via_core::registry::REGION_RDMA_READ;
use via_shm::conn::ConnSegment;
use via_shm::ring::{SlotHeader, INLINE_MAX, RDMA_TARGET_BYTES, RING_SLOTS, SLOT_RDMA_READ, SLOT_RDMA_READ_PIECE};

/// A refused RDMA read through the ring, on a reliable VI, as its
/// initiator learns of it: the target reports the protection error, the
/// initiator the connection lost (its descriptor says why), as on every path.
pub(crate) const RDMAR_REFUSED: Break = Break { mine: error_code::CONN_LOST, theirs: error_code::RDMAR_PROT };

/// Slots an answer leaves free in the answering side's ring: requests,
/// sends and writes of its own always find room, whatever it owes.
const ANSWER_ROOM: usize = RING_SLOTS / 2;

/// Ring reads in flight and answers owed in this process, all VIs
/// together: while zero, a poll looks no further ([`progress`]).
static RING_WORK: AtomicUsize = AtomicUsize::new(0);

/// An RDMA read this VI asked for through the ring, not yet all answered.
pub(crate) struct RingRead {
    /// Its number on this VI (`recv_seq` of the request and the answer).
    pub id: u64,
    pub desc: DescPtr,
    /// The memory handle the descriptor was posted with.
    pub mem: u32,
    /// `Registry::deregistrations` when it was posted.
    pub epoch: u32,
    /// The local buffers the answer lands in.
    pub segs: Segs,
    pub total: u32,
    /// Bytes answered so far, in order.
    pub got: u32,
    /// Status error bits once a local buffer went: the rest of the answer
    /// is consumed and not copied.
    pub error: u32,
    /// When its last piece came (or it was asked for, or became the first
    /// in line): a target silent for `RING_ROOM_LIMIT` loses the connection.
    pub since: Instant,
}

/// An RDMA read this VI owes its peer: the range it asked for, checked
/// when the request came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Answer {
    pub id: u64,
    pub addr: u64,
    pub handle: u32,
    pub total: u32,
    /// Bytes sent so far.
    pub sent: u32,
    /// Refused: the next slot says so and ends the answer.
    pub refused: bool,
    /// Every slot of it went.
    pub done: bool,
}

/// A read request's fields, read once from the slot's copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Request {
    pub id: u64,
    pub addr: u64,
    pub handle: u32,
    pub len: u32,
}

/// What a piece of an answer says about the read it answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Piece {
    /// This many bytes (0 only for a read of 0 bytes).
    Data(u32),
    /// The target refused the rest.
    Refused,
}

/// The request in a `SLOT_RDMA_READ` header (a copy) and its payload (a
/// copy): `None` if the header is not one the protocol has.
pub(crate) fn parse_request(hdr: &SlotHeader, target: &[u8; RDMA_TARGET_BYTES]) -> Option<Request> {
    if hdr.kind != SLOT_RDMA_READ
        || hdr.status != 0
        || hdr.aux != 0
        || hdr.flags != 0
        || hdr.inline_len as usize != RDMA_TARGET_BYTES
    {
        return None;
    }
    let addr = u64::from_le_bytes(target[..8].try_into().ok()?);
    let handle = u32::from_le_bytes(target[8..].try_into().ok()?);
    Some(Request { id: hdr.recv_seq, addr, handle, len: hdr.length })
}

/// Checks a `SLOT_RDMA_READ_PIECE` header (a copy) against the read it
/// must answer: number `id` of `total` bytes, `got` of them in.  `None`:
/// the peer wrote something impossible.
pub(crate) fn check_piece(id: u64, total: u32, got: u32, hdr: &SlotHeader) -> Option<Piece> {
    if hdr.kind != SLOT_RDMA_READ_PIECE
        || hdr.recv_seq != id
        || hdr.length != total
        || hdr.aux != u64::from(got)
        || hdr.flags != 0
    {
        return None;
    }
    let n = hdr.inline_len;
    match hdr.status {
        0 if n == 0 => (total == 0).then_some(Piece::Data(0)),
        0 => (n <= total - got).then_some(Piece::Data(n)),
        STATUS_RDMA_PROT_ERROR if n == 0 => Some(Piece::Refused),
        _ => None,
    }
}

impl Answer {
    fn new(r: Request, refused: bool) -> Answer {
        Answer { id: r.id, addr: r.addr, handle: r.handle, total: r.len, sent: 0, refused, done: false }
    }

    /// Its next slot: the header, and the range of this process's memory
    /// the slot carries (`addr`, `len`); `None` once all went.
    pub(crate) fn next(&self) -> Option<(SlotHeader, u64, u32)> {
        if self.done {
            return None;
        }
        let mut hdr = SlotHeader {
            kind: SLOT_RDMA_READ_PIECE,
            length: self.total,
            recv_seq: self.id,
            aux: u64::from(self.sent),
            ..Default::default()
        };
        if self.refused {
            hdr.status = STATUS_RDMA_PROT_ERROR;
            return Some((hdr, 0, 0));
        }
        let n = (self.total - self.sent).min(INLINE_MAX as u32);
        Some((hdr, self.addr + u64::from(self.sent), n))
    }

    /// Its next slot went, carrying `n` bytes.
    pub(crate) fn sent(&mut self, n: u32) {
        self.sent += n;
        self.done = self.refused || self.sent == self.total;
    }
}

/// Counts ring work of `vi` in (`delta` > 0) or out.
fn count_work(vi: &Vi, delta: isize) {
    if delta >= 0 {
        RING_WORK.fetch_add(delta as usize, Ordering::AcqRel);
        vi.ring_work.fetch_add(delta as usize, Ordering::AcqRel);
    } else {
        RING_WORK.fetch_sub(delta.unsigned_abs(), Ordering::AcqRel);
        vi.ring_work.fetch_sub(delta.unsigned_abs(), Ordering::AcqRel);
    }
}

/// Drains the rings of the VIs of `nic` that have ring reads in flight or
/// answers owed: a CQ poll or a wait on a work queue gets them on.  One
/// load while there are none in the process.
pub(crate) fn progress(nic: &Nic) {
    if RING_WORK.load(Ordering::Relaxed) == 0 {
        return;
    }
    let vis: Vec<_> = nic.shm_conns.lock().iter().map(|(vi, _)| *vi).collect();
    for vi in vis {
        if let Ok(vi) = Vi::get(vi) {
            if vi.ring_work.load(Ordering::Acquire) != 0 {
                vi.ring_progress();
            }
        }
    }
}

impl Vi {
    /// Posts an RDMA read through the ring (`carry_out`, with `q` locked):
    /// pushes the request and leaves the descriptor in flight.
    pub(crate) fn post_ring_read(
        &self,
        mut q: QueueGuard<'_, SendQueue>,
        conn: &Arc<Conn>,
        desc: DescPtr,
        mem: u32,
        wr: &WorkRequest,
        rules: &Rules<'_>,
    ) {
        let Some((addr, handle)) = wr.remote else { return };
        let total = wr.total as u32;
        // Before the buffers are asked again: a region that goes after
        // this load shows where the answer lands.
        let epoch = rules.registry.deregistrations();
        let fail = if !rules.registry.is_live(mem) || !buffers_registered(desc, &wr.segs, rules) {
            Some((STATUS_PROTECTION_ERROR, Break { mine: error_code::POST_DESC, theirs: error_code::CONN_LOST }))
        } else {
            let id = q.next_read;
            let hdr = SlotHeader { kind: SLOT_RDMA_READ, length: total, recv_seq: id, ..Default::default() };
            let mut target = [0u8; RDMA_TARGET_BYTES];
            target[..8].copy_from_slice(&addr.to_le_bytes());
            target[8..].copy_from_slice(&handle.to_le_bytes());
            let mut waited = None;
            match push_room(conn, &hdr, std::iter::once(&target[..]), &mut waited) {
                Err(()) => Some((STATUS_TRANSPORT_ERROR, super::shm_path::LOST)),
                Ok(()) => {
                    // A target that waits on its CQ only answers now.
                    conn.ask_peer_to_drain();
                    q.next_read = id.wrapping_add(1);
                    q.tally.add(Counter::RdmaReads, 1);
                    let since = Instant::now();
                    let segs = wr.segs.clone();
                    q.ring_reads.push_back(RingRead { id, desc, mem, epoch, segs, total, got: 0, error: 0, since });
                    count_work(self, 1);
                    let item = SendItem {
                        desc,
                        mem,
                        epoch,
                        done: false,
                        token: id,
                        read: None,
                        op: STATUS_OP_RDMA_READ,
                        length: total,
                        give_up: None,
                    };
                    q.items.push_back(item);
                    None
                }
            }
        };
        let Some((bits, why)) = fail else {
            return;
        };
        desc.complete(STATUS_OP_RDMA_READ | bits, 0, None);
        let item = SendItem { desc, mem, epoch: 0, done: true, token: 0, read: None, op: 0, length: 0, give_up: None };
        q.items.push_back(item);
        let completed = q.advance();
        drop(q);
        for _ in 0..completed {
            self.push_cq(false);
        }
        self.bump();
        self.break_connection(why);
    }

    /// Whether this VI lets the peer read `[addr, addr + len)` of region
    /// `handle`: the VI and the region enable RDMA read, the region is
    /// live, holds the range and has the VI's protection tag.
    pub(crate) fn ring_read_allowed(&self, handle: u32, addr: u64, len: u64) -> bool {
        let (rules, attrs) = self.rules();
        attrs.rdma_read
            && matches!(rules.registry.lookup(handle),
                Some(r) if r.ptag == rules.ptag && r.flags & REGION_RDMA_READ != 0 && r.contains(addr, len))
    }

    /// Takes in a read request (the peek of `hdr`) as the target: checked
    /// now, answered as the ring has room.  `closing`: the connection is
    /// going, nothing is answered.  `Err`: the peer wrote something
    /// impossible.
    pub(crate) fn ring_read_request(
        &self,
        q: &mut RecvQueue,
        seg: &ConnSegment,
        hdr: &SlotHeader,
        closing: bool,
    ) -> Result<(), ()> {
        let rx = seg.rx();
        if q.pieces.is_some() || q.rdma.is_some() {
            return Err(());
        }
        let mut target = [0u8; RDMA_TARGET_BYTES];
        if hdr.inline_len as usize != RDMA_TARGET_BYTES || rx.read_payload(&mut [&mut target[..]]) != RDMA_TARGET_BYTES
        {
            return Err(());
        }
        let request = parse_request(hdr, &target).ok_or(())?;
        rx.pop();
        if closing {
            return Ok(());
        }
        // An honest peer has no more reads in flight than its send queue holds.
        if q.answers.len() >= limits::MAX_DESCRIPTORS_PER_QUEUE {
            return Err(());
        }
        let refused = !self.ring_read_allowed(request.handle, request.addr, u64::from(request.len));
        if refused {
            self.nic.counters.add(Counter::RdmaRefused, 1);
        }
        q.answers.push_back(Answer::new(request, refused));
        count_work(self, 1);
        self.pump_answers(q, seg)
    }

    /// Pushes what this VI owes, in order, as long as the ring has room
    /// ([`ANSWER_ROOM`] left free); never waits.  Each piece's range is
    /// checked against the registry as it is copied out.  `Err`: the
    /// peer's counters are impossible.
    pub(crate) fn pump_answers(&self, q: &mut RecvQueue, seg: &ConnSegment) -> Result<(), ()> {
        // The send queue's lock: the ring's one producer at a time.
        let s = self.send.lock();
        if s.conn().is_none() {
            return Ok(());
        }
        let tx = seg.tx();
        while let Some(a) = q.answers.front_mut() {
            while let Some((hdr, at, n)) = a.next() {
                if tx.len() >= RING_SLOTS - ANSWER_ROOM {
                    return Ok(());
                }
                if !a.refused && n > 0 && !self.ring_read_allowed(a.handle, at, u64::from(n)) {
                    // Deregistered (or changed) since the request came.
                    a.refused = true;
                    self.nic.counters.add(Counter::RdmaRefused, 1);
                    continue;
                }
                let bytes: &[u8] = if hdr.status == 0 && n > 0 {
                    // SAFETY: [at, at + n) lies in a region of this process
                    // registered for RDMA read under the VI's tag, checked
                    // just now.
                    unsafe { std::slice::from_raw_parts(at as *const u8, n as usize) }
                } else {
                    &[]
                };
                match tx.push_gather(&hdr, std::iter::once(bytes)) {
                    Ok(()) => a.sent(n),
                    Err(via_shm::ShmError::Full) => return Ok(()),
                    Err(_) => return Err(()),
                }
                self.nic.counters.add(Counter::RingPieces, 1);
            }
            q.answers.pop_front();
            count_work(self, -1);
        }
        drop(s);
        Ok(())
    }

    /// Takes in a piece of the answer to this VI's first ring read in
    /// flight (the peek of `hdr`), into its local buffers; completes the
    /// read with the last piece or a refusal.  `closing`: the reads are
    /// flushed, the piece is dropped.  Returns why the connection must
    /// break; `Err`: the peer wrote something impossible (an answer to
    /// nothing, or not to what was asked).
    pub(crate) fn ring_read_piece(
        &self,
        seg: &ConnSegment,
        hdr: &SlotHeader,
        closing: bool,
    ) -> Result<Option<Break>, ()> {
        let rx = seg.rx();
        if closing {
            rx.pop();
            return Ok(None);
        }
        let mut s = self.send.lock();
        let (rules, attrs) = self.rules();
        let registry = rules.registry;
        let Some(read) = s.ring_reads.front_mut() else {
            return Err(());
        };
        let piece = check_piece(read.id, read.total, read.got, hdr).ok_or(())?;
        let mut broken = None;
        let mut finished = None;
        match piece {
            Piece::Refused => {
                finished = Some((STATUS_RDMA_PROT_ERROR, 0));
                broken = Some(RDMAR_REFUSED);
            }
            Piece::Data(n) => {
                if read.error == 0 && n > 0 {
                    // The descriptor and its buffers are still registered
                    // unless a region went since the post; then asked again.
                    let live = registry.deregistrations() == read.epoch
                        || (registry.is_live(read.mem) && buffers_registered(read.desc, &read.segs, &rules));
                    if live {
                        rx.read_payload_into(scattered(&read.segs, u64::from(read.got)));
                    } else {
                        read.error = STATUS_PROTECTION_ERROR;
                    }
                }
                read.got += n;
                read.since = Instant::now();
                if read.got == read.total {
                    if read.error != 0 {
                        finished = Some((read.error, 0));
                        if registry.is_live(read.mem) && crate::vi::reliable(attrs.reliability) {
                            broken = Some(Break { mine: error_code::POST_DESC, theirs: error_code::CONN_LOST });
                        }
                    } else {
                        finished = Some((0, read.total));
                    }
                }
            }
        }
        rx.pop();
        let Some((bits, length)) = finished else {
            drop(s);
            // The target may sleep until its ring has room again.
            seg.tx().nudge();
            return Ok(None);
        };
        let read = s.ring_reads.pop_front().expect("the read answered");
        count_work(self, -1);
        if let Some(next) = s.ring_reads.front_mut() {
            next.since = Instant::now();
        }
        let first = s.done;
        if let Some(item) =
            s.items.iter_mut().skip(first).find(|i| !i.done && i.op == STATUS_OP_RDMA_READ && i.token == read.id)
        {
            item.finish(registry, STATUS_OP_RDMA_READ | bits, length);
        }
        let completed = s.advance();
        drop(s);
        for _ in 0..completed {
            self.push_cq(false);
        }
        self.bump();
        Ok(broken)
    }

    /// Drains this VI's ring for its reads in flight and the answers it
    /// owes, and gives up a read whose target has been silent past
    /// [`RING_ROOM_LIMIT`].
    pub(crate) fn ring_progress(&self) {
        let mut r = self.recv.lock();
        let broken = self.drain(&mut r, crate::vi::Drain::All);
        drop(r);
        let why = broken.or_else(|| self.give_up_silent_read());
        if let Some(why) = why {
            self.break_connection(why);
        }
    }

    /// Completes the first ring read in flight with a transport error if
    /// its target sent nothing for it for [`RING_ROOM_LIMIT`]: the
    /// connection is lost (returned).
    fn give_up_silent_read(&self) -> Option<Break> {
        let mut s = self.send.lock();
        if s.ring_reads.front()?.since.elapsed() <= RING_ROOM_LIMIT {
            return None;
        }
        tracing::warn!(vi = self.handle, "the peer did not answer an RDMA read for {RING_ROOM_LIMIT:?}");
        let read = s.ring_reads.pop_front().expect("a read in flight");
        count_work(self, -1);
        let first = s.done;
        let registry = &self.nic.registry;
        if let Some(item) =
            s.items.iter_mut().skip(first).find(|i| !i.done && i.op == STATUS_OP_RDMA_READ && i.token == read.id)
        {
            item.finish(registry, STATUS_OP_RDMA_READ | STATUS_TRANSPORT_ERROR, 0);
        }
        let completed = s.advance();
        drop(s);
        for _ in 0..completed {
            self.push_cq(false);
        }
        Some(super::shm_path::LOST)
    }

    /// Forgets the ring reads in flight (their descriptors are flushed by
    /// the caller) and the answers owed: the connection is going.
    pub(crate) fn forget_ring_work(&self, r: &mut RecvQueue, s: &mut SendQueue) {
        let n = r.answers.len() + s.ring_reads.len();
        r.answers.clear();
        s.ring_reads.clear();
        if n > 0 {
            count_work(self, -(n as isize));
        }
    }

    /// The segment to sleep on while this VI waits for ring work: reads
    /// in flight or answers owed.
    pub(crate) fn ring_wait_segment(&self) -> Option<Arc<ConnSegment>> {
        if self.ring_work.load(Ordering::Acquire) == 0 {
            return None;
        }
        self.recv.lock().seg.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(addr: u64, handle: u32) -> [u8; RDMA_TARGET_BYTES] {
        let mut t = [0u8; RDMA_TARGET_BYTES];
        t[..8].copy_from_slice(&addr.to_le_bytes());
        t[8..].copy_from_slice(&handle.to_le_bytes());
        t
    }

    fn request(len: u32, id: u64) -> SlotHeader {
        SlotHeader {
            kind: SLOT_RDMA_READ,
            length: len,
            recv_seq: id,
            inline_len: RDMA_TARGET_BYTES as u32,
            ..Default::default()
        }
    }

    fn piece(id: u64, total: u32, at: u32, n: u32, status: u32) -> SlotHeader {
        SlotHeader {
            kind: SLOT_RDMA_READ_PIECE,
            length: total,
            recv_seq: id,
            aux: u64::from(at),
            inline_len: n,
            status,
            ..Default::default()
        }
    }

    #[test]
    fn a_request_is_its_fields_and_nothing_else() {
        let t = target(0x7f00_0000_1000, 0x0003_0007);
        let want = Request { id: 9, addr: 0x7f00_0000_1000, handle: 0x0003_0007, len: 4096 };
        assert_eq!(parse_request(&request(4096, 9), &t), Some(want));
        for bad in [
            SlotHeader { status: 1, ..request(4096, 9) },
            SlotHeader { aux: 1, ..request(4096, 9) },
            SlotHeader { flags: 1, ..request(4096, 9) },
            SlotHeader { inline_len: 8, ..request(4096, 9) },
            SlotHeader { kind: SLOT_RDMA_READ_PIECE, ..request(4096, 9) },
        ] {
            assert_eq!(parse_request(&bad, &t), None, "{bad:?}");
        }
    }

    #[test]
    fn pieces_must_answer_what_was_asked_in_order() {
        // Read 7 of 3000 bytes, 1024 in.
        assert_eq!(check_piece(7, 3000, 1024, &piece(7, 3000, 1024, 1024, 0)), Some(Piece::Data(1024)));
        assert_eq!(check_piece(7, 3000, 2048, &piece(7, 3000, 2048, 952, 0)), Some(Piece::Data(952)));
        assert_eq!(check_piece(7, 3000, 1024, &piece(7, 3000, 1024, 0, STATUS_RDMA_PROT_ERROR)), Some(Piece::Refused));
        for bad in [
            piece(8, 3000, 1024, 1024, 0),                    // another read
            piece(7, 3001, 1024, 1024, 0),                    // another length
            piece(7, 3000, 0, 1024, 0),                       // out of order
            piece(7, 3000, 2048, 1024, 0),                    // a gap
            piece(7, 3000, 1024, 0, 0),                       // empty
            piece(7, 3000, 2048, 953, 0),                     // past the end (checked at 2048)
            piece(7, 3000, 1024, 10, STATUS_RDMA_PROT_ERROR), // a refusal with bytes
            piece(7, 3000, 1024, 0, STATUS_TRANSPORT_ERROR),  // another status
            SlotHeader { flags: 2, ..piece(7, 3000, 1024, 1024, 0) },
            SlotHeader { kind: SLOT_RDMA_READ, ..piece(7, 3000, 1024, 1024, 0) },
        ] {
            let got = if bad.aux == 2048 { 2048 } else { 1024 };
            assert_eq!(check_piece(7, 3000, got, &bad), None, "{bad:?}");
        }
        // A read of nothing is answered by one empty piece.
        assert_eq!(check_piece(1, 0, 0, &piece(1, 0, 0, 0, 0)), Some(Piece::Data(0)));
        assert_eq!(check_piece(1, 0, 0, &piece(1, 0, 0, 1, 0)), None);
    }

    #[test]
    fn an_answer_is_pieces_of_at_most_a_slot_then_nothing() {
        let r = Request { id: 3, addr: 0x10_0000, handle: 5, len: 2 * INLINE_MAX as u32 + 100 };
        let mut a = Answer::new(r, false);
        let mut seen = Vec::new();
        while let Some((hdr, at, n)) = a.next() {
            assert_eq!(check_piece(3, r.len, a.sent, &SlotHeader { inline_len: n, ..hdr }), Some(Piece::Data(n)));
            seen.push((at, n));
            a.sent(n);
        }
        let k = INLINE_MAX as u32;
        assert_eq!(seen, [(0x10_0000, k), (0x10_0000 + u64::from(k), k), (0x10_0000 + 2 * u64::from(k), 100)]);
        // Nothing to read: one empty piece.
        let mut empty = Answer::new(Request { len: 0, ..r }, false);
        let (hdr, _, n) = empty.next().unwrap();
        assert_eq!((n, check_piece(3, 0, 0, &hdr)), (0, Some(Piece::Data(0))));
        empty.sent(0);
        assert!(empty.next().is_none());
        // Refused at once, or half-way: one refusal where it stopped, then nothing.
        let mut no = Answer::new(r, true);
        let (hdr, _, n) = no.next().unwrap();
        assert_eq!((n, check_piece(3, r.len, 0, &hdr)), (0, Some(Piece::Refused)));
        no.sent(0);
        assert!(no.next().is_none());
        let mut half = Answer::new(r, false);
        half.sent(k);
        half.refused = true;
        let (hdr, _, _) = half.next().unwrap();
        assert_eq!(check_piece(3, r.len, k, &hdr), Some(Piece::Refused));
    }
}
