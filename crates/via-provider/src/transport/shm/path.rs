//! The data path of VIs connected through shared memory (`transport::shm`):
//! a send is carried out by the posting thread inside `post_send`, copied
//! inline into the ring or written with one cross-memory copy into the
//! receive buffer the peer published, so its descriptor is complete when
//! `post_send` returns; an RDMA read through the ring (where the kernel
//! forbids cross-memory attach) stays in flight until its answer is drained
//! (`ring_read`).  Receives complete when the owner drains its ring.

use crate::counters::{Counter, CounterRow, StageTimer};
use crate::endpoint::PeerMessage;
use crate::endpoint::NO_CQ;
use crate::queue_lock::QueueGuard;
use crate::transport::shm::Conn;
use crate::transport::Ending;
use crate::vi::{
    reliable, Break, Drain, Link, Pieces, RecvQueue, RingWrite, SendQueue, Transport, Vi, ViAttrs, ViState, WorkQueue,
};
use std::io::{IoSlice, IoSliceMut};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use via_core::consts::error_code;
use via_core::consts::*;
use via_core::descriptor::{validate, DescPtr, LocalSeg, Op, Rules, WorkRequest};
use via_core::registry::{PublishedTable, Region, REGION_RDMA_READ, REGION_RDMA_WRITE};
use via_shm::cma;
use via_shm::conn::ConnSegment;
use via_shm::recv::RecvSeg;
use via_shm::ring::{
    SlotHeader, INLINE_MAX, RDMA_TARGET_BYTES, SLOT_RDMA_PIECE, SLOT_RDMA_READ, SLOT_RDMA_READ_PIECE, SLOT_RDMA_WRITE,
    SLOT_RDMA_WRITE_IMM, SLOT_SEND, SLOT_SEND_PIECE,
};

/// Slot flag: `imm` is valid.
const FLAG_IMMEDIATE: u32 = 1;

/// Slot flag: the payload is inline in the slot.
const FLAG_INLINE: u32 = 2;

/// Slot flag (with `FLAG_INLINE`): the slot holds the first piece of a
/// message; `SLOT_SEND_PIECE` slots carry the rest.
const FLAG_PIECES: u32 = 4;

/// How long a send through the ring in pieces waits for the receiver to
/// make room before the connection is given up.
pub(crate) const RING_ROOM_LIMIT: Duration = Duration::from_secs(10);

impl Transport for Conn {
    fn complete(self: Arc<Self>, vi: &Arc<Vi>) {
        let _r = vi.recv.lock();
        let mut s = vi.send.lock();
        cma::allow_peer(self.peer_pid);
        vi.lane.store(self.lane_in.id, Ordering::Release);
        vi.nic.shm_conns.lock().push((vi.handle, Arc::downgrade(&self)));
        vi.attach_link(&mut s, Link::Shm(self.clone()));
        vi.set_state(ViState::Connected);
        vi.nic.counters.add(Counter::Connects, 1);
        drop(s);
        self.watch();
        vi.bump();
    }

    /// At once, with the descriptor complete on return, except an RDMA
    /// read through the ring.
    fn post(
        vi: &Vi,
        q: QueueGuard<'_, SendQueue>,
        desc: DescPtr,
        mem: u32,
        own: &Region,
        rules: &Rules,
        attrs: &ViAttrs,
    ) {
        vi.post_shm(q, desc, mem, own, rules, attrs)
    }

    /// Waits out the peer's copies under way.
    fn end(&self, how: Ending) {
        match how {
            Ending::Disconnect => self.tell(PeerMessage::Disconnect),
            Ending::Break(Some(code)) => self.tell(PeerMessage::Break(code)),
            Ending::Break(None) => {}
        }
        self.unwatch();
        self.close_fenced();
    }

    /// Nothing to move without the locks: a poll drains the ring under
    /// the receive queue's (`drain_ring`), where sends complete at once.
    fn progress(_vi: &Vi) -> bool {
        false
    }

    /// The ring's producer wakes the wait: for the receive queue, a
    /// message; for the send queue, the answer of an RDMA read through
    /// the ring (`ring_read`), if one is in flight.
    fn sleep(vi: &Vi, queue: WorkQueue, word: u32, nap: Duration) {
        let seg = match queue {
            WorkQueue::Recv => vi.recv.lock().seg.clone(),
            WorkQueue::Send => vi.ring_wait_segment(),
        };
        match seg {
            Some(seg) => seg.rx().wait(Some(nap)),
            None => vi.sleep_on_word(word, nap),
        }
    }
}

