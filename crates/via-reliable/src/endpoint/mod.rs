//! One network port without I/O: what it does with the packets its
//! datapath brings, for all the sessions it carries.
//!
//! A port carries many connections, each a [`Session`](crate::Session) of
//! its own.  The [`Endpoint`] holds what they share:
//!
//! - **routing**: every packet names its target VI; the endpoint hands
//!   consecutive packets of one VI to it together ([`Routes::deliver`]),
//!   whose session then checks the key;
//! - **owed acknowledgements**: a session that takes packets while more
//!   are coming holds back the acknowledgement it owes
//!   ([`Session::poll_transmit_busy`](crate::Session::poll_transmit_busy)).
//!   Its VI is remembered, and once a poll finds the datapath empty, all
//!   that arrived is placed and the endpoint has each such VI send its
//!   acknowledgement ([`Routes::send_owed_ack`]): acknowledged only after
//!   placing;
//! - **read scheduling**: which of the datapath's sources a poll reads
//!   ([`ReadSchedule`]);
//! - **frame or datagram**: a link may send a packet as an Ethernet frame,
//!   which takes another path than its UDP datagrams and may overtake them,
//!   only when it is the one packet in flight ([`FrameChoice`]).
//!
//! A [`Datapath`] moves the bytes: the provider's UDP sockets with GSO/GRO
//! with its packet ring of Ethernet frames [`Beside`] them, or the
//! simulator's network ([`crate::netsim`]).  [`Endpoint::poll`] drives it.

mod frames;
mod read_schedule;

pub use frames::FrameChoice;
pub use read_schedule::ReadSchedule;

use via_wire::{Header, Packet, WireError, HEADER_LEN};

/// The connections of a port, as its endpoint sees them: VI ids it routes
/// packets to.
pub trait Routes {
    /// Hands `packets` for VI `vi` (that came as a frame if `frame`) to it.
    /// `app_away`: the application is not polling, so no reply will carry
    /// an acknowledgement soon.  Returns `None` if the port has no VI `vi`,
    /// else whether its session now owes an acknowledgement it held back.
    fn deliver(&mut self, vi: u32, packets: &[(Header, &[u8])], frame: bool, app_away: bool) -> Option<bool>;

    /// VI `vi` sends the acknowledgement it held back, if it still owes it.
    /// With `app_away` (a reader took over for an application that is not
    /// polling) it acknowledges everything received, without the delay: no
    /// reply will carry it soon, and the reader's timer may wait long for a
    /// CPU the application is computing on, longer than the peer's
    /// retransmission timer.
    fn send_owed_ack(&mut self, vi: u32, app_away: bool);
}

/// Where a port's packets come from: some sources of frames and datagrams
/// that a poll reads, in the order and as often as its [`ReadSchedule`]
/// says.  Each read hands what it finds to the [`Arrivals`] and returns
/// whether it found anything; a source a datapath lacks has nothing.
/// Datapaths stack like smoltcp's devices: [`Beside`] puts one that takes
/// frames beside one that takes datagrams.
pub trait Datapath {
    /// Whether it takes Ethernet frames: they are read first, and its peer
    /// paths less often while they are quiet.
    fn takes_frames(&self) -> bool {
        false
    }
    /// Whether it has paths of its own to some peers (connected sockets);
    /// without, every poll reads the shared one.
    fn has_peer_paths(&self) -> bool {
        false
    }
    /// Reads the frames waiting.
    fn read_frames(&mut self, _arrivals: &mut Arrivals<'_>) -> bool {
        false
    }
    /// Reads the datagrams waiting on the paths to each peer.
    fn read_peers(&mut self, _arrivals: &mut Arrivals<'_>) -> bool {
        false
    }
    /// Reads the datagrams waiting on the shared path (those no peer path
    /// took: before a connection is complete, a peer without a path).
    fn read_shared(&mut self, _arrivals: &mut Arrivals<'_>) -> bool {
        false
    }
}

