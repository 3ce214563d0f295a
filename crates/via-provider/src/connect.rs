//! Connection management: the client-server and peer-to-peer models.
//!
//! `viad` introduces the two processes and hands both the connection
//! segment and a socket pair.  Each side then maps the segment, publishes
//! the receives it has already posted, and says `Ready` with its endpoint
//! and its registry table; only then may the other side send, so that
//! pre-posted receives are never missed.  The server answers the client's
//! `Ready` with `Accept` or `Reject`; peers just exchange `Ready`.  Who the
//! peer is comes from the kernel with its first message
//! ([`crate::peer_channel`]), and a peer that does not say `Ready` within
//! [`HANDSHAKE`] is dropped, so a listener goes on to the next request.
//! Once matched, a request waits past its timeout for the listener's
//! answer, up to [`TAKEN_GRACE`], as it does for a listener on another
//! host: a request taken just before its timeout is not lost to it.

use crate::endpoint::{Endpoint, PeerMessage};
use crate::handles::Handle;
use crate::lane::Lane;
use crate::nic::Nic;
use crate::peer_channel::{self, Sender};
use crate::provider;
use crate::timeout::Deadline;
pub(crate) use crate::transport::shm::Conn;
use crate::transport::udp::{NetLink, NetPort};
use crate::transport::Ending;
pub(crate) use crate::vi::Linked;
use crate::vi::{Link, Transport, Vi, ViState};
use parking_lot::Mutex;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Weak};
use std::time::Duration;
use via_core::consts::SERVICE_UNRELIABLE;
use via_core::error::{ViaError, ViaResult};
use via_shm::bell::Bell;
use via_shm::conn::{ConnSegment, Side, CONN_SEGMENT_BYTES};
use via_shm::inbox::Inbox;
use via_shm::region::SharedRegion;
use via_shm::table::TableSegment;
use via_wire::cm::CmEndpoint;
use viad_client::client::{self, AgentError, ConnFds, Request};

/// What `VipConnectWait` returns: a request waiting for an answer.
pub struct PendingConn {
    /// The NIC it arrived on.
    pub nic: Arc<Nic>,
    /// Client host address.
    pub remote_host: Vec<u8>,
    /// Client discriminator.
    pub remote_disc: Vec<u8>,
    /// The client's endpoint.
    pub peer: Endpoint,
    parts: Mutex<Option<Answer>>,
}

/// How a pending request is answered: on its socket pair (same host) or
/// through the host agent (another host).
enum Answer {
    Local(Parts, Introduction),
    Remote { responder: client::Responder, endpoint: CmEndpoint },
}

struct Parts {
    seg: Arc<ConnSegment>,
    socket: OwnedFd,
    peer_bell: Arc<Bell>,
}

/// The two lanes of a connection: ours for the peer, the peer's for us.
struct LanePair {
    lane_in: Arc<Lane>,
    lane_out: Arc<Inbox>,
}

/// What the peer's `Ready` or `Accept` established: who it is (the
/// kernel's word) and its registry table.
struct Introduction {
    sender: Sender,
    table: Arc<TableSegment>,
}

/// How long a peer may take to say `Ready` once `viad` has matched it.
/// An honest peer takes milliseconds; a listener waits no longer for one
/// that does not, and goes on to the next request.
pub const HANDSHAKE: Duration = Duration::from_secs(2);

pub use viad_client::proto::TAKEN_GRACE;

/// How long past its own timeout a listener waits for the `Ready` of a
/// client matched just before it (an honest one takes milliseconds).
pub const READY_GRACE: Duration = Duration::from_millis(500);

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
fn conn_lost(vi: &Vi) -> crate::transport::shm::conn::LostFn {
    let provider = Arc::downgrade(&vi.nic.provider);
    Box::new(move |conn, code| {
        if let Some(vi) = provider.upgrade().and_then(|p| Vi::get_in(&p, conn.vi).ok()) {
            vi.peer_lost(conn, code);
        }
    })
}

/// The host agent, for a call that closing `nic` ends.
fn agent(nic: &Nic) -> client::Agent {
    client::Agent::from_env().cancelled_by(nic.closing.clone())
}

