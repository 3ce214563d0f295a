//! The data path of VIs connected over the network: posting turns a
//! descriptor into a message of the VI's session; the session's events
//! complete descriptors, place received bytes and answer RDMA requests.

use crate::counters::{Counter, StageTimer};
use crate::queue_lock::QueueGuard;
use crate::transport::udp::{scatter, Gather, NetEvent, NetEvents, NetLink, NetReceiver, Registered, RegistryOwner};
use crate::transport::Ending;
use crate::vi::{
    reliable, Answer, Break, Inbound, InboundWrite, Link, RecvQueue, SendItem, SendQueue, Transport, Vi, ViAttrs,
    ViState, WorkQueue,
};
use std::sync::{Arc, Weak};
use std::time::Duration;
use via_core::consts::error_code;
use via_core::consts::*;
use via_core::descriptor::{validate, DescPtr, LocalSeg, Op, Rules, Segs};
use via_core::registry::{Region, REGION_RDMA_READ, REGION_RDMA_WRITE};
use via_reliable::{BreakReason, MsgKind, OutMessage, Segment, SendError};

/// How long an unreliable RDMA write waits for its answer once sent.
const UNANSWERED_WRITE: Duration = Duration::from_millis(100);

/// The payload of an answer: buffers to read when packets go out, or
/// bytes read once and kept with the message.
enum Reply {
    Gather(Gather),
    Snapshot(Box<[u8]>),
}

/// What applying events asks of the session afterwards.
#[derive(Default)]
struct Followup {
    /// A timer to arm for an unanswered write.
    deadline: Option<std::time::Instant>,
    replies: Vec<(MsgKind, u32, Reply)>,
    close: Option<Break>,
    /// A packet refused (an RDMA write segment; a send too long for its
    /// receive or without one; a receive whose buffers went): the
    /// connection breaks acknowledging only the packets before it.
    refused: Option<Refusal>,
    lost: Option<u32>,
    woke: bool,
}

/// A packet refused, and the codes of the break it causes: the BREAK
/// acknowledges every packet before it, all placed, so that the peer
/// completes them (and no later one).
struct Refusal {
    seq: u32,
    /// The BREAK's code, which tells the peer what it sent was refused.
    theirs: u32,
    /// Reported to this process.
    mine: u32,
}

/// How the port reaches a VI connected through it.
impl NetReceiver for Vi {
    fn net_input(
        &self,
        link: &Arc<NetLink>,
        packets: &[(via_wire::Header, &[u8])],
        frame: bool,
        app_away: bool,
    ) -> bool {
        let mut events = NetEvents::new();
        let owed = {
            let mut st = link.state.lock();
            if frame {
                st.heard_frame();
            }
            let now = crate::clock::now_time();
            // What arrives now is acknowledged once it is placed (below).
            st.session.hold_acks();
            for &(ref header, payload) in packets {
                // In order: placed straight from the datagram.  A packet can
                // also release segments held for reordering; they follow it.
                if let Some(segment) = st.session.handle_packet_in_place(now, header, payload) {
                    events.push(NetEvent::Segment(segment, payload.into()));
                }
                st.take_events(&mut events);
            }
            st.flush_busy(link, now, &mut events);
            if !st.session.acks_held() {
                st.session.release_acks();
                if let Some(t) = st.session.poll_timeout() {
                    link.port.timer_before(t);
                }
                Some(st.session.acks_at_idle(app_away))
            } else {
                None
            }
        };
        if !events.is_empty() {
            self.apply_net(link, &mut events);
        }
        if let Some(owed) = owed {
            return owed;
        }
        // Placed (or refused, and the session broken): now packets may say
        // so, and an acknowledgement that fell due meanwhile goes.
        let mut more = NetEvents::new();
        let owed = {
            let mut st = link.state.lock();
            st.session.release_acks();
            st.flush_busy(link, crate::clock::now_time(), &mut more);
            if let Some(t) = st.session.poll_timeout() {
                link.port.timer_before(t);
            }
            st.session.acks_at_idle(app_away)
        };
        if !more.is_empty() {
            self.apply_net(link, &mut more);
        }
        owed
    }

    /// The place is found by `continuing_place`; the receive queue stays
    /// locked while `receive` runs, so that it stays this message's.
    fn receive_in_place(&self, max: usize, receive: &mut dyn FnMut(*mut u8, usize)) -> bool {
        let r = self.recv.lock();
        let Some((place, len)) = self.continuing_place(&r, max) else { return false };
        receive(place, len);
        true
    }

