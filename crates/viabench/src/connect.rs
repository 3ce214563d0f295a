//! Connection set-up (`--pattern connect`): how long it takes to connect,
//! and how many connections one client sets up per second, VIA beside TCP
//! on the same path.
//!
//! The client repeats one cycle, one connection after the other:
//!
//! * VIA (`via-send`): `VipCreateVi`, a receive posted, `VipConnectRequest`
//!   to the server's discriminator (the server: `VipCreateVi`, a receive
//!   posted, `VipConnectWait`, `VipConnectAccept`); then one 8-byte message
//!   there and its echo back, `VipDisconnect` and `VipDestroyVi` on both
//!   sides.  On one host the agent matches the request with the listener;
//!   between hosts it goes to the other host's agent on the CM port (UDP).
//! * TCP (`tcp`): `connect` to the server's listening port (the server:
//!   `accept`), `TCP_NODELAY`, the same message and echo, `close` on both
//!   sides.
//!
//! The NIC, its protection tag and the registered memory (VIA) or the
//! listening socket (TCP) are set up once per test, outside the clock.
//! Per connection the client takes two times: *set-up*, the call that
//! connects (`VipConnectRequest`, which returns once the server's
//! `VipConnectAccept` answered; `connect`, which returns once the server's
//! kernel answered, before the server's `accept`), and *first reply*, from
//! the same start until the echo is in (the server's application has taken
//! the connection and answered through it).  The rate is connections per
//! second of the whole cycle, VI or socket creation and teardown included.
//! Every echo is checked: its value depends on the run and the connection.

use crate::error::{Error, Result};
use crate::link::{Deadline, Mapping};
use crate::pattern::mix;
use crate::proto::{Mode, RunSpec, ServerInfo, TestSpec, Wait};
use crate::vipl_api::*;
use serde::Serialize;
use std::ffi::CString;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// Bytes of the message each connection carries there and back.
pub const MESSAGE_BYTES: usize = 8;

/// Connections set up per test by default.
pub const DEFAULT_CONNECTIONS: u64 = 1000;

/// The same with `--quick`.
pub const QUICK_CONNECTIONS: u64 = 200;

/// Whether `mode` has a connection set-up to measure.
pub fn supports(mode: Mode) -> bool {
    matches!(mode, Mode::ViaSend | Mode::Tcp)
}

/// Untimed connections before the measured ones: the first connection
/// between two processes maps what later ones reuse, and the agent and
/// the caches warm up.
pub fn warmup(connections: u64) -> u64 {
    (connections / 20).clamp(1, 20)
}

/// The value the client sends on connection `i` of a run (the server echoes it).
pub fn message(seed: u64, i: u64) -> u64 {
    mix(seed ^ mix(i))
}

/// The two times of one connection, as the client took them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// The call that connects.
    pub setup: Duration,
    /// From the same start until the echo of the first message is in.
    pub reply: Duration,
}

/// Order statistics of a set of times, in microseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Summary {
    /// The fastest.
    pub min: f64,
    /// The median.
    pub median: f64,
    /// The 90th percentile (nearest rank).
    pub p90: f64,
    /// The 99th percentile (nearest rank).
    pub p99: f64,
    /// The slowest.
    pub max: f64,
    /// The arithmetic mean.
    pub mean: f64,
}

impl Summary {
    /// The summary of `us` (any order); all zero when empty.
    pub fn of(us: &[f64]) -> Summary {
        if us.is_empty() {
            return Summary::default();
        }
        let mut s = us.to_vec();
        s.sort_by(f64::total_cmp);
        let rank = |q: f64| s[((q * s.len() as f64).ceil() as usize).clamp(1, s.len()) - 1];
        let median = if s.len() % 2 == 1 { s[s.len() / 2] } else { (s[s.len() / 2 - 1] + s[s.len() / 2]) / 2.0 };
        Summary {
            min: s[0],
            median,
            p90: rank(0.90),
            p99: rank(0.99),
            max: s[s.len() - 1],
            mean: s.iter().sum::<f64>() / s.len() as f64,
        }
    }
}

