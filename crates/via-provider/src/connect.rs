//! Connection management: the client-server and peer-to-peer models.
//!
//! `viad` matches a request with a listener or a peer and says which
//! transport joins them: processes of one host get the connection segment
//! and a socket pair (`transport::shm::setup`), VIs on different hosts
//! the other's endpoint (`transport::udp::setup`).  This module runs the
//! VI's state through the models: a request waits for the answer past its
//! timeout once matched, up to [`TAKEN_GRACE`], as it does for a listener
//! on another host, so a request taken just before its timeout is not
//! lost to it; a listener waits no longer than [`HANDSHAKE`] for a client
//! of this host to say `Ready`, and goes on to the next request.

use crate::endpoint::Endpoint;
use crate::handles::Handle;
use crate::nic::Nic;
use crate::provider;
use crate::timeout::Deadline;
use crate::transport::shm::setup::HANDSHAKE;
use crate::transport::{shm, udp, Ending};
use crate::vi::{Link, Linked, Transport, Vi, ViState};
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;
use via_core::error::{ViaError, ViaResult};
use via_shm::conn::CONN_SEGMENT_BYTES;
use via_wire::cm::CmEndpoint;
use viad_client::client::{self, AgentError, Request};

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
    Local(shm::setup::Offer),
    Remote { responder: client::Responder, endpoint: CmEndpoint },
}

pub use viad_client::proto::TAKEN_GRACE;

/// How long past its own timeout a listener waits for the `Ready` of a
/// client matched just before it (an honest one takes milliseconds).
pub const READY_GRACE: Duration = Duration::from_millis(500);

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
                // The client says Ready once its receives are published;
                // matched just before the timeout, it still has a moment.
                let ready_by = deadline.extended_by(READY_GRACE).capped(HANDSHAKE);
                match shm::setup::offer(fds, nic, &ready_by)? {
                    Some(offer) => (offer.peer, Answer::Local(offer)),
                    None if deadline.passed() => return Err(ViaError::Timeout),
                    // A client that vanished, lied or dawdled during the
                    // handshake: wait for the next one.
                    None => continue,
                }
            }
            client::Transport::Remote(responder) => match client::decode_endpoint(&incoming.remote_info) {
                Some(endpoint) => (udp::setup::endpoint_of(&endpoint), Answer::Remote { responder, endpoint }),
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
        Answer::Local(offer) => offer.accept(vi)?,
        Answer::Remote { responder, endpoint } => {
            let family = if endpoint.addr.is_ipv6() { &[0u8; 16][..] } else { &[0u8; 4][..] };
            let identity = udp::setup::identity(vi, family)?;
            let link = identity.link(vi, &endpoint);
            // Connected before answering, so that the client's first packets find the VI.
            link.complete(vi);
            if let Err(e) = responder.accept(&identity.info) {
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
        Some(Answer::Local(offer)) => offer.reject(),
        Some(Answer::Remote { responder, .. }) => {
            let _ = responder.reject();
        }
        None => {}
    }
    Ok(())
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

/// Runs one rendezvous (client-server or peer) to a linked connection.
fn rendezvous(
    vi: &Arc<Vi>,
    local: &NetAddress,
    remote: &NetAddress,
    deadline: &Deadline,
    peer_model: bool,
) -> ViaResult<Linked> {
    let identity = match client::is_local_host(&remote.host) {
        true => None,
        false => Some(udp::setup::identity(vi, &remote.host)?),
    };
    let info = identity.as_ref().map_or(Vec::new(), |identity| identity.info.clone());
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
            let conn = shm::setup::handshake(vi, fds, matched.side, &answer_by, peer_model)?;
            Ok(Linked { peer: conn.peer, link: Link::Shm(conn) })
        }
        (None, Some(identity)) => {
            let endpoint = client::decode_endpoint(&matched.remote_info).ok_or(ViaError::NotReachable)?;
            Ok(Linked { link: Link::Net(identity.link(vi, &endpoint)), peer: udp::setup::endpoint_of(&endpoint) })
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
    let identities = udp::setup::identity(a, &b.nic.device.host_addr)
        .and_then(|x| Ok((x, udp::setup::identity(b, &a.nic.device.host_addr)?)));
    let (id_a, id_b) = match identities {
        Ok(ids) => ids,
        Err(e) => {
            abort(a);
            abort(b);
            return Err(e);
        }
    };
    let seen_by_a = client::decode_endpoint(&id_b.info).ok_or(ViaError::NotReachable)?;
    let seen_by_b = client::decode_endpoint(&id_a.info).ok_or(ViaError::NotReachable)?;
    let peer_a = udp::setup::endpoint_of(&seen_by_a);
    let peer_b = udp::setup::endpoint_of(&seen_by_b);
    finish(a, Linked { link: Link::Net(id_a.link(a, &seen_by_a)), peer: peer_a });
    finish(b, Linked { link: Link::Net(id_b.link(b, &seen_by_b)), peer: peer_b });
    Ok(())
}

/// Connects `a` and `b`, VIs of this process, over shared memory, as the
/// host agent and the handshake would: one connection segment and socket
/// pair between them, each side mapping the other's bell, lane and
/// registry table.  The whole-provider simulator's local connections.
#[cfg(test)]
pub(crate) fn link_locally(a: &Arc<Vi>, b: &Arc<Vi>) -> ViaResult<(Arc<shm::Conn>, Arc<shm::Conn>)> {
    begin_pair(a, b)?;
    let conns = shm::setup::local_pair(a, b).map_err(|e| {
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
