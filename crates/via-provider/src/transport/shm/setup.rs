//! Making a shared-memory connection, once `viad` has introduced the two
//! processes and handed both the connection segment and a socket pair.
//!
//! Each side maps the segment, publishes the receives it has already
//! posted, and says `Ready` with its endpoint and its registry table; only
//! then may the other side send, so that pre-posted receives are never
//! missed.  The server answers the client's `Ready` with `Accept` or
//! `Reject`; peers just exchange `Ready`.  Who the peer is comes from the
//! kernel with its first message ([`crate::peer_channel`]); then each side
//! gives the other its completion lane for it.

use super::Conn;
use crate::endpoint::{Endpoint, PeerMessage};
use crate::lane::LaneHold;
use crate::nic::Nic;
use crate::peer_channel::{self, Sender};
use crate::provider;
use crate::timeout::Deadline;
use crate::vi::{Transport, Vi};
use parking_lot::Mutex;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Weak};
use std::time::Duration;
use via_core::error::{ViaError, ViaResult};
use via_shm::bell::Bell;
use via_shm::conn::{ConnSegment, Side, CONN_SEGMENT_BYTES};
use via_shm::inbox::Inbox;
use via_shm::region::SharedRegion;
use via_shm::table::TableSegment;
use viad_client::client::{self, ConnFds};

/// How long a peer may take to say `Ready` once `viad` has matched it.
/// An honest peer takes milliseconds; a listener waits no longer for one
/// that does not, and goes on to the next request.
pub const HANDSHAKE: Duration = Duration::from_secs(2);

/// What `viad` handed over, mapped: the segment, our end of the socket
/// pair, and the peer's bell.
struct Parts {
    seg: Arc<ConnSegment>,
    socket: OwnedFd,
    peer_bell: Arc<Bell>,
}

/// The two lanes of a connection: ours for the peer, the peer's for us.
struct LanePair {
    lane_in: LaneHold,
    lane_out: Arc<Inbox>,
}

/// What the peer's `Ready` or `Accept` established: who it is (the
/// kernel's word) and its registry table.
struct Introduction {
    sender: Sender,
    table: Arc<TableSegment>,
}

/// A request from a client of this host that said `Ready`: what
/// `VipConnectAccept` or `VipConnectReject` answers.
pub(crate) struct Offer {
    parts: Parts,
    intro: Introduction,
    /// The client's endpoint.
    pub peer: Endpoint,
}

impl Parts {
    fn into_conn(self, intro: Introduction, lanes: LanePair, peer: Endpoint, vi: &Vi) -> Conn {
        // The peer's copies into us need our leave where Yama restricts
        // ptrace; given before we say Accept, so a client that probes on
        // our Accept has it.
        via_shm::cma::allow_peer(intro.sender.pid);
        let attach = via_shm::cma::may_attach(intro.sender.pid);
        if !attach {
            vi.nic.counters.add(crate::counters::Counter::RingConnections, 1);
        }
        Conn {
            seg: self.seg,
            socket: self.socket,
            lane_out: lanes.lane_out,
            peer_bell: self.peer_bell,
            lane_in: lanes.lane_in,
            peer_table: intro.table,
            peer_pid: intro.sender.pid,
            attach: AtomicBool::new(attach),
            peer,
            vi: vi.handle,
            lost: conn_lost(vi),
            token: Default::default(),
            counters: vi.nic.counters.clone(),
            inline_max: vi.nic.tuning.inline_max,
        }
    }
}

/// What a shared-memory connection of `vi` does when its peer went, or
/// broke it with a code: the VI, found in its provider's table, enters the
/// error state (if that connection is still its own).
fn conn_lost(vi: &Vi) -> super::conn::LostFn {
    let provider = Arc::downgrade(&vi.nic.provider);
    Box::new(move |conn, code| {
        if let Some(vi) = provider.upgrade().and_then(|p| Vi::get_in(&p, conn.vi).ok()) {
            vi.peer_lost(conn, code);
        }
    })
}

/// Says `Ready` or `Accept`: the endpoint, with this NIC's registry table.
fn introduce(socket: &OwnedFd, msg: PeerMessage, vi: &Vi) -> std::io::Result<()> {
    peer_channel::send(socket.as_fd(), &msg, Some(vi.nic.table.fd()))
}

/// Waits for the peer's introduction (`Ready` or `Accept`), or another
/// message.  `Ok(None)` on timeout; an introduction without the kernel's
/// word on its sender, or without a table that maps, is an error.
fn introduction(
    socket: &OwnedFd,
    nic: &Nic,
    deadline: &Deadline,
) -> std::io::Result<Option<(PeerMessage, Option<Introduction>)>> {
    let Some(got) = peer_channel::recv(socket.as_fd(), Some(nic.closing.as_fd()), deadline)? else {
        return Ok(None);
    };
    let refused = |why: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, why.to_string());
    match got.msg {
        PeerMessage::Ready(_) | PeerMessage::Accept(_) => {
            let sender = got.sender.ok_or_else(|| refused("no credentials from the peer"))?;
            let fd = got.fd.ok_or_else(|| refused("no registry table from the peer"))?;
            let table = provider().peer_tables.map(fd, TableSegment::map)?;
            Ok(Some((got.msg, Some(Introduction { sender, table }))))
        }
        other => Ok(Some((other, None))),
    }
}

