//! What a seed's workload does, drawn from the seed before anything runs:
//! hosts, VI pairs, attributes, faults, rounds of transfers, the VI-level
//! faults, a disruption (a death or a partition), and the ending.

use std::fmt;
use std::time::Duration;
use via_core::consts::{SERVICE_RELIABLE_DELIVERY, SERVICE_RELIABLE_RECEPTION, SERVICE_UNRELIABLE};
use via_reliable::netsim::{Faults, Partition};
use via_reliable::sim::SimRng;

/// VI pairs of a seed.
pub(super) const MAX_PAIRS: u64 = 4;
/// Transfers of a round, before its closing sends.
pub(super) const MAX_OPS: u64 = 6;
/// Rounds of a seed.
pub(super) const MAX_ROUNDS: u64 = 10;
/// Receives left posted at the end, per VI.
pub(super) const MAX_LEFT: u64 = 3;
/// Bytes of the largest send.
pub(super) const MAX_SEND: u32 = 65536;
/// Bytes of the largest RDMA write or read.
pub(super) const MAX_RDMA: u32 = 16384;
/// Most data segments of a send or receive.
pub(super) const SEGS: u32 = 4;
/// Most receive room past a message.
pub(super) const MAX_SLACK: u32 = 200;
/// Bytes between buffers that must not change.
pub(super) const GUARD: usize = 64;
/// Each VI's RDMA write target area.
pub(super) const RDMA_BYTES: usize = 128 << 10;
/// Each VI's RDMA read source area.
pub(super) const READ_BYTES: usize = 64 << 10;
/// When a long partition starts: the rounds before it are over by then
/// (they take a second or two of virtual time at most).
pub(super) const PARTITION_AT: Duration = Duration::from_secs(30);

/// Kept apart from the simulator's own stream of the same seed.
const PLAN_STREAM: u64 = 0x00C0_FFEE_0F0F_5EED;
/// The refused RDMA operations' own stream: seeds without one draw the
/// same plan as before there were any.
const REFUSAL_STREAM: u64 = 0x0BAD_ACCE_55ED_0000;
/// Each VI's region registered without the RDMA access a refused
/// operation needs.
pub(super) const CLOSED_BYTES: usize = 32 << 10;
/// A handle that names no region: a registered one with these bits flipped.
pub(super) const FORGED: u32 = 0x5A5A_0000;
/// Of the refused operations on reliable levels, the share of reads.
pub(super) const REFUSED_READS: f64 = 0.4;

/// What a transfer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Send,
    WriteImm,
    Write,
    Read,
}

/// One transfer.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Op {
    pub kind: Kind,
    pub pair: usize,
    /// The end of the pair (0 or 1) that posts it.
    pub from: usize,
    pub len: u32,
    /// Data segments on the initiator's side (besides an RDMA address segment).
    pub nseg: u32,
    pub immediate: Option<u32>,
    /// The bytes a send or write carries (none for a read).
    pub data: Vec<u8>,
    /// RDMA write: the offset in the peer's write area; read: in its read area.
    pub target: u32,
    /// Receive room past the message.
    pub slack: u32,
    /// Data segments of its receive.
    pub rsegs: u32,
    /// A round's closing send: what its VI wrote before is visible once it arrives.
    pub closing: bool,
}

impl Op {
    /// Whether it consumes a receive descriptor at its target.
    pub fn takes_receive(&self) -> bool {
        matches!(self.kind, Kind::Send | Kind::WriteImm)
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            Kind::Send if self.closing => "closing send",
            Kind::Send => "send",
            Kind::WriteImm => "RDMA write with immediate data",
            Kind::Write => "RDMA write",
            Kind::Read => "RDMA read",
        };
        write!(f, "{what} of {} B in {} segment(s) from end {} of pair {}", self.len, self.nseg, self.from, self.pair)?;
        if let Some(imm) = self.immediate {
            write!(f, ", immediate 0x{imm:08x}")?;
        }
        if matches!(self.kind, Kind::Write | Kind::WriteImm | Kind::Read) {
            write!(f, ", at offset {}", self.target)?;
        }
        Ok(())
    }
}

