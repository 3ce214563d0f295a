//! A deterministic simulation of whole ports: several hosts, each an
//! [`Endpoint`] carrying many sessions, joined by a simulated network, in
//! one thread with virtual time.
//!
//! Where [`crate::sim`] tests one connection, this tests what a port adds
//! around its sessions: routing by VI id, acknowledgements owed until a
//! poll finds the datapath empty, the read schedule, and frames that take a
//! faster path than datagrams.  Its layers follow the provider's:
//!
//! - [`SimNet`] carries packets (real bytes, `via_wire::encode`d) between
//!   up to [`MAX_HOSTS`] hosts, on two paths per host pair: datagrams,
//!   kept in order per pair, and frames, faster, so that a frame can
//!   overtake datagrams sent before it;
//! - [`FaultInjector`] sits on the send side and loses, duplicates, holds
//!   back (reorders), corrupts and misdirects packets (to another VI of the
//!   same host, re-checksummed, or to the wrong host), and partitions a host
//!   pair for a while;
//! - [`SimDatapath`] is a host's [`Datapath`]: arrived frames, a queue per
//!   peer that has a path of its own, and a shared queue for the others;
//! - [`HostVis`] is a host's [`Routes`]: its VIs, each a [`Session`], a
//!   [`FrameChoice`] and the bytes of the messages it sends, handling
//!   packets as the provider's VI does (`hold_acks`, place, flush busy,
//!   release, report an owed acknowledgement).
//!
//! [`run`] draws a whole case from a seed: 2 to 4 hosts, up to 6 reliable
//! or unreliable connections between random (host, VI) pairs with random
//! VI ids and keys, messages both ways, faults, and maybe the death of one
//! host.  Every host polls its endpoint (reading everything, for an absent
//! application, at random) and runs its timers.  The run checks, as it
//! goes:
//!
//! - reliable connections deliver every message exactly once, in order,
//!   whole, with its kind, immediate data and bytes; unreliable ones at most
//!   once, whole and in order;
//! - no packet acknowledges a sequence number whose data is not placed, and
//!   `Event::Sent` comes only once the peer placed the whole message;
//! - a misdirected packet is refused by its target's key check
//!   (`Stats::bad_key`) and never yields data there;
//! - a sequenced packet leaves as a frame only as the one packet its
//!   session has in flight, with no earlier unacknowledged datagram of that
//!   session still in the network or unread at the peer;
//! - after a poll that found nothing, no session of the host owes an
//!   acknowledgement;
//! - the endpoint's tally matches what the datapath handed it;
//! - every connection between live hosts completes (or, across a long
//!   partition, breaks at both ends), every session with a dead host
//!   breaks, time advances, and all of it within a virtual time limit.
//!
//! A failure prints its seed; replay it alone with
//! `VIA_NETSIM_SEED=n cargo test -p via-reliable --test netsim`.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::fmt;
use std::time::{Duration, Instant};

use via_wire::{Header, Kind, Packet, HEADER_LEN};

use crate::endpoint::{Datapath, Endpoint, FrameChoice, Inbox, Routes, Tally};
use crate::sim::SimRng;
use crate::{BreakReason, Config, Event, MsgKind, OutMessage, Peer, Segment, SendError, Session, Stats};

/// Most hosts a case joins.
pub const MAX_HOSTS: usize = 4;

/// Virtual time after which a connection neither done nor broken stalled.
const TIME_LIMIT: Duration = Duration::from_secs(40);

/// A partition at least this long breaks the sessions across it (longer
/// than their idle timeout).
const LONG_PARTITION: Duration = Duration::from_secs(3);

/// Polls one wake-up may take before the host is deemed never idle.
const MAX_POLLS: usize = 10_000;

/// Which of a host pair's paths a packet takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// A UDP datagram: datagrams between two hosts keep their order.
    Datagram,
    /// An Ethernet frame: a faster path that may overtake datagrams.
    Frame,
}

/// Which session sent a packet: what the simulator knows of it beyond its
/// bytes, which are all the receiver sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Origin {
    /// The connection, by index.
    pub conn: usize,
    /// The end of the connection that sent it (0 or 1).
    pub side: usize,
    /// Its kind.
    pub kind: Kind,
    /// Its sequence number, for a sequenced kind.
    pub seq: Option<u32>,
}

/// A packet a host hands to its datapath.
#[derive(Debug, Clone)]
pub struct Outgoing {
    /// The host it is for.
    pub to: usize,
    /// Datagram or frame.
    pub path: Path,
    /// The encoded packet.
    pub bytes: Vec<u8>,
    /// Who sent it.
    pub origin: Origin,
    /// Every sequence number below this was acknowledged to the sending
    /// session when the packet left (what the session accepted from its
    /// peer, counted apart from the session's own bookkeeping).
    pub acked_below: u32,
}

/// The send side of a host's datapath: the packets its VIs built, in
/// order, until the network takes them.  The VIs hold it (as a link holds
/// its port's sockets), so that they can send while a poll lends the
/// receive side to the endpoint.
#[derive(Debug, Default)]
pub struct SendSide {
    packets: Vec<Outgoing>,
}

impl SendSide {
    /// Sends a packet as a datagram.
    pub fn send_datagram(&mut self, to: usize, bytes: Vec<u8>, origin: Origin, acked_below: u32) {
        self.packets.push(Outgoing { to, path: Path::Datagram, bytes, origin, acked_below });
    }

    /// Sends one packet as a frame.
    pub fn send_frame(&mut self, to: usize, bytes: Vec<u8>, origin: Origin, acked_below: u32) {
        self.packets.push(Outgoing { to, path: Path::Frame, bytes, origin, acked_below });
    }

    /// Takes what was sent since the last call.
    pub fn take(&mut self) -> Vec<Outgoing> {
        std::mem::take(&mut self.packets)
    }
}

/// A packet in the network or waiting at its host, with what the
/// simulator did to it.
#[derive(Debug, Clone)]
pub struct Carried {
    /// The sending host.
    pub from: usize,
    /// The host it arrives at (the wrong one, if misdirected there).
    pub to: usize,
    /// Datagram or frame.
    pub path: Path,
    /// The bytes as they arrive.
    pub bytes: Vec<u8>,
    /// Who sent it.
    pub origin: Origin,
    /// A byte was flipped: the receiver must refuse it as malformed.
    pub corrupted: bool,
    /// Sent to another VI or host than its session's peer.
    pub misdirected: bool,
}

impl Carried {
    /// A packet of `origin`'s session that its peer may take: not damaged,
    /// not sent astray.
    fn intact_for_peer(&self) -> bool {
        !self.corrupted && !self.misdirected
    }
}

/// A packet on its way, ordered by arrival.
#[derive(Debug)]
struct Flight {
    at: Instant,
    order: u64,
    packet: Carried,
}

impl PartialEq for Flight {
    fn eq(&self, other: &Flight) -> bool {
        (self.at, self.order) == (other.at, other.order)
    }
}

impl Eq for Flight {}

