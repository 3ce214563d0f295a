//! The agent's event loop: sessions, rendezvous by discriminator, connection
//! management across hosts, counters.
//!
//! One thread polls the listening socket, a signalfd, the CM socket and every
//! client.  A client sends exactly one request per connection (a listener
//! that received a request from another host sends one more: its answer);
//! waiting requests stay in the client table until they match, time out or
//! their client goes away.
//!
//! # Across hosts
//!
//! A `Connect` for a host address that is not this host's is forwarded to
//! that host's agent as a CM `Request` on UDP (see [`crate::cm`] for the
//! retransmission and expiry rules).  The remote agent holds it, answers each
//! copy with `Ack`, and hands it to a listener of its own (oldest first) as
//! an `Incoming` without descriptors; the listener's process answers on the
//! same connection with `Accept` (its endpoint) or `Reject`, which the remote
//! agent sends back until the requester's agent acknowledges it.  A listener
//! that goes away without answering gives the request back to the queue.
//!
//! A `PeerConnect` for another host is forwarded only by the host whose
//! address is the larger one (byte-wise), as `Request { peer: true }`; the
//! other host never forwards, and matches the forwarded request with its
//! local mirror-image request, answering `Accept` with its local process's
//! endpoint.  The forwarder's process is side A, the other one side B.  The
//! side-B process is told `PeerMatched` once the Accept is acknowledged; if
//! the forwarder's agent says the request no longer waits (`NoMatch`), the
//! local request waits again.
//!
//! `NoMatch { id }` also says: "this request is not for this host" (its
//! `to_host` is not one of ours), "too many requests are held here", and,
//! from a requester's agent to an `Accept`, "that request no longer waits"
//! (the listener's `Responder::accept` then fails with `NoMatch`).  An
//! `Accept` whose `Ack` was lost is acknowledged again for
//! [`crate::cm::FINISHED_MEMORY`]; a `Reject` is always acknowledged.
//!
//! # The CM port
//!
//! The agent sends every CM message from its CM socket and takes CM
//! messages only from the CM port of the other host: a datagram from any
//! other source port is dropped before it is parsed and counted
//! (`cm_refused_source`).  The default port ([`CM_PORT`]) is privileged, so
//! no other local user can bind it before the agent, and a message from it
//! comes from a privileged process of its host.  Where the port is not
//! privileged on this host (a port at or above
//! `net.ipv4.ip_unprivileged_port_start`) the agent says so at start.  A CM
//! port the agent cannot bind (`EACCES`: not root; `EADDRINUSE`: another
//! process holds it) is logged and shown by `viad --stats` (`cm_port` 0,
//! `cm_bind_errno`); the agent serves this host only, and a request for
//! another host fails at once with `Error { NoCmPort }`, whose message says
//! why.
//!
//! A listener that holds a request from another host must answer within
//! [`ANSWER_TIME`]; after that the agent tells it `NoMatch`, closes its
//! connection and gives the request back to the queue, so that a listener
//! that never answers cannot keep the requester waiting until it gives up.
//!
//! # Trust and resources
//!
//! The agent learns each client's uid and pid from the kernel
//! (`SO_PEERCRED`) when it accepts the connection; what a client states
//! about itself (the `pid` of a request) is only logged.
//!
//! * Only root or the agent's own uid may `Stop` it; anyone else gets
//!   `Error { PermissionDenied }` and the agent goes on.
//! * Each other uid may hold at most [`Config::max_connections_per_uid`]
//!   connections (sessions, waiting requests, unanswered connections); one
//!   more gets `Error { Limit }` and is closed at once.  Root and the
//!   agent's own uid are exempt: they can stop or kill the agent anyway, so
//!   a limit would protect nothing from them.
//! * At start the agent raises its soft `RLIMIT_NOFILE` to the hard limit.
//!   When it runs out of descriptors all the same (`accept` fails with
//!   `EMFILE`, `ENFILE`, ...), it stops polling its socket until a client
//!   goes away or [`ACCEPT_PAUSE`] has passed, instead of spinning on a
//!   connection it cannot take.
//! * Request ids come from the OS random source; without it the agent does
//!   not start.
//! * The agent creates connection segments of exactly
//!   [`via_shm::CONN_SEGMENT_BYTES`]; a request that asks for another size
//!   (0 means "the agent's") is refused.

use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};
use via_wire::cm::{CmEndpoint, CmMessage, CM_PORT};

use crate::client::{decode_endpoint, encode_endpoint};
use crate::cm::{Arrival, Cm, Event, Held, HeldKey, HeldState, Outcome};
use crate::device;
use crate::proto::{ConnectReq, ErrorKind, Reply, Request, Side, FOREVER};
use crate::sock::{self, Cred};
use crate::udp::CmSocket;

/// How long a listener may hold a request from another host unanswered.
pub const ANSWER_TIME: Duration = Duration::from_secs(5);
/// How long the agent leaves its socket alone after `accept` failed for want
/// of descriptors or memory (unless a client goes away first).
pub const ACCEPT_PAUSE: Duration = Duration::from_millis(100);
/// Default of [`Config::max_connections_per_uid`].
pub const MAX_CONNECTIONS_PER_UID: usize = 1024;
/// The size of every connection segment the agent creates.
const SEGMENT_BYTES: u64 = via_shm::CONN_SEGMENT_BYTES as u64;

/// How the agent runs.
#[derive(Debug, Clone)]
pub struct Config {
    /// Exit after this long without any client connection (and with no
    /// cross-host request in flight); `None` = never.
    pub idle_timeout: Option<Duration>,
    /// UDP port of the connection managers of all hosts, the same on every
    /// host (see [`CM_PORT`]); 0 = no cross-host connections (requests for
    /// other hosts fail with `NoCmPort`).
    pub cm_port: u16,
    /// Most connections one uid may hold at the agent at once; root and the
    /// agent's own uid are exempt (see the module docs).
    pub max_connections_per_uid: usize,
}

impl Default for Config {
    fn default() -> Config {
        Config { idle_timeout: None, cm_port: CM_PORT, max_connections_per_uid: MAX_CONNECTIONS_PER_UID }
    }
}

/// Binds the agent's socket; `Ok(None)` when another agent holds the name.
pub fn bind(name: &str) -> io::Result<Option<OwnedFd>> {
    match sock::listen(name) {
        Ok(fd) => Ok(Some(fd)),
        Err(e) if e.raw_os_error() == Some(libc::EADDRINUSE) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Serves clients on `listener`, and other hosts' agents on the CM port,
/// until Stop, SIGTERM/SIGINT or the idle timeout.  Blocks SIGTERM and
/// SIGINT in the calling thread to receive them on a signalfd.  A CM port
/// that cannot be bound is logged and reported to the clients that ask for
/// another host (see the module docs), and the agent serves this host only.
/// Fails at once, serving nobody, when the OS random source cannot be read.
pub fn run(listener: OwnedFd, config: &Config) -> io::Result<()> {
    let seed = random_u64()
        .map_err(|e| io::Error::new(e.kind(), format!("cannot read the OS random source (getrandom): {e}")))?;
    raise_fd_limit();
    let signals = signal_fd()?;
    let privileged = config.cm_port != 0 && config.cm_port < unprivileged_port_start();
    if config.cm_port != 0 && !privileged {
        warn!(
            "CM port {} is not privileged on this host (net.ipv4.ip_unprivileged_port_start = {}): \
             any local user may bind it, and a CM message from it does not prove that it comes from \
             a host's agent",
            config.cm_port,
            unprivileged_port_start()
        );
    }
    let (udp, down) = match config.cm_port {
        0 => (None, CmDown { errno: 0, reason: NO_CM_PORT.to_string() }),
        port => match CmSocket::bind(port) {
            Ok(s) => {
                info!(port, dual_stack = s.is_v6(), privileged, "CM socket bound");
                (Some(s), CmDown { errno: 0, reason: String::new() })
            }
            Err(e) => {
                let down = CmDown::bind_failed(port, &e);
                warn!("{}", down.reason);
                (None, down)
            }
        },
    };
    let mut agent = Agent::new(udp, config, seed);
    agent.cm_down = down;
    agent.cm_port_privileged = privileged && agent.udp.is_some();
    let mut idle_since = Some(Instant::now());
    loop {
        let now = Instant::now();
        agent.tick(now);
        let mut deadline = agent.next_deadline();
        if agent.idle() {
            let since = *idle_since.get_or_insert(now);
            if let Some(idle) = config.idle_timeout {
                if now >= since + idle {
                    info!("no client for {idle:?}, exiting");
                    return Ok(());
                }
                deadline = Some(deadline.map_or(since + idle, |d| d.min(since + idle)));
            }
        } else {
            idle_since = None;
        }
        let timeout = deadline.map_or(-1, |d| {
            let left = d.saturating_duration_since(now);
            left.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32
        });
        let cm_fd = agent.udp.as_ref().map_or(-1, |u| u.as_fd().as_raw_fd());
        let tokens: Vec<u64> = agent.clients.keys().copied().collect();
        let listen_fd = match agent.accepting() {
            true => listener.as_raw_fd(),
            false => -1,
        };
        let mut fds: Vec<libc::pollfd> = [listen_fd, signals.as_raw_fd(), cm_fd]
            .into_iter()
            .chain(agent.clients.values().map(|c| c.fd.as_raw_fd()))
            .map(|fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 })
            .collect();
        // SAFETY: `fds` is a valid array of pollfd of the given length (a
        // negative fd is ignored by poll).
        if unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) } < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if fds[1].revents != 0 {
            info!("signal received, exiting");
            return Ok(());
        }
        for (token, p) in tokens.iter().zip(&fds[3..]) {
            if p.revents != 0 {
                agent.readable(*token);
            }
        }
        if fds[2].revents != 0 {
            agent.cm_readable();
        }
        if fds[0].revents != 0 {
            agent.accept_all(listener.as_fd());
        }
        if agent.stop {
            info!("stop requested, exiting");
            return Ok(());
        }
    }
}

