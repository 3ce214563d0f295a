//! A deterministic network between two [`Session`]s, in one thread, with
//! virtual time.
//!
//! Packets are really encoded with `via_wire` and decoded on arrival, so
//! the checksum and the header checks are part of every run.  The network
//! loses, duplicates, reorders, corrupts and delays packets, and can cut
//! the link for a while, all drawn from one seeded generator: the same
//! seed replays the same run exactly.
//!
//! [`Sim`] is the network with its two sessions; [`Script`] and [`run`]
//! drive a random exchange of messages both ways over it and check what
//! arrives against what was sent ([`Outcome`]).

use crate::Time;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::fmt;
use std::time::Duration;

use via_wire::{Header, Packet};

use crate::{BreakReason, Config, Event, MsgKind, OutMessage, Peer, SendError, Session, Stats};

/// A small seeded generator (xoshiro256**), so the simulator needs no
/// dependency and its streams never change under it.
#[derive(Debug, Clone)]
pub struct SimRng {
    s: [u64; 4],
}

impl SimRng {
    /// A generator whose whole stream follows from `seed`.
    pub fn new(seed: u64) -> SimRng {
        // SplitMix64 spreads the seed over the state.
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        SimRng { s: [next(), next(), next(), next()] }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let r = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        r
    }

    /// A uniform value in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// A uniform value in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi.saturating_sub(lo).saturating_add(1))
    }

    /// A uniform float in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.unit() < p
    }

    /// A uniform duration in `lo..=hi`.
    pub fn duration(&mut self, lo: Duration, hi: Duration) -> Duration {
        let lo_ns = lo.as_nanos() as u64;
        let hi_ns = (hi.as_nanos() as u64).max(lo_ns);
        Duration::from_nanos(self.range(lo_ns, hi_ns))
    }

    /// `n` random bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            v.extend_from_slice(&self.next_u64().to_le_bytes());
        }
        v.truncate(n);
        v
    }
}

/// How the simulated network misbehaves.
#[derive(Debug, Clone, PartialEq)]
pub struct SimConfig {
    /// Seed of everything random in the network.
    pub seed: u64,
    /// Probability that a packet is lost.
    pub loss: f64,
    /// Probability that a packet is delivered twice.
    pub duplicate: f64,
    /// Probability that a packet is held back so later ones overtake it.
    pub reorder: f64,
    /// Probability that one random byte of the encoded packet is flipped;
    /// the receiver's `Packet::new_checked` must refuse it.
    pub corrupt: f64,
    /// Shortest one-way delay.
    pub delay_min: Duration,
    /// Longest one-way delay (before any reordering delay).
    pub delay_max: Duration,
    /// Packets sent between these two times since the start are lost.
    pub partition: Option<(Duration, Duration)>,
}

impl Default for SimConfig {
    /// A perfect network with a fixed 50 µs delay.
    fn default() -> SimConfig {
        SimConfig {
            seed: 0,
            loss: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            corrupt: 0.0,
            delay_min: Duration::from_micros(50),
            delay_max: Duration::from_micros(50),
            partition: None,
        }
    }
}

impl SimConfig {
    /// Whether this network delivers every packet once, intact and in order.
    pub fn is_perfect(&self) -> bool {
        self.loss == 0.0
            && self.duplicate == 0.0
            && self.reorder == 0.0
            && self.corrupt == 0.0
            && self.delay_min == self.delay_max
            && self.partition.is_none()
    }
}

/// One of the two ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// The first session.
    A,
    /// The second session.
    B,
}

impl Side {
    /// 0 for A, 1 for B.
    pub fn index(self) -> usize {
        match self {
            Side::A => 0,
            Side::B => 1,
        }
    }

    /// The other end.
    pub fn other(self) -> Side {
        match self {
            Side::A => Side::B,
            Side::B => Side::A,
        }
    }
}

/// What the network did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetStats {
    /// Packets the sessions handed to the network.
    pub sent: u64,
    /// Packets handed to a session.
    pub delivered: u64,
    /// Packets lost at random.
    pub lost: u64,
    /// Packets lost to the partition.
    pub partitioned: u64,
    /// Extra copies made.
    pub duplicated: u64,
    /// Packets held back.
    pub reordered: u64,
    /// Packets with a flipped byte.
    pub corrupted: u64,
    /// Corrupted packets `Packet::new_checked` refused (all of them, or the
    /// run records a violation).
    pub corrupt_rejected: u64,
}

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Flight {
    at: Time,
    order: u64,
    to: usize,
    corrupted: bool,
    bytes: Vec<u8>,
}