/// The VI-level fault of the last round: of its last op, a closing send,
/// or of the RDMA operation its target refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Breaking {
    /// Longer than its receive by this many bytes.
    TooLong(u32),
    /// No receive posted for it (reliable levels).
    NoReceive,
    /// Op `at` of the last round, an RDMA write or read (reliable levels),
    /// is refused by its target (notes/contract.md, "Forbidden RDMA
    /// write"); a write comes before the VI's closing send, a read after
    /// it, last.
    Refused { why: Forbidden, at: usize },
}

/// Why a target refuses an RDMA operation, and so where it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Forbidden {
    /// The write or read area, where the seed enables no RDMA of its kind
    /// (neither the target VI nor its region): `target` is in that area.
    NotEnabled,
    /// The target's region registered without that kind of RDMA:
    /// `target` is in it.
    Closed,
    /// Across the end of the target's data region into memory registered
    /// nowhere: `target` is in the read area, the region's last part.
    PastEnd,
    /// The write or read area under a forged memory handle (`FORGED`).
    WrongHandle,
}

/// What happens to the hosts or the network once a round is over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Disruption {
    /// `host` dies after round `after`.
    Death { host: usize, after: usize },
    /// `hosts` are cut off from each other from `PARTITION_AT` on, long
    /// enough to break the sessions across; the rounds up to `after` come
    /// before.
    LongPartition { hosts: (usize, usize), after: usize },
    /// A partition short enough to be survived, at a random time
    /// (`faults.partition`): the workload does nothing about it.
    ShortPartition,
}

/// A seed's whole workload.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Plan {
    pub seed: u64,
    pub hosts: usize,
    pub level: u16,
    /// Unreliable over a lossy network: only at-most-once, in order,
    /// whole and uncorrupted are checked of what arrives.
    pub lossy: bool,
    /// The two hosts of each VI pair: one host in one pair of four, whose
    /// VIs connect over shared memory.
    pub pairs: Vec<(usize, usize)>,
    pub rdma_write: bool,
    pub rdma_read: bool,
    /// Per host: its VIs' receive queues complete through one CQ.
    pub shared_cq: Vec<bool>,
    pub faults: Faults,
    pub rounds: Vec<Vec<Op>>,
    /// The fault of the last op of the last round.
    pub breaking: Option<Breaking>,
    pub disruption: Option<Disruption>,
    /// Receives posted on the surviving ends of the pairs a disruption
    /// breaks, and whether one end posts a send there too.
    pub probe_recvs: usize,
    pub probe_send: bool,
    /// Per pair: the end that disconnects first at the ending.
    pub closer: Vec<usize>,
    /// Per pair and end: receives left posted at the ending.
    pub left: Vec<[usize; 2]>,
}

