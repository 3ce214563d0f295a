//! The network's misbehaviour: [`Faults`] to inject, a [`Partition`] of a
//! host pair, and the [`FaultInjector`] on the send side that applies them.

use std::time::Duration;

use via_wire::{Header, Packet, HEADER_LEN};

use super::net::{Carried, NetConfig, Outgoing, Path, SimNet};
use crate::sim::SimRng;

/// A partition at least this long breaks the sessions across it (longer
/// than their idle timeout).
const LONG_PARTITION: Duration = Duration::from_secs(3);

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netsim::net::Origin;
    use via_wire::Kind;

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