impl Vi {
    /// Carries out a send-queue operation on the shared-memory connection
    /// `q` holds (`Transport::post`).
    fn post_shm(
        &self,
        mut q: QueueGuard<'_, SendQueue>,
        desc: DescPtr,
        mem: u32,
        own: &Region,
        rules: &Rules,
        attrs: &ViAttrs,
    ) {
        let counters = &self.nic.counters;
        let queue = &mut *q;
        // The link's field, not `conn()`: the tally is borrowed beside it.
        let Some(Link::Shm(conn)) = &queue.link else {
            unreachable!("posted on shared memory without a shared-memory link")
        };
        let timer = StageTimer::start();
        let inline = InlineSend::check(conn, desc, mem, own, rules, attrs.reliability);
        timer.stop(counters, Counter::ValidateNs, None);
        if let Some(send) = inline {
            let timer = StageTimer::start();
            if let Some((status, length, broken)) = send.push(conn, &mut queue.tally) {
                self.hot.tx_slot.store(conn.seg.tx().next_push_slot() as usize, Ordering::Relaxed);
                timer.stop(counters, Counter::TransferNs, Some(Counter::Transfers));
                self.finish_send(q, desc, mem, STATUS_OP_SEND | status, length, broken);
                return;
            }
        }
        let timer = StageTimer::start();
        let checked = validate(desc, mem, own, false, rules);
        timer.stop(counters, Counter::ValidateNs, None);
        let timer = StageTimer::start();
        let (status, length, broken) = match checked {
            Err(bits) => {
                let why = reliable(attrs.reliability)
                    .then_some(Break { mine: error_code::POST_DESC, theirs: error_code::CONN_LOST });
                (desc.op_status_bits() | bits, 0, why)
            }
            Ok(wr) if wr.op == Op::RdmaRead && wr.remote.is_some() => {
                let conn = conn.clone();
                let done = match conn.attach() {
                    true => read_by_attach(&conn, &wr, reliable(attrs.reliability), &mut queue.tally),
                    false => None,
                };
                match done {
                    Some((status, length, why)) => {
                        timer.stop(counters, Counter::TransferNs, Some(Counter::Transfers));
                        (wr.op.status_bits(false) | status, length, why)
                    }
                    None => {
                        // The kernel does not let us into the target: the
                        // request goes through the ring and the descriptor
                        // stays in flight until the target's answer is
                        // drained (`ring_read`).
                        self.post_ring_read(q, &conn, desc, mem, &wr, rules);
                        timer.stop(counters, Counter::TransferNs, Some(Counter::Transfers));
                        return;
                    }
                }
            }
            Ok(wr) => {
                let (status, length, why) =
                    execute(conn, &wr, reliable(attrs.reliability), attrs.reliability, &mut queue.tally);
                self.hot.tx_slot.store(conn.seg.tx().next_push_slot() as usize, Ordering::Relaxed);
                timer.stop(counters, Counter::TransferNs, Some(Counter::Transfers));
                (wr.op.status_bits(false) | status, length, why)
            }
        };
        self.finish_send(q, desc, mem, status, length, broken);
    }

    /// Completes a send carried out at once with `status` and `length`,
    /// queues it as complete and unlocks the queue; then breaks the
    /// connection if `broken` says why.
    fn finish_send(
        &self,
        q: QueueGuard<'_, SendQueue>,
        desc: DescPtr,
        mem: u32,
        status: u32,
        length: u32,
        broken: Option<Break>,
    ) {
        let timer = StageTimer::start();
        desc.complete(status, length, None);
        self.queue_completed_send(q, desc, mem);
        timer.stop(&self.nic.counters, Counter::CompleteNs, Some(Counter::Completions));
        self.bump();
        if let Some(why) = broken {
            self.break_connection(why);
        }
    }

    /// `VipRecvDone`'s common case on shared memory, in one step, while
    /// no receive is complete and nothing else is under way on the ring
    /// (pieces, an RDMA write, answers owed): an empty ring, or a whole
    /// inline send (with or without immediate data) in its next slot for
    /// the first pending receive, whose buffers are still registered and
    /// long enough, which is taken and completes that receive.  False
    /// leaves everything as it was for `drain`, which takes the same slot
    /// the same way and handles every other case.
    pub(crate) fn drain_inline_send(&self, q: &mut RecvQueue) -> bool {
        // A network VI has no ring, and costs one test here.
        let Some(seg) = q.seg.as_deref() else { return false };
        let rx = seg.rx();
        if q.done != 0 || q.failed != 0 || q.pieces.is_some() || q.rdma.is_some() || !q.answers.is_empty() {
            return false;
        }
        let hdr = match rx.peek() {
            Ok(Some(hdr)) => hdr,
            Ok(None) => return true,
            Err(_) => return false,
        };
        let Some(item) = q.items.front_mut() else { return false };
        if hdr.kind != SLOT_SEND
            || hdr.flags & !FLAG_IMMEDIATE != FLAG_INLINE
            || hdr.status != 0
            || item.seq != Some(hdr.recv_seq)
            || hdr.length as u64 > item.total
            || self.nic.registry.deregistrations() != item.epoch
        {
            return false;
        }
        let timer = StageTimer::start();
        // SAFETY (both): validated against the registry when posted, and
        // no region went since (`deregistrations`).
        let buffer = |s: &LocalSeg| unsafe { std::slice::from_raw_parts_mut(s.addr as *mut u8, s.len as usize) };
        let small = item.segs.first().and_then(|s| rx.read_small(buffer(s)));
        let length = small.unwrap_or_else(|| rx.read_payload_into(item.segs.iter().map(buffer))) as u32;
        let imm = (hdr.flags & FLAG_IMMEDIATE != 0).then_some(hdr.imm);
        let status = STATUS_OP_RECEIVE | if imm.is_some() { STATUS_IMMEDIATE } else { 0 };
        item.desc.complete(status, length, imm);
        item.done = true;
        q.done += 1;
        rx.pop();
        self.hot.rx_slot.store(rx.next_slot() as usize, Ordering::Relaxed);
        q.tally.add(Counter::MsgsReceived, 1);
        q.tally.add(Counter::BytesReceived, length as u64);
        timer.stop(&self.nic.counters, Counter::ReceiveNs, Some(Counter::Receives));
        true
    }