impl Plan {
    /// The workload of `seed`.
    pub fn new(seed: u64) -> Plan {
        let mut r = SimRng::new(seed ^ PLAN_STREAM);
        let hosts = r.range(2, 4) as usize;
        let level = pick(&mut r, &[SERVICE_UNRELIABLE, SERVICE_RELIABLE_DELIVERY, SERVICE_RELIABLE_RECEPTION]);
        let reliable = level != SERVICE_UNRELIABLE;
        let lossy = !reliable && r.chance(0.4);
        let pairs = (0..r.range(1, MAX_PAIRS))
            .map(|_| {
                let a = r.below(hosts as u64) as usize;
                match r.chance(0.25) {
                    true => (a, a),
                    false => (a, (a + 1 + r.below(hosts as u64 - 1) as usize) % hosts),
                }
            })
            .collect::<Vec<_>>();
        let rdma_write = r.below(3) != 0;
        let rdma_read = reliable && r.chance(0.5);
        let shared_cq = (0..hosts).map(|_| r.chance(0.5)).collect();
        let nrounds = r.range(1, MAX_ROUNDS) as usize;
        let disruption = match r.below(10) {
            0 | 1 => Some(Disruption::Death {
                host: r.below(hosts as u64) as usize,
                after: r.below(nrounds as u64) as usize,
            }),
            2 => {
                let a = r.below(hosts as u64) as usize;
                let b = (a + 1 + r.below(hosts as u64 - 1) as usize) % hosts;
                Some(Disruption::LongPartition { hosts: (a, b), after: r.below(nrounds as u64) as usize })
            }
            // Survived without loss: only where loss is survived anyway.
            3 if reliable || lossy => Some(Disruption::ShortPartition),
            _ => None,
        };
        let faults = random_faults(&mut r, reliable || lossy, hosts, disruption);
        let mut plan = Plan {
            seed,
            hosts,
            level,
            lossy,
            pairs,
            rdma_write,
            rdma_read,
            shared_cq,
            faults,
            rounds: Vec::new(),
            breaking: None,
            disruption,
            probe_recvs: r.range(1, 3) as usize,
            probe_send: r.chance(0.5),
            closer: Vec::new(),
            left: Vec::new(),
        };
        // Decided before the rounds: the broken VI's last round goes one way only.
        let breaking = if r.below(4) == 0 && !lossy {
            Some(Breaking::TooLong(0))
        } else if reliable && r.below(6) == 0 {
            Some(Breaking::NoReceive)
        } else {
            None
        };
        let last_usable = plan.usable_pairs(nrounds - 1);
        let broken = match (breaking, last_usable.is_empty()) {
            (Some(_), false) => Some((last_usable[r.below(last_usable.len() as u64) as usize], r.below(2) as usize)),
            _ => None,
        };
        // One in eight of the seeds without another VI-level fault.
        let mut f = SimRng::new(seed ^ REFUSAL_STREAM);
        let refused = match (broken, lossy || last_usable.is_empty() || f.below(8) != 0) {
            (None, false) => Some((last_usable[f.below(last_usable.len() as u64) as usize], f.below(2) as usize)),
            _ => None,
        };
        for k in 0..nrounds {
            let ops = plan.random_round(&mut r, k, broken.or(refused).filter(|_| k + 1 == nrounds));
            plan.rounds.push(ops);
        }
        if let Some((pair, from)) = refused {
            plan.breaking = Some(plan.add_refused(&mut f, pair, from));
        }
        if broken.is_some() {
            plan.breaking = breaking;
            let op = plan.rounds.last_mut().and_then(|ops| ops.last_mut()).expect("the broken VI's closing send");
            if let Some(Breaking::TooLong(_)) = breaking {
                if op.len == 0 {
                    op.len = 1;
                    op.nseg = 1;
                    op.data = r.bytes(1);
                }
                op.slack = 0;
                plan.breaking = Some(Breaking::TooLong(1 + r.below(op.len.min(64) as u64) as u32));
            }
        }
        plan.closer = plan.pairs.iter().map(|_| r.below(2) as usize).collect();
        plan.left = plan.pairs.iter().map(|_| [r.range(0, MAX_LEFT) as usize, r.range(0, MAX_LEFT) as usize]).collect();
        plan
    }

    /// Whether the levels' VIs are reliable.
    pub fn reliable(&self) -> bool {
        self.level != SERVICE_UNRELIABLE
    }

    /// Whether the disruption breaks `pair` (it spans the partition or
    /// touches the dead host).
    pub fn cut(&self, pair: usize) -> bool {
        let (a, b) = self.pairs[pair];
        match self.disruption {
            Some(Disruption::Death { host, .. }) => a == host || b == host,
            Some(Disruption::LongPartition { hosts, .. }) => (a, b) == hosts || (b, a) == hosts,
            _ => false,
        }
    }

