//! VIs: the VIA object, with its state machine, its work queues and their
//! completions.  What moves the data is the VI's transport, whose side of
//! the VI lives with it: `transport::shm::path` (with RDMA reads through
//! the ring in `transport::shm::read_path`) and `transport::udp::path`.
//! The VI dispatches to the one its connection uses (`link::Link`).
//! Lock order: `recv` before `send`.

pub(crate) mod hot;
mod link;

use hot::{Fixed, HotLines};
pub(crate) use link::{Link, LinkKind, Linked, Transport, WorkQueue};

use crate::transport::shm::conn::publish;
use crate::transport::shm::ring_read;

use crate::counters::StageTimer;
use crate::counters::{Counter, CounterRow, RowLease, RECV_COLUMNS, SEND_COLUMNS};
use crate::cq::{Cq, CqEntry};
use crate::doorbell::{self, Ringer, Rung, ViDoorbell};
use crate::endpoint::{Endpoint, NO_CQ};
use crate::handles::{Handle, ThreadCache};
use crate::nic::{ErrorEvent, Nic};
use crate::queue_lock::{QueueGuard, QueueMutex};
use crate::timeout::{done_first, poll_answer, Deadline, SpinWait};
use crate::transport::shm::Conn;
use crate::transport::Ending;
use crate::tuning::{CqMode, Doorbell};
use crate::vi_attrs::AttrCell;
pub use crate::vi_attrs::ViAttrs;
use crate::{progress, provider, Provider};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use via_core::consts::*;
use via_core::consts::{error_code, resource_code};
use via_core::descriptor::{descriptor_region, validate, DescPtr, Rules, Segs};
use via_core::error::{ViaError, ViaResult};
use via_shm::conn::ConnSegment;
use via_shm::futex;

/// `VIP_VI_STATE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ViState {
    /// Not connected.
    Idle = 0,
    /// Connected.
    Connected = 1,
    /// A connection request is under way.
    ConnectPending = 2,
    /// The connection broke; descriptors are flushed.
    Error = 3,
}

pub(crate) struct RecvItem {
    pub desc: DescPtr,
    /// The memory handle the descriptor was posted with.
    pub mem: u32,
    pub segs: Segs,
    /// `Registry::deregistrations` when it was posted: where it differs
    /// as bytes land, the descriptor and `segs` are asked again.
    pub epoch: u32,
    pub total: u64,
    /// Sequence number in the peer-visible receive cache, once published.
    pub seq: Option<u64>,
    pub done: bool,
    /// Status error bits of a descriptor that failed validation; it
    /// completes with them when its turn comes.
    pub error: u32,
}

#[derive(Default)]
pub(crate) struct RecvQueue {
    pub items: VecDeque<RecvItem>,
    /// Completed items form a prefix of `items`: its length.
    pub done: usize,
    /// CQ2: how many of the completed items `VipCQDone` has reported.
    pub cq_seen: usize,
    /// Pending items that failed validation (`RecvItem::error`), which
    /// `settle` completes as they reach the head: while there are none it
    /// reads no item, so a message touches only the one it lands in.
    pub failed: usize,
    pub seg: Option<Arc<ConnSegment>>,
    /// Network: the message being placed into the first pending item.
    pub inbound: Option<Inbound>,
    /// Network: the RDMA write being placed, on a reliable VI.
    pub writing: Option<InboundWrite>,
    /// Network: a message being dropped (no receive, or an error).
    pub dropping: Option<u32>,
    /// Shared memory: the message arriving in ring pieces into the first
    /// pending item.
    pub pieces: Option<Pieces>,
    /// Shared memory: the RDMA write arriving through the ring.
    pub rdma: Option<RingWrite>,
    /// Shared memory: the RDMA reads through the ring this VI owes its
    /// peer, in order (`ring_read`).
    pub answers: VecDeque<ring_read::Answer>,
    /// Messages and bytes received.
    pub tally: CounterRow,
}

/// A message arriving through the ring in pieces (`FLAG_PIECES`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pieces {
    /// The receive entry it consumed.
    pub seq: u64,
    /// The message's length.
    pub total: u32,
    /// Bytes arrived so far, in order.
    pub got: u32,
    /// Error bits of the descriptor (its buffers went since the post):
    /// the pieces are consumed and not copied.
    pub error: u32,
    /// The immediate data its first piece carried.
    pub imm: Option<u32>,
}

/// An RDMA write arriving through the ring (`SLOT_RDMA_WRITE`, then its
/// `SLOT_RDMA_PIECE` slots), checked against this process's registry when
/// its header came.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RingWrite {
    /// Where it lands.
    pub addr: u64,
    /// The memory handle the initiator named.
    pub handle: u32,
    /// Its length.
    pub total: u32,
    /// Bytes arrived so far, in order.
    pub got: u32,
    /// Refused: its pieces are consumed and not copied.
    pub refused: bool,
    /// With immediate data: the receive entry it consumes and the data.
    pub imm: Option<(u64, u32)>,
}

/// A message being placed into a receive descriptor over the network.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Inbound {
    /// The sender's message number.
    pub msg: u32,
    /// The message's length.
    pub total: u32,
    /// Bytes placed so far: the session delivers a message's bytes in order.
    pub placed: u32,
}

/// An RDMA write being placed over the network, whose first packet was
/// checked and placed: where its next bytes belong.
#[derive(Debug, Clone, Copy)]
pub(crate) struct InboundWrite {
    /// The memory handle the initiator named.
    pub handle: u32,
    /// Where its next bytes land.
    pub next: u64,
    /// How many bytes of it are left.
    pub left: u32,
}

