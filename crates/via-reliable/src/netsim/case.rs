//! A whole case, drawn from a seed: hosts, delays, faults, sessions'
//! configuration, connections and what each end sends.

use std::fmt;
use std::time::Duration;

use super::faults::{Faults, Partition};
use super::net::NetConfig;
use super::MAX_HOSTS;
use crate::sim::SimRng;
use crate::{Config, MsgKind, Peer};

/// A scripted send: when, what kind, immediate data, bytes.
pub type Planned = (Duration, MsgKind, Option<u32>, Vec<u8>);

/// How a connection's predecessor ends, so that its VIs can connect again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handover {
    /// Once it completed, end `by` disconnects; the other end breaks on
    /// the DISCONNECT (or, if that is lost, when it hears nothing more).
    Completed {
        /// The end that disconnects.
        by: usize,
    },
    /// Both ends disconnect as soon as every message is placed, some of
    /// them still unacknowledged: the most packets still on their way.
    LastPlaced,
}

/// A connection that reuses an earlier one's VIs, as a provider's VI may
/// connect again after its connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct After {
    /// The earlier connection, by index.
    pub conn: usize,
    /// How it ends.
    pub handover: Handover,
    /// How long after both its ends are closed this one starts.
    pub delay: Duration,
}

/// One connection of a case.
#[derive(Debug, Clone)]
pub struct ConnSpec {
    /// Each end: its host and identity.
    pub ends: [(usize, Peer); 2],
    /// Reliable or unreliable sessions.
    pub reliable: bool,
    /// The hosts share a link: packets may go as frames.
    pub frames: bool,
    /// What each end sends, in time order (for a successor, from its
    /// start).
    pub plan: [Vec<Planned>; 2],
    /// The connection whose VIs it reuses: it starts once that one ended.
    pub after: Option<After>,
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
        let mut case = Case {
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
        };
        // Drawn last, so that the rest of the case is the same with or
        // without it.
        if r.chance(0.2) {
            let successor = random_successor(&mut r, &case.conns, &case.net, max_payload);
            case.conns.push(successor);
        }
        case
    }

    /// The partition, if it separates the ends of `conn` long enough to
    /// break it.
    pub(super) fn long_partition(&self, conn: &ConnSpec) -> bool {
        self.faults.partition.is_some_and(|p| p.is_long() && p.between(conn.ends[0].0, conn.ends[1].0))
    }
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let conns: Vec<String> = self
            .conns
            .iter()
            .map(|c| {
                let after = match c.after {
                    None => String::new(),
                    Some(a) => format!(" after conn {} ({:?}, +{:?})", a.conn, a.handover, a.delay),
                };
                format!(
                    "{}:{}<->{}:{}{}{} msgs {}/{}{after}",
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
        conns.push(ConnSpec { ends, reliable, frames, plan, after: None });
    }
    conns
}

/// A connection between the VIs of one of `conns`, with new keys, that
/// starts once that one ended: soon after, so that packets of the old one
/// (held back, duplicated, or its DISCONNECTs) still reach the new
/// sessions, whose key check must refuse them.
fn random_successor(r: &mut SimRng, conns: &[ConnSpec], net: &NetConfig, max_payload: usize) -> ConnSpec {
    let conn = r.below(conns.len() as u64) as usize;
    let old = &conns[conn];
    let ends = old.ends.map(|(host, peer)| (host, Peer { vi: peer.vi, key: r.next_u64() }));
    // An unreliable connection may lose its last message: it has no
    // moment at which every message is placed.
    let handover = if old.reliable && r.chance(0.6) {
        Handover::LastPlaced
    } else {
        Handover::Completed { by: r.below(2) as usize }
    };
    let delay = if r.chance(0.4) { Duration::ZERO } else { r.duration(Duration::ZERO, net.delay_max) };
    let spread = Duration::from_millis(r.range(0, 150));
    let plan = [random_plan(r, max_payload, spread), random_plan(r, max_payload, spread)];
    ConnSpec { ends, reliable: old.reliable, frames: old.frames, plan, after: Some(After { conn, handover, delay }) }
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
