//! The network transport: VIs on different hosts over UDP.
//!
//! Each NIC has one UDP socket (a [`NetPort`]) that multiplexes all its
//! VIs: packets name the target VI and carry its random per-connection key.
//! Each connected VI owns a [`via_reliable::Session`], the I/O-free protocol
//! core; this module feeds it datagrams and time, and sends what it returns.
//! Whoever calls first drains the socket: the application in its
//! `Done`/`Wait` calls, or the helper thread when the application is not
//! calling.

use crate::counters::{Counter, Counters};
use crate::nic::Nic;
use crate::tuning::tuning;
use crate::Vi;
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;
use via_core::error::{ViaError, ViaResult};
use via_reliable::{Config, Event, Session, Transmit};
use via_wire::{Header, Packet, HEADER_LEN};

/// Largest UDP payload.
const MAX_DATAGRAM: usize = 65507;

/// The UDP socket of one NIC.
pub struct NetPort {
    socket: UdpSocket,
    /// The address IPv4 peers send to (the device's IPv4 address).
    pub local4: SocketAddr,
    /// The address IPv6 peers send to, if the device has an IPv6 address
    /// and the socket is dual-stack.
    pub local6: Option<SocketAddr>,
    dual_stack: bool,
    /// Payload bytes per packet.
    pub segment: usize,
    vis: RwLock<HashMap<u32, Weak<Vi>>>,
    /// Held while draining the socket, so packets of one VI are handled in order.
    engine: Mutex<Batch>,
    /// The NIC's counters.
    pub counters: Counters,
    /// Who drains the socket: the application while it polls, the helper
    /// thread otherwise (`Handover`).
    pub(crate) handover: Handover,
    /// The port's token in the helper thread's epoll.
    pub(crate) token: AtomicU64,
}

/// How long after the application's last poll the helper thread takes
/// the socket over: packets then wait at most this long for someone to
/// read them while the application neither polls nor sleeps in a wait.
pub(crate) const QUIET: std::time::Duration = std::time::Duration::from_micros(200);

/// The hand-over of a port's socket between the application and the helper
/// thread.  The helper thread's epoll reports the socket once (one-shot) and
/// is armed again only when the helper thread takes over, so a datagram
/// that arrives while the application polls wakes no other thread: the
/// poll that is running reads it.
#[derive(Default)]
pub(crate) struct Handover {
    /// When the application last polled (ns since `epoch()`).
    app_polled: AtomicU64,
    /// Application threads asleep in a wait that this port's packets end.
    sleepers: AtomicU32,
    /// Whether the helper thread's epoll will report the socket.
    pub(crate) armed: AtomicBool,
}

impl Handover {
    /// Whether the helper thread should drain the socket now: somebody
    /// sleeps on it, or the application has not polled for `QUIET`.
    pub(crate) fn helper_drains(&self, now_ns: u64) -> bool {
        self.sleepers.load(Ordering::SeqCst) > 0
            || now_ns.saturating_sub(self.app_polled.load(Ordering::Relaxed)) >= QUIET.as_nanos() as u64
    }

    /// When the helper thread should look again, if it left the socket to
    /// the application (ns since `epoch()`).
    pub(crate) fn look_again_ns(&self) -> u64 {
        self.app_polled.load(Ordering::Relaxed) + QUIET.as_nanos() as u64
    }
}