/// A descriptor on the send queue.  Kept to 48 bytes: at a thousand VIs
/// each message pushes and pops one gone cold, so what only the network's
/// RDMA operations need waits in [`Answer`], boxed.
pub(crate) struct SendItem {
    pub desc: DescPtr,
    /// Network: the token of the message carrying it; shared memory: the
    /// number of its RDMA read through the ring.
    pub token: u64,
    /// Network RDMA operation that completes with its target's answer.
    pub answer: Option<Box<Answer>>,
    /// The memory handle the descriptor was posted with.
    pub mem: u32,
    /// `Registry::deregistrations` when it was posted: where it differs
    /// when the descriptor is written, its region is asked again
    /// ([`desc_registered`]).
    pub epoch: u32,
    /// `VIP_STATUS_OP_*` bits.
    pub op: u32,
    pub length: u32,
    pub done: bool,
}

const _: () = assert!(std::mem::size_of::<SendItem>() <= 48, "a send item grew past 48 bytes");

/// A network RDMA operation waiting for its target's answer: a read, or
/// a write where the target places after it acknowledges.
pub(crate) struct Answer {
    /// The request's message number, which the answer names.
    pub msg: u32,
    /// RDMA read: the local buffers the answer's bytes land in.
    pub segs: Segs,
    /// Unreliable RDMA write sent but not answered: completes by this time
    /// even if the answer was lost.
    pub give_up: Option<std::time::Instant>,
}

#[derive(Default)]
pub(crate) struct SendQueue {
    pub items: VecDeque<SendItem>,
    /// Completed items form a prefix of `items`: its length.
    pub done: usize,
    /// CQ2: how many of the completed items `VipCQDone` has reported.
    pub cq_seen: usize,
    /// The connection's transport: the one place it is recorded
    /// (`Vi::attach_link`).
    pub link: Option<Link>,
    /// Posted, its doorbell rung, not yet taken by the send engine.
    pub rung: usize,
    /// Shared memory: RDMA reads through the ring in flight, in order
    /// (`ring_read`); their descriptors wait in `items`.
    pub ring_reads: VecDeque<ring_read::RingRead>,
    /// The number of the next RDMA read through the ring.
    pub next_read: u64,
    /// Messages, bytes and copies sent.
    pub tally: CounterRow,
}

impl SendQueue {
    /// The shared-memory connection, if that is the transport.
    pub fn conn(&self) -> Option<&Arc<Conn>> {
        match &self.link {
            Some(Link::Shm(conn)) => Some(conn),
            _ => None,
        }
    }

    /// The network link, if that is the transport.
    pub fn net(&self) -> Option<&Arc<crate::transport::udp::NetLink>> {
        match &self.link {
            Some(Link::Net(link)) => Some(link),
            _ => None,
        }
    }

    /// Moves the completed prefix forward; returns how many completed now.
    pub fn advance(&mut self) -> usize {
        let before = self.done;
        while self.items.get(self.done).is_some_and(|i| i.done) {
            self.done += 1;
        }
        self.done - before
    }
}

/// Whether a descriptor posted with memory handle `mem`, when the registry
/// had seen `epoch` deregistrations, may still be written: no region went
/// since (one load), or its own region did not.  The application may have
/// deregistered the descriptor's region and unmapped it while the
/// descriptor was posted; then the descriptor completes unwritten, handed
/// back in its turn by `VipSendDone`/`VipRecvDone`.
#[inline]
pub(crate) fn desc_registered(registry: &via_core::registry::Registry, mem: u32, epoch: u32) -> bool {
    registry.deregistrations() == epoch || registry.is_live(mem)
}

impl SendItem {
    /// Completes it with `status` and `length`, writing them into the
    /// descriptor unless its region went ([`desc_registered`]).
    pub(crate) fn finish(&mut self, registry: &via_core::registry::Registry, status: u32, length: u32) {
        if desc_registered(registry, self.mem, self.epoch) {
            self.desc.complete(status, length, None);
        }
        self.done = true;
    }
}

impl RecvItem {
    /// Completes it with `status`, `length` and `imm`, writing them into
    /// the descriptor unless its region went ([`desc_registered`]).  The
    /// caller moves the queue's completed prefix on.
    pub(crate) fn finish(
        &mut self,
        registry: &via_core::registry::Registry,
        status: u32,
        length: u32,
        imm: Option<u32>,
    ) {
        if desc_registered(registry, self.mem, self.epoch) {
            self.desc.complete(status, length, imm);
        }
        self.done = true;
    }
}

/// Why a connection is being broken, seen from both ends.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Break {
    /// Error code reported to this process.
    pub mine: u32,
    /// Error code sent to the peer.
    pub theirs: u32,
}