    /// Sends it only if no packet has carried it since; with `app_away`,
    /// also one still within its delay.
    fn send_owed_ack(&self, link: &Arc<NetLink>, app_away: bool) {
        let mut events = NetEvents::new();
        {
            let mut st = link.state.lock();
            if !st.session.ready_idle_ack(app_away) {
                return;
            }
            st.flush(link, &mut events);
        }
        if !events.is_empty() {
            self.apply_net(link, &mut events);
        }
    }

    fn net_timers(&self, link: &Arc<NetLink>, now: via_reliable::Time) -> Option<via_reliable::Time> {
        let mut events = NetEvents::new();
        let next = {
            let mut st = link.state.lock();
            if st.session.poll_timeout().is_some_and(|t| t <= now) {
                st.session.handle_timeout(now);
            }
            st.flush_at(link, now, &mut events);
            st.session.poll_timeout()
        };
        if !events.is_empty() {
            self.apply_net(link, &mut events);
        }
        let unanswered = self.expire_unanswered(crate::clock::instant_of(now)).map(crate::clock::time_of);
        next.into_iter().chain(unanswered).min()
    }
}

impl Transport for NetLink {
    fn complete(self: Arc<Self>, vi: &Arc<Vi>) {
        let mut r = vi.recv.lock();
        let mut s = vi.send.lock();
        self.route_to(Arc::downgrade(vi) as Weak<dyn NetReceiver>);
        // Sends' buffers are checked against this registry before their
        // bytes are read (`Outbound::check`).
        self.state.lock().registry_of = Some(vi.nic.clone() as Arc<dyn RegistryOwner>);
        vi.attach_link(&mut s, Link::Net(self));
        // Nothing of an earlier connection's messages carries over.
        r.inbound = None;
        r.writing = None;
        r.dropping = None;
        vi.set_state(ViState::Connected);
        vi.nic.counters.add(Counter::Connects, 1);
        drop(s);
        vi.bump();
    }

    fn post(
        vi: &Vi,
        mut q: QueueGuard<'_, SendQueue>,
        desc: DescPtr,
        mem: u32,
        own: &Region,
        rules: &Rules,
        _: &ViAttrs,
    ) {
        // A reference of its own: the session's events are applied with
        // the queue unlocked.
        let Some(Link::Net(link)) = q.link.clone() else {
            unreachable!("posted on the network without a network link")
        };
        let mut events = NetEvents::new();
        vi.post_net(&mut q, desc, mem, own, rules, &mut events);
        // The usual post completes nothing yet and hears of nothing:
        // then there is nothing to apply.
        let completed_now = q.items.back().is_some_and(|i| i.done);
        drop(q);
        if completed_now || !events.is_empty() {
            vi.apply_net(&link, &mut events);
        }
    }

    fn end(&self, how: Ending) {
        match how {
            Ending::Disconnect => self.disconnect(),
            Ending::Break(theirs) => self.close(theirs),
        }
    }

    /// Reads the NIC's one port, which every network link is on: the
    /// packets it finds land in their VIs (`NetReceiver`).  No reference
    /// to the link is taken on an empty poll.
    fn progress(vi: &Vi) -> bool {
        vi.nic.poll_net()
    }

    /// The port's packets end the wait: the helper thread reads the port
    /// meanwhile and wakes the VI a packet is for.
    fn sleep(vi: &Vi, _queue: WorkQueue, word: u32, nap: Duration) {
        let _port = vi.nic.sleep_on_port();
        vi.sleep_on_word(word, nap);
    }
}