    pub(crate) fn drain_ring(&self, q: &mut RecvQueue, seg: &ConnSegment, how: Drain) -> Option<Break> {
        let rx = seg.rx();
        let impossible = || {
            tracing::warn!(vi = self.handle, "peer wrote an impossible ring entry");
            Some(LOST)
        };
        let closing = matches!(how, Drain::Closing);
        // RDMA reads this VI owes go on as the peer makes room.
        if !q.answers.is_empty() && !closing && self.pump_answers(q, seg).is_err() {
            return impossible();
        }
        let mut broken = None;
        loop {
            self.settle(q);
            if let Drain::Past(n) = how {
                if q.done > n {
                    return broken;
                }
            }
            let hdr = match rx.peek() {
                Ok(Some(h)) => h,
                Ok(None) => return broken,
                Err(_) => return impossible(),
            };
            if hdr.kind == SLOT_RDMA_WRITE || hdr.kind == SLOT_RDMA_PIECE || q.rdma.is_some() {
                match self.ring_write_slot(q, rx, &hdr) {
                    Ok(None) => continue,
                    Ok(Some(why)) => return Some(why),
                    Err(()) => return impossible(),
                }
            }
            if hdr.kind == SLOT_RDMA_READ || hdr.kind == SLOT_RDMA_READ_PIECE {
                let taken = if hdr.kind == SLOT_RDMA_READ {
                    self.ring_read_request(q, seg, &hdr, closing).map(|()| None)
                } else if q.pieces.is_some() {
                    Err(())
                } else {
                    self.ring_read_piece(seg, &hdr, closing)
                };
                self.hot.rx_slot.store(rx.next_slot() as usize, Ordering::Relaxed);
                match taken {
                    Ok(None) => continue,
                    Ok(Some(why)) => return Some(why),
                    Err(()) => return impossible(),
                }
            }
            let timer = StageTimer::start();
            let index = q.done;
            let pieces = q.pieces;
            let Some(item) = q.items.get_mut(index) else {
                return impossible();
            };
            let kind_ok = match pieces {
                Some(_) => hdr.kind == SLOT_SEND_PIECE,
                None => hdr.kind == SLOT_SEND || hdr.kind == SLOT_RDMA_WRITE_IMM,
            };
            if item.seq != Some(hdr.recv_seq) || !kind_ok {
                return impossible();
            }
            let mut status =
                if hdr.kind == SLOT_RDMA_WRITE_IMM { STATUS_OP_REMOTE_RDMA_WRITE } else { STATUS_OP_RECEIVE };
            let mut imm = (hdr.flags & FLAG_IMMEDIATE != 0).then_some(hdr.imm);
            let mut length = hdr.length;
            // Whether the descriptor and its buffers are still registered:
            // they were when it was posted, and unless a region went since
            // (one load) they are.
            let registry = &self.nic.registry;
            let (desc_live, buffers_live) = if registry.deregistrations() == item.epoch {
                (true, true)
            } else {
                let live = registry.is_live(item.mem);
                (live, live && via_core::descriptor::buffers_registered(item.desc, &item.segs, &self.rules().0))
            };
            if pieces.is_some() || (hdr.kind == SLOT_SEND && hdr.flags & FLAG_PIECES != 0) {
                // A message through the ring in pieces, in order, each
                // checked against the message and the message against
                // this descriptor before a byte is copied.
                let mut p = match pieces {
                    Some(p) => p,
                    None if hdr.status != 0 || hdr.flags & FLAG_INLINE == 0 || hdr.length as u64 > item.total => {
                        return impossible();
                    }
                    None => Pieces { seq: hdr.recv_seq, total: hdr.length, got: 0, error: 0, imm },
                };
                // The message's immediate data came with its first piece.
                imm = p.imm;
                if hdr.recv_seq != p.seq
                    || hdr.length != p.total
                    || hdr.aux != p.got as u64
                    || hdr.inline_len == 0
                    || hdr.inline_len > p.total - p.got
                {
                    return impossible();
                }
                if p.error == 0 && !buffers_live {
                    p.error = STATUS_PROTECTION_ERROR;
                }
                if p.error == 0 {
                    rx.read_payload_into(scattered(&item.segs, p.got as u64));
                }
                p.got += hdr.inline_len;
                rx.pop();
                if p.got < p.total {
                    q.pieces = Some(p);
                    continue;
                }
                q.pieces = None;
                if p.error != 0 {
                    status |= p.error;
                    length = 0;
                    if desc_live && reliable(self.attrs().reliability) {
                        broken = Some(Break { mine: error_code::POST_DESC, theirs: error_code::CONN_LOST });
                    }
                } else {
                    length = p.total;
                }
            } else if hdr.status & STATUS_ERROR_MASK != 0 {
                status |= hdr.status & STATUS_ERROR_MASK;
                length = 0;
            } else if hdr.kind == SLOT_SEND && (hdr.length as u64) > item.total {
                // An inline send: its sender did not look at this descriptor.
                status |= STATUS_LENGTH_ERROR;
                length = 0;
                if reliable(self.attrs().reliability) {
                    broken = Some(LOST);
                }
            } else if hdr.kind == SLOT_SEND && !buffers_live {
                // A buffer was deregistered after the post, and its memory
                // may be gone: no byte lands, a local protection error.  (Or
                // the descriptor's own region went, and with it what its
                // buffers are: nothing lands, nothing is written, and the
                // connection, which did nothing wrong, goes on.)
                status |= STATUS_PROTECTION_ERROR;
                length = 0;
                if desc_live && reliable(self.attrs().reliability) {
                    broken = Some(Break { mine: error_code::POST_DESC, theirs: error_code::CONN_LOST });
                }
            } else if hdr.flags & FLAG_INLINE != 0 {
                let dst = item
                    .segs
                    .iter()
                    // SAFETY: validated against the registry when posted.
                    .map(|s| unsafe { std::slice::from_raw_parts_mut(s.addr as *mut u8, s.len as usize) });
                length = rx.read_payload_into(dst) as u32;
            }
            if imm.is_some() {
                status |= STATUS_IMMEDIATE;
            }
            // The descriptor's own region may have gone the same way: then
            // it is handed back unwritten rather than written into memory
            // that may no longer be there.
            if desc_live {
                item.desc.complete(status, length, imm);
            }
            item.done = true;
            q.done += 1;
            rx.pop();
            self.hot.rx_slot.store(rx.next_slot() as usize, Ordering::Relaxed);
            if status & STATUS_ERROR_MASK == 0 {
                q.tally.add(Counter::MsgsReceived, 1);
                q.tally.add(Counter::BytesReceived, length as u64);
            }
            timer.stop(&self.nic.counters, Counter::ReceiveNs, Some(Counter::Receives));
        }
    }