impl PartialOrd for Flight {
    fn partial_cmp(&self, other: &Flight) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Flight {
    fn cmp(&self, other: &Flight) -> Ordering {
        (self.at, self.order).cmp(&(other.at, other.order))
    }
}

/// The delays of a simulated network.
#[derive(Debug, Clone, PartialEq)]
pub struct NetConfig {
    /// Shortest datagram delay.
    pub delay_min: Duration,
    /// Longest datagram delay (before any holding back).
    pub delay_max: Duration,
    /// Shortest frame delay.
    pub frame_min: Duration,
    /// Longest frame delay: shorter than `delay_min`, so that frames
    /// overtake datagrams.
    pub frame_max: Duration,
}

/// What the network and its fault injector did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetStats {
    /// Packets handed to the network.
    pub sent: u64,
    /// Of those, frames.
    pub frames: u64,
    /// Packets handed to an endpoint.
    pub delivered: u64,
    /// Packets lost at random.
    pub lost: u64,
    /// Packets lost to a partition.
    pub partitioned: u64,
    /// Extra copies made.
    pub duplicated: u64,
    /// Packets held back so that later ones overtake them.
    pub reordered: u64,
    /// Packets with a flipped byte.
    pub corrupted: u64,
    /// Packets sent to another VI or host.
    pub misdirected: u64,
    /// Corrupted packets handed to an endpoint.
    pub corrupt_arrived: u64,
    /// Packets to or from a dead host that vanished.
    pub vanished: u64,
}

/// The network between the hosts: packets in flight, by arrival time.
#[derive(Debug)]
pub struct SimNet {
    start: Instant,
    /// Virtual time.
    pub now: Instant,
    config: NetConfig,
    queue: BinaryHeap<Reverse<Flight>>,
    order: u64,
    /// Latest arrival scheduled per (from, to, path), to keep each path in order.
    last_arrival: [[[Instant; 2]; MAX_HOSTS]; MAX_HOSTS],
    /// What happened to the packets.
    pub stats: NetStats,
}

impl SimNet {
    /// An empty network whose time starts now.
    pub fn new(config: NetConfig) -> SimNet {
        let start = Instant::now();
        SimNet {
            start,
            now: start,
            config,
            queue: BinaryHeap::new(),
            order: 0,
            last_arrival: [[[start; 2]; MAX_HOSTS]; MAX_HOSTS],
            stats: NetStats::default(),
        }
    }

    /// Virtual time since the start.
    pub fn elapsed(&self) -> Duration {
        self.now - self.start
    }

    /// Carries `packet` to its host after its path's delay; one `held_back`
    /// arrives that much later still, out of its path's order.
    pub fn carry(&mut self, rng: &mut SimRng, packet: Carried, held_back: Option<Duration>) {
        let (lo, hi) = match packet.path {
            Path::Datagram => (self.config.delay_min, self.config.delay_max),
            Path::Frame => (self.config.frame_min, self.config.frame_max),
        };
        let mut at = self.now + rng.duration(lo, hi);
        match held_back {
            Some(extra) => at += extra,
            None => {
                let last = &mut self.last_arrival[packet.from][packet.to][packet.path as usize];
                at = at.max(*last);
                *last = at;
            }
        }
        self.order += 1;
        self.queue.push(Reverse(Flight { at, order: self.order, packet }));
    }

    /// When the next packet arrives.
    pub fn next_arrival(&self) -> Option<Instant> {
        self.queue.peek().map(|f| f.0.at)
    }

    /// The next packet due by now, if any.
    pub fn pop_due(&mut self) -> Option<Carried> {
        if self.queue.peek().is_some_and(|f| f.0.at <= self.now) {
            self.queue.pop().map(|f| f.0.packet)
        } else {
            None
        }
    }

    /// Packets in flight, in no particular order.
    pub fn in_flight(&self) -> impl Iterator<Item = &Carried> {
        self.queue.iter().map(|f| &f.0.packet)
    }

    /// Removes every packet from or to `host` (it died); returns them.
    pub fn drop_host(&mut self, host: usize) -> Vec<Carried> {
        let (gone, kept): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.queue).into_iter().partition(|f| f.0.packet.from == host || f.0.packet.to == host);
        self.queue = kept.into_iter().collect();
        self.stats.vanished += gone.len() as u64;
        gone.into_iter().map(|f| f.0.packet).collect()
    }
}

/// A host pair cut off from each other for a while.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Partition {
    /// The two hosts.
    pub hosts: (usize, usize),
    /// Packets between them sent from this time on are lost...
    pub start: Duration,
    /// ...until this time.
    pub end: Duration,
}

impl Partition {
    /// Whether it separates `a` and `b`.
    pub fn between(&self, a: usize, b: usize) -> bool {
        self.hosts == (a, b) || self.hosts == (b, a)
    }

    /// Whether it lasts long enough to break the sessions across it.
    pub fn is_long(&self) -> bool {
        self.end - self.start >= LONG_PARTITION
    }
}

/// How the network misbehaves.
#[derive(Debug, Clone, PartialEq)]
pub struct Faults {
    /// Probability that a packet is lost.
    pub loss: f64,
    /// Probability that a packet arrives twice.
    pub duplicate: f64,
    /// Probability that a copy is held back so that later ones overtake it.
    pub reorder: f64,
    /// Probability that a copy gets a flipped byte.
    pub corrupt: f64,
    /// Probability that a copy goes to another VI of its host, or to
    /// another host.
    pub misdirect: f64,
    /// A host pair cut off for a while.
    pub partition: Option<Partition>,
}

/// The send side's faults, between the hosts and the network: as a
/// device wrapper, it sees each packet leave and decides what the network
/// makes of it.
#[derive(Debug, Clone)]
pub struct FaultInjector {
    faults: Faults,
    /// Each host's VI ids, for packets sent to another VI.
    vis: Vec<Vec<u32>>,
    /// Extra delay up to which a held-back packet waits.
    hold_max: Duration,
}

impl FaultInjector {
    /// An injector of `faults` between hosts whose VIs are `vis`.
    pub fn new(faults: Faults, vis: Vec<Vec<u32>>, net: &NetConfig) -> FaultInjector {
        FaultInjector { faults, vis, hold_max: net.delay_max * 2 + Duration::from_micros(500) }
    }

    /// Sends `out` from host `from` through the faults into `net`; returns
    /// the copies that are on their way (0 lost, 2 duplicated).
    pub fn send(&self, rng: &mut SimRng, net: &mut SimNet, from: usize, out: Outgoing) -> u64 {
        net.stats.sent += 1;
        if out.path == Path::Frame {
            net.stats.frames += 1;
        }
        let cut = self.faults.partition.is_some_and(|p| {
            let t = net.elapsed();
            p.between(from, out.to) && t >= p.start && t < p.end
        });
        if cut {
            net.stats.partitioned += 1;
            return 0;
        }
        if rng.chance(self.faults.loss) {
            net.stats.lost += 1;
            return 0;
        }
        let copies = if rng.chance(self.faults.duplicate) {
            net.stats.duplicated += 1;
            2
        } else {
            1
        };
        for _ in 0..copies {
            let mut packet = Carried {
                from,
                to: out.to,
                path: out.path,
                bytes: out.bytes.clone(),
                origin: out.origin,
                corrupted: false,
                misdirected: false,
            };
            if rng.chance(self.faults.misdirect) {
                net.stats.misdirected += 1;
                self.misdirect(rng, &mut packet);
            }
            if rng.chance(self.faults.corrupt) {
                net.stats.corrupted += 1;
                let i = rng.below(packet.bytes.len() as u64) as usize;
                packet.bytes[i] ^= rng.range(1, 255) as u8;
                packet.corrupted = true;
            }
            let held_back = rng.chance(self.faults.reorder).then(|| {
                net.stats.reordered += 1;
                rng.duration(Duration::from_micros(1), self.hold_max)
            });
            net.carry(rng, packet, held_back);
        }
        copies
    }