/// Two sessions joined by a simulated network, with the message bytes the
/// I/O layer would keep (so `PayloadRef`s can be gathered).
#[derive(Debug)]
pub struct Sim {
    /// Virtual time.
    pub now: Time,
    start: Time,
    config: SimConfig,
    rng: SimRng,
    sessions: [Session; 2],
    /// Bytes of messages not yet reported Sent, by side and token.
    payloads: [HashMap<u64, Vec<u8>>; 2],
    next_token: u64,
    queue: BinaryHeap<Reverse<Flight>>,
    order: u64,
    /// Latest arrival scheduled towards each side, to keep links in order.
    last_arrival: [Time; 2],
    /// Events the sessions reported, in order, for the driver to take.
    pub events: VecDeque<(Side, Event)>,
    /// What the network did.
    pub net: NetStats,
    /// Broken rules the simulator itself can see (a corrupted packet that
    /// passed the checksum, a payload named after its Sent...).
    pub violations: Vec<String>,
}

impl Sim {
    /// A network joining two sessions that share `session` as their
    /// configuration; VI ids and keys are drawn from the seed.
    pub fn new(net: SimConfig, session: Config) -> Sim {
        Sim::with_configs(net, session.clone(), session)
    }

    /// Like [`Sim::new`], with a configuration per side.
    pub fn with_configs(net: SimConfig, a: Config, b: Config) -> Sim {
        let mut rng = SimRng::new(net.seed);
        let pa = Peer { vi: rng.next_u64() as u32, key: rng.next_u64() };
        let pb = Peer { vi: rng.next_u64() as u32, key: rng.next_u64() };
        let start = Time::default();
        Sim {
            now: start,
            start,
            sessions: [Session::new(a, pa, pb, start), Session::new(b, pb, pa, start)],
            config: net,
            rng,
            payloads: [HashMap::new(), HashMap::new()],
            next_token: 1,
            queue: BinaryHeap::new(),
            order: 0,
            last_arrival: [start; 2],
            events: VecDeque::new(),
            net: NetStats::default(),
            violations: Vec::new(),
        }
    }

    /// Time since the simulation started.
    pub fn elapsed(&self) -> Duration {
        self.now - self.start
    }

    /// The session of `side`.
    pub fn session(&self, side: Side) -> &Session {
        &self.sessions[side.index()]
    }

    /// The session of `side`, to call it directly (then call
    /// [`Sim::flush`]).
    pub fn session_mut(&mut self, side: Side) -> &mut Session {
        &mut self.sessions[side.index()]
    }

    /// The network's generator, for drivers that want their randomness
    /// from the same seed.
    pub fn rng(&mut self) -> &mut SimRng {
        &mut self.rng
    }

    /// Sends `data` from `side` as a message of `kind`, keeping the bytes
    /// for the packets that will name them; returns the message number.
    pub fn send(&mut self, side: Side, kind: MsgKind, imm: Option<u32>, data: Vec<u8>) -> Result<u32, SendError> {
        let token = self.next_token;
        self.next_token += 1;
        let msg = OutMessage { kind, len: data.len() as u32, imm, token };
        let n = self.sessions[side.index()].send(msg)?;
        self.payloads[side.index()].insert(token, data);
        self.flush();
        Ok(n)
    }

    /// Packets in the network.
    pub fn in_network(&self) -> usize {
        self.queue.len()
    }

    /// When something happens next: a packet arrives or a timer fires.
    pub fn next_time(&self) -> Option<Time> {
        let mut t = self.queue.peek().map(|f| f.0.at);
        for s in &self.sessions {
            if let Some(x) = s.poll_timeout() {
                t = Some(t.map_or(x, |t| t.min(x)));
            }
        }
        t
    }

    /// Moves time to `to` (never backwards) and runs what is due: arrivals
    /// in order, then timers.  Each input is followed by a flush, which
    /// holds owed acknowledgements while more arrivals are due (as a
    /// receiver with more input to take does) and sends them once none are.
    pub fn advance(&mut self, to: Time) {
        self.now = self.now.max(to);
        while self.queue.peek().is_some_and(|f| f.0.at <= self.now) {
            let Reverse(f) = self.queue.pop().expect("peeked");
            self.arrive(f);
            let busy = self.queue.peek().is_some_and(|f| f.0.at <= self.now);
            self.flush_as(busy);
        }
        for i in 0..2 {
            if self.sessions[i].poll_timeout().is_some_and(|t| t <= self.now) {
                self.sessions[i].handle_timeout(self.now);
                self.flush();
            }
        }
    }

