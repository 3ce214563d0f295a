//! The simulated network: packets with what the simulator knows of them
//! beyond their bytes, the send side of a host's datapath, and [`SimNet`],
//! which carries packets between hosts on two paths per host pair.

use crate::Time;
use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::time::Duration;

use via_wire::Kind;

use super::MAX_HOSTS;
use crate::sim::SimRng;

/// Which of a host pair's paths a packet takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// A UDP datagram: datagrams between two hosts keep their order.
    Datagram,
    /// An Ethernet frame: a faster path that may overtake datagrams.
    Frame,
}

/// Which session sent a packet: what the simulator knows of it beyond its
/// bytes, which are all the receiver sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Origin {
    /// The connection, by index.
    pub conn: usize,
    /// The end of the connection that sent it (0 or 1).
    pub side: usize,
    /// Its kind.
    pub kind: Kind,
    /// Its sequence number, for a sequenced kind.
    pub seq: Option<u32>,
}

/// A packet a host hands to its datapath.
#[derive(Debug, Clone)]
pub struct Outgoing {
    /// The host it is for.
    pub to: usize,
    /// Datagram or frame.
    pub path: Path,
    /// The encoded packet.
    pub bytes: Vec<u8>,
    /// Who sent it.
    pub origin: Origin,
    /// Every sequence number below this was acknowledged to the sending
    /// session when the packet left (what the session accepted from its
    /// peer, counted apart from the session's own bookkeeping).
    pub acked_below: u32,
}

/// The send side of a host's datapath: the packets its VIs built, in
/// order, until the network takes them.  The VIs hold it (as a link holds
/// its port's sockets), so that they can send while a poll lends the
/// receive side to the endpoint.
#[derive(Debug, Default)]
pub struct SendSide {
    packets: Vec<Outgoing>,
}

impl SendSide {
    /// Sends a packet as a datagram.
    pub fn send_datagram(&mut self, to: usize, bytes: Vec<u8>, origin: Origin, acked_below: u32) {
        self.packets.push(Outgoing { to, path: Path::Datagram, bytes, origin, acked_below });
    }

    /// Sends one packet as a frame.
    pub fn send_frame(&mut self, to: usize, bytes: Vec<u8>, origin: Origin, acked_below: u32) {
        self.packets.push(Outgoing { to, path: Path::Frame, bytes, origin, acked_below });
    }

    /// Takes what was sent since the last call.
    pub fn take(&mut self) -> Vec<Outgoing> {
        std::mem::take(&mut self.packets)
    }
}

/// A packet in the network or waiting at its host, with what the
/// simulator did to it.
#[derive(Debug, Clone)]
pub struct Carried {
    /// The sending host.
    pub from: usize,
    /// The host it arrives at (the wrong one, if misdirected there).
    pub to: usize,
    /// Datagram or frame.
    pub path: Path,
    /// The bytes as they arrive.
    pub bytes: Vec<u8>,
    /// Who sent it.
    pub origin: Origin,
    /// A byte was flipped: the receiver must refuse it as malformed.
    pub corrupted: bool,
    /// Sent to another VI or host than its session's peer.
    pub misdirected: bool,
}

impl Carried {
    /// A packet of `origin`'s session that its peer may take: not damaged,
    /// not sent astray.
    pub(super) fn intact_for_peer(&self) -> bool {
        !self.corrupted && !self.misdirected
    }
}

/// A packet on its way, ordered by arrival.
#[derive(Debug)]
struct Flight {
    at: Time,
    order: u64,
    packet: Carried,
}

impl PartialEq for Flight {
    fn eq(&self, other: &Flight) -> bool {
        (self.at, self.order) == (other.at, other.order)
    }
}

impl Eq for Flight {}

impl PartialOrd for Flight {
    fn partial_cmp(&self, other: &Flight) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Flight {
    fn cmp(&self, other: &Flight) -> Ordering {
        (self.at, self.order).cmp(&(other.at, other.order))
    }
}

/// The delays of a simulated network.
#[derive(Debug, Clone, PartialEq)]
pub struct NetConfig {
    /// Shortest datagram delay.
    pub delay_min: Duration,
    /// Longest datagram delay (before any holding back).
    pub delay_max: Duration,
    /// Shortest frame delay.
    pub frame_min: Duration,
    /// Longest frame delay: shorter than `delay_min`, so that frames
    /// overtake datagrams.
    pub frame_max: Duration,
}

/// What the network and its fault injector did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetStats {
    /// Packets handed to the network.
    pub sent: u64,
    /// Of those, frames.
    pub frames: u64,
    /// Packets handed to an endpoint.
    pub delivered: u64,
    /// Packets lost at random.
    pub lost: u64,
    /// Packets lost to a partition.
    pub partitioned: u64,
    /// Extra copies made.
    pub duplicated: u64,
    /// Packets held back so that later ones overtake them.
    pub reordered: u64,
    /// Packets with a flipped byte.
    pub corrupted: u64,
    /// Packets sent to another VI or host.
    pub misdirected: u64,
    /// Corrupted packets handed to an endpoint.
    pub corrupt_arrived: u64,
    /// Packets to or from a dead host that vanished.
    pub vanished: u64,
}

