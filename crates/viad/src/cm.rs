//! Connection management between host agents: the state, without I/O.
//!
//! `viad` talks to the agents of other hosts with the CM messages of
//! [`via_wire::cm`], one per UDP datagram on the CM port.  This module keeps
//! the tables and timers of that exchange and is driven by the agent's event
//! loop with explicit `now` instants, so that tests can step a fake clock:
//!
//! * **Outgoing** requests: a `Connect` (or, on the host with the larger
//!   address, a `PeerConnect`) for another host is sent as
//!   `Request { id, .. }`, where `id` is this agent's own random 64-bit
//!   number.  Copies go out 100 ms apart ([`FAST_INTERVAL`]) for the first
//!   [`FAST_COPIES`] copies, then every 500 ms ([`SLOW_INTERVAL`]); once the
//!   remote agent has acknowledged (`Ack`: "held, waiting for a listener")
//!   the slow pace applies at once.  The copies keep the request alive at the
//!   remote agent.  At the request's deadline it ends as `NoMatch` if the
//!   remote host answered (its agent, or its kernel with an ICMP "port
//!   unreachable" when no agent runs there, within [`HOST_MEMORY`]), else as
//!   `Unreachable`.  A request that a listener has taken (`Taken`) waits up
//!   to [`TAKEN_GRACE`] past its deadline for that listener's answer.
//! * **Withdrawn** requests: a request that ends without an answer (its
//!   deadline, or its client gone) is withdrawn (`Withdraw`, repeated on the
//!   same schedule until acknowledged, for at most [`HOLD_TIME`]), so that
//!   the remote agent drops it before a listener takes it.
//! * **Held** requests: a `Request` from another agent is held under the key
//!   (sender's address, id), so duplicates and retransmissions refresh one
//!   entry and never make a second one.  A new request from the same VI
//!   (same endpoint address and VI id) supersedes the ones it held before,
//!   which that VI no longer waits for.  Each copy is answered with `Ack`
//!   while the request waits, `Taken` once a listener has it, or with the
//!   answer once there is one.  A held request expires [`HOLD_TIME`] after
//!   its last copy arrived, or at once when withdrawn.
//! * **Answers**: `Accept` or `Reject` for a held request is retransmitted on
//!   the same schedule until the requester's agent sends `Ack`, for at most
//!   [`ANSWER_GIVE_UP`].
//! * **Finished** requests: the requester remembers for [`FINISHED_MEMORY`]
//!   how its requests ended, so that a retransmitted answer whose `Ack` was
//!   lost is acknowledged again instead of refused.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use via_wire::cm::{CmEndpoint, CmMessage};

pub use viad_client::proto::{ANSWER_GIVE_UP, TAKEN_GRACE};

/// Spacing of the first copies of a request or an answer.
pub const FAST_INTERVAL: Duration = Duration::from_millis(100);
/// Spacing of the copies after the first [`FAST_COPIES`], or once acknowledged.
pub const SLOW_INTERVAL: Duration = Duration::from_millis(500);
/// How many copies go out at [`FAST_INTERVAL`] (the first one included).
pub const FAST_COPIES: u32 = 10;
/// A held request expires this long after its last copy arrived.
pub const HOLD_TIME: Duration = Duration::from_secs(2);
/// How long a requester remembers how its requests ended.
pub const FINISHED_MEMORY: Duration = Duration::from_secs(10);
/// Most requests from other agents held at once; more are refused (`NoMatch`).
pub const MAX_HELD: usize = 4096;
/// A host that answered (a CM message, or "port unreachable") counts as up
/// for this long: a request to it that nobody takes ends as `NoMatch`.
pub const HOST_MEMORY: Duration = Duration::from_secs(30);
/// Most withdrawals in flight at once; more go out once, unrepeated.
pub const MAX_WITHDRAWING: usize = 4096;

/// A held request's key: the requesting agent's address and its id.
pub type HeldKey = (SocketAddr, u64);

/// When the next copy of a datagram is due.
#[derive(Debug, Clone)]
pub struct Retransmit {
    start: Instant,
    next: Instant,
    copies: u32,
    slow: bool,
}

impl Retransmit {
    /// The schedule of a datagram whose first copy went out at `now`.
    pub fn new(now: Instant) -> Retransmit {
        Retransmit { start: now, next: now + FAST_INTERVAL, copies: 1, slow: false }
    }

    /// When the first copy went out.
    pub fn start(&self) -> Instant {
        self.start
    }

    /// When the next copy is due.
    pub fn next(&self) -> Instant {
        self.next
    }

    /// How many copies went out.
    pub fn copies(&self) -> u32 {
        self.copies
    }

    fn interval(&self) -> Duration {
        match self.slow || self.copies >= FAST_COPIES {
            true => SLOW_INTERVAL,
            false => FAST_INTERVAL,
        }
    }

    /// Records one more copy sent at `now`.
    pub fn sent(&mut self, now: Instant) {
        self.copies += 1;
        self.next = now + self.interval();
    }

    /// Switches to the slow pace from the next copy on.
    pub fn slow_down(&mut self) {
        if self.interval() == FAST_INTERVAL {
            self.next += SLOW_INTERVAL - FAST_INTERVAL;
        }
        self.slow = true;
    }
}

