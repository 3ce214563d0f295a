//! The network transport: VIs on different hosts over UDP.
//!
//! Each NIC has one UDP port (a [`NetPort`]) that multiplexes all its VIs:
//! packets name the target VI and carry its random per-connection key.  The
//! port is an unconnected socket and a socket connected to each peer
//! (`peer_socket`), all bound to one address.
//! Each connected VI owns a [`via_reliable::Session`], the I/O-free protocol
//! core; this module feeds it datagrams and time, and sends what it returns.
//! What the port's sessions share without I/O (routing by VI, owed
//! acknowledgements, which socket a poll reads, frame or datagram) is the
//! I/O-free [`via_reliable::endpoint`]; the port's sockets and packet ring
//! are its datapath (`UdpSockets` with a `PacketRing` beside them), the
//! port's VIs its routes (`PortRoutes`).
//! Whoever calls first drains the sockets: the application in its
//! `Done`/`Wait` calls, or the helper thread when the application is not
//! calling.
//!
//! Segmentation offload: consecutive equal-size packets to one peer leave in
//! one `sendmsg` as a UDP GSO buffer (`UDP_SEGMENT`), which the kernel cuts
//! into datagrams at the packet size; the socket takes coalesced datagrams
//! (`UDP_GRO`) and cuts them again at the size the kernel reports.  Every
//! packet is still a datagram of its own on the wire and is checked on its
//! own.  `VIA_GSO=0` turns both off.

mod batch;
pub(crate) mod ether;
mod last_words;
pub(crate) mod neighbours;
mod path;
pub(crate) mod peer_socket;
pub(crate) mod send;
pub(crate) mod setup;
#[cfg(test)]
pub(crate) mod sim_wire;

use crate::counters::{Counter, Counters};
use crate::progress;
use crate::transport::udp::batch::{first_packet_len, Batch, GRO_BUFFER};
use crate::transport::udp::ether::EtherSocket;
use crate::transport::udp::last_words::LastWords;
use crate::transport::udp::peer_socket::{bind_port, set_option, PeerSocket};
use crate::transport::udp::send::{send_groups, OutPackets, Packets, GSO_MAX_BYTES, GSO_MAX_SEGMENTS};
use crate::tuning::Tuning;
use parking_lot::{Mutex, RwLock};
use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;
use via_core::error::{ViaError, ViaResult};
use via_reliable::endpoint::{Arrivals, Beside, Datapath, Endpoint, FrameChoice, Routes, Tally};
use via_reliable::{BreakReason, Config, Event, LastWord, Segment, Session, Time};
use via_wire::frame::{Frame, MAC_LEN};
use via_wire::{Header, Packet, FLAG_LAST, HEADER_LEN};
use viad_client::client::DeviceInfo;

/// A connected VI as its port sees it: where its packets go.  (`Vi`
/// implements it, in `path`; the port names no VI type.)
pub(crate) trait NetReceiver: Send + Sync {
    /// Packets for it arrived (in an Ethernet frame if `frame`).  Returns
    /// whether its session owes an acknowledgement it held back (with
    /// `app_away`, whether anything is unacknowledged): the port sends it
    /// when it finds its sockets empty (`send_owed_ack`), unless a reply
    /// carried it first.
    fn net_input(&self, link: &Arc<NetLink>, packets: &[(Header, &[u8])], frame: bool, app_away: bool) -> bool;
    /// Calls `receive` with the place where its message under way continues
    /// and the room there (at most `max`), while that place stays its own;
    /// false, without calling it, when it has no such place.
    fn receive_in_place(&self, max: usize, receive: &mut dyn FnMut(*mut u8, usize)) -> bool;
    /// Sends the acknowledgement `net_input` held back.
    fn send_owed_ack(&self, link: &Arc<NetLink>, app_away: bool);
    /// Runs its session's timers; returns its next deadline.
    fn net_timers(&self, link: &Arc<NetLink>, now: Time) -> Option<Time>;
}

/// Whose registry a link's outgoing buffers are checked against before
/// their bytes are read (`Outbound::check`): the VI's NIC.
pub(crate) trait RegistryOwner: Send + Sync {
    /// The registry.
    fn registry(&self) -> &via_core::registry::Registry;
}

/// Largest UDP payload.
pub(crate) const MAX_DATAGRAM: usize = 65507;

/// Bytes of the IPv4 and UDP headers; IPv6 has 20 more.
const IP4_UDP_HEADERS: usize = 28;
const IP6_UDP_HEADERS: usize = 48;

/// The UDP sockets of one NIC: one unconnected, and one connected to each
/// peer (`peer_socket`).
pub struct NetPort {
    socket: UdpSocket,
    /// Every socket of the port, and whether they are in the helper
    /// thread's epoll.
    watched: Mutex<Watched>,
    /// The address IPv4 peers send to (the device's IPv4 address).
    pub local4: SocketAddr,
    /// The address IPv6 peers send to, if the device has an IPv6 address
    /// and the socket is dual-stack.
    pub local6: Option<SocketAddr>,
    dual_stack: bool,
    /// Payload bytes per packet.
    pub segment: usize,
    /// Payload bytes per large packet (`takes_large_packets`): a whole
    /// number of the MTU's datagrams fills one GSO buffer.
    pub large_payload: usize,
    /// Whether the segment size was set (`VIA_SEGMENT_SIZE`) rather than
    /// taken from the MTU: then packets are of that size, never large.
    fixed_segment: bool,
    /// The device's MTU: a GSO segment must fit it whole.
    mtu: usize,
    /// Whether sends may use GSO: `VIA_GSO` allows it and the kernel has
    /// not refused it on this socket.
    gso: AtomicBool,
    /// Whether the socket takes coalesced datagrams (`UDP_GRO`).
    gro: bool,
    /// GSO buffers sent (of more than one packet).
    gso_buffers: AtomicU64,
    /// Coalesced datagrams received (holding more than one packet).
    gro_buffers: AtomicU64,
    /// The port's Ethernet side, where the process may open it (`ether`).
    ether: Option<EtherSocket>,
    vis: RwLock<HashMap<u32, Route, BuildHasherDefault<IdHasher>>>,
    /// The last words of this port's ended connections, said again to
    /// their peers' retransmissions.
    ended: Mutex<LastWords>,
    /// Held while draining the sockets, so packets of one VI are handled in order.
    engine: Mutex<Engine>,
    /// The NIC's counters.
    pub counters: Counters,
    /// Who drains the socket: the application while it polls, the helper
    /// thread otherwise (`Handover`).
    pub(crate) handover: Handover,
    /// The port's token in the helper thread's epoll.
    pub(crate) token: AtomicU64,
    /// When the sessions' earliest timer is due (ns since `epoch_ns`), for
    /// the application's polls, which run the timers while they go on.
    timers_due_ns: AtomicU64,
    /// In the whole-provider simulator, the simulated wire that takes the
    /// place of the sockets (`NetPort::simulated`).
    #[cfg(test)]
    sim: Option<Arc<sim_wire::SimWire>>,
}

/// How long after the application's last poll the helper thread takes
/// the socket over: packets then wait at least this long for someone to
/// read them while the application neither polls nor sleeps in a wait.
pub(crate) const QUIET: std::time::Duration = std::time::Duration::from_micros(200);

/// The longest the helper thread leaves between two looks at an
/// application that keeps polling: each look it finds the application
/// polling doubles the interval from `QUIET` up to this.  A look is a
/// wake-up on the application's CPU, if it has only one; this bounds how
/// long packets wait after the application stops polling, below the
/// shortest retransmission timeout (1 ms).
pub(crate) const QUIET_MAX: std::time::Duration = std::time::Duration::from_micros(800);

/// How often, in polls that find nothing, the application's poll reads
/// the clock to see whether the sessions' timers are due.
const TIMER_CHECK_POLLS: u32 = 16;

/// The hand-over of a port's sockets between the application and the
/// helper thread.  The helper thread's epoll reports them once (one-shot),
/// then they leave its epoll set and return only when the helper thread
/// takes over, so a datagram that arrives while the application polls
/// wakes no other thread and calls into no epoll: the poll that is running
/// reads it.
#[derive(Default)]
pub(crate) struct Handover {
    /// Polls by the application so far: a count, not a clock, so that a
    /// poll reads no clock.  Only a change matters.
    app_polls: AtomicU64,
    /// The count the helper thread saw last, and when it last saw it
    /// change (ns since `epoch()`), and how long it waits before it looks
    /// again (0: `QUIET`); only the helper thread writes these.
    seen_polls: AtomicU64,
    seen_change_ns: AtomicU64,
    interval_ns: AtomicU64,
    /// Application threads asleep in a wait that this port's packets end.
    sleepers: AtomicU32,
    /// Whether the helper thread's epoll will report the socket.
    pub(crate) armed: AtomicBool,
}

impl Handover {
    /// The application polls.
    fn polled(&self) {
        // Threads that poll at once may lose each other's increments: any
        // change is enough.
        let n = self.app_polls.load(Ordering::Relaxed);
        self.app_polls.store(n.wrapping_add(1), Ordering::Relaxed);
    }