    /// Takes in one slot of an RDMA write through the ring (the peek of
    /// `hdr`): its header is checked against this process's registry, tag
    /// and enables (as `udp::path::local_allows` does for the network), its
    /// pieces land only where that allowed, and each piece's range is
    /// checked again where it lands (a region deregistered meanwhile takes
    /// no byte).  A refused write writes nothing; on a reliable VI it
    /// breaks the connection (returned), on an unreliable one it is
    /// dropped.  `Err`: the peer wrote something impossible.
    fn ring_write_slot(&self, q: &mut RecvQueue, rx: &via_shm::Ring, hdr: &SlotHeader) -> Result<Option<Break>, ()> {
        let refused_before = q.rdma.is_some_and(|w| w.refused);
        let w = match (q.rdma, hdr.kind) {
            (None, SLOT_RDMA_WRITE) if q.pieces.is_none() => {
                if hdr.status != 0
                    || hdr.aux != 0
                    || hdr.flags & !FLAG_IMMEDIATE != 0
                    || hdr.inline_len as usize != RDMA_TARGET_BYTES
                {
                    return Err(());
                }
                let mut target = [0u8; RDMA_TARGET_BYTES];
                if rx.read_payload(&mut [&mut target[..]]) != RDMA_TARGET_BYTES {
                    return Err(());
                }
                let addr = u64::from_le_bytes(target[..8].try_into().map_err(|_| ())?);
                let handle = u32::from_le_bytes(target[8..].try_into().map_err(|_| ())?);
                let imm = if hdr.flags & FLAG_IMMEDIATE != 0 {
                    // The receive it consumes is the next one posted here.
                    if q.items.get(q.done).is_none_or(|i| i.seq != Some(hdr.recv_seq)) {
                        return Err(());
                    }
                    Some((hdr.recv_seq, hdr.imm))
                } else {
                    None
                };
                let refused = !self.ring_write_allowed(handle, addr, hdr.length as u64);
                RingWrite { addr, handle, total: hdr.length, got: 0, refused, imm }
            }
            (Some(mut w), SLOT_RDMA_PIECE) => {
                if hdr.length != w.total
                    || hdr.aux != w.got as u64
                    || hdr.inline_len == 0
                    || hdr.inline_len > w.total - w.got
                {
                    return Err(());
                }
                let n = hdr.inline_len;
                let at = w.addr.wrapping_add(w.got as u64);
                if !w.refused && !self.ring_write_allowed(w.handle, at, n as u64) {
                    w.refused = true;
                }
                if !w.refused {
                    // SAFETY: [at, at + n) lies in a region of this process
                    // registered for RDMA write under the VI's tag, checked
                    // just now.
                    let dst = unsafe { std::slice::from_raw_parts_mut(at as *mut u8, n as usize) };
                    rx.read_payload(&mut [dst]);
                }
                w.got += n;
                w
            }
            _ => return Err(()),
        };
        rx.pop();
        self.hot.rx_slot.store(rx.next_slot() as usize, Ordering::Relaxed);
        let reliable = reliable(self.attrs().reliability);
        let refused_now = w.refused && !refused_before;
        if refused_now {
            self.nic.counters.add(Counter::RdmaRefused, 1);
        }
        if w.got < w.total {
            q.rdma = Some(w);
        } else {
            q.rdma = None;
            if let Some((seq, imm)) = w.imm {
                let Some(item) = q.items.get_mut(q.done).filter(|i| i.seq == Some(seq)) else {
                    return Err(());
                };
                let mut status = STATUS_OP_REMOTE_RDMA_WRITE | STATUS_IMMEDIATE;
                let length = if w.refused {
                    status |= STATUS_RDMA_PROT_ERROR;
                    0
                } else {
                    w.total
                };
                item.finish(&self.nic.registry, status, length, Some(imm));
                q.done += 1;
                if !w.refused {
                    q.tally.add(Counter::MsgsReceived, 1);
                    q.tally.add(Counter::BytesReceived, length as u64);
                }
            }
        }
        Ok((refused_now && reliable).then_some(RDMAW_REFUSED))
    }

    /// Whether this VI lets the peer write `[addr, addr + len)` of region
    /// `handle`: the VI and the region enable RDMA write, the region is
    /// live, holds the range and has the VI's protection tag.
    fn ring_write_allowed(&self, handle: u32, addr: u64, len: u64) -> bool {
        let (rules, attrs) = self.rules();
        attrs.rdma_write
            && matches!(rules.registry.lookup(handle),
                Some(r) if r.ptag == rules.ptag && r.flags & REGION_RDMA_WRITE != 0 && r.contains(addr, len))
    }
}

/// The buffers of a validated descriptor, inline for the usual few: a copy
/// allocates nothing.
type Slices<T> = smallvec::SmallVec<[T; 4]>;

fn local_slices(segs: &[LocalSeg]) -> Slices<IoSlice<'static>> {
    segs.iter()
        // SAFETY: validated against the registry when posted.
        .map(|s| IoSlice::new(unsafe { std::slice::from_raw_parts(s.addr as *const u8, s.len as usize) }))
        .collect()
}

fn local_slices_mut(segs: &[LocalSeg]) -> Slices<IoSliceMut<'static>> {
    segs.iter()
        // SAFETY: validated against the registry when posted.
        .map(|s| IoSliceMut::new(unsafe { std::slice::from_raw_parts_mut(s.addr as *mut u8, s.len as usize) }))
        .collect()
}

const NO_RECV: Break = Break { mine: error_code::CONN_LOST, theirs: error_code::RECVQ_EMPTY };
pub(crate) const LOST: Break = Break { mine: error_code::CONN_LOST, theirs: error_code::CONN_LOST };
/// An RDMA write through the ring that this side refused, on a reliable VI:
/// this side reports the protection error, the initiator the connection
/// lost (its descriptor says why), as on every path.
const RDMAW_REFUSED: Break = Break { mine: error_code::RDMAW_PROT, theirs: error_code::CONN_LOST };