/// A request this agent forwarded to another host for one of its processes.
#[derive(Debug)]
pub struct Outgoing {
    /// The client that asked.
    pub token: u64,
    /// The remote agent.
    pub dest: SocketAddr,
    /// The encoded `Request`.
    pub datagram: Vec<u8>,
    /// When the request ends; `None` = never.
    pub deadline: Option<Instant>,
    /// Whether the remote agent acknowledged a copy.
    pub acked: bool,
    /// Until when a listener that took the request may still answer.
    pub taken_until: Option<Instant>,
    /// Retransmission schedule.
    pub tx: Retransmit,
}

impl Outgoing {
    /// When the request ends unanswered: its deadline, pushed back while a
    /// listener that took it may still answer.
    pub fn ends_at(&self) -> Option<Instant> {
        self.deadline.map(|d| self.taken_until.map_or(d, |t| d.max(t)))
    }
}

/// A request withdrawn from the remote agent; repeated until acknowledged.
#[derive(Debug)]
struct Withdrawal {
    dest: SocketAddr,
    tx: Retransmit,
}

/// Where a held request stands.
#[derive(Debug)]
pub enum HeldState {
    /// Waiting for a listener (or for the mirror-image peer request).
    Queued,
    /// Handed to the listener of this client, which has not answered yet.
    Delivered(u64),
    /// Answered; the answer is retransmitted until acknowledged.
    Answering {
        /// The encoded `Accept` or `Reject`.
        datagram: Vec<u8>,
        /// Retransmission schedule.
        tx: Retransmit,
        /// The client to tell when the answer is acknowledged or given up.
        waiter: Option<u64>,
    },
    /// Answered and acknowledged (or given up); resent if a copy of the
    /// request still arrives.
    Answered {
        /// The encoded `Accept` or `Reject`.
        datagram: Vec<u8>,
    },
}

/// A request from another host's agent.
#[derive(Debug)]
pub struct Held {
    /// Arrival order among all waiting requests of this agent.
    pub seq: u64,
    /// VIA host address of the requester.
    pub from_host: Vec<u8>,
    /// The requester's discriminator.
    pub from_disc: Vec<u8>,
    /// VIA host address asked for.
    pub to_host: Vec<u8>,
    /// Discriminator asked for.
    pub to_disc: Vec<u8>,
    /// Peer-to-peer request.
    pub peer: bool,
    /// The requesting VI.
    pub endpoint: CmEndpoint,
    /// When the last copy arrived.
    pub last_seen: Instant,
    /// Where it stands.
    pub state: HeldState,
}

/// What became of a request this agent forwarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The remote side accepted.
    Accepted,
    /// The remote listener rejected.
    Rejected,
}

/// How a `Request` from another agent was taken.
#[derive(Debug, PartialEq, Eq)]
pub enum Arrival {
    /// A new request, now held (queued); acknowledge it and look for a match.
    New,
    /// A copy of a held request; send back these datagrams.
    Duplicate(Vec<u8>),
    /// Too many requests are held; refuse it.
    Full,
}

/// Something the agent must do, reported by [`Cm::poll`].
#[derive(Debug, PartialEq, Eq)]
pub enum Event {
    /// Send this datagram (a retransmission).
    Send(SocketAddr, Vec<u8>),
    /// The forwarded request of this client reached its deadline (and is
    /// withdrawn: the `Send` of its `Withdraw` comes with this event).
    TimedOut {
        /// The client.
        token: u64,
        /// Whether the remote host answered: its agent acknowledged the
        /// request, or the host answered recently ([`HOST_MEMORY`]).
        answered: bool,
    },
    /// Nobody acknowledged the answer to this held request.
    GaveUp {
        /// The request.
        key: HeldKey,
        /// The client waiting for the acknowledgement.
        waiter: Option<u64>,
    },
}

/// CM counters.
#[derive(Debug, Default, Clone)]
pub struct CmStats {
    /// Requests forwarded to other hosts (first copies).
    pub requests_sent: u64,
    /// Distinct requests from other hosts taken for holding.
    pub requests_received: u64,
    /// Copies of requests already held.
    pub duplicates: u64,
    /// Copies sent again: requests and answers.
    pub retransmits: u64,
    /// Cross-host connections accepted (by either side).
    pub accepts: u64,
    /// Cross-host connect requests rejected (by either side).
    pub rejects: u64,
    /// Forwarded requests that ended without a match.
    pub no_match: u64,
    /// Forwarded requests whose host never answered.
    pub unreachable: u64,
    /// Datagrams on the CM port that were not CM messages.
    pub malformed: u64,
    /// Held requests handed to a local listener.
    pub remote_listeners_matched: u64,
    /// Requests this agent withdrew from other hosts.
    pub withdrawn_sent: u64,
    /// Held requests dropped because their requester withdrew them.
    pub withdrawn_received: u64,
    /// Held requests dropped because a newer request of the same VI came.
    pub superseded: u64,
    /// ICMP "port unreachable" answers: a host up with no agent.
    pub port_unreachable: u64,
}

