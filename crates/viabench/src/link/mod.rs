//! The transports under test, behind one interface that the NetPIPE driver
//! ([`crate::driver`]) times.
//!
//! A link moves blocks between two fixed sets of buffers: each side sends
//! from three prepared buffers (the first iteration's, the middle ones', the
//! last one's, each with its own data pattern) and receives into memory it
//! keeps until the block is checked.

pub mod raw_cma;
pub mod raw_ether;
pub mod raw_shm;
pub mod raw_udp;
pub mod tcp;
pub mod via;

use crate::error::{Error, Result};
use crate::pattern::Which;
use crate::proto::{Mode, PeerInfo, ServerInfo, TestSpec};
use serde::Serialize;
use std::cell::Cell;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Which end of the connection a process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// Drives the test and takes the time.
    Client,
    /// Answers.
    Server,
}

impl Side {
    /// The direction of the blocks this side sends (0: client to server).
    pub fn dir(self) -> u8 {
        match self {
            Side::Client => 0,
            Side::Server => 1,
        }
    }
}

/// Counters a link keeps about itself.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LinkStats {
    /// Messages (chunks or datagrams) sent.
    pub messages: u64,
    /// Flow-control continue messages sent.
    pub continues: u64,
    /// Times a sender waited for credits.
    pub stalls: u64,
}

/// A data path under test.
pub trait Link {
    /// Fills the three send buffers with `len` bytes of the patterns `seeds`
    /// (first, middle, last).  All earlier sends must have completed.
    fn prepare(&mut self, len: usize, seeds: [u64; 3]) -> Result<()>;
    /// Sends a block of `len` bytes from buffer `which`.
    fn send(&mut self, which: Which, len: usize) -> Result<()>;
    /// Receives a block of `len` bytes; with `keep` it stays available for
    /// [`Link::verify`] until the next kept block.
    fn recv(&mut self, len: usize, keep: bool) -> Result<()>;
    /// Checks the kept block against the pattern of `seed`.
    fn verify(&self, seed: u64, len: usize) -> Result<()>;
    /// Waits until every send has completed (end of a run, not timed).
    fn finish(&mut self) -> Result<()>;
    /// Chooses the VI for the next blocks (round-robin over several VIs).
    fn select(&mut self, _vi: usize) {}
    /// How many VIs the link drives.
    fn vis(&self) -> usize {
        1
    }
    /// Counters.
    fn stats(&self) -> LinkStats {
        LinkStats::default()
    }
    /// Tears the link down.
    fn close(&mut self) -> Result<()> {
        Ok(())
    }
}

/// The server's half-made link: `Ready` has to go out before the client
/// can connect to it.
pub trait Pending {
    /// What the client needs to connect.
    fn info(&self) -> ServerInfo;
    /// Accepts the client's connection (blocks until it comes).
    fn accept(self: Box<Self>) -> Result<Box<dyn LinkServer>>;
}

/// A server link that still needs what the client sent in `Peer`.
pub trait LinkServer {
    /// Completes the link.
    fn complete(self: Box<Self>, peer: &PeerInfo, peer_ip: IpAddr) -> Result<Box<dyn Link>>;
}

/// Sets up the server's side of `spec`.  `local_ip` is the address the
/// client reached the control port on; `device` the VIA device to open.
pub fn server_setup(spec: &TestSpec, device: &str, local_ip: IpAddr) -> Result<Box<dyn Pending>> {
    match spec.mode {
        Mode::ViaSend | Mode::ViaRdma => Ok(Box::new(via::ViaLink::open(spec, device, Side::Server)?)),
        Mode::Tcp => Ok(Box::new(tcp::TcpPending::listen(spec, local_ip)?)),
        Mode::RawShm => Ok(Box::new(raw_shm::ShmLink::create(spec)?)),
        Mode::RawUdp => Ok(Box::new(raw_udp::UdpLink::bind(spec, local_ip, Side::Server)?)),
        Mode::RawEther => Ok(Box::new(raw_ether::EtherLink::open(spec, Side::Server)?)),
        Mode::RawCma => Ok(Box::new(raw_cma::CmaLink::new(spec, Side::Server)?)),
    }
}