    /// Sends `packet` astray: to another VI of its host (with a checksum
    /// that fits, as a confused sender would) or, as it is, to another host.
    fn misdirect(&self, rng: &mut SimRng, packet: &mut Carried) {
        packet.misdirected = true;
        let hosts = self.vis.len();
        if rng.chance(0.5) {
            let others: Vec<usize> = (0..hosts).filter(|&h| h != packet.to).collect();
            packet.to = others[rng.below(others.len() as u64) as usize];
            return;
        }
        let Ok(mut header) = Header::parse(&Packet::new_unchecked(&packet.bytes[..])) else { return };
        let others: Vec<u32> = self.vis[packet.to].iter().copied().filter(|&v| v != header.dst_vi).collect();
        header.dst_vi = if others.is_empty() {
            // No other VI there: one nobody has, most likely.
            rng.range(1, 1 << 20) as u32
        } else {
            others[rng.below(others.len() as u64) as usize]
        };
        packet.bytes = via_wire::encode(&header, &packet.bytes[HEADER_LEN..]);
    }
}

/// What the datapath handed the endpoint, for checking its tally.
#[derive(Debug, Clone, Copy)]
struct Handed {
    corrupted: bool,
    frame: bool,
    /// The destination VI in the bytes (of an intact packet).
    dst_vi: u32,
    origin: Origin,
}

impl Handed {
    fn of(p: &Carried) -> Handed {
        let dst_vi = if p.corrupted { 0 } else { Packet::new_unchecked(&p.bytes[..]).dst_vi() };
        Handed { corrupted: p.corrupted, frame: p.path == Path::Frame, dst_vi, origin: p.origin }
    }
}

/// One host's datapath, receive side: the frames that arrived, the
/// datagrams of each peer that has a path of its own (a connected socket),
/// and the shared path where the others' datagrams wait (the unconnected
/// socket).
#[derive(Debug)]
pub struct SimDatapath {
    frames: VecDeque<Carried>,
    /// Datagrams per sending host, for those with a peer path.
    peers: Vec<VecDeque<Carried>>,
    shared: VecDeque<Carried>,
    /// Which hosts' datagrams have a path of their own.
    peer_path: Vec<bool>,
    /// Datagrams one read of one path takes at most (as `recvmmsg`'s vlen).
    batch: usize,
    /// What the reads handed to the endpoint since the last look.
    handed: Vec<Handed>,
}

impl SimDatapath {
    /// A datapath with a path of its own for the datagrams of each host
    /// `peer_path` marks (by host index), reading up to `batch` datagrams
    /// of a path at once.
    pub fn new(peer_path: Vec<bool>, batch: usize) -> SimDatapath {
        SimDatapath {
            frames: VecDeque::new(),
            peers: vec![VecDeque::new(); peer_path.len()],
            shared: VecDeque::new(),
            peer_path,
            batch: batch.max(1),
            handed: Vec::new(),
        }
    }

    /// A packet arrived from the network.
    pub fn arrive(&mut self, packet: Carried) {
        match packet.path {
            Path::Frame => self.frames.push_back(packet),
            Path::Datagram if self.peer_path[packet.from] => self.peers[packet.from].push_back(packet),
            Path::Datagram => self.shared.push_back(packet),
        }
    }

    /// Whether nothing waits to be read.
    pub fn is_empty(&self) -> bool {
        self.frames.is_empty() && self.shared.is_empty() && self.peers.iter().all(VecDeque::is_empty)
    }

    /// Packets waiting to be read.
    pub fn waiting(&self) -> impl Iterator<Item = &Carried> {
        self.frames.iter().chain(self.peers.iter().flatten()).chain(self.shared.iter())
    }

    /// Drops everything waiting (the host died); returns it.
    fn clear(&mut self) -> Vec<Carried> {
        let mut gone: Vec<Carried> = self.frames.drain(..).collect();
        for q in &mut self.peers {
            gone.extend(q.drain(..));
        }
        gone.extend(self.shared.drain(..));
        gone
    }

    fn take_handed(&mut self) -> Vec<Handed> {
        std::mem::take(&mut self.handed)
    }

    /// Hands up to a batch of `queue`'s datagrams to the endpoint.
    fn read_batch(
        queue: &mut VecDeque<Carried>,
        batch: usize,
        handed: &mut Vec<Handed>,
        inbox: &mut Inbox<'_>,
    ) -> bool {
        let n = queue.len().min(batch);
        if n == 0 {
            return false;
        }
        let taken: Vec<Carried> = queue.drain(..n).collect();
        handed.extend(taken.iter().map(Handed::of));
        inbox.datagrams(taken.iter().map(|p| &p.bytes[..]));
        true
    }
}

impl Datapath for SimDatapath {
    fn takes_frames(&self) -> bool {
        true
    }

    fn has_peer_paths(&self) -> bool {
        true
    }

    fn read_frames(&mut self, inbox: &mut Inbox<'_>) -> bool {
        let any = !self.frames.is_empty();
        while let Some(p) = self.frames.pop_front() {
            self.handed.push(Handed::of(&p));
            inbox.frame(&p.bytes);
        }
        any
    }

    fn read_peers(&mut self, inbox: &mut Inbox<'_>) -> bool {
        let mut any = false;
        for queue in &mut self.peers {
            any |= SimDatapath::read_batch(queue, self.batch, &mut self.handed, inbox);
        }
        any
    }

    fn read_shared(&mut self, inbox: &mut Inbox<'_>) -> bool {
        SimDatapath::read_batch(&mut self.shared, self.batch, &mut self.handed, inbox)
    }
}

/// What a host's VIs tell the checker, in the order it happened.
#[derive(Debug)]
enum Note {
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
struct HostOut {
    send: SendSide,
    notes: Vec<Note>,
}

impl HostOut {
    fn violation(&mut self, v: String) {
        self.notes.push(Note::Violation(v));
    }
}

/// One end of a connection on its host: what the provider's VI keeps for
/// the network.
#[derive(Debug)]
struct Link {
    conn: usize,
    side: usize,
    peer_host: usize,
    local: Peer,
    remote: Peer,
    session: Session,
    frames: FrameChoice,
    /// The peer is on this host's link: packets may go as frames.
    frames_on: bool,
    /// Longest packet a frame carries.
    max_frame: usize,
    /// Bytes of the messages being sent, by token, until `Sent`.
    payloads: HashMap<u64, Vec<u8>>,
    next_token: u64,
    /// One past the sequence number of the last segment placed: no packet
    /// may acknowledge beyond it.
    placed_next: u32,
    /// Acknowledgements the session accepted from its peer: every sequence
    /// number below this arrived.
    acked_below: u32,
}

impl Link {
    fn reliable(&self) -> bool {
        self.session.config().reliable
    }

    fn origin(&self, header: &Header) -> Origin {
        let seq = header.kind.is_sequenced().then_some(header.seq);
        Origin { conn: self.conn, side: self.side, kind: header.kind, seq }
    }