/// The CM tables of one agent.
#[derive(Debug)]
pub struct Cm {
    /// Requests forwarded for local processes, by id.
    pub outgoing: BTreeMap<u64, Outgoing>,
    /// Requests from other agents.
    pub held: BTreeMap<HeldKey, Held>,
    finished: BTreeMap<u64, (Outcome, Instant)>,
    withdrawing: BTreeMap<u64, Withdrawal>,
    /// When each host last answered.
    answered: BTreeMap<IpAddr, Instant>,
    next_id: u64,
    /// Counters.
    pub stats: CmStats,
}

impl Cm {
    /// Empty tables; request ids start at `seed` (pass a random number, so
    /// that ids of different agents and runs do not collide).
    pub fn new(seed: u64) -> Cm {
        Cm {
            outgoing: BTreeMap::new(),
            held: BTreeMap::new(),
            finished: BTreeMap::new(),
            withdrawing: BTreeMap::new(),
            answered: BTreeMap::new(),
            next_id: seed,
            stats: CmStats::default(),
        }
    }

    /// Whether any request or answer is in flight.
    pub fn busy(&self) -> bool {
        !self.outgoing.is_empty() || !self.held.is_empty() || !self.withdrawing.is_empty()
    }

    /// Registers a request for client `token` to the agent at `dest`, whose
    /// first copy the caller sends now.  `encode` builds the datagram for an
    /// id; returns the id and the datagram, or `None` if `encode` failed.
    pub fn start(
        &mut self,
        token: u64,
        dest: SocketAddr,
        encode: impl FnOnce(u64) -> Option<Vec<u8>>,
        deadline: Option<Instant>,
        now: Instant,
    ) -> Option<(u64, Vec<u8>)> {
        let mut id = self.next_id;
        while self.outgoing.contains_key(&id) || self.finished.contains_key(&id) {
            id = id.wrapping_add(1);
        }
        self.next_id = id.wrapping_add(1);
        let datagram = encode(id)?;
        self.outgoing.insert(
            id,
            Outgoing {
                token,
                dest,
                datagram: datagram.clone(),
                deadline,
                acked: false,
                taken_until: None,
                tx: Retransmit::new(now),
            },
        );
        self.stats.requests_sent += 1;
        Some((id, datagram))
    }

    /// The remote agent at `from` acknowledged request `id`: it holds it.
    /// Only the agent the request went to can say so.
    pub fn outgoing_acked(&mut self, id: u64, from: SocketAddr) {
        if let Some(o) = self.outgoing.get_mut(&id).filter(|o| o.dest == from) {
            if !o.acked {
                o.acked = true;
                o.tx.slow_down();
            }
        }
    }

    /// A listener at the remote agent took request `id`: it waits for that
    /// listener's answer up to [`TAKEN_GRACE`] from now, past its deadline.
    /// Only the agent the request went to can say so.
    pub fn outgoing_taken(&mut self, id: u64, from: SocketAddr, now: Instant) {
        self.outgoing_acked(id, from);
        if let Some(o) = self.outgoing.get_mut(&id).filter(|o| o.dest == from) {
            o.taken_until = Some(now + TAKEN_GRACE);
        }
    }

    /// Host `ip` answered at `now`: a CM message from its agent, or its
    /// kernel's "port unreachable" for the CM port.  Only hosts this agent
    /// asked are remembered, so that datagrams from anywhere cannot grow
    /// the table.
    pub fn host_answered(&mut self, ip: IpAddr, now: Instant) {
        if self.answered.contains_key(&ip) || self.outgoing.values().any(|o| o.dest.ip() == ip) {
            self.answered.insert(ip, now);
        }
    }

    /// The kernel reported "port unreachable" for a datagram to `dest`: the
    /// host is up, and no agent runs there (yet).
    pub fn port_unreachable(&mut self, dest: SocketAddr, now: Instant) {
        self.stats.port_unreachable += 1;
        self.host_answered(dest.ip(), now);
    }

    /// Whether host `ip` answered within [`HOST_MEMORY`] of `now`.
    pub fn host_up(&self, ip: IpAddr, now: Instant) -> bool {
        self.answered.get(&ip).is_some_and(|t| now < *t + HOST_MEMORY)
    }

    /// Ends request `id`, which no longer waits, and withdraws it from the
    /// remote agent: returns where to send the first `Withdraw` and its
    /// bytes.
    pub fn withdraw(&mut self, id: u64, now: Instant) -> Option<(SocketAddr, Vec<u8>)> {
        let o = self.outgoing.remove(&id)?;
        Some((o.dest, self.start_withdrawal(id, o.dest, now)))
    }

    fn start_withdrawal(&mut self, id: u64, dest: SocketAddr, now: Instant) -> Vec<u8> {
        self.stats.withdrawn_sent += 1;
        if self.withdrawing.len() < MAX_WITHDRAWING {
            self.withdrawing.insert(id, Withdrawal { dest, tx: Retransmit::new(now) });
        }
        CmMessage::Withdraw { id }.encode()
    }

    /// The remote agent acknowledged the withdrawal of `id` (or an `Ack` of
    /// the request itself crossed it: the request expires there anyway).
    pub fn withdrawal_acked(&mut self, id: u64, from: SocketAddr) {
        if self.withdrawing.get(&id).is_some_and(|w| w.dest == from) {
            self.withdrawing.remove(&id);
        }
    }