    /// Whether every pair connects again after the ending and repeats the
    /// first round, which breaks nothing (there is another round after it)
    /// and which a seed whose receives may go missing (lossy) or whose
    /// hosts die or stay cut off does not repeat.
    pub fn again(&self) -> bool {
        !self.lossy && self.rounds.len() > 1 && self.disrupted_after().is_none()
    }

    /// The round after which the disruption comes, if the workload
    /// takes part in it.
    pub fn disrupted_after(&self) -> Option<usize> {
        match self.disruption {
            Some(Disruption::Death { after, .. } | Disruption::LongPartition { after, .. }) => Some(after),
            _ => None,
        }
    }

    /// The pairs that carry traffic in round `k`.
    fn usable_pairs(&self, k: usize) -> Vec<usize> {
        let after = self.disrupted_after();
        (0..self.pairs.len()).filter(|&p| !(self.cut(p) && after.is_some_and(|a| k > a))).collect()
    }

    /// The refused RDMA operation of the last round on `pair` from end
    /// `from`, and where it goes: a write among the ops before the
    /// closing sends, a read last.
    fn add_refused(&mut self, f: &mut SimRng, pair: usize, from: usize) -> Breaking {
        let ops = self.rounds.last_mut().expect("a last round");
        let kind = match self.level != SERVICE_UNRELIABLE && f.chance(REFUSED_READS) {
            true => Kind::Read,
            false => pick(f, &[Kind::Write, Kind::WriteImm]),
        };
        let enabled = if kind == Kind::Read { self.rdma_read } else { self.rdma_write };
        let mut why = match enabled {
            false => Forbidden::NotEnabled,
            true => pick(f, &[Forbidden::Closed, Forbidden::PastEnd, Forbidden::WrongHandle]),
        };
        let mut len = random_len(f, MAX_RDMA).max(2);
        // A write into the write area goes past the round's other writes
        // to that target, so that none of them covers a byte it landed.
        let free = ops
            .iter()
            .filter(|o| o.pair == pair && o.from == from && matches!(o.kind, Kind::Write | Kind::WriteImm))
            .map(|o| o.target + o.len + GUARD as u32)
            .max()
            .unwrap_or(0);
        if kind != Kind::Read && why == Forbidden::WrongHandle && free as usize + 1 >= RDMA_BYTES {
            why = Forbidden::PastEnd;
        }
        let area = if kind == Kind::Read { READ_BYTES } else { RDMA_BYTES } as u32;
        let target = match (why, kind) {
            (Forbidden::Closed, _) => {
                len = len.min(CLOSED_BYTES as u32);
                f.below((CLOSED_BYTES as u32 - len + 1) as u64) as u32
            }
            // At least one byte on each side of the end.
            (Forbidden::PastEnd, _) => READ_BYTES as u32 - 1 - f.below(len as u64 - 1) as u32,
            (_, Kind::Read) | (Forbidden::NotEnabled, _) => f.below((area - len + 1) as u64) as u32,
            _ => {
                len = len.min(area - free);
                free + f.below((area - free - len + 1) as u64) as u32
            }
        };
        let nseg = 1 + f.below(SEGS.min(len) as u64) as u32;
        let immediate = (kind == Kind::WriteImm).then(|| f.next_u64() as u32);
        let data = if kind == Kind::Read { Vec::new() } else { f.bytes(len as usize) };
        let op = Op { kind, pair, from, len, nseg, immediate, data, target, slack: 0, rsegs: 1, closing: false };
        let at = match kind {
            Kind::Read => ops.len(),
            _ => f.below(ops.iter().filter(|o| !o.closing).count() as u64 + 1) as usize,
        };
        ops.insert(at, op);
        Breaking::Refused { why, at }
    }