impl Vi {
    /// Posts a send-queue descriptor on the network link `q` holds; the
    /// session's events for the work queues go to `events`.
    pub(crate) fn post_net(
        &self,
        q: &mut SendQueue,
        desc: DescPtr,
        mem: u32,
        own: &Region,
        rules: &Rules,
        events: &mut NetEvents<'static>,
    ) {
        let Some(Link::Net(link)) = &q.link else { unreachable!("posted on the network without a network link") };
        let mut st = link.state.lock();
        let timer = StageTimer::start();
        // Before the buffers are checked: a region that goes after this
        // shows.  The descriptor's own region was looked up before it, for
        // the post: it must still be there.
        let epoch = rules.registry.deregistrations();
        let checked = match rules.registry.is_live(mem) {
            true => validate(desc, mem, own, false, rules),
            false => Err(STATUS_PROTECTION_ERROR),
        };
        timer.stop(&self.nic.counters, Counter::ValidateNs, None);
        let timer = StageTimer::start();
        match checked {
            Err(bits) => {
                let op = desc.op_status_bits();
                desc.complete(op | bits, 0, None);
                let item = SendItem { desc, token: 0, answer: None, mem, epoch, op, length: 0, done: true };
                q.items.push_back(item);
                if reliable(self.attrs().reliability) {
                    st.session.close(error_code::CONN_LOST);
                }
            }
            Ok(wr) => {
                let op = wr.op.status_bits(false);
                let gather: Gather = wr.segs.iter().map(|s| (s.addr, s.len)).collect();
                let total = wr.total as u32;
                // An RDMA write completes when the target has checked and
                // placed it, so that a refused write reports RDMA_PROT_ERROR
                // to the initiator as on one host: with the acknowledgement
                // of its last packet where the target places before it
                // acknowledges, else with the target's answer.
                let answered = !link.placed_acks;
                let (kind, len, read) = match (wr.op, wr.remote) {
                    (Op::RdmaWrite, Some((addr, handle))) => {
                        (MsgKind::RdmaWrite { addr, handle }, total, answered.then(Segs::new))
                    }
                    (Op::RdmaRead, Some((addr, handle))) => {
                        (MsgKind::RdmaReadRequest { addr, handle, len: total }, 0, Some(wr.segs.clone()))
                    }
                    _ => (MsgKind::Send, total, None),
                };
                // The bytes are read from the buffers as packets go out,
                // while they stay registered (`Outbound::check`).  An RDMA
                // read sends none of them.
                let token = if wr.op == Op::RdmaRead {
                    st.remember(Gather::new())
                } else {
                    let handles = wr.segs.iter().map(|s| s.handle).collect();
                    st.remember_registered(gather, Registered { epoch, ptag: rules.ptag, handles })
                };
                let sent = st.session.send(OutMessage { kind, len, imm: wr.immediate, token });
                let mut item = SendItem { desc, token, answer: None, mem, epoch, op, length: total, done: false };
                match sent {
                    Ok(msg) => {
                        item.answer = read.map(|segs| Box::new(Answer { msg, segs, give_up: None }));
                        // The queue's own row: plain adds, no atomics.
                        let c = &mut q.tally;
                        match wr.op {
                            Op::SendRecv => {
                                c.add(Counter::MsgsSent, 1);
                                c.add(Counter::BytesSent, total as u64);
                            }
                            Op::RdmaWrite => c.add(Counter::RdmaWrites, 1),
                            Op::RdmaRead => c.add(Counter::RdmaReads, 1),
                        }
                    }
                    Err(e) => {
                        st.outbound.remove(token);
                        let bits = if e == SendError::TooLarge { STATUS_LENGTH_ERROR } else { STATUS_TRANSPORT_ERROR };
                        desc.complete(op | bits, 0, None);
                        item.done = true;
                    }
                }
                q.items.push_back(item);
            }
        }
        st.flush(link, events);
        timer.stop(&self.nic.counters, Counter::TransferNs, Some(Counter::Transfers));
        if let Some(t) = st.session.poll_timeout() {
            link.port.timer_before(t);
        }
    }

    /// The place where the message being received continues and the room
    /// there, at most `max` bytes, so that the kernel can write the
    /// next packet's payload where it belongs rather than into a buffer to
    /// copy it from: the posted receive's buffer, or the target of an RDMA
    /// write whose first packet was checked and placed.  `None` when no
    /// message is under way or nothing of it is left.
    ///
    /// Whatever the kernel writes there, a packet of another message or a
    /// damaged one, is safe while `r` stays locked: the descriptor can
    /// neither complete nor be flushed, and
    /// only bytes past those placed are offered, which the message's own
    /// bytes overwrite before it completes (the session delivers them in
    /// order).  An RDMA write's are offered only on a reliable VI, where
    /// the write's own bytes come or the connection breaks, and only where
    /// the target's registry, tag and enable allow the write just now, as
    /// for a copy.
    fn continuing_place(&self, r: &RecvQueue, max: usize) -> Option<(*mut u8, usize)> {
        if let Some(w) = r.writing {
            let len = max.min(w.left as usize);
            let (rules, attrs) = self.rules();
            if len == 0 || !(attrs.rdma_write && local_allows(&rules, w.handle, w.next, len as u64, REGION_RDMA_WRITE))
            {
                return None;
            }
            return Some((w.next as *mut u8, len));
        }
        let inbound = r.inbound?;
        let item = r.items.get(r.done).filter(|i| !i.done && i.error == 0)?;
        // Only while no region went since its buffers were last found
        // registered (one load): else the packet goes through the receive
        // buffer, and `place` asks the registry before it writes a byte.
        if self.nic.registry.deregistrations() != item.epoch {
            return None;
        }
        let left = inbound.total.saturating_sub(inbound.placed) as usize;
        continuation(&item.segs, inbound.placed, max.min(left))
    }