    /// Ends request `id`; remembers `outcome`, if any, for re-acknowledging.
    pub fn finish(&mut self, id: u64, outcome: Option<Outcome>, now: Instant) -> Option<Outgoing> {
        let o = self.outgoing.remove(&id)?;
        if let Some(outcome) = outcome {
            self.finished.insert(id, (outcome, now + FINISHED_MEMORY));
        }
        Some(o)
    }

    /// How request `id` ended, if it ended recently with an answer.
    pub fn outcome(&self, id: u64) -> Option<Outcome> {
        self.finished.get(&id).map(|f| f.0)
    }

    /// Takes a `Request` from `src`; `held` describes it (its `seq` is used
    /// only if it is new).
    pub fn arrive(&mut self, src: SocketAddr, id: u64, held: Held) -> Arrival {
        let now = held.last_seen;
        if let Some(h) = self.held.get_mut(&(src, id)) {
            h.last_seen = now;
            self.stats.duplicates += 1;
            return Arrival::Duplicate(match &h.state {
                HeldState::Queued => CmMessage::Ack { id }.encode(),
                HeldState::Delivered(_) => CmMessage::Taken { id }.encode(),
                HeldState::Answering { datagram, .. } | HeldState::Answered { datagram } => datagram.clone(),
            });
        }
        // The VI asks again: what it asked before no longer waits.  (A
        // request being answered stays: its answer tells the requester.)
        let before = self.held.len();
        self.held.retain(|(from, _), h| {
            let same_vi = *from == src && h.endpoint.addr == held.endpoint.addr && h.endpoint.vi == held.endpoint.vi;
            !(same_vi && matches!(h.state, HeldState::Queued | HeldState::Delivered(_)))
        });
        self.stats.superseded += (before - self.held.len()) as u64;
        if self.held.len() >= MAX_HELD && !self.forget_oldest_answered() {
            return Arrival::Full;
        }
        self.held.insert((src, id), held);
        self.stats.requests_received += 1;
        Arrival::New
    }

    /// Makes room in a full table: forgets the answered request whose last
    /// copy is the oldest (kept only to answer a late copy again), so that
    /// a sustained rate of requests is not refused for the answered ones.
    /// `false` when every held request is still waiting or being answered.
    fn forget_oldest_answered(&mut self) -> bool {
        let oldest = self
            .held
            .iter()
            .filter(|(_, h)| matches!(h.state, HeldState::Answered { .. }))
            .min_by_key(|(_, h)| h.last_seen)
            .map(|(k, _)| *k);
        oldest.is_some_and(|k| self.held.remove(&k).is_some())
    }

    /// Answers held request `key` with `datagram`, whose first copy the
    /// caller sends now; `waiter` is told when it is acknowledged.
    pub fn answer(&mut self, key: HeldKey, datagram: Vec<u8>, waiter: Option<u64>, now: Instant) {
        if let Some(h) = self.held.get_mut(&key) {
            h.state = HeldState::Answering { datagram, tx: Retransmit::new(now), waiter };
        }
    }

    /// The requester acknowledged the answer to `key`.  Returns `Some(waiter)`
    /// if an answer was in flight.
    pub fn answer_acked(&mut self, key: HeldKey) -> Option<Option<u64>> {
        let h = self.held.get_mut(&key)?;
        let HeldState::Answering { datagram, waiter, .. } = &mut h.state else {
            return None;
        };
        let waiter = *waiter;
        h.state = HeldState::Answered { datagram: std::mem::take(datagram) };
        Some(waiter)
    }

    /// The requester refused the answer to `key` (`NoMatch`: it no longer
    /// waits).  Forgets the request; returns `Some(waiter)` if it had an answer.
    pub fn answer_refused(&mut self, key: HeldKey) -> Option<Option<u64>> {
        let waiter = match &self.held.get(&key)?.state {
            HeldState::Answering { waiter, .. } => *waiter,
            HeldState::Answered { .. } => None,
            HeldState::Queued | HeldState::Delivered(_) => return None,
        };
        self.held.remove(&key);
        Some(waiter)
    }

    /// The requester withdrew held request `key`: forgets it, whatever its
    /// state (a listener it was delivered to gets `NoMatch` for its answer).
    /// Returns `Some(waiter)` if it was held, where `waiter` is the local
    /// client that waits for the acknowledgement of an answer in flight.
    pub fn withdrawn(&mut self, key: HeldKey) -> Option<Option<u64>> {
        let h = self.held.remove(&key)?;
        self.stats.withdrawn_received += 1;
        Some(match h.state {
            HeldState::Answering { waiter, .. } => waiter,
            _ => None,
        })
    }