/// The network between the hosts: packets in flight, by arrival time.
#[derive(Debug)]
pub struct SimNet {
    start: Time,
    /// Virtual time.
    pub now: Time,
    config: NetConfig,
    queue: BinaryHeap<Reverse<Flight>>,
    order: u64,
    /// Latest arrival scheduled per (from, to, path), to keep each path in order.
    last_arrival: [[[Time; 2]; MAX_HOSTS]; MAX_HOSTS],
    /// What happened to the packets.
    pub stats: NetStats,
}

impl SimNet {
    /// An empty network whose time starts now.
    pub fn new(config: NetConfig) -> SimNet {
        let start = Time::default();
        SimNet {
            start,
            now: start,
            config,
            queue: BinaryHeap::new(),
            order: 0,
            last_arrival: [[[start; 2]; MAX_HOSTS]; MAX_HOSTS],
            stats: NetStats::default(),
        }
    }

    /// Virtual time since the start.
    pub fn elapsed(&self) -> Duration {
        self.now - self.start
    }

    /// Carries `packet` to its host after its path's delay; one `held_back`
    /// arrives that much later still, out of its path's order.
    pub fn carry(&mut self, rng: &mut SimRng, packet: Carried, held_back: Option<Duration>) {
        let (lo, hi) = match packet.path {
            Path::Datagram => (self.config.delay_min, self.config.delay_max),
            Path::Frame => (self.config.frame_min, self.config.frame_max),
        };
        let mut at = self.now + rng.duration(lo, hi);
        match held_back {
            Some(extra) => at += extra,
            None => {
                let last = &mut self.last_arrival[packet.from][packet.to][packet.path as usize];
                at = at.max(*last);
                *last = at;
            }
        }
        self.order += 1;
        self.queue.push(Reverse(Flight { at, order: self.order, packet }));
    }

    /// When the next packet arrives.
    pub fn next_arrival(&self) -> Option<Time> {
        self.queue.peek().map(|f| f.0.at)
    }

    /// The next packet due by now, if any.
    pub fn pop_due(&mut self) -> Option<Carried> {
        if self.queue.peek().is_some_and(|f| f.0.at <= self.now) {
            self.queue.pop().map(|f| f.0.packet)
        } else {
            None
        }
    }

    /// Packets in flight, in no particular order.
    pub fn in_flight(&self) -> impl Iterator<Item = &Carried> {
        self.queue.iter().map(|f| &f.0.packet)
    }

    /// Removes every packet from or to `host` (it died); returns them.
    pub fn drop_host(&mut self, host: usize) -> Vec<Carried> {
        let (gone, kept): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.queue).into_iter().partition(|f| f.0.packet.from == host || f.0.packet.to == host);
        self.queue = kept.into_iter().collect();
        self.stats.vanished += gone.len() as u64;
        gone.into_iter().map(|f| f.0.packet).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_overtakes_datagrams_sent_before_it() {
        let config = NetConfig {
            delay_min: Duration::from_micros(100),
            delay_max: Duration::from_micros(100),
            frame_min: Duration::from_micros(10),
            frame_max: Duration::from_micros(10),
        };
        let mut net = SimNet::new(config);
        let mut rng = SimRng::new(1);
        let origin = Origin { conn: 0, side: 0, kind: Kind::Ack, seq: None };
        let packet = |path, bytes: u8| Carried {
            from: 0,
            to: 1,
            path,
            bytes: vec![bytes],
            origin,
            corrupted: false,
            misdirected: false,
        };
        net.carry(&mut rng, packet(Path::Datagram, 1), None);
        net.carry(&mut rng, packet(Path::Frame, 2), None);
        net.now += Duration::from_millis(1);
        let order: Vec<u8> = std::iter::from_fn(|| net.pop_due()).map(|p| p.bytes[0]).collect();
        assert_eq!(order, vec![2, 1]);
    }
}
