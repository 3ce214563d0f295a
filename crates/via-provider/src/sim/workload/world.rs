//! A plan carried out over the simulator: every host's NIC, tag, CQ and
//! error log, every VI pair's two ends with their memory, and what each
//! end's work queues hold; each completion is judged as it is reaped.

use super::memory::{first_difference, first_not, status_str, Desc, Region, DESC_STRIDE, ERRBITS, STATUS_OP_BITS};
use super::plan::*;
use super::Inject;
use crate::clock::simulated;
use crate::cq::Cq;
use crate::handles::Handle;
use crate::lane::CqEntry;
use crate::nic::{ErrorEvent, Nic};
use crate::sim::Sim;
use crate::tuning::CqMode;
use crate::vi::{Vi, ViAttrs, ViState};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};
use via_core::consts::*;
use via_core::descriptor::DescPtr;
use via_core::error::ViaError;
use via_core::registry::{REGION_RDMA_READ, REGION_RDMA_WRITE};
use via_reliable::netsim::NetStats;
use via_reliable::sim::SimRng;

/// What untouched bytes hold.
const JUNK: u8 = 0xA5;
/// Descriptors and buffers of an end: send slots, then receive slots.
const SEND_SLOTS: usize = 8;
const RECV_SLOTS: usize = 16;
/// One slot's buffer: the largest message, its slack and a guard.
const SLOT_BYTES: usize = 68 << 10;
const _: () = assert!(SLOT_BYTES >= (MAX_SEND + MAX_SLACK) as usize + GUARD);
/// An end's data region: send sources and read places, receive buffers,
/// the area the peer writes, the area the peer reads.
const SEND_AREA: usize = 0;
const RECV_AREA: usize = SEND_AREA + SEND_SLOTS * SLOT_BYTES;
const RDMA_AREA: usize = RECV_AREA + RECV_SLOTS * SLOT_BYTES;
const READ_AREA: usize = RDMA_AREA + RDMA_BYTES;
const DATA_BYTES: usize = READ_AREA + READ_BYTES;
const _: () = assert!(DATA_BYTES.is_multiple_of(4096), "the read area ends the registered region");
/// Mapped past the data region, registered nowhere: room for the part of
/// a refused write past the region's end.
const TAIL_BYTES: usize = MAX_RDMA as usize + GUARD;
/// The room of a receive in a lossy seed: whatever message comes.
const LOSSY_ROOM: u32 = MAX_SEND + MAX_SLACK;
/// The room of a receive left posted at the ending.
const LEFT_ROOM: u32 = 4096;
/// Bytes of the send a disruption's survivor posts.
const PROBE_LEN: u32 = 1000;
/// Virtual time a wait may take before it counts as a hang.
const WAIT_LIMIT: Duration = Duration::from_secs(60);
/// Lossy seeds: how long the network must be quiet before a round is over
/// (far past its longest delay, a held-back packet included).
const QUIET: Duration = Duration::from_millis(100);
/// Real time the error callbacks (run on the provider's helper thread) may take.
const REPORT_WAIT: Duration = Duration::from_secs(5);
/// Kept apart from the plan's stream of the same seed.
const READ_STREAM: u64 = 0x5EAD_5EAD_0000_0000;
/// The stream that picks the waits, apart from the plan's too.
const WAIT_STREAM: u64 = 0x3A17_3A17_0000_0000;
/// Of the times the world would step with nothing reaped, the share (in
/// 1/256) that it waits instead, blocked in `VipSendWait`, `VipRecvWait`
/// or `VipCQWait` while the simulation goes on.
const WAIT_SHARE: u64 = 64;
/// The timeouts a wait is given, in milliseconds.
const WAIT_TIMEOUTS: [u64; 5] = [0, 1, 5, 20, 200];

/// What one seed did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Summary {
    /// Virtual time it took.
    pub elapsed: Duration,
    /// What the network did.
    pub stats: NetStats,
    /// Descriptors completed and judged.
    pub completions: u64,
    /// Whether its VIs connected again after the ending.
    pub again: bool,
    /// Waits (`VipSendWait`, `VipRecvWait`, `VipCQWait`) made, and how
    /// many of them ended at their timeout.
    pub waits: u64,
    pub timeouts: u64,
    /// CQ entries reaped from hosts whose CQs scan the work queues (CQ2).
    pub scanned_entries: u64,
    /// Whether a host declined the payload CRC.
    pub declined_crc: bool,
    /// Connections made over shared memory, and of those through the ring
    /// (from the start, or one side from a moment on).
    pub local_links: u64,
    pub ring_links: u64,
}

struct Host {
    nic: Arc<Nic>,
    ptag: Handle,
    cq: Option<Arc<Cq>>,
    reports: Arc<Mutex<Vec<ErrorEvent>>>,
    dead: bool,
}

/// What a posted descriptor must complete with.
#[derive(Debug, Clone, Copy)]
enum Expect {
    /// Op `op` of round `round`: on the send queue of its initiator, or the
    /// receive it consumes at its target.
    Op { round: usize, op: usize },
    /// A lossy seed's receive: any message sent to this end after the last
    /// one received, or none.
    AnyMessage,
    /// Flushed by a disconnect or a broken connection.
    Flushed(&'static str),
    /// A send posted once the peer is gone.
    Probe,
}

struct Posted {
    desc: Desc,
    slot: usize,
    /// A receive's room (0 for a send).
    room: u32,
    expect: Expect,
}

/// One end of a VI pair.
struct End {
    host: usize,
    vi: Arc<Vi>,
    data: Region,
    descs: Region,
    /// Registered without the access a refused RDMA operation lacks.
    closed: Region,
    /// What its read area holds.
    read_area: Vec<u8>,
    /// Posted and not yet reaped, oldest first.
    sends: VecDeque<Posted>,
    recvs: VecDeque<Posted>,
    free_send: Vec<usize>,
    free_recv: Vec<usize>,
    /// Lossy seeds: the messages sent to it (round, op) in order, and the
    /// first of them that may still arrive.
    inbound: Vec<(usize, usize)>,
    next_inbound: usize,
    /// Its connection broke or must break: it ends in the error state.
    broken: bool,
}

impl End {
    fn send_desc(&self, slot: usize) -> Desc {
        Desc(self.descs.addr(slot * DESC_STRIDE) as usize)
    }

    fn recv_desc(&self, slot: usize) -> Desc {
        Desc(self.descs.addr((SEND_SLOTS + slot) * DESC_STRIDE) as usize)
    }
}

fn send_off(slot: usize) -> usize {
    SEND_AREA + slot * SLOT_BYTES
}

fn recv_off(slot: usize) -> usize {
    RECV_AREA + slot * SLOT_BYTES
}

/// The seed's world.  The simulator goes first when it is dropped: its
/// NICs close (flushing into descriptors that are still there) before the
/// memory is deregistered and freed.
pub(super) struct World<'p> {
    sim: Sim,
    plan: &'p Plan,
    inject: Inject,
    hosts: Vec<Host>,
    ends: Vec<[End; 2]>,
    /// Error callbacks that must come: host, VI, code, why.
    reports: Vec<(usize, Handle, u32, String)>,
    completions: u64,
    again: bool,
    /// Picks when and on what the world waits.
    wait_rng: SimRng,
    waits: u64,
    timeouts: u64,
    scanned_entries: u64,
}

