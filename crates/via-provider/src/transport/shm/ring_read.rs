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
//!
//! This module is the protocol and its state; the VI's side of it is
//! `read_path`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;
use via_core::consts::*;
use via_core::descriptor::{DescPtr, Segs};
use via_shm::ring::{SlotHeader, INLINE_MAX, RDMA_TARGET_BYTES, SLOT_RDMA_READ, SLOT_RDMA_READ_PIECE};

/// Ring reads in flight and answers owed in this process, all VIs
/// together: while zero, a poll looks no further ([`pending`]).
static RING_WORK: AtomicUsize = AtomicUsize::new(0);

/// Counts ring work in (`delta` > 0) or out.
pub(crate) fn count(delta: isize) {
    if delta >= 0 {
        RING_WORK.fetch_add(delta as usize, Ordering::AcqRel);
    } else {
        RING_WORK.fetch_sub(delta.unsigned_abs(), Ordering::AcqRel);
    }
}

/// Whether any VI of this process has ring reads in flight or answers owed.
pub(crate) fn pending() -> bool {
    RING_WORK.load(Ordering::Relaxed) != 0
}

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
    pub(crate) fn new(r: Request, refused: bool) -> Answer {
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