    /// Whether the helper thread should drain the socket now: somebody
    /// sleeps on it, or the application has not polled for `QUIET` (since
    /// the helper thread last looked and saw it had).  Helper thread only.
    pub(crate) fn helper_drains(&self, now_ns: u64) -> bool {
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            return true;
        }
        let polls = self.app_polls.load(Ordering::Relaxed);
        if polls != self.seen_polls.load(Ordering::Relaxed) {
            self.seen_polls.store(polls, Ordering::Relaxed);
            self.seen_change_ns.store(now_ns, Ordering::Relaxed);
            let longer = (self.interval() * 2).min(QUIET_MAX.as_nanos() as u64);
            self.interval_ns.store(longer, Ordering::Relaxed);
            return false;
        }
        let away = now_ns.saturating_sub(self.seen_change_ns.load(Ordering::Relaxed)) >= QUIET.as_nanos() as u64;
        if away {
            self.interval_ns.store(0, Ordering::Relaxed);
        }
        away
    }

    /// Whether the application is polling, as the helper thread last saw
    /// it: it leaves the sockets and the sessions' timers to it.
    pub(crate) fn app_is_polling(&self) -> bool {
        self.sleepers.load(Ordering::SeqCst) == 0 && !self.armed.load(Ordering::SeqCst)
    }

    /// When the helper thread should look again, if it left the socket to
    /// the application (ns since `epoch()`).
    pub(crate) fn look_again_ns(&self) -> u64 {
        self.seen_change_ns.load(Ordering::Relaxed) + self.interval()
    }

    fn interval(&self) -> u64 {
        self.interval_ns.load(Ordering::Relaxed).max(QUIET.as_nanos() as u64)
    }
}

/// The clock of the hand-over: the sessions' `Time`, in nanoseconds.
pub(crate) fn epoch_ns() -> u64 {
    crate::clock::time_of(Instant::now()).as_nanos()
}

/// An application thread asleep on a port: while it exists, the helper
/// thread reads the socket as soon as a datagram arrives.
pub(crate) struct PortSleep(Arc<NetPort>);

impl Drop for PortSleep {
    fn drop(&mut self) {
        self.0.handover.sleepers.fetch_sub(1, Ordering::SeqCst);
    }
}

/// How soon the helper thread tries again to take over a port that another
/// thread was draining.
const BUSY_RETRY: std::time::Duration = std::time::Duration::from_micros(20);

/// The helper thread serves a port: its sockets when the application is
/// not polling them (`Handover`), and its sessions' timers.
impl progress::Source for NetPort {
    fn ready(&self) {
        // One-shot: the report is spent, and the sockets leave the epoll
        // set until it is armed again.  Drain now if nobody else will;
        // otherwise `service` looks again later.
        self.unwatch();
        self.handover.armed.store(false, Ordering::SeqCst);
        if self.handover.helper_drains(epoch_ns()) {
            self.take_over();
        }
    }

    fn service(&self, now: Instant) -> Option<Instant> {
        let mut look_again = None;
        if !self.handover.armed.load(Ordering::SeqCst) {
            if !self.handover.helper_drains(epoch_ns()) {
                let ns = self.handover.look_again_ns().saturating_sub(epoch_ns());
                look_again = Some(now + std::time::Duration::from_nanos(ns));
            } else if !self.take_over() {
                look_again = Some(now + BUSY_RETRY);
            }
        }
        // The sessions' timers of a port the application polls are its polls'.
        let timers = if self.handover.app_is_polling() {
            None
        } else {
            self.run_timers(crate::clock::time_of(now)).map(crate::clock::instant_of)
        };
        timers.into_iter().chain(look_again).min()
    }
}

/// What a port is made of: `NetPort::open` finds it on the device and
/// the kernel, `NetPort::simulated` on the simulator's wire.
struct PortParts {
    socket: UdpSocket,
    /// The descriptors the helper thread watches for the port.
    fds: Vec<RawFd>,
    local4: SocketAddr,
    local6: Option<SocketAddr>,
    dual_stack: bool,
    mtu: usize,
    segment: usize,
    /// `VIA_SEGMENT_SIZE` set the segment.
    fixed_segment: bool,
    /// Sends may use GSO.
    offload: bool,
    gro: bool,
    ether: Option<EtherSocket>,
    batch: Batch,
    #[cfg(test)]
    sim: Option<Arc<sim_wire::SimWire>>,
}

impl NetPort {
    /// Opens the port of `nic`: a dual-stack UDP socket, reached at the
    /// device's IPv4 address (and IPv6 address, if it has one); a plain IPv4
    /// socket on the device's address where IPv6 is not available.
    pub fn open(device: &DeviceInfo, tuning: &Tuning, counters: &Counters) -> ViaResult<Arc<NetPort>> {
        let ip4 = match device.host_addr.as_slice() {
            [a, b, c, d] => IpAddr::V4(Ipv4Addr::new(*a, *b, *c, *d)),
            _ => return Err(ViaError::Resource),
        };
        let ip6 = device
            .host_addr6
            .as_deref()
            .and_then(|b| <[u8; 16]>::try_from(b).ok())
            .map(|b| IpAddr::V6(std::net::Ipv6Addr::from(b)));
        let (socket, dual_stack) = match bind_port(IpAddr::V6(Ipv6Addr::UNSPECIFIED)) {
            Ok(s) => (s, true),
            Err(_) => (bind_port(ip4).map_err(|_| ViaError::Resource)?, false),
        };
        socket.set_nonblocking(true).map_err(|_| ViaError::Resource)?;
        grow_buffers(&socket);
        let number = socket.local_addr().map_err(|_| ViaError::Resource)?.port();
        // Segmentation offload: sends of several packets in one buffer, and
        // datagrams that arrive coalesced (UDP_GRO).
        let offload = tuning.gso && kernel_has_gso(&socket);
        let gro = offload && set_option(&socket, libc::SOL_UDP, libc::UDP_GRO, 1).is_ok();
        let fixed_segment = crate::tuning::segment_size(tuning);
        let segment = segment_size(device.mtu as usize, fixed_segment);
        // Coalesced datagrams need buffers of the largest one; without
        // coalescing a buffer one byte longer than a packet tells a longer
        // datagram (truncated) from a packet.
        let buffer = if gro { GRO_BUFFER } else { MAX_DATAGRAM.min(HEADER_LEN + segment) + 1 };
        let ether = match ip4 {
            IpAddr::V4(ip) if tuning.ethernet => EtherSocket::open(ip, number)
                .map_err(|e| tracing::debug!("no Ethernet frames on this port ({e}): UDP only"))
                .ok(),
            _ => None,
        };
        let mut fds = vec![socket.as_raw_fd()];
        fds.extend(ether.as_ref().map(EtherSocket::fd));
        let port = Arc::new(NetPort::assemble(
            PortParts {
                socket,
                fds,
                local4: SocketAddr::new(ip4, number),
                local6: ip6.filter(|_| dual_stack).map(|ip| SocketAddr::new(ip, number)),
                dual_stack,
                mtu: device.mtu as usize,
                segment,
                fixed_segment: fixed_segment.is_some(),
                offload,
                gro,
                ether,
                batch: Batch::new(tuning.recv_batch, buffer, gro),
                #[cfg(test)]
                sim: None,
            },
            counters,
        ));
        // The engine holds the port weakly: it serves it while it lives.
        let token = progress::register(Arc::downgrade(&port) as Weak<dyn progress::Source>, true);
        port.token.store(token, Ordering::Release);
        port.handover.armed.store(true, Ordering::SeqCst);
        port.watch(progress::epoll_fd(), token);
        Ok(port)
    }

    /// A port of the whole-provider simulator on `wire`: no helper thread
    /// serves it (the simulator polls it and runs its timers) and its
    /// packets go over the wire instead of a socket.  It still holds an
    /// unused socket, so that everything else about it is a real port's.
    /// With `large`, it sends and takes large packets as a port with both
    /// offloads does, each one datagram on the simulated wire, as the
    /// receiver's `UDP_GRO` puts it together.
    #[cfg(test)]
    pub(crate) fn simulated(
        wire: Arc<sim_wire::SimWire>,
        mtu: usize,
        large: bool,
        counters: &Counters,
    ) -> Arc<NetPort> {
        let socket = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("a loopback socket");
        let segment = segment_size(mtu, None);
        Arc::new(NetPort::assemble(
            PortParts {
                socket,
                fds: Vec::new(),
                local4: sim_wire::addr_of(wire.host),
                local6: None,
                dual_stack: false,
                mtu,
                segment,
                fixed_segment: false,
                offload: large,
                gro: large,
                ether: None,
                batch: Batch::new(1, HEADER_LEN + segment + 1, false),
                sim: Some(wire),
            },
            counters,
        ))
    }

    /// A port of `parts`, with nothing sent or received yet.
    fn assemble(parts: PortParts, counters: &Counters) -> NetPort {
        NetPort {
            socket: parts.socket,
            watched: Mutex::new(Watched { fds: parts.fds, epoll: None }),
            local4: parts.local4,
            local6: parts.local6,
            dual_stack: parts.dual_stack,
            segment: parts.segment,
            fixed_segment: parts.fixed_segment,
            large_payload: large_payload(parts.mtu),
            mtu: parts.mtu,
            gso: AtomicBool::new(parts.offload),
            gro: parts.gro,
            gso_buffers: AtomicU64::new(0),
            gro_buffers: AtomicU64::new(0),
            ether: parts.ether,
            vis: RwLock::new(HashMap::default()),
            ended: Mutex::new(LastWords::default()),
            engine: Mutex::new(Engine {
                endpoint: Endpoint::new(parts.segment),
                input: Input { batch: parts.batch, landing: None },
                frame_slot: 0,
                peers: Vec::new(),
                idle_polls: 0,
            }),
            counters: counters.clone(),
            handover: Handover::default(),
            token: AtomicU64::new(0),
            timers_due_ns: AtomicU64::new(0),
            #[cfg(test)]
            sim: parts.sim,
        }
    }