fn map_parts(fds: ConnFds, side: Side) -> ViaResult<Parts> {
    let fail = |what: &str, e: &dyn std::fmt::Display| {
        tracing::warn!("cannot map the connection's {what}: {e}");
        ViaError::Resource
    };
    // Before anything can arrive on it: the kernel names every sender.
    peer_channel::expect_credentials(fds.socket.as_fd()).map_err(|e| fail("socket", &e))?;
    let region = SharedRegion::map_exact(fds.segment, CONN_SEGMENT_BYTES).map_err(|e| fail("segment", &e))?;
    let seg = ConnSegment::new(region, side).map_err(|e| fail("segment", &e))?;
    let peer_bell = provider().peer_bells.map(fds.peer_bell, Bell::map).map_err(|e| fail("peer bell", &e))?;
    Ok(Parts { seg: Arc::new(seg), socket: fds.socket, peer_bell })
}

/// Once the peer's introduction named it: gives the peer our lane for it,
/// and takes the peer's lane for us.  The peer's `Lane` must come from the
/// process that introduced itself, with a lane that maps.
fn exchange_lanes(socket: &OwnedFd, nic: &Nic, pid: i32, deadline: &Deadline) -> std::io::Result<LanePair> {
    let refused = |why: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, why.to_string());
    let lane_in = nic.lanes.for_peer(pid)?;
    // A thread asleep in VipCQWait looks again, at this lane too.
    nic.wake_cq_sleepers();
    peer_channel::send(socket.as_fd(), &PeerMessage::Lane, Some(lane_in.queues.fd()))?;
    let got = peer_channel::recv(socket.as_fd(), Some(nic.closing.as_fd()), &deadline.capped(HANDSHAKE))?
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::TimedOut, "no lane from the peer"))?;
    match (got.msg, got.sender, got.fd) {
        (PeerMessage::Lane, Some(sender), Some(fd)) if sender.pid == pid => {
            Ok(LanePair { lane_in, lane_out: provider().peer_lanes.map(fd, Inbox::map)? })
        }
        (PeerMessage::Reject, ..) => Err(std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "rejected")),
        _ => Err(refused("no lane from the peer that introduced itself")),
    }
}

/// The server's side of a request from this host: maps what `viad` handed
/// over and waits, up to `ready_by`, for the client's `Ready`.  `Ok(None)`
/// for a client that vanished, lied or dawdled during the handshake.
pub(crate) fn offer(fds: ConnFds, nic: &Nic, ready_by: &Deadline) -> ViaResult<Option<Offer>> {
    let parts = map_parts(fds, Side::B)?;
    match introduction(&parts.socket, nic, ready_by) {
        Ok(Some((PeerMessage::Ready(peer), Some(intro)))) => Ok(Some(Offer { parts, intro, peer })),
        _ => Ok(None),
    }
}

impl Offer {
    /// `VipConnectAccept`: connects `vi` to the client.
    pub(crate) fn accept(self, vi: &Arc<Vi>) -> ViaResult<()> {
        let Offer { parts, intro, peer } = self;
        vi.attach_segment(parts.seg.clone())?;
        // Before we say Accept: a client that probes on it has our leave.
        via_shm::cma::allow_peer(intro.sender.pid);
        let lanes = introduce(&parts.socket, PeerMessage::Accept(vi.endpoint()), vi)
            .and_then(|()| exchange_lanes(&parts.socket, &vi.nic, intro.sender.pid, &Deadline::after_ms(u64::MAX)));
        let Ok(lanes) = lanes else {
            vi.detach_segment();
            return Err(ViaError::Timeout);
        };
        Arc::new(parts.into_conn(intro, lanes, peer, vi)).complete(vi);
        Ok(())
    }

    /// `VipConnectReject`: tells the client.
    pub(crate) fn reject(self) {
        let _ = peer_channel::send(self.parts.socket.as_fd(), &PeerMessage::Reject, None);
    }
}

