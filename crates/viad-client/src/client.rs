//! What the provider library calls: sessions, rendezvous requests, counters.
//!
//! Every call opens its own connection to the agent, so calls are thread-safe
//! and share no state.
//!
//! # Connections across hosts
//!
//! A request whose remote host is not this host ([`is_local_host`]) is
//! carried to that host's agent by the connection managers.  Its `info` must
//! then be the requester's network endpoint encoded with [`encode_endpoint`]
//! (the agent refuses anything else with [`AgentError::Protocol`]); the
//! answer's `remote_info` is the other side's endpoint in the same encoding,
//! and no descriptors come with it (`Matched::fds` is `None`).  A listener
//! gets such a request as an [`Incoming`] whose transport is
//! [`Transport::Remote`], and answers it with [`Responder::accept`] (its own
//! encoded endpoint) or [`Responder::reject`].  Same-host requests keep
//! handing `info` over untouched.
//!
//! # Which agent a client trusts
//!
//! Any local user can bind an abstract socket name, so a name proves
//! nothing.  Right after connecting, before it sends a byte or a descriptor,
//! the client asks the kernel who listens on the socket (`SO_PEERCRED`: the
//! credentials of the process that called `listen`) and talks to the agent
//! only if it runs as root or as this process's effective uid.  Otherwise the
//! call fails with [`AgentError::Untrusted`], which names the socket and the
//! impostor's uid and pid.
//!
//! So that each user still finds an agent it can trust, a client that finds
//! the configured name (`VIA_AGENT_SOCKET`, else [`DEFAULT_SOCKET`], or the
//! name given to [`Agent::with_socket`]) held by another non-root user goes
//! to a name of its own, `<name>.<euid>` ([`user_socket_name`]), and starts
//! an agent there on demand (when the handle starts agents at all, see
//! [`Agent::autostart`]).  The agent found there must pass the same check.
//! The call fails with `Untrusted` when that agent does not, or when no agent
//! runs there and none may be started (then the error names the configured
//! socket's impostor), and with [`AgentError::Unavailable`] when starting one
//! failed.  Processes pair up only through one agent: those of a user sent
//! to its own agent do not meet processes that use the configured one, and
//! that agent reaches other hosts only if it could bind the CM port (a
//! privileged port by default, which an agent of a user other than root
//! cannot bind): when it could not, a request for another host fails at
//! once with [`AgentError::NoCmPort`], which says why.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use via_wire::cm::{CmEndpoint, CmMessage};

pub use crate::device::{local_host_addrs, DeviceInfo};
pub use crate::proto::Side;
use crate::proto::{ConnectReq, ErrorKind, ListenReq, Reply, Request as ProtoRequest, FOREVER};
use crate::{launch, proto, sock};

/// Abstract socket name of the agent unless `VIA_AGENT_SOCKET` says otherwise.
pub const DEFAULT_SOCKET: &str = "openvia-viad";
/// Environment variable naming the agent's abstract socket.
pub const SOCKET_ENV: &str = "VIA_AGENT_SOCKET";
/// Extra time the client waits beyond a request's own timeout for the agent's answer.
const REPLY_GRACE: Duration = Duration::from_secs(5);
/// How long the client retries connecting after starting the agent.
const START_WAIT: Duration = Duration::from_secs(3);
/// Id carried by the CM `Accept` message that frames an encoded endpoint.
const ENDPOINT_FRAME_ID: u64 = 0;