    /// Whether this port is the simulator's.
    fn is_simulated(&self) -> bool {
        #[cfg(test)]
        return self.sim.is_some();
        #[cfg(not(test))]
        false
    }

    /// Arms the one-shot report of the sockets again (the caller has set
    /// `armed`): a datagram already waiting is reported at once.
    fn arm(&self) {
        self.watch(progress::epoll_fd(), self.token.load(Ordering::Acquire));
    }

    /// The helper thread drains the sockets and arms their report again;
    /// false if another thread is draining them (then `service` tries again
    /// soon).
    fn take_over(&self) -> bool {
        if !self.poll(true) {
            return false;
        }
        self.handover.armed.store(true, Ordering::SeqCst);
        self.arm();
        true
    }

    /// Puts every socket of the port in the epoll set `epoll` under
    /// `token`, to be reported once (`EPOLLONESHOT`), or arms them again.
    pub(crate) fn watch(&self, epoll: RawFd, token: u64) {
        let mut w = self.watched.lock();
        let op = if w.epoll.is_some() { libc::EPOLL_CTL_MOD } else { libc::EPOLL_CTL_ADD };
        for &fd in &w.fds {
            epoll_ctl(epoll, op, fd, token);
        }
        w.epoll = Some((epoll, token));
    }

    /// Takes the sockets out of the helper thread's epoll: a socket in an
    /// epoll set costs every datagram that arrives a call into epoll, even
    /// when its report is spent.
    pub(crate) fn unwatch(&self) {
        let mut w = self.watched.lock();
        if let Some((epoll, _)) = w.epoll.take() {
            for &fd in &w.fds {
                epoll_ctl(epoll, libc::EPOLL_CTL_DEL, fd, 0);
            }
        }
    }