/// A Virtual Interface.
///
/// Laid out in order: the first line holds what a CQ poll reads of the VI
/// it names and where that VI's next message goes (`hot`), so that at a
/// thousand VIs a completion costs one miss before the prefetches go out.
#[repr(C, align(64))]
pub struct Vi {
    /// This VI's handle.
    pub handle: Handle,
    /// CQ of the receive queue.
    pub recv_cq: Option<Arc<Cq>>,
    /// CQ of the send queue.
    pub send_cq: Option<Arc<Cq>>,
    /// The lane of the peer process this VI is connected to (0: none): CQ
    /// entries for this VI count only from that lane ([`crate::lane`]).
    pub(crate) lane: AtomicU64,
    state: AtomicU8,
    /// The kind of the send queue's link (`LinkKind as u8`), which the
    /// polls and waits dispatch on without the queue's lock
    /// (`Vi::attach_link`).
    link_kind: AtomicU8,
    /// The lines its next message touches, for a CQ poll that names this
    /// VI to prefetch before `VipRecvDone` and `VipPostSend` ([`hot`]).
    pub(crate) hot: HotLines,
    /// Its NIC.
    pub nic: Arc<Nic>,
    attrs: AttrCell,
    pub(crate) ptag_id: AtomicU32,
    pub(crate) recv: QueueMutex<RecvQueue>,
    pub(crate) send: QueueMutex<SendQueue>,
    /// Futex word for waiters that have no ring to sleep on.
    wake_word: AtomicU32,
    sleepers: AtomicUsize,
    /// Outcome of an asynchronous peer connection request.
    pub(crate) peer_outcome: Mutex<Option<ViaResult<Linked>>>,
    /// Set when the VI is destroyed, for notify threads.
    pub destroyed: std::sync::atomic::AtomicBool,
    /// Its doorbell (`VIA_DOORBELL=d1`).
    pub(crate) doorbell: ViDoorbell,
    /// Shared memory: RDMA reads through the ring in flight plus answers
    /// owed (`ring_read`), readable without the queue locks.
    pub(crate) ring_work: AtomicUsize,
    /// Its row of the NIC's counters, which both queues' `tally` add to.
    row: RowLease,
}

thread_local! {
    /// The VIs this thread used recently ([`Vi::with`]).
    static VIS: ThreadCache<Vi> = const { ThreadCache::new() };
}

/// How much of the ring `Vi::drain` moves in.
#[derive(Clone, Copy)]
pub(crate) enum Drain {
    /// Every message that has arrived: before the queue is flushed.
    All,
    /// Messages until more than this many receives are complete: a poll
    /// that reports one completion then looks at the ring no further.
    Past(usize),
    /// Every message, as the connection closes (both queue locks held, the
    /// sends flushed): RDMA read requests and answers are dropped.
    Closing,
}

pub(crate) fn reliable(level: u16) -> bool {
    level != SERVICE_UNRELIABLE
}

impl Vi {
    /// Creates a VI on `nic`.
    pub fn create(
        nic: &Arc<Nic>,
        attrs: ViAttrs,
        send_cq: Option<Arc<Cq>>,
        recv_cq: Option<Arc<Cq>>,
    ) -> ViaResult<Handle> {
        let tag = check_attrs(nic, &attrs)?;
        for cq in send_cq.iter().chain(recv_cq.iter()) {
            if !Arc::ptr_eq(&cq.nic, nic) {
                return Err(ViaError::InvalidParameter);
            }
        }
        if nic.vi_count.fetch_add(1, Ordering::AcqRel) >= limits::MAX_VI {
            nic.vi_count.fetch_sub(1, Ordering::AcqRel);
            return Err(ViaError::Resource);
        }
        crate::queue_lock::prepare();
        let row = nic.counters.row();
        let inserted = nic.provider.vis.insert(|handle| {
            Arc::new(Vi {
                handle,
                nic: nic.clone(),
                send_cq: send_cq.clone(),
                recv_cq: recv_cq.clone(),
                attrs: AttrCell::new(&attrs),
                ptag_id: AtomicU32::new(tag.id),
                state: AtomicU8::new(ViState::Idle as u8),
                recv: QueueMutex::new(RecvQueue { tally: row.view(RECV_COLUMNS), ..Default::default() }),
                send: QueueMutex::new(SendQueue { tally: row.view(SEND_COLUMNS), ..Default::default() }),
                link_kind: AtomicU8::new(LinkKind::Unlinked as u8),
                hot: HotLines::default(),
                lane: AtomicU64::new(0),
                wake_word: AtomicU32::new(0),
                sleepers: AtomicUsize::new(0),
                peer_outcome: Mutex::new(None),
                destroyed: Default::default(),
                doorbell: ViDoorbell::default(),
                ring_work: AtomicUsize::new(0),
                row,
            })
        });
        let Some((handle, vi)) = inserted else {
            nic.vi_count.fetch_sub(1, Ordering::AcqRel);
            return Err(ViaError::Resource);
        };
        vi.hot.set(Fixed::Row, vi.row.line());
        if let Some(engine) = &nic.send_engine {
            engine.attach(Arc::downgrade(&vi) as std::sync::Weak<dyn Ringer>);
        }
        tag.vi_users.fetch_add(1, Ordering::AcqRel);
        if let Some(cq) = &send_cq {
            cq.attach(handle, false);
        }
        if let Some(cq) = &recv_cq {
            cq.attach(handle, true);
        }
        Ok(handle)
    }

    /// Looks up a VI handle of the process's provider.
    pub fn get(handle: Handle) -> ViaResult<Arc<Vi>> {
        Vi::get_in(provider(), handle)
    }

    /// Looks up a VI handle of `provider`.
    pub fn get_in(provider: &Provider, handle: Handle) -> ViaResult<Arc<Vi>> {
        provider.vis.get(handle).ok_or(ViaError::InvalidParameter)
    }

    /// Runs `f` on the VI of `handle`, through the thread's cache
    /// ([`handles::Table::with`](crate::handles::Table::with)).
    pub fn with<R>(handle: Handle, f: impl FnOnce(&Arc<Vi>) -> ViaResult<R>) -> ViaResult<R> {
        Vi::with_in(provider(), handle, f)
    }

    /// As [`Vi::with`], for a VI of `provider`.
    pub fn with_in<R>(provider: &Provider, handle: Handle, f: impl FnOnce(&Arc<Vi>) -> ViaResult<R>) -> ViaResult<R> {
        provider.vis.with(&VIS, handle, f).unwrap_or(Err(ViaError::InvalidParameter))
    }

    /// Destroys an idle VI.
    pub fn destroy(handle: Handle) -> ViaResult<()> {
        Vi::destroy_in(provider(), handle)
    }