/// Sets up and connects the client's side of `spec` to a server that
/// answered `info` from `server_ip`; returns the link and what the server
/// needs to complete its side.
pub fn client_connect(
    spec: &TestSpec,
    info: &ServerInfo,
    server_ip: IpAddr,
    local_ip: IpAddr,
) -> Result<(Box<dyn Link>, PeerInfo)> {
    match spec.mode {
        Mode::ViaSend | Mode::ViaRdma => {
            let mut link = via::ViaLink::open(spec, &spec.device, Side::Client)?;
            link.connect(info)?;
            let peer = PeerInfo { rdma: link.rdma_targets(), ..Default::default() };
            Ok((Box::new(link), peer))
        }
        Mode::Tcp => Ok((Box::new(tcp::TcpLink::connect(spec, server_ip, info.port)?), PeerInfo::default())),
        Mode::RawShm => {
            let path = info.shm_path.as_deref().ok_or_else(|| Error::new("the server sent no shared-memory file"))?;
            Ok((Box::new(raw_shm::ShmLink::open(spec, path)?), PeerInfo::default()))
        }
        Mode::RawUdp => {
            let mut link = raw_udp::UdpLink::bind(spec, local_ip, Side::Client)?;
            let port = link.port();
            link.connect_to(std::net::SocketAddr::new(server_ip, info.port))?;
            Ok((Box::new(link), PeerInfo { port, ..Default::default() }))
        }
        Mode::RawEther => {
            let mut link = raw_ether::EtherLink::open(spec, Side::Client)?;
            link.connect_to(info.mac.ok_or_else(|| Error::new("the server sent no Ethernet address"))?);
            let mac = Some(link.mac());
            Ok((Box::new(link), PeerInfo { mac, ..Default::default() }))
        }
        Mode::RawCma => {
            let (pid, addr) = info.cma.ok_or_else(|| Error::new("the server sent no process and buffer (raw-cma)"))?;
            let mut link = raw_cma::CmaLink::new(spec, Side::Client)?;
            link.connect_to(pid, addr);
            let cma = Some(link.buffer());
            Ok((Box::new(link), PeerInfo { cma, ..Default::default() }))
        }
    }
}

/// A deadline for waits that must not hang for ever when a message is lost.
/// Its clock starts at the first check, which a wait makes only after many
/// empty polls or a timed-out blocking slice: a message that comes soon
/// costs no clock read, in every contender alike.
#[derive(Debug)]
pub struct Deadline {
    at: Cell<Option<Instant>>,
    limit: Duration,
}

impl Deadline {
    /// `limit` from the first check.
    pub fn after(limit: Duration) -> Deadline {
        Deadline { at: Cell::new(None), limit }
    }
    /// An error if the deadline has passed.
    pub fn check(&self, what: &str) -> Result<()> {
        let now = Instant::now();
        let at = self.at.get().unwrap_or(now + self.limit);
        self.at.set(Some(at));
        if now >= at {
            Err(Error::new(format!("{what}: nothing arrived within {:?}", self.limit)))
        } else {
            Ok(())
        }
    }
}

/// Anonymous memory, mapped and touched in advance so that page faults stay
/// out of the measurements.
pub struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value.
unsafe impl Send for Mapping {}

impl Mapping {
    /// `len` bytes (rounded up to pages), zeroed and populated.
    pub fn new(len: usize) -> Result<Mapping> {
        let len = len.max(1).div_ceil(4096) * 4096;
        use rustix::mm::{mmap_anonymous, MapFlags, ProtFlags};
        let prot = ProtFlags::READ | ProtFlags::WRITE;
        // SAFETY: a fresh anonymous private mapping at an address the kernel picks.
        let ptr = unsafe { mmap_anonymous(std::ptr::null_mut(), len, prot, MapFlags::PRIVATE | MapFlags::POPULATE) }
            .map_err(|e| Error::new(format!("mmap of {len} bytes: {}", std::io::Error::from(e))))?;
        Ok(Mapping { ptr: ptr as *mut u8, len })
    }
    /// The first byte.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }
    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Always false: a mapping has at least one page.
    pub fn is_empty(&self) -> bool {
        false
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `new` mapped, unused once this is dropped.
        let _ = unsafe { rustix::mm::munmap(self.ptr as *mut std::ffi::c_void, self.len) };
    }
}

/// [`Link::verify`] of a link that keeps its last block in `received`:
/// the block kept must be `len` bytes (`kept`) and follow the pattern of
/// `seed`; a wrong byte is reported as "byte K of a LEN-byte `wrong`".
pub fn verify_kept(kept: usize, received: &[u8], seed: u64, len: usize, wrong: &str) -> Result<()> {
    if kept != len {
        return Err(Error::new(format!("kept {kept} bytes of a {len}-byte block")));
    }
    crate::pattern::check(seed, 0, &received[..len])
        .map_err(|k| Error::new(format!("byte {k} of a {len}-byte {wrong}")))
}