/// Carries out one validated send-queue operation on a connection.
/// Returns the status bits to add, the length, and whether the connection must break.
fn execute(
    conn: &Conn,
    wr: &WorkRequest,
    reliable: bool,
    level: u16,
    tally: &mut CounterRow,
) -> (u32, u32, Option<Break>) {
    let total = wr.total as u32;
    match wr.op {
        Op::SendRecv => deliver(conn, wr, SLOT_SEND, reliable, level, tally),
        Op::RdmaWrite => {
            let Some((addr, handle)) = wr.remote else {
                return (STATUS_FORMAT_ERROR, 0, None);
            };
            if !conn.attach() {
                // The kernel does not let us into the target: through the
                // ring, checked by the target against its own registry.
                return ring_write(conn, wr, addr, handle, reliable, tally);
            }
            if small_write_with_immediate(wr, level, conn.inline_max) {
                // Through the ring, as a send is: the target takes the
                // immediate data from its ring anyway, and places the bytes
                // just before (checked against its own registry); cheaper
                // than a system call.
                return ring_write(conn, wr, addr, handle, reliable, tally);
            }
            let copied = {
                // Announced before the check: the peer's fences wait for it.
                let Some(_copy) = conn.seg.begin_copy() else {
                    return (STATUS_TRANSPORT_ERROR, 0, Some(LOST));
                };
                if !remote_allows(conn, addr, handle, wr.total, true) {
                    return refused_write(conn, reliable);
                }
                match wr.total {
                    0 => Ok(0),
                    n => cma::write_remote(conn.peer_pid, &local_slices(&wr.segs), &[(addr, n as usize)]),
                }
            };
            match copied {
                Ok(_) => {}
                // Refused, so nothing moved: the whole write through the ring.
                Err(e) if conn.attach_refused(&e) => return ring_write(conn, wr, addr, handle, reliable, tally),
                Err(_) => return (STATUS_TRANSPORT_ERROR, 0, Some(LOST)),
            }
            tally.add(Counter::RdmaWrites, 1);
            tally.add(Counter::CmaCopies, (wr.total > 0) as u64);
            if wr.immediate.is_some() {
                let (bits, _, why) = deliver(conn, wr, SLOT_RDMA_WRITE_IMM, reliable, level, tally);
                return (bits, total, why);
            }
            (0, total, None)
        }
        // A read with its address segment is `carry_out`'s (`read_by_attach`
        // or through the ring): here only one without.
        Op::RdmaRead => (STATUS_FORMAT_ERROR, 0, None),
    }
}

/// Whether an RDMA write goes through the ring although the kernel lets
/// this process copy into the target: one small enough to be copied inline
/// (`VIA_INLINE_MAX`) that completes with immediate data, so the target
/// drains its ring to take it.  Not at reliable reception, where a write
/// completes only once its bytes are in the target's memory.  A write
/// without immediate data is always copied at once: a target may poll its
/// memory for it without calling the library.
fn small_write_with_immediate(wr: &WorkRequest, level: u16, inline_max: usize) -> bool {
    wr.immediate.is_some() && wr.total <= inline_max as u64 && level != SERVICE_RELIABLE_RECEPTION
}

/// An RDMA read by cross-memory attach: the status bits to add, the
/// length and whether the connection must break; `None` when the kernel
/// refused the copy (nothing was read) and the read must go through the
/// ring ([`Conn::attach_refused`]).
fn read_by_attach(
    conn: &Conn,
    wr: &WorkRequest,
    reliable: bool,
    tally: &mut CounterRow,
) -> Option<(u32, u32, Option<Break>)> {
    let (addr, handle) = wr.remote?;
    let copied = {
        // Announced before the check: the peer's fences wait for it.
        let Some(_copy) = conn.seg.begin_copy() else {
            return Some((STATUS_TRANSPORT_ERROR, 0, Some(LOST)));
        };
        if !remote_allows(conn, addr, handle, wr.total, false) {
            conn.counters.add(Counter::RdmaRefused, 1);
            let why = reliable.then_some(Break { mine: error_code::CONN_LOST, theirs: error_code::RDMAR_PROT });
            return Some((STATUS_RDMA_PROT_ERROR, 0, why));
        }
        match wr.total {
            0 => Ok(0),
            n => cma::read_remote(conn.peer_pid, &mut local_slices_mut(&wr.segs), &[(addr, n as usize)]),
        }
    };
    match copied {
        Ok(_) => {}
        Err(e) if conn.attach_refused(&e) => return None,
        Err(_) => return Some((STATUS_TRANSPORT_ERROR, 0, Some(LOST))),
    }
    tally.add(Counter::CmaCopies, (wr.total > 0) as u64);
    tally.add(Counter::RdmaReads, 1);
    Some((0, wr.total as u32, None))
}

/// A send that fits a ring slot (the usual small message), checked as
/// `validate` checks it and pushed without building a work request.
struct InlineSend {
    /// Its buffers of more than no bytes, checked against the registry.
    buffers: [(u64, u32); InlineSend::MOST],
    used: usize,
    total: u64,
    immediate: Option<u32>,
}

impl InlineSend {
    /// Buffers of a send this path takes: one or two, the common cases.
    const MOST: usize = 2;

    /// The send `desc` posts, checked as `validate` checks it, if it is
    /// one for this path; `None`, with nothing done, for any other
    /// operation or descriptor, a refused one included, and for a level
    /// that delivers only once the receiver has the bytes: `validate` and
    /// `execute` carry those out.
    #[inline(always)]
    fn check(conn: &Conn, desc: DescPtr, mem: u32, own: &Region, rules: &Rules, level: u16) -> Option<InlineSend> {
        let control = desc.control();
        let count = desc.seg_count() as usize;
        if control & (CONTROL_RESERVED | CONTROL_OP_MASK) != CONTROL_OP_SENDRECV
            || count > Self::MOST
            || level == SERVICE_RELIABLE_RECEPTION
        {
            return None;
        }
        let extent = (CONTROL_SEGMENT_BYTES + count * DATA_SEGMENT_BYTES) as u64;
        if own.ptag != rules.ptag || !own.contains(desc.0 as u64, extent) {
            return None;
        }
        let mut send = InlineSend { buffers: [(0, 0); Self::MOST], used: 0, total: 0, immediate: None };
        for i in 0..count {
            let seg = desc.segment(i);
            let held = match seg.handle == mem {
                true => own.contains(seg.addr, seg.len as u64),
                false => rules.registry.check_local(seg.handle, seg.addr, seg.len as u64, rules.ptag),
            };
            if !held {
                return None;
            }
            send.total += seg.len as u64;
            if seg.len > 0 {
                send.buffers[send.used] = (seg.addr, seg.len);
                send.used += 1;
            }
        }
        if send.total > conn.inline_max as u64 || send.total > rules.max_transfer {
            return None;
        }
        send.immediate = (control & CONTROL_IMMEDIATE != 0).then(|| desc.immediate());
        Some(send)
    }