/// Nanoseconds since the first call: the clock of the hand-over.
pub(crate) fn epoch_ns() -> u64 {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// An application thread asleep on a port: while it exists, the helper
/// thread reads the socket as soon as a datagram arrives.
pub(crate) struct PortSleep(Arc<NetPort>);

impl Drop for PortSleep {
    fn drop(&mut self) {
        self.0.handover.sleepers.fetch_sub(1, Ordering::SeqCst);
    }
}

impl NetPort {
    /// Opens the port of `nic`: a dual-stack UDP socket, reached at the
    /// device's IPv4 address (and IPv6 address, if it has one); a plain IPv4
    /// socket on the device's address where IPv6 is not available.
    pub fn open(nic: &Nic) -> ViaResult<Arc<NetPort>> {
        let ip4 = match nic.device.host_addr.as_slice() {
            [a, b, c, d] => IpAddr::V4(Ipv4Addr::new(*a, *b, *c, *d)),
            _ => return Err(ViaError::Resource),
        };
        let ip6 = nic
            .device
            .host_addr6
            .as_deref()
            .and_then(|b| <[u8; 16]>::try_from(b).ok())
            .map(|b| IpAddr::V6(std::net::Ipv6Addr::from(b)));
        let (socket, dual_stack) = match UdpSocket::bind("[::]:0") {
            Ok(s) => (s, true),
            Err(_) => (UdpSocket::bind(SocketAddr::new(ip4, 0)).map_err(|_| ViaError::Resource)?, false),
        };
        socket.set_nonblocking(true).map_err(|_| ViaError::Resource)?;
        grow_buffers(&socket);
        let number = socket.local_addr().map_err(|_| ViaError::Resource)?.port();
        let port = Arc::new(NetPort {
            socket,
            local4: SocketAddr::new(ip4, number),
            local6: ip6.filter(|_| dual_stack).map(|ip| SocketAddr::new(ip, number)),
            dual_stack,
            segment: segment_size(nic.device.mtu as usize),
            vis: RwLock::new(HashMap::new()),
            engine: Mutex::new(Batch::new(
                tuning().recv_batch,
                MAX_DATAGRAM.min(HEADER_LEN + segment_size(nic.device.mtu as usize)) + 1,
            )),
            counters: nic.counters.clone(),
            handover: Handover::default(),
            token: AtomicU64::new(0),
        });
        crate::progress::watch_port(&port);
        Ok(port)
    }

    /// The socket's descriptor, for the helper thread's epoll.
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.socket.as_raw_fd()
    }

    /// Routes packets for VI id `vi` to `target`.
    pub fn register(&self, vi: u32, target: Weak<Vi>) {
        self.vis.write().insert(vi, target);
    }

    /// Stops routing packets to VI id `vi`.
    pub fn unregister(&self, vi: u32) {
        self.vis.write().remove(&vi);
    }

    /// The application polls: drains the socket, and tells the helper thread
    /// to leave it alone for a while.
    pub fn poll_for_app(&self) {
        self.handover.app_polled.store(epoch_ns(), Ordering::Relaxed);
        self.poll();
    }

    /// An application thread is about to sleep until this port's packets
    /// wake it: the helper thread must read the socket from now on.
    pub(crate) fn sleep(self: &Arc<Self>) -> PortSleep {
        self.handover.sleepers.fetch_add(1, Ordering::SeqCst);
        if !self.handover.armed.swap(true, Ordering::SeqCst) {
            crate::progress::arm_port(self);
        }
        PortSleep(self.clone())
    }

    /// Drains the socket, handing each packet to its VI.  Returns false when
    /// another thread is draining it already.
    pub fn poll(&self) -> bool {
        let Some(mut batch) = self.engine.try_lock() else { return false };
        use std::os::fd::AsRawFd;
        while let Some(n) = batch.receive(self.socket.as_raw_fd()) {
            self.dispatch(&batch, n);
            if n < batch.lens.len() {
                break;
            }
        }
        true
    }

    /// Hands a batch of datagrams to their VIs, consecutive packets of one VI
    /// together, so that one acknowledgement can answer several.
    fn dispatch(&self, batch: &Batch, n: usize) {
        let mut run: Vec<(Header, &[u8])> = Vec::new();
        let mut run_vi = None;
        for datagram in batch.datagrams(n) {
            let header = match Packet::new_checked(datagram).and_then(|p| Header::parse(&p)) {
                Ok(h) => h,
                Err(e) => {
                    tracing::debug!("malformed packet: {e}");
                    self.counters.add(Counter::Malformed, 1);
                    continue;
                }
            };
            if run_vi != Some(header.dst_vi) {
                self.deliver(run_vi, &run);
                run.clear();
                run_vi = Some(header.dst_vi);
            }
            run.push((header, &datagram[HEADER_LEN..]));
        }
        self.deliver(run_vi, &run);
    }

    fn deliver(&self, vi: Option<u32>, packets: &[(Header, &[u8])]) {
        let Some(id) = vi else { return };
        if packets.is_empty() {
            return;
        }
        let target = self.vis.read().get(&id).and_then(Weak::upgrade);
        match target {
            Some(vi) => {
                self.counters.add(Counter::PacketsReceived, packets.len() as u64);
                vi.net_input(packets);
            }
            None => {
                tracing::debug!(vi = id, "packets for an unknown VI");
                self.counters.add(Counter::UnknownVi, packets.len() as u64);
            }
        }
    }

    /// Runs the timers of every VI on this port; returns the next deadline.
    pub fn service(&self, now: Instant) -> Option<Instant> {
        let vis: Vec<Arc<Vi>> = self.vis.read().values().filter_map(Weak::upgrade).collect();
        vis.iter().filter_map(|vi| vi.net_timers(now)).min()
    }

    /// The address a peer at `remote_host` (4 or 16 bytes) sends to.
    pub fn local_for(&self, remote_host: &[u8]) -> ViaResult<SocketAddr> {
        match remote_host.len() {
            16 => self.local6.ok_or(ViaError::NotReachable),
            _ => Ok(self.local4),
        }
    }

    /// Sends the first `n` packets of `out` to `to` with as few system calls as possible.
    fn send_all(&self, to: SocketAddr, out: &[(Vec<u8>, usize)]) {
        use std::os::fd::AsRawFd;
        // A dual-stack socket reaches IPv4 peers at their mapped address.
        let to = match to {
            SocketAddr::V4(v4) if self.dual_stack => SocketAddr::new(IpAddr::V6(v4.ip().to_ipv6_mapped()), v4.port()),
            other => other,
        };
        let addr = socket2_addr(to);
        let mut iov: Vec<libc::iovec> = out
            .iter()
            .map(|(b, len)| libc::iovec { iov_base: b.as_ptr() as *mut libc::c_void, iov_len: *len })
            .collect();
        let mut msgs: Vec<libc::mmsghdr> = iov
            .iter_mut()
            .map(|v| {
                // SAFETY: a zeroed msghdr is valid; fields set below.
                let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
                h.msg_name = &addr.0 as *const libc::sockaddr_storage as *mut libc::c_void;
                h.msg_namelen = addr.1;
                h.msg_iov = v;
                h.msg_iovlen = 1;
                libc::mmsghdr { msg_hdr: h, msg_len: 0 }
            })
            .collect();
        let mut sent = 0;
        while sent < msgs.len() {
            let rest = &mut msgs[sent..];
            // SAFETY: every header points at live buffers and the address above.
            let r = unsafe { libc::sendmmsg(self.socket.as_raw_fd(), rest.as_mut_ptr(), rest.len() as u32, 0) };
            if r <= 0 {
                // A full socket buffer drops the rest: the session retransmits.
                break;
            }
            sent += r as usize;
        }
        self.counters.add(Counter::PacketsSent, sent as u64);
    }
}

