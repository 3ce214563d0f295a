//! The checker: what each connection sent and placed ([`ConnCheck`]), the
//! invariants checked as the run goes and at its end, and its [`Outcome`].

use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

use super::case::{ConnSpec, Planned};
use super::net::{Carried, NetStats, Outgoing, Path};
use super::NetSim;
use crate::endpoint::Tally;
use crate::{BreakReason, MsgKind, Segment};

/// A message as its sender sent it.
#[derive(Debug, Clone)]
pub(super) struct SentMsg {
    pub(super) kind: MsgKind,
    pub(super) imm: Option<u32>,
    pub(super) data: Vec<u8>,
}

/// How the simulator ended a connection whose VIs connect again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ending {
    /// End `by` disconnected: the other may yet break on the DISCONNECT,
    /// or when it hears nothing more.
    By(usize),
    /// Both ends disconnected: nothing more comes of it.
    Both,
}

/// What the checker knows of one connection: what each end sent and what
/// the other placed.
#[derive(Debug)]
pub(super) struct ConnCheck {
    pub(super) hosts: [usize; 2],
    reliable: bool,
    pub(super) plan: [VecDeque<Planned>; 2],
    /// Messages each end sent, by message number - 1.
    pub(super) log: [Vec<SentMsg>; 2],
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
    pub(super) in_transit: u64,
    /// Everything delivered (and, unless ended at its last placement,
    /// acknowledged).
    pub(super) completed: bool,
    /// Its sessions exist (a successor's, only once its predecessor ended).
    pub(super) started: bool,
    /// When a successor starts (time since the run's start), once known.
    pub(super) start_at: Option<Duration>,
    /// The simulator ended it, for a successor to reuse its VIs.
    pub(super) ended: Option<Ending>,
}

impl ConnCheck {
    pub(super) fn new(spec: &ConnSpec) -> ConnCheck {
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
            started: spec.after.is_none(),
            start_at: None,
            ended: None,
        }
    }

    /// Whether either end broke.
    pub(super) fn any_broken(&self) -> bool {
        self.broken.iter().any(Option::is_some)
    }

    /// Every message planned was sent and placed whole by the peer
    /// (reliable), acknowledged or not.
    pub(super) fn all_placed(&self) -> bool {
        (0..2).all(|s| self.plan[s].is_empty() && self.delivered[1 - s] == self.log[s].len())
    }

    /// Something of end `side` happened after the simulator ended the
    /// connection: no more data nor completions, and only the break that
    /// the peer's DISCONNECT (or silence) causes.
    fn after_end(&self, conn: usize, side: usize, what: &str, reason: Option<BreakReason>, v: &mut Vec<String>) {
        let Some(ending) = self.ended else { return };
        let expected = matches!((ending, reason), (Ending::By(by), Some(BreakReason::PeerDisconnect | BreakReason::Idle)) if by != side);
        if !expected {
            v.push(format!("conn {conn} side {side}: {what} after the connection ended ({ending:?})"));
        }
    }

    /// End `side` placed `segment`, checked against what the other end sent.
    pub(super) fn placed(&mut self, conn: usize, side: usize, s: Segment, data: Vec<u8>, violations: &mut Vec<String>) {
        let who = format!("conn {conn} side {side}");
        if self.ended.is_some() {
            self.after_end(conn, side, &format!("placed a segment of message {}", s.msg), None, violations);
            return;
        }
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
    pub(super) fn sent(&mut self, conn: usize, side: usize, violations: &mut Vec<String>) {
        self.after_end(conn, side, "completed a send", None, violations);
        let k = self.completions[side];
        self.completions[side] += 1;
        if k >= self.log[side].len() {
            violations.push(format!("conn {conn} side {side}: Sent without a message"));
        }
        if self.reliable && self.delivered[1 - side] < k + 1 {
            violations.push(format!("conn {conn} side {side}: message {} completed before the peer placed it", k + 1));
        }
    }

    pub(super) fn broke(&mut self, conn: usize, side: usize, reason: BreakReason, violations: &mut Vec<String>) {
        if self.broken[side].is_some() {
            violations.push(format!("conn {conn} side {side}: broken twice"));
        }
        self.after_end(conn, side, &format!("broke ({reason:?})"), Some(reason), violations);
        self.broken[side] = Some(reason);
    }

    /// Every message sent, completed and (reliable) delivered both ways;
    /// unreliable: nothing of it left on the way.
    pub(super) fn is_complete(&self) -> bool {
        (0..2).all(|s| {
            self.plan[s].is_empty()
                && self.completions[s] == self.log[s].len()
                && (!self.reliable || self.delivered[1 - s] == self.log[s].len())
        }) && (self.reliable || self.in_transit == 0)
    }
}