/// Why a call to the agent failed.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// No agent answers and none could be started.
    #[error("VI agent unavailable: {0}")]
    Unavailable(String),
    /// The device name does not name a VI device of this host.
    #[error("unknown VI device: {0}")]
    UnknownDevice(String),
    /// Nothing matched before the request's timeout (for a listener's
    /// answer: the requester no longer waits).
    #[error("no matching connection request")]
    NoMatch,
    /// The host address cannot be reached: the host answered nothing.
    #[error("host address not reachable")]
    Unreachable,
    /// The remote listener rejected the connect request.
    #[error("connection request rejected")]
    Rejected,
    /// The wait timed out.
    #[error("timed out")]
    Timeout,
    /// The caller's cancel fd ended the wait (see [`Agent::cancelled_by`]).
    #[error("cancelled")]
    Cancelled,
    /// A malformed or unexpected message, or a refused request.
    #[error("VI agent protocol error: {0}")]
    Protocol(String),
    /// An I/O error on the agent connection.
    #[error("VI agent I/O error: {0}")]
    Io(#[from] io::Error),
    /// The agent on `socket` runs as neither root nor this process's
    /// effective uid: nothing was sent to it (see the module docs).
    #[error("VI agent on @{socket} is not trusted: it runs as uid {uid} (pid {pid}), neither root nor this user")]
    Untrusted {
        /// The abstract socket name.
        socket: String,
        /// The effective uid of the process that listens on it.
        uid: u32,
        /// Its process id (0 when not visible from this pid namespace).
        pid: i32,
    },
    /// The agent refused: this uid may not do that (e.g. stop an agent of
    /// another user).
    #[error("VI agent refused: {0}")]
    PermissionDenied(String),
    /// The agent refused: this uid holds as many connections to it as it may.
    #[error("VI agent limit reached: {0}")]
    Limit(String),
    /// A request for another host, and this host's agent has no CM port:
    /// it could not bind it (the reason says why: not root, or another
    /// process holds the port) or runs without one.  It serves this host
    /// only.
    #[error("other hosts are unreachable: {0}")]
    NoCmPort(String),
}

/// An open device: keeps its connection to the agent open while it lives.
#[derive(Debug)]
pub struct Session {
    _conn: OwnedFd,
}

impl Session {
    /// Opens a session for `device` with the agent named by the environment,
    /// starting the agent if none runs.
    pub fn open(device: &str) -> Result<(Session, DeviceInfo), AgentError> {
        Agent::from_env().open_session(device, None)
    }

    /// Opens a session and hands the agent the process's counter page
    /// (`via_shm::stats`), which `viad --stats` then reports.
    pub fn open_with_stats(device: &str, stats: BorrowedFd) -> Result<(Session, DeviceInfo), AgentError> {
        Agent::from_env().open_session(device, Some(stats))
    }
}

/// What a matched connection hands each side.
#[derive(Debug)]
pub struct ConnFds {
    /// The connection segment (a memfd), the same file on both sides.
    pub segment: OwnedFd,
    /// This side's end of the connection's socket pair.
    pub socket: OwnedFd,
    /// The other side's bell: the futex words its CQ waits sleep on.
    pub peer_bell: OwnedFd,
}

/// A connection request delivered to a listener.
#[derive(Debug)]
pub struct Incoming {
    /// Host address of the requester.
    pub remote_host: Vec<u8>,
    /// Discriminator of the requester.
    pub remote_disc: Vec<u8>,
    /// The requester's info blob (for a requester on another host: its
    /// endpoint, see [`decode_endpoint`]).
    pub remote_info: Vec<u8>,
    /// How the connection is made.
    pub transport: Transport,
}

/// How a listener's connection is made.
#[derive(Debug)]
pub enum Transport {
    /// The requester is on this host: the connection's resources.  The
    /// acceptance travels on the socket pair.
    Local(ConnFds),
    /// The requester is on another host: answer through the agent.
    Remote(Responder),
}

/// Answers a request from another host.  Holds the agent connection that
/// delivered it; dropping it unanswered gives the request back to the agent,
/// which hands it to the next listener.
#[derive(Debug)]
pub struct Responder {
    conn: OwnedFd,
}

impl Responder {
    /// Accepts with this process's endpoint (see [`encode_endpoint`]).
    /// Returns once the requester's agent has acknowledged: the requester
    /// has its `Matched`.  `Err(NoMatch)` when the requester no longer waits,
    /// `Err(Unreachable)` when its agent never acknowledged (5 s),
    /// `Err(Protocol)` when `info` is not an endpoint.
    pub fn accept(self, info: &[u8]) -> Result<(), AgentError> {
        self.answer(ProtoRequest::Accept { info: info.to_vec() })
    }