    /// Round and index of the op the breaking fault is about.
    pub fn breaking_op(&self) -> Option<(usize, usize)> {
        let k = self.rounds.len().checked_sub(1)?;
        match self.breaking? {
            Breaking::Refused { at, .. } => Some((k, at)),
            _ => Some((k, self.rounds[k].len().checked_sub(1)?)),
        }
    }

    /// Whether op `i` of round `k` is the one the breaking fault is about.
    pub fn is_breaking(&self, k: usize, i: usize) -> bool {
        self.breaking_op() == Some((k, i))
    }

    /// Whether op `i` of round `k` comes after the refused operation on
    /// its VI, which the broken connection flushes (reliable levels).
    pub fn after_refusal(&self, k: usize, i: usize) -> bool {
        match (self.breaking, self.breaking_op()) {
            (Some(Breaking::Refused { .. }), Some((bk, at))) => {
                self.reliable() && k == bk && i > at && self.rounds[k][i].pair == self.rounds[k][at].pair
            }
            _ => false,
        }
    }

    /// The pair the breaking fault breaks (on reliable levels), if any.
    pub fn broken_pair(&self) -> Option<usize> {
        let broken = self.breaking.is_some() && (self.reliable() || self.breaking == Some(Breaking::NoReceive));
        let (k, i) = self.breaking_op().filter(|_| broken)?;
        Some(self.rounds[k][i].pair)
    }

    /// The receive room of op `i` of round `k`: the message and its slack,
    /// less what a too long send exceeds it by.
    pub fn room(&self, k: usize, i: usize) -> u32 {
        let op = &self.rounds[k][i];
        match self.breaking {
            Some(Breaking::TooLong(over)) if self.is_breaking(k, i) => op.len + op.slack - over,
            _ => op.len + op.slack,
        }
    }

    /// Round `k`: up to `MAX_OPS` transfers on the pairs usable then, each
    /// pair one way or both, then a closing send on every VI and way the
    /// round used; `broken` (pair, end) goes one way only and its closing
    /// send comes last.
    fn random_round(&self, r: &mut SimRng, k: usize, broken: Option<(usize, usize)>) -> Vec<Op> {
        let usable = self.usable_pairs(k);
        if usable.is_empty() {
            return Vec::new();
        }
        // Per pair: the one end that sends, or None for both.
        let ways: Vec<Option<usize>> = (0..self.pairs.len())
            .map(|p| match broken {
                Some((bp, from)) if bp == p => Some(from),
                _ => [Some(0), Some(1), None][r.below(3) as usize],
            })
            .collect();
        let mut cursor = vec![[0u32; 2]; self.pairs.len()];
        let mut used = Vec::new();
        let mut ops = Vec::new();
        for _ in 0..r.below(MAX_OPS + 1) {
            let pair = usable[r.below(usable.len() as u64) as usize];
            let from = ways[pair].unwrap_or_else(|| r.below(2) as usize);
            if !used.contains(&(pair, from)) {
                used.push((pair, from));
            }
            ops.push(self.random_op(r, pair, from, false, &mut cursor[pair][1 - from]));
        }
        if used.is_empty() {
            let pair = usable[r.below(usable.len() as u64) as usize];
            used.push((pair, ways[pair].unwrap_or_else(|| r.below(2) as usize)));
        }
        if let Some(b) = broken {
            used.retain(|&u| u != b);
            used.push(b);
        }
        for (pair, from) in used {
            ops.push(self.random_op(r, pair, from, true, &mut cursor[pair][1 - from]));
        }
        ops
    }

