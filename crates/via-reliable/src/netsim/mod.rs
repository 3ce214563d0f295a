//! A deterministic simulation of whole ports: several hosts, each an
//! [`Endpoint`] carrying many sessions, joined by a simulated network, in
//! one thread with virtual time.
//!
//! Where [`crate::sim`] tests one connection, this tests what a port adds
//! around its sessions: routing by VI id, acknowledgements owed until a
//! poll finds the datapath empty, the read schedule, and frames that take a
//! faster path than datagrams.  Its layers follow the provider's, a file
//! each:
//!
//! - `net.rs`: [`SimNet`] carries packets (real bytes, `via_wire::encode`d)
//!   between up to [`MAX_HOSTS`] hosts, on two paths per host pair:
//!   datagrams, kept in order per pair, and frames, faster, so that a frame
//!   can overtake datagrams sent before it;
//! - `faults.rs`: [`FaultInjector`] sits on the send side and loses,
//!   duplicates, holds back (reorders), corrupts and misdirects packets (to
//!   another VI of the same host, re-checksummed, or to the wrong host), and
//!   partitions a host pair for a while;
//! - `datapath.rs`: [`SimDatapath`] is a host's
//!   [`Datapath`](crate::endpoint::Datapath): arrived frames, a queue per
//!   peer that has a path of its own, and a shared queue for the others;
//! - `host.rs`: [`HostVis`] is a host's [`Routes`](crate::endpoint::Routes):
//!   its VIs, each a [`Session`], a [`FrameChoice`] and the bytes of the
//!   messages it sends, handling packets as the provider's VI does
//!   (`hold_acks`, place, flush busy, release, report an owed
//!   acknowledgement).
//!
//! [`run`] draws a whole [`Case`] from a seed (`case.rs`): 2 to 4 hosts, up
//! to 6 reliable or unreliable connections between random (host, VI) pairs
//! with random VI ids and keys, messages both ways, faults, and maybe the
//! death of one host.  [`NetSim`] (`mod.rs`) runs it: every host polls its
//! endpoint (reading everything, for an absent application, at random) and
//! runs its timers.  The run checks, as it goes (the VIs report what they
//! see inside a host, `check.rs` judges it and gives the [`Outcome`]):
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

mod case;
mod check;
mod datapath;
mod faults;
mod host;
mod net;

pub use case::{Case, ConnSpec, Planned};
pub use check::Outcome;
pub use datapath::SimDatapath;
pub use faults::{FaultInjector, Faults, Partition};
pub use host::HostVis;
pub use net::{Carried, NetConfig, NetStats, Origin, Outgoing, Path, SendSide, SimNet};

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::endpoint::{Endpoint, FrameChoice, Tally};
use crate::sim::SimRng;
use crate::{Config, SendError, Session};

use check::{ConnCheck, SentMsg};
use host::{Host, HostOut, Link, Note};

/// Most hosts a case joins.
pub const MAX_HOSTS: usize = 4;

/// Virtual time after which a connection neither done nor broken stalled.
const TIME_LIMIT: Duration = Duration::from_secs(40);

/// Polls one wake-up may take before the host is deemed never idle.
const MAX_POLLS: usize = 10_000;

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
}

/// Draws the case of `seed`, runs it and checks it.
pub fn run(seed: u64) -> Outcome {
    NetSim::new(Case::random(seed)).run()
}