/// Rounds `n` up to a multiple of `to`.
pub fn round_up(n: usize, to: usize) -> usize {
    n.div_ceil(to) * to
}

/// `futex(FUTEX_WAIT)` on a word shared between processes.
pub fn futex_wait(word: &std::sync::atomic::AtomicU32, expected: u32, timeout: Duration) {
    use rustix::thread::futex;
    let ts = futex::Timespec { tv_sec: timeout.as_secs() as i64, tv_nsec: i64::from(timeout.subsec_nanos()) };
    let _ = futex::wait(word, futex::Flags::empty(), expected, Some(&ts));
}

/// `futex(FUTEX_WAKE)` of every waiter on a shared word.
pub fn futex_wake(word: &std::sync::atomic::AtomicU32) {
    use rustix::thread::futex;
    let _ = futex::wake(word, futex::Flags::empty(), i32::MAX as u32);
}

/// Sets an `int` socket option that socket2 and rustix have no call for
/// (those of packet sockets, `UDP_GRO`).
pub fn set_int_option(
    socket: &impl std::os::fd::AsRawFd,
    level: libc::c_int,
    option: libc::c_int,
    value: libc::c_int,
) -> std::io::Result<()> {
    set_option(socket, level, option, &value)
}

/// Sets socket option `option` to `value`, a plain C value (an int, a
/// `tpacket_req`) passed with its own size.
pub fn set_option<T>(
    socket: &impl std::os::fd::AsRawFd,
    level: libc::c_int,
    option: libc::c_int,
    value: &T,
) -> std::io::Result<()> {
    // SAFETY: an open socket and a live value of the size passed.
    let r = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            level,
            option,
            value as *const T as *const libc::c_void,
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Sets SO_SNDBUF and SO_RCVBUF to `bytes`: with the `FORCE` options where
/// the process may exceed the system's maximum (`net.core.*mem_max`), else
/// the plain ones, which the kernel caps.
pub fn set_socket_buffers(socket: &impl std::os::fd::AsFd, bytes: u32) -> std::io::Result<()> {
    use rustix::net::sockopt;
    let value = bytes.min(i32::MAX as u32 / 2) as usize;
    if sockopt::set_socket_send_buffer_size_force(socket, value).is_err() {
        sockopt::set_socket_send_buffer_size(socket, value)?;
    }
    if sockopt::set_socket_recv_buffer_size_force(socket, value).is_err() {
        sockopt::set_socket_recv_buffer_size(socket, value)?;
    }
    Ok(())
}

/// The interface behind a VIA device name: `/dev/via_eth0` is `eth0`.
pub fn interface_of(device: &str) -> &str {
    let name = device.strip_prefix("/dev/").unwrap_or(device);
    name.strip_prefix("via_").unwrap_or(name)
}

/// The largest UDP payload that fits the MTU of `device`'s interface.
pub fn udp_payload(device: &str) -> usize {
    let mtu = std::fs::read_to_string(format!("/sys/class/net/{}/mtu", interface_of(device)))
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .unwrap_or(1500);
    mtu.saturating_sub(28).clamp(256, 65507)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_runs_from_its_first_check() {
        let d = Deadline::after(Duration::from_millis(20));
        std::thread::sleep(Duration::from_millis(30));
        d.check("first").expect("the clock starts at the first check");
        std::thread::sleep(Duration::from_millis(30));
        let e = d.check("waiting").expect_err("20 ms after the first check");
        assert!(e.to_string().contains("waiting: nothing arrived within 20ms"), "{e}");
    }

    #[test]
    fn device_names_map_to_interfaces() {
        assert_eq!(interface_of("/dev/via_lo"), "lo");
        assert_eq!(interface_of("via_eth1"), "eth1");
        assert_eq!(interface_of("/dev/via_vb0"), "vb0");
        assert_eq!(udp_payload("/dev/via_lo"), 65507);
    }

    #[test]
    fn mappings_are_page_sized_and_writable() {
        let m = Mapping::new(10).unwrap();
        assert_eq!(m.len(), 4096);
        // SAFETY: inside the mapping.
        unsafe {
            *m.ptr().add(4095) = 7;
            assert_eq!(*m.ptr().add(4095), 7);
        }
        assert_eq!(round_up(4097, 4096), 8192);
    }
}