/// What a connect test measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ConnectStats {
    /// Connections measured (after the untimed warm-up).
    pub count: u64,
    /// Untimed connections before them.
    pub warmup: u64,
    /// Set-up time of every connection, µs, in order.
    pub setup_us: Vec<f64>,
    /// First-reply time of every connection, µs, in order.
    pub reply_us: Vec<f64>,
    /// Summary of `setup_us`.
    pub setup: Summary,
    /// Summary of `reply_us`.
    pub reply: Summary,
    /// Wall time of the measured cycles, seconds.
    pub seconds: f64,
    /// Connections set up (and torn down) per second, one after the other.
    pub per_second: f64,
}

impl ConnectStats {
    /// The statistics of `samples`, measured in `elapsed` after `warmup`
    /// untimed connections.
    pub fn new(samples: &[Sample], elapsed: Duration, warmup: u64) -> ConnectStats {
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        let setup_us: Vec<f64> = samples.iter().map(|s| us(s.setup)).collect();
        let reply_us: Vec<f64> = samples.iter().map(|s| us(s.reply)).collect();
        let seconds = elapsed.as_secs_f64();
        ConnectStats {
            count: samples.len() as u64,
            warmup,
            setup: Summary::of(&setup_us),
            reply: Summary::of(&reply_us),
            setup_us,
            reply_us,
            seconds,
            per_second: if seconds > 0.0 { samples.len() as f64 / seconds } else { 0.0 },
        }
    }
}

/// The server's side of a connect test.
pub trait ConnectServer {
    /// What the client needs to connect.
    fn info(&self) -> ServerInfo;
    /// Takes `run.reps` connections, one after the other, each echoing one
    /// message.
    fn serve(&mut self, run: RunSpec) -> Result<()>;
}

/// The client's side of a connect test.
pub trait ConnectClient {
    /// Sets up one connection, sends `value`, checks its echo, tears the
    /// connection down.
    fn once(&mut self, value: u64) -> Result<Sample>;
}

/// Sets up the server's side of `spec` on `device` (VIA) or `local_ip` (TCP).
pub fn server_open(spec: &TestSpec, device: &str, local_ip: IpAddr) -> Result<Box<dyn ConnectServer>> {
    match spec.mode {
        Mode::ViaSend => Ok(Box::new(ViaEnd::open(spec, device)?)),
        Mode::Tcp => {
            let listener = TcpListener::bind(SocketAddr::new(local_ip, 0))?;
            Ok(Box::new(TcpServer { listener, spec: spec.clone() }))
        }
        m => Err(Error::new(format!("the connect pattern measures via-send and tcp, not {}", m.name()))),
    }
}

/// Sets up the client's side of `spec` against a server that answered
/// `info` from `server_ip`.
pub fn client_open(spec: &TestSpec, info: &ServerInfo, server_ip: IpAddr) -> Result<Box<dyn ConnectClient>> {
    match spec.mode {
        Mode::ViaSend => {
            let mut end = ViaEnd::open(spec, &spec.device)?;
            end.remote_addr = info.nic_addr.clone();
            Ok(Box::new(end))
        }
        Mode::Tcp => Ok(Box::new(TcpClient { server: SocketAddr::new(server_ip, info.port), spec: spec.clone() })),
        m => Err(Error::new(format!("the connect pattern measures via-send and tcp, not {}", m.name()))),
    }
}

/// The client's side of a run: `run.reps` connections, each timed; returns
/// the samples and the wall time of all the cycles.
pub fn client_run(client: &mut dyn ConnectClient, run: RunSpec) -> Result<(Vec<Sample>, Duration)> {
    let mut samples = Vec::with_capacity(run.reps as usize);
    let start = Instant::now();
    for i in 0..run.reps {
        samples.push(client.once(message(run.seed, i)).map_err(|e| e.context(format!("connection {}", i + 1)))?);
    }
    Ok((samples, start.elapsed()))
}