/// The frames of one datapath beside the datagrams of another: the
/// provider's packet ring beside its UDP sockets.
pub struct Beside<F, D> {
    /// Where frames come from.
    pub frames: F,
    /// Where datagrams come from.
    pub datagrams: D,
}

impl<F: Datapath, D: Datapath> Datapath for Beside<F, D> {
    fn takes_frames(&self) -> bool {
        self.frames.takes_frames()
    }
    fn has_peer_paths(&self) -> bool {
        self.datagrams.has_peer_paths()
    }
    fn read_frames(&mut self, arrivals: &mut Arrivals<'_>) -> bool {
        self.frames.read_frames(arrivals)
    }
    fn read_peers(&mut self, arrivals: &mut Arrivals<'_>) -> bool {
        self.datagrams.read_peers(arrivals)
    }
    fn read_shared(&mut self, arrivals: &mut Arrivals<'_>) -> bool {
        self.datagrams.read_shared(arrivals)
    }
}

/// A datapath that may be missing (a port without an Ethernet side).
impl<T: Datapath> Datapath for Option<T> {
    fn takes_frames(&self) -> bool {
        self.as_ref().is_some_and(T::takes_frames)
    }
    fn has_peer_paths(&self) -> bool {
        self.as_ref().is_some_and(T::has_peer_paths)
    }
    fn read_frames(&mut self, arrivals: &mut Arrivals<'_>) -> bool {
        self.as_mut().is_some_and(|d| d.read_frames(arrivals))
    }
    fn read_peers(&mut self, arrivals: &mut Arrivals<'_>) -> bool {
        self.as_mut().is_some_and(|d| d.read_peers(arrivals))
    }
    fn read_shared(&mut self, arrivals: &mut Arrivals<'_>) -> bool {
        self.as_mut().is_some_and(|d| d.read_shared(arrivals))
    }
}

/// What an endpoint counted since it was last asked ([`Endpoint::take_tally`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// Packets handed to a VI.
    pub packets: u64,
    /// Packets that came as frames.
    pub frames: u64,
    /// Packets refused as malformed (a bad checksum, a bad header).
    pub malformed: u64,
    /// Packets for a VI the port does not have.
    pub unknown_vi: u64,
    /// What was wrong with the last malformed packet, for the log.
    pub last_malformed: Option<WireError>,
}

/// A port's routing, owed acknowledgements and read schedule.
#[derive(Debug)]
pub struct Endpoint {
    /// Payload bytes per packet: a longer one is a large packet
    /// ([`Arrivals::datagrams`]).
    segment: usize,
    schedule: ReadSchedule,
    /// VIs whose sessions hold back an acknowledgement.
    owed: Vec<u32>,
    tally: Tally,
}

/// The endpoint's side of one poll, handed to the datapath's reads.
pub struct Arrivals<'a> {
    segment: usize,
    owed: &'a mut Vec<u32>,
    tally: &'a mut Tally,
    routes: &'a mut dyn Routes,
    app_away: bool,
}

impl Endpoint {
    /// An endpoint whose packets carry up to `segment` payload bytes.
    pub fn new(segment: usize) -> Endpoint {
        Endpoint { segment, schedule: ReadSchedule::default(), owed: Vec::new(), tally: Tally::default() }
    }

    /// One poll: reads the datagrams and frames waiting in `datapath`, as
    /// its schedule says (with `everything`, every source, for a reader
    /// that takes over for an application that is not polling), hands them
    /// to their VIs in `routes`, and once nothing came, has the VIs that
    /// held back an acknowledgement send it.  Returns whether anything came.
    pub fn poll(&mut self, datapath: &mut dyn Datapath, routes: &mut dyn Routes, everything: bool) -> bool {
        let frames = datapath.takes_frames();
        let mut arrivals = Arrivals {
            segment: self.segment,
            owed: &mut self.owed,
            tally: &mut self.tally,
            routes,
            app_away: everything,
        };
        let mut busy = false;
        // Frames first: one is always the oldest packet its session has
        // in flight (`FrameChoice`).
        if frames {
            busy |= datapath.read_frames(&mut arrivals);
        }
        let peers_read = self.schedule.peers_due(frames, everything);
        let got = peers_read && datapath.read_peers(&mut arrivals);
        self.schedule.peers_done(got);
        busy |= got;
        if self.schedule.unconnected_due(peers_read, busy, !datapath.has_peer_paths(), everything) {
            busy |= datapath.read_shared(&mut arrivals);
        }
        // Idle: what came has been put where it belongs, so now is the
        // time to acknowledge it (a reply may have done so already).
        if !busy {
            let Arrivals { owed, routes, .. } = arrivals;
            for vi in owed.drain(..) {
                routes.send_owed_ack(vi, everything);
            }
        }
        busy
    }