/// The requester's side, after `viad` matched it: maps, publishes the
/// receives, says `Ready`, and waits for `Accept` (client-server) or the
/// peer's `Ready` (`peer_model`).
pub(crate) fn handshake(
    vi: &Vi,
    fds: ConnFds,
    side: client::Side,
    deadline: &Deadline,
    peer_model: bool,
) -> ViaResult<Arc<Conn>> {
    let side = match side {
        client::Side::A => Side::A,
        client::Side::B => Side::B,
    };
    let parts = map_parts(fds, side)?;
    vi.attach_segment(parts.seg.clone())?;
    introduce(&parts.socket, PeerMessage::Ready(vi.endpoint()), vi).map_err(|_| ViaError::Timeout)?;
    let (peer, intro) = match introduction(&parts.socket, &vi.nic, deadline) {
        Ok(Some((PeerMessage::Accept(peer), Some(intro)))) if !peer_model => (peer, intro),
        Ok(Some((PeerMessage::Ready(peer), Some(intro)))) if peer_model => (peer, intro),
        Ok(Some((PeerMessage::Reject, _))) => return Err(ViaError::Reject),
        Ok(None) => return Err(ViaError::Timeout),
        // Another thread closed the NIC.
        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => return Err(ViaError::InvalidParameter),
        _ if peer_model => return Err(ViaError::Timeout),
        _ => return Err(ViaError::Reject),
    };
    let lanes = exchange_lanes(&parts.socket, &vi.nic, intro.sender.pid, deadline).map_err(|e| match e.kind() {
        std::io::ErrorKind::Interrupted => ViaError::InvalidParameter,
        std::io::ErrorKind::ConnectionRefused => ViaError::Reject,
        _ => ViaError::Timeout,
    })?;
    Ok(Arc::new(parts.into_conn(intro, lanes, peer, vi)))
}

/// The two sides of a local connection between `a` and `b`, VIs of this
/// process, as the host agent and the handshake would make them: one
/// connection segment and socket pair between them, each side mapping the
/// other's bell, lane and registry table, their receives published.
#[cfg(test)]
pub(crate) fn local_pair(a: &Arc<Vi>, b: &Arc<Vi>) -> std::io::Result<(Arc<Conn>, Arc<Conn>)> {
    let segment = SharedRegion::create("openvia-conn", CONN_SEGMENT_BYTES)?;
    let (socket_a, socket_b) = viad_client::sock::pair()?;
    // SAFETY: getuid cannot fail.
    let me = Sender { pid: std::process::id() as i32, uid: unsafe { libc::getuid() } };
    let mut parts = Vec::new();
    for (vi, peer, side, socket) in [(a, b, Side::A, socket_a), (b, a, Side::B, socket_b)] {
        let fds = ConnFds {
            segment: segment.fd().try_clone_to_owned()?,
            socket,
            peer_bell: peer.nic.bell.fd().try_clone_to_owned()?,
        };
        let part = map_parts(fds, side).map_err(|e| std::io::Error::other(format!("{e:?}")))?;
        vi.attach_segment(part.seg.clone()).map_err(|e| std::io::Error::other(format!("{e:?}")))?;
        parts.push(part);
    }
    let mut conns = parts.into_iter().zip([(a, b), (b, a)]).map(|(part, (vi, peer))| -> std::io::Result<Arc<Conn>> {
        let table = provider().peer_tables.map(peer.nic.table.fd().try_clone_to_owned()?, TableSegment::map)?;
        let lane_in = vi.nic.lanes.for_peer(me.pid)?;
        let theirs = peer.nic.lanes.for_peer(me.pid)?;
        let lane_out = provider().peer_lanes.map(theirs.queues.fd().try_clone_to_owned()?, Inbox::map)?;
        let intro = Introduction { sender: me, table };
        Ok(Arc::new(part.into_conn(intro, LanePair { lane_in, lane_out }, peer.endpoint(), vi)))
    });
    Ok((conns.next().unwrap()?, conns.next().unwrap()?))
}

/// The segments of the peer processes this process is connected to (their
/// inboxes, their registry tables), each mapped once however many
/// connections lead to its owner.  One mapping per connection would cost
/// each connection the segment's page tables, and completions pushed
/// through 128 VIs would go through 128 addresses of the same pages, one
/// TLB entry each.
pub struct PeerMappings<T>(Mutex<Vec<(FileIdentity, Weak<T>)>>);

impl<T> Default for PeerMappings<T> {
    fn default() -> Self {
        PeerMappings(Mutex::new(Vec::new()))
    }
}

/// A file's device and inode.
type FileIdentity = (u64, u64);

impl<T> PeerMappings<T> {
    /// The mapping of the segment behind `fd`: the one this process has if
    /// it is still in use, else a new one made by `map`.
    fn map(&self, fd: OwnedFd, map: impl FnOnce(OwnedFd) -> std::io::Result<T>) -> std::io::Result<Arc<T>> {
        // A live mapping holds its fd open, so its inode cannot be reused.
        let id = SharedRegion::file_identity(fd.as_fd())?;
        let mut mapped = self.0.lock();
        mapped.retain(|(_, inbox)| inbox.strong_count() > 0);
        if let Some(inbox) = mapped.iter().find(|(known, _)| *known == id).and_then(|(_, inbox)| inbox.upgrade()) {
            return Ok(inbox);
        }
        let segment = Arc::new(map(fd)?);
        mapped.push((id, Arc::downgrade(&segment)));
        Ok(segment)
    }
}