// ---------------------------------------------------------------- VIA

/// Longest single `*Wait` call, so that the deadline is looked at.
const WAIT_SLICE_MS: libc::c_ulong = 1000;
/// `MaxTransferSize` of the VIs: the same on both sides.
const MAX_TRANSFER: usize = 4096;

/// One side of a VIA connect test: the NIC, a protection tag and one
/// registered page holding the two descriptors and the two buffers.
struct ViaEnd {
    nic: VIP_PVOID,
    ptag: VIP_PVOID,
    mem: Mapping,
    mh: VIP_MEM_HANDLE,
    registered: bool,
    nic_addr: Vec<u8>,
    /// The server's NIC address (client only).
    remote_addr: Vec<u8>,
    attrs: VIP_VI_ATTRIBUTES,
    wait: Wait,
    timeout: Duration,
    tag: String,
}

/// Offsets in the registered page.
const RECV_DESC: usize = 0;
const SEND_DESC: usize = 64;
const SEND_BUF: usize = 128;
const RECV_BUF: usize = 192;

/// A VI of one connection; disconnected (if it was connected) and
/// destroyed when dropped, also on an error path.
struct ConnVi {
    vi: VIP_PVOID,
    connected: bool,
}

impl ConnVi {
    /// `VipDisconnect` (if connected) and `VipDestroyVi`.
    fn close(mut self) -> Result<()> {
        let vi = std::mem::replace(&mut self.vi, std::ptr::null_mut());
        let connected = std::mem::take(&mut self.connected);
        if connected {
            // SAFETY: a VI handle of ours.
            check("VipDisconnect", unsafe { VipDisconnect(vi) })?;
        }
        // SAFETY: as above; no descriptor of it is posted any more.
        check("VipDestroyVi", unsafe { VipDestroyVi(vi) })?;
        Ok(())
    }
}

impl Drop for ConnVi {
    fn drop(&mut self) {
        if self.vi.is_null() {
            return;
        }
        // SAFETY: a VI handle of ours, given up here.
        unsafe {
            if self.connected {
                VipDisconnect(self.vi);
            }
            VipDestroyVi(self.vi);
        }
    }
}

impl ViaEnd {
    fn open(spec: &TestSpec, device: &str) -> Result<ViaEnd> {
        vipl::set_segment_size(spec.segment.map(|s| s as usize));
        let name = CString::new(device).map_err(|_| Error::new("bad device name"))?;
        let mut end = ViaEnd {
            nic: std::ptr::null_mut(),
            ptag: std::ptr::null_mut(),
            mem: Mapping::new(4096)?,
            mh: 0,
            registered: false,
            nic_addr: Vec::new(),
            remote_addr: Vec::new(),
            // SAFETY: plain data, filled in below.
            attrs: unsafe { std::mem::zeroed() },
            wait: spec.wait,
            timeout: Duration::from_millis(spec.timeout_ms),
            tag: spec.tag.clone(),
        };
        // SAFETY: a NUL-terminated name and a valid out-pointer.
        check("VipOpenNic", unsafe { VipOpenNic(name.as_ptr(), &mut end.nic) })
            .map_err(|e| Error::from(e).context(device))?;
        end.nic_addr = nic_address(end.nic)?;
        let max_transfer = MAX_TRANSFER.min(nic_max_transfer(end.nic)?);
        // SAFETY: a valid out-pointer.
        check("VipCreatePtag", unsafe { VipCreatePtag(end.nic, &mut end.ptag) })?;
        let attrs = VIP_MEM_ATTRIBUTES { Ptag: end.ptag, EnableRdmaWrite: 0, EnableRdmaRead: 0 };
        // SAFETY: the mapping is ours and stays mapped until deregistered.
        check("VipRegisterMem", unsafe {
            VipRegisterMem(end.nic, end.mem.ptr() as VIP_PVOID, end.mem.len() as libc::c_ulong, &attrs, &mut end.mh)
        })?;
        end.registered = true;
        end.attrs = VIP_VI_ATTRIBUTES {
            ReliabilityLevel: spec.reliability.level(),
            MaxTransferSize: max_transfer as libc::c_ulong,
            QoS: std::ptr::null_mut(),
            Ptag: end.ptag,
            EnableRdmaWrite: 0,
            EnableRdmaRead: 0,
        };
        Ok(end)
    }

