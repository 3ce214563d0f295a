//! A host's VIs, as the provider's VI handles packets ([`HostVis`] is the
//! [`Routes`] its endpoint hands them to), and the host itself.

use crate::Time;
use std::collections::HashMap;

use via_wire::Header;

use super::case::Case;
use super::datapath::SimDatapath;
use super::net::{Origin, SendSide};
use crate::endpoint::{Endpoint, FrameChoice, Routes};
use crate::{BreakReason, Config, Event, MsgKind, OutMessage, Peer, Segment, SendError, Session, Stats};

/// What a host's VIs tell the checker, in the order it happened.
#[derive(Debug)]
pub(super) enum Note {
    /// The receiving end `side` placed a segment.
    Placed { conn: usize, side: usize, segment: Segment, data: Vec<u8> },
    /// End `side` completed the send of its next message.
    Sent { conn: usize, side: usize },
    /// End `side` broke.
    Broken { conn: usize, side: usize, reason: BreakReason },
    /// A broken rule seen inside the host.
    Violation(String),
}

/// What a host's VIs send and report.
#[derive(Debug, Default)]
pub(super) struct HostOut {
    pub(super) send: SendSide,
    pub(super) notes: Vec<Note>,
}

impl HostOut {
    fn violation(&mut self, v: String) {
        self.notes.push(Note::Violation(v));
    }
}

/// One end of a connection on its host: what the provider's VI keeps for
/// the network.
#[derive(Debug)]
pub(super) struct Link {
    pub(super) conn: usize,
    pub(super) side: usize,
    pub(super) peer_host: usize,
    pub(super) local: Peer,
    pub(super) remote: Peer,
    pub(super) session: Session,
    pub(super) frames: FrameChoice,
    /// The peer is on this host's link: packets may go as frames.
    pub(super) frames_on: bool,
    /// Longest packet a frame carries.
    pub(super) max_frame: usize,
    /// Bytes of the messages being sent, by token, until `Sent`.
    pub(super) payloads: HashMap<u64, Vec<u8>>,
    pub(super) next_token: u64,
    /// One past the sequence number of the last segment placed: no packet
    /// may acknowledge beyond it.
    pub(super) placed_next: u32,
    /// Acknowledgements the session accepted from its peer: every sequence
    /// number below this arrived.
    pub(super) acked_below: u32,
    /// The key packets to this VI carried in its previous connection, if
    /// it had one: packets with it are stale.
    pub(super) stale_key: Option<u64>,
    /// Stale packets that reached the open session, and of them, those
    /// it refused without effect.
    pub(super) stale: (u64, u64),
}

impl Link {
    /// End `side` of connection `conn` of `case`, connected at `now`;
    /// `stale_key` is the key of the VI's previous connection, if any.
    pub(super) fn new(case: &Case, conn: usize, side: usize, now: Time, stale_key: Option<u64>) -> Link {
        let spec = &case.conns[conn];
        let ((_, local), (peer_host, remote)) = (spec.ends[side], spec.ends[1 - side]);
        let config = Config { reliable: spec.reliable, ..case.session.clone() };
        Link {
            conn,
            side,
            peer_host,
            local,
            remote,
            session: Session::new(config, local, remote, now),
            frames: FrameChoice::default(),
            frames_on: spec.frames,
            max_frame: case.max_frame,
            payloads: HashMap::new(),
            next_token: 1,
            placed_next: 1,
            acked_below: 1,
            stale_key,
            stale: (0, 0),
        }
    }

    fn reliable(&self) -> bool {
        self.session.config().reliable
    }

    fn origin(&self, header: &Header) -> Origin {
        let seq = header.kind.is_sequenced().then_some(header.seq);
        Origin { conn: self.conn, side: self.side, kind: header.kind, seq }
    }

