//! A host's [`Datapath`], receive side: where arrived packets wait for its
//! endpoint's reads, and what the reads handed it.

use std::collections::VecDeque;

use via_wire::Packet;

use super::net::{Carried, Origin, Path};
use crate::endpoint::{Arrivals, Datapath};

/// What the datapath handed the endpoint, for checking its tally.
#[derive(Debug, Clone, Copy)]
pub(super) struct Handed {
    pub(super) corrupted: bool,
    pub(super) frame: bool,
    /// The destination VI in the bytes (of an intact packet).
    pub(super) dst_vi: u32,
    pub(super) origin: Origin,
}

impl Handed {
    fn of(p: &Carried) -> Handed {
        let dst_vi = if p.corrupted { 0 } else { Packet::new_unchecked(&p.bytes[..]).dst_vi() };
        Handed { corrupted: p.corrupted, frame: p.path == Path::Frame, dst_vi, origin: p.origin }
    }
}

/// One host's datapath, receive side: the frames that arrived, the
/// datagrams of each peer that has a path of its own (a connected socket),
/// and the shared path where the others' datagrams wait (the unconnected
/// socket).
#[derive(Debug)]
pub struct SimDatapath {
    frames: VecDeque<Carried>,
    /// Datagrams per sending host, for those with a peer path.
    peers: Vec<VecDeque<Carried>>,
    shared: VecDeque<Carried>,
    /// Which hosts' datagrams have a path of their own.
    peer_path: Vec<bool>,
    /// Datagrams one read of one path takes at most (as `recvmmsg`'s vlen).
    batch: usize,
    /// What the reads handed to the endpoint since the last look.
    handed: Vec<Handed>,
}

impl SimDatapath {
    /// A datapath with a path of its own for the datagrams of each host
    /// `peer_path` marks (by host index), reading up to `batch` datagrams
    /// of a path at once.
    pub fn new(peer_path: Vec<bool>, batch: usize) -> SimDatapath {
        SimDatapath {
            frames: VecDeque::new(),
            peers: vec![VecDeque::new(); peer_path.len()],
            shared: VecDeque::new(),
            peer_path,
            batch: batch.max(1),
            handed: Vec::new(),
        }
    }

    /// A packet arrived from the network.
    pub fn arrive(&mut self, packet: Carried) {
        match packet.path {
            Path::Frame => self.frames.push_back(packet),
            Path::Datagram if self.peer_path[packet.from] => self.peers[packet.from].push_back(packet),
            Path::Datagram => self.shared.push_back(packet),
        }
    }

    /// Whether nothing waits to be read.
    pub fn is_empty(&self) -> bool {
        self.frames.is_empty() && self.shared.is_empty() && self.peers.iter().all(VecDeque::is_empty)
    }

    /// Packets waiting to be read.
    pub fn waiting(&self) -> impl Iterator<Item = &Carried> {
        self.frames.iter().chain(self.peers.iter().flatten()).chain(self.shared.iter())
    }

    /// Drops everything waiting (the host died); returns it.
    pub(super) fn clear(&mut self) -> Vec<Carried> {
        let mut gone: Vec<Carried> = self.frames.drain(..).collect();
        for q in &mut self.peers {
            gone.extend(q.drain(..));
        }
        gone.extend(self.shared.drain(..));
        gone
    }

    pub(super) fn take_handed(&mut self) -> Vec<Handed> {
        std::mem::take(&mut self.handed)
    }

    /// Hands up to a batch of `queue`'s datagrams to the endpoint.
    fn read_batch(
        queue: &mut VecDeque<Carried>,
        batch: usize,
        handed: &mut Vec<Handed>,
        arrivals: &mut Arrivals<'_>,
    ) -> bool {
        let n = queue.len().min(batch);
        if n == 0 {
            return false;
        }
        let taken: Vec<Carried> = queue.drain(..n).collect();
        handed.extend(taken.iter().map(Handed::of));
        arrivals.datagrams(taken.iter().map(|p| &p.bytes[..]));
        true
    }
}

impl Datapath for SimDatapath {
    fn takes_frames(&self) -> bool {
        true
    }

    fn has_peer_paths(&self) -> bool {
        true
    }

    fn read_frames(&mut self, arrivals: &mut Arrivals<'_>) -> bool {
        let any = !self.frames.is_empty();
        while let Some(p) = self.frames.pop_front() {
            self.handed.push(Handed::of(&p));
            arrivals.frame(&p.bytes);
        }
        any
    }

    fn read_peers(&mut self, arrivals: &mut Arrivals<'_>) -> bool {
        let mut any = false;
        for queue in &mut self.peers {
            any |= SimDatapath::read_batch(queue, self.batch, &mut self.handed, arrivals);
        }
        any
    }

    fn read_shared(&mut self, arrivals: &mut Arrivals<'_>) -> bool {
        SimDatapath::read_batch(&mut self.shared, self.batch, &mut self.handed, arrivals)
    }
}