    /// Destroys an idle VI of `provider`.
    pub fn destroy_in(provider: &Provider, handle: Handle) -> ViaResult<()> {
        let vi = Vi::get_in(provider, handle)?;
        {
            let _r = vi.recv.lock();
            let _s = vi.send.lock();
            if vi.state() != ViState::Idle {
                return Err(ViaError::InvalidState);
            }
            provider.vis.remove(handle).ok_or(ViaError::InvalidParameter)?;
        }
        vi.destroyed.store(true, Ordering::Release);
        if let Some(engine) = &vi.nic.send_engine {
            engine.detach(&*vi);
        }
        vi.bump();
        vi.nic.vi_count.fetch_sub(1, Ordering::AcqRel);
        if let Ok(tag) = vi.nic.ptag(vi.attrs().ptag) {
            tag.vi_users.fetch_sub(1, Ordering::AcqRel);
        }
        if let Some(cq) = &vi.send_cq {
            cq.detach(vi.handle, false);
        }
        if let Some(cq) = &vi.recv_cq {
            cq.detach(vi.handle, true);
        }
        Ok(())
    }

    /// The current state.
    pub fn state(&self) -> ViState {
        match self.state.load(Ordering::Acquire) {
            0 => ViState::Idle,
            1 => ViState::Connected,
            2 => ViState::ConnectPending,
            _ => ViState::Error,
        }
    }

    pub(crate) fn set_state(&self, s: ViState) {
        self.state.store(s as u8, Ordering::Release);
    }

    /// The attributes.
    pub fn attrs(&self) -> ViAttrs {
        self.attrs.load()
    }

    /// Changes the attributes of an idle VI.
    pub fn set_attrs(&self, new: ViAttrs) -> ViaResult<()> {
        let _r = self.recv.lock();
        let _s = self.send.lock();
        if self.state() != ViState::Idle {
            return Err(ViaError::InvalidState);
        }
        let tag = check_attrs(&self.nic, &new)?;
        let attrs = self.attrs.load();
        if attrs.ptag != new.ptag {
            if let Ok(old) = self.nic.ptag(attrs.ptag) {
                old.vi_users.fetch_sub(1, Ordering::AcqRel);
            }
            tag.vi_users.fetch_add(1, Ordering::AcqRel);
            self.ptag_id.store(tag.id, Ordering::Release);
        }
        self.attrs.store(&new);
        Ok(())
    }

    /// Whether the send and receive queues are empty.
    pub fn queues_empty(&self) -> (bool, bool) {
        let r = self.recv.lock().items.is_empty();
        let s = self.send.lock();
        (s.items.is_empty() && s.rung == 0, r)
    }

    /// What the peer needs to know about this VI.
    pub(crate) fn endpoint(&self) -> Endpoint {
        let a = self.attrs();
        Endpoint {
            vi: self.handle,
            // CQ2: the peer has no entry to write for us.
            recv_cq: match (&self.recv_cq, self.nic.tuning.cq) {
                (Some(c), CqMode::Entries) => c.index as u32,
                _ => NO_CQ,
            },
            reliability: a.reliability,
            max_transfer: a.max_transfer,
            rdma_write: a.rdma_write,
            rdma_read: a.rdma_read,
            ptag: self.ptag_id.load(Ordering::Acquire),
        }
    }

    pub(crate) fn rules(&self) -> (Rules<'_>, ViAttrs) {
        let a = self.attrs();
        let rules = Rules {
            registry: &self.nic.registry,
            ptag: self.ptag_id.load(Ordering::Acquire),
            max_transfer: a.max_transfer,
            rdma_read: reliable(a.reliability),
        };
        (rules, a)
    }

    /// Wakes everybody waiting on this VI.  The wake-up system call only
    /// when somebody sleeps: a sleeper counts itself in `sleepers` before it
    /// checks `wake_word` in `futex_wait`, so one of the two sees the other.
    pub(crate) fn bump(&self) {
        self.wake_word.fetch_add(1, Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            futex::futex_wake(&self.wake_word, i32::MAX);
        }
    }

    /// CQ2: whether a work queue has a completion `VipCQDone` has not
    /// reported yet; if so it counts as reported now.
    pub(crate) fn report_unseen(&self, recv: bool) -> bool {
        if recv {
            let mut q = self.recv.lock();
            let seen = q.cq_seen;
            let broken = self.drain(&mut q, Drain::Past(seen));
            let unseen = q.done > q.cq_seen;
            q.cq_seen += unseen as usize;
            drop(q);
            if let Some(why) = broken {
                self.break_connection(why);
            }
            unseen
        } else {
            let mut q = self.send.lock();
            if q.done == q.cq_seen && self.ring_work.load(Ordering::Acquire) != 0 {
                drop(q);
                self.ring_progress();
                q = self.send.lock();
            }
            let unseen = q.done > q.cq_seen;
            q.cq_seen += unseen as usize;
            unseen
        }
    }

    pub(crate) fn push_cq(&self, recv: bool) {
        let cq = if recv { &self.recv_cq } else { &self.send_cq };
        if let Some(cq) = cq {
            cq.push_local(CqEntry { vi: self.handle, recv });
        }
    }

    // ---- connection plumbing (used by connect.rs) -------------------------------------