    /// Takes every packet and event the sessions have ready.
    pub fn flush(&mut self) {
        self.flush_as(false);
    }

    /// [`Sim::flush`]; `busy`: more input is due, so owed acknowledgements wait.
    fn flush_as(&mut self, busy: bool) {
        for i in 0..2 {
            while let Some(t) = if busy {
                self.sessions[i].poll_transmit_busy(self.now)
            } else {
                self.sessions[i].poll_transmit(self.now)
            } {
                let payload = match t.payload {
                    None => Vec::new(),
                    Some(r) => match self.payloads[i].get(&r.token) {
                        Some(data) => {
                            let (o, l) = (r.offset as usize, r.len as usize);
                            match data.get(o..o + l) {
                                Some(bytes) => bytes.to_vec(),
                                None => {
                                    self.violations.push(format!("payload {r:?} outside its message"));
                                    Vec::new()
                                }
                            }
                        }
                        None => {
                            self.violations.push(format!("payload {r:?} named after its Sent"));
                            Vec::new()
                        }
                    },
                };
                let bytes = via_wire::encode(&t.header, &payload);
                self.transmit(i, bytes);
            }
            self.collect_events(i);
        }
    }

    /// Moves session `i`'s events to the log, in order.
    fn collect_events(&mut self, i: usize) {
        while let Some(e) = self.sessions[i].poll_event() {
            self.log_event(i, e);
        }
    }

    fn log_event(&mut self, i: usize, e: Event) {
        if let Event::Sent { token } = e {
            if self.payloads[i].remove(&token).is_none() {
                self.violations.push(format!("Sent for unknown token {token}"));
            }
        }
        let side = if i == 0 { Side::A } else { Side::B };
        self.events.push_back((side, e));
    }

    fn transmit(&mut self, from: usize, bytes: Vec<u8>) {
        self.net.sent += 1;
        if let Some((s, e)) = self.config.partition {
            let t = self.elapsed();
            if t >= s && t < e {
                self.net.partitioned += 1;
                return;
            }
        }
        if self.rng.chance(self.config.loss) {
            self.net.lost += 1;
            return;
        }
        let copies = if self.rng.chance(self.config.duplicate) {
            self.net.duplicated += 1;
            2
        } else {
            1
        };
        for _ in 0..copies {
            let delay = self.rng.duration(self.config.delay_min, self.config.delay_max);
            let mut at = self.now + delay;
            if self.rng.chance(self.config.reorder) {
                // Held back: later packets overtake it.
                self.net.reordered += 1;
                let extra = self.config.delay_max * 2 + Duration::from_micros(500);
                at += self.rng.duration(Duration::from_micros(1), extra);
            } else {
                // A link keeps its order: jitter alone never reorders.
                at = at.max(self.last_arrival[1 - from]);
                self.last_arrival[1 - from] = at;
            }
            let mut bytes = bytes.clone();
            let corrupted = self.rng.chance(self.config.corrupt);
            if corrupted {
                self.net.corrupted += 1;
                let i = self.rng.below(bytes.len() as u64) as usize;
                bytes[i] ^= self.rng.range(1, 255) as u8;
            }
            self.order += 1;
            self.queue.push(Reverse(Flight { at, order: self.order, to: 1 - from, corrupted, bytes }));
        }
    }

    fn arrive(&mut self, f: Flight) {
        let packet = match Packet::new_checked(&f.bytes[..]) {
            Ok(p) => p,
            Err(e) => {
                if f.corrupted {
                    self.net.corrupt_rejected += 1;
                } else {
                    self.violations.push(format!("intact packet refused: {e}"));
                }
                return;
            }
        };
        if f.corrupted {
            self.violations.push("corrupted packet passed the checksum".to_string());
            return;
        }
        let header = match Header::parse(&packet) {
            Ok(h) => h,
            Err(e) => {
                self.violations.push(format!("checked packet unparsable: {e}"));
                return;
            }
        };
        self.net.delivered += 1;
        // The in-place path, as the provider uses it: the returned segment
        // comes after the events already queued and before this call's.
        self.collect_events(f.to);
        let payload = packet.payload();
        if let Some(segment) = self.sessions[f.to].handle_packet_in_place(self.now, &header, payload) {
            self.log_event(f.to, segment.with_data(payload.to_vec()));
        }
        self.collect_events(f.to);
    }
}