    /// Completes unreliable RDMA writes whose answer did not come in time
    /// (unreliable service reports no remote outcome); returns the next such deadline.
    fn expire_unanswered(&self, now: std::time::Instant) -> Option<std::time::Instant> {
        // Only an unreliable VI gives up on an answer; the send queue's lock
        // stays with the application's thread on the others.
        if reliable(self.attrs().reliability) {
            return None;
        }
        let mut s = self.send.lock();
        let mut next: Option<std::time::Instant> = None;
        for item in s.items.iter_mut().filter(|i| !i.done) {
            match item.answer.as_ref().and_then(|a| a.give_up) {
                Some(t) if t <= now => {
                    let (status, length) = (item.op, item.length);
                    item.finish(&self.nic.registry, status, length);
                }
                Some(t) => next = Some(next.map_or(t, |n| n.min(t))),
                None => {}
            }
        }
        let completed = s.advance();
        drop(s);
        for _ in 0..completed {
            self.push_cq(false);
        }
        if completed > 0 {
            self.bump();
        }
        next
    }

    /// Applies a session's events to the work queues.
    pub(crate) fn apply_net(&self, link: &Arc<NetLink>, events: &mut NetEvents<'_>) {
        let (rules, attrs) = self.rules();
        let reliable = reliable(attrs.reliability);
        let mut f = Followup::default();
        {
            let mut r = self.recv.lock();
            let mut s = self.send.lock();
            if !s.net().is_some_and(|l| Arc::ptr_eq(l, link)) {
                return; // a late event of a link that is gone
            }
            // Drained in place: the list is not moved, only its events.
            for event in events.drain(..) {
                tracing::trace!(vi = self.handle, ?event, "session event");
                match event {
                    NetEvent::Sent { token } => {
                        if let Some(item) = s.items.iter_mut().find(|i| !i.done && i.token == token) {
                            if let Some(answer) = &mut item.answer {
                                if !reliable && item.op == STATUS_OP_RDMA_WRITE {
                                    // The answer may be lost on an unreliable VI: do not wait for ever.
                                    answer.give_up = Some(crate::clock::now() + UNANSWERED_WRITE);
                                    f.deadline = answer.give_up;
                                }
                            } else {
                                let (status, length) = (item.op, item.length);
                                item.finish(rules.registry, status, length);
                            }
                        }
                    }
                    NetEvent::Segment(Segment { kind, msg, offset, total, imm, first, last, seq }, data) => {
                        // Only the packet after a placed one of a write continues it.
                        r.writing = None;
                        match kind {
                            MsgKind::Send => {
                                let timer = StageTimer::start();
                                let at = Arrival { msg, seq, offset, total, imm, first, last };
                                self.place(&mut r, at, &data, reliable && link.placed_acks, reliable, &mut f);
                                timer.stop(&self.nic.counters, Counter::ReceiveNs, last.then_some(Counter::Receives));
                                if f.refused.is_some() {
                                    break;
                                }
                            }
                            MsgKind::RdmaWrite { addr, handle } => {
                                if r.dropping == Some(msg) {
                                    continue; // refused earlier segment of this write
                                }
                                let at = addr.wrapping_add(offset as u64);
                                // The whole write is checked with its first segment, so
                                // that a refused write lands no byte at all.
                                let allowed = |a: u64, n: u64| {
                                    attrs.rdma_write && local_allows(&rules, handle, a, n, REGION_RDMA_WRITE)
                                };
                                let refused =
                                    (first && !allowed(addr, total as u64)) || !allowed(at, data.len() as u64);
                                if refused && link.placed_acks {
                                    // Refused: the connection breaks, acknowledging only
                                    // the packets before this one.
                                    self.nic.counters.add(Counter::RdmaRefused, 1);
                                    let code = error_code::RDMAW_PROT;
                                    f.refused = Some(Refusal { seq, theirs: code, mine: code });
                                    break;
                                }
                                if refused {
                                    // Refused: the answer tells the initiator, which breaks
                                    // a reliable connection once it knows (the answer must
                                    // get there first).
                                    self.nic.counters.add(Counter::RdmaRefused, 1);
                                    let answer =
                                        MsgKind::RdmaReadResponse { request: msg, status: STATUS_RDMA_PROT_ERROR };
                                    f.replies.push((answer, 0, Reply::Gather(Gather::new())));
                                    if !last {
                                        r.dropping = Some(msg);
                                    }
                                    continue;
                                }
                                // Already there if the kernel wrote it in place (`receive_in_place`).
                                if data.as_ptr() != at as *const u8 {
                                    // SAFETY: checked against this process's registry just now.
                                    // The bytes may lie in a posted receive buffer or another
                                    // write's target (`NetPort::land`), which may overlap this one.
                                    unsafe { std::ptr::copy(data.as_ptr(), at as *mut u8, data.len()) };
                                }
                                // The rest of a write on a reliable VI may land in place.
                                let placed = offset.saturating_add(data.len() as u32);
                                r.writing = (reliable && !last && placed < total).then(|| InboundWrite {
                                    handle,
                                    next: addr.wrapping_add(placed as u64),
                                    left: total - placed,
                                });
                                if last && !link.placed_acks {
                                    f.replies.push((
                                        MsgKind::RdmaReadResponse { request: msg, status: 0 },
                                        0,
                                        Reply::Gather(Gather::new()),
                                    ));
                                }
                                if last && imm.is_some() {
                                    self.settle(&mut r);
                                    let index = r.done;
                                    match r.items.get_mut(index) {
                                        Some(item) => {
                                            let bits = STATUS_OP_REMOTE_RDMA_WRITE | STATUS_IMMEDIATE;
                                            item.finish(rules.registry, bits, total, imm);
                                            r.done += 1;
                                            self.push_cq(true);
                                            f.woke = true;
                                        }
                                        None if reliable && link.placed_acks => {
                                            f.refused = Some(no_receive().refusing(seq));
                                            break;
                                        }
                                        None if reliable => f.close = Some(no_receive()),
                                        None => {}
                                    }
                                }
                            }
                            MsgKind::RdmaReadRequest { addr, handle, len } => {
                                let ok =
                                    attrs.rdma_read && local_allows(&rules, handle, addr, len as u64, REGION_RDMA_READ);
                                let status = if ok { 0 } else { STATUS_RDMA_PROT_ERROR };
                                self.nic.counters.add(Counter::RdmaRefused, (!ok) as u64);
                                // Read once, now: a retransmission must not read
                                // the region again, which may be deregistered
                                // (and unmapped) by then.
                                let bytes: Box<[u8]> = match ok {
                                    // SAFETY: the range lies in a region registered for RDMA read (checked above).
                                    true => {
                                        unsafe { std::slice::from_raw_parts(addr as *const u8, len as usize) }.into()
                                    }
                                    false => Box::new([]),
                                };
                                f.replies.push((
                                    MsgKind::RdmaReadResponse { request: msg, status },
                                    if ok { len } else { 0 },
                                    Reply::Snapshot(bytes),
                                ));
                            }
                            MsgKind::RdmaReadResponse { request, status } => {
                                let found = s
                                    .items
                                    .iter_mut()
                                    .find(|i| !i.done && i.answer.as_ref().is_some_and(|a| a.msg == request));
                                if let Some(item) = found {
                                    if status != 0 {
                                        item.finish(rules.registry, item.op | STATUS_RDMA_PROT_ERROR, 0);
                                        if reliable {
                                            // The target refused: on a reliable VI the connection breaks.
                                            let theirs = if item.op == STATUS_OP_RDMA_WRITE {
                                                error_code::RDMAW_PROT
                                            } else {
                                                error_code::RDMAR_PROT
                                            };
                                            f.close = Some(Break { mine: error_code::CONN_LOST, theirs });
                                        }
                                    } else if item.op == STATUS_OP_RDMA_WRITE {
                                        let (status, length) = (item.op, item.length);
                                        item.finish(rules.registry, status, length);
                                    } else {
                                        let segs = &item.answer.as_ref().expect("awaits its answer").segs;
                                        // The local buffers may have been
                                        // deregistered (and unmapped) since
                                        // the read was posted: then no byte
                                        // lands, a local protection error.
                                        let (desc_live, buffers_live) =
                                            still_registered(&rules, item.mem, &mut item.epoch, segs);
                                        if !buffers_live {
                                            item.finish(rules.registry, item.op | STATUS_PROTECTION_ERROR, 0);
                                            if reliable && desc_live {
                                                f.close = Some(Break {
                                                    mine: error_code::POST_DESC,
                                                    theirs: error_code::CONN_LOST,
                                                });
                                            }
                                        } else if !scatter(segs, offset as u64, &data) || total != item.length {
                                            item.finish(rules.registry, item.op | STATUS_TRANSPORT_ERROR, 0);
                                        } else if last {
                                            item.finish(rules.registry, item.op, total);
                                        }
                                    }
                                }
                            }
                        }
                    }
                    NetEvent::Broken(BreakReason::PeerBreak(error_code::RDMAW_PROT)) if link.placed_acks => {
                        // The target refused our oldest unacknowledged RDMA write.
                        let refused = s.items.iter_mut().find(|i| !i.done && i.op == STATUS_OP_RDMA_WRITE);
                        if let Some(item) = refused {
                            item.finish(rules.registry, item.op | STATUS_RDMA_PROT_ERROR, 0);
                        }
                        f.lost.get_or_insert(error_code::CONN_LOST);
                    }
                    NetEvent::Broken(BreakReason::PeerBreak(via_wire::BREAK_RECEIVE_TOO_SHORT)) if link.placed_acks => {
                        // The peer's receive was too short for our oldest
                        // unacknowledged send (reliable reception).
                        let refused = s.items.iter_mut().find(|i| !i.done && i.op == STATUS_OP_SEND);
                        if let Some(item) = refused {
                            let length = item.length;
                            item.finish(rules.registry, item.op | STATUS_REMOTE_DESC_ERROR, length);
                        }
                        f.lost.get_or_insert(error_code::CONN_LOST);
                    }
                    NetEvent::Unreadable { token } => {
                        // A buffer of this send was deregistered before its
                        // bytes were all read: nothing more of it goes, and
                        // a reliable session was closed where it was found.
                        if let Some(item) = s.items.iter_mut().find(|i| !i.done && i.token == token) {
                            item.finish(rules.registry, item.op | STATUS_PROTECTION_ERROR, 0);
                            if reliable {
                                f.lost.get_or_insert(error_code::POST_DESC);
                            }
                        }
                    }
                    NetEvent::Broken(reason) => {
                        tracing::info!(vi = link.local_vi, ?reason, "network connection broken");
                        // The first reason stands (`Unreadable` before the
                        // break it caused).
                        f.lost.get_or_insert(match reason {
                            BreakReason::PeerBreak(code) if code <= error_code::CATASTROPHIC => code,
                            _ => error_code::CONN_LOST,
                        });
                    }
                }
            }
            let completed = s.advance();
            for _ in 0..completed {
                self.push_cq(false);
            }
            f.woke |= completed > 0;
        }
        if f.woke {
            self.bump();
        }
        if let Some(t) = f.deadline {
            link.port.timer_before(crate::clock::time_of(t));
        }
        if !f.replies.is_empty() || f.close.is_some() || f.refused.is_some() {
            let mut more = NetEvents::new();
            {
                let mut st = link.state.lock();
                // The answers acknowledge what this batch placed before them:
                // an initiator that closes on a refused read must find the
                // sends and writes before it acknowledged, as they were placed.
                match &f.refused {
                    Some(r) => st.session.placed_before(r.seq),
                    None => st.session.release_acks(),
                }
                for (kind, len, reply) in f.replies.drain(..) {
                    let token = match reply {
                        Reply::Gather(gather) => st.remember(gather),
                        Reply::Snapshot(bytes) => st.remember_snapshot(bytes),
                    };
                    let _ = st.session.send(OutMessage { kind, len, imm: None, token });
                }
                // Answers go out before a BREAK that closes the session.
                st.flush(link, &mut more);
                if let Some(r) = &f.refused {
                    st.session.close_refusing(r.seq, r.theirs);
                    st.flush(link, &mut more);
                } else if let Some(b) = f.close {
                    st.session.close(b.theirs);
                    st.flush(link, &mut more);
                }
            }
            if let Some(r) = f.refused {
                self.net_lost(r.mine);
                return;
            }
            if let Some(b) = f.close {
                self.net_lost(b.mine);
                return;
            }
            if !more.is_empty() {
                self.apply_net(link, &mut more);
            }
        }
        if let Some(code) = f.lost {
            self.net_lost(code);
        }
    }