    /// Attaches a mapped segment: publishes every receive posted so far.
    pub(crate) fn attach_segment(&self, seg: Arc<ConnSegment>) -> ViaResult<()> {
        let mut q = self.recv.lock();
        let mut seq = Vec::new();
        for item in q.items.iter().filter(|i| !i.done && i.error == 0) {
            seq.push(publish(&seg, &item.segs)?);
        }
        for (item, s) in q.items.iter_mut().filter(|i| !i.done && i.error == 0).zip(seq) {
            item.seq = Some(s);
        }
        self.hot.rx_slot.store(seg.rx().next_slot() as usize, Ordering::Relaxed);
        self.hot.tx_slot.store(seg.tx().next_push_slot() as usize, Ordering::Relaxed);
        self.hot.set(Fixed::Segment, Arc::as_ptr(&seg) as *const u8);
        self.hot.set_control(seg.control_lines());
        self.note_recv_front(&q);
        q.seg = Some(seg);
        Ok(())
    }

    /// Starts fetching what the next message on this VI touches, which the
    /// CQ says has come: the lines move in while the application calls
    /// `VipRecvDone` ([`hot`]).
    pub(crate) fn prefetch_received(&self) {
        self.hot.prefetch((self as *const Vi).cast(), std::mem::size_of::<Vi>());
    }

    /// Records where the first pending receive is, with its descriptor and
    /// first buffer, for the next prefetch.
    fn note_recv_front(&self, q: &RecvQueue) {
        let front = q.items.get(q.done);
        let item = front.map_or(0, |i| i as *const RecvItem as usize);
        self.hot.recv_front.store(item, Ordering::Relaxed);
        self.hot.recv_desc.store(front.map_or(0, |i| i.desc.0), Ordering::Relaxed);
        let buffer = front.and_then(|i| i.segs.first()).map_or(0, |s| s.addr as usize);
        self.hot.recv_buffer.store(buffer, Ordering::Relaxed);
    }

    /// Records where the send queue's next item goes, for the next
    /// prefetch.  An application that takes its completed sends back
    /// before it posts again (a ping-pong) empties the queue, which then
    /// starts again at its buffer's start (`take_sent`): while every item
    /// is complete that is where the first one lies; else after the last.
    fn note_send_back(&self, q: &SendQueue) {
        let (a, b) = q.items.as_slices();
        let back = match (q.done == q.items.len(), b.is_empty()) {
            (true, _) => a.as_ptr(),
            (false, true) => a.as_ptr_range().end,
            (false, false) => b.as_ptr_range().end,
        };
        self.hot.send_back.store(back as usize, Ordering::Relaxed);
    }

    /// Forgets a segment whose connection never came about.
    pub(crate) fn detach_segment(&self) {
        let mut q = self.recv.lock();
        q.seg = None;
        self.hot.clear_connection();
        for item in q.items.iter_mut() {
            item.seq = None;
        }
    }

    /// `VipDisconnect`: Connected or Error -> Idle, flushing what is posted.
    pub fn disconnect(&self) -> ViaResult<()> {
        match self.end_connection(Ending::Disconnect, None) {
            true => Ok(()),
            false => Err(ViaError::InvalidState),
        }
    }

    /// The peer went away or broke the connection: Error state, flushed queues, callback.
    /// Only `conn`'s own events count: a late one of an earlier connection is ignored.
    pub(crate) fn peer_lost(&self, conn: &Conn, code: u32) {
        if self.end_connection(Ending::Break(None), Some(conn)) {
            self.report(code);
        }
    }

    /// The one way a connection ends, by `VipDisconnect` (Connected or
    /// Error -> Idle) or by an error (Connected -> Error): the transport
    /// tells the peer and lets go, then every posted descriptor is flushed
    /// and whoever waits is woken.  With `only`, only while that
    /// shared-memory connection is the VI's.  True if this call ended it.
    fn end_connection(&self, how: Ending, only: Option<&Conn>) -> bool {
        let mut r = self.recv.lock();
        let mut s = self.send.lock();
        let state = self.state();
        match how {
            Ending::Disconnect if !matches!(state, ViState::Connected | ViState::Error) => return false,
            Ending::Break(_) if state != ViState::Connected => return false,
            _ => {}
        }
        if let Some(only) = only {
            if !s.conn().is_some_and(|current| std::ptr::eq(only, Arc::as_ptr(current))) {
                return false;
            }
        }
        if let Ending::Break(_) = how {
            self.set_state(ViState::Error);
            self.nic.counters.add(Counter::Breaks, 1);
        }
        if let Some(link) = self.detach_link(&mut s) {
            link.end(how);
        }
        self.flush_sends(&mut s);
        self.forget_ring_work(&mut r, &mut s);
        self.drain(&mut r, Drain::Closing);
        self.flush(&mut r);
        r.inbound = None;
        r.writing = None;
        r.dropping = None;
        // Wake a waiter asleep on the ring: there is nothing more to wait for.
        if let Some(seg) = r.seg.take() {
            seg.rx().wake();
        }
        if how == Ending::Disconnect {
            self.set_state(ViState::Idle);
        }
        drop(s);
        drop(r);
        self.bump();
        true
    }

    /// Records the transport of a connection that completes (both queue
    /// locks held): the send queue holds it, and the polls and waits read
    /// its kind without the lock.  (The port's receive path reaches the
    /// link through its route, `NetLink::route_to`.)
    pub(crate) fn attach_link(&self, s: &mut SendQueue, link: Link) {
        self.link_kind.store(link.kind() as u8, Ordering::Release);
        if let Link::Shm(conn) = &link {
            self.hot.set(Fixed::Conn, Arc::as_ptr(conn) as *const u8);
        }
        s.link = Some(link);
    }

    /// Forgets the transport of a connection that ends (both queue locks held).
    fn detach_link(&self, s: &mut SendQueue) -> Option<Link> {
        self.link_kind.store(LinkKind::Unlinked as u8, Ordering::Release);
        self.hot.clear_connection();
        s.link.take()
    }