    /// One transfer; `cursor` is where the next RDMA write to its target
    /// may go in this round.
    fn random_op(&self, r: &mut SimRng, pair: usize, from: usize, closing: bool, cursor: &mut u32) -> Op {
        let mut kinds = vec![Kind::Send];
        if self.rdma_write {
            kinds.extend([Kind::WriteImm, Kind::Write]);
        }
        if self.rdma_read {
            kinds.push(Kind::Read);
        }
        let kind = if closing { Kind::Send } else { pick(r, &kinds) };
        let mut len = random_len(r, if kind == Kind::Send { MAX_SEND } else { MAX_RDMA });
        if kind != Kind::Send && len == 0 {
            len = 1;
        }
        let nseg = if len == 0 { 0 } else { 1 + r.below(SEGS.min(len) as u64) as u32 };
        let immediate = (kind == Kind::WriteImm || (kind == Kind::Send && r.chance(0.5))).then(|| r.next_u64() as u32);
        let data = if kind == Kind::Read { Vec::new() } else { r.bytes(len as usize) };
        let target = match kind {
            Kind::Write | Kind::WriteImm => {
                *cursor += r.below(4) as u32 * GUARD as u32;
                let at = *cursor;
                *cursor += len + GUARD as u32;
                assert!(*cursor as usize <= RDMA_BYTES, "seed {}: a round's writes overflow the area", self.seed);
                at
            }
            Kind::Read => r.below((READ_BYTES - len as usize + 1) as u64) as u32,
            Kind::Send => 0,
        };
        let slack = if r.below(3) == 0 { 0 } else { r.below(MAX_SLACK as u64) as u32 };
        let rsegs = 1 + r.below(SEGS as u64) as u32;
        Op { kind, pair, from, len, nseg, immediate, data, target, slack, rsegs, closing }
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let level = match self.level {
            SERVICE_UNRELIABLE if self.lossy => "unreliable (lossy)",
            SERVICE_UNRELIABLE => "unreliable",
            SERVICE_RELIABLE_DELIVERY => "reliable delivery",
            _ => "reliable reception",
        };
        let ops: usize = self.rounds.iter().map(Vec::len).sum();
        write!(
            f,
            "{} hosts, {level}, pairs {:?}, rdma write {} read {}, shared CQ {:?}, {} rounds of {ops} ops, \
             breaking {:?}, disruption {:?}, closers {:?}, left {:?}, {:?}",
            self.hosts,
            self.pairs,
            self.rdma_write,
            self.rdma_read,
            self.shared_cq,
            self.rounds.len(),
            self.breaking,
            self.disruption,
            self.closer,
            self.left,
            self.faults
        )
    }
}

fn pick<T: Copy>(r: &mut SimRng, xs: &[T]) -> T {
    xs[r.below(xs.len() as u64) as usize]
}

/// A size, mostly small: one packet, a few, many.
fn random_len(r: &mut SimRng, max: u32) -> u32 {
    match r.below(4) {
        0 => r.below(65) as u32,
        1 => r.below(2048) as u32,
        2 => r.below(16384.min(max) as u64) as u32,
        _ => r.below(max as u64 + 1) as u32,
    }
}

