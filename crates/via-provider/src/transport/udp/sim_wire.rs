//! A port's datapath in the whole-provider simulator (`crate::sim`): the
//! packets it sends go to the simulated network's send side, those that
//! arrive wait in a simulated datapath for its polls.  Host `h` is at
//! 10.0.0.`h + 1`, and where its wire takes Ethernet frames, at MAC
//! 02:00:00:00:00:`h + 1`, so a peer's address names its host.

use super::send::Packets;
use parking_lot::Mutex;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use via_reliable::netsim::{Origin, SendSide, SimDatapath};
use via_wire::{Header, Packet};

/// The UDP port number of every simulated host.
const PORT: u16 = 4791;

/// One simulated host's wire, shared by its port and the simulator.
pub(crate) struct SimWire {
    /// The host's index.
    pub host: usize,
    /// Whether it takes Ethernet frames beside its datagrams.
    pub frames: bool,
    /// Packets that arrived, until the port's polls read them.
    pub arrived: Mutex<SimDatapath>,
    /// Packets the port sent, until the simulator carries them.
    pub sent: Mutex<SendSide>,
}

impl SimWire {
    /// The wire of host `host` among `hosts`; with `frames`, it takes
    /// Ethernet frames too.
    pub(crate) fn new(host: usize, hosts: usize, frames: bool) -> SimWire {
        SimWire {
            host,
            frames,
            // Every peer has a path of its own, as a connected socket gives.
            arrived: Mutex::new(SimDatapath::new(vec![true; hosts], 32)),
            sent: Mutex::new(SendSide::default()),
        }
    }

    /// Sends `packets` to `to`, each as a datagram.
    pub(crate) fn send(&self, to: SocketAddr, packets: Packets<'_>) {
        let Some(host) = host_of(to) else { return };
        let mut sent = self.sent.lock();
        for i in 0..packets.len() {
            let bytes = packets.bytes(i);
            let origin = origin(&bytes);
            sent.send_datagram(host, bytes, origin, 0);
        }
    }

    /// Sends `packet` as a frame to `mac`; false if no host is there.
    pub(crate) fn send_frame(&self, mac: [u8; 6], packet: &[u8]) -> bool {
        let Some(host) = host_of_mac(mac) else { return false };
        self.sent.lock().send_frame(host, packet.to_vec(), origin(packet), 0);
        true
    }
}

/// What the simulated network notes of a packet it carries.
fn origin(packet: &[u8]) -> Origin {
    let header = Header::parse(&Packet::new_unchecked(packet)).ok();
    Origin {
        conn: 0,
        side: 0,
        kind: header.map_or(via_wire::Kind::Ack, |h| h.kind),
        seq: header.filter(|h| h.kind.is_sequenced()).map(|h| h.seq),
    }
}

/// Host `host`'s Ethernet address.
pub(crate) fn mac_of(host: usize) -> [u8; 6] {
    [2, 0, 0, 0, 0, host as u8 + 1]
}

/// The host at Ethernet address `mac`, if it is one.
pub(crate) fn host_of_mac(mac: [u8; 6]) -> Option<usize> {
    match mac {
        [2, 0, 0, 0, 0, n] => (n as usize).checked_sub(1),
        _ => None,
    }
}

/// Host `host`'s address.
pub(crate) fn addr_of(host: usize) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, host as u8 + 1)), PORT)
}

/// The host at `addr`, if it is one.
fn host_of(addr: SocketAddr) -> Option<usize> {
    match addr.ip() {
        IpAddr::V4(ip) if ip.octets()[..3] == [10, 0, 0] && addr.port() == PORT => {
            (ip.octets()[3] as usize).checked_sub(1)
        }
        _ => None,
    }
}