    /// Places a segment of a received send into the first pending receive.
    /// `refusing`: a reliable connection whose acknowledgements say a packet
    /// was placed, where a packet that breaks it is refused by packet, so
    /// that its sender completes exactly what was placed before it.
    fn place(&self, r: &mut RecvQueue, at: Arrival, data: &[u8], refusing: bool, reliable: bool, f: &mut Followup) {
        let Arrival { msg, seq, offset, total, imm, first, last } = at;
        if r.dropping == Some(msg) {
            if last {
                r.dropping = None;
            }
            return;
        }
        if first {
            self.settle(r);
            let index = r.done;
            match r.items.get_mut(index) {
                None => {
                    if refusing {
                        f.refused = Some(no_receive().refusing(seq));
                    } else if reliable {
                        f.close = Some(no_receive());
                    } else {
                        self.nic.counters.add(Counter::DroppedNoRecv, 1);
                    }
                    if !last {
                        r.dropping = Some(msg);
                    }
                    return;
                }
                Some(item) if total as u64 > item.total => {
                    item.finish(&self.nic.registry, received(imm) | STATUS_LENGTH_ERROR, 0, imm);
                    r.done += 1;
                    self.push_cq(true);
                    f.woke = true;
                    if refusing {
                        // Reliable reception: its sender learns which message it was.
                        let theirs = if self.attrs().reliability == SERVICE_RELIABLE_RECEPTION {
                            via_wire::BREAK_RECEIVE_TOO_SHORT
                        } else {
                            error_code::CONN_LOST
                        };
                        f.refused = Some(Refusal { seq, theirs, mine: error_code::CONN_LOST });
                    } else if reliable {
                        f.close = Some(Break { mine: error_code::CONN_LOST, theirs: error_code::CONN_LOST });
                    }
                    if !last {
                        r.dropping = Some(msg);
                    }
                    return;
                }
                Some(_) => r.inbound = Some(Inbound { msg, total, placed: 0 }),
            }
        }
        if r.inbound.is_none_or(|i| i.msg != msg) {
            return;
        }
        let index = r.done;
        let item = &mut r.items[index];
        // Before a byte lands: the application may have deregistered (and
        // unmapped) a buffer of the receive since it posted it.  One load
        // while no region went since they were last found registered.
        let (desc_live, buffers_live) = if self.nic.registry.deregistrations() == item.epoch {
            (true, true)
        } else {
            still_registered(&self.rules().0, item.mem, &mut item.epoch, &item.segs)
        };
        if !buffers_live {
            // No byte lands, a local protection error.  (Or the descriptor's
            // own region went, and with it what its buffers are: nothing
            // lands, nothing is written, and the connection, which did
            // nothing wrong, goes on.)
            item.finish(&self.nic.registry, received(imm) | STATUS_PROTECTION_ERROR, 0, imm);
            r.done += 1;
            r.inbound = None;
            self.push_cq(true);
            f.woke = true;
            if desc_live && reliable {
                let lost = Break { mine: error_code::POST_DESC, theirs: error_code::CONN_LOST };
                if refusing {
                    f.refused = Some(lost.refusing(seq));
                } else {
                    f.close = Some(lost);
                }
            }
            if !last {
                r.dropping = Some(msg);
            }
            return;
        }
        if let Some(inbound) = r.inbound.as_mut() {
            inbound.placed = offset.saturating_add(data.len() as u32);
        }
        let item = &mut r.items[index];
        scatter(&item.segs, offset as u64, data);
        if last {
            item.finish(&self.nic.registry, received(imm), total, imm);
            r.done += 1;
            r.inbound = None;
            r.tally.add(Counter::MsgsReceived, 1);
            r.tally.add(Counter::BytesReceived, total as u64);
            self.push_cq(true);
            f.woke = true;
        }
    }
}

