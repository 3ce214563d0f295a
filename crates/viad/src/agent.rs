//! The agent's event loop: sessions, rendezvous by discriminator, counters.
//!
//! One thread polls the listening socket, a signalfd and every client.  A
//! client sends exactly one request per connection; waiting requests stay in
//! the client table until they match, time out or their client goes away.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use crate::device;
use crate::proto::{ErrorKind, Reply, Request, Side, FOREVER};
use crate::sock;

/// How the agent runs.
#[derive(Debug, Clone, Default)]
pub struct Config {
    /// Exit after this long without any client connection; `None` = never.
    pub idle_timeout: Option<Duration>,
}

/// Binds the agent's socket; `Ok(None)` when another agent holds the name.
pub fn bind(name: &str) -> io::Result<Option<OwnedFd>> {
    match sock::listen(name) {
        Ok(fd) => Ok(Some(fd)),
        Err(e) if e.raw_os_error() == Some(libc::EADDRINUSE) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Serves clients on `listener` until Stop, SIGTERM/SIGINT or the idle timeout.
/// Blocks SIGTERM and SIGINT in the calling thread to receive them on a signalfd.
pub fn run(listener: OwnedFd, config: &Config) -> io::Result<()> {
    let signals = signal_fd()?;
    let mut agent = Agent {
        started: Some(Instant::now()),
        ..Agent::default()
    };
    let mut idle_since = Some(Instant::now());
    loop {
        let now = Instant::now();
        agent.expire(now);
        let mut deadline = agent.next_deadline();
        if agent.clients.is_empty() {
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
        let tokens: Vec<u64> = agent.clients.keys().copied().collect();
        let mut fds: Vec<libc::pollfd> = [listener.as_raw_fd(), signals.as_raw_fd()]
            .into_iter()
            .chain(agent.clients.values().map(|c| c.fd.as_raw_fd()))
            .map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: `fds` is a valid array of pollfd of the given length.
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
        for (token, p) in tokens.iter().zip(&fds[2..]) {
            if p.revents != 0 {
                agent.readable(*token);
            }
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
    segment_bytes: u64,
    deadline: Option<Instant>,
    inbox: OwnedFd,
}

enum State {
    New,
    Session,
    Waiting(Waiter),
}

struct Client {
    fd: OwnedFd,
    state: State,
}

#[derive(Default)]
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
    started: Option<Instant>,
    stop: bool,
}

fn same_host(a: &[u8], b: &[u8]) -> bool {
    device::canonical_host(a) == device::canonical_host(b)
}

/// Whether listener `l` accepts connect request `c`.
fn serves(l: &Waiter, c: &Waiter) -> bool {
    same_host(&l.local_host, &c.remote_host) && l.local_disc == c.remote_disc
}

/// Whether two waiting requests pair up.
fn pairs(a: &Waiter, b: &Waiter) -> bool {
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

/// A fresh connection segment of `bytes` bytes and a socket pair.
fn resources(bytes: u64) -> io::Result<(OwnedFd, OwnedFd, OwnedFd)> {
    let name = c"openvia-conn";
    // SAFETY: plain syscalls; the memfd is owned from here on.
    let memfd = unsafe {
        let fd = libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = OwnedFd::from_raw_fd(fd);
        if libc::ftruncate(fd.as_raw_fd(), bytes as libc::off_t) != 0 {
            return Err(io::Error::last_os_error());
        }
        // Neither side may resize the segment under the other's mapping.
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        if libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) != 0 {
            return Err(io::Error::last_os_error());
        }
        fd
    };
    let (s0, s1) = sock::pair()?;
    Ok((memfd, s0, s1))
}

impl Agent {
    fn accept_all(&mut self, listener: BorrowedFd) {
        loop {
            match sock::accept(listener) {
                Ok(fd) => {
                    self.next_token += 1;
                    debug!(client = self.next_token, "connected");
                    let state = State::New;
                    self.clients.insert(self.next_token, Client { fd, state });
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => return warn!("accept: {e}"),
            }
        }
    }

    fn readable(&mut self, token: u64) {
        let Some(client) = self.clients.get(&token) else {
            return;
        };
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
            Ok(Some(_)) if !matches!(client.state, State::New) => {
                self.malformed(token, "message after the request")
            }
            Ok(Some(msg)) if msg.truncated => self.malformed(token, "message too long"),
            Ok(Some(msg)) => match Request::decode(&msg.data) {
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

    fn handle(&mut self, token: u64, req: Request, mut fds: Vec<OwnedFd>) {
        let wants_fd = matches!(
            req,
            Request::Listen(_) | Request::Connect(_) | Request::PeerConnect(_)
        );
        if fds.len() != wants_fd as usize {
            return self.malformed(token, "wrong number of descriptors");
        }
        let kind = match &req {
            Request::PeerConnect(_) => Kind::Peer,
            _ => Kind::Connect,
        };
        let seq = self.next_seq;
        self.next_seq += 1;
        let deadline = |ms: u64| match ms {
            FOREVER => None,
            ms => Instant::now().checked_add(Duration::from_millis(ms)),
        };
        let waiter = match req {
            Request::Hello { device } => return self.hello(token, &device),
            Request::Stats => return self.finish(token, &Reply::Stats(self.counters())),
            Request::Stop => {
                self.stop = true;
                return self.finish(token, &Reply::Done);
            }
            Request::Listen(l) => Waiter {
                kind: Kind::Listen,
                seq,
                local_host: l.host,
                local_disc: l.disc,
                remote_host: Vec::new(),
                remote_disc: Vec::new(),
                info: l.info,
                segment_bytes: 0,
                deadline: deadline(l.timeout_ms),
                inbox: fds.remove(0),
            },
            Request::Connect(c) | Request::PeerConnect(c) if !device::is_local(&c.remote_host) => {
                debug!(client = token, pid = c.pid, host = ?c.remote_host, "unreachable");
                self.unreachable += 1;
                return self.finish(token, &Reply::Unreachable);
            }
            Request::Connect(c) | Request::PeerConnect(c) => Waiter {
                kind,
                seq,
                local_host: c.local_host,
                local_disc: c.local_disc,
                remote_host: c.remote_host,
                remote_disc: c.remote_disc,
                info: c.info,
                segment_bytes: c.segment_bytes,
                deadline: deadline(c.timeout_ms),
                inbox: fds.remove(0),
            },
        };
        self.wait(token, waiter);
    }

    fn hello(&mut self, token: u64, name: &str) {
        match device::resolve(name) {
            Ok(d) => {
                let reply = Reply::Device {
                    name: d.name,
                    interface: d.interface,
                    host_addr: d.host_addr,
                    mtu: d.mtu,
                };
                if self.send(token, &reply, &[]) {
                    if let Some(c) = self.clients.get_mut(&token) {
                        c.state = State::Session;
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

    /// Queues `w` for `token`, then pairs it with the oldest matching waiter.
    fn wait(&mut self, token: u64, w: Waiter) {
        debug!(client = token, kind = ?w.kind, disc = ?w.local_disc, "waiting");
        if let Some(c) = self.clients.get_mut(&token) {
            c.state = State::Waiting(w);
        }
        while let Some(w) = self.waiter(token) {
            let partner = self
                .clients
                .iter()
                .filter_map(|(t, c)| match &c.state {
                    State::Waiting(o) if *t != token && pairs(w, o) => Some((o.seq, *t)),
                    _ => None,
                })
                .min();
            let Some((_, old)) = partner else { return };
            // A partner that has gone away is dropped and the next one tried.
            if let Err(gone) = self.pair(old, token) {
                self.clients.remove(&gone);
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
        let (memfd, s0, s1) = match resources(a.segment_bytes.max(b.segment_bytes)) {
            Ok(r) => r,
            Err(e) => {
                warn!("cannot create connection resources: {e}");
                return Err(new);
            }
        };
        let (reply_a, reply_b) = match a.kind {
            Kind::Peer => (
                Reply::PeerMatched {
                    side: Side::A,
                    remote_info: b.info.clone(),
                },
                Reply::PeerMatched {
                    side: Side::B,
                    remote_info: a.info.clone(),
                },
            ),
            _ => (
                Reply::Matched {
                    remote_info: b.info.clone(),
                },
                Reply::Incoming {
                    remote_host: a.local_host.clone(),
                    remote_disc: a.local_disc.clone(),
                    remote_info: a.info.clone(),
                },
            ),
        };
        let fds_a = [memfd.as_fd(), s0.as_fd(), b.inbox.as_fd()];
        let fds_b = [memfd.as_fd(), s1.as_fd(), a.inbox.as_fd()];
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
        let expired: Vec<(u64, Kind)> = self
            .clients
            .iter()
            .filter_map(|(t, c)| match &c.state {
                State::Waiting(w) if w.deadline.is_some_and(|d| d <= now) => Some((*t, w.kind)),
                _ => None,
            })
            .collect();
        for (token, kind) in expired {
            debug!(client = token, ?kind, "timed out");
            match kind {
                Kind::Listen => self.listen_timeouts += 1,
                _ => self.no_match += 1,
            }
            self.finish(token, &Reply::NoMatch);
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.clients
            .values()
            .filter_map(|c| match &c.state {
                State::Waiting(w) => w.deadline,
                _ => None,
            })
            .min()
    }

    fn counters(&self) -> Vec<(String, u64)> {
        let count = |f: &dyn Fn(&State) -> bool| {
            self.clients.values().filter(|c| f(&c.state)).count() as u64
        };
        let waiting = |k: Kind| count(&|s| matches!(s, State::Waiting(w) if w.kind == k));
        let uptime = self.started.map_or(0, |s| s.elapsed().as_secs());
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
        ]
        .into_iter()
        .map(|(n, v)| (n.to_string(), v))
        .collect()
    }
}
