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
//!   remote agent ever acknowledged, else as `Unreachable`.
//! * **Held** requests: a `Request` from another agent is held under the key
//!   (sender's address, id), so duplicates and retransmissions refresh one
//!   entry and never make a second one.  Each copy is answered with `Ack`
//!   while the request waits, or with the answer once there is one.  A held
//!   request expires [`HOLD_TIME`] after its last copy arrived.
//! * **Answers**: `Accept` or `Reject` for a held request is retransmitted on
//!   the same schedule until the requester's agent sends `Ack`, for at most
//!   [`ANSWER_GIVE_UP`].
//! * **Finished** requests: the requester remembers for [`FINISHED_MEMORY`]
//!   how its requests ended, so that a retransmitted answer whose `Ack` was
//!   lost is acknowledged again instead of refused.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use via_wire::cm::{CmEndpoint, CmMessage};

/// Spacing of the first copies of a request or an answer.
pub const FAST_INTERVAL: Duration = Duration::from_millis(100);
/// Spacing of the copies after the first [`FAST_COPIES`], or once acknowledged.
pub const SLOW_INTERVAL: Duration = Duration::from_millis(500);
/// How many copies go out at [`FAST_INTERVAL`] (the first one included).
pub const FAST_COPIES: u32 = 10;
/// A held request expires this long after its last copy arrived.
pub const HOLD_TIME: Duration = Duration::from_secs(2);
/// An answer nobody acknowledges is given up after this long.
pub const ANSWER_GIVE_UP: Duration = Duration::from_secs(5);
/// How long a requester remembers how its requests ended.
pub const FINISHED_MEMORY: Duration = Duration::from_secs(10);
/// Most requests from other agents held at once; more are refused (`NoMatch`).
pub const MAX_HELD: usize = 4096;

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
    /// Retransmission schedule.
    pub tx: Retransmit,
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
    /// The forwarded request of this client reached its deadline.
    TimedOut {
        /// The client.
        token: u64,
        /// Whether the remote agent ever acknowledged it.
        acked: bool,
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
}

/// The CM tables of one agent.
#[derive(Debug)]
pub struct Cm {
    /// Requests forwarded for local processes, by id.
    pub outgoing: BTreeMap<u64, Outgoing>,
    /// Requests from other agents.
    pub held: BTreeMap<HeldKey, Held>,
    finished: BTreeMap<u64, (Outcome, Instant)>,
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
            next_id: seed,
            stats: CmStats::default(),
        }
    }

    /// Whether any request or answer is in flight.
    pub fn busy(&self) -> bool {
        !self.outgoing.is_empty() || !self.held.is_empty()
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
            Outgoing { token, dest, datagram: datagram.clone(), deadline, acked: false, tx: Retransmit::new(now) },
        );
        self.stats.requests_sent += 1;
        Some((id, datagram))
    }

    /// The remote agent acknowledged request `id`: it holds it.
    pub fn outgoing_acked(&mut self, id: u64) {
        if let Some(o) = self.outgoing.get_mut(&id) {
            if !o.acked {
                o.acked = true;
                o.tx.slow_down();
            }
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
                HeldState::Queued | HeldState::Delivered(_) => CmMessage::Ack { id }.encode(),
                HeldState::Answering { datagram, .. } | HeldState::Answered { datagram } => datagram.clone(),
            });
        }
        if self.held.len() >= MAX_HELD {
            return Arrival::Full;
        }
        self.held.insert((src, id), held);
        self.stats.requests_received += 1;
        Arrival::New
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

    /// Retransmits what is due, ends requests at their deadline, gives up
    /// unacknowledged answers and forgets expired state.
    pub fn poll(&mut self, now: Instant) -> Vec<Event> {
        let mut events = Vec::new();
        let timed_out: Vec<u64> =
            self.outgoing.iter().filter(|(_, o)| o.deadline.is_some_and(|d| d <= now)).map(|(id, _)| *id).collect();
        for id in timed_out {
            if let Some(o) = self.outgoing.remove(&id) {
                match o.acked {
                    true => self.stats.no_match += 1,
                    false => self.stats.unreachable += 1,
                }
                events.push(Event::TimedOut { token: o.token, acked: o.acked });
            }
        }
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
        let outgoing = self.outgoing.values().flat_map(|o| [Some(o.tx.next()), o.deadline]);
        let held = self.held.values().map(|h| match &h.state {
            HeldState::Answering { tx, .. } => Some(tx.next().min(tx.start() + ANSWER_GIVE_UP)),
            _ => Some(h.last_seen + HOLD_TIME),
        });
        let finished = self.finished.values().map(|f| Some(f.1));
        outgoing.chain(held).chain(finished).flatten().min()
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

    fn held(seq: u64, now: Instant) -> Held {
        Held {
            seq,
            from_host: vec![10, 0, 0, 1],
            from_disc: b"c".to_vec(),
            to_host: vec![10, 0, 0, 2],
            to_disc: b"s".to_vec(),
            peer: false,
            endpoint: endpoint(),
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
        cm.outgoing_acked(id);
        cm.outgoing_acked(id);
        // The copy due at 200 ms moves to 600 ms.
        let at = copy_times(&mut cm, t0 + ms(101), 1898);
        assert_eq!(at, vec![499, 999, 1499]);
        assert_eq!(cm.poll(t0 + ms(2000)), vec![Event::TimedOut { token: 3, acked: true }]);
        assert!(cm.outgoing.is_empty() && !cm.busy());
        assert_eq!((cm.stats.no_match, cm.stats.unreachable), (1, 0));
    }

    #[test]
    fn an_unanswered_request_times_out_as_unreachable() {
        let t0 = Instant::now();
        let mut cm = Cm::new(1);
        let dest: SocketAddr = "10.0.0.2:60".parse().unwrap();
        cm.start(4, dest, |_| Some(vec![1]), Some(t0 + ms(250)), t0);
        assert_eq!(cm.next_deadline(), Some(t0 + ms(100)));
        assert_eq!(sends(&cm.poll(t0 + ms(100))), 1);
        assert_eq!(sends(&cm.poll(t0 + ms(200))), 1);
        assert_eq!(cm.next_deadline(), Some(t0 + ms(250)));
        let events = cm.poll(t0 + ms(250));
        assert_eq!(events, vec![Event::TimedOut { token: 4, acked: false }]);
        assert_eq!((cm.stats.no_match, cm.stats.unreachable), (0, 1));
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
        assert_eq!(cm.arrive(a, u64::MAX, held(0, t0)), Arrival::Full);
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