    fn server_disc(&self) -> Vec<u8> {
        format!("viabench-{}-connect", self.tag).into_bytes()
    }

    fn at(&self, offset: usize) -> *mut u8 {
        // SAFETY: every offset used lies inside the one page.
        unsafe { self.mem.ptr().add(offset) }
    }

    /// A new VI with a receive for the peer's message posted.
    fn new_vi(&self) -> Result<ConnVi> {
        let mut vi: VIP_PVOID = std::ptr::null_mut();
        // SAFETY: valid attributes and out-pointer; no CQs.
        check("VipCreateVi", unsafe {
            VipCreateVi(self.nic, &self.attrs, std::ptr::null_mut(), std::ptr::null_mut(), &mut vi)
        })?;
        let vi = ConnVi { vi, connected: false };
        let mut desc = Descriptor::default();
        desc.cs.seg_count = 1;
        desc.ds[0] = DataSegment { data: self.at(RECV_BUF) as u64, handle: self.mh, length: 64 };
        let d = self.at(RECV_DESC) as *mut Descriptor;
        // SAFETY: a descriptor slot of the page; the last VI's is done with.
        unsafe { std::ptr::write(d, desc) };
        // SAFETY: a descriptor in registered memory.
        check("VipPostRecv", unsafe { VipPostRecv(vi.vi, d, self.mh) })?;
        Ok(vi)
    }

    /// Sends `value` on `vi`.
    fn send(&self, vi: &ConnVi, value: u64) -> Result<()> {
        // SAFETY: the send buffer, not in use by a send.
        unsafe { std::ptr::write_unaligned(self.at(SEND_BUF) as *mut u64, value) };
        let mut desc = Descriptor::default();
        desc.cs.seg_count = 1;
        desc.cs.length = MESSAGE_BYTES as u32;
        desc.ds[0] = DataSegment { data: self.at(SEND_BUF) as u64, handle: self.mh, length: MESSAGE_BYTES as u32 };
        let d = self.at(SEND_DESC) as *mut Descriptor;
        // SAFETY: the send descriptor slot; the last send completed.
        unsafe { std::ptr::write(d, desc) };
        // SAFETY: a descriptor in registered memory.
        check("VipPostSend", unsafe { VipPostSend(vi.vi, d, self.mh) })?;
        Ok(())
    }

    /// Waits for the completion of `vi`'s receive (`recv`) or send, polling
    /// or blocking as the test says.
    fn complete(&self, vi: &ConnVi, recv: bool) -> Result<*mut Descriptor> {
        let deadline = Deadline::after(self.timeout);
        let mut spins = 0u32;
        let mut d: *mut Descriptor = std::ptr::null_mut();
        loop {
            // SAFETY (all four): a VI of ours and a valid out-pointer.
            let rc = match (self.wait, recv) {
                (Wait::Poll, true) => unsafe { VipRecvDone(vi.vi, &mut d) },
                (Wait::Poll, false) => unsafe { VipSendDone(vi.vi, &mut d) },
                (Wait::Block, true) => unsafe { VipRecvWait(vi.vi, WAIT_SLICE_MS, &mut d) },
                (Wait::Block, false) => unsafe { VipSendWait(vi.vi, WAIT_SLICE_MS, &mut d) },
            };
            match rc {
                VIP_SUCCESS => break,
                VIP_NOT_DONE | VIP_TIMEOUT => {
                    spins = spins.wrapping_add(1);
                    if rc == VIP_TIMEOUT || spins.is_multiple_of(4096) {
                        deadline.check(if recv { "waiting for the message" } else { "waiting for the send" })?;
                    }
                }
                rc => check(if recv { "VipRecvDone" } else { "VipSendDone" }, rc)?,
            }
        }
        // SAFETY: the provider returned one of our descriptors.
        let status = unsafe { Descriptor::status(d) };
        if status & VIP_STATUS_DONE == 0 || status & VIP_STATUS_ERROR_MASK != 0 {
            let what = if recv { "receive" } else { "send" };
            return Err(Error::new(format!("the {what} completed with status {status:#x}")));
        }
        Ok(d)
    }