    /// Queues a message and sends what it can, as an application's post
    /// does.
    fn send_message(
        &mut self,
        now: Instant,
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

    /// Runs the session's timers if due, and sends what they call for.
    fn run_timers(&mut self, now: Instant, out: &mut HostOut) {
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
        now: Instant,
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
    fn send_owed_ack(&mut self, now: Instant, app_away: bool, out: &mut HostOut) -> bool {
        if !self.session.ready_idle_ack(app_away) {
            return false;
        }
        let sent = self.session.stats().packets_sent;
        self.flush_and_apply(now, false, out);
        self.session.stats().packets_sent > sent
    }

    /// Hands one packet to the session; a packet not meant for this
    /// connection must be refused by the key check and give nothing.
    fn take_packet(&mut self, now: Instant, h: &Header, payload: &[u8], pending: &mut Vec<Event>, out: &mut HostOut) {
        let meant = h.key == self.local.key && h.src_vi == self.remote.vi && h.dst_vi == self.local.vi;
        let before = self.session.stats();
        let was_closed = self.session.is_closed();
        let queued = pending.len();
        if let Some(segment) = self.session.handle_packet_in_place(now, h, payload) {
            pending.push(segment.with_data(payload.to_vec()));
        }
        self.take_events(pending, out);
        if !meant {
            self.check_refused(h, before, was_closed, &pending[queued..], out);
            return;
        }
        if self.reliable() && self.session.stats().packets_received > before.packets_received {
            self.acked_below = self.acked_below.max(h.ack);
        }
    }

    /// A misdirected packet `h` gave `events`: there must be no data among
    /// them, and the key check must have counted it.
    fn check_refused(&self, h: &Header, before: Stats, was_closed: bool, events: &[Event], out: &mut HostOut) {
        let who = format!("conn {} side {} (VI {})", self.conn, self.side, self.local.vi);
        if events.iter().any(|e| matches!(e, Event::Segment { .. })) {
            out.violation(format!("{who}: a misdirected {} packet seq {} yielded data", h.kind, h.seq));
        }
        let refused = self.session.stats().bad_key - before.bad_key;
        if !was_closed && refused != 1 {
            out.violation(format!("{who}: a misdirected {} packet passed the key check", h.kind));
        }
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

    fn flush_and_apply(&mut self, now: Instant, busy: bool, out: &mut HostOut) {
        let mut events = Vec::new();
        self.flush(now, busy, &mut events, out);
        self.apply(events, out);
    }

    /// Sends everything the session has to send, as `NetState::flush_with`
    /// does: the one fresh packet of a flush may go as a frame, if it is
    /// the only one in flight.  `busy`: more input is coming, an owed
    /// acknowledgement may wait.
    fn flush(&mut self, now: Instant, busy: bool, events: &mut Vec<Event>, out: &mut HostOut) {
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
    now: Instant,
    links: Vec<Link>,
    out: HostOut,
    /// Acknowledgements sent because the endpoint said they were owed.
    owed_acks: u64,
}

impl HostVis {
    fn index(&self, vi: u32) -> Option<usize> {
        self.links.iter().position(|l| l.local.vi == vi)
    }

    /// Whether the host has VI `vi`.
    pub fn has(&self, vi: u32) -> bool {
        self.index(vi).is_some()
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
struct Host {
    endpoint: Endpoint,
    datapath: SimDatapath,
    vis: HostVis,
    alive: bool,
    /// When it polls next (packets arrived).
    wake: Option<Instant>,
}

/// A message as its sender sent it.
#[derive(Debug, Clone)]
struct SentMsg {
    kind: MsgKind,
    imm: Option<u32>,
    data: Vec<u8>,
}

/// A scripted send: when, what kind, immediate data, bytes.
pub type Planned = (Duration, MsgKind, Option<u32>, Vec<u8>);

/// One connection of a case.
#[derive(Debug, Clone)]
pub struct ConnSpec {
    /// Each end: its host and identity.
    pub ends: [(usize, Peer); 2],
    /// Reliable or unreliable sessions.
    pub reliable: bool,
    /// The hosts share a link: packets may go as frames.
    pub frames: bool,
    /// What each end sends, in time order.
    pub plan: [Vec<Planned>; 2],
}

/// What the checker knows of one connection: what each end sent and what
/// the other placed.
#[derive(Debug)]
struct ConnCheck {
    hosts: [usize; 2],
    reliable: bool,
    plan: [VecDeque<Planned>; 2],
    /// Messages each end sent, by message number - 1.
    log: [Vec<SentMsg>; 2],
    /// The message each end is receiving: its number and bytes so far.
    partial: [(u32, Vec<u8>); 2],
    /// Messages each end received whole.
    delivered: [usize; 2],
    /// Newest message number each end received (unreliable).
    last_unreliable: [u32; 2],
    /// `Sent` events each end reported.
    completions: [usize; 2],
    broken: [Option<BreakReason>; 2],
    /// Message packets of this connection in the network or unread.
    in_transit: u64,
    completed: bool,
}

impl ConnCheck {
    fn new(spec: &ConnSpec) -> ConnCheck {
        ConnCheck {
            hosts: [spec.ends[0].0, spec.ends[1].0],
            reliable: spec.reliable,
            plan: [spec.plan[0].iter().cloned().collect(), spec.plan[1].iter().cloned().collect()],
            log: Default::default(),
            partial: Default::default(),
            delivered: [0; 2],
            last_unreliable: [0; 2],
            completions: [0; 2],
            broken: [None; 2],
            in_transit: 0,
            completed: false,
        }
    }

    /// End `side` placed `segment`, checked against what the other end sent.
    fn placed(&mut self, conn: usize, side: usize, s: Segment, data: Vec<u8>, violations: &mut Vec<String>) {
        let who = format!("conn {conn} side {side}");
        let Some(sent) = self.log[1 - side].get(s.msg.wrapping_sub(1) as usize).cloned() else {
            violations.push(format!("{who}: got message {} that was never sent", s.msg));
            return;
        };
        if s.kind != sent.kind || s.imm != sent.imm || s.total as usize != sent.data.len() {
            violations.push(format!(
                "{who}: message {} is {:?}/{:?}/{}, sent as {:?}/{:?}/{}",
                s.msg,
                s.kind,
                s.imm,
                s.total,
                sent.kind,
                sent.imm,
                sent.data.len()
            ));
        }
        if self.reliable {
            self.placed_reliable(&who, side, s, data, &sent.data, violations);
        } else {
            self.placed_unreliable(&who, side, s, data, &sent.data, violations);
        }
    }

    fn placed_reliable(&mut self, who: &str, side: usize, s: Segment, data: Vec<u8>, sent: &[u8], v: &mut Vec<String>) {
        let expect = self.delivered[side] as u32 + 1;
        if s.msg != expect {
            v.push(format!("{who}: got message {}, expected {expect}", s.msg));
            return;
        }
        let (msg, bytes) = &mut self.partial[side];
        if s.first != (*msg != s.msg) || s.offset as usize != bytes.len() {
            v.push(format!(
                "{who}: message {}: segment at {} (first={}) after {} bytes",
                s.msg,
                s.offset,
                s.first,
                bytes.len()
            ));
        }
        if s.first {
            *msg = s.msg;
            bytes.clear();
        }
        bytes.extend_from_slice(&data);
        if s.last {
            if bytes[..] != sent[..] {
                v.push(format!("{who}: message {}: content differs", s.msg));
            }
            *msg = 0;
            bytes.clear();
            self.delivered[side] += 1;
        }
    }

    fn placed_unreliable(
        &mut self,
        who: &str,
        side: usize,
        s: Segment,
        data: Vec<u8>,
        sent: &[u8],
        v: &mut Vec<String>,
    ) {
        if !(s.first && s.last && s.offset == 0) {
            v.push(format!("{who}: partial unreliable message {}", s.msg));
        }
        if s.msg <= self.last_unreliable[side] {
            v.push(format!("{who}: message {} after {} (duplicate or reordered)", s.msg, self.last_unreliable[side]));
        }
        self.last_unreliable[side] = s.msg;
        if data != sent {
            v.push(format!("{who}: message {}: content differs", s.msg));
        }
        self.delivered[side] += 1;
    }

    /// End `side` completed its next send: never before the peer has the
    /// whole message (reliable).
    fn sent(&mut self, conn: usize, side: usize, violations: &mut Vec<String>) {
        let k = self.completions[side];
        self.completions[side] += 1;
        if k >= self.log[side].len() {
            violations.push(format!("conn {conn} side {side}: Sent without a message"));
        }
        if self.reliable && self.delivered[1 - side] < k + 1 {
            violations.push(format!("conn {conn} side {side}: message {} completed before the peer placed it", k + 1));
        }
    }

    fn broke(&mut self, conn: usize, side: usize, reason: BreakReason, violations: &mut Vec<String>) {
        if self.broken[side].is_some() {
            violations.push(format!("conn {conn} side {side}: broken twice"));
        }
        self.broken[side] = Some(reason);
    }

    /// Every message sent, completed and (reliable) delivered both ways;
    /// unreliable: nothing of it left on the way.
    fn is_complete(&self) -> bool {
        (0..2).all(|s| {
            self.plan[s].is_empty()
                && self.completions[s] == self.log[s].len()
                && (!self.reliable || self.delivered[1 - s] == self.log[s].len())
        }) && (self.reliable || self.in_transit == 0)
    }
}

/// A whole case, drawn from a seed.
#[derive(Debug, Clone)]
pub struct Case {
    /// The seed it came from (and the run's randomness comes from).
    pub seed: u64,
    /// Hosts.
    pub hosts: usize,
    /// Delays.
    pub net: NetConfig,
    /// Faults.
    pub faults: Faults,
    /// The sessions' configuration (`reliable` is per connection).
    pub session: Config,
    /// Connections.
    pub conns: Vec<ConnSpec>,
    /// A host that dies, and when.
    pub death: Option<(usize, Duration)>,
    /// Probability that a poll reads everything, for an application that
    /// is away.
    pub away: f64,
    /// Longest time a host takes to poll after packets arrive (packets
    /// that arrive meanwhile are read together).
    pub poll_lag: Duration,
    /// Per host: which hosts' datagrams have a path of their own.
    pub peer_paths: Vec<Vec<bool>>,
    /// Per host: datagrams one read takes at most.
    pub batch: Vec<usize>,
    /// Longest packet a frame carries.
    pub max_frame: usize,
}

impl Case {
    /// A case drawn from `seed`.
    pub fn random(seed: u64) -> Case {
        let mut r = SimRng::new(seed ^ 0x0E7_5EED_C0FF_EE00);
        let hosts = r.range(2, MAX_HOSTS as u64) as usize;
        let max_payload = pick(&mut r, &[64, 256, 1024, 1372]);
        let session = Config {
            max_payload,
            window: pick(&mut r, &[1, 4, 16, 64]),
            ack_every: r.range(1, 4) as u32,
            rto_max: Duration::from_millis(100),
            // Enough for 10% loss and 5% corruption and a short partition;
            // a dead peer still breaks the session within about 2 s.
            max_retransmits: 20,
            keepalive: Duration::from_millis(250),
            idle_timeout: Duration::from_secs(2),
            ..Config::default()
        };
        let net = random_net(&mut r);
        let faults = random_faults(&mut r, hosts);
        let conns = random_conns(&mut r, hosts, max_payload);
        let death = r.chance(0.2).then(|| (r.below(hosts as u64) as usize, Duration::from_micros(r.range(0, 400_000))));
        Case {
            seed,
            hosts,
            net,
            faults,
            session,
            conns,
            death,
            away: pick(&mut r, &[0.0, 0.2, 0.8, 1.0]),
            poll_lag: Duration::from_micros(pick(&mut r, &[0, 5, 50])),
            peer_paths: (0..hosts).map(|_| (0..hosts).map(|_| r.chance(0.7)).collect()).collect(),
            batch: (0..hosts).map(|_| pick(&mut r, &[1, 4, 32])).collect(),
            max_frame: pick(&mut r, &[600, 1500]),
        }
    }

    /// The partition, if it separates the ends of `conn` long enough to
    /// break it.
    fn long_partition(&self, conn: &ConnSpec) -> bool {
        self.faults.partition.is_some_and(|p| p.is_long() && p.between(conn.ends[0].0, conn.ends[1].0))
    }
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let conns: Vec<String> = self
            .conns
            .iter()
            .map(|c| {
                format!(
                    "{}:{}<->{}:{}{}{} msgs {}/{}",
                    c.ends[0].0,
                    c.ends[0].1.vi,
                    c.ends[1].0,
                    c.ends[1].1.vi,
                    if c.reliable { "" } else { " unreliable" },
                    if c.frames { " frames" } else { "" },
                    c.plan[0].len(),
                    c.plan[1].len()
                )
            })
            .collect();
        write!(
            f,
            "{} hosts, conns [{}], payload {} window {} ack_every {}, {:?}, {:?}, death {:?}, away {}, lag {:?}, \
             batch {:?}, peer paths {:?}, max frame {}",
            self.hosts,
            conns.join(", "),
            self.session.max_payload,
            self.session.window,
            self.session.ack_every,
            self.net,
            self.faults,
            self.death,
            self.away,
            self.poll_lag,
            self.batch,
            self.peer_paths,
            self.max_frame
        )
    }
}

fn pick<T: Copy>(r: &mut SimRng, xs: &[T]) -> T {
    xs[r.below(xs.len() as u64) as usize]
}

fn random_net(r: &mut SimRng) -> NetConfig {
    let delay_min = Duration::from_micros(r.range(4, 500));
    let delay_max = delay_min + Duration::from_micros(r.range(0, 5000));
    let frame_max = (delay_min / 2).max(Duration::from_micros(2));
    NetConfig { delay_min, delay_max, frame_min: (delay_min / 8).max(Duration::from_micros(1)), frame_max }
}

fn random_faults(r: &mut SimRng, hosts: usize) -> Faults {
    if r.chance(0.15) {
        return Faults { loss: 0.0, duplicate: 0.0, reorder: 0.0, corrupt: 0.0, misdirect: 0.0, partition: None };
    }
    let partition = r.chance(0.15).then(|| {
        let a = r.below(hosts as u64) as usize;
        let b = (a + 1 + r.below(hosts as u64 - 1) as usize) % hosts;
        let start = Duration::from_millis(r.range(0, 300));
        let len = if r.chance(0.5) {
            Duration::from_millis(r.range(10, 150))
        } else {
            Duration::from_millis(r.range(4000, 6000))
        };
        Partition { hosts: (a, b), start, end: start + len }
    });
    Faults {
        loss: pick(r, &[0.0, 0.01, 0.05, 0.1]),
        duplicate: pick(r, &[0.0, 0.02, 0.1]),
        reorder: pick(r, &[0.0, 0.05, 0.2]),
        corrupt: pick(r, &[0.0, 0.01, 0.05]),
        misdirect: pick(r, &[0.0, 0.01, 0.05]),
        partition,
    }
}

/// Connections between random (host, VI) pairs: VI ids from a small range,
/// unique per host, so that a packet sent to the wrong host may find a VI
/// of that id there.
fn random_conns(r: &mut SimRng, hosts: usize, max_payload: usize) -> Vec<ConnSpec> {
    let mut used: Vec<Vec<u32>> = vec![Vec::new(); hosts];
    let n = r.range(1, 6) as usize;
    let mut conns = Vec::with_capacity(n);
    for _ in 0..n {
        let a = r.below(hosts as u64) as usize;
        let b = (a + 1 + r.below(hosts as u64 - 1) as usize) % hosts;
        let ends = [(a, random_peer(r, &mut used[a])), (b, random_peer(r, &mut used[b]))];
        let reliable = r.chance(0.85);
        let frames = reliable && r.chance(0.7);
        let spread = Duration::from_millis(r.range(0, 150));
        let plan = [random_plan(r, max_payload, spread), random_plan(r, max_payload, spread)];
        conns.push(ConnSpec { ends, reliable, frames, plan });
    }
    conns
}

fn random_peer(r: &mut SimRng, used: &mut Vec<u32>) -> Peer {
    let vi = loop {
        let vi = r.range(1, 16) as u32;
        if !used.contains(&vi) {
            break vi;
        }
    };
    used.push(vi);
    Peer { vi, key: r.next_u64() }
}

/// Messages of up to three packets and a bit, sends and RDMA writes, some
/// with immediate data, spread over `spread`.
fn random_plan(r: &mut SimRng, max_payload: usize, spread: Duration) -> Vec<Planned> {
    let max_len = 3 * max_payload as u64 + 7;
    let mut times: Vec<Duration> = (0..r.range(0, 24)).map(|_| r.duration(Duration::ZERO, spread)).collect();
    times.sort();
    times
        .into_iter()
        .map(|t| {
            let len = r.below(max_len + 1) as usize;
            let data = r.bytes(len);
            let imm = r.chance(0.3).then(|| r.next_u64() as u32);
            let kind = if r.chance(0.5) {
                MsgKind::Send
            } else {
                MsgKind::RdmaWrite { addr: r.next_u64(), handle: r.next_u64() as u32 }
            };
            (t, kind, imm, data)
        })
        .collect()
}

/// What happened in a [`run`].
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The case's seed.
    pub seed: u64,
    /// The case, in short.
    pub case: String,
    /// Connections.
    pub connections: usize,
    /// Connections that completed.
    pub completed: usize,
    /// Connections with a broken end and not completed.
    pub broken: usize,
    /// The host that died, if one did.
    pub died: Option<usize>,
    /// Messages sent, and received whole, over all connections.
    pub messages: (usize, usize),
    /// Virtual time the run took.
    pub elapsed: Duration,
    /// Time ran out with a connection unresolved.
    pub stalled: bool,
    /// What the network did.
    pub net: NetStats,
    /// What the endpoints counted, summed.
    pub tally: Tally,
    /// Misdirected packets the sessions' key checks refused.
    pub bad_key: u64,
    /// Retransmissions, over all sessions.
    pub retransmits: u64,
    /// Acknowledgements held back while packets came, sent once a poll
    /// found the datapath empty.
    pub owed_acks: u64,
    /// Every broken rule.
    pub violations: Vec<String>,
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "seed {}: {}/{} connections completed, {} broken, died={:?}, messages {}/{}, elapsed={:?}, \
             stalled={}, bad_key={}, retransmits={}, owed_acks={}\n  case: {}\n  net: {:?}\n  tally: {:?}\n  violations: {:#?}",
            self.seed,
            self.completed,
            self.connections,
            self.broken,
            self.died,
            self.messages.1,
            self.messages.0,
            self.elapsed,
            self.stalled,
            self.bad_key,
            self.retransmits,
            self.owed_acks,
            self.case,
            self.net,
            self.tally,
            self.violations
        )
    }
}

/// The hosts, the network between them and the checker.
#[derive(Debug)]
pub struct NetSim {
    case: Case,
    rng: SimRng,
    net: SimNet,
    injector: FaultInjector,
    hosts: Vec<Host>,
    conns: Vec<ConnCheck>,
    died: Option<usize>,
    tally: Tally,
    violations: Vec<String>,
}

impl NetSim {
    /// The hosts and connections of `case`, connected at the start.
    pub fn new(case: Case) -> NetSim {
        let net = SimNet::new(case.net.clone());
        let mut hosts: Vec<Host> = (0..case.hosts)
            .map(|h| Host {
                endpoint: Endpoint::new(case.session.max_payload),
                datapath: SimDatapath::new(case.peer_paths[h].clone(), case.batch[h]),
                vis: HostVis { now: net.now, links: Vec::new(), out: HostOut::default(), owed_acks: 0 },
                alive: true,
                wake: None,
            })
            .collect();
        for (conn, spec) in case.conns.iter().enumerate() {
            for side in 0..2 {
                let ((host, local), (peer_host, remote)) = (spec.ends[side], spec.ends[1 - side]);
                let config = Config { reliable: spec.reliable, ..case.session.clone() };
                hosts[host].vis.links.push(Link {
                    conn,
                    side,
                    peer_host,
                    local,
                    remote,
                    session: Session::new(config, local, remote, net.now),
                    frames: FrameChoice::default(),
                    frames_on: spec.frames,
                    max_frame: case.max_frame,
                    payloads: HashMap::new(),
                    next_token: 1,
                    placed_next: 1,
                    acked_below: 1,
                });
            }
        }
        let vis = hosts.iter().map(|h| h.vis.links.iter().map(|l| l.local.vi).collect()).collect();
        NetSim {
            rng: SimRng::new(case.seed),
            injector: FaultInjector::new(case.faults.clone(), vis, &case.net),
            conns: case.conns.iter().map(ConnCheck::new).collect(),
            net,
            hosts,
            died: None,
            tally: Tally::default(),
            violations: Vec::new(),
            case,
        }
    }

    /// Runs the case to its end and judges it.
    pub fn run(mut self) -> Outcome {
        let limit = self.net.now + TIME_LIMIT;
        let mut same_instant = 0u32;
        let mut stalled = false;
        loop {
            self.step();
            if self.all_resolved() {
                break;
            }
            let Some(next) = self.next_time() else {
                self.violations.push("nothing left to happen, yet connections are unresolved".to_string());
                break;
            };
            if next > limit {
                stalled = true;
                break;
            }
            if next <= self.net.now {
                same_instant += 1;
                if same_instant > 100_000 {
                    self.violations.push("time does not advance: something keeps happening at once".to_string());
                    stalled = true;
                    break;
                }
            } else {
                same_instant = 0;
            }
            self.net.now = self.net.now.max(next);
        }
        self.judge(stalled);
        self.outcome(stalled)
    }

    /// Runs everything due now: arrivals, the death, sends, timers, polls.
    fn step(&mut self) {
        self.land_arrivals();
        if let Some((host, at)) = self.case.death {
            if self.died.is_none() && self.net.elapsed() >= at {
                self.kill(host);
            }
        }
        self.send_planned();
        self.run_timers();
        for h in 0..self.hosts.len() {
            if self.hosts[h].alive && self.hosts[h].wake.is_some_and(|t| t <= self.net.now) {
                self.hosts[h].wake = None;
                self.poll_host(h);
            }
        }
    }

    /// Moves the packets that arrived to their hosts' datapaths, and has
    /// each host poll within its lag.
    fn land_arrivals(&mut self) {
        while let Some(p) = self.net.pop_due() {
            let host = &mut self.hosts[p.to];
            if !host.alive {
                self.net.stats.vanished += 1;
                self.left_transit(&p.origin);
                continue;
            }
            host.datapath.arrive(p);
            let at = self.net.now + self.rng.duration(Duration::ZERO, self.case.poll_lag);
            host.wake = Some(host.wake.map_or(at, |w| w.min(at)));
        }
    }

    /// A message packet of `origin`'s connection left the network.
    fn left_transit(&mut self, origin: &Origin) {
        if origin.kind.is_message() {
            self.conns[origin.conn].in_transit -= 1;
        }
    }

    /// Host `h` dies: it polls, times and sends nothing more, and its
    /// packets vanish.
    fn kill(&mut self, h: usize) {
        self.died = Some(h);
        let host = &mut self.hosts[h];
        host.alive = false;
        host.wake = None;
        host.vis.out = HostOut::default();
        let mut gone = host.datapath.clear();
        self.net.stats.vanished += gone.len() as u64;
        gone.extend(self.net.drop_host(h));
        for p in gone {
            self.left_transit(&p.origin);
        }
    }

    /// The scripted sends that are due, on live hosts.
    fn send_planned(&mut self) {
        let elapsed = self.net.elapsed();
        for conn in 0..self.conns.len() {
            for side in 0..2 {
                let host = self.conns[conn].hosts[side];
                if !self.hosts[host].alive {
                    continue;
                }
                while self.conns[conn].plan[side].front().is_some_and(|p| p.0 <= elapsed) {
                    let planned = self.conns[conn].plan[side].pop_front().expect("checked");
                    self.send_message(conn, side, planned);
                }
            }
        }
    }

    fn send_message(&mut self, conn: usize, side: usize, (_, kind, imm, data): Planned) {
        let host = self.conns[conn].hosts[side];
        let sent = SentMsg { kind, imm, data: data.clone() };
        let now = self.net.now;
        let vis = &mut self.hosts[host].vis;
        vis.now = now;
        let i = vis.links.iter().position(|l| l.conn == conn && l.side == side).expect("the end is on its host");
        let result = vis.links[i].send_message(now, kind, imm, data, &mut vis.out);
        match result {
            Ok(n) => {
                let check = &mut self.conns[conn];
                if n as usize != check.log[side].len() + 1 {
                    self.violations.push(format!("conn {conn} side {side}: message number {n} out of sequence"));
                }
                check.log[side].push(sent);
            }
            Err(SendError::Closed) => {}
            Err(e) => self.violations.push(format!("conn {conn} side {side}: send refused: {e}")),
        }
        self.settle(host);
    }

    /// The sessions' timers that are due, on live hosts.
    fn run_timers(&mut self) {
        let now = self.net.now;
        for h in 0..self.hosts.len() {
            if !self.hosts[h].alive {
                continue;
            }
            let vis = &mut self.hosts[h].vis;
            vis.now = now;
            for link in &mut vis.links {
                link.run_timers(now, &mut vis.out);
            }
            self.settle(h);
        }
    }

    /// Host `h` polls until a poll finds nothing and nothing waits; a few
    /// more empty polls now and then age its read schedule as a polling
    /// application would.
    fn poll_host(&mut self, h: usize) {
        self.hosts[h].vis.now = self.net.now;
        let mut idle_polls = 0;
        let extra = self.rng.below(3);
        for _ in 0..MAX_POLLS {
            let everything = self.rng.chance(self.case.away);
            let host = &mut self.hosts[h];
            let busy = host.endpoint.poll(&mut host.datapath, &mut host.vis, everything);
            self.check_tally(h);
            self.settle(h);
            if busy {
                continue;
            }
            self.check_nothing_owed(h);
            if self.hosts[h].datapath.is_empty() {
                if idle_polls >= extra {
                    return;
                }
                idle_polls += 1;
            }
        }
        self.violations.push(format!("host {h}: {MAX_POLLS} polls never found the datapath idle"));
    }

    /// The endpoint counted what its datapath handed it: packets for its
    /// VIs, frames, malformed ones (every corrupted copy: the checksum
    /// covers every byte), and packets for VIs it does not have.
    fn check_tally(&mut self, h: usize) {
        let host = &mut self.hosts[h];
        let handed = host.datapath.take_handed();
        let got = host.endpoint.take_tally();
        let mut want = Tally::default();
        for p in &handed {
            if p.corrupted {
                want.malformed += 1;
                continue;
            }
            want.frames += p.frame as u64;
            if host.vis.has(p.dst_vi) {
                want.packets += 1;
            } else {
                want.unknown_vi += 1;
            }
        }
        if got != want {
            self.violations.push(format!("host {h}: the endpoint counted {got:?} of what came, not {want:?}"));
        }
        self.net.stats.delivered += handed.len() as u64;
        self.net.stats.corrupt_arrived += want.malformed;
        for p in &handed {
            self.left_transit(&p.origin);
        }
        self.tally.packets += got.packets;
        self.tally.frames += got.frames;
        self.tally.malformed += got.malformed;
        self.tally.unknown_vi += got.unknown_vi;
    }

    /// After a poll that found nothing, the endpoint has had every VI that
    /// held back an acknowledgement send it.
    fn check_nothing_owed(&mut self, h: usize) {
        let host = &self.hosts[h];
        if !host.endpoint.owed().is_empty() {
            self.violations.push(format!("host {h}: VIs {:?} still owed after an idle poll", host.endpoint.owed()));
        }
        for l in host.vis.links.iter().filter(|l| l.session.ack_owed()) {
            self.violations.push(format!(
                "host {h}: conn {} side {} owes an acknowledgement after an idle poll (at {:?})",
                l.conn,
                l.side,
                self.net.elapsed()
            ));
        }
    }

    /// Takes what host `h` sent into the network, and what it reported to
    /// the checker.
    fn settle(&mut self, h: usize) {
        let out = std::mem::take(&mut self.hosts[h].vis.out);
        let HostOut { mut send, notes } = out;
        for packet in send.take() {
            if packet.path == Path::Frame {
                self.check_frame_is_oldest(&packet);
            }
            let origin = packet.origin;
            let copies = self.injector.send(&mut self.rng, &mut self.net, h, packet);
            if origin.kind.is_message() {
                self.conns[origin.conn].in_transit += copies;
            }
        }
        for note in notes {
            self.note(note);
        }
    }

    fn note(&mut self, note: Note) {
        let v = &mut self.violations;
        match note {
            Note::Placed { conn, side, segment, data } => self.conns[conn].placed(conn, side, segment, data, v),
            Note::Sent { conn, side } => self.conns[conn].sent(conn, side, v),
            Note::Broken { conn, side, reason } => self.conns[conn].broke(conn, side, reason, v),
            Note::Violation(s) => v.push(s),
        }
    }

    /// A sequenced packet that leaves as a frame is the oldest its session
    /// has in flight: no earlier datagram of that session, still
    /// unacknowledged, is in the network or unread at its peer.
    fn check_frame_is_oldest(&mut self, frame: &Outgoing) {
        let Some(seq) = frame.origin.seq else { return };
        let o = frame.origin;
        let earlier = |p: &&Carried| {
            p.path == Path::Datagram
                && p.intact_for_peer()
                && p.origin.conn == o.conn
                && p.origin.side == o.side
                && p.origin.seq.is_some_and(|s| s < seq && s >= frame.acked_below)
        };
        let overtaken = self.net.in_flight().chain(self.hosts[frame.to].datapath.waiting()).find(earlier);
        let Some(p) = overtaken else { return };
        self.violations.push(format!(
            "conn {} side {}: {} seq {seq} left as a frame ahead of the unacknowledged {} seq {:?} \
                 (acknowledged below {}) at {:?}",
            o.conn,
            o.side,
            o.kind,
            p.origin.kind,
            p.origin.seq,
            frame.acked_below,
            self.net.elapsed()
        ));
    }

    /// When something happens next: an arrival, a poll, the death, a
    /// scripted send or a timer.
    fn next_time(&self) -> Option<Instant> {
        let mut times: Vec<Instant> = Vec::new();
        times.extend(self.net.next_arrival());
        if let (Some((_, at)), None) = (self.case.death, self.died) {
            times.push(self.net.now + at.saturating_sub(self.net.elapsed()));
        }
        let start = self.net.now - self.net.elapsed();
        for c in &self.conns {
            for side in 0..2 {
                if self.hosts[c.hosts[side]].alive {
                    times.extend(c.plan[side].front().map(|p| start + p.0));
                }
            }
        }
        for host in self.hosts.iter().filter(|h| h.alive) {
            times.extend(host.wake);
            times.extend(host.vis.links.iter().filter_map(|l| l.session.poll_timeout()));
        }
        times.into_iter().min()
    }

    /// Whether every connection is done with: completed, or broken where
    /// it may break, and the death (if any) has happened.
    fn all_resolved(&mut self) -> bool {
        for c in &mut self.conns {
            if !c.completed && c.is_complete() && c.broken.iter().all(Option::is_none) {
                c.completed = true;
            }
        }
        if self.case.death.is_some() && self.died.is_none() {
            return false;
        }
        self.conns.iter().all(|c| match self.dead_side(c) {
            Some(dead) => c.broken[1 - dead].is_some(),
            None => c.completed || c.broken.iter().all(Option::is_some),
        })
    }

    /// The end of `c` on the dead host, if one died.
    fn dead_side(&self, c: &ConnCheck) -> Option<usize> {
        self.died.and_then(|d| c.hosts.iter().position(|&h| h == d))
    }

    /// The verdict on each connection at the end.
    fn judge(&mut self, stalled: bool) {
        for (i, (c, spec)) in self.conns.iter().zip(&self.case.conns).enumerate() {
            let long_partition = self.case.long_partition(spec);
            let verdict = match self.dead_side(c) {
                Some(dead) => match c.broken[1 - dead] {
                    None => Some("its peer died and it did not break".to_string()),
                    Some(BreakReason::Retransmits | BreakReason::Idle) => None,
                    Some(_) if long_partition => None,
                    Some(r) => Some(format!("its peer died and it broke with {r:?}")),
                },
                None if c.completed => None,
                None if c.broken.iter().any(Option::is_some) && !long_partition => {
                    Some(format!("broke ({:?}) with no long partition nor death", c.broken))
                }
                None if c.broken.iter().all(Option::is_some) => None,
                None => Some(format!("neither completed nor broken at both ends ({:?})", c.broken)),
            };
            if let Some(v) = verdict {
                let when = if stalled { " (stalled)" } else { "" };
                self.violations.push(format!("conn {i}{when}: {v}"));
            }
        }
    }

    fn outcome(self, stalled: bool) -> Outcome {
        let sessions = || self.hosts.iter().flat_map(|h| h.vis.links.iter().map(|l| l.session.stats()));
        let completed = self.conns.iter().filter(|c| c.completed).count();
        let broken = self.conns.iter().filter(|c| !c.completed && c.broken.iter().any(Option::is_some)).count();
        let sent = self.conns.iter().map(|c| c.log[0].len() + c.log[1].len()).sum();
        let delivered = self.conns.iter().map(|c| c.delivered[0] + c.delivered[1]).sum();
        Outcome {
            seed: self.case.seed,
            case: self.case.to_string(),
            connections: self.conns.len(),
            completed,
            broken,
            died: self.died,
            messages: (sent, delivered),
            elapsed: self.net.elapsed(),
            stalled,
            net: self.net.stats,
            tally: self.tally,
            bad_key: sessions().map(|s| s.bad_key).sum(),
            retransmits: sessions().map(|s| s.retransmits).sum(),
            owed_acks: self.hosts.iter().map(|h| h.vis.owed_acks).sum(),
            violations: self.violations,
        }
    }
}

/// Draws the case of `seed`, runs it and checks it.
pub fn run(seed: u64) -> Outcome {
    NetSim::new(Case::random(seed)).run()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_overtakes_datagrams_sent_before_it() {
        let config = NetConfig {
            delay_min: Duration::from_micros(100),
            delay_max: Duration::from_micros(100),
            frame_min: Duration::from_micros(10),
            frame_max: Duration::from_micros(10),
        };
        let mut net = SimNet::new(config);
        let mut rng = SimRng::new(1);
        let origin = Origin { conn: 0, side: 0, kind: Kind::Ack, seq: None };
        let packet = |path, bytes: u8| Carried {
            from: 0,
            to: 1,
            path,
            bytes: vec![bytes],
            origin,
            corrupted: false,
            misdirected: false,
        };
        net.carry(&mut rng, packet(Path::Datagram, 1), None);
        net.carry(&mut rng, packet(Path::Frame, 2), None);
        net.now += Duration::from_millis(1);
        let order: Vec<u8> = std::iter::from_fn(|| net.pop_due()).map(|p| p.bytes[0]).collect();
        assert_eq!(order, vec![2, 1]);
    }

    #[test]
    fn a_misdirected_packet_keeps_a_valid_checksum_or_goes_to_another_host() {
        let faults = Faults { loss: 0.0, duplicate: 0.0, reorder: 0.0, corrupt: 0.0, misdirect: 1.0, partition: None };
        let config = NetConfig {
            delay_min: Duration::from_micros(1),
            delay_max: Duration::from_micros(1),
            frame_min: Duration::from_micros(1),
            frame_max: Duration::from_micros(1),
        };
        let injector = FaultInjector::new(faults, vec![vec![1, 2], vec![3, 4]], &config);
        let mut net = SimNet::new(config);
        let mut rng = SimRng::new(3);
        let header = Header { kind: Kind::Ack, dst_vi: 3, src_vi: 1, key: 9, ..Header::default() };
        let origin = Origin { conn: 0, side: 0, kind: Kind::Ack, seq: None };
        for _ in 0..50 {
            let out =
                Outgoing { to: 1, path: Path::Datagram, bytes: via_wire::encode(&header, b""), origin, acked_below: 1 };
            injector.send(&mut rng, &mut net, 0, out);
        }
        net.now += Duration::from_millis(1);
        let (mut rewritten, mut astray) = (0, 0);
        while let Some(p) = net.pop_due() {
            assert!(p.misdirected);
            let h = Header::parse(&Packet::new_checked(&p.bytes[..]).expect("a valid checksum")).unwrap();
            if p.to == 1 {
                assert_eq!(h.dst_vi, 4, "another VI of the same host");
                rewritten += 1;
            } else {
                assert_eq!(h.dst_vi, 3);
                astray += 1;
            }
        }
        assert!(rewritten > 0 && astray > 0);
    }
}