    /// A socket of the port connected to `peer`, shared by every link to
    /// it; `None` if none can be opened (the link then sends and receives
    /// on the unconnected socket).
    pub(crate) fn connect_peer(&self, peer: SocketAddr) -> Option<Arc<PeerSocket>> {
        if self.is_simulated() {
            return None;
        }
        // An IPv4 peer gets an IPv4 socket: the kernel's IPv6 socket layer
        // costs a dual-stack socket time on every datagram.
        let port = self.socket.local_addr().ok()?.port();
        let (local, to) = match peer {
            SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
                Some(ip4) => (
                    SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port),
                    SocketAddr::new(IpAddr::V4(ip4), v6.port()),
                ),
                None => (SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port), peer),
            },
            SocketAddr::V4(_) => (SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port), peer),
        };
        let mut engine = self.engine.lock();
        if let Some(s) = engine.peers.iter().find(|s| s.peer == to) {
            return Some(s.clone());
        }
        let opened = PeerSocket::connect(local, to).and_then(|s| {
            grow_buffers(s.socket());
            if self.gro {
                set_option(s.socket(), libc::SOL_UDP, libc::UDP_GRO, 1)?;
            }
            Ok(s)
        });
        match opened {
            Ok(s) => {
                let s = Arc::new(s);
                let mut w = self.watched.lock();
                w.fds.push(s.fd());
                if let Some((epoll, token)) = w.epoll {
                    epoll_ctl(epoll, libc::EPOLL_CTL_ADD, s.fd(), token);
                }
                drop(w);
                engine.peers.push(s.clone());
                Some(s)
            }
            Err(e) => {
                tracing::info!(%to, "no connected socket for this peer ({e}): using the port's own");
                None
            }
        }
    }

    /// Routes packets for `link`'s VI id to `target`, through `link`.  A
    /// word its last connection ended with is still said to that
    /// connection's peer: the keys tell the two connections' packets apart.
    fn register(&self, link: &Arc<NetLink>, target: Weak<dyn NetReceiver>) {
        let vi = link.local_vi;
        let last_word = self.ended.lock().holds(vi, crate::clock::now());
        self.vis.write().insert(vi, Route { vi: target, link: Arc::downgrade(link), last_word });
    }

    /// Stops routing packets to VI id `vi`, whose connection ended; with
    /// `last`, the word it ended with and the peer it went to, said again
    /// to the peer's packets for a while.
    pub fn unregister(&self, vi: u32, last: Option<(LastWord, SocketAddr)>) {
        if let Some((word, peer)) = last {
            self.ended.lock().keep(vi, word, peer, crate::clock::now());
        }
        self.vis.write().remove(&vi);
    }

    /// Packets came for VI id `vi`, which has no connection or a new one:
    /// if they are the retransmissions of a peer whose connection with it
    /// ended, the peer hears its last word again (once for the batch).
    fn answer_ended(&self, vi: u32, packets: &[(Header, &[u8])]) {
        let answer = self.ended.lock().answer(vi, packets, crate::clock::now());
        if let Some((header, peer)) = answer {
            tracing::info!(vi, %peer, kind = ?header.kind, "the peer retransmits to an ended connection: its last word said again");
            let mut out = OutPackets::default();
            out.push(&via_reliable::Transmit { header, payload: None }, None);
            self.send_all(peer, None, &out);
            self.counters.add(Counter::LastWordsRepeated, 1);
        }
    }

    /// The application polls: drains the sockets, and tells the helper
    /// thread to leave them alone for a while.  Whether the poll may have
    /// completed something (`poll_port`; true while another thread drains).
    pub fn poll_for_app(&self) -> bool {
        self.handover.polled();
        self.poll_port(false).unwrap_or(true)
    }

    /// A session timer of this port falls due at `deadline`: the
    /// application's polls run it if they still go on by then, else the
    /// helper thread does.
    pub(crate) fn timer_before(&self, deadline: Time) {
        let at = deadline.as_nanos();
        // A read first: most timers are later than the earliest, and a
        // write would pull the port's line from its other VIs' threads.
        if at < self.timers_due_ns.load(Ordering::Relaxed) {
            self.timers_due_ns.fetch_min(at, Ordering::Relaxed);
        }
        if !self.handover.app_is_polling() && !self.is_simulated() {
            progress::kick_before(crate::clock::instant_of(deadline));
        }
    }

    /// Runs the sessions' timers that are due, on the application's
    /// thread: while it polls, the helper thread sleeps through them
    /// rather than wake on its CPU.
    fn run_due_timers(&self) {
        let now = crate::clock::now_time();
        if now.as_nanos() < self.timers_due_ns.load(Ordering::Relaxed) {
            return;
        }
        let next = self.run_timers(now).map_or(u64::MAX, Time::as_nanos);
        // The next look, at the latest QUIET_MAX from now: a timer armed
        // without `timer_before` is not missed for longer.
        let soon = now.as_nanos() + QUIET_MAX.as_nanos() as u64;
        self.timers_due_ns.store(next.min(soon), Ordering::Relaxed);
    }

    /// An application thread is about to sleep until this port's packets
    /// wake it: the helper thread must read the sockets from now on.
    pub(crate) fn sleep(self: &Arc<Self>) -> PortSleep {
        self.handover.sleepers.fetch_add(1, Ordering::SeqCst);
        if !self.handover.armed.swap(true, Ordering::SeqCst) {
            self.arm();
        }
        PortSleep(self.clone())
    }

    /// Drains the sockets, handing each packet to its VI: the endpoint
    /// reads the Ethernet side's ring, then the sockets its schedule names
    /// for this poll, or with `everything` all of them.  Returns false when
    /// another thread is draining them already.
    pub fn poll(&self, everything: bool) -> bool {
        self.poll_port(everything).is_some()
    }

    /// [`NetPort::poll`]: `None` when another thread is draining the
    /// sockets, else whether the poll may have completed a work queue's
    /// descriptor: a packet came, an owed acknowledgement went (its flush
    /// may end unreliable sends), or the sessions' timers were looked at.
    fn poll_port(&self, everything: bool) -> Option<bool> {
        let mut engine = self.engine.try_lock()?;
        let engine = &mut *engine;
        #[cfg(test)]
        if let Some(wire) = &self.sim {
            // The simulator runs the timers, in an order of its own.
            engine.endpoint.poll(&mut *wire.arrived.lock(), &mut PortRoutes(self), everything);
            self.count(engine.endpoint.take_tally());
            return Some(true);
        }
        // A socket only the port still holds has no link left: it leaves
        // the epoll set before it is closed (its number may be reused).
        if engine.peers.iter().any(|s| Arc::strong_count(s) == 1) {
            let mut w = self.watched.lock();
            for s in engine.peers.iter().filter(|s| Arc::strong_count(s) == 1) {
                w.fds.retain(|&fd| fd != s.fd());
                if let Some((epoll, _)) = w.epoll {
                    epoll_ctl(epoll, libc::EPOLL_CTL_DEL, s.fd(), 0);
                }
            }
            drop(w);
            engine.peers.retain(|s| Arc::strong_count(s) > 1);
        }
        let ring = self.ether.as_ref().map(|ether| PacketRing { port: self, ether, slot: &mut engine.frame_slot });
        let sockets = UdpSockets { port: self, input: &mut engine.input, peers: &engine.peers };
        let mut datapath = Beside { frames: ring, datagrams: sockets };
        let owed = !engine.endpoint.owed().is_empty();
        let busy = engine.endpoint.poll(&mut datapath, &mut PortRoutes(self), everything);
        self.count(engine.endpoint.take_tally());
        let mut timers = false;
        if !busy && !everything {
            engine.idle_polls = engine.idle_polls.wrapping_add(1);
            if engine.idle_polls.is_multiple_of(TIMER_CHECK_POLLS) {
                self.run_due_timers();
                timers = true;
            }
        }
        Some(busy || owed || timers)
    }

    /// Adds what the endpoint counted to the NIC's counters.
    fn count(&self, tally: Tally) {
        if tally == Tally::default() {
            return;
        }
        self.counters.add(Counter::PacketsReceived, tally.packets);
        self.counters.add(Counter::FramesReceived, tally.frames);
        self.counters.add(Counter::Malformed, tally.malformed);
        self.counters.add(Counter::UnknownVi, tally.unknown_vi);
        if tally.malformed > 0 {
            tracing::debug!(count = tally.malformed, last = ?tally.last_malformed, "malformed packets refused");
        }
    }

    /// Reads one socket: a datagram, and if more seem to follow (a long
    /// message, coalesced datagrams), batches until it is empty.  While
    /// large packets come, each is read on its own, its payload straight
    /// into the posted receive buffer where it belongs (`land`).  Returns
    /// whether anything came.
    fn drain(&self, input: &mut Input, fd: RawFd, arrivals: &mut Arrivals<'_>) -> bool {
        let mut any = false;
        loop {
            // The VI through its own reference: no lookup in the port's
            // table, shared by all its VIs, on each poll.
            let target = input.landing.as_ref().filter(|l| l.fd == fd).map(|l| (l.id, l.vi.upgrade()));
            if let Some((id, vi)) = target {
                match vi.and_then(|vi| self.land(input, fd, id, &*vi, arrivals)) {
                    Some(Landed::Packet) => {
                        any = true;
                        continue;
                    }
                    // The application's answer may be waiting on this
                    // message: no look at the socket before it sees it.
                    Some(Landed::MessageEnd) => return true,
                    Some(Landed::Nothing) => return any,
                    None => input.landing = None,
                }
            }
            if !input.batch.receive_one(fd) {
                return any;
            }
            self.received(input, fd, 1, arrivals);
            // Nothing more is likely; or it ended a message, whose
            // application may be waiting on it to answer: no look at the
            // socket before it sees it.
            if !input.batch.more_likely(0, HEADER_LEN + self.segment) || input.batch.ends_message(0) {
                return true;
            }
            if input.landing.as_ref().is_some_and(|l| l.fd == fd) {
                any = true;
                continue;
            }
            while let Some(n) = input.batch.receive(fd) {
                self.received(input, fd, n, arrivals);
                if n < input.batch.lens.len() {
                    break;
                }
            }
            return true;
        }
    }

    /// Receives one datagram from `fd` with its payload placed where the
    /// message of `vi` (whose id is `id`) continues
    /// (`Vi::receive_in_place`), and hands it on: in place if it is a
    /// whole packet for `vi` and intact, else put together behind its
    /// header as any other datagram.  `None` when `vi` has no message
    /// under way.
    fn land(
        &self,
        input: &mut Input,
        fd: RawFd,
        id: u32,
        vi: &dyn NetReceiver,
        arrivals: &mut Arrivals<'_>,
    ) -> Option<Landed> {
        let batch = &mut input.batch;
        let max = self.large_payload.min(batch.bufs[0].len() - HEADER_LEN);
        let mut landed = None;
        vi.receive_in_place(max, &mut |place, room| {
            landed = Some((batch.receive_beside(fd, place, room), place, room))
        });
        let (got, place, room) = landed?;
        if !got {
            return Some(Landed::Nothing);
        }
        let len = batch.lens[0];
        let payload_len = len.saturating_sub(HEADER_LEN);
        // Only a packet for `vi` stays where it landed: another VI's
        // application could take the buffer back while that VI copies from it.
        let whole = len > HEADER_LEN && first_packet_len(&batch.bufs[0][..HEADER_LEN.min(len)]) == len;
        let for_vi = len >= HEADER_LEN && Packet::new_unchecked(&batch.bufs[0][..HEADER_LEN]).dst_vi() == id;
        if whole && for_vi && payload_len <= room {
            self.count_coalesced(batch, 1);
            // SAFETY: the kernel wrote `payload_len` bytes at `place`, which
            // stays a posted receive's buffer until the VI places this
            // packet or its connection goes (then nothing is placed).
            let payload = unsafe { std::slice::from_raw_parts(place, payload_len) };
            match Header::parse_split(&batch.bufs[0][..HEADER_LEN], payload) {
                Ok(header) => {
                    self.counters.add(Counter::PacketsInPlace, 1);
                    let last = header.has(FLAG_LAST);
                    arrivals.packet(header, payload);
                    if last {
                        return Some(Landed::MessageEnd);
                    }
                }
                Err(e) => arrivals.malformed(Some(e)),
            }
        } else {
            // Another datagram: its bytes after the header go back behind it.
            let moved = payload_len.min(room);
            // SAFETY: the kernel wrote `moved` bytes at `place`, and the
            // batch's first buffer has room for them after the header.
            unsafe { std::ptr::copy_nonoverlapping(place, batch.bufs[0][HEADER_LEN..].as_mut_ptr(), moved) };
            self.received(input, fd, 1, arrivals);
        }
        Some(Landed::Packet)
    }

    /// Hands the frames waiting in the Ethernet side's ring to their VIs.
    fn take_frames(&self, ether: &EtherSocket, slot: &mut usize, arrivals: &mut Arrivals<'_>) -> bool {
        let port = self.local4.port();
        ether.take(slot, |bytes| match Frame::new_checked(bytes) {
            Ok(frame) if frame.port() == port => arrivals.frame(frame.packet()),
            // A frame for another port of this host.
            Ok(_) => arrivals.malformed(None),
            Err(e) => arrivals.malformed(Some(e)),
        })
    }

    /// Hands the first `n` buffers of the batch, read from `fd`, to their
    /// VIs, and notes a large packet's VI for the next receive (`land`).
    fn received(&self, input: &mut Input, fd: RawFd, n: usize, arrivals: &mut Arrivals<'_>) {
        self.count_coalesced(&input.batch, n);
        if let Some(id) = arrivals.datagrams(input.batch.datagrams(n)) {
            if !input.landing.as_ref().is_some_and(|l| l.fd == fd && l.id == id) {
                input.landing = self.vis.read().get(&id).map(|r| Landing { fd, id, vi: r.vi.clone() });
            }
        }
    }

    /// Counts the coalesced buffers among the first `n` of `batch`.
    fn count_coalesced(&self, batch: &Batch, n: usize) {
        let coalesced = batch.segments[..n].iter().zip(&batch.lens).filter(|(&s, &len)| s > 0 && len > s).count();
        if coalesced > 0 {
            self.gro_buffers.fetch_add(coalesced as u64, Ordering::Relaxed);
        }
    }

    /// Runs the timers of every VI on this port; returns the next deadline.
    pub fn run_timers(&self, now: Time) -> Option<Time> {
        let vis: Vec<_> = self.vis.read().values().filter_map(Route::upgrade).collect();
        vis.iter().filter_map(|(vi, link)| vi.net_timers(link, now)).min()
    }

    /// The address a peer at `remote_host` (4 or 16 bytes) sends to.
    pub fn local_for(&self, remote_host: &[u8]) -> ViaResult<SocketAddr> {
        match remote_host.len() {
            16 => self.local6.ok_or(ViaError::NotReachable),
            _ => Ok(self.local4),
        }
    }

    /// Whether this port sends and takes large packets: packets longer
    /// than a datagram, one GSO buffer each, whose datagrams after the first
    /// carry no header and which the receiver's `UDP_GRO` puts together
    /// again.  It needs both offloads, and no `VIA_SEGMENT_SIZE` (which
    /// asks for packets of that size).
    pub fn takes_large_packets(&self) -> bool {
        self.gro && self.gso.load(Ordering::Relaxed) && !self.fixed_segment
    }

    /// The Ethernet address where this port takes frames, if it does.
    pub fn local_ether(&self) -> Option<[u8; MAC_LEN]> {
        #[cfg(test)]
        if let Some(wire) = self.sim.as_ref().filter(|w| w.frames) {
            return Some(sim_wire::mac_of(wire.host));
        }
        self.ether.as_ref().map(|e| e.mac)
    }

    /// Whether this port's Ethernet side reaches `peer` at `mac` directly.
    fn reaches_by_frame(&self, peer: SocketAddr, mac: [u8; MAC_LEN]) -> bool {
        #[cfg(test)]
        if let Some(wire) = &self.sim {
            return wire.frames && sim_wire::host_of_mac(mac).is_some();
        }
        self.ether.as_ref().is_some_and(|ether| ether.on_link(peer.ip(), mac))
    }

    /// The longest packet a frame of this port carries, if it sends frames.
    fn max_frame(&self) -> Option<usize> {
        #[cfg(test)]
        if let Some(wire) = &self.sim {
            return wire.frames.then_some(self.mtu);
        }
        self.ether.as_ref().map(|ether| ether.max_packet)
    }

    /// Sends `packet` as a frame to port `port` at `mac`; false if it
    /// could not go.
    fn send_frame(&self, mac: [u8; MAC_LEN], port: u16, packet: &[u8]) -> bool {
        #[cfg(test)]
        if let Some(wire) = &self.sim {
            return wire.send_frame(mac, packet);
        }
        self.ether.as_ref().is_some_and(|ether| ether.send(mac, port, packet))
    }

    /// Segmentation offload on this port: whether sends use GSO, whether
    /// the socket takes coalesced datagrams, GSO buffers sent and coalesced
    /// datagrams received so far.
    pub fn offload(&self) -> Offload {
        Offload {
            gso: self.gso.load(Ordering::Relaxed),
            gro: self.gro,
            gso_buffers: self.gso_buffers.load(Ordering::Relaxed),
            gro_buffers: self.gro_buffers.load(Ordering::Relaxed),
            in_place: self.counters.get(Counter::PacketsInPlace),
        }
    }

    /// Where packets to `to` go on the wire, and the bytes of the IP and
    /// UDP headers in front of them: a dual-stack socket reaches IPv4 peers
    /// at their mapped address.
    fn destination(&self, to: SocketAddr) -> (SocketAddr, usize) {
        match to {
            SocketAddr::V4(v4) if self.dual_stack => {
                (SocketAddr::new(IpAddr::V6(v4.ip().to_ipv6_mapped()), v4.port()), IP4_UDP_HEADERS)
            }
            SocketAddr::V4(_) => (to, IP4_UDP_HEADERS),
            SocketAddr::V6(_) => (to, IP6_UDP_HEADERS),
        }
    }

    /// Sends `packets` (buffers and lengths) to `to`, on `connected` (the
    /// port's socket connected to `to`) if there is one, with as few system
    /// calls as possible: one `sendmmsg`, whose messages each carry a run of
    /// equal-size packets as one GSO buffer where the port may use GSO.
    fn send_all(&self, to: SocketAddr, connected: Option<&PeerSocket>, packets: &OutPackets) {
        #[cfg(test)]
        if let Some(wire) = &self.sim {
            wire.send(to, packets.from(0));
            self.counters.add(Counter::PacketsSent, packets.len() as u64);
            return;
        }
        let (to, headers) = self.destination(to);
        // The address only for the unconnected socket: a sockaddr_storage
        // is 128 bytes to fill.
        let addr = connected.is_none().then(|| socket_addr(to));
        let fd = connected.map_or(self.socket.as_raw_fd(), |s| s.fd());
        let addr = addr.as_ref();
        // A GSO segment must fit the MTU whole (the kernel refuses it otherwise).
        let max_segment = if self.gso.load(Ordering::Relaxed) { self.mtu.saturating_sub(headers) } else { 0 };
        let (mut sent, refused) = self.send_groups(fd, addr, packets.from(0), max_segment);
        if let Some(at) = refused {
            // This socket cannot send GSO buffers (a device without checksum
            // offload, an old kernel): from now on, one datagram per message.
            if self.gso.swap(false, Ordering::Relaxed) {
                tracing::info!("UDP segmentation offload refused on this port; sending datagrams one by one");
            }
            sent = at + self.send_groups(fd, addr, packets.from(at), 0).0;
        }
        self.counters.add(Counter::PacketsSent, sent as u64);
    }

    /// Sends `packets` with [`send_groups`], counting the GSO buffers.
    fn send_groups(
        &self,
        fd: RawFd,
        addr: Option<&(libc::sockaddr_storage, libc::socklen_t)>,
        packets: Packets<'_>,
        max_segment: usize,
    ) -> (usize, Option<usize>) {
        let out = send_groups(fd, addr, packets, max_segment);
        if out.gso_buffers > 0 {
            self.gso_buffers.fetch_add(out.gso_buffers as u64, Ordering::Relaxed);
        }
        (out.packets, out.refused)
    }
}