    /// Waits for the peer's message on `vi`; returns its value.
    fn receive(&self, vi: &ConnVi) -> Result<u64> {
        let d = self.complete(vi, true)?;
        // SAFETY: a completed receive descriptor of ours.
        let len = unsafe { Descriptor::length(d) } as usize;
        if len != MESSAGE_BYTES {
            return Err(Error::new(format!("a {len}-byte message, not {MESSAGE_BYTES}")));
        }
        // SAFETY: the receive buffer, filled by the completed receive.
        Ok(unsafe { std::ptr::read_unaligned(self.at(RECV_BUF) as *const u64) })
    }

    fn address(&self, host: &[u8], disc: &[u8]) -> NetAddress {
        NetAddress::new(host, disc)
    }
}

impl Drop for ViaEnd {
    fn drop(&mut self) {
        // SAFETY: our own handles, released in the reverse order of `open`;
        // every VI of this end is gone already.
        unsafe {
            if self.registered {
                VipDeregisterMem(self.nic, self.mem.ptr() as VIP_PVOID, self.mh);
            }
            if !self.ptag.is_null() {
                VipDestroyPtag(self.nic, self.ptag);
            }
            if !self.nic.is_null() {
                VipCloseNic(self.nic);
            }
        }
    }
}

impl ConnectServer for ViaEnd {
    fn info(&self) -> ServerInfo {
        ServerInfo { nic_addr: self.nic_addr.clone(), ..Default::default() }
    }

    fn serve(&mut self, run: RunSpec) -> Result<()> {
        let local = self.address(&self.nic_addr, &self.server_disc());
        for i in 0..run.reps {
            let mut vi = self.new_vi()?;
            let mut remote = NetAddress::empty();
            // SAFETY: plain data filled by the provider.
            let mut attrs: VIP_VI_ATTRIBUTES = unsafe { std::mem::zeroed() };
            let mut conn: VIP_PVOID = std::ptr::null_mut();
            // SAFETY: valid addresses and out-pointers.
            check("VipConnectWait", unsafe {
                VipConnectWait(
                    self.nic,
                    local.as_ptr(),
                    self.timeout.as_millis() as libc::c_ulong,
                    remote.as_mut_ptr(),
                    &mut attrs,
                    &mut conn,
                )
            })
            .map_err(|e| Error::from(e).context(format!("connection {}", i + 1)))?;
            // SAFETY: the connection handle just returned and our VI.
            check("VipConnectAccept", unsafe { VipConnectAccept(conn, vi.vi) })?;
            vi.connected = true;
            let value = self.receive(&vi).map_err(|e| e.context(format!("connection {}", i + 1)))?;
            if value != message(run.seed, i) {
                return Err(Error::new(format!("connection {}: the client's message is wrong", i + 1)));
            }
            self.send(&vi, value)?;
            self.complete(&vi, false)?;
            vi.close()?;
        }
        Ok(())
    }
}