fn agent_error(e: AgentError) -> ViaError {
    match e {
        AgentError::NoMatch => ViaError::NoMatch,
        AgentError::Unreachable => ViaError::NotReachable,
        // This host's agent cannot reach other hosts at all: say why (not
        // root, or another process holds the CM port).
        e @ AgentError::NoCmPort(_) => {
            tracing::warn!("host agent: {e}");
            ViaError::NotReachable
        }
        AgentError::Timeout => ViaError::Timeout,
        // Another thread closed the NIC: its handle is no longer valid.
        AgentError::Cancelled => ViaError::InvalidParameter,
        AgentError::UnknownDevice(_) => ViaError::InvalidParameter,
        other => {
            tracing::warn!("host agent: {other}");
            ViaError::Resource
        }
    }
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

fn side(s: client::Side) -> Side {
    match s {
        client::Side::A => Side::A,
        client::Side::B => Side::B,
    }
}

/// Splits a `VIP_NET_ADDRESS` into host address and discriminator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetAddress {
    /// Host address bytes.
    pub host: Vec<u8>,
    /// Discriminator bytes.
    pub disc: Vec<u8>,
}

/// `VipConnectWait`.
pub fn connect_wait(nic: &Arc<Nic>, local: &NetAddress, timeout_ms: u64) -> ViaResult<Handle> {
    let deadline = Deadline::after_ms(timeout_ms);
    loop {
        let incoming = agent(nic)
            .listen(&nic.device.host_addr, &local.disc, &[], nic.bell.fd(), deadline.remaining())
            .map_err(agent_error)?;
        let (peer, answer) = match incoming.transport {
            client::Transport::Local(fds) => {
                let parts = map_parts(fds, Side::B)?;
                // The client says Ready once its receives are published;
                // matched just before the timeout, it still has a moment.
                let ready_by = deadline.extended_by(READY_GRACE).capped(HANDSHAKE);
                match introduction(&parts.socket, nic, &ready_by) {
                    Ok(Some((PeerMessage::Ready(peer), Some(intro)))) => (peer, Answer::Local(parts, intro)),
                    _ if deadline.passed() => return Err(ViaError::Timeout),
                    // A client that vanished, lied or dawdled during the
                    // handshake: wait for the next one.
                    _ => continue,
                }
            }
            client::Transport::Remote(responder) => match client::decode_endpoint(&incoming.remote_info) {
                Some(endpoint) => (endpoint_of(&endpoint), Answer::Remote { responder, endpoint }),
                None => {
                    let _ = responder.reject();
                    continue;
                }
            },
        };
        let pending = PendingConn {
            nic: nic.clone(),
            remote_host: incoming.remote_host,
            remote_disc: incoming.remote_disc,
            peer,
            parts: Mutex::new(Some(answer)),
        };
        return provider().conns.insert(|_| Arc::new(pending)).map(|(h, _)| h).ok_or(ViaError::Resource);
    }
}

/// `VipConnectAccept`.
pub fn accept(conn: Handle, vi: &Arc<Vi>) -> ViaResult<()> {
    let pending = provider().conns.get(conn).ok_or(ViaError::InvalidParameter)?;
    if !Arc::ptr_eq(&vi.nic, &pending.nic) {
        return Err(ViaError::InvalidParameter);
    }
    if vi.state() != ViState::Idle {
        return Err(ViaError::InvalidState);
    }
    let attrs = vi.attrs();
    if attrs.reliability != pending.peer.reliability {
        return Err(ViaError::InvalidReliabilityLevel);
    }
    if attrs.max_transfer != pending.peer.max_transfer {
        return Err(ViaError::InvalidMtu);
    }
    let answer = pending.parts.lock().take().ok_or(ViaError::InvalidParameter)?;
    provider().conns.remove(conn);
    match answer {
        Answer::Local(parts, intro) => {
            vi.attach_segment(parts.seg.clone())?;
            // Before we say Accept: a client that probes on it has our leave.
            via_shm::cma::allow_peer(intro.sender.pid);
            let lanes = introduce(&parts.socket, PeerMessage::Accept(vi.endpoint()), vi)
                .and_then(|()| exchange_lanes(&parts.socket, &vi.nic, intro.sender.pid, &Deadline::after_ms(u64::MAX)));
            let Ok(lanes) = lanes else {
                vi.detach_segment();
                return Err(ViaError::Timeout);
            };
            Arc::new(parts.into_conn(intro, lanes, pending.peer, vi)).complete(vi);
        }
        Answer::Remote { responder, endpoint } => {
            let family = if endpoint.addr.is_ipv6() { &[0u8; 16][..] } else { &[0u8; 4][..] };
            let (port, key, info) = net_identity(vi, family)?;
            let link = net_link(vi, port, key, &endpoint);
            // Connected before answering, so that the client's first packets find the VI.
            link.complete(vi);
            if let Err(e) = responder.accept(&info) {
                tracing::warn!("accepting a remote connection: {e}");
                let _ = vi.disconnect();
                return Err(ViaError::Timeout);
            }
        }
    }
    Ok(())
}