/// A packet of a send, as `place` takes it.
struct Arrival {
    msg: u32,
    seq: u32,
    offset: u32,
    total: u32,
    imm: Option<u32>,
    first: bool,
    last: bool,
}

/// The status bits of a receive that a message completed, with or without
/// an error: immediate data is reported whenever the message carried it,
/// as over shared memory.
fn received(imm: Option<u32>) -> u32 {
    STATUS_OP_RECEIVE | if imm.is_some() { STATUS_IMMEDIATE } else { 0 }
}

/// The place in the buffers `segs` where byte `offset` of a message lies,
/// as long as the bytes from there stay in one segment, at most `max`:
/// its address and length, or `None` for none.
fn continuation(segs: &[LocalSeg], offset: u32, max: usize) -> Option<(*mut u8, usize)> {
    let mut offset = offset as u64;
    for s in segs {
        let len = s.len as u64;
        if offset < len {
            let n = ((len - offset) as usize).min(max);
            return (n > 0).then_some(((s.addr + offset) as *mut u8, n));
        }
        offset -= len;
    }
    None
}

/// Whether a descriptor posted with memory handle `mem` and its buffers
/// `segs` are still registered: the descriptor's own region, and each
/// buffer in the region of its handle with the VI's tag.  While the
/// registry has seen no deregistration since `*epoch` (read before they
/// were last checked) they are, in one load; otherwise they are looked up,
/// and if all are there `*epoch` moves on to the count read first.
/// Returns whether the descriptor may be written and whether the buffers
/// may be read or written.
fn still_registered(rules: &Rules, mem: u32, epoch: &mut u32, segs: &[LocalSeg]) -> (bool, bool) {
    let registry = rules.registry;
    let now = registry.deregistrations();
    if now == *epoch {
        return (true, true);
    }
    let desc = registry.is_live(mem);
    let buffers = desc && segs.iter().all(|s| registry.check_local(s.handle, s.addr, s.len as u64, rules.ptag));
    if buffers {
        *epoch = now;
    }
    (desc, buffers)
}