/// What draining a port's sockets needs, held by whoever drains them.
struct Engine {
    /// Routing, owed acknowledgements and the read schedule.
    endpoint: Endpoint,
    /// The receive buffers and where the next packet probably lands.
    input: Input,
    /// The next slot of the Ethernet side's ring.
    frame_slot: usize,
    /// The port's sockets connected to one peer each.
    peers: Vec<Arc<PeerSocket>>,
    /// The application's polls that found nothing, for `TIMER_CHECK_POLLS`.
    idle_polls: u32,
}

/// The receive side of the port's sockets.
struct Input {
    batch: Batch,
    /// Where the next datagram probably continues a VI's message.
    landing: Option<Landing>,
}

/// The port's UDP sockets as a datapath, for one poll: the sockets
/// connected to a peer each, and the unconnected one.
struct UdpSockets<'a> {
    port: &'a NetPort,
    input: &'a mut Input,
    peers: &'a [Arc<PeerSocket>],
}

impl Datapath for UdpSockets<'_> {
    fn has_peer_paths(&self) -> bool {
        !self.peers.is_empty()
    }
    fn read_peers(&mut self, arrivals: &mut Arrivals<'_>) -> bool {
        let mut any = false;
        for peer in self.peers {
            any |= self.port.drain(self.input, peer.fd(), arrivals);
        }
        any
    }
    fn read_shared(&mut self, arrivals: &mut Arrivals<'_>) -> bool {
        self.port.drain(self.input, self.port.socket.as_raw_fd(), arrivals)
    }
}

/// The port's Ethernet side as a datapath, for one poll: the frames in
/// its receive ring, from the slot `slot` on.
struct PacketRing<'a> {
    port: &'a NetPort,
    ether: &'a EtherSocket,
    slot: &'a mut usize,
}

impl Datapath for PacketRing<'_> {
    fn takes_frames(&self) -> bool {
        true
    }
    fn read_frames(&mut self, arrivals: &mut Arrivals<'_>) -> bool {
        self.port.take_frames(self.ether, self.slot, arrivals)
    }
}

/// The port's VIs, as its endpoint routes packets to them.
struct PortRoutes<'a>(&'a NetPort);

/// Where a VI id's packets go: to its VI, through its link.
struct Route {
    vi: Weak<dyn NetReceiver>,
    link: Weak<NetLink>,
    /// The id's last connection ended with a word still kept, which its
    /// peer's packets may be owed (`LastWords`).
    last_word: bool,
}

impl Route {
    /// The VI and its link, while both are.
    fn upgrade(&self) -> Option<(Arc<dyn NetReceiver>, Arc<NetLink>)> {
        Some((self.vi.upgrade()?, self.link.upgrade()?))
    }
}

impl Routes for PortRoutes<'_> {
    fn deliver(&mut self, id: u32, packets: &[(Header, &[u8])], frame: bool, app_away: bool) -> Option<bool> {
        let (target, last_word) = self.0.vis.read().get(&id).map_or((None, true), |r| (r.upgrade(), r.last_word));
        if target.is_none() {
            tracing::debug!(vi = id, "packets for an unknown VI");
        }
        // The new connection's session drops the old one's packets (their
        // key); their peer is owed the old word.
        if last_word {
            self.0.answer_ended(id, packets);
        }
        let (vi, link) = target?;
        Some(vi.net_input(&link, packets, frame, app_away))
    }
    fn send_owed_ack(&mut self, id: u32, app_away: bool) {
        let target = self.0.vis.read().get(&id).and_then(Route::upgrade);
        if let Some((vi, link)) = target {
            vi.send_owed_ack(&link, app_away);
        }
    }
}

/// What [`NetPort::land`] took from the socket.
enum Landed {
    /// Nothing: the socket is empty.
    Nothing,
    /// A packet, which did not end a message in place.
    Packet,
    /// The packet that ends the message it was placed for.
    MessageEnd,
}

/// The socket a large packet came from last, and the VI (`id`) it was for.
struct Landing {
    fd: RawFd,
    id: u32,
    vi: Weak<dyn NetReceiver>,
}

/// The port's sockets, and the epoll set and token they are in, if any.
struct Watched {
    fds: Vec<RawFd>,
    epoll: Option<(RawFd, u64)>,
}

/// Adds `fd` to, re-arms it in, or removes it from the epoll set `epoll`:
/// readable, reported once.
fn epoll_ctl(epoll: RawFd, op: libc::c_int, fd: RawFd, token: u64) {
    let events = (libc::EPOLLIN | libc::EPOLLONESHOT) as u32;
    let mut ev = libc::epoll_event { events, u64: token };
    // SAFETY: both descriptors are open: the helper's epoll lives for the
    // process, the port's sockets leave the set before they are closed.
    unsafe { libc::epoll_ctl(epoll, op, fd, &mut ev) };
}

/// What [`NetPort::offload`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offload {
    /// Sends use GSO (`VIA_GSO` allows it and the kernel has not refused it).
    pub gso: bool,
    /// The socket takes coalesced datagrams (`UDP_GRO`).
    pub gro: bool,
    /// GSO buffers sent (each of more than one packet).
    pub gso_buffers: u64,
    /// Coalesced datagrams received (each of more than one packet).
    pub gro_buffers: u64,
    /// Packets received with their payload straight in a posted receive
    /// buffer (`NetPort::land`); counted only where the NIC has counters.
    pub in_place: u64,
}