    /// Queues a message and sends what it can, as an application's post
    /// does.
    pub(super) fn send_message(
        &mut self,
        now: Time,
        kind: MsgKind,
        imm: Option<u32>,
        data: Vec<u8>,
        out: &mut HostOut,
    ) -> Result<u32, SendError> {
        let token = self.next_token;
        self.next_token += 1;
        let number = self.session.send(OutMessage { kind, len: data.len() as u32, imm, token })?;
        self.payloads.insert(token, data);
        self.flush_and_apply(now, false, out);
        Ok(number)
    }

    /// Ends the connection as the application's disconnect does: the
    /// DISCONNECT leaves at once.
    pub(super) fn disconnect(&mut self, now: Time, out: &mut HostOut) {
        self.session.disconnect();
        self.flush_and_apply(now, false, out);
    }

    /// Runs the session's timers if due, and sends what they call for.
    pub(super) fn run_timers(&mut self, now: Time, out: &mut HostOut) {
        if self.session.poll_timeout().is_some_and(|t| t <= now) {
            self.session.handle_timeout(now);
            self.flush_and_apply(now, false, out);
        }
    }

    /// Packets for this VI, as the provider's VI takes them: acknowledgements
    /// held while they are handled, sent only after their data is placed.
    /// Returns whether the session owes an acknowledgement it held back
    /// (with `app_away`: whether anything is unacknowledged).
    fn deliver(
        &mut self,
        now: Time,
        packets: &[(Header, &[u8])],
        frame: bool,
        app_away: bool,
        out: &mut HostOut,
    ) -> bool {
        if frame {
            self.frames.heard_frame();
        }
        self.session.hold_acks();
        let mut pending = Vec::new();
        for (header, payload) in packets {
            self.take_packet(now, header, payload, &mut pending, out);
        }
        self.flush(now, true, &mut pending, out);
        if !self.session.acks_held() {
            self.session.release_acks();
            self.apply(pending, out);
            return self.session.acks_at_idle(app_away);
        }
        // Placed only now, after packets that left meanwhile: they must not
        // have acknowledged it.
        self.apply(pending, out);
        self.session.release_acks();
        self.flush_and_apply(now, true, out);
        self.session.acks_at_idle(app_away)
    }

    /// Sends the acknowledgement held back, if still owed (with
    /// `app_away`: of everything received, without the delay).  Returns
    /// whether a packet went.
    fn send_owed_ack(&mut self, now: Time, app_away: bool, out: &mut HostOut) -> bool {
        if !self.session.ready_idle_ack(app_away) {
            return false;
        }
        let sent = self.session.stats().packets_sent;
        self.flush_and_apply(now, false, out);
        self.session.stats().packets_sent > sent
    }

    /// Hands one packet to the session; a packet not meant for this
    /// connection (misdirected, or left from the VI's previous connection)
    /// must be refused by the key check and give nothing.
    fn take_packet(&mut self, now: Time, h: &Header, payload: &[u8], pending: &mut Vec<Event>, out: &mut HostOut) {
        let meant = h.key == self.local.key && h.src_vi == self.remote.vi && h.dst_vi == self.local.vi;
        let stale = self.stale_key == Some(h.key);
        let before = self.session.stats();
        let was_closed = self.session.is_closed();
        let queued = pending.len();
        if let Some(segment) = self.session.handle_packet_in_place(now, h, payload) {
            pending.push(segment.with_data(payload.to_vec()));
        }
        self.take_events(pending, out);
        if !meant {
            let refused = self.check_refused(h, stale, before, was_closed, &pending[queued..], out);
            if stale && !was_closed {
                self.stale.0 += 1;
                self.stale.1 += refused as u64;
            }
            return;
        }
        if self.reliable() && self.session.stats().packets_received > before.packets_received {
            self.acked_below = self.acked_below.max(h.ack);
        }
    }