    /// Takes the peer's next posted receive and pushes the message into
    /// the ring: the status bits to add, the length and whether the
    /// connection must break.  `None`, with nothing done, where no receive
    /// is posted (the general path drops the message or breaks).
    #[inline(always)]
    fn push(&self, conn: &Conn, tally: &mut CounterRow) -> Option<(u32, u32, Option<Break>)> {
        let Ok(Some(seq)) = conn.seg.peer_recvs().take_seq() else {
            return None;
        };
        let hdr = SlotHeader {
            kind: SLOT_SEND,
            length: self.total as u32,
            recv_seq: seq,
            imm: self.immediate.unwrap_or(0),
            flags: FLAG_INLINE | if self.immediate.is_some() { FLAG_IMMEDIATE } else { 0 },
            ..Default::default()
        };
        // SAFETY: checked against the registry by `check` just now, as the
        // general path's buffers are by `validate`.
        let pieces = self.buffers[..self.used]
            .iter()
            .map(|&(addr, len)| unsafe { std::slice::from_raw_parts(addr as *const u8, len as usize) });
        // The peer's CQ entry goes out right behind the message's stamp.
        if conn.seg.tx().push_gather_then(&hdr, pieces, || conn.push_peer_completion()).is_err() {
            return Some((STATUS_TRANSPORT_ERROR, 0, Some(LOST)));
        }
        if conn.peer.recv_cq != NO_CQ {
            conn.ring_peer_if_asleep();
        }
        tally.add(Counter::InlineSends, 1);
        tally.add(Counter::MsgsSent, 1);
        tally.add(Counter::BytesSent, self.total);
        Some((0, self.total as u32, None))
    }
}

/// Consumes the peer's next posted receive for a send (or RDMA write with immediate data).
///
/// An inline send and an immediate need only to know that a receive is
/// posted; the receiver checks the length against its own descriptor
/// (`drain`).  A send by cross-memory attach reads the receive's buffers.
fn deliver(
    conn: &Conn,
    wr: &WorkRequest,
    kind: u32,
    reliable: bool,
    level: u16,
    tally: &mut CounterRow,
) -> (u32, u32, Option<Break>) {
    let total = wr.total;
    let inline = kind == SLOT_SEND && total as usize <= conn.inline_max && level != SERVICE_RELIABLE_RECEPTION;
    // The receive's segments are read only where the bytes go to them; an
    // entry (half a kilobyte) is not moved around on the inline path.
    let mut entry = None;
    let taken = if inline || kind != SLOT_SEND {
        conn.seg.peer_recvs().take_seq()
    } else {
        conn.seg.peer_recvs().take().map(|e| {
            entry = e;
            entry.as_ref().map(|e| e.seq)
        })
    };
    let seq = match taken {
        Ok(Some(seq)) => seq,
        Ok(None) if !reliable => {
            conn.counters.add(Counter::DroppedNoRecv, 1);
            return (0, total as u32, None); // unreliable: dropped
        }
        Ok(None) => return (STATUS_TRANSPORT_ERROR, 0, Some(NO_RECV)),
        Err(_) => return (STATUS_TRANSPORT_ERROR, 0, Some(LOST)),
    };
    let mut hdr = SlotHeader {
        kind,
        length: total as u32,
        recv_seq: seq,
        imm: wr.immediate.unwrap_or(0),
        flags: if wr.immediate.is_some() { FLAG_IMMEDIATE } else { 0 },
        ..Default::default()
    };
    let mut result = (0, total as u32, None);
    let mut payload: &[LocalSeg] = &[];
    let mut pushed = false;
    if entry.as_ref().is_some_and(|e| total > e.total) {
        hdr.status = STATUS_LENGTH_ERROR;
        hdr.length = 0;
        if reliable {
            let bits = if level == SERVICE_RELIABLE_RECEPTION { STATUS_REMOTE_DESC_ERROR } else { 0 };
            result = (bits, total as u32, Some(LOST));
        }
    } else if inline {
        hdr.flags |= FLAG_INLINE;
        tally.add(Counter::InlineSends, 1);
        payload = &wr.segs;
    } else if !conn.attach() && kind == SLOT_SEND {
        match send_through_ring(conn, &mut hdr, wr, tally) {
            Ok(true) => pushed = true,
            Ok(false) => payload = &wr.segs,
            Err(()) => return (STATUS_TRANSPORT_ERROR, 0, Some(LOST)),
        }
    } else if let Some(entry) = entry.filter(|_| total > 0) {
        let copied = {
            // Announced before the check: the peer's fences wait for it.
            let Some(_copy) = conn.seg.begin_copy() else {
                return (STATUS_TRANSPORT_ERROR, 0, Some(LOST));
            };
            // Only as much of the receive buffers as the message fills: the kernel
            // pins every page of the remote ranges it is given.
            let mut left = total;
            let used: smallvec::SmallVec<[RecvSeg; 4]> = entry
                .segs()
                .iter()
                .map_while(|s| {
                    let n = (s.len as u64).min(left);
                    left -= n;
                    (n > 0).then_some(RecvSeg { len: n as u32, ..*s })
                })
                .collect();
            // A buffer the receiver deregistered since it posted it gets
            // nothing; the receiver finds its region gone and reports it.
            match used.iter().all(|s| receiver_holds(conn, s)) {
                true => {
                    let remote: smallvec::SmallVec<[(u64, usize); 4]> =
                        used.iter().map(|s| (s.addr, s.len as usize)).collect();
                    tally.add(Counter::CmaCopies, 1);
                    cma::write_remote(conn.peer_pid, &local_slices(&wr.segs), &remote)
                }
                false => Ok(total as usize),
            }
        };
        match copied {
            Ok(n) if n as u64 == total => {}
            // Refused, so nothing moved: the message through the ring.
            Err(e) if conn.attach_refused(&e) => match send_through_ring(conn, &mut hdr, wr, tally) {
                Ok(true) => pushed = true,
                Ok(false) => payload = &wr.segs,
                Err(()) => return (STATUS_TRANSPORT_ERROR, 0, Some(LOST)),
            },
            _ => return (STATUS_TRANSPORT_ERROR, 0, Some(LOST)),
        }
    }
    if pushed {
        if conn.peer.recv_cq != NO_CQ {
            conn.complete_peer_receive();
        }
    } else {
        // SAFETY: validated against the registry when posted.
        let pieces = payload.iter().map(|s| unsafe { std::slice::from_raw_parts(s.addr as *const u8, s.len as usize) });
        // The peer's CQ entry goes out right behind the message's stamp.
        if conn.seg.tx().push_gather_then(&hdr, pieces, || conn.push_peer_completion()).is_err() {
            return (STATUS_TRANSPORT_ERROR, 0, Some(LOST));
        }
        if conn.peer.recv_cq != NO_CQ {
            conn.ring_peer_if_asleep();
        }
    }
    if kind == SLOT_SEND && hdr.status == 0 {
        tally.add(Counter::MsgsSent, 1);
        tally.add(Counter::BytesSent, total);
    }
    result
}