    /// The kind of the VI's link, without the send queue's lock.
    pub(crate) fn link_kind(&self) -> LinkKind {
        LinkKind::from_u8(self.link_kind.load(Ordering::Acquire))
    }

    /// Completes every pending send with DESC_FLUSHED_ERROR.
    fn flush_sends(&self, s: &mut SendQueue) {
        // A descriptor whose region went is not written: see `SendItem::finish`.
        for item in s.items.iter_mut().filter(|i| !i.done) {
            let status = item.op | STATUS_DESC_FLUSHED_ERROR;
            item.finish(&self.nic.registry, status, 0);
        }
        for _ in 0..s.advance() {
            self.push_cq(false);
        }
    }

    /// The network link went down: Error state, flushed queues, callback.
    pub(crate) fn net_lost(&self, code: u32) {
        if self.end_connection(Ending::Break(None), None) {
            self.report(code);
        }
    }

    pub(crate) fn break_connection(&self, why: Break) {
        if self.end_connection(Ending::Break(Some(why.theirs)), None) {
            self.report(why.mine);
        }
    }

    fn report(&self, code: u32) {
        let event = ErrorEvent {
            nic: self.nic.handle,
            vi: self.handle,
            cq: 0,
            descriptor: 0,
            resource: resource_code::VI,
            code,
        };
        let nic = self.nic.clone();
        progress::defer(Box::new(move || nic.report(event)));
    }

    // ---- receive side -----------------------------------------------------------------

    /// `VipPostRecv`.
    pub fn post_recv(&self, desc: DescPtr, mem: u32) -> ViaResult<()> {
        if desc.0 == 0 {
            return Err(ViaError::InvalidParameter);
        }
        let mut q = self.recv.lock();
        // Read under a queue lock: see `AttrCell`.
        let (rules, _) = self.rules();
        // Before the descriptor's region and its buffers are looked up: a
        // region that goes after this shows.
        let epoch = rules.registry.deregistrations();
        let Some(own) = descriptor_region(desc, mem, &rules) else {
            return Err(ViaError::Descriptor);
        };
        if q.items.len() >= limits::MAX_DESCRIPTORS_PER_QUEUE {
            return Err(ViaError::Resource);
        }
        // Posted again before it completed: refused.  The mark in the
        // descriptor says "maybe" in one load of a line the post touches
        // anyway; only then is the queue, the truth, searched.  See
        // `DescPtr::maybe_posted`.
        let queue = self.handle << 1;
        if desc.maybe_posted(queue) && q.items.iter().skip(q.done).any(|i| !i.done && i.desc == desc) {
            return Err(ViaError::InvalidParameter);
        }
        desc.clear_status();
        desc.mark_posted(queue);
        let state = self.state();
        let flushed = state == ViState::Error;
        let (segs, total, error) = match validate(desc, mem, &own, true, &rules) {
            Ok(wr) => (wr.segs, wr.total, 0),
            Err(bits) => (Segs::new(), 0, bits),
        };
        if flushed || error != 0 {
            let bits = if flushed { STATUS_DESC_FLUSHED_ERROR } else { error };
            // Completes in order: at once if nothing is pending ahead of it.
            q.items.push_back(RecvItem { desc, mem, epoch, segs, total, seq: None, done: false, error: bits });
            q.failed += 1;
            self.settle(&mut q);
            drop(q);
            self.bump();
            if error != 0 && reliable(self.attrs().reliability) {
                self.break_connection(Break { mine: error_code::POST_DESC, theirs: error_code::CONN_LOST });
            }
            return Ok(());
        }
        let seq = match &q.seg {
            Some(seg) => Some(publish(seg, &segs)?),
            None => None,
        };
        q.items.push_back(RecvItem { desc, mem, epoch, segs, total, seq, done: false, error: 0 });
        if q.items.len() == q.done + 1 {
            self.note_recv_front(&q);
        }
        Ok(())
    }

    /// Completes failed descriptors that have reached the head of the pending part.
    pub(crate) fn settle(&self, q: &mut RecvQueue) {
        if q.failed == 0 {
            return;
        }
        while let Some(item) = q.items.get_mut(q.done) {
            if item.error == 0 {
                break;
            }
            // Its region may have gone since it was posted: see `RecvItem::finish`.
            let status = STATUS_OP_RECEIVE | item.error;
            item.finish(&self.nic.registry, status, 0, None);
            q.done += 1;
            q.failed -= 1;
            self.push_cq(true);
        }
    }

    /// Completes arrived messages in posting order, as many as `how` asks
    /// for.  Returns why the connection must break: the peer wrote
    /// something that cannot be true, or, on a reliable VI, an inline
    /// message was longer than its receive buffer.
    pub(crate) fn drain(&self, q: &mut RecvQueue, how: Drain) -> Option<Break> {
        self.settle(q);
        // Moved out and back rather than cloned: no reference counting per poll.
        let seg = q.seg.take()?;
        let broken = self.drain_ring(q, &seg, how);
        q.seg = Some(seg);
        broken
    }

    /// Completes every pending receive with DESC_FLUSHED_ERROR.
    fn flush(&self, q: &mut RecvQueue) {
        q.pieces = None;
        q.rdma = None;
        let mut n = 0;
        for item in q.items.iter_mut().skip(q.done) {
            let bits = if item.error != 0 { item.error } else { STATUS_DESC_FLUSHED_ERROR };
            // Its region may have gone since it was posted: see `RecvItem::finish`.
            item.finish(&self.nic.registry, STATUS_OP_RECEIVE | bits, 0, None);
            n += 1;
        }
        q.done = q.items.len();
        q.failed = 0;
        for _ in 0..n {
            self.push_cq(true);
        }
    }