    /// A packet `h` not meant for this connection (`stale`: of the VI's
    /// previous connection) gave `events`: it must give none (no data, no
    /// completion, no break), and the key check must have counted it, and
    /// nothing else.  Returns whether all of that held.
    fn check_refused(
        &self,
        h: &Header,
        stale: bool,
        before: Stats,
        was_closed: bool,
        events: &[Event],
        out: &mut HostOut,
    ) -> bool {
        let who = format!("conn {} side {} (VI {})", self.conn, self.side, self.local.vi);
        let what = if stale { "stale" } else { "misdirected" };
        let mut ok = true;
        if let Some(e) = events.first() {
            let e = match e {
                Event::Segment { .. } => "data".to_string(),
                e => format!("{e:?}"),
            };
            out.violation(format!("{who}: a {what} {} packet seq {} yielded {e}", h.kind, h.seq));
            ok = false;
        }
        let after = self.session.stats();
        if !was_closed && (after.bad_key - before.bad_key != 1 || after.packets_received != before.packets_received) {
            out.violation(format!("{who}: a {what} {} packet seq {} passed the key check", h.kind, h.seq));
            ok = false;
        }
        ok
    }

    /// Moves the session's events to `pending`, forgetting the bytes of
    /// messages that are sent.
    fn take_events(&mut self, pending: &mut Vec<Event>, out: &mut HostOut) {
        while let Some(e) = self.session.poll_event() {
            if let Event::Sent { token } = e {
                if self.payloads.remove(&token).is_none() {
                    out.violation(format!("conn {} side {}: Sent for unknown token {token}", self.conn, self.side));
                }
            }
            pending.push(e);
        }
    }

    /// Places received data and reports the events.
    fn apply(&mut self, events: Vec<Event>, out: &mut HostOut) {
        let (conn, side) = (self.conn, self.side);
        for e in events {
            match e {
                Event::Segment { kind, msg, offset, total, imm, first, last, seq, data } => {
                    if self.reliable() {
                        self.placed_next = seq.wrapping_add(1);
                    }
                    let segment = Segment { kind, msg, offset, total, imm, first, last, seq };
                    out.notes.push(Note::Placed { conn, side, segment, data });
                }
                Event::Sent { .. } => out.notes.push(Note::Sent { conn, side }),
                Event::Broken(reason) => out.notes.push(Note::Broken { conn, side, reason }),
            }
        }
    }

    pub(super) fn flush_and_apply(&mut self, now: Time, busy: bool, out: &mut HostOut) {
        let mut events = Vec::new();
        self.flush(now, busy, &mut events, out);
        self.apply(events, out);
    }

    /// Sends everything the session has to send, as `NetState::flush_with`
    /// does: the one fresh packet of a flush may go as a frame, if it is
    /// the only one in flight.  `busy`: more input is coming, an owed
    /// acknowledgement may wait.
    fn flush(&mut self, now: Time, busy: bool, events: &mut Vec<Event>, out: &mut HostOut) {
        let retransmits = self.session.stats().retransmits;
        let mut built: Vec<(Vec<u8>, Origin)> = Vec::new();
        loop {
            let t = if busy { self.session.poll_transmit_busy(now) } else { self.session.poll_transmit(now) };
            let Some(t) = t else { break };
            self.check_acknowledges_placed(&t.header, out);
            let origin = self.origin(&t.header);
            self.frames.leaving(origin.seq);
            let payload = self.gather(t.payload, out);
            built.push((via_wire::encode(&t.header, &payload), origin));
        }
        let fresh = self.session.stats().retransmits == retransmits;
        let in_flight = self.session.in_flight();
        let open = !self.session.is_closed();
        let lone = built.len() == 1;
        let frame = self.frames_on
            && built.first().is_some_and(|(bytes, _)| {
                self.frames.may_send(lone, fresh, open, in_flight, bytes.len(), self.max_frame)
            });
        if frame {
            let (bytes, origin) = built.pop().expect("one packet");
            if origin.seq.is_some() && in_flight > 1 {
                out.violation(format!(
                    "conn {} side {}: a frame left with {in_flight} in flight",
                    self.conn, self.side
                ));
            }
            self.frames.sent_frame(origin.seq);
            out.send.send_frame(self.peer_host, bytes, origin, self.acked_below);
        }
        for (bytes, origin) in built {
            out.send.send_datagram(self.peer_host, bytes, origin, self.acked_below);
        }
        self.take_events(events, out);
    }