/// What happened in a [`run`](super::run).
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
    /// Connections that reused an earlier one's VIs and started, and of
    /// them, those that completed.
    pub successors: (usize, usize),
    /// Packets of an earlier connection that reached its successor's open
    /// sessions, and of them, those the key check refused without effect.
    pub stale: (u64, u64),
    /// Successors that took stale packets and still completed.
    pub stale_survived: usize,
    /// Every broken rule.
    pub violations: Vec<String>,
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "seed {}: {}/{} connections completed, {} broken, died={:?}, messages {}/{}, elapsed={:?}, \
             stalled={}, bad_key={}, retransmits={}, owed_acks={}, successors={:?}, stale={:?}\n  case: {}\n  \
             net: {:?}\n  tally: {:?}\n  violations: {:#?}",
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
            self.successors,
            self.stale,
            self.case,
            self.net,
            self.tally,
            self.violations
        )
    }
}

// The checks the run makes of the hosts and the network as it goes, and
// its verdict at the end.
impl NetSim {
    /// The endpoint counted what its datapath handed it: packets for its
    /// VIs, frames, malformed ones (every corrupted copy: the checksum
    /// covers every byte), and packets for VIs it does not have.
    pub(super) fn check_tally(&mut self, h: usize) {
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
        // Why the last malformed packet was refused is for the log only.
        let counted = Tally { last_malformed: None, ..got };
        if counted != want {
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
    pub(super) fn check_nothing_owed(&mut self, h: usize) {
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

    /// A sequenced packet that leaves as a frame is the oldest its session
    /// has in flight: no earlier datagram of that session, still
    /// unacknowledged, is in the network or unread at its peer.
    pub(super) fn check_frame_is_oldest(&mut self, frame: &Outgoing) {
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

    /// Whether every connection is done with: completed, or broken where
    /// it may break, and the death (if any) has happened.
    pub(super) fn all_resolved(&mut self) -> bool {
        for c in &mut self.conns {
            if c.started && !c.completed && c.is_complete() && !c.any_broken() {
                c.completed = true;
            }
        }
        if self.case.death.is_some() && self.died.is_none() {
            return false;
        }
        self.conns.iter().all(|c| match self.dead_side(c) {
            // A successor never starts once a host of it died.
            dead if !c.started => dead.is_some(),
            _ if c.ended.is_some() => true,
            Some(dead) => c.broken[1 - dead].is_some(),
            None => c.completed || c.broken.iter().all(Option::is_some),
        })
    }

    /// The end of `c` on the dead host, if one died.
    fn dead_side(&self, c: &ConnCheck) -> Option<usize> {
        self.died.and_then(|d| c.hosts.iter().position(|&h| h == d))
    }

    /// The verdict on each connection at the end.
    pub(super) fn judge(&mut self, stalled: bool) {
        for (i, (c, spec)) in self.conns.iter().zip(&self.case.conns).enumerate() {
            let long_partition = self.case.long_partition(spec);
            let verdict = match self.dead_side(c) {
                None if !c.started => Some("never started: the connection before it never ended".to_string()),
                Some(_) if !c.started => None,
                // Ended by the simulator: what came after is checked as it came.
                _ if c.ended.is_some() => None,
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

    pub(super) fn outcome(self, stalled: bool) -> Outcome {
        let links = || self.hosts.iter().flat_map(|h| h.vis.all_links());
        let sessions = || links().map(|l| l.session.stats());
        let successors =
            || self.conns.iter().zip(&self.case.conns).enumerate().filter(|(_, (c, s))| c.started && s.after.is_some());
        let stale_of = |conn: usize| links().filter(|l| l.conn == conn).map(|l| l.stale.0).sum::<u64>();
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
            successors: (successors().count(), successors().filter(|(_, (c, _))| c.completed).count()),
            stale: links().fold((0, 0), |(n, r), l| (n + l.stale.0, r + l.stale.1)),
            stale_survived: successors().filter(|&(i, (c, _))| c.completed && stale_of(i) > 0).count(),
            violations: self.violations,
        }
    }
}