    /// Retransmits what is due, ends requests at their deadline, gives up
    /// unacknowledged answers and forgets expired state.
    pub fn poll(&mut self, now: Instant) -> Vec<Event> {
        let mut events = Vec::new();
        let timed_out: Vec<u64> =
            self.outgoing.iter().filter(|(_, o)| o.ends_at().is_some_and(|d| d <= now)).map(|(id, _)| *id).collect();
        for id in timed_out {
            if let Some(o) = self.outgoing.remove(&id) {
                let answered = o.acked || self.host_up(o.dest.ip(), now);
                match answered {
                    true => self.stats.no_match += 1,
                    false => self.stats.unreachable += 1,
                }
                let withdraw = self.start_withdrawal(id, o.dest, now);
                events.push(Event::Send(o.dest, withdraw));
                events.push(Event::TimedOut { token: o.token, answered });
            }
        }
        self.withdrawing.retain(|id, w| {
            if now >= w.tx.start() + HOLD_TIME {
                return false;
            }
            if w.tx.next() <= now {
                w.tx.sent(now);
                events.push(Event::Send(w.dest, CmMessage::Withdraw { id: *id }.encode()));
            }
            true
        });
        self.answered.retain(|_, t| now < *t + HOST_MEMORY);
        for o in self.outgoing.values_mut() {
            if o.tx.next() <= now {
                o.tx.sent(now);
                self.stats.retransmits += 1;
                events.push(Event::Send(o.dest, o.datagram.clone()));
            }
        }
        let mut expired = Vec::new();
        for (key, h) in self.held.iter_mut() {
            if let HeldState::Answering { datagram, tx, waiter } = &mut h.state {
                if now >= tx.start() + ANSWER_GIVE_UP {
                    events.push(Event::GaveUp { key: *key, waiter: *waiter });
                    h.state = HeldState::Answered { datagram: std::mem::take(datagram) };
                } else if tx.next() <= now {
                    tx.sent(now);
                    self.stats.retransmits += 1;
                    events.push(Event::Send(key.0, datagram.clone()));
                }
                continue;
            }
            if now >= h.last_seen + HOLD_TIME {
                expired.push(*key);
            }
        }
        for key in expired {
            self.held.remove(&key);
        }
        self.finished.retain(|_, (_, until)| *until > now);
        events
    }