/// Hashes the VI ids of a port's table, which every packet looks up: a
/// multiply where SipHash would cost more than the rest of the lookup.
/// The ids are the VIs' handles, chosen by this process, so no peer can
/// make them collide (a peer's made-up id only misses).
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u32(b as u32);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = (self.0 ^ n as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// A socket address in the form `bind` and `sendmmsg` take.
pub(crate) fn socket_addr(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
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
    use rustix::net::sockopt;
    let bytes = 16 << 20;
    // The forced variants need CAP_NET_ADMIN; otherwise take what the limit allows.
    if sockopt::set_socket_recv_buffer_size_force(socket, bytes).is_err() {
        let _ = sockopt::set_socket_recv_buffer_size(socket, bytes);
    }
    if sockopt::set_socket_send_buffer_size_force(socket, bytes).is_err() {
        let _ = sockopt::set_socket_send_buffer_size(socket, bytes);
    }
}

/// Whether the kernel knows UDP segmentation offload (Linux 4.18 and
/// later answer for `UDP_SEGMENT`; older ones would ignore the control
/// message and send one long datagram).
pub(crate) fn kernel_has_gso(socket: &UdpSocket) -> bool {
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt of an int option into a local.
    unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_UDP,
            libc::UDP_SEGMENT,
            &mut value as *mut libc::c_int as *mut libc::c_void,
            &mut len,
        ) == 0
    }
}

/// Payload bytes of a large packet at `mtu`: its header and payload fill
/// whole datagrams of the MTU (IPv4), as many as one GSO buffer holds.
fn large_payload(mtu: usize) -> usize {
    let datagram = mtu.saturating_sub(IP4_UDP_HEADERS).max(HEADER_LEN + 1);
    let count = (GSO_MAX_BYTES / datagram).clamp(1, GSO_MAX_SEGMENTS);
    (count * datagram).min(MAX_DATAGRAM) - HEADER_LEN
}

/// Payload bytes per packet: the size set (`VIA_SEGMENT_SIZE`), or what
/// fits the MTU.
fn segment_size(mtu: usize, set: Option<usize>) -> usize {
    let from_mtu = mtu.saturating_sub(28 + HEADER_LEN).max(512);
    set.unwrap_or(from_mtu).clamp(256, MAX_DATAGRAM - HEADER_LEN)
}

/// The buffers a sent message's bytes come from, until the session says it is sent.
/// Inline for the usual one or two buffers: posting a send allocates nothing.
pub(crate) type Gather = smallvec::SmallVec<[(u64, u32); 2]>;

/// The network side of one connected VI.
pub struct NetLink {
    /// The NIC's port.
    pub port: Arc<NetPort>,
    /// The peer's data socket.
    pub peer: SocketAddr,
    /// The port's socket connected to the peer, if it has one.
    connected: Option<Arc<PeerSocket>>,
    /// The peer's Ethernet address and port, if packets may go to it as
    /// frames: it takes them, it is on this port's link, and the session
    /// is reliable and checksums its payloads (a frame has no UDP checksum).
    frames_to: Option<([u8; MAC_LEN], u16)>,
    /// This VI's id on the wire.
    pub local_vi: u32,
    /// Both ends place an RDMA write before they acknowledge it, and
    /// refuse one with a BREAK (`CmEndpoint::placed_acks`): a write
    /// completes when its last packet is acknowledged, with no answer.
    pub placed_acks: bool,
    pub(crate) state: Mutex<NetState>,
}

pub(crate) struct NetState {
    pub session: Session,
    pub outbound: Outbound,
    /// The NIC whose registry the messages' buffers are checked against
    /// before their bytes are read (`Outbound::check`); set when the VI
    /// connects (`Transport::complete`), before it posts anything.
    pub(crate) registry_of: Option<Arc<dyn RegistryOwner>>,
    /// Packets built for one `sendmmsg`.
    out: OutPackets,
    /// The session's counters when last added to the NIC's.
    seen: via_reliable::LossCounts,
    /// Whether its packets may go as frames, and its frames so far.
    frames: FrameChoice,
}

impl NetLink {
    /// A link to `peer` with a fresh session; `peer_ether` is where the
    /// peer takes frames, if it does.
    pub fn new(
        port: Arc<NetPort>,
        peer: SocketAddr,
        peer_ether: Option<[u8; MAC_LEN]>,
        config: Config,
        local: via_reliable::Peer,
        remote: via_reliable::Peer,
        placed_acks: bool,
    ) -> NetLink {
        let frames_to = match peer_ether {
            Some(mac) if config.reliable && config.payload_crc && port.reaches_by_frame(peer, mac) => {
                Some((mac, peer.port()))
            }
            _ => None,
        };
        NetLink {
            connected: port.connect_peer(peer),
            frames_to,
            port,
            peer,
            local_vi: local.vi,
            placed_acks,
            state: Mutex::new(NetState {
                session: Session::new(config, local, remote, crate::clock::now_time()),
                outbound: Outbound::default(),
                registry_of: None,
                out: OutPackets::default(),
                seen: Default::default(),
                frames: FrameChoice::default(),
            }),
        }
    }
}

impl NetState {
    /// A token for a message whose bytes come from `gather`.
    pub fn remember(&mut self, gather: Gather) -> u64 {
        self.outbound.insert(gather)
    }

    /// A token for a message whose bytes come from `gather`, in the
    /// application's registered memory as `registered` says: they are
    /// read only while it stays registered (`Outbound::check`).
    pub fn remember_registered(&mut self, gather: Gather, registered: Registered) -> u64 {
        self.outbound.insert_registered(gather, Some(registered))
    }

    /// Keeps the bytes of a message that must not be read again from
    /// where they came from (an RDMA read's answer: the region may be
    /// deregistered before the last retransmission); returns its token.
    pub fn remember_snapshot(&mut self, bytes: Box<[u8]>) -> u64 {
        self.outbound.insert_snapshot(bytes)
    }

    /// Sends everything the session has to send on `link` (whose state
    /// this is), and collects its events.
    pub fn flush(&mut self, link: &NetLink, events: &mut NetEvents<'_>) {
        self.flush_at(link, crate::clock::now_time(), events);
    }

    /// [`NetState::flush`] at `now`, for a caller that has just read the clock.
    pub fn flush_at(&mut self, link: &NetLink, now: Time, events: &mut NetEvents<'_>) {
        self.flush_with(link, now, events, false);
    }

    /// [`NetState::flush_at`] for a receiver with more input to take: an
    /// acknowledgement that may wait is held (`Session::poll_transmit_busy`)
    /// until the port is idle or a reply carries it.
    pub fn flush_busy(&mut self, link: &NetLink, now: Time, events: &mut NetEvents<'_>) {
        self.flush_with(link, now, events, true);
    }

    fn flush_with(&mut self, link: &NetLink, now: Time, events: &mut NetEvents<'_>, busy: bool) {
        // A receiver's flush, with nothing to send, to report or to count
        // (what the rest would find, in a few loads): the usual one.  A
        // sender's flush has its message to send and skips the check.
        if busy && self.session.quiet(now, false) && self.session.loss_counts() == self.seen {
            return;
        }
        let port = &*link.port;
        let send = |packets: &OutPackets| port.send_all(link.peer, link.connected.as_deref(), packets);
        // Packets of a datagram each; a large packet (longer) is a GSO
        // buffer of its own.
        let size = HEADER_LEN + port.segment.min(MAX_DATAGRAM - HEADER_LEN);
        // With GSO each GSO buffer goes as soon as it is full, so the peer
        // starts on it while the next is built; without, a batch of datagrams.
        // Large packets: the first at once, then `LARGE_PER_SEND` to a call.
        let batch = if port.gso.load(Ordering::Relaxed) {
            (GSO_MAX_BYTES / size).clamp(1, GSO_MAX_SEGMENTS)
        } else {
            SEND_BATCH
        };
        let next = |s: &mut Session| if busy { s.poll_transmit_busy(now) } else { s.poll_transmit(now) };
        self.out.clear();
        let mut batches = 0;
        let mut last = None;
        let was_off = self.frames.off();
        // The registry's deregistration count, read once per flush, where
        // a packet of the application's buffers is built.
        let mut deregistrations = None;
        while let Some(t) = next(&mut self.session) {
            if let (Some(p), Some(owner)) = (t.payload, &self.registry_of) {
                // Before a byte is read: the application may have
                // deregistered (and unmapped) a buffer since it posted the
                // send.  Then nothing more of the message is read or sent:
                // its send fails, and a reliable session breaks.
                match self.outbound.check(p.token, owner.registry(), &mut deregistrations) {
                    Check::Readable => {}
                    Check::Refused => {
                        events.push(NetEvent::Unreadable { token: p.token });
                        if self.session.config().reliable {
                            self.session.close(via_core::consts::error_code::CONN_LOST);
                        }
                        continue;
                    }
                    Check::Refusing => continue,
                }
            }
            last = t.header.kind.is_sequenced().then_some(t.header.seq);
            self.frames.leaving(last);
            let gather = t.payload.and_then(|p| self.outbound.get(p.token));
            let large = t.payload.is_some_and(|p| p.len as usize > port.segment);
            self.out.push(&t, gather);
            if self.out.len() == batch || (large && (batches == 0 || self.out.len() >= LARGE_PER_SEND)) {
                send(&self.out);
                self.out.clear();
                batches += 1;
            }
        }
        let stats = self.session.loss_counts();
        if !self.out.is_empty() {
            let lone = batches == 0 && self.out.len() == 1;
            let fresh = stats.retransmits == self.seen.retransmits;
            if !self.send_frame(link, lone, fresh, last) {
                send(&self.out);
            }
        }
        if self.frames.off() && !was_off {
            tracing::info!(vi = link.local_vi, peer = %link.peer, "frames lost in a row: packets to this peer go over UDP only");
        }
        port.counters.add(Counter::Retransmits, stats.retransmits - self.seen.retransmits);
        port.counters.add(Counter::Duplicates, stats.duplicates - self.seen.duplicates);
        port.counters.add(Counter::BadKey, stats.bad_key - self.seen.bad_key);
        self.seen = stats;
        self.take_events(events);
    }