impl ConnectClient for ViaEnd {
    fn once(&mut self, value: u64) -> Result<Sample> {
        let local = self.address(&self.nic_addr, format!("viabench-{}-client", self.tag).as_bytes());
        let remote = self.address(&self.remote_addr, &self.server_disc());
        let mut vi = self.new_vi()?;
        // SAFETY: plain data filled by the provider.
        let mut attrs: VIP_VI_ATTRIBUTES = unsafe { std::mem::zeroed() };
        let start = Instant::now();
        // SAFETY: addresses built above, valid out-pointer.
        check("VipConnectRequest", unsafe {
            VipConnectRequest(
                vi.vi,
                local.as_ptr(),
                remote.as_ptr(),
                self.timeout.as_millis() as libc::c_ulong,
                &mut attrs,
            )
        })?;
        let setup = start.elapsed();
        vi.connected = true;
        self.send(&vi, value)?;
        let echo = self.receive(&vi)?;
        let reply = start.elapsed();
        if echo != value {
            return Err(Error::new("the echo of the message is wrong"));
        }
        self.complete(&vi, false)?;
        vi.close()?;
        Ok(Sample { setup, reply })
    }
}

// ---------------------------------------------------------------- TCP

/// The server's listening socket.
struct TcpServer {
    listener: TcpListener,
    spec: TestSpec,
}

/// Waits until `fd` is readable or `timeout` has passed.
fn readable(fd: &impl AsRawFd, timeout: Duration) -> Result<bool> {
    let mut p = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
    loop {
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut p, 1, ms) };
        if n >= 0 {
            return Ok(n > 0);
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != ErrorKind::Interrupted {
            return Err(e.into());
        }
    }
}

/// Sets the socket up for one message: `TCP_NODELAY`, and polling
/// (non-blocking) or blocking with the test's timeout.
fn prepare(stream: &TcpStream, spec: &TestSpec) -> Result<()> {
    stream.set_nodelay(true)?;
    match spec.wait {
        Wait::Poll => stream.set_nonblocking(true)?,
        Wait::Block => stream.set_read_timeout(Some(Duration::from_millis(spec.timeout_ms)))?,
    }
    Ok(())
}