/// Receive buffers for `recvmmsg`, with their headers built once: an
/// empty poll of the socket allocates nothing.
struct Batch {
    bufs: Vec<Vec<u8>>,
    lens: Vec<usize>,
    /// One iovec per buffer; points into `bufs`' heap storage, which never moves.
    iov: Vec<libc::iovec>,
    /// One header per buffer; points into `iov`'s heap storage, which never moves.
    msgs: Vec<libc::mmsghdr>,
}

// The raw pointers only point into the batch's own heap buffers.
unsafe impl Send for Batch {}

impl Batch {
    fn new(count: usize, size: usize) -> Batch {
        let mut bufs: Vec<Vec<u8>> = (0..count).map(|_| vec![0u8; size]).collect();
        let mut iov: Vec<libc::iovec> = bufs
            .iter_mut()
            .map(|b| libc::iovec { iov_base: b.as_mut_ptr() as *mut libc::c_void, iov_len: b.len() })
            .collect();
        let msgs = iov
            .iter_mut()
            .map(|v| {
                // SAFETY: a zeroed msghdr is valid; the iovec is set below.
                let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
                h.msg_iov = v;
                h.msg_iovlen = 1;
                libc::mmsghdr { msg_hdr: h, msg_len: 0 }
            })
            .collect();
        Batch { bufs, lens: vec![0; count], iov, msgs }
    }