    /// Sends the one packet in `out` (sequence number `seq`) as a frame, if
    /// it may go as one (`FrameChoice::may_send`): the link sends frames,
    /// and the packet is the only one in flight, so a frame never overtakes
    /// an earlier packet sent over UDP.  Returns whether it went.
    fn send_frame(&mut self, link: &NetLink, lone: bool, fresh: bool, seq: Option<u32>) -> bool {
        let Some((mac, port)) = link.frames_to else { return false };
        let Some(max) = link.port.max_frame() else { return false };
        let Some(packet) = self.out.from(0).whole(0) else { return false };
        let open = !self.session.is_closed();
        if !self.frames.may_send(lone, fresh, open, self.session.in_flight(), packet.len(), max) {
            return false;
        }
        if !link.port.send_frame(mac, port, packet) {
            return false;
        }
        self.frames.sent_frame(seq);
        link.port.counters.add(Counter::PacketsSent, 1);
        link.port.counters.add(Counter::FramesSent, 1);
        true
    }

    /// A packet came from the peer as a frame.
    pub(crate) fn heard_frame(&mut self) {
        self.frames.heard_frame();
    }

    /// Moves the session's queued events to `events`, forgetting the
    /// buffers of messages that are sent.
    pub fn take_events(&mut self, events: &mut NetEvents<'_>) {
        while let Some(e) = self.session.poll_event() {
            events.push(match e {
                Event::Segment { kind, msg, offset, total, imm, first, last, seq, data } => {
                    NetEvent::Segment(Segment { kind, msg, offset, total, imm, first, last, seq }, Cow::Owned(data))
                }
                Event::Sent { token } => {
                    self.outbound.remove(token);
                    NetEvent::Sent { token }
                }
                Event::Broken(reason) => NetEvent::Broken(reason),
            });
        }
    }
}

/// The buffers of the messages a session is sending, by token.  Tokens
/// are handed out in order and mostly retired in order: a deque indexed
/// from the oldest one still held.
pub(crate) struct Outbound {
    /// The token of `slots[0]`; tokens start at 1 (0 means none).
    first: u64,
    slots: VecDeque<Option<Held>>,
}

/// A message's buffers, and the bytes they point into where the message
/// owns them.
struct Held {
    gather: Gather,
    /// Where `gather` lies in the application's registered memory, to be
    /// asked again before its bytes are read; `None` for bytes the message
    /// owns (or none).
    registered: Option<Registered>,
    /// Found unregistered ([`Outbound::check`]): never read again.
    refused: bool,
    /// Never read here: `gather` points into it, and it lives as long.
    _snapshot: Option<Box<[u8]>>,
}

/// Where the buffers of a message lie in the registry: the application may
/// deregister (and unmap) them while the message is under way, and a
/// packet, or a retransmission, must not read them then.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Registered {
    /// `Registry::deregistrations` when the buffers were last known to be
    /// registered (read before they were checked): while the count stays
    /// there, they still are, in one load.
    pub epoch: u32,
    /// The protection tag the buffers must carry (the VI's).
    pub ptag: u32,
    /// The memory handle of each buffer of the gather, in order.
    pub handles: smallvec::SmallVec<[u32; 2]>,
}

/// What [`Outbound::check`] found of a message's buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Check {
    /// They may be read (or the message has none, or is gone).
    Readable,
    /// A buffer is no longer registered (with the tag): found now, and to
    /// be reported; nothing of the message is read from now on.
    Refused,
    /// Found so before, and reported.
    Refusing,
}

impl Default for Outbound {
    fn default() -> Outbound {
        Outbound { first: 1, slots: VecDeque::new() }
    }
}

impl Outbound {
    /// Keeps `gather`; returns its token.
    pub fn insert(&mut self, gather: Gather) -> u64 {
        self.insert_registered(gather, None)
    }

    /// Keeps `gather`, which lies in registered memory as `registered`
    /// says (checked before its bytes are read: [`Outbound::check`]);
    /// returns its token.
    pub fn insert_registered(&mut self, gather: Gather, registered: Option<Registered>) -> u64 {
        debug_assert!(registered.as_ref().is_none_or(|r| r.handles.len() == gather.len()));
        self.slots.push_back(Some(Held { gather, registered, refused: false, _snapshot: None }));
        self.first + self.slots.len() as u64 - 1
    }

    /// Whether the bytes of message `token` may be read now: its buffers
    /// are still registered with their tag.  `deregistrations` is the
    /// registry's count, read at the first call of a flush that needs it
    /// and kept for the rest: while it equals the message's, the answer is
    /// yes without a look at the registry (one load per flush).  Otherwise
    /// each buffer is looked up again; if all are still there the message
    /// takes the count, else it is refused for good.
    pub fn check(
        &mut self,
        token: u64,
        registry: &via_core::registry::Registry,
        deregistrations: &mut Option<u32>,
    ) -> Check {
        let Some(i) = token.checked_sub(self.first).and_then(|i| usize::try_from(i).ok()) else {
            return Check::Readable;
        };
        let Some(Some(held)) = self.slots.get_mut(i) else { return Check::Readable };
        if held.refused {
            return Check::Refusing;
        }
        let Some(reg) = held.registered.as_mut() else { return Check::Readable };
        let now = *deregistrations.get_or_insert_with(|| registry.deregistrations());
        if now == reg.epoch {
            return Check::Readable;
        }
        let live = held
            .gather
            .iter()
            .zip(&reg.handles)
            .all(|(&(addr, len), &handle)| registry.check_local(handle, addr, len as u64, reg.ptag));
        if live {
            reg.epoch = now;
            Check::Readable
        } else {
            held.refused = true;
            Check::Refused
        }
    }

    /// Keeps `bytes` as a message of its own; returns its token.
    pub fn insert_snapshot(&mut self, bytes: Box<[u8]>) -> u64 {
        // The heap block does not move with the box.
        let gather = match bytes.len() {
            0 => Gather::new(),
            n => smallvec::smallvec![(bytes.as_ptr() as u64, n as u32)],
        };
        self.slots.push_back(Some(Held { gather, registered: None, refused: false, _snapshot: Some(bytes) }));
        self.first + self.slots.len() as u64 - 1
    }

    /// The buffers of message `token`, if it is still held.
    pub fn get(&self, token: u64) -> Option<&Gather> {
        let i = usize::try_from(token.checked_sub(self.first)?).ok()?;
        self.slots.get(i)?.as_ref().map(|h| &h.gather)
    }

    /// Forgets message `token`.
    pub fn remove(&mut self, token: u64) {
        let Some(i) = token.checked_sub(self.first).and_then(|i| usize::try_from(i).ok()) else { return };
        if let Some(slot) = self.slots.get_mut(i) {
            *slot = None;
        }
        while let Some(None) = self.slots.front() {
            self.slots.pop_front();
            self.first += 1;
        }
    }
}

/// The events of one step of a session: a few at most in the common
/// case, kept on the stack.
pub(crate) type NetEvents<'a> = smallvec::SmallVec<[NetEvent<'a>; 4]>;

/// A session event for the work queues.  A segment delivered in place
/// borrows its bytes from the received datagram.
#[derive(Debug)]
pub(crate) enum NetEvent<'a> {
    Segment(Segment, Cow<'a, [u8]>),
    Sent {
        token: u64,
    },
    /// A buffer of the message was deregistered before all its bytes were
    /// read (`Outbound::check`): nothing more of it is read or sent, and
    /// its send completes with a protection error.  On a reliable session
    /// the flush that found it has closed the session (`Broken` follows).
    Unreadable {
        token: u64,
    },
    Broken(BreakReason),
}

/// Packets sent per system call without GSO.
const SEND_BATCH: usize = 32;
/// Large packets handed to one `sendmmsg` after a flush's first.  The
/// kernel queues each to the peer's socket as it finishes it, so the peer
/// starts on the first of them no later than the payload CRCs of the others
/// take, and the system calls saved are the sender's, the side a stream of
/// large packets waits for.
const LARGE_PER_SEND: usize = 4;

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
        let (from, to) = (data[done..].as_ptr(), (s.addr + offset) as *mut u8);
        // Bytes the kernel wrote in place (`NetPort::land`) are there
        // already; others may come from another posted buffer, which an
        // application may have let overlap this one.
        if !std::ptr::eq(from, to) {
            // SAFETY: receive buffers were validated against the registry when posted.
            unsafe { std::ptr::copy(from, to, n) };
        }
        done += n;
        offset = 0;
        if done == data.len() {
            return true;
        }
    }
    done == data.len()
}