/// The network's faults: none that lose a packet where the level cannot
/// survive loss (`survives_loss` false: an exact unreliable seed), and the
/// partition of the disruption.
fn random_faults(r: &mut SimRng, survives_loss: bool, hosts: usize, disruption: Option<Disruption>) -> Faults {
    let mut faults = Faults { loss: 0.0, duplicate: 0.0, reorder: 0.0, corrupt: 0.0, misdirect: 0.0, partition: None };
    // A duplicate arrives after its original, which an unreliable session drops.
    faults.duplicate = pick(r, &[0.0, 0.02, 0.1]);
    if survives_loss {
        faults.loss = pick(r, &[0.0, 0.01, 0.05, 0.1]);
        faults.reorder = pick(r, &[0.0, 0.05, 0.2]);
        if r.chance(0.3) {
            faults.corrupt = pick(r, &[0.01, 0.05]);
            faults.misdirect = pick(r, &[0.01, 0.05]);
        }
    }
    faults.partition = match disruption {
        Some(Disruption::LongPartition { hosts, .. }) => {
            // Longer than the sessions' idle timeout (10 s), so that idle
            // sessions across it break too.
            let len = Duration::from_millis(r.range(12_000, 15_000));
            Some(Partition { hosts, start: PARTITION_AT, end: PARTITION_AT + len })
        }
        Some(Disruption::ShortPartition) => {
            let a = r.below(hosts as u64) as usize;
            let b = (a + 1 + r.below(hosts as u64 - 1) as usize) % hosts;
            let start = Duration::from_millis(r.range(0, 300));
            // Well within what the retransmissions of a session outlast.
            Some(Partition { hosts: (a, b), start, end: start + Duration::from_millis(r.range(10, 400)) })
        }
        _ => None,
    };
    faults
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_replay_and_keep_to_their_limits() {
        for seed in 0..1000 {
            let plan = Plan::new(seed);
            assert!(plan == Plan::new(seed), "seed {seed} draws another plan");
            for (k, ops) in plan.rounds.iter().enumerate() {
                for (i, op) in ops.iter().enumerate() {
                    let refused = matches!(plan.breaking, Some(Breaking::Refused { .. })) && plan.is_breaking(k, i);
                    assert!(
                        op.kind != Kind::Read || plan.rdma_read || refused,
                        "seed {seed}: a read where reads are off"
                    );
                    if plan.cut(op.pair) && plan.disrupted_after().is_some_and(|after| k > after) {
                        panic!("seed {seed}: round {k} op {i} on pair {} after the disruption broke it", op.pair);
                    }
                    assert!(op.slack <= MAX_SLACK && plan.room(k, i) <= MAX_SEND + MAX_SLACK);
                }
                // The broken pair goes one way in the last round.
                if let (Some(p), true) = (plan.broken_pair(), k + 1 == plan.rounds.len()) {
                    let from = ops.last().unwrap().from;
                    assert!(
                        ops.iter().all(|o| o.pair != p || o.from == from),
                        "seed {seed}: both ways on the broken VI"
                    );
                }
            }
            if plan.breaking == Some(Breaking::NoReceive) {
                assert!(plan.reliable(), "seed {seed}: an unreceived send on an unreliable VI");
            }
            if let (Some(Breaking::Refused { why, .. }), Some((k, i))) = (plan.breaking, plan.breaking_op()) {
                let ops = &plan.rounds[k];
                let op = &ops[i];
                assert!(!plan.lossy && op.kind != Kind::Send && !op.closing, "seed {seed}: refused {op}");
                assert!(op.kind != Kind::Read || plan.reliable(), "seed {seed}: a refused read on an unreliable VI");
                // Something of its VI comes after a refused write, nothing after a read.
                let later = ops[i + 1..].iter().any(|o| o.pair == op.pair);
                assert_eq!(later, op.kind != Kind::Read, "seed {seed}: what follows the refused {op}");
                let (start, end) = (op.target as usize, (op.target + op.len) as usize);
                let area = if op.kind == Kind::Read { READ_BYTES } else { RDMA_BYTES };
                match why {
                    Forbidden::Closed => assert!(end <= CLOSED_BYTES),
                    Forbidden::PastEnd => assert!(start < READ_BYTES && end > READ_BYTES),
                    _ => assert!(end <= area),
                }
                assert_eq!(
                    why == Forbidden::NotEnabled,
                    if op.kind == Kind::Read { !plan.rdma_read } else { !plan.rdma_write },
                    "seed {seed}: {why:?} for {op}"
                );
            }
            if !plan.reliable() && !plan.lossy {
                let f = &plan.faults;
                assert!(f.loss == 0.0 && f.reorder == 0.0 && f.corrupt == 0.0 && f.misdirect == 0.0);
                assert!(f.partition.is_none() || plan.disruption.is_some_and(|d| d != Disruption::ShortPartition));
            }
        }
    }

    /// The seeds an optimized run takes by default, CI's, reach every part
    /// of the plan (in any build: drawing plans is cheap).
    #[test]
    fn the_default_seeds_cover_every_feature() {
        let plans: Vec<Plan> = (1..=super::super::OPTIMIZED_SEEDS).map(Plan::new).collect();
        let count = |f: &dyn Fn(&Plan) -> bool| plans.iter().filter(|p| f(p)).count();
        let any_op = |p: &Plan, f: &dyn Fn(&Op) -> bool| p.rounds.iter().flatten().any(f);
        type Feature<'a> = (&'a str, &'a dyn Fn(&Plan) -> bool);
        let refused = |p: &Plan, kinds: &[Kind], why: Option<Forbidden>| match (p.breaking, p.breaking_op()) {
            (Some(Breaking::Refused { why: w, .. }), Some((k, i))) => {
                kinds.contains(&p.rounds[k][i].kind) && why.is_none_or(|why| why == w)
            }
            _ => false,
        };
        let writes = &[Kind::Write, Kind::WriteImm];
        let features: [Feature; 27] = [
            ("unreliable", &|p| p.level == SERVICE_UNRELIABLE && !p.lossy),
            ("lossy unreliable", &|p| p.lossy),
            ("reliable delivery", &|p| p.level == SERVICE_RELIABLE_DELIVERY),
            ("reliable reception", &|p| p.level == SERVICE_RELIABLE_RECEPTION),
            ("4 hosts", &|p| p.hosts == 4),
            ("4 pairs", &|p| p.pairs.len() == 4),
            ("a shared CQ", &|p| p.shared_cq.contains(&true)),
            ("an empty send", &|p| any_op(p, &|o| o.kind == Kind::Send && o.len == 0)),
            ("a send of more than 32 KiB", &|p| any_op(p, &|o| o.len > 32768)),
            ("an RDMA write with immediate data", &|p| any_op(p, &|o| o.kind == Kind::WriteImm)),
            ("an RDMA write", &|p| any_op(p, &|o| o.kind == Kind::Write)),
            ("an RDMA read", &|p| any_op(p, &|o| o.kind == Kind::Read)),
            ("a too long send", &|p| matches!(p.breaking, Some(Breaking::TooLong(_)))),
            ("a too long send, reliable", &|p| matches!(p.breaking, Some(Breaking::TooLong(_))) && p.reliable()),
            ("an unreceived send", &|p| p.breaking == Some(Breaking::NoReceive)),
            ("a refused RDMA write, reliable", &|p| refused(p, writes, None) && p.reliable()),
            ("a refused RDMA write, unreliable", &|p| refused(p, writes, None) && !p.reliable()),
            ("a refused RDMA write with immediate data", &|p| refused(p, &[Kind::WriteImm], None)),
            ("a refused RDMA write, VI without it", &|p| refused(p, writes, Some(Forbidden::NotEnabled))),
            ("a refused RDMA write, region without it", &|p| refused(p, writes, Some(Forbidden::Closed))),
            ("a refused RDMA write, past the end", &|p| refused(p, writes, Some(Forbidden::PastEnd))),
            ("a refused RDMA write, forged handle", &|p| refused(p, writes, Some(Forbidden::WrongHandle))),
            ("a death", &|p| matches!(p.disruption, Some(Disruption::Death { .. }))),
            ("a long partition", &|p| matches!(p.disruption, Some(Disruption::LongPartition { .. }))),
            ("a short partition", &|p| p.disruption == Some(Disruption::ShortPartition)),
            ("corruption and misdirection", &|p| p.faults.corrupt > 0.0 && p.faults.misdirect > 0.0),
            ("10% loss", &|p| p.faults.loss >= 0.1),
        ];
        for (what, f) in features {
            let n = count(f);
            assert!(n >= 3, "{what}: {n} of {} seeds", plans.len());
        }
        let n = count(&|p| refused(p, &[Kind::Read], None));
        assert!(n >= 3, "a refused RDMA read: {n} of {} seeds", plans.len());
    }
}