    /// `VipRecvDone`.
    pub fn recv_done(&self) -> ViaResult<DescPtr> {
        progress_nic(&self.nic);
        let kind = self.link_kind();
        poll_answer(done_first(|| kind.progress(self), || self.take_received()))
    }

    /// The first completed receive, after moving in what the shared-memory
    /// connection has delivered.
    fn take_received(&self) -> Option<DescPtr> {
        let mut q = self.recv.lock();
        let broken = match self.drain_inline_send(&mut q) {
            true => None,
            false => self.drain(&mut q, Drain::Past(0)),
        };
        let got = if q.done > 0 {
            q.done -= 1;
            q.cq_seen = q.cq_seen.saturating_sub(1);
            let desc = q.items.pop_front().map(|i| i.desc);
            self.note_recv_front(&q);
            desc
        } else {
            None
        };
        drop(q);
        if let Some(why) = broken {
            self.break_connection(why);
        }
        got
    }

    /// Whether a message for the receive queue is arriving just now: partly
    /// placed from the network or the ring, or being copied in by the peer
    /// (`VipRecvWait` spins on past its window meanwhile).
    pub(crate) fn arriving(&self) -> bool {
        let r = self.recv.lock();
        r.inbound.is_some()
            || r.writing.is_some()
            || r.pieces.is_some()
            || r.rdma.is_some()
            || r.seg.as_ref().is_some_and(|seg| seg.peer_copying())
    }

    /// `VipRecvWait`.
    pub fn recv_wait(&self, timeout_ms: u64) -> ViaResult<DescPtr> {
        let deadline = Deadline::after_ms(timeout_ms);
        let mut spin = SpinWait::start(&deadline);
        loop {
            let word = self.wake_word.load(Ordering::Acquire);
            match self.recv_done() {
                Ok(d) => {
                    spin.done();
                    return Ok(d);
                }
                Err(ViaError::NotDone) => {}
                Err(e) => return Err(e),
            }
            if self.destroyed.load(Ordering::Acquire) {
                // Another thread destroyed the VI: its handle is no longer valid.
                return Err(ViaError::InvalidParameter);
            }
            if spin.spin_while(|| self.arriving()) {
                continue;
            }
            if deadline.passed() {
                return Err(ViaError::Timeout);
            }
            let nap = deadline.next_sleep(Duration::from_millis(50));
            if crate::clock::simulated_sleep(nap) {
                continue;
            }
            self.link_kind().sleep(self, WorkQueue::Recv, word, nap);
        }
    }

    // ---- send side --------------------------------------------------------------------

    /// `VipPostSend`: checks the descriptor's place and the VI's state, then
    /// carries the operation out or rings the doorbell (`doorbell`).
    pub fn post_send(self: &Arc<Self>, desc: DescPtr, mem: u32) -> ViaResult<()> {
        let timer = StageTimer::start();
        if desc.0 == 0 {
            return Err(ViaError::InvalidParameter);
        }
        let mut q = self.send.lock();
        let (rules, attrs) = self.rules();
        let state = self.state();
        if state != ViState::Connected && state != ViState::Error {
            return Err(ViaError::InvalidState);
        }
        let Some(own) = descriptor_region(desc, mem, &rules) else {
            return Err(ViaError::Descriptor);
        };
        if q.items.len() + q.rung >= limits::MAX_DESCRIPTORS_PER_QUEUE {
            return Err(ViaError::Resource);
        }
        // Posted again before it completed: refused.  The mark in the
        // descriptor says "maybe" (`DescPtr::maybe_posted`), the queue
        // confirms; a send still at the doorbell (`rung`) is out of the
        // queue's sight, so there the mark decides.  On the 4-byte path
        // this is one load and one store in the control segment's line.
        let queue = self.handle << 1 | 1;
        if desc.maybe_posted(queue) && (q.rung > 0 || q.items.iter().skip(q.done).any(|i| !i.done && i.desc == desc)) {
            return Err(ViaError::InvalidParameter);
        }
        desc.clear_status();
        desc.mark_posted(queue);
        if self.nic.tuning.doorbell == Doorbell::Direct {
            // Its region was looked up and checked just now.
            Link::post(self, q, desc, mem, &own, &rules, &attrs);
        } else {
            q.rung += 1;
            drop(q);
            let ringer: Arc<dyn Ringer> = self.clone();
            doorbell::ring(self.nic.send_engine.as_deref(), &ringer, desc, mem);
        }
        timer.stop(&self.nic.counters, Counter::PostSendNs, Some(Counter::PostSendCalls));
        Ok(())
    }

    /// Carries out a send the NIC's send engine took from a doorbell
    /// (`q.rung` counts those); `VipPostSend` without one carries its send
    /// out itself (`Link::post`).
    pub(crate) fn carry_out(&self, q: QueueGuard<'_, SendQueue>, desc: DescPtr, mem: u32) {
        let (rules, attrs) = self.rules();
        // Its descriptor's region may have been deregistered (and unmapped)
        // since the post: it is not read, and completes unwritten in its turn.
        let Some(own) = rules.registry.lookup(mem) else {
            self.queue_completed_send(q, desc, mem);
            self.bump();
            return;
        };
        Link::post(self, q, desc, mem, &own, &rules, &attrs);
    }

    /// Completes a send posted while the VI has no connection (in the
    /// Error state) as flushed.
    pub(crate) fn flush_posted(&self, q: QueueGuard<'_, SendQueue>, desc: DescPtr, mem: u32) {
        desc.complete(STATUS_DESC_FLUSHED_ERROR, 0, None);
        self.queue_completed_send(q, desc, mem);
        self.bump();
    }