impl NetLink {
    /// Routes the packets of this link's VI id to `target`, which hears
    /// them through this link, until the link ends.
    pub(crate) fn route_to(self: &Arc<Self>, target: Weak<dyn NetReceiver>) {
        self.port.register(self, target);
    }

    /// Orderly disconnect: tell the peer, stop routing.
    pub fn disconnect(&self) {
        let mut st = self.state.lock();
        tracing::info!(vi = self.local_vi, peer = %self.peer, stats = ?st.session.stats(), offload = ?self.port.offload(), frames = ?st.frames, payload_crc = st.session.config().payload_crc, "network VI disconnected");
        st.session.disconnect();
        st.flush(self, &mut NetEvents::new());
        let last = st.session.last_word().map(|w| (w, self.peer));
        drop(st);
        self.port.unregister(self.local_vi, last);
    }

    /// Breaks the connection, telling the peer `code` if given; stops routing.
    pub fn close(&self, code: Option<u32>) {
        let mut st = self.state.lock();
        tracing::info!(vi = self.local_vi, peer = %self.peer, stats = ?st.session.stats(), offload = ?self.port.offload(), frames = ?st.frames, payload_crc = st.session.config().payload_crc, "network VI broken");
        if let Some(code) = code {
            st.session.close(code);
        }
        st.flush(self, &mut NetEvents::new());
        let last = st.session.last_word().map(|w| (w, self.peer));
        drop(st);
        self.port.unregister(self.local_vi, last);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use via_core::descriptor::LocalSeg;

    #[test]
    fn the_helper_looks_less_often_while_the_application_polls_and_takes_over_when_it_stops() {
        let h = Handover::default();
        let quiet = QUIET.as_nanos() as u64;
        let max = QUIET_MAX.as_nanos() as u64;
        let mut now = 1_000_000;
        let mut intervals = Vec::new();
        for _ in 0..5 {
            h.polled();
            assert!(!h.helper_drains(now), "the application polled since the last look");
            intervals.push(h.look_again_ns() - now);
            now = h.look_again_ns();
        }
        // From QUIET, doubled at each look, up to QUIET_MAX.
        assert_eq!(intervals, [2, 4, 8, 16, 32].map(|k| (k * quiet).min(max)));
        // No poll since: at the next look the helper takes over, and the
        // interval starts again from QUIET.
        now = h.look_again_ns();
        assert!(h.helper_drains(now));
        assert_eq!(h.look_again_ns() - h.seen_change_ns.load(Ordering::Relaxed), quiet);
        // A sleeper makes the helper drain however recently the application polled.
        h.polled();
        h.sleepers.fetch_add(1, Ordering::SeqCst);
        assert!(h.helper_drains(now));
        assert!(!h.app_is_polling());
    }

    #[test]
    fn scatter_crosses_segment_boundaries() {
        let mut x = [0u8; 4];
        let mut y = [0u8; 4];
        let segs = [
            LocalSeg { addr: x.as_mut_ptr() as u64, len: 4, handle: 0 },
            LocalSeg { addr: y.as_mut_ptr() as u64, len: 4, handle: 0 },
        ];
        assert!(scatter(&segs, 2, b"abcd"));
        assert_eq!((&x, &y), (b"\0\0ab", b"cd\0\0"));
        assert!(!scatter(&segs, 6, b"abc"));
    }

    /// `pages` pages mapped readable and writable, to register and unmap.
    fn map_pages(pages: usize) -> u64 {
        // SAFETY: an anonymous private mapping, checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                pages * 4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        p as u64
    }

    #[test]
    fn a_message_whose_buffer_was_deregistered_is_not_read_again() {
        use via_core::registry::Registry;
        let reg = Registry::new().unwrap();
        let (tag, page) = (7, 4096u64);
        let p = map_pages(3);
        let a = reg.register(p, page, tag, 0, false).unwrap();
        let b = reg.register(p + page, page, tag, 0, false).unwrap();
        let c = reg.register(p + 2 * page, page, tag, 0, false).unwrap();
        let registered =
            |handles: &[u32]| Registered { epoch: reg.deregistrations(), ptag: tag, handles: handles.into() };
        let mut o = Outbound::default();
        let both = o.insert_registered(smallvec::smallvec![(p + 10, 100), (p + page, 200)], Some(registered(&[a, b])));
        let first = o.insert_registered(smallvec::smallvec![(p, 10)], Some(registered(&[a])));
        let plain = o.insert(smallvec::smallvec![(p + page, 10)]);
        let snapshot = o.insert_snapshot(vec![1u8; 10].into());

        // Nothing went: readable, on the count read once for the flush.
        let mut count = None;
        for token in [both, first, plain, snapshot, 99] {
            assert_eq!(o.check(token, &reg, &mut count), Check::Readable);
        }
        assert_eq!(count, Some(reg.deregistrations()));

        // Another region goes: the buffers are looked up again, found, and
        // the message takes the new count.
        reg.deregister(c, p + 2 * page).unwrap();
        let mut count = None;
        assert_eq!(o.check(both, &reg, &mut count), Check::Readable);
        let i = (both - o.first) as usize;
        assert_eq!(o.slots[i].as_ref().unwrap().registered.as_ref().unwrap().epoch, reg.deregistrations());

        // One of its buffers goes and is unmapped: refused, once reported,
        // and never read again, whatever comes back at that address.
        reg.deregister(b, p + page).unwrap();
        // SAFETY: the page mapped above, no longer registered.
        assert_eq!(unsafe { libc::munmap((p + page) as *mut libc::c_void, page as usize) }, 0);
        let mut count = None;
        assert_eq!(o.check(both, &reg, &mut count), Check::Refused);
        assert_eq!(o.check(both, &reg, &mut count), Check::Refusing);
        let again = reg.register(p, 2 * page, tag, 0, false);
        assert!(again.is_err(), "a range with an unmapped page does not register");
        let mut count = None;
        assert_eq!(o.check(both, &reg, &mut count), Check::Refusing);
        // A message whose buffers are all still there goes on; one whose
        // bytes are its own, or that came with no registration, is not asked.
        assert_eq!(o.check(first, &reg, &mut count), Check::Readable);
        assert_eq!(o.check(snapshot, &reg, &mut count), Check::Readable);
        assert_eq!(o.check(plain, &reg, &mut count), Check::Readable);
        // Gone from the outbound (acknowledged): nothing to read.
        o.remove(both);
        assert_eq!(o.check(both, &reg, &mut count), Check::Readable);
        assert!(o.get(both).is_none());

        // A buffer moved to another tag is refused too.
        reg.set_attributes(a, p, tag + 1, 0).unwrap();
        reg.deregister(reg.register(p + 2 * page, page, tag, 0, false).unwrap(), p + 2 * page).unwrap();
        let mut count = None;
        assert_eq!(o.check(first, &reg, &mut count), Check::Refused);
        // SAFETY: the rest of the mapping above.
        unsafe {
            libc::munmap(p as *mut libc::c_void, page as usize);
            libc::munmap((p + 2 * page) as *mut libc::c_void, page as usize);
        }
    }

    #[test]
    fn a_snapshot_is_read_from_the_message_not_from_where_it_came_from() {
        let mut region = [7u8; 100];
        let mut o = Outbound::default();
        let token = o.insert_snapshot(region[10..50].into());
        // The region changes (is deregistered, reused) before a retransmission.
        region.fill(0);
        let gather = o.get(token).unwrap().clone();
        assert_eq!(gather.len(), 1);
        let (addr, len) = gather[0];
        assert_ne!(addr, region.as_ptr() as u64 + 10);
        // SAFETY: the snapshot is held by `o` for as long as the token is.
        let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, len as usize) };
        assert_eq!(bytes, &[7u8; 40][..]);
        o.remove(token);
        assert!(o.get(token).is_none());
    }

    #[test]
    fn outbound_hands_out_tokens_in_order_and_retires_them_in_any_order() {
        let mut o = Outbound::default();
        let tokens: Vec<u64> = (0..4u64).map(|i| o.insert(smallvec::smallvec![(i, 1)])).collect();
        assert_eq!(tokens, vec![1, 2, 3, 4]);
        assert_eq!(o.get(3), Some(&smallvec::smallvec![(2, 1)]));
        assert_eq!((o.get(0), o.get(5), o.get(u64::MAX)), (None, None, None));
        // Out of order: the front stays until it goes itself.
        o.remove(2);
        assert_eq!((o.get(2), o.get(1).is_some()), (None, true));
        o.remove(1);
        assert_eq!((o.first, o.slots.len()), (3, 2));
        // Unknown, repeated and far-off tokens change nothing.
        for t in [0, 1, 2, 99, u64::MAX] {
            o.remove(t);
        }
        assert_eq!((o.first, o.slots.len()), (3, 2));
        assert_eq!(o.insert(Gather::new()), 5);
        o.remove(3);
        o.remove(4);
        o.remove(5);
        assert!(o.slots.is_empty());
        assert_eq!(o.insert(Gather::new()), 6);
    }
}