/// Why a request for another host cannot leave with no CM port configured.
const NO_CM_PORT: &str = "this host's agent runs without a CM port (--cm-port 0 or VIA_CM_PORT=0) \
                          and serves this host only";

/// Why the agent has no CM socket.
#[derive(Debug, Clone, Default)]
struct CmDown {
    /// The `errno` of the failed bind; 0 when bound or not configured.
    errno: i32,
    /// What a client asking for another host is told.
    reason: String,
}

impl CmDown {
    /// `bind` of CM port `port` failed with `e`.  The reason fits in one
    /// error reply ([`crate::proto::MAX_TEXT`] bytes).
    fn bind_failed(port: u16, e: &io::Error) -> CmDown {
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc::geteuid() };
        let why = match e.raw_os_error() {
            Some(libc::EACCES) => {
                "the port is privileged: run viad as root, or set one unprivileged \
                                   VIA_CM_PORT on every host (unprotected)"
            }
            Some(libc::EADDRINUSE) => "another process holds it (another agent, or a squatter)",
            _ => "see the agent's log",
        };
        CmDown {
            errno: e.raw_os_error().unwrap_or(0),
            reason: format!(
                "this host's agent (uid {uid}) cannot bind CM port {port}: {e}: {why}; it serves this host only"
            ),
        }
    }
}

/// `net.ipv4.ip_unprivileged_port_start` of this network namespace: ports
/// below it need root or `CAP_NET_BIND_SERVICE`.  1024 (the kernel's
/// default, and the rule before the setting existed) when it cannot be read.
fn unprivileged_port_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_unprivileged_port_start")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .map_or(1024, |n| n.min(u32::from(u16::MAX)) as u16)
}

/// Blocks SIGTERM/SIGINT and returns a signalfd that becomes readable on them.
fn signal_fd() -> io::Result<OwnedFd> {
    // SAFETY: plain signal-mask syscalls on a local sigset.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in [libc::SIGTERM, libc::SIGINT] {
            // An ignored signal would never reach the signalfd.
            libc::signal(sig, libc::SIG_DFL);
            libc::sigaddset(&mut set, sig);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        let fd = libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

/// A random 64-bit number from the OS random source (for CM request ids),
/// with no weaker fallback: ids that another host could guess would let it
/// answer for requests it never received.
fn random_u64() -> io::Result<u64> {
    Ok(getrandom::u64()?)
}

/// Raises the soft limit on open descriptors to the hard one: every client
/// holds one or two, and running short only makes the agent refuse work.
fn raise_fd_limit() {
    // SAFETY: rlimit is plain data, filled and read by the two calls.
    let mut lim: libc::rlimit = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return warn!("getrlimit(RLIMIT_NOFILE): {}", io::Error::last_os_error());
    }
    if lim.rlim_cur >= lim.rlim_max {
        return;
    }
    let old = lim.rlim_cur;
    lim.rlim_cur = lim.rlim_max;
    // SAFETY: as above.
    match unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } {
        0 => debug!(from = old, to = lim.rlim_max, "raised the descriptor limit"),
        _ => warn!("cannot raise RLIMIT_NOFILE to {}: {}", lim.rlim_max, io::Error::last_os_error()),
    }
}

/// A CM message's bytes; empty (nothing is sent) if a field is over its limit.
fn wire(msg: &CmMessage) -> Vec<u8> {
    msg.try_encode().unwrap_or_default()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Listen,
    Connect,
    Peer,
}

/// A request waiting for its partner.
struct Waiter {
    kind: Kind,
    seq: u64,
    local_host: Vec<u8>,
    local_disc: Vec<u8>,
    remote_host: Vec<u8>,
    remote_disc: Vec<u8>,
    info: Vec<u8>,
    deadline: Option<Instant>,
    bell: OwnedFd,
    /// A peer request for another host, waiting here for that host's
    /// forwarded request: the process's endpoint (decoded `info`).
    endpoint: Option<CmEndpoint>,
}

enum State {
    /// Connected; no request yet.
    New,
    /// An open device.
    Session,
    /// A request waiting for its partner on this host (or, for a peer
    /// request of the smaller host, for the other host's request).
    Waiting(Waiter),
    /// A request forwarded to another host as CM request `id`.
    Forwarded { id: u64, peer: bool },
    /// A listener that got a request from another host; its answer is due
    /// by `deadline`.
    Answering { key: HeldKey, deadline: Instant },
    /// A listener that accepted a request from another host; waiting for
    /// the requester's agent to acknowledge.
    Confirming(HeldKey),
    /// A peer request matched with another host's request; waiting for that
    /// host's agent to acknowledge this side's Accept.
    PeerConfirming { key: HeldKey, waiter: Waiter, remote_info: Vec<u8> },
}

struct Client {
    fd: OwnedFd,
    /// Who connected, as the kernel saw it.
    cred: Cred,
    state: State,
    /// The transport counters a session's process publishes.
    stats: Option<via_shm::stats::StatsView>,
}

struct Agent {
    clients: BTreeMap<u64, Client>,
    next_token: u64,
    next_seq: u64,
    matched: u64,
    peer_matched: u64,
    no_match: u64,
    listen_timeouts: u64,
    unreachable: u64,
    protocol_errors: u64,
    connections_refused: u64,
    stops_refused: u64,
    answer_timeouts: u64,
    accept_pauses: u64,
    started: Instant,
    stop: bool,
    cm: Cm,
    udp: Option<CmSocket>,
    cm_port: u16,
    /// Why `udp` is `None`.
    cm_down: CmDown,
    /// The bound CM port is below `ip_unprivileged_port_start`.
    cm_port_privileged: bool,
    /// CM datagrams dropped for a source port other than the CM port.
    cm_refused_source: u64,
    /// The agent's own effective uid.
    owner: u32,
    /// See [`Config::max_connections_per_uid`].
    max_per_uid: usize,
    /// `accept` failed for want of resources: the socket is left alone until
    /// this instant or until there are fewer clients than this.
    accept_paused: Option<(Instant, usize)>,
}

/// Two host addresses name the same device: equal, or two addresses (say
/// IPv4 and IPv6) of one local interface.
fn same_host(a: &[u8], b: &[u8]) -> bool {
    device::canonical_host(a) == device::canonical_host(b)
        || device::interface_of(a).is_some_and(|i| device::interface_of(b) == Some(i))
}

/// Whether listener `l` accepts connect request `c`.
fn serves(l: &Waiter, c: &Waiter) -> bool {
    same_host(&l.local_host, &c.remote_host) && l.local_disc == c.remote_disc
}