/// A random exchange of messages both ways.
#[derive(Debug, Clone, PartialEq)]
pub struct Script {
    /// The network.
    pub net: SimConfig,
    /// Both sessions' configuration.
    pub session: Config,
    /// Messages each side sends.
    pub messages: usize,
    /// Send times are spread uniformly over this long from the start.
    pub spread: Duration,
    /// Give up (and report `stalled`) after this much virtual time.
    pub time_limit: Duration,
    /// Side A also sends RDMA read requests, which side B answers.
    pub rdma_reads: bool,
}

impl Script {
    /// A case drawn from `seed`: loss up to 20%, duplication, reordering,
    /// corruption, delay, and now and then a partition (short ones that a
    /// reliable session survives, and long ones that break it).
    pub fn random(seed: u64, reliable: bool) -> Script {
        let mut r = SimRng::new(seed ^ 0x5EED_0F5C_21F7_u64);
        let pick = |r: &mut SimRng, xs: &[f64]| xs[r.below(xs.len() as u64) as usize];
        let perfect = r.chance(0.2);
        let loss = if perfect { 0.0 } else { pick(&mut r, &[0.0, 0.01, 0.05, 0.1, 0.2]) };
        let duplicate = if perfect { 0.0 } else { pick(&mut r, &[0.0, 0.02, 0.1]) };
        let reorder = if perfect { 0.0 } else { pick(&mut r, &[0.0, 0.05, 0.2]) };
        let corrupt = if perfect { 0.0 } else { pick(&mut r, &[0.0, 0.01, 0.1]) };
        let delay_min = Duration::from_micros(r.range(0, 1000));
        let delay_max = if perfect { delay_min } else { delay_min + Duration::from_micros(r.range(0, 10_000)) };
        let partition = (!perfect && r.chance(0.15)).then(|| {
            let start = Duration::from_millis(r.range(0, 300));
            let len = if r.chance(0.5) {
                Duration::from_millis(r.range(10, 200))
            } else {
                Duration::from_secs(r.range(40, 60))
            };
            (start, start + len)
        });
        let max_payload = [1usize, 7, 64, 256, 1024, 1372][r.below(6) as usize];
        let window = [1u32, 2, 4, 16, 64, 256][r.below(6) as usize];
        let session = Config {
            reliable,
            max_payload,
            window,
            ack_every: r.range(1, 4) as u32,
            // With 20% loss and 10% corruption a round trip fails half the
            // time, and the default 10 retransmissions run out about once
            // in 15,000 runs; such a link needs more patience.  A long
            // partition still breaks the session.
            max_retransmits: 30,
            ..Config::default()
        };
        Script {
            net: SimConfig { seed, loss, duplicate, reorder, corrupt, delay_min, delay_max, partition },
            session,
            messages: r.range(1, 60) as usize,
            spread: Duration::from_millis(r.range(0, 200)),
            time_limit: Duration::from_secs(300),
            rdma_reads: reliable && r.chance(0.3),
        }
    }

    /// Whether a partition is long enough to break a reliable session.
    pub fn long_partition(&self) -> bool {
        self.net.partition.is_some_and(|(s, e)| e - s >= Duration::from_secs(5))
    }
}

/// What happened in a [`run`].
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The script's seed.
    pub seed: u64,
    /// Every message was sent, completed and delivered both ways
    /// (unreliable: sent, completed, and the network drained).
    pub completed: bool,
    /// Why each side broke, if it did.
    pub broken: [Option<BreakReason>; 2],
    /// Messages each side received whole.
    pub delivered: [usize; 2],
    /// Messages each side sent.
    pub sent: [usize; 2],
    /// `Sent` events each side reported.
    pub completions: [usize; 2],
    /// Virtual time the run took.
    pub elapsed: Duration,
    /// Time ran out with the sessions neither done nor broken.
    pub stalled: bool,
    /// Each session's counters at the end.
    pub stats: [Stats; 2],
    /// What the network did.
    pub net: NetStats,
    /// Every broken rule: wrong content, order, duplicates, partial
    /// messages, completions before delivery, corruption let through.
    pub violations: Vec<String>,
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "seed {}: completed={} broken={:?} sent={:?} delivered={:?} completions={:?} \
             elapsed={:?} stalled={} net={:?} violations={:?}",
            self.seed,
            self.completed,
            self.broken,
            self.sent,
            self.delivered,
            self.completions,
            self.elapsed,
            self.stalled,
            self.net,
            self.violations
        )
    }
}