    /// Rejects the request; the requester gets [`AgentError::Rejected`].
    /// Returns once the agent has taken the answer (it delivers it on its
    /// own).  `Err(NoMatch)` when the requester no longer waits.
    pub fn reject(self) -> Result<(), AgentError> {
        self.answer(ProtoRequest::Reject)
    }

    fn answer(self, req: ProtoRequest) -> Result<(), AgentError> {
        let wait = proto::ANSWER_GIVE_UP + REPLY_GRACE;
        match exchange(&self.conn, &req, &[], None, Some(wait))?.0 {
            Reply::Done => Ok(()),
            Reply::NoMatch => Err(AgentError::NoMatch),
            Reply::Unreachable => Err(AgentError::Unreachable),
            other => Err(unexpected(&other)),
        }
    }
}

/// A matched connect or peer request.
#[derive(Debug)]
pub struct Matched {
    /// Which side this process is.  Across hosts, the connect requester is
    /// side A; of two peers, the one on the host with the larger address.
    pub side: Side,
    /// The other side's info blob (across hosts: its endpoint, see
    /// [`decode_endpoint`]).
    pub remote_info: Vec<u8>,
    /// The connection's resources; `None` when the peer is on another host.
    pub fds: Option<ConnFds>,
}

/// A connect or peer request.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// Host address of the requesting device.
    pub local_host: &'a [u8],
    /// Discriminator of the requesting endpoint.
    pub local_disc: &'a [u8],
    /// Host address asked for.
    pub remote_host: &'a [u8],
    /// Discriminator asked for.
    pub remote_disc: &'a [u8],
    /// Opaque blob handed to the other side.
    pub info: &'a [u8],
    /// This process's bell, handed to the other side.
    pub bell: BorrowedFd<'a>,
    /// Size of the connection segment wanted.
    pub segment_bytes: u64,
}

/// Encodes a network endpoint as the `info` of a request for another host
/// (and of a listener's [`Responder::accept`]).
///
/// The encoding is the CM message `Accept { id: 0, endpoint }` of
/// [`via_wire::cm`], framing and checksum included, so that the agent puts
/// exactly what the CM protocol carries on the wire.
pub fn encode_endpoint(endpoint: &CmEndpoint) -> Vec<u8> {
    let msg = CmMessage::Accept { id: ENDPOINT_FRAME_ID, endpoint: endpoint.clone() };
    // An Accept has no field with a limit: encoding cannot fail.
    msg.try_encode().unwrap_or_default()
}

/// Decodes what [`encode_endpoint`] made; `None` for anything else.
pub fn decode_endpoint(info: &[u8]) -> Option<CmEndpoint> {
    match CmMessage::decode(info) {
        Ok(CmMessage::Accept { id: ENDPOINT_FRAME_ID, endpoint }) => Some(endpoint),
        _ => None,
    }
}

/// Whether VIA host address `host` is this host: 127.0.0.0/8, `::1`, or an
/// address (IPv4 or IPv6) of one of its interfaces.  Requests for any other
/// host go to that host's agent.
pub fn is_local_host(host: &[u8]) -> bool {
    crate::device::is_local(host)
}

/// The socket name from `VIA_AGENT_SOCKET`, or [`DEFAULT_SOCKET`].
pub fn socket_name() -> String {
    std::env::var(SOCKET_ENV).ok().filter(|s| !s.is_empty()).unwrap_or_else(|| DEFAULT_SOCKET.to_string())
}

/// The abstract name of this user's own agent, used when the agent on `name`
/// belongs to another non-root user: `<name>.<euid>`.
pub fn user_socket_name(name: &str) -> String {
    // SAFETY: geteuid has no preconditions.
    format!("{name}.{}", unsafe { libc::geteuid() })
}