    /// Queues a send whose descriptor is complete already (or left
    /// unwritten, its region gone), moves the completed prefix on and
    /// unlocks the queue; the send CQ hears of each completion.
    pub(crate) fn queue_completed_send(&self, mut q: QueueGuard<'_, SendQueue>, desc: DescPtr, mem: u32) {
        // Complete already: `epoch` is never asked.
        let item = SendItem { desc, token: 0, answer: None, mem, epoch: 0, op: 0, length: 0, done: true };
        q.items.push_back(item);
        let completed = q.advance();
        self.note_send_back(&q);
        drop(q);
        for _ in 0..completed {
            self.push_cq(false);
        }
    }

    /// `VipSendDone`.
    pub fn send_done(&self) -> ViaResult<DescPtr> {
        progress_nic(&self.nic);
        let kind = self.link_kind();
        poll_answer(done_first(|| kind.progress(self), || self.take_sent()))
    }

    /// The first completed send.
    fn take_sent(&self) -> Option<DescPtr> {
        let mut q = self.send.lock();
        if q.done == 0 {
            // An RDMA read through the ring completes as its answer is
            // drained: whoever waits for it drains.
            if self.ring_work.load(Ordering::Acquire) == 0 {
                return None;
            }
            drop(q);
            self.ring_progress();
            q = self.send.lock();
            if q.done == 0 {
                return None;
            }
        }
        q.done -= 1;
        q.cq_seen = q.cq_seen.saturating_sub(1);
        let desc = q.items.pop_front().expect("done prefix").desc;
        if q.items.is_empty() && q.items.capacity() > 0 {
            // Back to the buffer's start: in a ping-pong every send's item
            // takes the same line, the one the hint names.
            q.items.clear();
        }
        Some(desc)
    }

    /// `VipSendWait`.
    pub fn send_wait(&self, timeout_ms: u64) -> ViaResult<DescPtr> {
        let deadline = Deadline::after_ms(timeout_ms);
        loop {
            let word = self.wake_word.load(Ordering::Acquire);
            if let Ok(d) = self.send_done() {
                return Ok(d);
            }
            if self.destroyed.load(Ordering::Acquire) {
                return Err(ViaError::InvalidParameter);
            }
            if deadline.passed() {
                return Err(ViaError::Timeout);
            }
            let nap = deadline.next_sleep(Duration::from_millis(50));
            if crate::clock::simulated_sleep(nap) {
                continue;
            }
            self.link_kind().sleep(self, WorkQueue::Send, word, nap);
        }
    }

    /// Waits until the state changes or the deadline passes (peer
    /// connections): the network port, where the connection's answer may
    /// come, is read meanwhile.
    pub(crate) fn wait_change(&self, deadline: &Deadline) {
        let word = self.wake_word.load(Ordering::Acquire);
        let _port = self.nic.sleep_on_port();
        self.sleep_on_word(word, deadline.next_sleep(Duration::from_millis(50)));
    }

    /// Sleeps until the VI is woken (`bump`) after its wake word read
    /// `word`, or `nap` passes.
    pub(crate) fn sleep_on_word(&self, word: u32, nap: Duration) {
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        futex::futex_wait(&self.wake_word, word, Some(nap));
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The NIC's send engine takes a rung send and carries it out.
impl Ringer for Vi {
    fn doorbell(&self) -> &ViDoorbell {
        &self.doorbell
    }

    fn take(&self, r: Rung) {
        if let Some(at) = r.at {
            let c = &self.nic.counters;
            c.add(Counter::DoorbellNs, at.elapsed().as_nanos() as u64);
            c.add(Counter::DoorbellRings, 1);
        }
        let mut q = self.send.lock();
        q.rung -= 1;
        self.carry_out(q, r.desc, r.mem);
    }
}

/// What whoever polls a NIC does first: sweeps its doorbells, if it has
/// any, and moves the shared-memory RDMA reads through the ring on.  Two
/// loads in the poll when there is neither.
#[inline]
pub(crate) fn progress_nic(nic: &Nic) {
    if nic.send_engine.is_some() || ring_read::pending() {
        progress_nic_work(nic);
    }
}

#[inline(never)]
fn progress_nic_work(nic: &Nic) {
    if let Some(engine) = &nic.send_engine {
        engine.sweep();
    }
    ring_progress(nic);
}

/// Drains the rings of the VIs of `nic` that have RDMA reads through the
/// ring in flight or answers owed: a CQ poll or a wait on a work queue
/// gets them on.  One load while there are none in the process.
fn ring_progress(nic: &Nic) {
    if !ring_read::pending() {
        return;
    }
    let vis: Vec<_> = nic.shm_conns.lock().iter().map(|(vi, _)| *vi).collect();
    for vi in vis {
        if let Ok(vi) = Vi::get_in(&nic.provider, vi) {
            if vi.ring_work.load(Ordering::Acquire) != 0 {
                vi.ring_progress();
            }
        }
    }
}

fn check_attrs(nic: &Nic, attrs: &ViAttrs) -> ViaResult<Arc<crate::nic::Ptag>> {
    let tag = nic.ptag(attrs.ptag)?;
    if ![SERVICE_UNRELIABLE, SERVICE_RELIABLE_DELIVERY, SERVICE_RELIABLE_RECEPTION].contains(&attrs.reliability) {
        return Err(ViaError::InvalidReliabilityLevel);
    }
    if attrs.max_transfer == 0 || attrs.max_transfer > limits::MAX_TRANSFER_SIZE {
        return Err(ViaError::InvalidMtu);
    }
    if attrs.rdma_read && !reliable(attrs.reliability) {
        return Err(ViaError::InvalidRdmaRead);
    }
    Ok(tag)
}