/// The bytes `offset..offset + len` of the gathered buffers `segs`.
fn gathered(segs: &[LocalSeg], offset: u64, len: u64) -> impl Iterator<Item = &'static [u8]> + Clone + '_ {
    let mut start = 0u64;
    segs.iter().filter_map(move |s| {
        let (from, to) = (start, start + s.len as u64);
        start = to;
        let (a, b) = (from.max(offset), to.min(offset + len));
        // SAFETY: validated against the registry when posted; a..b lies in the segment.
        (a < b).then(|| unsafe { std::slice::from_raw_parts((s.addr + (a - from)) as *const u8, (b - a) as usize) })
    })
}

/// The writable bytes of the gathered buffers `segs` from `offset` on.
pub(crate) fn scattered(segs: &[LocalSeg], offset: u64) -> impl Iterator<Item = &'static mut [u8]> + '_ {
    let mut start = 0u64;
    segs.iter().filter_map(move |s| {
        let (from, to) = (start, start + s.len as u64);
        start = to;
        let a = from.max(offset);
        // SAFETY: validated against the registry when posted; a..to lies in the segment.
        (a < to).then(|| unsafe { std::slice::from_raw_parts_mut((s.addr + (a - from)) as *mut u8, (to - a) as usize) })
    })
}

/// Readies `hdr` for a send through the ring, where this process may not
/// attach to the receiver: the receiver copies the bytes into its
/// descriptor and checks them against it.  A message that fits a slot is
/// left for the caller to push with its payload (`Ok(false)`); a larger
/// one is pushed here, in pieces (`Ok(true)`).
fn send_through_ring(conn: &Conn, hdr: &mut SlotHeader, wr: &WorkRequest, tally: &mut CounterRow) -> Result<bool, ()> {
    hdr.flags |= FLAG_INLINE;
    if wr.total as usize <= INLINE_MAX {
        return Ok(false);
    }
    hdr.flags |= FLAG_PIECES;
    send_pieces(conn, hdr, &wr.segs, tally).map(|()| true)
}

/// Pushes a message larger than a slot through the ring: `first` (with
/// `FLAG_PIECES`) carries its first `INLINE_MAX` bytes, `SLOT_SEND_PIECE`
/// slots the rest.  Where the ring is full, waits for the receiver to make
/// room, for at most [`RING_ROOM_LIMIT`] and while the peer is there.
fn send_pieces(conn: &Conn, first: &SlotHeader, segs: &[LocalSeg], tally: &mut CounterRow) -> Result<(), ()> {
    let total = first.length as u64;
    let mut waited = None;
    let n = total.min(INLINE_MAX as u64);
    push_room(conn, first, gathered(segs, 0, n), &mut waited)?;
    tally.add(Counter::RingPieces, 1);
    push_pieces(conn, SLOT_SEND_PIECE, first, segs, n, &mut waited, tally)
}

/// Pushes the bytes of `segs` from `offset` to `like.length` in slots of
/// `kind` (`SLOT_SEND_PIECE`, `SLOT_RDMA_PIECE`), each `aux` bytes into the
/// message, with `like`'s length and receive.
fn push_pieces(
    conn: &Conn,
    kind: u32,
    like: &SlotHeader,
    segs: &[LocalSeg],
    mut offset: u64,
    waited: &mut Option<std::time::Instant>,
    tally: &mut CounterRow,
) -> Result<(), ()> {
    let total = like.length as u64;
    while offset < total {
        let n = (total - offset).min(INLINE_MAX as u64);
        let hdr = SlotHeader { kind, length: like.length, recv_seq: like.recv_seq, aux: offset, ..Default::default() };
        push_room(conn, &hdr, gathered(segs, offset, n), waited)?;
        offset += n;
        tally.add(Counter::RingPieces, 1);
    }
    Ok(())
}