/// Waits for one connection request for `disc` on `host`. None timeout = for ever.
/// Err(Timeout) when it passes.  The request may come from another host
/// ([`Transport::Remote`]).
pub fn listen(
    host: &[u8],
    disc: &[u8],
    info: &[u8],
    bell: BorrowedFd,
    timeout: Option<Duration>,
) -> Result<Incoming, AgentError> {
    Agent::from_env().listen(host, disc, info, bell, timeout)
}

/// Asks for a listener; on success this process is side A.  For a listener
/// on another host: `Err(Rejected)` if it rejects, `Err(NoMatch)` if that
/// host is up (its agent, or its kernel when no agent runs there, answered)
/// but no listener took the request in time, `Err(Unreachable)` if the
/// host answered nothing, and at once
/// `Err(NoCmPort)` if this host's agent has no CM port.
pub fn connect(req: &Request, timeout: Duration) -> Result<Matched, AgentError> {
    Agent::from_env().connect(req, timeout)
}

/// Asks for the mirror-image peer request.
pub fn peer_connect(req: &Request, timeout: Duration) -> Result<Matched, AgentError> {
    Agent::from_env().peer_connect(req, timeout)
}

/// The running agent's counters; does not start an agent.
pub fn stats() -> Result<Vec<(String, u64)>, AgentError> {
    Agent::from_env().stats()
}

/// Asks the running agent to exit; does not start an agent.
pub fn stop() -> Result<(), AgentError> {
    Agent::from_env().stop()
}

/// A handle on one agent, by socket name.
#[derive(Debug, Clone)]
pub struct Agent {
    socket: String,
    autostart: bool,
    /// Ends a wait for a reply when it becomes readable.
    cancel: Option<std::sync::Arc<OwnedFd>>,
}

impl Agent {
    /// The agent named by `VIA_AGENT_SOCKET`, started on demand.
    pub fn from_env() -> Agent {
        Agent { socket: socket_name(), autostart: true, cancel: None }
    }

    /// The agent on abstract socket `name`, not started on demand.
    pub fn with_socket(name: &str) -> Agent {
        Agent { socket: name.to_string(), autostart: false, cancel: None }
    }

    /// Sets whether a missing agent is started on demand.
    pub fn autostart(mut self, on: bool) -> Agent {
        self.autostart = on;
        self
    }

    /// Ends every wait for the agent's reply with [`AgentError::Cancelled`]
    /// once `fd` becomes readable (an eventfd that closing a NIC signals,
    /// say): a call blocked for ever in another thread returns.
    pub fn cancelled_by(mut self, fd: std::sync::Arc<OwnedFd>) -> Agent {
        self.cancel = Some(fd);
        self
    }

    /// The abstract socket name.
    pub fn socket(&self) -> &str {
        &self.socket
    }

    /// Opens a session for `device`; see [`Session::open`].
    pub fn open_session(&self, device: &str, stats: Option<BorrowedFd>) -> Result<(Session, DeviceInfo), AgentError> {
        let hello = ProtoRequest::Hello { device: device.to_string() };
        let fds: Vec<BorrowedFd> = stats.into_iter().collect();
        let (conn, reply, _) = self.call(&hello, &fds, Some(REPLY_GRACE), self.autostart)?;
        match reply {
            Reply::Device { name, interface, host_addr, host_addr6, mtu } => Ok((
                Session { _conn: conn },
                DeviceInfo { name, interface, host_addr, host_addr6: Some(host_addr6).filter(|a| !a.is_empty()), mtu },
            )),
            other => Err(unexpected(&other)),
        }
    }

    /// Waits for one connection request; see [`listen`].
    pub fn listen(
        &self,
        host: &[u8],
        disc: &[u8],
        info: &[u8],
        bell: BorrowedFd,
        timeout: Option<Duration>,
    ) -> Result<Incoming, AgentError> {
        let req = ProtoRequest::Listen(ListenReq {
            host: host.to_vec(),
            disc: disc.to_vec(),
            info: info.to_vec(),
            timeout_ms: timeout.map_or(FOREVER, millis),
            pid: std::process::id(),
        });
        let wait = timeout.and_then(|t| t.checked_add(REPLY_GRACE));
        let (conn, reply, fds) = self.call(&req, &[bell], wait, self.autostart)?;
        match reply {
            Reply::Incoming { remote_host, remote_disc, remote_info, remote } => Ok(Incoming {
                remote_host,
                remote_disc,
                remote_info,
                transport: match remote {
                    true if fds.is_empty() => Transport::Remote(Responder { conn }),
                    true => return Err(AgentError::Protocol("unexpected descriptors".into())),
                    false => Transport::Local(conn_fds(fds)?),
                },
            }),
            // The agent ends an unanswered listen at its timeout.
            Reply::NoMatch => Err(AgentError::Timeout),
            other => Err(unexpected(&other)),
        }
    }

