//! A bare UDP ping-pong: blocks cut into datagrams of the path's payload
//! size, no header, no reliability.  The floor under the UDP transport of
//! openvia; a lost datagram fails the run instead of being retransmitted.

use super::{udp_payload, Deadline, Link, LinkServer, LinkStats, Pending, Side};
use crate::error::{Error, Result};
use crate::pattern::{self, Which};
use crate::proto::{PeerInfo, ServerInfo, TestSpec, Wait, ACK_BYTES};
use std::io::ErrorKind;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::Duration;

/// Largest UDP payload.
const MAX_DATAGRAM: usize = 65507;

/// A UDP socket connected to the peer's.
pub struct UdpLink {
    sock: UdpSocket,
    wait: Wait,
    timeout: Duration,
    payload: usize,
    bufs: [Vec<u8>; 3],
    rbuf: Vec<u8>,
    kept: usize,
    messages: u64,
}

impl UdpLink {
    /// Binds a socket on `ip`.
    pub fn bind(spec: &TestSpec, ip: IpAddr, _side: Side) -> Result<UdpLink> {
        let sock = UdpSocket::bind(SocketAddr::new(ip, 0))?;
        grow_buffers(&sock);
        let timeout = Duration::from_millis(spec.timeout_ms);
        match spec.wait {
            Wait::Poll => sock.set_nonblocking(true)?,
            Wait::Block => sock.set_read_timeout(Some(timeout))?,
        }
        let payload = spec.segment.map(|s| s as usize).unwrap_or_else(|| udp_payload(&spec.device)).min(MAX_DATAGRAM);
        let cap = spec.max_block.max(ACK_BYTES);
        Ok(UdpLink {
            sock,
            wait: spec.wait,
            timeout,
            payload,
            bufs: [vec![0; cap], vec![0; cap], vec![0; cap]],
            rbuf: vec![0; cap + MAX_DATAGRAM],
            kept: 0,
            messages: 0,
        })
    }

    /// The local port.
    pub fn port(&self) -> u16 {
        self.sock.local_addr().map(|a| a.port()).unwrap_or(0)
    }

    /// Sends to and receives from `peer` only.
    pub fn connect_to(&mut self, peer: SocketAddr) -> Result<()> {
        self.sock.connect(peer)?;
        Ok(())
    }
}

/// Socket buffers big enough for a burst of a few MiB.
fn grow_buffers(sock: &UdpSocket) {
    let bytes: libc::c_int = 16 << 20;
    for (force, plain) in [(libc::SO_RCVBUFFORCE, libc::SO_RCVBUF), (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF)] {
        let set = |opt| {
            // SAFETY: setsockopt with an int option on our socket.
            unsafe {
                libc::setsockopt(
                    sock.as_raw_fd(),
                    libc::SOL_SOCKET,
                    opt,
                    &bytes as *const libc::c_int as *const libc::c_void,
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            }
        };
        if set(force) != 0 {
            set(plain);
        }
    }
}

impl Link for UdpLink {
    fn prepare(&mut self, len: usize, seeds: [u64; 3]) -> Result<()> {
        for (buf, seed) in self.bufs.iter_mut().zip(seeds) {
            pattern::fill(seed, &mut buf[..len]);
        }
        Ok(())
    }

    fn send(&mut self, which: Which, len: usize) -> Result<()> {
        let deadline = Deadline::after(self.timeout);
        let mut off = 0;
        let mut spins = 0u32;
        while off < len {
            let l = (len - off).min(self.payload);
            match self.sock.send(&self.bufs[which as usize][off..off + l]) {
                Ok(_) => {
                    off += l;
                    self.messages += 1;
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {
                    spins = spins.wrapping_add(1);
                    if spins.is_multiple_of(65536) {
                        deadline.check("UDP send")?;
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    fn recv(&mut self, len: usize, keep: bool) -> Result<()> {
        let deadline = Deadline::after(self.timeout);
        let mut got = 0;
        let mut spins = 0u32;
        while got < len {
            match self.sock.recv(&mut self.rbuf[got..got + MAX_DATAGRAM]) {
                Ok(n) => got += n,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted | ErrorKind::TimedOut) => {
                    spins = spins.wrapping_add(1);
                    if self.wait == Wait::Block || spins.is_multiple_of(65536) {
                        deadline.check("UDP receive (a datagram was lost?)")?;
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        if got != len {
            return Err(Error::new(format!("received {got} bytes for a {len}-byte block")));
        }
        if keep {
            self.kept = len;
        }
        Ok(())
    }

    fn verify(&self, seed: u64, len: usize) -> Result<()> {
        if self.kept != len {
            return Err(Error::new(format!("kept {} bytes of a {len}-byte block", self.kept)));
        }
        pattern::check(seed, 0, &self.rbuf[..len])
            .map_err(|k| Error::new(format!("byte {k} of a {len}-byte UDP block is wrong (reordered datagrams?)")))
    }

    fn finish(&mut self) -> Result<()> {
        Ok(())
    }

    fn stats(&self) -> LinkStats {
        LinkStats { messages: self.messages, ..Default::default() }
    }
}

impl Pending for UdpLink {
    fn info(&self) -> ServerInfo {
        ServerInfo { port: self.port(), ..Default::default() }
    }

    fn accept(self: Box<Self>) -> Result<Box<dyn LinkServer>> {
        Ok(self)
    }
}

impl LinkServer for UdpLink {
    fn complete(mut self: Box<Self>, peer: &PeerInfo, peer_ip: IpAddr) -> Result<Box<dyn Link>> {
        self.connect_to(SocketAddr::new(peer_ip, peer.port))?;
        Ok(self)
    }
}