/// Whether two waiting requests of this host pair up.
fn pairs(a: &Waiter, b: &Waiter) -> bool {
    if a.endpoint.is_some() || b.endpoint.is_some() {
        return false;
    }
    match (a.kind, b.kind) {
        (Kind::Listen, Kind::Connect) => serves(a, b),
        (Kind::Connect, Kind::Listen) => serves(b, a),
        (Kind::Peer, Kind::Peer) => {
            same_host(&a.local_host, &b.remote_host)
                && a.local_disc == b.remote_disc
                && same_host(&b.local_host, &a.remote_host)
                && b.local_disc == a.remote_disc
        }
        _ => false,
    }
}

/// Whether waiting request `w` takes the request `h` from another host: a
/// listener takes a connect request for it, a peer request of this (the
/// smaller) host takes its mirror image.
fn takes(w: &Waiter, h: &Held) -> bool {
    let for_w = same_host(&w.local_host, &h.to_host) && w.local_disc == h.to_disc;
    match w.kind {
        Kind::Listen => !h.peer && for_w,
        Kind::Peer => {
            h.peer
                && w.endpoint.is_some()
                && for_w
                && same_host(&w.remote_host, &h.from_host)
                && w.remote_disc == h.from_disc
        }
        Kind::Connect => false,
    }
}