    /// Asks for a listener; see [`connect`].
    pub fn connect(&self, req: &Request, timeout: Duration) -> Result<Matched, AgentError> {
        self.rendezvous(ProtoRequest::Connect(connect_req(req, timeout)), req.bell, timeout)
    }

    /// Asks for the mirror-image peer request; see [`peer_connect`].
    pub fn peer_connect(&self, req: &Request, timeout: Duration) -> Result<Matched, AgentError> {
        let peer = ProtoRequest::PeerConnect(connect_req(req, timeout));
        self.rendezvous(peer, req.bell, timeout)
    }

    /// The agent's counters, by name, fetched a reply's worth at a time
    /// (processes coming or going between replies may shift the list).
    pub fn stats(&self) -> Result<Vec<(String, u64)>, AgentError> {
        let mut all: Vec<(String, u64)> = Vec::new();
        loop {
            let start = all.len() as u32;
            match self.call(&ProtoRequest::Stats { start }, &[], Some(REPLY_GRACE), false)?.1 {
                Reply::Stats { counters, total } => {
                    let last = counters.is_empty() || start as usize + counters.len() >= total as usize;
                    all.extend(counters);
                    if last {
                        return Ok(all);
                    }
                }
                other => return Err(unexpected(&other)),
            }
        }
    }