/// `VipConnectReject`.
pub fn reject(conn: Handle) -> ViaResult<()> {
    let pending = provider().conns.remove(conn).ok_or(ViaError::InvalidParameter)?;
    match pending.parts.lock().take() {
        Some(Answer::Local(parts, _)) => {
            let _ = peer_channel::send(parts.socket.as_fd(), &PeerMessage::Reject, None);
        }
        Some(Answer::Remote { responder, .. }) => {
            let _ = responder.reject();
        }
        None => {}
    }
    Ok(())
}

/// The VI's identity on the network: the NIC's port, a fresh key, and the
/// encoded endpoint that travels in the connection request.  Devices
/// without an IPv4 address have no port: they connect on this host only.
fn net_identity(vi: &Vi, remote_host: &[u8]) -> ViaResult<(Arc<NetPort>, u64, Vec<u8>)> {
    let port = vi.nic.port()?;
    let key = random_key()?;
    let a = vi.attrs();
    let endpoint = CmEndpoint {
        addr: port.local_for(remote_host)?,
        vi: vi.handle as u32,
        key,
        reliability: a.reliability,
        max_transfer: a.max_transfer.min(u32::MAX as u64) as u32,
        rdma_write: a.rdma_write,
        rdma_read: a.rdma_read,
        segment: port.segment as u32,
        payload_crc: vi.nic.tuning.payload_crc,
        ether: port.local_ether(),
        large_packets: port.takes_large_packets(),
        placed_acks: true,
    };
    Ok((port, key, client::encode_endpoint(&endpoint)))
}

fn net_link(vi: &Vi, port: Arc<NetPort>, key: u64, remote: &CmEndpoint) -> Arc<NetLink> {
    let a = vi.attrs();
    // Large packets when both ends take them: a window of 16 (1 MiB at
    // MTU 1500) holds about what 256 packets of a datagram each did.
    let large = remote.large_packets && port.takes_large_packets();
    let (max_payload, window) = match large {
        true => (port.large_payload, 16),
        false => (port.segment.min(remote.segment as usize).max(1), via_reliable::Config::default().window),
    };
    let config = via_reliable::Config {
        reliable: a.reliability != SERVICE_UNRELIABLE,
        max_payload,
        window,
        max_message: a.max_transfer.min(u32::MAX as u64) as u32,
        // Either end may insist on the CRC-32C over payloads.
        payload_crc: vi.nic.tuning.payload_crc || remote.payload_crc,
        ..Default::default()
    };
    let local = via_reliable::Peer { vi: vi.handle as u32, key };
    let peer = via_reliable::Peer { vi: remote.vi, key: remote.key };
    // An RDMA write completes with the acknowledgement of its last packet
    // where the target places before it acknowledges (reliable levels).
    let placed_acks = remote.placed_acks && config.reliable;
    Arc::new(NetLink::new(port, remote.addr, remote.ether, config, local, peer, placed_acks))
}

/// A remote endpoint as the VI attributes report it.
fn endpoint_of(e: &CmEndpoint) -> Endpoint {
    Endpoint {
        vi: e.vi as u64,
        recv_cq: crate::endpoint::NO_CQ,
        reliability: e.reliability,
        max_transfer: e.max_transfer as u64,
        rdma_write: e.rdma_write,
        rdma_read: e.rdma_read,
        ptag: 0,
    }
}

/// A connection key from the OS random source: a key anyone could guess
/// would let them inject packets, so without one there is no connection.
fn random_key() -> ViaResult<u64> {
    match getrandom::u64() {
        Ok(key) => Ok(key | 1),
        Err(e) => {
            tracing::warn!("no connection key: the OS random source failed: {e}");
            Err(ViaError::Resource)
        }
    }
}

