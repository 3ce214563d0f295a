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
//!   its VIs, each a [`Session`](crate::Session), a
//!   [`FrameChoice`](crate::endpoint::FrameChoice) and the bytes of the
//!   messages it sends, handling packets as the provider's VI does
//!   (`hold_acks`, place, flush busy, release, report an owed
//!   acknowledgement), each VI id routed to its current connection.
//!
//! [`run`] draws a whole [`Case`] from a seed (`case.rs`): 2 to 4 hosts, up
//! to 6 reliable or unreliable connections between random (host, VI) pairs
//! with random VI ids and keys, messages both ways, faults, maybe the
//! death of one host, and maybe a VI pair that connects again: a
//! successor connection with the same hosts and VI ids and new keys,
//! started (soon) after the earlier one ended, by a disconnect of both
//! ends right after its last message was placed, of one end once it
//! completed, or by breaking.  [`NetSim`] (`mod.rs`) runs it: every host
//! polls its endpoint (reading everything, for an absent application, at
//! random) and runs its timers.  The run checks, as it goes (the VIs report what they
//! see inside a host, `check.rs` judges it and gives the [`Outcome`]):
//!
//! - reliable connections deliver every message exactly once, in order,
//!   whole, with its kind, immediate data and bytes; unreliable ones at most
//!   once, whole and in order;
//! - no packet acknowledges a sequence number whose data is not placed, and
//!   `Event::Sent` comes only once the peer placed the whole message;
//! - a misdirected packet is refused by its target's key check
//!   (`Stats::bad_key`) and never yields data there;
//! - when a VI connects again, every packet of its old connection that
//!   reaches the new session (held back, duplicated, its DISCONNECT:
//!   [`Outcome::stale`]) is refused by the key check and yields no data,
//!   completion nor break; the new connection delivers its own messages
//!   as above, and the old one places, completes and breaks nothing after
//!   the simulator ended it;
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

pub use case::{After, Case, ConnSpec, Handover, Planned};
pub use check::Outcome;
pub use datapath::SimDatapath;
pub use faults::{FaultInjector, Faults, Partition};
pub use host::HostVis;
pub use net::{Carried, NetConfig, NetStats, Origin, Outgoing, Path, SendSide, SimNet};

use crate::Time;
use std::time::Duration;

use crate::endpoint::{Endpoint, Tally};
use crate::sim::SimRng;
use crate::SendError;

use check::{ConnCheck, Ending, SentMsg};
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
                vis: HostVis {
                    now: net.now,
                    links: Vec::new(),
                    retired: Vec::new(),
                    out: HostOut::default(),
                    owed_acks: 0,
                },
                alive: true,
                wake: None,
            })
            .collect();
        // Every VI id a host will have; a successor's are its predecessor's.
        let mut vis: Vec<Vec<u32>> = vec![Vec::new(); case.hosts];
        for (conn, spec) in case.conns.iter().enumerate() {
            for side in 0..2 {
                let (host, local) = spec.ends[side];
                if !vis[host].contains(&local.vi) {
                    vis[host].push(local.vi);
                }
                if spec.after.is_none() {
                    hosts[host].vis.connect(Link::new(&case, conn, side, net.now, None));
                }
            }
        }
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
        self.start_successors();
        self.send_planned();
        self.run_timers();
        for h in 0..self.hosts.len() {
            if self.hosts[h].alive && self.hosts[h].wake.is_some_and(|t| t <= self.net.now) {
                self.hosts[h].wake = None;
                self.poll_host(h);
            }
        }
        self.succession();
    }

    /// For each connection that reuses an earlier one's VIs: ends the
    /// earlier one when its case says (disconnecting), and once both its
    /// ends are closed, sets when the successor starts.
    fn succession(&mut self) {
        for s in 0..self.conns.len() {
            let Some(after) = self.case.conns[s].after else { continue };
            if self.conns[s].started || self.conns[s].start_at.is_some() {
                continue;
            }
            self.end_predecessor(after.conn, after.handover);
            let closed = (0..2).all(|side| {
                let host = self.conns[after.conn].hosts[side];
                self.hosts[host].vis.link(after.conn, side).is_some_and(|l| l.session.is_closed())
            });
            if closed && self.conns[s].start_at.is_none() {
                self.conns[s].start_at = Some(self.net.elapsed() + after.delay);
            }
        }
    }

    /// Ends connection `p` by disconnecting, if its `handover` is due: it
    /// completed, or (`LastPlaced`) every message of it is placed.  Not
    /// one that broke, nor with a dead host: those end on their own, or
    /// never.
    fn end_predecessor(&mut self, p: usize, handover: Handover) {
        let c = &self.conns[p];
        if c.ended.is_some() || c.any_broken() || c.hosts.iter().any(|&h| !self.hosts[h].alive) {
            return;
        }
        let ending = match handover {
            Handover::LastPlaced if c.all_placed() => Ending::Both,
            Handover::Completed { by } if c.is_complete() => Ending::By(by),
            _ => return,
        };
        let c = &mut self.conns[p];
        c.ended = Some(ending);
        c.completed = true;
        let sides: &[usize] = match ending {
            Ending::Both => &[0, 1],
            Ending::By(by) => &[by][..],
        };
        let now = self.net.now;
        for &side in sides {
            let host = self.conns[p].hosts[side];
            let vis = &mut self.hosts[host].vis;
            vis.now = now;
            let link = vis.links.iter_mut().find(|l| l.conn == p && l.side == side).expect("the end is on its host");
            link.disconnect(now, &mut vis.out);
        }
        for &side in sides {
            self.settle(self.conns[p].hosts[side]);
        }
    }

    /// The successors due to start, on live hosts: new sessions, with new
    /// keys, that their VIs now route to.
    fn start_successors(&mut self) {
        let elapsed = self.net.elapsed();
        for s in 0..self.conns.len() {
            let c = &self.conns[s];
            let due = !c.started && c.start_at.is_some_and(|t| t <= elapsed);
            if !due || c.hosts.iter().any(|&h| !self.hosts[h].alive) {
                continue;
            }
            let after = self.case.conns[s].after.expect("a successor");
            for side in 0..2 {
                let (host, old) = self.case.conns[after.conn].ends[side];
                let link = Link::new(&self.case, s, side, self.net.now, Some(old.key));
                self.hosts[host].vis.connect(link);
            }
            let c = &mut self.conns[s];
            c.started = true;
            // Its plan's times count from its start.
            for p in c.plan.iter_mut().flatten() {
                p.0 += elapsed;
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
            if !self.conns[conn].started {
                continue;
            }
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
        // A connection that broke may have sends left when its VI connects
        // again: they go to its retired, closed session.
        let link = vis.links.iter_mut().chain(&mut vis.retired).find(|l| l.conn == conn && l.side == side);
        let result = link.expect("the end is on its host").send_message(now, kind, imm, data, &mut vis.out);
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
        // A predecessor ends right after its last message is placed.
        self.succession();
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
    fn next_time(&self) -> Option<Time> {
        let mut times: Vec<Time> = Vec::new();
        times.extend(self.net.next_arrival());
        if let (Some((_, at)), None) = (self.case.death, self.died) {
            times.push(self.net.now + at.saturating_sub(self.net.elapsed()));
        }
        let start = self.net.now - self.net.elapsed();
        for c in &self.conns {
            if !c.started {
                if c.hosts.iter().all(|&h| self.hosts[h].alive) {
                    times.extend(c.start_at.map(|t| start + t));
                }
                continue;
            }
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