/// Writes the whole message (it fits an empty socket buffer).
fn write_message(stream: &mut TcpStream, value: u64) -> Result<()> {
    let bytes = value.to_le_bytes();
    let mut off = 0;
    while off < bytes.len() {
        match stream.write(&bytes[off..]) {
            Ok(0) => return Err(Error::new("the TCP peer closed the connection")),
            Ok(n) => off += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Reads one message, spinning (non-blocking socket) or asleep in `recv`.
fn read_message(stream: &mut TcpStream, timeout: Duration) -> Result<u64> {
    let mut bytes = [0u8; MESSAGE_BYTES];
    let mut got = 0;
    let deadline = Deadline::after(timeout);
    let mut spins = 0u32;
    while got < bytes.len() {
        match stream.read(&mut bytes[got..]) {
            Ok(0) => return Err(Error::new("the TCP peer closed the connection")),
            Ok(n) => got += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted | ErrorKind::TimedOut) => {
                spins = spins.wrapping_add(1);
                if e.kind() == ErrorKind::TimedOut || spins.is_multiple_of(4096) {
                    deadline.check("waiting for the TCP message")?;
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(u64::from_le_bytes(bytes))
}

impl ConnectServer for TcpServer {
    fn info(&self) -> ServerInfo {
        ServerInfo { port: self.listener.local_addr().map(|a| a.port()).unwrap_or(0), ..Default::default() }
    }

    fn serve(&mut self, run: RunSpec) -> Result<()> {
        let timeout = Duration::from_millis(self.spec.timeout_ms);
        for i in 0..run.reps {
            let what = || format!("connection {}", i + 1);
            if !readable(&self.listener, timeout)? {
                return Err(Error::new(format!("{}: no TCP connection within {timeout:?}", what())));
            }
            let (mut stream, _) = self.listener.accept()?;
            prepare(&stream, &self.spec)?;
            let value = read_message(&mut stream, timeout).map_err(|e| e.context(what()))?;
            if value != message(run.seed, i) {
                return Err(Error::new(format!("{}: the client's message is wrong", what())));
            }
            write_message(&mut stream, value)?;
        }
        Ok(())
    }
}

/// The client's side: where to connect.
struct TcpClient {
    server: SocketAddr,
    spec: TestSpec,
}

impl ConnectClient for TcpClient {
    fn once(&mut self, value: u64) -> Result<Sample> {
        let timeout = Duration::from_millis(self.spec.timeout_ms);
        let start = Instant::now();
        let mut stream = TcpStream::connect_timeout(&self.server, timeout)?;
        let setup = start.elapsed();
        prepare(&stream, &self.spec)?;
        write_message(&mut stream, value)?;
        let echo = read_message(&mut stream, timeout)?;
        let reply = start.elapsed();
        if echo != value {
            return Err(Error::new("the echo of the message is wrong"));
        }
        Ok(Sample { setup, reply })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_take_nearest_ranks() {
        let us: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        let s = Summary::of(&us);
        assert_eq!((s.min, s.p90, s.p99, s.max), (1.0, 90.0, 99.0, 100.0));
        assert_eq!(s.median, 50.5);
        assert!((s.mean - 50.5).abs() < 1e-12);
        let one = Summary::of(&[7.0]);
        assert_eq!((one.min, one.median, one.p90, one.p99, one.max), (7.0, 7.0, 7.0, 7.0, 7.0));
        assert_eq!(Summary::of(&[]), Summary::default());
        assert_eq!(Summary::of(&[3.0, 1.0, 2.0]).median, 2.0);
    }

    #[test]
    fn stats_count_every_connection_and_the_rate() {
        let samples: Vec<Sample> = (1..=4)
            .map(|i| Sample { setup: Duration::from_micros(i * 10), reply: Duration::from_micros(i * 10 + 5) })
            .collect();
        let st = ConnectStats::new(&samples, Duration::from_millis(2), 1);
        assert_eq!(st.count, 4);
        assert_eq!(st.setup_us, vec![10.0, 20.0, 30.0, 40.0]);
        assert_eq!(st.reply.max, 45.0);
        assert!((st.per_second - 2000.0).abs() < 1e-6);
        assert_eq!(ConnectStats::new(&[], Duration::ZERO, 0).per_second, 0.0);
    }

    #[test]
    fn messages_differ_by_run_and_connection() {
        assert_ne!(message(1, 0), message(1, 1));
        assert_ne!(message(1, 0), message(2, 0));
        assert_eq!(warmup(200), 10);
        assert_eq!(warmup(5), 1);
        assert_eq!(warmup(100_000), 20);
        assert!(supports(Mode::ViaSend) && supports(Mode::Tcp) && !supports(Mode::RawShm));
    }

    /// The TCP pair end to end, in threads: every connection is counted and
    /// timed, and a wrong echo would fail.
    #[test]
    fn tcp_connections_echo_in_order() {
        let spec = TestSpec {
            mode: Mode::Tcp,
            pattern: crate::proto::Pattern::Connect,
            wait: Wait::Block,
            vis: None,
            device: "/dev/via_lo".into(),
            reliability: crate::proto::Reliability::Delivery,
            segment: None,
            sockbuf: None,
            max_block: MESSAGE_BYTES,
            desc_size: 64,
            ring: 16,
            tag: "t".into(),
            timeout_ms: 5000,
        };
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut server = TcpServer { listener, spec: spec.clone() };
        let info = server.info();
        let run = RunSpec { size: MESSAGE_BYTES, reps: 5, seed: 42 };
        let t = std::thread::spawn(move || server.serve(run));
        let mut client = client_open(&spec, &info, IpAddr::from([127, 0, 0, 1])).unwrap();
        let (samples, elapsed) = client_run(client.as_mut(), run).unwrap();
        t.join().unwrap().unwrap();
        assert_eq!(samples.len(), 5);
        assert!(samples.iter().all(|s| s.setup > Duration::ZERO && s.reply >= s.setup));
        assert!(elapsed >= samples.iter().map(|s| s.reply).sum());
    }
}