    /// VIs that still owe an acknowledgement (until a poll finds nothing).
    pub fn owed(&self) -> &[u32] {
        &self.owed
    }

    /// What was counted since the last call.
    pub fn take_tally(&mut self) -> Tally {
        std::mem::take(&mut self.tally)
    }
}

impl Arrivals<'_> {
    /// Whether the application is away (the poll reads everything for it).
    pub fn app_away(&self) -> bool {
        self.app_away
    }

    /// Hands datagrams, each one packet, to their VIs, consecutive packets
    /// of one VI together so that one acknowledgement can answer several.
    /// Returns the VI of the last large packet among them (longer than a
    /// segment), whose next packet probably follows on the same path.
    pub fn datagrams<'d>(&mut self, datagrams: impl IntoIterator<Item = &'d [u8]>) -> Option<u32> {
        // Consecutive packets of one VI: on the stack for the usual few.
        let mut run: smallvec::SmallVec<[(Header, &[u8]); 4]> = smallvec::SmallVec::new();
        let mut run_vi = None;
        let mut large = None;
        for datagram in datagrams {
            let Some(header) = self.parse(datagram) else { continue };
            if run_vi != Some(header.dst_vi) {
                self.deliver(run_vi, &run, false);
                run.clear();
                run_vi = Some(header.dst_vi);
            }
            if datagram.len() > HEADER_LEN + self.segment {
                large = Some(header.dst_vi);
            }
            run.push((header, &datagram[HEADER_LEN..]));
        }
        self.deliver(run_vi, &run, false);
        large
    }

    /// Hands a packet that came as a frame to its VI.
    pub fn frame(&mut self, packet: &[u8]) {
        if let Some(header) = self.parse(packet) {
            self.tally.frames += 1;
            self.deliver(Some(header.dst_vi), &[(header, &packet[HEADER_LEN..])], true);
        }
    }

    /// Hands a packet whose header the datapath parsed apart from its
    /// payload (a payload received in place) to its VI.
    pub fn packet(&mut self, header: Header, payload: &[u8]) {
        self.deliver(Some(header.dst_vi), &[(header, payload)], false);
    }

    /// Counts a packet the datapath found malformed, and why if it knows.
    pub fn malformed(&mut self, why: Option<WireError>) {
        self.tally.malformed += 1;
        self.tally.last_malformed = why.or(self.tally.last_malformed);
    }

    /// The header of `packet`, checked; `None` (counted) for a malformed one.
    fn parse(&mut self, packet: &[u8]) -> Option<Header> {
        match Packet::new_checked(packet).and_then(|p| Header::parse(&p)) {
            Ok(h) => Some(h),
            Err(e) => {
                self.malformed(Some(e));
                None
            }
        }
    }

    fn deliver(&mut self, vi: Option<u32>, packets: &[(Header, &[u8])], frame: bool) {
        let Some(id) = vi else { return };
        if packets.is_empty() {
            return;
        }
        match self.routes.deliver(id, packets, frame, self.app_away) {
            Some(owes) => {
                self.tally.packets += packets.len() as u64;
                if owes && !self.owed.contains(&id) {
                    self.owed.push(id);
                }
            }
            None => self.tally.unknown_vi += packets.len() as u64,
        }
    }
}

#[cfg(test)]
mod tests;