    /// When [`Cm::poll`] has something to do next.
    pub fn next_deadline(&self) -> Option<Instant> {
        let outgoing = self.outgoing.values().flat_map(|o| [Some(o.tx.next()), o.ends_at()]);
        let withdrawing = self.withdrawing.values().map(|w| Some(w.tx.next().min(w.tx.start() + HOLD_TIME)));
        let held = self.held.values().map(|h| match &h.state {
            HeldState::Answering { tx, .. } => Some(tx.next().min(tx.start() + ANSWER_GIVE_UP)),
            _ => Some(h.last_seen + HOLD_TIME),
        });
        let finished = self.finished.values().map(|f| Some(f.1));
        outgoing.chain(withdrawing).chain(held).chain(finished).flatten().min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn endpoint() -> CmEndpoint {
        CmEndpoint {
            addr: "10.0.0.1:4000".parse().unwrap(),
            vi: 1,
            key: 2,
            reliability: 0,
            max_transfer: 1 << 16,
            rdma_write: false,
            rdma_read: false,
            segment: 1400,
            payload_crc: true,
            ether: None,
            large_packets: false,
            placed_acks: false,
        }
    }

    /// A request of VI `seq` (each its own VI, unless changed).
    fn held(seq: u64, now: Instant) -> Held {
        let mut endpoint = endpoint();
        endpoint.vi = seq as u32;
        Held {
            seq,
            from_host: vec![10, 0, 0, 1],
            from_disc: b"c".to_vec(),
            to_host: vec![10, 0, 0, 2],
            to_disc: b"s".to_vec(),
            peer: false,
            endpoint,
            last_seen: now,
            state: HeldState::Queued,
        }
    }

    fn sends(events: &[Event]) -> usize {
        events.iter().filter(|e| matches!(e, Event::Send(..))).count()
    }

    /// Steps a fake clock in 1 ms steps and records when copies go out.
    fn copy_times(cm: &mut Cm, t0: Instant, until: u64) -> Vec<u64> {
        let mut at = Vec::new();
        for t in 0..=until {
            for e in cm.poll(t0 + ms(t)) {
                if let Event::Send(..) = e {
                    at.push(t);
                }
            }
        }
        at
    }

    #[test]
    fn request_retransmission_schedule() {
        let t0 = Instant::now();
        let mut cm = Cm::new(u64::MAX);
        let dest: SocketAddr = "10.0.0.2:60".parse().unwrap();
        let (id, first) = cm.start(7, dest, |id| Some(id.to_be_bytes().to_vec()), None, t0).unwrap();
        assert_eq!((id, first), (u64::MAX, u64::MAX.to_be_bytes().to_vec()));
        // Nine more copies 100 ms apart, then 500 ms apart.
        let at = copy_times(&mut cm, t0, 3000);
        let mut want: Vec<u64> = (1..FAST_COPIES as u64).map(|k| 100 * k).collect();
        want.extend([1400, 1900, 2400, 2900]);
        assert_eq!(at, want);
        assert_eq!(cm.stats.retransmits, want.len() as u64);
        assert_eq!(cm.stats.requests_sent, 1);
        assert_eq!(cm.next_deadline(), Some(t0 + ms(3400)));
        // Ids wrap and stay unique.
        let (id2, _) = cm.start(8, dest, |_| Some(vec![]), None, t0).unwrap();
        assert_eq!(id2, 0);
        assert!(cm.start(9, dest, |_| None, None, t0).is_none());
        assert_eq!(cm.outgoing.len(), 2);
    }

    #[test]
    fn an_acknowledged_request_slows_down_and_times_out_as_no_match() {
        let t0 = Instant::now();
        let mut cm = Cm::new(1);
        let dest: SocketAddr = "[fd77::2]:60".parse().unwrap();
        let deadline = Some(t0 + ms(2000));
        let (id, _) = cm.start(3, dest, |_| Some(vec![1]), deadline, t0).unwrap();
        assert_eq!(sends(&cm.poll(t0 + ms(100))), 1);
        cm.outgoing_acked(id, dest);
        cm.outgoing_acked(id, dest);
        // The copy due at 200 ms moves to 600 ms.
        let at = copy_times(&mut cm, t0 + ms(101), 1898);
        assert_eq!(at, vec![499, 999, 1499]);
        let withdraw = CmMessage::Withdraw { id }.encode();
        assert_eq!(
            cm.poll(t0 + ms(2000)),
            vec![Event::Send(dest, withdraw), Event::TimedOut { token: 3, answered: true }]
        );
        assert!(cm.outgoing.is_empty());
        // The withdrawal goes on until acknowledged.
        assert!(cm.busy());
        cm.withdrawal_acked(id, dest);
        assert!(!cm.busy());
        assert_eq!((cm.stats.no_match, cm.stats.unreachable), (1, 0));
    }

    #[test]
    fn an_unanswered_request_times_out_as_unreachable() {
        let t0 = Instant::now();
        let mut cm = Cm::new(1);
        let dest: SocketAddr = "10.0.0.2:60".parse().unwrap();
        let (id, _) = cm.start(4, dest, |_| Some(vec![1]), Some(t0 + ms(250)), t0).unwrap();
        assert_eq!(cm.next_deadline(), Some(t0 + ms(100)));
        assert_eq!(sends(&cm.poll(t0 + ms(100))), 1);
        assert_eq!(sends(&cm.poll(t0 + ms(200))), 1);
        assert_eq!(cm.next_deadline(), Some(t0 + ms(250)));
        let events = cm.poll(t0 + ms(250));
        let withdraw = CmMessage::Withdraw { id }.encode();
        assert_eq!(events, vec![Event::Send(dest, withdraw.clone()), Event::TimedOut { token: 4, answered: false }]);
        assert_eq!((cm.stats.no_match, cm.stats.unreachable), (0, 1));
        // Unacknowledged, the withdrawal is repeated on the request's
        // schedule for HOLD_TIME, then given up.
        let at = copy_times(&mut cm, t0 + ms(251), 3000);
        assert_eq!(at, (1..FAST_COPIES as u64).map(|k| 100 * k - 1).chain([1399, 1899]).collect::<Vec<_>>());
        assert!(!cm.busy());
        assert_eq!(cm.stats.withdrawn_sent, 1);
    }

    #[test]
    fn duplicates_refresh_one_entry() {
        let t0 = Instant::now();
        let mut cm = Cm::new(1);
        let a: SocketAddr = "10.0.0.1:60".parse().unwrap();
        let b: SocketAddr = "10.0.0.3:60".parse().unwrap();
        assert_eq!(cm.arrive(a, 9, held(1, t0)), Arrival::New);
        let ack = CmMessage::Ack { id: 9 }.encode();
        for k in 1..=5 {
            let now = t0 + ms(100 * k);
            assert_eq!(cm.arrive(a, 9, held(100 + k, now)), Arrival::Duplicate(ack.clone()));
        }
        // The same id from another agent, or another id, is another request.
        assert_eq!(cm.arrive(b, 9, held(2, t0)), Arrival::New);
        assert_eq!(cm.arrive(a, 10, held(3, t0)), Arrival::New);
        assert_eq!(cm.held.len(), 3);
        assert_eq!(cm.held[&(a, 9)].seq, 1);
        assert_eq!(cm.held[&(a, 9)].last_seen, t0 + ms(500));
        assert_eq!((cm.stats.requests_received, cm.stats.duplicates), (3, 5));

        // Once answered, a copy gets the answer again.
        let accept = CmMessage::Accept { id: 9, endpoint: endpoint() }.encode();
        cm.answer((a, 9), accept.clone(), Some(5), t0 + ms(600));
        assert_eq!(cm.arrive(a, 9, held(0, t0 + ms(650))), Arrival::Duplicate(accept.clone()));
        assert_eq!(cm.answer_acked((a, 9)), Some(Some(5)));
        assert_eq!(cm.answer_acked((a, 9)), None);
        assert_eq!(cm.arrive(a, 9, held(0, t0 + ms(700))), Arrival::Duplicate(accept));
    }

    #[test]
    fn held_requests_expire_after_their_last_copy() {
        let t0 = Instant::now();
        let mut cm = Cm::new(1);
        let a: SocketAddr = "10.0.0.1:60".parse().unwrap();
        cm.arrive(a, 1, held(1, t0));
        cm.arrive(a, 2, held(2, t0));
        cm.held.get_mut(&(a, 2)).unwrap().state = HeldState::Delivered(7);
        cm.arrive(a, 1, held(1, t0 + ms(1500)));
        assert_eq!(cm.next_deadline(), Some(t0 + HOLD_TIME));
        assert!(cm.poll(t0 + HOLD_TIME - ms(1)).is_empty());
        assert_eq!(cm.held.len(), 2);
        // A delivered request expires too: its requester stopped sending.
        assert!(cm.poll(t0 + HOLD_TIME).is_empty());
        assert_eq!(cm.held.keys().collect::<Vec<_>>(), vec![&(a, 1)]);
        cm.poll(t0 + ms(1500) + HOLD_TIME);
        assert!(cm.held.is_empty() && !cm.busy());
        // A full table refuses.
        for id in 0..MAX_HELD as u64 {
            assert_eq!(cm.arrive(a, id, held(id, t0)), Arrival::New);
        }
        assert_eq!(cm.arrive(a, u64::MAX, held(u64::MAX, t0)), Arrival::Full);
        // An answered request makes room: the oldest one goes.
        for id in [7, 3, 9] {
            cm.answer((a, id), vec![1], None, t0);
            cm.answer_acked((a, id));
        }
        cm.held.get_mut(&(a, 7)).unwrap().last_seen = t0 - ms(1);
        assert_eq!(cm.arrive(a, u64::MAX, held(u64::MAX, t0)), Arrival::New);
        assert!(!cm.held.contains_key(&(a, 7)) && cm.held.contains_key(&(a, 3)));
    }

    #[test]
    fn answers_are_retransmitted_until_acknowledged_or_given_up() {
        let t0 = Instant::now();
        let mut cm = Cm::new(1);
        let a: SocketAddr = "10.0.0.1:60".parse().unwrap();
        cm.arrive(a, 1, held(1, t0));
        cm.arrive(a, 2, held(2, t0));
        cm.answer((a, 1), vec![1], Some(11), t0);
        cm.answer((a, 2), vec![2], None, t0);
        let at = copy_times(&mut cm, t0, 350);
        assert_eq!(at, vec![100, 100, 200, 200, 300, 300]);
        assert_eq!(cm.answer_acked((a, 1)), Some(Some(11)));
        // The acknowledged answer stops; the other one goes on to the give-up.
        let mut copies = 0;
        let mut gave_up = Vec::new();
        for t in 351..=6000 {
            for e in cm.poll(t0 + ms(t)) {
                match e {
                    Event::Send(to, d) => {
                        assert_eq!((to, d), (a, vec![2]));
                        copies += 1;
                    }
                    Event::GaveUp { key, waiter } => gave_up.push((t, key, waiter)),
                    e => panic!("{e:?}"),
                }
            }
        }
        // 100 ms apart up to the tenth copy (900 ms), then 500 ms apart, until 5 s.
        assert_eq!(copies, 6 + 8);
        assert_eq!(gave_up, vec![(5000, (a, 2), None)]);
        // Afterwards both expire like any held request.
        assert!(cm.held.is_empty());
    }

    #[test]
    fn a_host_that_answered_port_unreachable_is_up_and_its_requests_end_as_no_match() {
        let t0 = Instant::now();
        let mut cm = Cm::new(1);
        let up: SocketAddr = "10.0.0.2:60".parse().unwrap();
        let down: SocketAddr = "10.0.0.3:60".parse().unwrap();
        cm.start(1, up, |_| Some(vec![1]), Some(t0 + ms(1000)), t0);
        cm.start(2, down, |_| Some(vec![2]), Some(t0 + ms(1000)), t0);
        cm.port_unreachable(up, t0 + ms(10));
        let ended: Vec<Event> =
            cm.poll(t0 + ms(1000)).into_iter().filter(|e| matches!(e, Event::TimedOut { .. })).collect();
        assert_eq!(
            ended,
            vec![Event::TimedOut { token: 1, answered: true }, Event::TimedOut { token: 2, answered: false }]
        );
        assert_eq!((cm.stats.no_match, cm.stats.unreachable, cm.stats.port_unreachable), (1, 1, 1));
        // The host counts as up for HOST_MEMORY: a later request, whose
        // copies the kernel no longer answers (ICMP is rate-limited), also
        // ends as NoMatch; after that it is unreachable again.
        let later = t0 + ms(10) + HOST_MEMORY - ms(1);
        cm.start(3, up, |_| Some(vec![3]), Some(later), t0 + ms(1000));
        let events = cm.poll(later);
        assert!(events.contains(&Event::TimedOut { token: 3, answered: true }), "{events:?}");
        cm.start(4, up, |_| Some(vec![4]), Some(later + ms(600)), later);
        let events = cm.poll(later + ms(600));
        assert!(events.contains(&Event::TimedOut { token: 4, answered: false }), "{events:?}");
        // Any CM message counts as an answer too, from a host it asked.
        let stranger: IpAddr = "10.9.9.9".parse().unwrap();
        cm.host_answered(stranger, later);
        assert!(!cm.host_up(stranger, later), "a host nobody asked is not remembered");
        cm.start(5, down, |_| Some(vec![5]), None, later);
        cm.host_answered(down.ip(), later);
        assert!(cm.host_up(down.ip(), later + HOST_MEMORY - ms(1)) && !cm.host_up(down.ip(), later + HOST_MEMORY));
    }

    #[test]
    fn a_request_a_listener_took_waits_past_its_deadline_for_the_answer() {
        let t0 = Instant::now();
        let mut cm = Cm::new(1);
        let dest: SocketAddr = "10.0.0.2:60".parse().unwrap();
        let (id, _) = cm.start(1, dest, |_| Some(vec![1]), Some(t0 + ms(1000)), t0).unwrap();
        cm.outgoing_taken(id, dest, t0 + ms(900));
        assert!(cm.outgoing[&id].acked);
        assert_eq!(cm.next_deadline().map(|d| d > t0 + ms(1000)), Some(false), "copies still go out");
        let ends = t0 + ms(900) + TAKEN_GRACE;
        assert_eq!(cm.outgoing[&id].ends_at(), Some(ends));
        for t in (1000..(900 + TAKEN_GRACE.as_millis() as u64)).step_by(50) {
            let events = cm.poll(t0 + ms(t));
            assert!(!events.iter().any(|e| matches!(e, Event::TimedOut { .. })), "ended at {t} ms");
        }
        assert!(cm.poll(ends).contains(&Event::TimedOut { token: 1, answered: true }));
        // Taken before the deadline changes nothing: the deadline stays.
        let (id, _) = cm.start(2, dest, |_| Some(vec![1]), Some(ends + TAKEN_GRACE * 2), ends).unwrap();
        cm.outgoing_taken(id, dest, ends);
        assert_eq!(cm.outgoing[&id].ends_at(), Some(ends + TAKEN_GRACE * 2));
    }

    #[test]
    fn a_withdrawn_or_superseded_request_is_never_held_for_a_listener() {
        let t0 = Instant::now();
        let mut cm = Cm::new(1);
        let a: SocketAddr = "10.0.0.1:60".parse().unwrap();
        let b: SocketAddr = "10.0.0.3:60".parse().unwrap();
        // Withdrawn while queued: gone, with no listener to tell.
        cm.arrive(a, 1, held(1, t0));
        assert_eq!(cm.withdrawn((a, 1)), Some(None));
        assert_eq!(cm.withdrawn((a, 1)), None);
        assert!(cm.held.is_empty());
        // Withdrawn while its answer is in flight: the waiter is told.
        cm.arrive(a, 2, held(2, t0));
        cm.answer((a, 2), vec![2], Some(9), t0);
        assert_eq!(cm.withdrawn((a, 2)), Some(Some(9)));
        // Delivered: gone too (the listener's answer then finds nothing),
        // and until then its copies are answered `Taken`.
        cm.arrive(a, 3, held(3, t0));
        cm.held.get_mut(&(a, 3)).unwrap().state = HeldState::Delivered(4);
        let taken = CmMessage::Taken { id: 3 }.encode();
        assert_eq!(cm.arrive(a, 3, held(0, t0 + ms(100))), Arrival::Duplicate(taken));
        assert_eq!(cm.withdrawn((a, 3)), Some(None));
        assert_eq!(cm.stats.withdrawn_received, 3);

        // The same VI asks again with a new id: the old request goes, the
        // requests of other VIs and other agents stay.
        let of_vi = |seq, vi, now| {
            let mut h = held(seq, now);
            h.endpoint.vi = vi;
            h
        };
        cm.arrive(a, 10, of_vi(10, 1, t0));
        cm.arrive(a, 11, of_vi(11, 2, t0));
        cm.arrive(b, 12, of_vi(12, 1, t0));
        cm.arrive(a, 13, of_vi(13, 1, t0 + ms(5)));
        let mut keys: Vec<HeldKey> = cm.held.keys().copied().collect();
        keys.sort();
        assert_eq!(keys, vec![(a, 11), (a, 13), (b, 12)]);
        assert_eq!(cm.stats.superseded, 1);
        // One being answered is not superseded: its answer ends it.
        cm.answer((a, 13), vec![13], None, t0);
        cm.arrive(a, 14, of_vi(14, 1, t0 + ms(6)));
        assert!(cm.held.contains_key(&(a, 13)) && cm.held.contains_key(&(a, 14)));
    }

    #[test]
    fn refused_answers_and_finished_requests() {
        let t0 = Instant::now();
        let mut cm = Cm::new(1);
        let a: SocketAddr = "10.0.0.1:60".parse().unwrap();
        cm.arrive(a, 1, held(1, t0));
        // Only an answered request can be refused.
        assert_eq!(cm.answer_refused((a, 1)), None);
        cm.answer((a, 1), vec![1], Some(4), t0);
        assert_eq!(cm.answer_refused((a, 1)), Some(Some(4)));
        assert!(cm.held.is_empty());

        let (id, _) = cm.start(1, a, |_| Some(vec![]), None, t0).unwrap();
        assert_eq!(cm.outcome(id), None);
        assert!(cm.finish(id, Some(Outcome::Accepted), t0).is_some());
        assert!(cm.finish(id, Some(Outcome::Rejected), t0).is_none());
        assert_eq!(cm.outcome(id), Some(Outcome::Accepted));
        assert_eq!(cm.next_deadline(), Some(t0 + FINISHED_MEMORY));
        cm.poll(t0 + FINISHED_MEMORY);
        assert_eq!(cm.outcome(id), None);
    }
}