impl<'p> World<'p> {
    /// The hosts, their VIs connected in pairs, their memory registered.
    pub fn new(plan: &'p Plan, inject: Inject) -> Result<World<'p>, String> {
        let sim = Sim::new(plan.seed, plan.hosts, plan.faults.clone());
        let mut hosts = Vec::new();
        for h in 0..plan.hosts {
            let nic = sim.nic(h).clone();
            let ptag = nic.create_ptag().map_err(|e| format!("host {h}: VipCreatePtag: {e:?}"))?;
            let cq = match plan.shared_cq[h] {
                true => Some(
                    Cq::create(&nic, 256)
                        .and_then(|h| Cq::get_in(&nic.provider, h))
                        .map_err(|e| format!("host {h}: VipCreateCQ: {e:?}"))?,
                ),
                false => None,
            };
            let reports = Arc::new(Mutex::new(Vec::new()));
            let log = reports.clone();
            nic.set_error_handler(Some(Arc::new(move |e: &ErrorEvent| log.lock().push(*e))));
            hosts.push(Host { nic, ptag, cq, reports, dead: false });
        }
        let mut flags = 0;
        if plan.rdma_write {
            flags |= REGION_RDMA_WRITE;
        }
        if plan.rdma_read {
            flags |= REGION_RDMA_READ;
        }
        // Only the access a refused operation needs is missing there.
        let closed_flags = match plan.breaking_op().map(|(k, i)| plan.rounds[k][i].kind) {
            Some(Kind::Read) => flags & !REGION_RDMA_READ,
            _ => flags & !REGION_RDMA_WRITE,
        };
        let mut ends = Vec::new();
        for (p, &(a, b)) in plan.pairs.iter().enumerate() {
            let mut pair = Vec::new();
            for (side, h) in [a, b].into_iter().enumerate() {
                let host = &hosts[h];
                let what = format!("pair {p} end {side} (host {h})");
                let attrs = ViAttrs {
                    reliability: plan.level,
                    max_transfer: limits::MAX_TRANSFER_SIZE,
                    ptag: host.ptag,
                    rdma_write: plan.rdma_write,
                    rdma_read: plan.rdma_read,
                };
                let vi = Vi::create(&host.nic, attrs, None, host.cq.clone())
                    .and_then(|h| Vi::get_in(&host.nic.provider, h))
                    .map_err(|e| format!("{what}: VipCreateVi: {e:?}"))?;
                let tag = host.nic.ptag(host.ptag).map_err(|e| format!("{what}: its tag: {e:?}"))?.id;
                let data =
                    Region::new(&host.nic, DATA_BYTES, TAIL_BYTES, tag, flags).map_err(|e| format!("{what}: {e}"))?;
                let descs = Region::new(&host.nic, (SEND_SLOTS + RECV_SLOTS) * DESC_STRIDE, 0, tag, 0)
                    .map_err(|e| format!("{what}: {e}"))?;
                let closed =
                    Region::new(&host.nic, CLOSED_BYTES, 0, tag, closed_flags).map_err(|e| format!("{what}: {e}"))?;
                // Without reads too: a refused write past the region's end begins there.
                let read_area = SimRng::new(plan.seed ^ READ_STREAM ^ (2 * p + side) as u64).bytes(READ_BYTES);
                data.write(READ_AREA, &read_area);
                data.fill(DATA_BYTES, TAIL_BYTES, JUNK);
                closed.fill(0, CLOSED_BYTES, JUNK);
                pair.push(End {
                    host: h,
                    vi,
                    data,
                    descs,
                    closed,
                    read_area,
                    sends: VecDeque::new(),
                    recvs: VecDeque::new(),
                    free_send: (0..SEND_SLOTS).rev().collect(),
                    free_recv: (0..RECV_SLOTS).rev().collect(),
                    inbound: Vec::new(),
                    next_inbound: 0,
                    broken: false,
                });
            }
            let [e0, e1]: [End; 2] = pair.try_into().ok().expect("two ends");
            ends.push([e0, e1]);
        }
        let mut world = World {
            sim,
            plan,
            inject,
            hosts,
            ends,
            reports: Vec::new(),
            completions: 0,
            again: false,
            wait_rng: SimRng::new(plan.seed ^ WAIT_STREAM),
            waits: 0,
            timeouts: 0,
            scanned_entries: 0,
        };
        for p in 0..world.ends.len() {
            let [a, b] = &world.ends[p];
            world.sim.connect(&a.vi, &b.vi).map_err(|e| format!("pair {p}: connecting: {e:?}"))?;
            for s in 0..2 {
                world.check_state(p, s, ViState::Connected, "once connected")?;
            }
        }
        Ok(world)
    }

    // ---- naming things in messages ----------------------------------------------------

    fn end_name(&self, p: usize, s: usize) -> String {
        let e = &self.ends[p][s];
        format!("pair {p} end {s} (host {}, VI {})", e.host, e.vi.handle)
    }

    fn op_name(&self, k: usize, i: usize) -> String {
        let refused = match self.plan.breaking {
            Some(Breaking::Refused { why, .. }) if self.plan.is_breaking(k, i) => format!(", refused: {why:?}"),
            _ => String::new(),
        };
        format!("round {k} op {i} ({}{refused})", self.plan.rounds[k][i])
    }

    fn live(&self, p: usize, s: usize) -> bool {
        !self.hosts[self.ends[p][s].host].dead
    }

    fn check_state(&self, p: usize, s: usize, want: ViState, when: &str) -> Result<(), String> {
        let got = self.ends[p][s].vi.state();
        match got == want {
            true => Ok(()),
            false => Err(format!("{}: state {got:?} {when}, expected {want:?}", self.end_name(p, s))),
        }
    }

    /// What is still awaited, for a message about a hang.
    fn pending(&self) -> String {
        let mut out = Vec::new();
        for p in 0..self.ends.len() {
            for s in 0..2 {
                let e = &self.ends[p][s];
                if !self.live(p, s) || (e.sends.is_empty() && e.recvs.is_empty() && !e.broken) {
                    continue;
                }
                let show =
                    |q: &VecDeque<Posted>| q.iter().map(|x| format!("{:?}", x.expect)).collect::<Vec<_>>().join(", ");
                out.push(format!(
                    "{}: {:?}{}, sends [{}], receives [{}]",
                    self.end_name(p, s),
                    e.vi.state(),
                    if e.broken { " (must reach Error)" } else { "" },
                    show(&e.sends),
                    show(&e.recvs)
                ));
            }
        }
        out.join("; ")
    }

    // ---- posting --------------------------------------------------------------------------

    /// Posts a receive of `room` bytes in `segs` segments on end (p, s).
    fn post_recv(&mut self, p: usize, s: usize, room: u32, segs: u32, expect: Expect) -> Result<(), String> {
        let name = self.end_name(p, s);
        let e = &mut self.ends[p][s];
        let slot = e.free_recv.pop().ok_or_else(|| format!("{name}: out of receive slots"))?;
        let (d, off) = (e.recv_desc(slot), recv_off(slot));
        e.data.fill(off, room as usize + GUARD, JUNK);
        let segs = segs.min(room);
        d.control(0, segs as usize, 0, 0);
        if segs > 0 {
            d.split(0, e.data.addr(off), e.data.mem, room, segs);
        }
        e.vi.post_recv(d.ptr(), e.descs.mem).map_err(|err| format!("{name}: VipPostRecv ({expect:?}): {err:?}"))?;
        e.recvs.push_back(Posted { desc: d, slot, room, expect });
        Ok(())
    }

    /// Posts op `i` of round `k` on its initiator's send queue.
    fn post_op(&mut self, k: usize, i: usize) -> Result<(), String> {
        let op = &self.plan.rounds[k][i];
        let (p, s) = (op.pair, op.from);
        let (read_at, write_at) = (READ_AREA as u64 + op.target as u64, RDMA_AREA as u64 + op.target as u64);
        let (read_at, write_at, peer_base, peer_mem) = {
            let peer = &self.ends[p][1 - s];
            match self.plan.breaking {
                Some(Breaking::Refused { why, .. }) if self.plan.is_breaking(k, i) => match why {
                    Forbidden::NotEnabled => (read_at, write_at, peer.data.addr(0), peer.data.mem),
                    Forbidden::Closed => (op.target as u64, op.target as u64, peer.closed.addr(0), peer.closed.mem),
                    Forbidden::PastEnd => (read_at, read_at, peer.data.addr(0), peer.data.mem),
                    Forbidden::WrongHandle => (read_at, write_at, peer.data.addr(0), peer.data.mem ^ FORGED),
                },
                _ => (read_at, write_at, peer.data.addr(0), peer.data.mem),
            }
        };
        let what = format!("{}: {}", self.end_name(p, s), self.op_name(k, i));
        let e = &mut self.ends[p][s];
        let slot = e.free_send.pop().ok_or_else(|| format!("{what}: out of send slots"))?;
        let (d, off) = (e.send_desc(slot), send_off(slot));
        let (src, mem) = (e.data.addr(off), e.data.mem);
        let imm = op.immediate.unwrap_or(0);
        let imm_bit = if op.immediate.is_some() { CONTROL_IMMEDIATE } else { 0 };
        match op.kind {
            Kind::Read => {
                e.data.fill(off, op.len as usize + GUARD, JUNK);
                d.control(CONTROL_OP_RDMAREAD, op.nseg as usize + 1, 0, op.len);
                d.segment(0, peer_base + read_at, peer_mem, 0);
                d.split(1, src, mem, op.len, op.nseg);
            }
            Kind::Write | Kind::WriteImm => {
                e.data.write(off, &op.data);
                d.control(CONTROL_OP_RDMAWRITE | imm_bit, op.nseg as usize + 1, imm, op.len);
                d.segment(0, peer_base + write_at, peer_mem, 0);
                d.split(1, src, mem, op.len, op.nseg);
            }
            Kind::Send => {
                e.data.write(off, &op.data);
                d.control(imm_bit, op.nseg as usize, imm, op.len);
                if op.nseg > 0 {
                    d.split(0, src, mem, op.len, op.nseg);
                }
            }
        }
        e.vi.post_send(d.ptr(), e.descs.mem).map_err(|err| format!("{what}: VipPostSend: {err:?}"))?;
        e.sends.push_back(Posted { desc: d, slot, room: 0, expect: Expect::Op { round: k, op: i } });
        Ok(())
    }

    // ---- reaping and judging ----------------------------------------------------------------

    /// Reaps every completion there is now, judging each; returns whether
    /// there was any.
    fn poll(&mut self) -> Result<bool, String> {
        let mut reaped = false;
        for p in 0..self.ends.len() {
            for s in 0..2 {
                if !self.live(p, s) {
                    continue;
                }
                while let Some(d) =
                    done(self.ends[p][s].vi.send_done(), || format!("{}: VipSendDone", self.end_name(p, s)))?
                {
                    self.judge(p, s, false, d)?;
                    reaped = true;
                }
                if self.hosts[self.ends[p][s].host].cq.is_none() {
                    while let Some(d) =
                        done(self.ends[p][s].vi.recv_done(), || format!("{}: VipRecvDone", self.end_name(p, s)))?
                    {
                        self.judge(p, s, true, d)?;
                        reaped = true;
                    }
                }
            }
        }
        for h in 0..self.hosts.len() {
            let Some(cq) = self.hosts[h].cq.clone().filter(|_| !self.hosts[h].dead) else { continue };
            while let Some(entry) = done(cq.done(), || format!("host {h}: VipCQDone"))? {
                reaped = true;
                self.reap_cq_entry(h, entry)?;
            }
        }
        Ok(reaped)
    }

    /// Host `h`'s CQ named `entry`: the receive it names is reaped.
    fn reap_cq_entry(&mut self, h: usize, entry: CqEntry) -> Result<(), String> {
        let found = (0..self.ends.len())
            .flat_map(|p| [(p, 0), (p, 1)])
            .find(|&(p, s)| self.ends[p][s].host == h && self.ends[p][s].vi.handle == entry.vi);
        let Some((p, s)) = found else {
            return Err(format!("host {h}: the CQ named VI {}, none of this host's", entry.vi));
        };
        if !entry.recv {
            return Err(format!("{}: a CQ entry for the send queue, which has no CQ", self.end_name(p, s)));
        }
        if self.hosts[h].nic.tuning.cq == CqMode::Scan {
            self.scanned_entries += 1;
        }
        // The entry comes once the descriptor is complete: *Done has it now.
        match done(self.ends[p][s].vi.recv_done(), || format!("{}: VipRecvDone", self.end_name(p, s)))? {
            Some(d) => self.judge(p, s, true, d),
            None => Err(format!(
                "{}: the CQ named this VI's receive queue, and VipRecvDone then found nothing",
                self.end_name(p, s)
            )),
        }
    }

    /// Now and then, where the world would step with nothing reaped, it
    /// waits instead: in `VipSendWait` or `VipRecvWait` on an end with
    /// descriptors pending there, or in `VipCQWait` on a host whose CQ
    /// has receives pending, with a timeout; the wait moves the
    /// simulation on where it would sleep.  What it returns is judged; a
    /// timeout must come no sooner than asked.  Returns whether it waited.
    fn wait_somewhere(&mut self) -> Result<bool, String> {
        if self.wait_rng.below(256) >= WAIT_SHARE {
            return Ok(false);
        }
        // (pair, side, receive queue) of each end with something pending.
        let pending: Vec<(usize, usize, bool)> = (0..self.ends.len())
            .flat_map(|p| [(p, 0), (p, 1)])
            .filter(|&(p, s)| self.live(p, s))
            .flat_map(|(p, s)| {
                let e = &self.ends[p][s];
                [(!e.sends.is_empty()).then_some((p, s, false)), (!e.recvs.is_empty()).then_some((p, s, true))]
            })
            .flatten()
            .collect();
        if pending.is_empty() {
            return Ok(false);
        }
        let (p, s, recv) = pending[self.wait_rng.below(pending.len() as u64) as usize];
        let timeout_ms = WAIT_TIMEOUTS[self.wait_rng.below(WAIT_TIMEOUTS.len() as u64) as usize];
        let h = self.ends[p][s].host;
        let vi = self.ends[p][s].vi.clone();
        let cq = self.hosts[h].cq.clone().filter(|_| recv);
        let began = self.sim.elapsed();
        self.waits += 1;
        let sim = &mut self.sim;
        let mut step = |nap| sim.step_within(Some(nap));
        let (call, got) = match (&cq, recv) {
            (Some(cq), _) => {
                let got = simulated::stepping(&mut step, || cq.wait(timeout_ms));
                (format!("host {h}: VipCQWait({timeout_ms})"), got.map(Waited::Entry))
            }
            (None, true) => {
                let got = simulated::stepping(&mut step, || vi.recv_wait(timeout_ms));
                (format!("{}: VipRecvWait({timeout_ms})", self.end_name(p, s)), got.map(Waited::Recv))
            }
            (None, false) => {
                let got = simulated::stepping(&mut step, || vi.send_wait(timeout_ms));
                (format!("{}: VipSendWait({timeout_ms})", self.end_name(p, s)), got.map(Waited::Send))
            }
        };
        let waited = self.sim.elapsed() - began;
        match got {
            Ok(Waited::Entry(entry)) => self.reap_cq_entry(h, entry)?,
            Ok(Waited::Recv(d)) => self.judge(p, s, true, d)?,
            Ok(Waited::Send(d)) => self.judge(p, s, false, d)?,
            Err(ViaError::Timeout) if waited >= Duration::from_millis(timeout_ms) => self.timeouts += 1,
            Err(ViaError::Timeout) => return Err(format!("{call}: VIP_TIMEOUT after {waited:?} of virtual time")),
            Err(e) => return Err(format!("{call}: {e:?}")),
        }
        Ok(true)
    }

    /// Moves the world on until `finished`, reaping as it goes; fails after
    /// `WAIT_LIMIT` of virtual time.
    fn drive(&mut self, what: &str, finished: impl Fn(&Self) -> bool) -> Result<(), String> {
        let limit = self.sim.elapsed() + WAIT_LIMIT;
        loop {
            let reaped = self.poll()?;
            if finished(self) {
                return Ok(());
            }
            if self.sim.elapsed() > limit {
                return Err(format!(
                    "{what}: still waiting after {WAIT_LIMIT:?} of virtual time (now {:?}): {}",
                    self.sim.elapsed(),
                    self.pending()
                ));
            }
            if !reaped && !self.wait_somewhere()? {
                self.sim.step();
            }
        }
    }

    /// Every live end's queues are empty (but for a lossy seed's receives)
    /// and every broken one is in the error state.
    fn settled(&self) -> bool {
        (0..self.ends.len()).flat_map(|p| [(p, 0), (p, 1)]).filter(|&(p, s)| self.live(p, s)).all(|(p, s)| {
            let e = &self.ends[p][s];
            // A lossy seed's receives wait for messages that may never come.
            let waiting = e.recvs.iter().any(|r| !matches!(r.expect, Expect::AnyMessage));
            e.sends.is_empty() && !waiting && (!e.broken || e.vi.state() != ViState::Connected)
        })
    }

    /// A descriptor that end (p, s) reaped from its send or receive queue:
    /// the oldest posted there, completed as it must be.
    fn judge(&mut self, p: usize, s: usize, recv: bool, got: DescPtr) -> Result<(), String> {
        let queue = if recv { "VipRecvDone" } else { "VipSendDone" };
        let name = self.end_name(p, s);
        let e = &mut self.ends[p][s];
        let q = if recv { &mut e.recvs } else { &mut e.sends };
        let Some(posted) = q.pop_front() else {
            return Err(format!("{name}: {queue} returned descriptor 0x{:x} with none posted", got.0));
        };
        if posted.desc.0 != got.0 {
            return Err(format!(
                "{name}: {queue} returned descriptor 0x{:x}, expected 0x{:x} ({:?}), the oldest posted",
                got.0, posted.desc.0, posted.expect
            ));
        }
        if recv {
            e.free_recv.push(posted.slot);
        } else {
            e.free_send.push(posted.slot);
        }
        self.completions += 1;
        let d = posted.desc;
        let status = d.status();
        if status & STATUS_DONE == 0 {
            return Err(format!(
                "{name}: {queue} returned a descriptor whose status {} lacks DONE",
                status_str(status)
            ));
        }
        let what = |w: &World| match posted.expect {
            Expect::Op { round, op } => format!("{name}: {queue}: {}", w.op_name(round, op)),
            other => format!("{name}: {queue}: {other:?}"),
        };
        let result = match (posted.expect, recv) {
            (Expect::Op { round, op }, false) => self.judge_sent(p, s, round, op, posted.slot, d),
            (Expect::Op { round, op }, true) => self.judge_received(p, s, round, op, posted.slot, d),
            (Expect::AnyMessage, _) => self.judge_any_message(p, s, posted.slot, d),
            (Expect::Flushed(why), _) => errbits(d, STATUS_DONE | STATUS_DESC_FLUSHED_ERROR)
                .and_then(|()| self.untouched(p, s, recv_off(posted.slot), posted.room as usize + GUARD))
                .map_err(|e| format!("{e}: it must be flushed, {why}")),
            (Expect::Probe, _) if self.plan.reliable() => errbits(d, STATUS_DONE | STATUS_DESC_FLUSHED_ERROR),
            (Expect::Probe, _) => exact(d, STATUS_DONE | STATUS_OP_SEND, PROBE_LEN),
        };
        result.map_err(|why| format!("{}: {why}", what(self)))
    }

    /// The completion of op `i` of round `k` at its initiator (p, s).
    fn judge_sent(&mut self, p: usize, s: usize, k: usize, i: usize, slot: usize, d: Desc) -> Result<(), String> {
        let plan = self.plan;
        let op = &plan.rounds[k][i];
        if let (Some(Breaking::Refused { .. }), true) = (plan.breaking, plan.is_breaking(k, i)) {
            // At every level (notes/contract.md, "Forbidden RDMA write").
            errbits(d, STATUS_DONE | STATUS_RDMA_PROT_ERROR)?;
            if op.kind == Kind::Read {
                // Nothing came (tests/c/crossuser.c checks the length too).
                if d.length() != 0 {
                    return Err(format!("length {}, expected 0: a refused read", d.length()));
                }
                let e = &self.ends[p][s];
                if let Some(diff) = first_not(JUNK, e.data.bytes(send_off(slot), op.len as usize + GUARD)) {
                    return Err(format!("a refused read brought bytes: {diff}"));
                }
            }
            return Ok(());
        }
        if plan.after_refusal(k, i) {
            // Reliable levels: later descriptors flush (notes/contract.md, "Posting").
            return errbits(d, STATUS_DONE | STATUS_DESC_FLUSHED_ERROR);
        }
        if plan.is_breaking(k, i) {
            return match (plan.breaking, plan.level) {
                // Across hosts the peer's transport may have acknowledged
                // it before the connection broke: DONE, with or without error.
                (Some(Breaking::NoReceive), _) => Ok(()),
                (_, SERVICE_UNRELIABLE) => exact(d, STATUS_DONE | STATUS_OP_SEND, op.len),
                (_, SERVICE_RELIABLE_DELIVERY) => Ok(()),
                _ => errbits(d, STATUS_DONE | STATUS_REMOTE_DESC_ERROR),
            };
        }
        let bits = match op.kind {
            Kind::Send => STATUS_OP_SEND,
            Kind::Write | Kind::WriteImm => STATUS_OP_RDMA_WRITE,
            Kind::Read => STATUS_OP_RDMA_READ,
        };
        // A read ahead of the send that breaks its connection: its answer,
        // sent before the BREAK, may be lost or overtaken by it; then the
        // read had not completed when the connection broke, and is
        // flushed.  (Sends and writes ahead of it are acknowledged by the
        // BREAK itself, and complete.)
        let broken_here = plan.broken_pair() == Some(p) && k + 1 == plan.rounds.len();
        if op.kind == Kind::Read && broken_here && d.status() & ERRBITS == STATUS_DONE | STATUS_DESC_FLUSHED_ERROR {
            return Ok(());
        }
        exact(d, STATUS_DONE | bits, op.len)?;
        if op.kind == Kind::Read {
            let e = &self.ends[p][s];
            let want = &self.ends[p][1 - s].read_area[op.target as usize..(op.target + op.len) as usize];
            if let Some(diff) = first_difference(want, e.data.bytes(send_off(slot), op.len as usize)) {
                return Err(format!("the bytes read differ: {diff}"));
            }
            if let Some(diff) = first_not(JUNK, e.data.bytes(send_off(slot) + op.len as usize, GUARD)) {
                return Err(format!("past the bytes read: {diff}"));
            }
        }
        Ok(())
    }

    /// The receive that op `i` of round `k` consumed at end (p, s).
    fn judge_received(&mut self, p: usize, s: usize, k: usize, i: usize, slot: usize, d: Desc) -> Result<(), String> {
        let plan = self.plan;
        let op = &plan.rounds[k][i];
        let (room, off) = (plan.room(k, i) as usize, recv_off(slot));
        let e = &self.ends[p][s];
        if plan.after_refusal(k, i) {
            // Its message comes after the refused operation: never placed.
            errbits(d, STATUS_DONE | STATUS_DESC_FLUSHED_ERROR)?;
            return self.untouched(p, s, off, room + GUARD);
        }
        if plan.is_breaking(k, i) {
            // Longer than its buffer: a length error, and no byte past the buffer.
            errbits(d, STATUS_DONE | STATUS_LENGTH_ERROR)?;
            if let Some(diff) = first_not(JUNK, e.data.bytes(off + room, GUARD)) {
                return Err(format!("past a receive buffer too short for the message: {diff}"));
            }
            // It still reports the message's immediate data.
            if op.immediate.is_some() && d.status() & STATUS_IMMEDIATE == 0 {
                return Err(format!("status {} lacks IMMEDIATE", status_str(d.status())));
            }
            return self.judge_immediate(op, d);
        }
        let imm_bit = if op.immediate.is_some() { STATUS_IMMEDIATE } else { 0 };
        match op.kind {
            Kind::Send => {
                exact(d, STATUS_DONE | STATUS_OP_RECEIVE | imm_bit, op.len)?;
                let mut want = op.data.clone();
                if self.inject == Inject::WrongByte && !want.is_empty() {
                    want[0] ^= 0xFF;
                }
                if let Some(diff) = first_difference(&want, e.data.bytes(off, op.len as usize)) {
                    return Err(format!("the bytes received differ: {diff}"));
                }
                if let Some(diff) = first_not(JUNK, e.data.bytes(off + op.len as usize, room - op.len as usize + GUARD))
                {
                    return Err(format!("past the message, in its slack of {} B and guard: {diff}", op.slack));
                }
            }
            _ => {
                exact(d, STATUS_DONE | STATUS_OP_REMOTE_RDMA_WRITE | STATUS_IMMEDIATE, op.len)?;
                if let Some(diff) = first_not(JUNK, e.data.bytes(off, room + GUARD)) {
                    return Err(format!("the receive buffer an RDMA write consumed changed: {diff}"));
                }
                // The write is in place by the time its receive completes.
                let landed = e.data.bytes(RDMA_AREA + op.target as usize, op.len as usize);
                if let Some(diff) = first_difference(&op.data, landed) {
                    return Err(format!("the write's bytes, once its receive completed: {diff}"));
                }
            }
        }
        self.judge_immediate(op, d)
    }

    /// Nothing landed in `len` bytes at `off` of end (p, s)'s data.
    fn untouched(&self, p: usize, s: usize, off: usize, len: usize) -> Result<(), String> {
        match first_not(JUNK, self.ends[p][s].data.bytes(off, len)) {
            None => Ok(()),
            Some(diff) => Err(format!("its receive buffer changed: {diff}")),
        }
    }

    fn judge_immediate(&self, op: &Op, d: Desc) -> Result<(), String> {
        let Some(mut want) = op.immediate else { return Ok(()) };
        if self.inject == Inject::WrongImmediate {
            want ^= 1;
        }
        match d.immediate() {
            got if got == want => Ok(()),
            got => Err(format!("immediate data 0x{got:08x}, expected 0x{want:08x}")),
        }
    }

    /// A lossy seed's receive at end (p, s): a message sent to it after the
    /// last one it received, whole and uncorrupted, or a flush.
    fn judge_any_message(&mut self, p: usize, s: usize, slot: usize, d: Desc) -> Result<(), String> {
        let plan = self.plan;
        let (status, off) = (d.status(), recv_off(slot));
        let e = &self.ends[p][s];
        let remote_write = status & STATUS_OP_BITS == STATUS_OP_REMOTE_RDMA_WRITE;
        if status & ERRBITS != STATUS_DONE || !(remote_write || status & STATUS_OP_BITS == STATUS_OP_RECEIVE) {
            return Err(format!(
                "status {}: neither a message nor an RDMA write with immediate data",
                status_str(status)
            ));
        }
        let imm = (status & STATUS_IMMEDIATE != 0).then(|| d.immediate());
        let len = d.length() as usize;
        let matches = |&(k, i): &(usize, usize)| {
            let op = &plan.rounds[k][i];
            let kind_fits = if remote_write { op.kind == Kind::WriteImm } else { op.kind == Kind::Send };
            kind_fits
                && op.len as usize == len
                && op.immediate == imm
                && match op.kind {
                    Kind::Send => op.data == e.data.bytes(off, len),
                    _ => e.data.bytes(RDMA_AREA + op.target as usize, len) == op.data,
                }
        };
        let Some(at) = e.inbound[e.next_inbound..].iter().position(matches) else {
            return Err(format!(
                "status {}, {len} B, immediate {imm:x?}: none of the {} messages sent to this VI after the last one \
                 received (at most once, in order, whole) is that",
                status_str(status),
                e.inbound.len() - e.next_inbound
            ));
        };
        let (k, i) = e.inbound[e.next_inbound + at];
        let room = LOSSY_ROOM as usize;
        let past = if remote_write { 0 } else { len };
        if let Some(diff) = first_not(JUNK, e.data.bytes(off + past, room - past + GUARD)) {
            return Err(format!("{}: past what it placed in the receive buffer: {diff}", self.op_name(k, i)));
        }
        let op = &plan.rounds[k][i];
        self.judge_immediate(op, d)?;
        self.ends[p][s].next_inbound += at + 1;
        Ok(())
    }

    // ---- rounds -----------------------------------------------------------------------------

    /// Round `k`: receives posted, then every op posted; everything reaped
    /// and judged; then every write area and every queue checked.
    pub fn round(&mut self, k: usize) -> Result<(), String> {
        let plan = self.plan;
        let ops = &plan.rounds[k];
        for p in 0..self.ends.len() {
            for s in 0..2 {
                if self.live(p, s) {
                    self.ends[p][s].data.fill(RDMA_AREA, RDMA_BYTES, JUNK);
                }
            }
        }
        if k + 1 == plan.rounds.len() {
            if let Some(p) = plan.broken_pair() {
                self.ends[p][0].broken = true;
                self.ends[p][1].broken = true;
            }
        }
        if plan.lossy {
            let mut needed = vec![[0usize; 2]; self.ends.len()];
            for (i, op) in ops.iter().enumerate().filter(|(_, op)| op.takes_receive()) {
                needed[op.pair][1 - op.from] += 1;
                self.ends[op.pair][1 - op.from].inbound.push((k, i));
            }
            for (p, want) in needed.iter().enumerate() {
                for (s, &want) in want.iter().enumerate() {
                    while self.ends[p][s].recvs.len() < want {
                        let segs = 1 + (self.ends[p][s].recvs.len() as u32 % SEGS);
                        self.post_recv(p, s, LOSSY_ROOM, segs, Expect::AnyMessage)?;
                    }
                }
            }
        } else {
            for (i, op) in ops.iter().enumerate() {
                // A refused write with immediate data consumes none, as
                // tests/c/rdma.c has it: none is posted for it.
                let unreceived = plan.is_breaking(k, i)
                    && matches!(plan.breaking, Some(Breaking::NoReceive | Breaking::Refused { .. }));
                if op.takes_receive() && !unreceived {
                    self.post_recv(op.pair, 1 - op.from, plan.room(k, i), op.rsegs, Expect::Op { round: k, op: i })?;
                }
            }
        }
        for i in 0..ops.len() {
            self.post_op(k, i)?;
        }
        let what = format!("round {k}");
        if plan.lossy {
            // Over when every send completed and the network has been quiet a while.
            self.drive(&what, |w| w.ends.iter().flatten().all(|e| e.sends.is_empty()))?;
            let until = self.sim.elapsed() + QUIET;
            self.drive(&what, |w| w.sim.elapsed() >= until)?;
        } else {
            self.drive(&what, World::settled)?;
        }
        if let (Some(p), Some((_, b))) = (plan.broken_pair(), plan.breaking_op().filter(|&(bk, _)| bk == k)) {
            let (sender, receiver) = (ops[b].from, 1 - ops[b].from);
            // The target of a refused operation says why; its initiator
            // lost the connection, as every path reports it.
            let (code, why) = match plan.breaking {
                Some(Breaking::NoReceive) => (error_code::RECVQ_EMPTY, "a send found no receive"),
                Some(Breaking::Refused { .. }) if ops[b].kind == Kind::Read => {
                    (error_code::RDMAR_PROT, "an RDMA read its target refused")
                }
                Some(Breaking::Refused { .. }) => (error_code::RDMAW_PROT, "an RDMA write its target refused"),
                _ => (error_code::CONN_LOST, "a send longer than its receive"),
            };
            self.expect_report(p, receiver, code, why);
            self.expect_report(p, sender, error_code::CONN_LOST, why);
        }
        self.check_write_areas(k)?;
        self.check_quiet(&format!("after round {k}"))
    }

    /// Every live end's write area holds what round `k` wrote there, and
    /// junk elsewhere.  Lossy seeds: each write landed whole or not at all.
    fn check_write_areas(&self, k: usize) -> Result<(), String> {
        let plan = self.plan;
        for p in 0..self.ends.len() {
            for s in 0..2 {
                if !self.live(p, s) {
                    continue;
                }
                let e = &self.ends[p][s];
                // Where refused operations go: no byte of theirs lands.
                let unchanged = [
                    ("the region without RDMA access", first_not(JUNK, e.closed.bytes(0, CLOSED_BYTES))),
                    ("the memory past the data region", first_not(JUNK, e.data.bytes(DATA_BYTES, TAIL_BYTES))),
                    ("the RDMA read area", first_difference(&e.read_area, e.data.bytes(READ_AREA, READ_BYTES))),
                ];
                for (what, diff) in unchanged {
                    if let Some(diff) = diff {
                        return Err(format!("{}: after round {k}, {what} changed: {diff}", self.end_name(p, s)));
                    }
                }
                let area = e.data.bytes(RDMA_AREA, RDMA_BYTES);
                let mut want = vec![JUNK; RDMA_BYTES];
                // Neither a refused write nor those after it (reliable levels) land.
                let writes = plan.rounds[k].iter().enumerate().filter(|&(i, op)| {
                    op.pair == p
                        && op.from == 1 - s
                        && matches!(op.kind, Kind::Write | Kind::WriteImm)
                        && !plan.after_refusal(k, i)
                        && !(plan.is_breaking(k, i) && matches!(plan.breaking, Some(Breaking::Refused { .. })))
                });
                for (i, op) in writes {
                    let range = op.target as usize..(op.target + op.len) as usize;
                    let landed = &area[range.clone()];
                    if plan.lossy && first_not(JUNK, landed).is_none() {
                        continue; // lost: nothing of it landed
                    }
                    if let Some(diff) = first_difference(&op.data, landed) {
                        return Err(format!(
                            "{}: {}: the bytes written: {diff}",
                            self.end_name(p, s),
                            self.op_name(k, i)
                        ));
                    }
                    want[range].copy_from_slice(&op.data);
                }
                if let Some(diff) = first_difference(&want, area) {
                    return Err(format!(
                        "{}: after round {k}, the RDMA write area outside the round's writes: {diff}",
                        self.end_name(p, s)
                    ));
                }
            }
        }
        Ok(())
    }

    /// Nothing more completes on any live end, its CQ is empty, and it is
    /// connected unless its connection broke.
    fn check_quiet(&mut self, when: &str) -> Result<(), String> {
        for h in 0..self.hosts.len() {
            if let (false, Some(cq)) = (self.hosts[h].dead, &self.hosts[h].cq) {
                if let Some(entry) = done(cq.done(), || format!("host {h}: VipCQDone"))? {
                    return Err(format!("host {h}: {when}, the CQ still had an entry, for VI {}", entry.vi));
                }
            }
        }
        for p in 0..self.ends.len() {
            for s in 0..2 {
                if !self.live(p, s) {
                    continue;
                }
                let e = &self.ends[p][s];
                let name = || self.end_name(p, s);
                if let Some(d) = done(e.vi.send_done(), || format!("{}: VipSendDone", name()))? {
                    return Err(format!("{}: {when}, VipSendDone returned descriptor 0x{:x}", name(), d.0));
                }
                if let Some(d) = done(e.vi.recv_done(), || format!("{}: VipRecvDone", name()))? {
                    return Err(format!("{}: {when}, VipRecvDone returned descriptor 0x{:x}", name(), d.0));
                }
                let state = e.vi.state();
                let want = if e.broken { ViState::Error } else { ViState::Connected };
                if state != want {
                    return Err(format!("{}: state {state:?} {when}, expected {want:?}", name()));
                }
            }
        }
        Ok(())
    }

    fn expect_report(&mut self, p: usize, s: usize, code: u32, why: &str) {
        let e = &self.ends[p][s];
        self.reports.push((e.host, e.vi.handle, code, format!("{}: {why}", self.end_name(p, s))));
    }

    // ---- disruption -------------------------------------------------------------------------

    /// The plan's death or long partition, once the rounds before it are
    /// over: the VIs it cuts off reach the error state with what they had
    /// posted flushed; the others go on.
    pub fn disrupt(&mut self) -> Result<(), String> {
        let plan = self.plan;
        let why = match plan.disruption {
            Some(Disruption::Death { host, .. }) => {
                self.sim.kill(host);
                self.hosts[host].dead = true;
                "the peer's host died"
            }
            Some(Disruption::LongPartition { .. }) => {
                let now = self.sim.elapsed();
                if now >= PARTITION_AT {
                    return Err(format!("the rounds before the partition took until {now:?}, past its start"));
                }
                self.drive("waiting for the partition", |w| w.sim.elapsed() >= PARTITION_AT)?;
                "a long partition"
            }
            _ => return Ok(()),
        };
        for p in (0..self.ends.len()).filter(|&p| plan.cut(p)) {
            let mut probe_sent = false;
            for s in 0..2 {
                if !self.live(p, s) || self.ends[p][s].broken {
                    continue;
                }
                self.ends[p][s].broken = true;
                self.expect_report(p, s, error_code::CONN_LOST, why);
                // A lossy seed's receives still posted go with the connection.
                for posted in self.ends[p][s].recvs.iter_mut() {
                    posted.expect = Expect::Flushed("the connection broke");
                }
                for _ in 0..plan.probe_recvs {
                    self.post_recv(p, s, LEFT_ROOM, 1, Expect::Flushed("the connection broke"))?;
                }
                if plan.probe_send && !probe_sent {
                    probe_sent = true;
                    self.post_probe(p, s)?;
                }
            }
        }
        self.drive(&format!("after {why}"), World::settled)?;
        self.check_quiet(&format!("after {why}"))
    }

    /// A send posted on a VI whose peer is gone: on a reliable VI it is never
    /// acknowledged and flushed when the connection breaks.
    fn post_probe(&mut self, p: usize, s: usize) -> Result<(), String> {
        let name = self.end_name(p, s);
        let e = &mut self.ends[p][s];
        let slot = e.free_send.pop().ok_or_else(|| format!("{name}: out of send slots"))?;
        let (d, off) = (e.send_desc(slot), send_off(slot));
        d.control(0, 1, 0, PROBE_LEN);
        d.segment(0, e.data.addr(off), e.data.mem, PROBE_LEN);
        e.vi.post_send(d.ptr(), e.descs.mem).map_err(|err| format!("{name}: VipPostSend of a probe: {err:?}"))?;
        e.sends.push_back(Posted { desc: d, slot, room: 0, expect: Expect::Probe });
        Ok(())
    }

    // ---- connecting again -------------------------------------------------------------------

    /// After the ending, every pair's VIs connect to each other again, with
    /// new keys, while packets of their ended connections may still be on
    /// the way (duplicated, reordered): the new connections must neither
    /// take those nor be disturbed by the last words they are answered with.
    pub fn connect_again(&mut self) -> Result<(), String> {
        for p in 0..self.ends.len() {
            let [a, b] = &self.ends[p];
            self.sim.connect(&a.vi, &b.vi).map_err(|e| format!("pair {p}: connecting again: {e:?}"))?;
            for s in 0..2 {
                self.check_state(p, s, ViState::Connected, "once connected again")?;
            }
        }
        self.again = true;
        Ok(())
    }

    // ---- the ending -------------------------------------------------------------------------

    /// Receives left posted on both ends of every pair, then one end
    /// disconnects: its receives are flushed at once, the other end reaches
    /// the error state with its receives flushed, and disconnects too.
    pub fn ending(&mut self) -> Result<(), String> {
        let plan = self.plan;
        const LEFT: Expect = Expect::Flushed("left posted at the ending");
        for p in 0..self.ends.len() {
            for s in 0..2 {
                if !self.live(p, s) {
                    continue;
                }
                for posted in self.ends[p][s].recvs.iter_mut() {
                    posted.expect = LEFT;
                }
                for _ in 0..plan.left[p][s] {
                    self.post_recv(p, s, LEFT_ROOM, 1, LEFT)?;
                }
            }
        }
        let mut others = Vec::new();
        for p in 0..self.ends.len() {
            let closer = if self.live(p, plan.closer[p]) { plan.closer[p] } else { 1 - plan.closer[p] };
            self.ends[p][closer]
                .vi
                .disconnect()
                .map_err(|e| format!("{}: VipDisconnect: {e:?}", self.end_name(p, closer)))?;
            self.check_state(p, closer, ViState::Idle, "once VipDisconnect returned")?;
            let other = 1 - closer;
            if self.live(p, other) {
                if !self.ends[p][other].broken {
                    self.expect_report(p, other, error_code::CONN_LOST, "the peer disconnected");
                    self.ends[p][other].broken = true;
                }
                others.push((p, other));
            }
        }
        // VipDisconnect flushes before it returns.
        self.poll()?;
        for p in 0..self.ends.len() {
            let closer = if self.live(p, plan.closer[p]) { plan.closer[p] } else { 1 - plan.closer[p] };
            if !self.ends[p][closer].recvs.is_empty() {
                return Err(format!(
                    "{}: receives not flushed once VipDisconnect returned: {}",
                    self.end_name(p, closer),
                    self.pending()
                ));
            }
        }
        self.drive("the ending", World::settled)?;
        for (p, s) in others {
            self.check_state(p, s, ViState::Error, "once the peer disconnected")?;
            self.ends[p][s].vi.disconnect().map_err(|e| format!("{}: VipDisconnect: {e:?}", self.end_name(p, s)))?;
            self.check_state(p, s, ViState::Idle, "once VipDisconnect returned")?;
        }
        for e in self.ends.iter_mut().flatten() {
            e.broken = false;
        }
        for p in 0..self.ends.len() {
            for s in 0..2 {
                if self.live(p, s) {
                    self.check_state(p, s, ViState::Idle, "at the end")?;
                }
            }
        }
        Ok(())
    }

    /// The error callbacks that must have come did, and no others; then
    /// every VI, CQ, region and tag of the live hosts goes.
    pub fn teardown(mut self) -> Result<Summary, String> {
        self.check_reports()?;
        for p in 0..self.ends.len() {
            for s in (0..2).filter(|&s| self.live(p, s)) {
                let e = &self.ends[p][s];
                if let Some(diff) = first_difference(&e.read_area, e.data.bytes(READ_AREA, e.read_area.len())) {
                    return Err(format!("{}: its RDMA read area changed: {diff}", self.end_name(p, s)));
                }
            }
        }
        for p in 0..self.ends.len() {
            for s in 0..2 {
                if !self.live(p, s) {
                    continue;
                }
                let name = self.end_name(p, s);
                let e = &mut self.ends[p][s];
                Vi::destroy_in(&e.vi.nic.provider, e.vi.handle)
                    .map_err(|err| format!("{name}: VipDestroyVi: {err:?}"))?;
                e.data.deregister().map_err(|err| format!("{name}: data: {err}"))?;
                e.descs.deregister().map_err(|err| format!("{name}: descriptors: {err}"))?;
                e.closed.deregister().map_err(|err| format!("{name}: the closed region: {err}"))?;
            }
        }
        for (h, host) in self.hosts.iter().enumerate().filter(|(_, h)| !h.dead) {
            if let Some(cq) = &host.cq {
                Cq::destroy_in(&host.nic.provider, cq.handle).map_err(|e| format!("host {h}: VipDestroyCQ: {e:?}"))?;
            }
            host.nic.destroy_ptag(host.ptag).map_err(|e| format!("host {h}: VipDestroyPtag: {e:?}"))?;
        }
        Ok(Summary {
            elapsed: self.sim.elapsed(),
            stats: self.sim.stats(),
            completions: self.completions,
            again: self.again,
            waits: self.waits,
            timeouts: self.timeouts,
            scanned_entries: self.scanned_entries,
            declined_crc: self.hosts.iter().any(|h| !h.nic.tuning.payload_crc),
            local_links: self.sim.local_links,
            ring_links: self.sim.ring_links,
        })
    }

    /// Waits (in real time: the callbacks run on the provider's helper
    /// thread) for every report that must come; then no live host may
    /// have reported anything else.
    fn check_reports(&self) -> Result<(), String> {
        let deadline = Instant::now() + REPORT_WAIT;
        let reported = |&(h, vi, code, _): &(usize, Handle, u32, String)| {
            self.hosts[h].reports.lock().iter().any(|e| e.vi == vi && e.code == code)
        };
        while let Some((_, _, code, why)) = self.reports.iter().find(|r| !reported(r)) {
            if Instant::now() > deadline {
                return Err(format!(
                    "no error code {code} reported for {why} within {REPORT_WAIT:?}; reported: {}",
                    self.all_reports()
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        for (h, host) in self.hosts.iter().enumerate().filter(|(_, h)| !h.dead) {
            let log = host.reports.lock().clone();
            for e in &log {
                let wanted = self.reports.iter().filter(|r| r.0 == h && r.1 == e.vi && r.2 == e.code).count();
                let got = log.iter().filter(|x| x.vi == e.vi && x.code == e.code).count();
                if got > wanted {
                    return Err(format!(
                        "host {h}: an error report nobody expected: {e:?}; reported: {}",
                        self.all_reports()
                    ));
                }
            }
        }
        Ok(())
    }

    fn all_reports(&self) -> String {
        let all: Vec<String> = self
            .hosts
            .iter()
            .enumerate()
            .flat_map(|(h, host)| {
                host.reports.lock().iter().map(|e| format!("host {h} VI {} code {}", e.vi, e.code)).collect::<Vec<_>>()
            })
            .collect();
        if all.is_empty() {
            "nothing".into()
        } else {
            all.join(", ")
        }
    }
}

/// What a wait returned.
enum Waited {
    Entry(CqEntry),
    Recv(DescPtr),
    Send(DescPtr),
}

/// A poll's answer: a completion, nothing yet, or a failure.
fn done<T>(r: Result<T, ViaError>, what: impl FnOnce() -> String) -> Result<Option<T>, String> {
    match r {
        Ok(t) => Ok(Some(t)),
        Err(ViaError::NotDone) => Ok(None),
        Err(e) => Err(format!("{}: {e:?}", what())),
    }
}

/// The whole status word and the length.
fn exact(d: Desc, want: u32, len: u32) -> Result<(), String> {
    let status = d.status();
    if status != want {
        return Err(format!("status {}, expected {}", status_str(status), status_str(want)));
    }
    match d.length() {
        got if got == len => Ok(()),
        got => Err(format!("length {got}, expected {len}")),
    }
}

/// The done and error bits of the status (the operation's bits of a failed
/// descriptor are not checked).
fn errbits(d: Desc, want: u32) -> Result<(), String> {
    match d.status() {
        got if got & ERRBITS == want => Ok(()),
        got => Err(format!("status {}, expected the error bits {}", status_str(got), status_str(want))),
    }
}