/// A message arrived for a reliable VI with no receive posted.
fn no_receive() -> Break {
    Break { mine: error_code::RECVQ_EMPTY, theirs: error_code::CONN_LOST }
}

impl Break {
    /// This break, caused by packet `seq`.
    fn refusing(self, seq: u32) -> Refusal {
        Refusal { seq, theirs: self.theirs, mine: self.mine }
    }
}

/// Checks an incoming RDMA access against this process's registry.
fn local_allows(rules: &Rules, handle: u32, addr: u64, len: u64, flag: u32) -> bool {
    matches!(rules.registry.lookup(handle), Some(r) if r.ptag == rules.ptag && r.flags & flag != 0 && r.contains(addr, len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_continuation_stays_in_one_segment_and_within_the_message() {
        let segs = [LocalSeg { addr: 0x1000, len: 100, handle: 0 }, LocalSeg { addr: 0x9000, len: 50, handle: 0 }];
        assert_eq!(continuation(&segs, 0, 1000), Some((0x1000 as *mut u8, 100)));
        assert_eq!(continuation(&segs, 40, 1000), Some((0x1028 as *mut u8, 60)));
        assert_eq!(continuation(&segs, 100, 1000), Some((0x9000 as *mut u8, 50)));
        assert_eq!(continuation(&segs, 120, 10), Some((0x9014 as *mut u8, 10)));
        // Past the buffers, or nothing left of the message: nowhere.
        assert_eq!(continuation(&segs, 150, 1000), None);
        assert_eq!(continuation(&segs, u32::MAX, 1000), None);
        assert_eq!(continuation(&segs, 10, 0), None);
        assert_eq!(continuation(&[], 0, 1000), None);
    }

    #[test]
    fn buffers_and_descriptors_are_asked_again_only_after_a_deregistration() {
        use via_core::registry::Registry;
        let reg = Registry::new().unwrap();
        let (tag, page) = (3, 4096u64);
        // SAFETY: an anonymous private mapping, checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                3 * page as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let p = p as u64;
        let desc = reg.register(p, page, tag, 0, false).unwrap();
        let buf = reg.register(p + page, page, tag, 0, false).unwrap();
        let other = reg.register(p + 2 * page, page, tag, 0, false).unwrap();
        let rules = Rules { registry: &reg, ptag: tag, max_transfer: 1 << 20, rdma_read: true };
        let segs = [LocalSeg { addr: p + page + 8, len: 100, handle: buf }];
        let posted = reg.deregistrations();
        let mut epoch = posted;
        assert_eq!(still_registered(&rules, desc, &mut epoch, &segs), (true, true));
        assert_eq!(epoch, posted);
        // Another region went: looked up, still there, the count moves on.
        reg.deregister(other, p + 2 * page).unwrap();
        assert_eq!(still_registered(&rules, desc, &mut epoch, &segs), (true, true));
        assert_eq!(epoch, reg.deregistrations());
        // The buffer's region went: the descriptor may be written, the buffer not.
        reg.deregister(buf, p + page).unwrap();
        assert_eq!(still_registered(&rules, desc, &mut epoch, &segs), (true, false));
        // A handle that names another region than the buffer's: refused.
        let elsewhere = [LocalSeg { addr: p + page + 8, len: 100, handle: desc }];
        assert_eq!(still_registered(&rules, desc, &mut epoch, &elsewhere), (true, false));
        // And the descriptor's own region: neither.
        reg.deregister(desc, p).unwrap();
        assert_eq!(still_registered(&rules, desc, &mut epoch, &segs), (false, false));
        // SAFETY: the mapping made above, registered no more.
        unsafe { libc::munmap(p as *mut libc::c_void, 3 * page as usize) };
    }
}
