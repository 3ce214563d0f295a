//! The VI's side of RDMA reads through the ring ([`super::ring_read`]):
//! the initiator posts a read and takes its answer's pieces; the target
//! checks a request and pumps its answer out as its ring has room.

use super::path::{push_room, scattered, RING_ROOM_LIMIT};
use super::ring_read::{self, check_piece, parse_request, Answer, Piece, RingRead};
use crate::counters::Counter;
use crate::queue_lock::QueueGuard;
use crate::transport::shm::Conn;
use crate::vi::{Break, RecvQueue, SendItem, SendQueue, Vi};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use via_core::consts::error_code;
use via_core::consts::*;
use via_core::descriptor::{buffers_registered, DescPtr, Rules, WorkRequest};
use via_core::registry::REGION_RDMA_READ;
use via_shm::conn::ConnSegment;
use via_shm::ring::{SlotHeader, RDMA_TARGET_BYTES, RING_SLOTS, SLOT_RDMA_READ};

/// A refused RDMA read through the ring, on a reliable VI, as its
/// initiator learns of it: the target reports the protection error, the
/// initiator the connection lost (its descriptor says why), as on every path.
pub(crate) const RDMAR_REFUSED: Break = Break { mine: error_code::CONN_LOST, theirs: error_code::RDMAR_PROT };

/// Slots an answer leaves free in the answering side's ring: requests,
/// sends and writes of its own always find room, whatever it owes.
const ANSWER_ROOM: usize = RING_SLOTS / 2;

/// Counts ring work of `vi` in (`delta` > 0) or out.
fn count_work(vi: &Vi, delta: isize) {
    ring_read::count(delta);
    if delta >= 0 {
        vi.ring_work.fetch_add(delta as usize, Ordering::AcqRel);
    } else {
        vi.ring_work.fetch_sub(delta.unsigned_abs(), Ordering::AcqRel);
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
                Err(()) => Some((STATUS_TRANSPORT_ERROR, super::path::LOST)),
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
                        token: id,
                        answer: None,
                        mem,
                        epoch,
                        op: STATUS_OP_RDMA_READ,
                        length: total,
                        done: false,
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
        self.queue_completed_send(q, desc, mem);
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
        Some(super::path::LOST)
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