/// Pushes one slot; where the ring is full, waits for the receiver to make
/// room, for at most [`RING_ROOM_LIMIT`] since `waited` (the first wait of
/// the message) and while the peer is there.
pub(crate) fn push_room<'a, I>(
    conn: &Conn,
    hdr: &SlotHeader,
    payload: I,
    waited: &mut Option<std::time::Instant>,
) -> Result<(), ()>
where
    I: Iterator<Item = &'a [u8]> + Clone,
{
    let mut spins = 0u32;
    loop {
        match conn.seg.tx().push_gather(hdr, payload.clone()) {
            Ok(()) => return Ok(()),
            Err(via_shm::ShmError::Full) => {
                spins += 1;
                if spins == 1 {
                    conn.ask_peer_to_drain();
                }
                if spins < 64 {
                    std::thread::yield_now();
                    continue;
                }
                let since = *waited.get_or_insert_with(std::time::Instant::now);
                if since.elapsed() > RING_ROOM_LIMIT || conn.seg.peer_closed() || peer_hung_up(conn) {
                    return Err(());
                }
            }
            Err(_) => return Err(()),
        }
    }
}

/// An RDMA write through the ring, where this process may not attach to
/// the target: a `SLOT_RDMA_WRITE` naming the target's memory, then the
/// data in `SLOT_RDMA_PIECE` slots.  Checked here first against the
/// target's published table, as a copy is, so that the initiator learns of
/// a refusal on every path; the target checks the write again against its
/// own registry, tag and enables before a byte lands (`drain_ring`), and
/// breaks a reliable connection over one it refuses (a region that went
/// since) or drops it on an unreliable VI: a write that passed here
/// completes once it is in the ring.  With immediate data it takes the
/// target's next posted receive first.
fn ring_write(
    conn: &Conn,
    wr: &WorkRequest,
    addr: u64,
    handle: u32,
    reliable: bool,
    tally: &mut CounterRow,
) -> (u32, u32, Option<Break>) {
    let total = wr.total as u32;
    if !remote_allows(conn, addr, handle, wr.total, true) {
        return refused_write(conn, reliable);
    }
    let mut recv_seq = 0;
    if wr.immediate.is_some() {
        match conn.seg.peer_recvs().take_seq() {
            Ok(Some(seq)) => recv_seq = seq,
            Ok(None) if !reliable => {
                conn.counters.add(Counter::DroppedNoRecv, 1);
                return (0, total, None); // unreliable: dropped
            }
            Ok(None) => return (STATUS_TRANSPORT_ERROR, 0, Some(NO_RECV)),
            Err(_) => return (STATUS_TRANSPORT_ERROR, 0, Some(LOST)),
        }
    }
    let hdr = SlotHeader {
        kind: SLOT_RDMA_WRITE,
        length: total,
        recv_seq,
        imm: wr.immediate.unwrap_or(0),
        flags: if wr.immediate.is_some() { FLAG_IMMEDIATE } else { 0 },
        ..Default::default()
    };
    let mut target = [0u8; RDMA_TARGET_BYTES];
    target[..8].copy_from_slice(&addr.to_le_bytes());
    target[8..].copy_from_slice(&handle.to_le_bytes());
    let mut waited = None;
    let pushed = push_room(conn, &hdr, std::iter::once(&target[..]), &mut waited)
        .and_then(|()| push_pieces(conn, SLOT_RDMA_PIECE, &hdr, &wr.segs, 0, &mut waited, tally));
    if pushed.is_err() {
        return (STATUS_TRANSPORT_ERROR, 0, Some(LOST));
    }
    if wr.immediate.is_some() && conn.peer.recv_cq != NO_CQ {
        conn.complete_peer_receive();
    } else {
        // A target that waits on its CQ only applies the write now.
        conn.ask_peer_to_drain();
    }
    tally.add(Counter::RdmaWrites, 1);
    (0, total, None)
}

/// Waits up to a millisecond on the connection's socket: true when the
/// peer has hung up (or said something, which mid-message can only be a
/// disconnect or a break).
fn peer_hung_up(conn: &Conn) -> bool {
    use std::os::fd::AsRawFd;
    let mut pfd = libc::pollfd { fd: conn.socket.as_raw_fd(), events: libc::POLLRDHUP, revents: 0 };
    // SAFETY: one pollfd, valid for the call.
    let n = unsafe { libc::poll(&mut pfd, 1, 1) };
    n > 0 && pfd.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
}

/// Whether the receiver still has the receive buffer `seg` registered.
fn receiver_holds(conn: &Conn, seg: &RecvSeg) -> bool {
    // SAFETY: as in `remote_allows`.
    let table = unsafe { PublishedTable::new(conn.peer_table.as_ptr()) };
    table.lookup(seg.handle).is_some_and(|r| r.contains(seg.addr, u64::from(seg.len)))
}

/// The outcome of an RDMA write that the target's table refuses: nothing
/// moves; on a reliable VI the connection breaks, `RDMAW_PROT` at the
/// target.
fn refused_write(conn: &Conn, reliable: bool) -> (u32, u32, Option<Break>) {
    conn.counters.add(Counter::RdmaRefused, 1);
    let why = reliable.then_some(Break { mine: error_code::CONN_LOST, theirs: error_code::RDMAW_PROT });
    (STATUS_RDMA_PROT_ERROR, 0, why)
}

/// Checks an RDMA request against the target's registry, tag and enables:
/// the registry's table as the target publishes it in its table segment.
fn remote_allows(conn: &Conn, addr: u64, handle: u32, len: u64, write: bool) -> bool {
    let peer = &conn.peer;
    if (write && !peer.rdma_write) || (!write && !peer.rdma_read) {
        return false;
    }
    // SAFETY: the table is TABLE_SEGMENT_BYTES >= TABLE_BYTES (nic.rs
    // asserts it), page aligned, mapped read-only while `conn` lives.
    let table = unsafe { PublishedTable::new(conn.peer_table.as_ptr()) };
    let Some(region) = table.lookup(handle) else {
        return false;
    };
    let flag = if write { REGION_RDMA_WRITE } else { REGION_RDMA_READ };
    region.ptag == peer.ptag && region.flags & flag != 0 && region.contains(addr, len)
}