/// A message as its sender sent it.
#[derive(Debug, Clone)]
struct Sent {
    kind: MsgKind,
    imm: Option<u32>,
    data: Vec<u8>,
}

/// A scripted send: when, what kind, immediate data, bytes.
type Planned = (Duration, MsgKind, Option<u32>, Vec<u8>);

/// What a receiver has of the message it is getting (reliable).
#[derive(Debug, Default)]
struct Partial {
    msg: u32,
    data: Vec<u8>,
}

/// Runs `script` and checks every delivery against what was sent.
pub fn run(script: &Script) -> Outcome {
    let mut sim = Sim::new(script.net.clone(), script.session.clone());
    let reliable = script.session.reliable;
    let max_len = 3 * script.session.max_payload.clamp(1, via_wire::MAX_PAYLOAD) + 7;

    // The plan: per side, (send time, kind, imm, bytes), from the seed.
    let mut plan: [VecDeque<Planned>; 2] = Default::default();
    for (side, p) in plan.iter_mut().enumerate() {
        let mut times: Vec<Duration> =
            (0..script.messages).map(|_| sim.rng().duration(Duration::ZERO, script.spread)).collect();
        times.sort();
        for t in times {
            let r = sim.rng();
            let len = r.below(max_len as u64 + 1) as usize;
            let data = r.bytes(len);
            let imm = r.chance(0.3).then(|| r.next_u64() as u32);
            let kind = match r.below(4) {
                0 | 1 => MsgKind::Send,
                2 => MsgKind::RdmaWrite { addr: r.next_u64(), handle: r.next_u64() as u32 },
                _ if script.rdma_reads && side == 0 => MsgKind::RdmaReadRequest {
                    addr: r.next_u64(),
                    handle: r.next_u64() as u32,
                    len: r.below(max_len as u64 + 1) as u32,
                },
                _ => MsgKind::Send,
            };
            let (imm, data) = match kind {
                MsgKind::RdmaReadRequest { .. } => (None, Vec::new()),
                _ => (imm, data),
            };
            p.push_back((t, kind, imm, data));
        }
    }

    // What each side sent, by message number - 1.
    let mut log: [Vec<Sent>; 2] = Default::default();
    let mut partial: [Partial; 2] = Default::default();
    let mut delivered = [0usize; 2];
    let mut last_unreliable = [0u32; 2];
    let mut completions = [0usize; 2];
    let mut broken: [Option<BreakReason>; 2] = [None, None];
    let mut violations: Vec<String> = Vec::new();
    // Read requests B received and still has to answer.
    let mut reads: VecDeque<(u32, u32)> = VecDeque::new();

    let limit = sim.now + script.time_limit;
    let mut same_instant = 0u32;
    let mut last_now = sim.now;
    let mut stalled = false;
    let mut completed = false;

    loop {
        // Scripted sends that are due.
        for side in [Side::A, Side::B] {
            let i = side.index();
            while plan[i].front().is_some_and(|p| p.0 <= sim.elapsed()) {
                let (_, kind, imm, data) = plan[i].pop_front().expect("checked");
                let entry = Sent { kind, imm, data: data.clone() };
                match sim.send(side, kind, imm, data) {
                    Ok(n) => {
                        if n as usize != log[i].len() + 1 {
                            violations.push(format!("{side:?}: message number {n} out of sequence"));
                        }
                        log[i].push(entry);
                    }
                    Err(SendError::Closed) => {}
                    Err(e) => violations.push(format!("{side:?}: send refused: {e}")),
                }
            }
        }
        // B answers read requests.
        while let Some((request, len)) = reads.pop_front() {
            let data = sim.rng().bytes(len as usize);
            let kind = MsgKind::RdmaReadResponse { request, status: 0 };
            if let Ok(n) = sim.send(Side::B, kind, None, data.clone()) {
                if n as usize != log[1].len() + 1 {
                    violations.push(format!("B: message number {n} out of sequence"));
                }
                log[1].push(Sent { kind, imm: None, data });
            }
        }

        // Check what happened.
        while let Some((side, e)) = sim.events.pop_front() {
            let i = side.index();
            let from = 1 - i;
            match e {
                Event::Sent { token: _ } => {
                    // Completions come in message order (reliable) and
                    // never before the peer has the whole message.
                    let k = completions[i];
                    completions[i] += 1;
                    if k >= log[i].len() {
                        violations.push(format!("{side:?}: Sent without a message"));
                    }
                    if reliable && delivered[from] < k + 1 {
                        violations.push(format!("{side:?}: message {} completed before the peer had it", k + 1));
                    }
                }
                Event::Broken(r) => {
                    if broken[i].is_some() {
                        violations.push(format!("{side:?}: broken twice"));
                    }
                    broken[i] = Some(r);
                }
                Event::Segment { kind, msg, offset, total, imm, first, last, data, .. } => {
                    let Some(sent) = log[from].get(msg.wrapping_sub(1) as usize).cloned() else {
                        violations.push(format!("{side:?}: message {msg} was never sent"));
                        continue;
                    };
                    let expect_total = match sent.kind {
                        MsgKind::RdmaReadRequest { .. } => 0,
                        _ => sent.data.len() as u32,
                    };
                    if kind != sent.kind || imm != sent.imm || total != expect_total {
                        violations.push(format!(
                            "{side:?}: message {msg} is {kind:?}/{imm:?}/{total}, \
                             sent as {:?}/{:?}/{expect_total}",
                            sent.kind, sent.imm
                        ));
                    }
                    if reliable {
                        let p = &mut partial[i];
                        let expect_msg = delivered[i] as u32 + 1;
                        if msg != expect_msg {
                            violations.push(format!("{side:?}: got message {msg}, expected {expect_msg}"));
                            continue;
                        }
                        if first != (p.msg != msg) || offset as usize != p.data.len() {
                            violations.push(format!(
                                "{side:?}: message {msg}: segment at {offset} (first={first}) \
                                 after {} bytes",
                                p.data.len()
                            ));
                        }
                        if first {
                            p.msg = msg;
                            p.data.clear();
                        }
                        p.data.extend_from_slice(&data);
                        if last {
                            if p.data != sent.data {
                                violations.push(format!("{side:?}: message {msg}: content differs"));
                            }
                            p.data.clear();
                            p.msg = 0;
                            delivered[i] += 1;
                            if let MsgKind::RdmaReadRequest { len, .. } = kind {
                                reads.push_back((msg, len));
                            }
                        }
                    } else {
                        if !(first && last && offset == 0) {
                            violations.push(format!("{side:?}: partial unreliable message {msg}"));
                        }
                        if msg <= last_unreliable[i] {
                            violations.push(format!(
                                "{side:?}: message {msg} after {} (duplicate or reordered)",
                                last_unreliable[i]
                            ));
                        }
                        last_unreliable[i] = msg;
                        if data != sent.data {
                            violations.push(format!("{side:?}: message {msg}: content differs"));
                        }
                        delivered[i] += 1;
                    }
                }
            }
        }

        // Done?
        let sent_all = plan[0].is_empty() && plan[1].is_empty() && reads.is_empty();
        let complete = sent_all
            && completions[0] == log[0].len()
            && completions[1] == log[1].len()
            && (!reliable || (delivered[1] == log[0].len() && delivered[0] == log[1].len()))
            && (reliable || sim.in_network() == 0);
        if complete && broken.iter().all(Option::is_none) {
            completed = true;
            break;
        }
        if broken.iter().all(Option::is_some) {
            break;
        }

        // Next thing to happen.
        let next_plan =
            plan.iter().filter_map(|p| p.front().map(|x| sim.now + x.0.saturating_sub(sim.elapsed()))).min();
        let next = match (sim.next_time(), next_plan) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => match a.or(b) {
                Some(t) => t,
                None => break,
            },
        };
        if next > limit {
            stalled = true;
            break;
        }
        if next <= last_now {
            same_instant += 1;
            if same_instant > 100_000 {
                violations.push("time does not advance: a timer keeps firing".to_string());
                stalled = true;
                break;
            }
        } else {
            same_instant = 0;
            last_now = next;
        }
        sim.advance(next);
    }

    violations.extend(sim.violations.iter().cloned());
    Outcome {
        seed: script.net.seed,
        completed,
        broken,
        delivered,
        sent: [log[0].len(), log[1].len()],
        completions,
        elapsed: sim.elapsed(),
        stalled,
        stats: [sim.session(Side::A).stats(), sim.session(Side::B).stats()],
        net: sim.net,
        violations,
    }
}