    /// Asks the agent to exit.
    pub fn stop(&self) -> Result<(), AgentError> {
        match self.call(&ProtoRequest::Stop, &[], Some(REPLY_GRACE), false)?.1 {
            Reply::Done => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    fn rendezvous(&self, req: ProtoRequest, bell: BorrowedFd, timeout: Duration) -> Result<Matched, AgentError> {
        // The agent may wait past the timeout for a listener that took the
        // request (`proto::TAKEN_GRACE`).
        let wait = timeout.checked_add(proto::TAKEN_GRACE + REPLY_GRACE);
        let (_, reply, fds) = self.call(&req, &[bell], wait, self.autostart)?;
        let (side, remote_info, remote) = match reply {
            Reply::Matched { remote_info, remote } if matches!(req, ProtoRequest::Connect(_)) => {
                (Side::A, remote_info, remote)
            }
            Reply::PeerMatched { side, remote_info, remote } if matches!(req, ProtoRequest::PeerConnect(_)) => {
                (side, remote_info, remote)
            }
            Reply::NoMatch => return Err(AgentError::NoMatch),
            Reply::Unreachable => return Err(AgentError::Unreachable),
            Reply::Rejected => return Err(AgentError::Rejected),
            other => return Err(unexpected(&other)),
        };
        let fds = match remote {
            true if fds.is_empty() => None,
            true => return Err(AgentError::Protocol("unexpected descriptors".into())),
            false => Some(conn_fds(fds)?),
        };
        Ok(Matched { side, remote_info, fds })
    }

    /// Sends one request and waits up to `wait` for its reply.
    fn call(
        &self,
        req: &ProtoRequest,
        fds: &[BorrowedFd],
        wait: Option<Duration>,
        autostart: bool,
    ) -> Result<(OwnedFd, Reply, Vec<OwnedFd>), AgentError> {
        // Refuse what cannot be encoded before starting an agent for it.
        req.encode().map_err(|e| AgentError::Protocol(e.to_string()))?;
        let conn = self.open(autostart)?;
        let cancel = self.cancel.as_ref().map(|c| c.as_fd());
        let (reply, fds) = exchange(&conn, req, fds, cancel, wait)?;
        Ok((conn, reply, fds))
    }

    /// Connects to an agent this process may trust: the one on the
    /// configured name, or else this user's own (see the module docs).
    fn open(&self, autostart: bool) -> Result<OwnedFd, AgentError> {
        let refused = match open_trusted(&self.socket, autostart) {
            Err(e @ AgentError::Untrusted { .. }) => e,
            other => return other,
        };
        let own = user_socket_name(&self.socket);
        tracing::debug!("{refused}; trying @{own}");
        match open_trusted(&own, autostart) {
            // With no agent of its own to go to, the refusal is the answer.
            Err(AgentError::Unavailable(_)) if !autostart => Err(refused),
            Err(AgentError::Unavailable(why)) => Err(AgentError::Unavailable(format!("{refused}; {why}"))),
            other => other,
        }
    }
}

/// Connects to the agent on `name`, starting it first if allowed and nobody
/// answers, and checks who it is before anything is sent.
fn open_trusted(name: &str, autostart: bool) -> Result<OwnedFd, AgentError> {
    let conn = connect_or_start(name, autostart)?;
    check_trusted(name, &conn)?;
    Ok(conn)
}

/// Connects to the agent on `name`, starting it first if allowed and nobody
/// answers.
fn connect_or_start(name: &str, autostart: bool) -> Result<OwnedFd, AgentError> {
    let unavailable = |e: io::Error| AgentError::Unavailable(format!("@{name}: {e}"));
    match sock::connect(name) {
        Ok(fd) => return Ok(fd),
        // A full backlog means the agent runs but is busy: retry only.
        Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {}
        Err(e) if !autostart || !absent(&e) => return Err(unavailable(e)),
        Err(_) => launch::start(name)?,
    }
    let deadline = Instant::now() + START_WAIT;
    loop {
        match sock::connect(name) {
            Ok(fd) => return Ok(fd),
            Err(e) if Instant::now() >= deadline => return Err(unavailable(e)),
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// Accepts the agent at the other end of `conn` only if it runs as root or
/// as this process's effective uid: anyone can bind an abstract name.
fn check_trusted(name: &str, conn: &OwnedFd) -> Result<(), AgentError> {
    let cred = sock::peer_cred(conn.as_fd())?;
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    match cred.uid == 0 || cred.uid == euid {
        true => Ok(()),
        false => Err(AgentError::Untrusted { socket: name.to_string(), uid: cred.uid, pid: cred.pid }),
    }
}

/// Sends one request on `conn` and waits up to `wait` for its reply.
fn exchange(
    conn: &OwnedFd,
    req: &ProtoRequest,
    fds: &[BorrowedFd],
    cancel: Option<BorrowedFd>,
    wait: Option<Duration>,
) -> Result<(Reply, Vec<OwnedFd>), AgentError> {
    let bytes = req.encode().map_err(|e| AgentError::Protocol(e.to_string()))?;
    match sock::send(conn.as_fd(), &bytes, fds) {
        // An agent that refuses a connection (over its per-uid limit, or a
        // listener's answer that came too late) closes it, but its reason may
        // still wait to be read.
        Err(e) if e.raw_os_error() == Some(libc::EPIPE) => {}
        other => other?,
    }
    match sock::wait_readable_unless(conn.as_fd(), cancel, wait)? {
        sock::Readiness::Readable => {}
        sock::Readiness::TimedOut => return Err(AgentError::Timeout),
        sock::Readiness::Cancelled => return Err(AgentError::Cancelled),
    }
    let msg = recv_reply(conn)?;
    if msg.truncated {
        return Err(AgentError::Protocol("truncated reply".into()));
    }
    match Reply::decode(&msg.data).map_err(|e| AgentError::Protocol(e.to_string()))? {
        Reply::Error { kind: ErrorKind::UnknownDevice, message } => Err(AgentError::UnknownDevice(message)),
        Reply::Error { kind: ErrorKind::PermissionDenied, message } => Err(AgentError::PermissionDenied(message)),
        Reply::Error { kind: ErrorKind::Limit, message } => Err(AgentError::Limit(message)),
        Reply::Error { kind: ErrorKind::NoCmPort, message } => Err(AgentError::NoCmPort(message)),
        Reply::Error { message, .. } => Err(AgentError::Protocol(message)),
        reply => Ok((reply, msg.fds)),
    }
}

/// Receives the agent's reply on `conn`.
fn recv_reply(conn: &OwnedFd) -> Result<sock::Received, AgentError> {
    let msg = match sock::recv(conn.as_fd()) {
        // The agent closed the connection with our request unread (it
        // refused the connection): the reset comes first, then the reason
        // it sent, if any.
        Err(e) if e.raw_os_error() == Some(libc::ECONNRESET) => match sock::recv(conn.as_fd()) {
            Ok(Some(msg)) => Some(msg),
            _ => return Err(e.into()),
        },
        other => other?,
    };
    msg.ok_or_else(|| AgentError::Unavailable("the agent closed the connection".into()))
}

/// Whether a connect error means nobody listens on the name.
fn absent(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ECONNREFUSED) | Some(libc::ENOENT))
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(FOREVER)
}

fn connect_req(req: &Request, timeout: Duration) -> ConnectReq {
    ConnectReq {
        local_host: req.local_host.to_vec(),
        local_disc: req.local_disc.to_vec(),
        remote_host: req.remote_host.to_vec(),
        remote_disc: req.remote_disc.to_vec(),
        info: req.info.to_vec(),
        timeout_ms: millis(timeout),
        segment_bytes: req.segment_bytes,
        pid: std::process::id(),
    }
}

fn conn_fds(fds: Vec<OwnedFd>) -> Result<ConnFds, AgentError> {
    let Ok([segment, socket, peer_bell]) = <[OwnedFd; 3]>::try_from(fds) else {
        return Err(AgentError::Protocol("expected 3 descriptors".into()));
    };
    Ok(ConnFds { segment, socket, peer_bell })
}

fn unexpected(reply: &Reply) -> AgentError {
    AgentError::Protocol(format!("unexpected reply {reply:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(addr: &str) -> CmEndpoint {
        CmEndpoint {
            addr: addr.parse().unwrap(),
            vi: 3,
            key: 0xfeed_f00d_dead_beef,
            reliability: 4,
            max_transfer: 65536,
            rdma_write: true,
            rdma_read: false,
            segment: 1400,
            payload_crc: true,
            ether: None,
            large_packets: false,
            placed_acks: false,
        }
    }

    #[test]
    fn endpoints_round_trip() {
        for addr in ["10.77.1.1:40000", "[fd77::1]:1"] {
            let e = endpoint(addr);
            let info = encode_endpoint(&e);
            assert_eq!(decode_endpoint(&info), Some(e));
            // Every truncation and any trailing byte is refused.
            for n in 0..info.len() {
                assert_eq!(decode_endpoint(&info[..n]), None);
            }
            let mut longer = info.clone();
            longer.push(0);
            assert_eq!(decode_endpoint(&longer), None);
        }
        // Other CM messages, and an Accept with another id, are not endpoints.
        let e = endpoint("10.0.0.1:1");
        let other = CmMessage::Accept { id: 1, endpoint: e }.encode();
        assert_eq!(decode_endpoint(&other), None);
        assert_eq!(decode_endpoint(&CmMessage::Ack { id: 0 }.encode()), None);
        assert_eq!(decode_endpoint(b"same-host info"), None);
    }

    #[test]
    fn local_hosts() {
        assert!(is_local_host(&[127, 0, 0, 1]));
        assert!(is_local_host(&[127, 1, 2, 3]));
        let mut v6 = [0u8; 16];
        v6[15] = 1;
        assert!(is_local_host(&v6));
        assert!(!is_local_host(&[10, 255, 255, 254]) || local_host_addrs().contains(&vec![10, 255, 255, 254]));
        assert!(!is_local_host(&[1, 2, 3]));
    }
}