fn request<'a>(vi: &'a Vi, remote: &'a NetAddress, local: &'a NetAddress, info: &'a [u8]) -> Request<'a> {
    Request {
        local_host: &vi.nic.device.host_addr,
        local_disc: &local.disc,
        remote_host: &remote.host,
        remote_disc: &remote.disc,
        info,
        bell: vi.nic.bell.fd(),
        segment_bytes: CONN_SEGMENT_BYTES as u64,
    }
}

fn begin(vi: &Vi) -> ViaResult<()> {
    // Idle -> ConnectPending, once.
    match vi.state() {
        ViState::Idle => {
            vi.set_state(ViState::ConnectPending);
            Ok(())
        }
        _ => Err(ViaError::InvalidState),
    }
}

fn abort(vi: &Vi) {
    vi.detach_segment();
    vi.set_state(ViState::Idle);
}

/// Completes the shared-memory handshake after `viad` matched us: map,
/// publish receives, say Ready, and wait for `expect` (Accept or the peer's Ready).
fn shm_handshake(vi: &Vi, fds: ConnFds, side: Side, deadline: &Deadline, peer_model: bool) -> ViaResult<Arc<Conn>> {
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

/// Runs one rendezvous (client-server or peer) to a linked connection.
fn rendezvous(
    vi: &Arc<Vi>,
    local: &NetAddress,
    remote: &NetAddress,
    deadline: &Deadline,
    peer_model: bool,
) -> ViaResult<Linked> {
    let identity = if client::is_local_host(&remote.host) { None } else { Some(net_identity(vi, &remote.host)?) };
    let info = identity.as_ref().map_or(Vec::new(), |(_, _, info)| info.clone());
    let req = request(vi, remote, local, &info);
    let matched = if peer_model {
        // Unmatched at its timeout is a timeout in the peer model.
        agent(&vi.nic).peer_connect(&req, deadline.remaining_or_long()).map_err(|e| match agent_error(e) {
            ViaError::NoMatch => ViaError::Timeout,
            other => other,
        })?
    } else {
        agent(&vi.nic).connect(&req, deadline.remaining_or_long()).map_err(agent_error)?
    };
    match (matched.fds, identity) {
        (Some(fds), _) => {
            // Matched: the listener's answer may come past the timeout.
            let answer_by = deadline.extended_by(TAKEN_GRACE);
            let conn = shm_handshake(vi, fds, side(matched.side), &answer_by, peer_model)?;
            Ok(Linked { peer: conn.peer, link: Link::Shm(conn) })
        }
        (None, Some((port, key, _))) => {
            let endpoint = client::decode_endpoint(&matched.remote_info).ok_or(ViaError::NotReachable)?;
            Ok(Linked { link: Link::Net(net_link(vi, port, key, &endpoint)), peer: endpoint_of(&endpoint) })
        }
        (None, None) => Err(ViaError::NotReachable),
    }
}

fn finish(vi: &Arc<Vi>, linked: Linked) -> Endpoint {
    linked.link.complete(vi);
    linked.peer
}

/// Begins connecting `a` and `b` to each other (the simulator's
/// connections): their reliability levels must match.
#[cfg(test)]
fn begin_pair(a: &Vi, b: &Vi) -> ViaResult<()> {
    if a.attrs().reliability != b.attrs().reliability {
        return Err(ViaError::InvalidReliabilityLevel);
    }
    begin(a)?;
    if let Err(e) = begin(b) {
        abort(a);
        return Err(e);
    }
    Ok(())
}

/// Connects `a` and `b`, VIs of this process on NICs of different hosts,
/// as the host agents' rendezvous would: each side's endpoint, encoded as
/// it travels in a connection request, reaches the other.  The
/// whole-provider simulator's connection manager.
#[cfg(test)]
pub(crate) fn link_directly(a: &Arc<Vi>, b: &Arc<Vi>) -> ViaResult<()> {
    begin_pair(a, b)?;
    let identities =
        net_identity(a, &b.nic.device.host_addr).and_then(|x| Ok((x, net_identity(b, &a.nic.device.host_addr)?)));
    let ((port_a, key_a, info_a), (port_b, key_b, info_b)) = match identities {
        Ok(ids) => ids,
        Err(e) => {
            abort(a);
            abort(b);
            return Err(e);
        }
    };
    let seen_by_a = client::decode_endpoint(&info_b).ok_or(ViaError::NotReachable)?;
    let seen_by_b = client::decode_endpoint(&info_a).ok_or(ViaError::NotReachable)?;
    finish(a, Linked { link: Link::Net(net_link(a, port_a, key_a, &seen_by_a)), peer: endpoint_of(&seen_by_a) });
    finish(b, Linked { link: Link::Net(net_link(b, port_b, key_b, &seen_by_b)), peer: endpoint_of(&seen_by_b) });
    Ok(())
}

/// Connects `a` and `b`, VIs of this process, over shared memory, as the
/// host agent and the handshake would: one connection segment and socket
/// pair between them, each side mapping the other's bell, lane and
/// registry table.  The whole-provider simulator's local connections.
#[cfg(test)]
pub(crate) fn link_locally(a: &Arc<Vi>, b: &Arc<Vi>) -> ViaResult<(Arc<Conn>, Arc<Conn>)> {
    begin_pair(a, b)?;
    let conns = local_pair(a, b).map_err(|e| {
        tracing::warn!("cannot make a local connection: {e}");
        abort(a);
        abort(b);
        ViaError::Resource
    })?;
    for (vi, conn) in [(a, &conns.0), (b, &conns.1)] {
        finish(vi, Linked { peer: conn.peer, link: Link::Shm(conn.clone()) });
    }
    Ok(conns)
}

/// The two sides of a local connection between `a` and `b`, their receives
/// published.
#[cfg(test)]
fn local_pair(a: &Arc<Vi>, b: &Arc<Vi>) -> std::io::Result<(Arc<Conn>, Arc<Conn>)> {
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

/// `VipConnectRequest`: returns the server's endpoint.
pub fn connect_request(vi: &Arc<Vi>, local: &NetAddress, remote: &NetAddress, timeout_ms: u64) -> ViaResult<Endpoint> {
    if timeout_ms == 0 {
        return Err(ViaError::InvalidParameter);
    }
    begin(vi)?;
    let deadline = Deadline::after_ms(timeout_ms);
    match rendezvous(vi, local, remote, &deadline, false) {
        Ok(linked) => Ok(finish(vi, linked)),
        Err(e) => {
            abort(vi);
            Err(e)
        }
    }
}

/// `VipConnectPeerRequest`: starts the rendezvous and returns at once.
pub fn peer_request(vi: &Arc<Vi>, local: &NetAddress, remote: &NetAddress, timeout_ms: u64) -> ViaResult<()> {
    if timeout_ms == 0 {
        return Err(ViaError::InvalidParameter);
    }
    begin(vi)?;
    *vi.peer_outcome.lock() = None;
    let deadline = Deadline::after_ms(timeout_ms);
    let (vi2, local, remote) = (vi.clone(), local.clone(), remote.clone());
    std::thread::Builder::new()
        .name("via-peer-connect".into())
        .spawn(move || {
            let outcome = rendezvous(&vi2, &local, &remote, &deadline, true);
            *vi2.peer_outcome.lock() = Some(outcome);
            vi2.bump();
        })
        .map_err(|_| ViaError::Resource)?;
    Ok(())
}

/// `VipConnectPeerDone` (`wait` false) and `VipConnectPeerWait` (`wait` true).
pub fn peer_done(vi: &Arc<Vi>, wait: bool) -> ViaResult<Endpoint> {
    if vi.state() != ViState::ConnectPending {
        return Err(ViaError::InvalidState);
    }
    let forever = Deadline::after_ms(crate::timeout::INFINITE_MS);
    loop {
        let outcome = vi.peer_outcome.lock().take();
        match outcome {
            Some(Ok(linked)) => {
                let peer = linked.peer;
                let attrs = vi.attrs();
                if attrs.reliability != peer.reliability || attrs.max_transfer != peer.max_transfer {
                    linked.link.end(Ending::Break(Some(via_core::consts::error_code::CONN_LOST)));
                    abort(vi);
                    return Err(if attrs.reliability != peer.reliability {
                        ViaError::InvalidReliabilityLevel
                    } else {
                        ViaError::InvalidMtu
                    });
                }
                return Ok(finish(vi, linked));
            }
            Some(Err(e)) => {
                abort(vi);
                return Err(e);
            }
            None if !wait => return Err(ViaError::NotDone),
            None => vi.wait_change(&forever),
        }
    }
}