    /// Receives up to a batch of datagrams without blocking; `None` when there are none.
    fn receive(&mut self, fd: std::os::fd::RawFd) -> Option<usize> {
        debug_assert_eq!(self.iov.len(), self.msgs.len());
        loop {
            // SAFETY: the headers point at our buffers.
            let r = unsafe {
                libc::recvmmsg(
                    fd,
                    self.msgs.as_mut_ptr(),
                    self.msgs.len() as u32,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            };
            if r < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            if r <= 0 {
                return None;
            }
            for (len, m) in self.lens.iter_mut().zip(&self.msgs).take(r as usize) {
                // A truncated datagram is longer than any packet we accept: drop it.
                *len = if m.msg_hdr.msg_flags & libc::MSG_TRUNC != 0 { 0 } else { m.msg_len as usize };
            }
            return Some(r as usize);
        }
    }

    fn datagrams(&self, n: usize) -> impl Iterator<Item = &[u8]> {
        self.bufs.iter().zip(&self.lens).take(n).map(|(b, &len)| &b[..len])
    }
}

/// A socket address in the form `sendmmsg` takes.
fn socket2_addr(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: zeroed storage is valid; we fill the variant that matches.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(a.ip().octets()) },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_in fits in sockaddr_storage.
            unsafe { std::ptr::write(&mut storage as *mut _ as *mut libc::sockaddr_in, sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr { s6_addr: a.ip().octets() },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_in6 fits in sockaddr_storage.
            unsafe { std::ptr::write(&mut storage as *mut _ as *mut libc::sockaddr_in6, sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}

/// Socket buffers large enough for a full window of jumbo segments, so that
/// bursts are not dropped by the kernel before the session sees them.
fn grow_buffers(socket: &UdpSocket) {
    use std::os::fd::AsRawFd;
    let bytes: libc::c_int = 16 << 20;
    for (force, plain) in [(libc::SO_RCVBUFFORCE, libc::SO_RCVBUF), (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF)] {
        let set = |opt| {
            // SAFETY: setsockopt with an int option on our socket.
            unsafe {
                libc::setsockopt(
                    socket.as_raw_fd(),
                    libc::SOL_SOCKET,
                    opt,
                    &bytes as *const libc::c_int as *const libc::c_void,
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            }
        };
        // The forced variant needs CAP_NET_ADMIN; otherwise take what the limit allows.
        if set(force) != 0 {
            set(plain);
        }
    }
}

/// Payload bytes per packet: `VIA_SEGMENT_SIZE`, or what fits the MTU.
fn segment_size(mtu: usize) -> usize {
    let from_mtu = mtu.saturating_sub(28 + HEADER_LEN).max(512);
    crate::tuning::segment_size().unwrap_or(from_mtu).clamp(256, MAX_DATAGRAM - HEADER_LEN)
}

/// The buffers a sent message's bytes come from, until the session says it is sent.
pub(crate) type Gather = Vec<(u64, u32)>;

/// The network side of one connected VI.
pub struct NetLink {
    /// The NIC's port.
    pub port: Arc<NetPort>,
    /// The peer's data socket.
    pub peer: SocketAddr,
    /// This VI's id on the wire.
    pub local_vi: u32,
    pub(crate) state: Mutex<NetState>,
}

pub(crate) struct NetState {
    pub session: Session,
    pub outbound: HashMap<u64, Gather>,
    next_token: u64,
    /// Packets built for one `sendmmsg`, with their lengths.
    out: Vec<(Vec<u8>, usize)>,
    /// The session's counters when last added to the NIC's.
    seen: via_reliable::Stats,
}

impl NetLink {
    /// A link to `peer` with a fresh session.
    pub fn new(
        port: Arc<NetPort>,
        peer: SocketAddr,
        config: Config,
        local: via_reliable::Peer,
        remote: via_reliable::Peer,
    ) -> NetLink {
        NetLink {
            port,
            peer,
            local_vi: local.vi,
            state: Mutex::new(NetState {
                session: Session::new(config, local, remote, Instant::now()),
                outbound: HashMap::new(),
                next_token: 1,
                out: Vec::new(),
                seen: Default::default(),
            }),
        }
    }
}

impl NetState {
    /// A token for a message whose bytes come from `gather`.
    pub fn remember(&mut self, gather: Gather) -> u64 {
        let token = self.next_token;
        self.next_token += 1;
        self.outbound.insert(token, gather);
        token
    }

    /// Sends everything the session has to send, and collects its events.
    pub fn flush(&mut self, link_peer: SocketAddr, port: &NetPort, events: &mut Vec<Event>) {
        let now = Instant::now();
        let mut n = 0;
        while let Some(t) = self.session.poll_transmit(now) {
            if n == self.out.len() {
                let size = HEADER_LEN + self.session.config().max_payload.min(MAX_DATAGRAM - HEADER_LEN);
                self.out.push((vec![0u8; size], 0));
            }
            let len = build(&self.outbound, &t, &mut self.out[n].0);
            self.out[n].1 = len;
            n += 1;
            if n == SEND_BATCH {
                port.send_all(link_peer, &self.out[..n]);
                n = 0;
            }
        }
        if n > 0 {
            port.send_all(link_peer, &self.out[..n]);
        }
        let stats = self.session.stats();
        port.counters.add(Counter::Retransmits, stats.retransmits - self.seen.retransmits);
        port.counters.add(Counter::Duplicates, stats.duplicates - self.seen.duplicates);
        port.counters.add(Counter::BadKey, stats.bad_key - self.seen.bad_key);
        self.seen = stats;
        while let Some(e) = self.session.poll_event() {
            if let Event::Sent { token } = e {
                self.outbound.remove(&token);
            }
            events.push(e);
        }
    }
}

/// Packets sent per system call.
const SEND_BATCH: usize = 32;

/// Builds one packet into `buf`: header, payload gathered from the
/// message's buffers, checksum.  Returns its length.
fn build(outbound: &HashMap<u64, Gather>, t: &Transmit, buf: &mut [u8]) -> usize {
    let plen = t.payload.map_or(0, |p| p.len as usize).min(buf.len() - HEADER_LEN);
    t.header.emit(buf, plen);
    if let Some(p) = t.payload {
        let out = &mut buf[HEADER_LEN..HEADER_LEN + plen];
        match outbound.get(&p.token) {
            Some(gather) => gather_bytes(gather, p.offset as u64, out),
            None => out.fill(0),
        }
    }
    via_wire::finish(&mut buf[..HEADER_LEN + plen]);
    HEADER_LEN + plen
}

/// Copies bytes `offset..offset + out.len()` of the buffers `gather` into `out`.
fn gather_bytes(gather: &Gather, mut offset: u64, out: &mut [u8]) {
    let mut filled = 0;
    for &(addr, len) in gather {
        let len = len as u64;
        if offset >= len {
            offset -= len;
            continue;
        }
        let n = ((len - offset) as usize).min(out.len() - filled);
        // SAFETY: the buffers were validated against the registry when posted
        // and stay registered until the descriptor completes.
        unsafe { std::ptr::copy_nonoverlapping((addr + offset) as *const u8, out[filled..].as_mut_ptr(), n) };
        filled += n;
        offset = 0;
        if filled == out.len() {
            return;
        }
    }
    out[filled..].fill(0);
}

/// Copies `data` into the buffers `segs` starting at byte `offset`.
/// Returns false if it does not fit.
pub(crate) fn scatter(segs: &[via_core::descriptor::LocalSeg], mut offset: u64, data: &[u8]) -> bool {
    let mut done = 0;
    for s in segs {
        let len = s.len as u64;
        if offset >= len {
            offset -= len;
            continue;
        }
        let n = ((len - offset) as usize).min(data.len() - done);
        // SAFETY: receive buffers were validated against the registry when posted.
        unsafe { std::ptr::copy_nonoverlapping(data[done..].as_ptr(), (s.addr + offset) as *mut u8, n) };
        done += n;
        offset = 0;
        if done == data.len() {
            return true;
        }
    }
    done == data.len()
}

impl NetLink {
    /// Orderly disconnect: tell the peer, stop routing.
    pub fn disconnect(&self) {
        let mut st = self.state.lock();
        tracing::info!(vi = self.local_vi, peer = %self.peer, stats = ?st.session.stats(), "network VI disconnected");
        st.session.disconnect();
        st.flush(self.peer, &self.port, &mut Vec::new());
        drop(st);
        self.port.unregister(self.local_vi);
    }

    /// Breaks the connection, telling the peer `code` if given; stops routing.
    pub fn close(&self, code: Option<u32>) {
        let mut st = self.state.lock();
        tracing::info!(vi = self.local_vi, peer = %self.peer, stats = ?st.session.stats(), "network VI broken");
        if let Some(code) = code {
            st.session.close(code);
        }
        st.flush(self.peer, &self.port, &mut Vec::new());
        drop(st);
        self.port.unregister(self.local_vi);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use via_core::descriptor::LocalSeg;

    #[test]
    fn gather_and_scatter_cross_segment_boundaries() {
        let a = *b"hello ";
        let b = *b"world";
        let gather = vec![(a.as_ptr() as u64, 6), (b.as_ptr() as u64, 5)];
        let mut out = [0u8; 7];
        gather_bytes(&gather, 3, &mut out);
        assert_eq!(&out, b"lo worl");
        let mut x = [0u8; 4];
        let mut y = [0u8; 4];
        let segs = [LocalSeg { addr: x.as_mut_ptr() as u64, len: 4 }, LocalSeg { addr: y.as_mut_ptr() as u64, len: 4 }];
        assert!(scatter(&segs, 2, b"abcd"));
        assert_eq!((&x, &y), (b"\0\0ab", b"cd\0\0"));
        assert!(!scatter(&segs, 6, b"abc"));
    }
}