/// A fresh connection segment of [`SEGMENT_BYTES`] and a socket pair.
fn resources() -> io::Result<(OwnedFd, OwnedFd, OwnedFd)> {
    use rustix::fs::{self, MemfdFlags, SealFlags};
    let memfd = fs::memfd_create("openvia-conn", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
    fs::ftruncate(&memfd, SEGMENT_BYTES)?;
    // Neither side may resize the segment under the other's mapping.
    fs::fcntl_add_seals(&memfd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
    let (s0, s1) = sock::pair()?;
    Ok((memfd, s0, s1))
}

fn deadline_after(now: Instant, ms: u64) -> Option<Instant> {
    match ms {
        FOREVER => None,
        ms => now.checked_add(Duration::from_millis(ms)),
    }
}

impl Agent {
    fn new(udp: Option<CmSocket>, config: &Config, seed: u64) -> Agent {
        Agent {
            clients: BTreeMap::new(),
            next_token: 0,
            next_seq: 0,
            matched: 0,
            peer_matched: 0,
            no_match: 0,
            listen_timeouts: 0,
            unreachable: 0,
            protocol_errors: 0,
            connections_refused: 0,
            stops_refused: 0,
            answer_timeouts: 0,
            accept_pauses: 0,
            started: Instant::now(),
            stop: false,
            cm: Cm::new(seed),
            udp,
            cm_port: config.cm_port,
            cm_down: CmDown::default(),
            cm_port_privileged: false,
            cm_refused_source: 0,
            // SAFETY: geteuid has no preconditions.
            owner: unsafe { libc::geteuid() },
            max_per_uid: config.max_connections_per_uid,
            accept_paused: None,
        }
    }

    /// Nothing to do: no client and nothing in flight with other hosts.
    fn idle(&self) -> bool {
        self.clients.is_empty() && !self.cm.busy()
    }

    /// Runs the timers and tidies up after clients that went away.
    fn tick(&mut self, now: Instant) {
        self.expire(now);
        self.cm_poll(now);
        self.sweep(now);
        self.resume_accepting(now);
    }

    /// Whether the listening socket is polled: not while a pause after a
    /// failed `accept` lasts (see [`Agent::accept_all`]).
    fn accepting(&self) -> bool {
        self.accept_paused.is_none()
    }

    /// Ends the pause of the listening socket once it has lasted
    /// [`ACCEPT_PAUSE`] or a client has gone away (freeing a descriptor).
    fn resume_accepting(&mut self, now: Instant) {
        if let Some((until, clients)) = self.accept_paused {
            if now >= until || self.clients.len() < clients {
                self.accept_paused = None;
            }
        }
    }

    /// When the pause of the listening socket ends, if one lasts.
    fn accept_deadline(&self) -> Option<Instant> {
        self.accept_paused.map(|(until, _)| until)
    }

    /// Takes every pending connection.  When `accept` fails for want of
    /// descriptors or memory the connection stays queued and the socket
    /// stays readable: the socket is then left alone for a while (see
    /// [`Agent::accepting`]) rather than polled again at once, which would
    /// spin.  Stops after a bounded burst, so that clients get their turn
    /// under a flood of connections.
    fn accept_all(&mut self, listener: BorrowedFd) {
        let mut held = self.connections_per_uid();
        for _ in 0..256 {
            match sock::accept(listener) {
                Ok(fd) => self.admit(fd, &mut held),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if matches!(e.kind(), io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted) => {}
                Err(e) => return self.pause_accepting(e),
            }
        }
    }

    /// Leaves the listening socket alone after `accept` failed with `e`.
    fn pause_accepting(&mut self, e: io::Error) {
        self.accept_pauses += 1;
        // Loud on the first pause and then ever more rarely, not ten times a
        // second while the shortage lasts.
        match self.accept_pauses.is_power_of_two() {
            true => warn!(clients = self.clients.len(), "accept: {e}; pausing for {ACCEPT_PAUSE:?}"),
            false => debug!(clients = self.clients.len(), "accept: {e}; pausing"),
        }
        self.accept_paused = Some((Instant::now() + ACCEPT_PAUSE, self.clients.len()));
    }

    /// How many connections each uid holds.
    fn connections_per_uid(&self) -> BTreeMap<u32, usize> {
        let mut held = BTreeMap::new();
        for c in self.clients.values() {
            *held.entry(c.cred.uid).or_insert(0) += 1;
        }
        held
    }

    /// Takes a new connection as a client, unless its uid is at its limit
    /// (`held` counts the connections of each uid, and counts this one once
    /// it is taken).
    fn admit(&mut self, fd: OwnedFd, held: &mut BTreeMap<u32, usize>) {
        let cred = match sock::peer_cred(fd.as_fd()) {
            Ok(c) => c,
            Err(e) => return warn!("SO_PEERCRED of a new client: {e}; closed"),
        };
        let count = held.entry(cred.uid).or_insert(0);
        let exempt = cred.uid == 0 || cred.uid == self.owner;
        if !exempt && *count >= self.max_per_uid {
            self.connections_refused += 1;
            warn!(uid = cred.uid, pid = cred.pid, limit = self.max_per_uid, "too many connections; refused");
            let message = format!("uid {} holds {} connections, the most it may", cred.uid, self.max_per_uid);
            if let Ok(bytes) = (Reply::Error { kind: ErrorKind::Limit, message }).encode() {
                // The connection is closed either way.
                let _ = sock::send(fd.as_fd(), &bytes, &[]);
            }
            return;
        }
        *count += 1;
        self.next_token += 1;
        debug!(client = self.next_token, uid = cred.uid, pid = cred.pid, "connected");
        self.clients.insert(self.next_token, Client { fd, cred, state: State::New, stats: None });
    }

    fn readable(&mut self, token: u64) {
        let Some(client) = self.clients.get(&token) else {
            return;
        };
        let answering = matches!(client.state, State::Answering { .. });
        let fresh = matches!(client.state, State::New);
        match sock::recv(client.fd.as_fd()) {
            Ok(None) => {
                debug!(client = token, "disconnected");
                self.clients.remove(&token);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => {
                debug!(client = token, "receive failed: {e}");
                self.clients.remove(&token);
            }
            Ok(Some(_)) if !fresh && !answering => self.malformed(token, "message after the request"),
            Ok(Some(msg)) if msg.truncated => self.malformed(token, "message too long"),
            Ok(Some(msg)) => match Request::decode(&msg.data) {
                Ok(req) if answering => self.answered(token, req, msg.fds),
                Ok(req) => self.handle(token, req, msg.fds),
                Err(e) => self.malformed(token, e.0),
            },
        }
    }

    fn malformed(&mut self, token: u64, why: &str) {
        self.protocol_errors += 1;
        warn!(client = token, "malformed message: {why}; closing");
        self.clients.remove(&token);
    }

    /// Sends `reply`; `false` (logged) when the client cannot take it.
    fn send(&self, token: u64, reply: &Reply, fds: &[BorrowedFd]) -> bool {
        let Some(client) = self.clients.get(&token) else {
            return false;
        };
        match reply.encode() {
            Ok(bytes) => match sock::send(client.fd.as_fd(), &bytes, fds) {
                Ok(()) => true,
                Err(e) => {
                    debug!(client = token, "send failed: {e}");
                    false
                }
            },
            Err(e) => {
                warn!(client = token, "cannot encode reply: {e}");
                false
            }
        }
    }

    /// Sends the last reply on a connection and closes it.
    fn finish(&mut self, token: u64, reply: &Reply) {
        self.send(token, reply, &[]);
        self.clients.remove(&token);
    }

    /// Refuses a request the wire format allowed: replies an error, closes.
    fn invalid(&mut self, token: u64, message: &str) {
        self.protocol_errors += 1;
        debug!(client = token, "invalid request: {message}");
        let kind = ErrorKind::Invalid;
        let message = message.to_string();
        self.finish(token, &Reply::Error { kind, message });
    }

    fn handle(&mut self, token: u64, req: Request, mut fds: Vec<OwnedFd>) {
        let wants_fd = matches!(req, Request::Listen(_) | Request::Connect(_) | Request::PeerConnect(_));
        // A Hello may bring the process's counter page.
        let may_fd = matches!(req, Request::Hello { .. });
        if fds.len() != wants_fd as usize && !(may_fd && fds.len() <= 1) {
            return self.malformed(token, "wrong number of descriptors");
        }
        let kind = match &req {
            Request::PeerConnect(_) => Kind::Peer,
            _ => Kind::Connect,
        };
        let seq = self.next_seq;
        self.next_seq += 1;
        let now = Instant::now();
        let waiter = match req {
            Request::Hello { device } => return self.hello(token, &device, fds.pop()),
            Request::Stats { start } => return self.finish(token, &self.stats_page(start as usize)),
            Request::Stop => return self.stop_request(token),
            Request::Accept { .. } | Request::Reject => {
                return self.malformed(token, "an answer without a request from another host")
            }
            Request::Listen(l) => Waiter {
                kind: Kind::Listen,
                seq,
                local_host: l.host,
                local_disc: l.disc,
                remote_host: Vec::new(),
                remote_disc: Vec::new(),
                info: l.info,
                deadline: deadline_after(now, l.timeout_ms),
                bell: fds.remove(0),
                endpoint: None,
            },
            Request::Connect(c) | Request::PeerConnect(c) if !matches!(c.segment_bytes, 0 | SEGMENT_BYTES) => {
                let message = format!("segment size {} is neither 0 nor {SEGMENT_BYTES}", c.segment_bytes);
                return self.invalid(token, &message);
            }
            Request::Connect(c) | Request::PeerConnect(c) if !device::is_local(&c.remote_host) => {
                return self.remote(token, kind, seq, c, fds.remove(0), now);
            }
            Request::Connect(c) | Request::PeerConnect(c) => Waiter {
                kind,
                seq,
                local_host: c.local_host,
                local_disc: c.local_disc,
                remote_host: c.remote_host,
                remote_disc: c.remote_disc,
                info: c.info,
                deadline: deadline_after(now, c.timeout_ms),
                bell: fds.remove(0),
                endpoint: None,
            },
        };
        self.wait(token, waiter);
    }

    /// Stops the agent if root or the agent's own uid asks; anyone else
    /// could otherwise take the host's agent away from its users.
    fn stop_request(&mut self, token: u64) {
        let Some(cred) = self.clients.get(&token).map(|c| c.cred) else {
            return;
        };
        if cred.uid == 0 || cred.uid == self.owner {
            info!(uid = cred.uid, pid = cred.pid, "stop requested");
            self.stop = true;
            return self.finish(token, &Reply::Done);
        }
        self.stops_refused += 1;
        warn!(uid = cred.uid, pid = cred.pid, "stop refused");
        let message = format!("only root or uid {} may stop this agent", self.owner);
        self.finish(token, &Reply::Error { kind: ErrorKind::PermissionDenied, message });
    }

    fn hello(&mut self, token: u64, name: &str, stats: Option<OwnedFd>) {
        match crate::aliases::resolve(name) {
            Ok(d) => {
                let reply = Reply::Device {
                    name: d.name,
                    interface: d.interface,
                    host_addr: d.host_addr,
                    host_addr6: d.host_addr6.unwrap_or_default(),
                    mtu: d.mtu,
                };
                if self.send(token, &reply, &[]) {
                    if let Some(c) = self.clients.get_mut(&token) {
                        c.state = State::Session;
                        c.stats = stats.and_then(|fd| via_shm::stats::StatsView::map(fd).ok());
                    }
                }
            }
            Err(message) => {
                debug!(client = token, "{message}");
                let kind = ErrorKind::UnknownDevice;
                self.finish(token, &Reply::Error { kind, message });
            }
        }
    }

    fn waiter(&self, token: u64) -> Option<&Waiter> {
        match &self.clients.get(&token)?.state {
            State::Waiting(w) => Some(w),
            _ => None,
        }
    }

    fn state(&self, token: u64) -> Option<&State> {
        self.clients.get(&token).map(|c| &c.state)
    }

    fn set_state(&mut self, token: u64, state: State) {
        if let Some(c) = self.clients.get_mut(&token) {
            c.state = state;
        }
    }

    /// Queues `w` for `token`, then pairs it with the oldest matching waiter
    /// of this host or request from another host.
    fn wait(&mut self, token: u64, w: Waiter) {
        debug!(client = token, kind = ?w.kind, disc = ?w.local_disc, "waiting");
        self.set_state(token, State::Waiting(w));
        while let Some(w) = self.waiter(token) {
            let local = self
                .clients
                .iter()
                .filter_map(|(t, c)| match &c.state {
                    State::Waiting(o) if *t != token && pairs(w, o) => Some((o.seq, *t)),
                    _ => None,
                })
                .min();
            let remote = self
                .cm
                .held
                .iter()
                .filter(|(_, h)| matches!(h.state, HeldState::Queued) && takes(w, h))
                .map(|(k, h)| (h.seq, *k))
                .min();
            let peer = w.kind == Kind::Peer;
            match (local, remote) {
                (Some((seq, old)), r) if r.is_none_or(|(rs, _)| seq < rs) => {
                    // A partner that has gone away is dropped and the next one tried.
                    if let Err(gone) = self.pair(old, token) {
                        self.clients.remove(&gone);
                    }
                }
                (_, Some((_, key))) => {
                    match peer {
                        true => self.peer_accept(key, token, Instant::now()),
                        false => {
                            self.deliver(key, token);
                        }
                    }
                    return;
                }
                _ => return,
            }
        }
    }

    /// Hands both waiters the same fresh resources, the older one first.
    /// Returns the token whose delivery failed.
    fn pair(&mut self, old: u64, new: u64) -> Result<(), u64> {
        let (Some(o), Some(n)) = (self.waiter(old), self.waiter(new)) else {
            return Err(new);
        };
        // Side A is the connect requester, or the earlier of two peers.
        let (a, b) = match o.kind {
            Kind::Listen => (n, o),
            _ => (o, n),
        };
        let (memfd, s0, s1) = match resources() {
            Ok(r) => r,
            Err(e) => {
                warn!("cannot create connection resources: {e}");
                return Err(new);
            }
        };
        let (reply_a, reply_b) = match a.kind {
            Kind::Peer => (
                Reply::PeerMatched { side: Side::A, remote_info: b.info.clone(), remote: false },
                Reply::PeerMatched { side: Side::B, remote_info: a.info.clone(), remote: false },
            ),
            _ => (
                Reply::Matched { remote_info: b.info.clone(), remote: false },
                Reply::Incoming {
                    remote_host: a.local_host.clone(),
                    remote_disc: a.local_disc.clone(),
                    remote_info: a.info.clone(),
                    remote: false,
                },
            ),
        };
        let fds_a = [memfd.as_fd(), s0.as_fd(), b.bell.as_fd()];
        let fds_b = [memfd.as_fd(), s1.as_fd(), a.bell.as_fd()];
        let (first, second) = match std::ptr::eq(a, o) {
            true => ((old, &reply_a, fds_a), (new, &reply_b, fds_b)),
            false => ((old, &reply_b, fds_b), (new, &reply_a, fds_a)),
        };
        if !self.send(first.0, first.1, &first.2) {
            return Err(old);
        }
        let delivered = self.send(second.0, second.1, &second.2);
        let peer = a.kind == Kind::Peer;
        info!(old, new, delivered, peer, "matched");
        match peer {
            true => self.peer_matched += 1,
            false => self.matched += 1,
        }
        // The older side already has its answer either way.
        self.clients.remove(&old);
        self.clients.remove(&new);
        Ok(())
    }

    /// Answers every waiter whose deadline has passed.
    fn expire(&mut self, now: Instant) {
        let expired: Vec<(u64, Kind, bool)> = self
            .clients
            .iter()
            .filter_map(|(t, c)| match &c.state {
                State::Waiting(w) if w.deadline.is_some_and(|d| d <= now) => Some((*t, w.kind, w.endpoint.is_some())),
                _ => None,
            })
            .collect();
        for (token, kind, remote) in expired {
            debug!(client = token, ?kind, "timed out");
            match kind {
                Kind::Listen => self.listen_timeouts += 1,
                _ => self.no_match += 1,
            }
            if remote {
                self.cm.stats.no_match += 1;
            }
            self.finish(token, &Reply::NoMatch);
        }
        self.expire_answers(now);
    }

    /// Closes the connection of every listener that held a request from
    /// another host past [`ANSWER_TIME`] without answering: `sweep` then
    /// gives the request back to the queue.  The listener is told `NoMatch`,
    /// which its late answer reads.
    fn expire_answers(&mut self, now: Instant) {
        let late: Vec<u64> = self
            .clients
            .iter()
            .filter(|(_, c)| matches!(c.state, State::Answering { deadline, .. } if deadline <= now))
            .map(|(t, _)| *t)
            .collect();
        for token in late {
            info!(client = token, "listener did not answer in {ANSWER_TIME:?}; request requeued");
            self.answer_timeouts += 1;
            self.finish(token, &Reply::NoMatch);
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.clients
            .values()
            .filter_map(|c| match &c.state {
                State::Waiting(w) => w.deadline,
                State::Answering { deadline, .. } => Some(*deadline),
                _ => None,
            })
            .chain(self.cm.next_deadline())
            .chain(self.accept_deadline())
            .min()
    }

    fn counters(&self) -> Vec<(String, u64)> {
        let count = |f: &dyn Fn(&State) -> bool| self.clients.values().filter(|c| f(&c.state)).count() as u64;
        let waiting = |k: Kind| count(&|s| matches!(s, State::Waiting(w) if w.kind == k && w.endpoint.is_none()));
        let remote_waiting =
            count(&|s| matches!(s, State::Forwarded { .. } | State::Waiting(Waiter { endpoint: Some(_), .. })));
        let uptime = self.started.elapsed().as_secs();
        let cm_port = self.udp.as_ref().and_then(|u| u.local_addr().ok()).map_or(0, |a| a.port());
        let s = &self.cm.stats;
        [
            ("clients", self.clients.len() as u64),
            ("sessions", count(&|s| matches!(s, State::Session))),
            ("listeners_waiting", waiting(Kind::Listen)),
            ("connects_pending", waiting(Kind::Connect)),
            ("peers_pending", waiting(Kind::Peer)),
            ("matched", self.matched),
            ("peer_matched", self.peer_matched),
            ("no_match", self.no_match),
            ("listen_timeouts", self.listen_timeouts),
            ("unreachable", self.unreachable),
            ("protocol_errors", self.protocol_errors),
            ("uptime_seconds", uptime),
            ("pid", u64::from(std::process::id())),
            ("uid", u64::from(self.owner)),
            ("cm_port", u64::from(cm_port)),
            ("cm_port_configured", u64::from(self.cm_port)),
            ("cm_port_privileged", u64::from(self.cm_port_privileged)),
            ("cm_bind_errno", self.cm_down.errno as u64),
            ("cm_refused_source", self.cm_refused_source),
            ("remote_pending", remote_waiting),
            ("remote_held", self.cm.held.len() as u64),
            ("cm_requests_sent", s.requests_sent),
            ("cm_requests_received", s.requests_received),
            ("cm_duplicates", s.duplicates),
            ("cm_retransmits", s.retransmits),
            ("cm_accepts", s.accepts),
            ("cm_rejects", s.rejects),
            ("cm_no_match", s.no_match),
            ("cm_unreachable", s.unreachable),
            ("cm_malformed", s.malformed),
            ("remote_listeners_matched", s.remote_listeners_matched),
            ("cm_withdrawn_sent", s.withdrawn_sent),
            ("cm_withdrawn_received", s.withdrawn_received),
            ("cm_superseded", s.superseded),
            ("cm_port_unreachable", s.port_unreachable),
            ("connections_refused", self.connections_refused),
            ("stops_refused", self.stops_refused),
            ("answer_timeouts", self.answer_timeouts),
            ("accept_pauses", self.accept_pauses),
        ]
        .into_iter()
        .map(|(n, v)| (n.to_string(), v))
        .chain(self.process_counters())
        .collect()
    }

    /// The counters from `start` on, as many as one reply carries.
    fn stats_page(&self, start: usize) -> Reply {
        let all = self.counters();
        let mut counters = Vec::new();
        let mut bytes = 0;
        for (name, value) in all.iter().skip(start) {
            bytes += 2 + name.len() + 8;
            if counters.len() == crate::proto::MAX_STATS || bytes > crate::proto::STATS_BUDGET {
                break;
            }
            counters.push((name.clone(), *value));
        }
        Reply::Stats { counters, total: all.len() as u32 }
    }

    /// The transport counters the processes of this host publish, as
    /// `process.<pid>.<device>.<counter>`.
    fn process_counters(&self) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        for snap in self.clients.values().filter_map(|c| c.stats.as_ref()?.snapshot()) {
            let clean = |t: &str| t.chars().map(|c| if c.is_ascii_graphic() { c } else { '_' }).collect::<String>();
            for (name, value) in snap.counters {
                out.push((format!("process.{}.{}.{}", snap.pid, clean(&snap.label), clean(&name)), value));
            }
        }
        out
    }

    // ---- across hosts -------------------------------------------------

    /// The CM address of the agent of VIA host `host`, if it can be reached.
    fn cm_dest(&self, host: &[u8]) -> Option<SocketAddr> {
        let udp = self.udp.as_ref()?;
        let ip = match host.len() {
            4 => IpAddr::from(<[u8; 4]>::try_from(host).ok()?),
            16 => IpAddr::from(<[u8; 16]>::try_from(host).ok()?),
            _ => return None,
        }
        .to_canonical();
        match udp.is_v6() || ip.is_ipv4() {
            true => Some(SocketAddr::new(ip, self.cm_port)),
            false => None,
        }
    }

    fn send_udp(&self, dest: SocketAddr, datagram: &[u8]) {
        let Some(udp) = self.udp.as_ref() else { return };
        if datagram.is_empty() {
            return;
        }
        if let Err(e) = udp.send_to(dest, datagram) {
            debug!(%dest, "CM send failed: {e}");
        }
    }

    /// A connect or peer request for another host.
    fn remote(&mut self, token: u64, kind: Kind, seq: u64, c: ConnectReq, bell: OwnedFd, now: Instant) {
        let Some(endpoint) = decode_endpoint(&c.info) else {
            return self.invalid(token, "info of a request for another host is not an endpoint");
        };
        if self.udp.is_none() {
            debug!(client = token, pid = c.pid, host = ?c.remote_host, "no CM port");
            self.unreachable += 1;
            self.cm.stats.unreachable += 1;
            let message = self.cm_down.reason.clone();
            return self.finish(token, &Reply::Error { kind: ErrorKind::NoCmPort, message });
        }
        let Some(dest) = self.cm_dest(&c.remote_host) else {
            debug!(client = token, pid = c.pid, host = ?c.remote_host, "unreachable");
            self.unreachable += 1;
            self.cm.stats.unreachable += 1;
            return self.finish(token, &Reply::Unreachable);
        };
        let deadline = deadline_after(now, c.timeout_ms);
        if kind == Kind::Peer && c.local_host <= c.remote_host {
            // The host with the smaller address never forwards a peer
            // request: it waits for the other host's one.
            let waiter = Waiter {
                kind,
                seq,
                local_host: c.local_host,
                local_disc: c.local_disc,
                remote_host: c.remote_host,
                remote_disc: c.remote_disc,
                info: c.info,
                deadline,
                bell,
                endpoint: Some(endpoint),
            };
            return self.wait(token, waiter);
        }
        let peer = kind == Kind::Peer;
        let encode = |id| {
            CmMessage::Request {
                id,
                from_host: c.local_host.clone(),
                from_disc: c.local_disc.clone(),
                to_host: c.remote_host.clone(),
                to_disc: c.remote_disc.clone(),
                peer,
                endpoint,
            }
            .try_encode()
            .ok()
        };
        let Some((id, datagram)) = self.cm.start(token, dest, encode, deadline, now) else {
            return self.invalid(token, "request cannot be encoded for another host");
        };
        info!(client = token, pid = c.pid, id, %dest, peer, "forwarded");
        self.send_udp(dest, &datagram);
        self.set_state(token, State::Forwarded { id, peer });
    }

    /// Reads every report and datagram waiting on the CM socket.
    fn cm_readable(&mut self) {
        self.cm_errors();
        let mut buf = [0u8; 2048];
        // Bounded, so that clients get their turn under a flood.
        for _ in 0..256 {
            let Some(udp) = self.udp.as_ref() else { return };
            let (n, src) = match udp.recv_from(&mut buf) {
                Ok(r) => r,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                // An ICMP report also comes back once as the error of a
                // receive (ECONNREFUSED); the report itself is in the queue.
                Err(e) => {
                    debug!("CM receive: {e}");
                    self.cm_errors();
                    continue;
                }
            };
            self.cm_datagram(src, &buf[..n], Instant::now());
        }
    }

    /// Takes the kernel's reports off the CM socket's error queue: a host
    /// that answers "port unreachable" for its CM port is up, with no agent.
    fn cm_errors(&mut self) {
        for _ in 0..256 {
            let Some(udp) = self.udp.as_ref() else { return };
            match udp.recv_error() {
                Ok(Some(dest)) if dest.port() == self.cm_port => {
                    debug!(%dest, "port unreachable: the host is up, with no agent");
                    self.cm.port_unreachable(dest, Instant::now());
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    }

    /// Takes one datagram that arrived on the CM socket from `src`: only
    /// from the CM port of the other host (see the module docs).
    fn cm_datagram(&mut self, src: SocketAddr, bytes: &[u8], now: Instant) {
        if src.port() != self.cm_port {
            self.cm_refused_source += 1;
            // Loud on the first and then ever more rarely: a flood must not
            // flood the log too.
            match self.cm_refused_source.is_power_of_two() {
                true => warn!(
                    %src,
                    refused = self.cm_refused_source,
                    "CM datagram refused: CM messages come only from port {}",
                    self.cm_port
                ),
                false => debug!(%src, len = bytes.len(), "CM datagram from another port refused"),
            }
            return;
        }
        match CmMessage::decode(bytes) {
            Ok(msg) => self.cm_message(src, msg, now),
            Err(e) => {
                self.cm.stats.malformed += 1;
                debug!(%src, len = bytes.len(), "malformed CM datagram: {e}");
            }
        }
    }

    fn cm_message(&mut self, src: SocketAddr, msg: CmMessage, now: Instant) {
        debug!(%src, ?msg, "CM message");
        self.cm.host_answered(src.ip(), now);
        match msg {
            CmMessage::Request { id, from_host, from_disc, to_host, to_disc, peer, endpoint } => {
                if !device::is_local(&to_host) {
                    debug!(%src, id, "request for another host's address");
                    return self.send_udp(src, &wire(&CmMessage::NoMatch { id }));
                }
                let seq = self.next_seq;
                self.next_seq += 1;
                let held = Held {
                    seq,
                    from_host,
                    from_disc,
                    to_host,
                    to_disc,
                    peer,
                    endpoint,
                    last_seen: now,
                    state: HeldState::Queued,
                };
                match self.cm.arrive(src, id, held) {
                    Arrival::Duplicate(reply) => self.send_udp(src, &reply),
                    Arrival::Full => {
                        warn!(%src, id, "too many requests from other hosts; refused");
                        self.send_udp(src, &wire(&CmMessage::NoMatch { id }));
                    }
                    Arrival::New => {
                        info!(%src, id, peer, "request from another host");
                        self.send_udp(src, &wire(&CmMessage::Ack { id }));
                        self.match_held((src, id), now);
                    }
                }
            }
            CmMessage::Accept { id, endpoint } => self.cm_accept(src, id, &endpoint, now),
            CmMessage::Reject { id } => {
                if let Some(o) = self.cm.finish(id, Some(Outcome::Rejected), now) {
                    info!(client = o.token, id, "rejected by the remote listener");
                    self.cm.stats.rejects += 1;
                    self.finish(o.token, &Reply::Rejected);
                }
                // Acknowledged even when unknown: it stops the retransmission.
                self.send_udp(src, &wire(&CmMessage::Ack { id }));
            }
            CmMessage::NoMatch { id } => {
                // Either the remote agent refuses our request...
                if let Some(o) = self.cm.finish(id, None, now) {
                    info!(client = o.token, id, "refused by the remote agent");
                    self.no_match += 1;
                    self.cm.stats.no_match += 1;
                    self.finish(o.token, &Reply::NoMatch);
                }
                // ...or the requester no longer waits for our answer.
                if let Some(Some(waiter)) = self.cm.answer_refused((src, id)) {
                    self.answer_refused(waiter, (src, id));
                }
            }
            CmMessage::Ack { id } => {
                self.cm.outgoing_acked(id, src);
                self.cm.withdrawal_acked(id, src);
                if let Some(Some(waiter)) = self.cm.answer_acked((src, id)) {
                    self.answer_acked(waiter, (src, id));
                }
            }
            CmMessage::Withdraw { id } => {
                if let Some(waiter) = self.cm.withdrawn((src, id)) {
                    info!(%src, id, "request withdrawn by its requester");
                    if let Some(waiter) = waiter {
                        self.answer_refused(waiter, (src, id));
                    }
                }
                self.send_udp(src, &wire(&CmMessage::Ack { id }));
            }
            CmMessage::Taken { id } => self.cm.outgoing_taken(id, src, now),
            CmMessage::KeepAlive { nonce } => self.send_udp(src, &wire(&CmMessage::KeepAliveReply { nonce })),
            CmMessage::KeepAliveReply { .. } => {}
        }
    }

    /// The remote side accepted our request `id`.
    fn cm_accept(&mut self, src: SocketAddr, id: u64, endpoint: &CmEndpoint, now: Instant) {
        let Some(token) = self.cm.outgoing.get(&id).map(|o| o.token) else {
            // A copy whose Ack was lost is acknowledged again; anything
            // else is for a request that no longer waits.
            let reply = match self.cm.outcome(id) {
                Some(Outcome::Accepted) => CmMessage::Ack { id },
                _ => CmMessage::NoMatch { id },
            };
            return self.send_udp(src, &wire(&reply));
        };
        let remote_info = encode_endpoint(endpoint);
        let reply = match self.state(token) {
            Some(State::Forwarded { peer: true, .. }) => {
                Reply::PeerMatched { side: Side::A, remote_info, remote: true }
            }
            _ => Reply::Matched { remote_info, remote: true },
        };
        let delivered = self.send(token, &reply, &[]);
        info!(client = token, id, delivered, "accepted by the remote side");
        self.clients.remove(&token);
        match delivered {
            true => {
                self.cm.finish(id, Some(Outcome::Accepted), now);
                self.cm.stats.accepts += 1;
                self.send_udp(src, &wire(&CmMessage::Ack { id }));
            }
            false => {
                self.cm.finish(id, None, now);
                self.send_udp(src, &wire(&CmMessage::NoMatch { id }));
            }
        }
    }

    /// Hands a queued request from another host to the oldest local waiter
    /// that takes it, if any.
    fn match_held(&mut self, key: HeldKey, now: Instant) {
        loop {
            let Some(h) = self.cm.held.get(&key) else {
                return;
            };
            if !matches!(h.state, HeldState::Queued) {
                return;
            }
            let partner = self
                .clients
                .iter()
                .filter_map(|(t, c)| match &c.state {
                    State::Waiting(w) if takes(w, h) => Some((w.seq, *t)),
                    _ => None,
                })
                .min();
            let Some((_, token)) = partner else {
                return;
            };
            if h.peer {
                return self.peer_accept(key, token, now);
            }
            if self.deliver(key, token) {
                return;
            }
        }
    }

    /// Hands held request `key` to listener `token`; `false` when the
    /// listener has gone (it is dropped).
    fn deliver(&mut self, key: HeldKey, token: u64) -> bool {
        let Some(h) = self.cm.held.get(&key) else {
            return true;
        };
        let reply = Reply::Incoming {
            remote_host: h.from_host.clone(),
            remote_disc: h.from_disc.clone(),
            remote_info: encode_endpoint(&h.endpoint),
            remote: true,
        };
        if !self.send(token, &reply, &[]) {
            self.clients.remove(&token);
            return false;
        }
        if let Some(h) = self.cm.held.get_mut(&key) {
            h.state = HeldState::Delivered(token);
        }
        self.cm.stats.remote_listeners_matched += 1;
        info!(client = token, src = %key.0, id = key.1, "request from another host delivered");
        // The requester waits for this listener's answer past its timeout.
        self.send_udp(key.0, &wire(&CmMessage::Taken { id: key.1 }));
        let deadline = Instant::now() + ANSWER_TIME;
        self.set_state(token, State::Answering { key, deadline });
        true
    }

    /// Matches local peer request `token` (of the smaller host) with the
    /// other host's request `key`: sends Accept with the local endpoint.
    fn peer_accept(&mut self, key: HeldKey, token: u64, now: Instant) {
        let Some(c) = self.clients.get_mut(&token) else {
            return;
        };
        let waiter = match std::mem::replace(&mut c.state, State::New) {
            State::Waiting(w) => w,
            other => {
                c.state = other;
                return;
            }
        };
        let (Some(h), Some(endpoint)) = (self.cm.held.get(&key), waiter.endpoint.clone()) else {
            return self.set_state(token, State::Waiting(waiter));
        };
        let remote_info = encode_endpoint(&h.endpoint);
        let datagram = wire(&CmMessage::Accept { id: key.1, endpoint });
        self.cm.answer(key, datagram.clone(), Some(token), now);
        self.send_udp(key.0, &datagram);
        self.cm.stats.accepts += 1;
        info!(client = token, src = %key.0, id = key.1, "peer request matched across hosts");
        let state = State::PeerConfirming { key, waiter, remote_info };
        self.set_state(token, state);
    }

    /// A listener's second message: its answer to a request from another host.
    fn answered(&mut self, token: u64, req: Request, fds: Vec<OwnedFd>) {
        if !fds.is_empty() {
            return self.malformed(token, "descriptors with an answer");
        }
        let accept = match req {
            Request::Accept { info } => Some(info),
            Request::Reject => None,
            _ => return self.malformed(token, "expected Accept or Reject"),
        };
        let Some(State::Answering { key, .. }) = self.state(token) else {
            return;
        };
        let key = *key;
        let now = Instant::now();
        let ours = self.cm.held.get(&key).is_some_and(|h| matches!(h.state, HeldState::Delivered(t) if t == token));
        if !ours {
            // The requester stopped asking and the request expired.
            return self.finish(token, &Reply::NoMatch);
        }
        let Some(info) = accept else {
            let datagram = wire(&CmMessage::Reject { id: key.1 });
            self.cm.answer(key, datagram.clone(), None, now);
            self.send_udp(key.0, &datagram);
            self.cm.stats.rejects += 1;
            info!(client = token, id = key.1, "listener rejected");
            return self.finish(token, &Reply::Done);
        };
        let Some(endpoint) = decode_endpoint(&info) else {
            // The request goes back to the queue (see `sweep`).
            return self.invalid(token, "accept info is not an endpoint");
        };
        let datagram = wire(&CmMessage::Accept { id: key.1, endpoint });
        self.cm.answer(key, datagram.clone(), Some(token), now);
        self.send_udp(key.0, &datagram);
        self.cm.stats.accepts += 1;
        info!(client = token, id = key.1, "listener accepted");
        self.set_state(token, State::Confirming(key));
    }

    /// The requester's agent acknowledged the answer to `key`, which
    /// `token` waits for.
    fn answer_acked(&mut self, token: u64, key: HeldKey) {
        match self.state(token) {
            Some(State::Confirming(k)) if *k == key => self.finish(token, &Reply::Done),
            Some(State::PeerConfirming { key: k, remote_info, .. }) if *k == key => {
                let reply = Reply::PeerMatched { side: Side::B, remote_info: remote_info.clone(), remote: true };
                self.finish(token, &reply);
            }
            _ => {}
        }
    }

    /// The requester's agent says request `key` no longer waits.
    fn answer_refused(&mut self, token: u64, key: HeldKey) {
        match self.state(token) {
            Some(State::Confirming(k)) if *k == key => self.finish(token, &Reply::NoMatch),
            Some(State::PeerConfirming { key: k, .. }) if *k == key => {
                let Some(c) = self.clients.get_mut(&token) else {
                    return;
                };
                if let State::PeerConfirming { waiter, .. } = std::mem::replace(&mut c.state, State::New) {
                    debug!(client = token, "the other host's request is gone; waiting again");
                    self.wait(token, waiter);
                }
            }
            _ => {}
        }
    }

    /// Runs the CM timers.
    fn cm_poll(&mut self, now: Instant) {
        for event in self.cm.poll(now) {
            match event {
                Event::Send(dest, datagram) => self.send_udp(dest, &datagram),
                Event::TimedOut { token, answered } => {
                    debug!(client = token, answered, "forwarded request timed out");
                    match answered {
                        true => {
                            self.no_match += 1;
                            self.finish(token, &Reply::NoMatch);
                        }
                        false => {
                            self.unreachable += 1;
                            self.finish(token, &Reply::Unreachable);
                        }
                    }
                }
                Event::GaveUp { key, waiter } => {
                    debug!(src = %key.0, id = key.1, "answer never acknowledged");
                    let Some(token) = waiter else { continue };
                    let waits = matches!(
                        self.state(token),
                        Some(State::Confirming(k) | State::PeerConfirming { key: k, .. }) if *k == key
                    );
                    if waits {
                        self.finish(token, &Reply::Unreachable);
                    }
                }
            }
        }
    }

    /// Forgets forwarded requests whose client went away, and gives requests
    /// from other hosts whose listener went away without answering back to
    /// the queue.
    fn sweep(&mut self, now: Instant) {
        let abandoned: Vec<u64> = self
            .cm
            .outgoing
            .iter()
            .filter(|(id, o)| !matches!(self.state(o.token), Some(State::Forwarded { id: i, .. }) if i == *id))
            .map(|(id, _)| *id)
            .collect();
        for id in abandoned {
            debug!(id, "forwarded request abandoned by its client; withdrawn");
            if let Some((dest, datagram)) = self.cm.withdraw(id, now) {
                self.send_udp(dest, &datagram);
            }
        }
        let requeue: Vec<HeldKey> = self
            .cm
            .held
            .iter()
            .filter(|(k, h)| match h.state {
                HeldState::Delivered(t) => !matches!(self.state(t), Some(State::Answering { key, .. }) if key == *k),
                _ => false,
            })
            .map(|(k, _)| *k)
            .collect();
        for key in requeue {
            if let Some(h) = self.cm.held.get_mut(&key) {
                info!(src = %key.0, id = key.1, "listener left without answering; requeued");
                h.state = HeldState::Queued;
            }
            self.match_held(key, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent() -> Agent {
        Agent::new(None, &Config::default(), 1)
    }

    /// Adds a client of uid 1000 in `state`; returns the other end of its connection.
    fn add_client(agent: &mut Agent, token: u64, state: State) -> OwnedFd {
        let (fd, peer) = sock::pair().unwrap();
        let cred = Cred { pid: 1, uid: 1000, gid: 1000 };
        agent.clients.insert(token, Client { fd, cred, state, stats: None });
        peer
    }

    fn endpoint(addr: &str) -> CmEndpoint {
        CmEndpoint {
            addr: addr.parse().unwrap(),
            vi: 1,
            key: 2,
            reliability: 0,
            max_transfer: 4096,
            rdma_write: false,
            rdma_read: false,
            segment: 1400,
            payload_crc: true,
            ether: None,
            large_packets: false,
            placed_acks: false,
        }
    }

    /// The replies waiting on a client's end of its connection (without
    /// waiting for more).
    fn replies(peer: &OwnedFd) -> Vec<Reply> {
        // SAFETY: fcntl on a descriptor this test owns.
        unsafe {
            let flags = libc::fcntl(peer.as_raw_fd(), libc::F_GETFL);
            libc::fcntl(peer.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK);
        }
        let mut out = Vec::new();
        while let Ok(Some(msg)) = sock::recv(peer.as_fd()) {
            out.push(Reply::decode(&msg.data).unwrap());
        }
        out
    }

    #[test]
    fn cm_datagrams_from_another_port_are_refused_before_they_are_read() {
        let mut agent = agent();
        assert_eq!(agent.cm_port, CM_PORT);
        let now = Instant::now();
        let host_b: IpAddr = "198.51.100.2".parse().unwrap();
        let agent_b = SocketAddr::new(host_b, CM_PORT);
        // Client 3 waits for the answer to its request to host b.
        let (id, _) = agent.cm.start(3, agent_b, |id| Some(id.to_be_bytes().to_vec()), None, now).unwrap();
        let client = add_client(&mut agent, 3, State::Forwarded { id, peer: false });
        let forged_ep = endpoint("198.51.100.2:4444");
        let request = CmMessage::Request {
            id: 5,
            from_host: vec![198, 51, 100, 2],
            from_disc: b"c".to_vec(),
            to_host: vec![127, 0, 0, 1],
            to_disc: b"s".to_vec(),
            peer: false,
            endpoint: forged_ep.clone(),
        };
        let forged = [
            CmMessage::Accept { id, endpoint: forged_ep.clone() },
            CmMessage::Reject { id },
            CmMessage::NoMatch { id },
            CmMessage::Ack { id },
            CmMessage::KeepAlive { nonce: 1 },
            request,
        ];
        // From host b, but from any port but the CM port: a user's process
        // there (1023 and 0 included), or the agent's own socket elsewhere.
        let mut sent = 0;
        for port in [CM_PORT + 1, 1023, 40000, 0, 5197] {
            let src = SocketAddr::new(host_b, port);
            for msg in &forged {
                agent.cm_datagram(src, &msg.encode(), now);
                sent += 1;
            }
            agent.cm_datagram(src, b"garbage", now);
            sent += 1;
        }
        assert_eq!(agent.cm_refused_source, sent);
        // None was read: the request waits as it did, unacknowledged.
        assert!(matches!(agent.state(3), Some(State::Forwarded { id: i, .. }) if *i == id));
        assert!(agent.cm.outgoing.get(&id).is_some_and(|o| !o.acked));
        assert!(agent.cm.held.is_empty());
        assert_eq!((agent.cm.stats.malformed, agent.cm.stats.accepts, agent.cm.stats.rejects), (0, 0, 0));
        assert!(replies(&client).is_empty());
        let counters: BTreeMap<String, u64> = agent.counters().into_iter().collect();
        assert_eq!(counters["cm_refused_source"], sent);

        // From the CM port, the same bytes are read.
        agent.cm_datagram(agent_b, b"garbage", now);
        assert_eq!(agent.cm.stats.malformed, 1);
        let real_ep = endpoint("198.51.100.2:5555");
        agent.cm_datagram(agent_b, &CmMessage::Accept { id, endpoint: real_ep.clone() }.encode(), now);
        assert_eq!(replies(&client), vec![Reply::Matched { remote_info: encode_endpoint(&real_ep), remote: true }]);
        assert!(agent.cm.outgoing.is_empty() && !agent.clients.contains_key(&3));
        assert_eq!((agent.cm.stats.accepts, agent.cm_refused_source), (1, sent));
    }

    #[test]
    fn a_request_for_another_host_without_a_cm_port_fails_at_once_and_says_why() {
        for (errno, says) in [(libc::EACCES, "privileged"), (libc::EADDRINUSE, "another process holds")] {
            let mut agent = agent();
            agent.cm_down = CmDown::bind_failed(CM_PORT, &io::Error::from_raw_os_error(errno));
            let client = add_client(&mut agent, 1, State::New);
            let (bell, _) = sock::pair().unwrap();
            let req = ConnectReq {
                local_host: vec![127, 0, 0, 1],
                local_disc: b"c".to_vec(),
                remote_host: vec![198, 51, 100, 2],
                remote_disc: b"s".to_vec(),
                info: encode_endpoint(&endpoint("127.0.0.1:4000")),
                timeout_ms: 10_000,
                segment_bytes: 0,
                pid: 1,
            };
            agent.handle(1, Request::Connect(req), vec![bell]);
            let got = replies(&client);
            let [Reply::Error { kind: ErrorKind::NoCmPort, message }] = got.as_slice() else {
                panic!("{got:?}");
            };
            assert!(message.contains(&format!("cannot bind CM port {CM_PORT}")), "{message}");
            assert!(message.contains(says), "{message}");
            // The whole reason reaches the client.
            assert!(message.ends_with("it serves this host only"), "{message}");
            assert!(!agent.clients.contains_key(&1) && agent.cm.outgoing.is_empty());
            let counters: BTreeMap<String, u64> = agent.counters().into_iter().collect();
            assert_eq!((counters["cm_port"], counters["cm_bind_errno"]), (0, errno as u64));
            assert_eq!((counters["unreachable"], counters["cm_unreachable"]), (1, 1));
        }
    }

    #[test]
    fn random_numbers_come_from_the_os() {
        let (a, b) = (random_u64().unwrap(), random_u64().unwrap());
        assert_ne!(a, b);
    }

    #[test]
    fn a_failed_accept_pauses_the_socket_until_time_passes_or_a_client_leaves() {
        let mut agent = agent();
        let _peers = [add_client(&mut agent, 1, State::New), add_client(&mut agent, 2, State::Session)];
        assert!(agent.accepting());
        agent.pause_accepting(io::Error::from_raw_os_error(libc::EMFILE));
        let until = agent.accept_deadline().unwrap();
        assert!(!agent.accepting());
        // The loop wakes up for the end of the pause.
        assert_eq!(agent.next_deadline(), Some(until));
        agent.resume_accepting(until - Duration::from_millis(1));
        assert!(!agent.accepting());
        agent.resume_accepting(until);
        assert!(agent.accepting() && agent.accept_deadline().is_none());
        // A client that goes away ends the pause at once.
        agent.pause_accepting(io::Error::from_raw_os_error(libc::ENFILE));
        agent.clients.remove(&1);
        agent.resume_accepting(Instant::now());
        assert!(agent.accepting());
        assert_eq!(agent.accept_pauses, 2);
    }

    #[test]
    fn a_listener_that_does_not_answer_in_time_gives_the_request_back() {
        let mut agent = agent();
        let now = Instant::now();
        let src = SocketAddr::new([10, 0, 0, 1].into(), CM_PORT);
        let endpoint = endpoint("10.0.0.1:4000");
        let held = Held {
            seq: 0,
            from_host: vec![10, 0, 0, 1],
            from_disc: b"c".to_vec(),
            to_host: vec![127, 0, 0, 1],
            to_disc: b"s".to_vec(),
            peer: false,
            endpoint,
            // As if its copies kept coming until the listener's deadline.
            last_seen: now + ANSWER_TIME,
            state: HeldState::Delivered(7),
        };
        assert_eq!(agent.cm.arrive(src, 9, held), Arrival::New);
        let key = (src, 9);
        let deadline = now + ANSWER_TIME;
        let listener = add_client(&mut agent, 7, State::Answering { key, deadline });
        assert_eq!(agent.next_deadline(), Some(deadline));
        agent.tick(deadline - Duration::from_millis(1));
        assert!(matches!(agent.cm.held[&key].state, HeldState::Delivered(7)));
        agent.tick(deadline);
        assert!(!agent.clients.contains_key(&7), "the listener's connection stays");
        assert!(matches!(agent.cm.held[&key].state, HeldState::Queued));
        assert_eq!(agent.answer_timeouts, 1);
        // The listener was told that the request no longer waits for it.
        let msg = sock::recv(listener.as_fd()).unwrap().unwrap();
        assert_eq!(Reply::decode(&msg.data).unwrap(), Reply::NoMatch);
        assert!(sock::recv(listener.as_fd()).unwrap().is_none());
    }
}