    /// A reliable session's packet acknowledges only data already placed.
    fn check_acknowledges_placed(&self, h: &Header, out: &mut HostOut) {
        if self.reliable() && h.ack > self.placed_next {
            out.violation(format!(
                "conn {} side {}: a {} packet acknowledges up to {} with data placed up to {}",
                self.conn, self.side, h.kind, h.ack, self.placed_next
            ));
        }
    }

    /// The bytes a transmit names, from the messages being sent.
    fn gather(&self, payload: Option<crate::PayloadRef>, out: &mut HostOut) -> Vec<u8> {
        let Some(r) = payload else { return Vec::new() };
        let bytes = self.payloads.get(&r.token).and_then(|d| d.get(r.offset as usize..(r.offset + r.len) as usize));
        match bytes {
            Some(b) => b.to_vec(),
            None => {
                out.violation(format!("conn {} side {}: payload {r:?} not there to send", self.conn, self.side));
                Vec::new()
            }
        }
    }
}

/// A host's VIs: the [`Routes`] its endpoint hands packets to.
#[derive(Debug)]
pub struct HostVis {
    pub(super) now: Time,
    /// The route table: each VI's current connection.
    pub(super) links: Vec<Link>,
    /// Connections whose VIs connected again since: no longer routed to,
    /// kept for their counters.
    pub(super) retired: Vec<Link>,
    pub(super) out: HostOut,
    /// Acknowledgements sent because the endpoint said they were owed.
    pub(super) owed_acks: u64,
}

impl HostVis {
    fn index(&self, vi: u32) -> Option<usize> {
        self.links.iter().position(|l| l.local.vi == vi)
    }

    /// Whether the host has VI `vi`.
    pub fn has(&self, vi: u32) -> bool {
        self.index(vi).is_some()
    }

    /// Routes `link`'s VI to it, as the provider's `NetPort::register`
    /// replaces the VI's entry: its previous connection gets no more
    /// packets.
    pub(super) fn connect(&mut self, link: Link) {
        if let Some(i) = self.index(link.local.vi) {
            let old = self.links.remove(i);
            self.retired.push(old);
        }
        self.links.push(link);
    }

    /// The end `side` of `conn`, if routed to.
    pub(super) fn link(&mut self, conn: usize, side: usize) -> Option<&mut Link> {
        self.links.iter_mut().find(|l| l.conn == conn && l.side == side)
    }

    /// Every connection the host had, current or retired.
    pub(super) fn all_links(&self) -> impl Iterator<Item = &Link> {
        self.links.iter().chain(&self.retired)
    }
}

impl Routes for HostVis {
    fn deliver(&mut self, vi: u32, packets: &[(Header, &[u8])], frame: bool, app_away: bool) -> Option<bool> {
        let i = self.index(vi)?;
        Some(self.links[i].deliver(self.now, packets, frame, app_away, &mut self.out))
    }

    fn send_owed_ack(&mut self, vi: u32, app_away: bool) {
        if let Some(i) = self.index(vi) {
            let sent = self.links[i].send_owed_ack(self.now, app_away, &mut self.out);
            self.owed_acks += sent as u64;
        }
    }
}

/// One host: its port's endpoint, datapath and VIs.
#[derive(Debug)]
pub(super) struct Host {
    pub(super) endpoint: Endpoint,
    pub(super) datapath: SimDatapath,
    pub(super) vis: HostVis,
    pub(super) alive: bool,
    /// When it polls next (packets arrived).
    pub(super) wake: Option<Time>,
}
