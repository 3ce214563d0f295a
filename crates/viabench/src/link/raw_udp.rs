//! A bare UDP ping-pong: blocks cut into datagrams of the path's payload
//! size, no header, no reliability.  The floor under the UDP transport of
//! openvia; a lost datagram fails the run instead of being retransmitted.
//! Like openvia's transport, it hands the kernel up to 64 datagrams at once
//! as a segmentation-offload buffer (`UDP_SEGMENT`) and takes them coalesced
//! (`UDP_GRO`) where the kernel allows, so its throughput is the floor too.
//!
//! The rendezvous patterns move each block after a request and an answer,
//! one small datagram each way, as openvia's rendezvous does before its
//! RDMA write: the floor of that exchange on this path, beside TCP's plain
//! blocks.

use super::{set_int_option, set_socket_buffers, udp_payload, Deadline, Link, LinkServer, LinkStats, Pending, Side};
use crate::error::{Error, Result};
use crate::pattern::{self, Which};
use crate::proto::{PeerInfo, ServerInfo, TestSpec, Wait, ACK_BYTES};
use std::io::ErrorKind;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::Duration;

/// Largest UDP payload.
const MAX_DATAGRAM: usize = 65507;
/// Largest read: a buffer of coalesced datagrams (`UDP_GRO`).
const MAX_READ: usize = 65535;
/// Most datagrams in one segmentation-offload buffer.
const GSO_MAX_SEGMENTS: usize = 64;
/// A rendezvous request and answer: their tag, then the block's length.
const REQUEST: u32 = 0x5251_4551;
const ANSWER: u32 = 0x414e_5357;
const CONTROL_BYTES: usize = 12;

/// A UDP socket connected to the peer's.
pub struct UdpLink {
    sock: UdpSocket,
    wait: Wait,
    timeout: Duration,
    payload: usize,
    bufs: [Vec<u8>; 3],
    rbuf: Vec<u8>,
    /// Bytes of the next block that arrived coalesced with the last one,
    /// at `rbuf[carry_at..]`.
    carry: usize,
    carry_at: usize,
    /// Whether sends may use `UDP_SEGMENT` (until the kernel refuses it).
    gso: bool,
    kept: usize,
    messages: u64,
    /// Blocks go after a request and an answer (the rendezvous patterns).
    rendezvous: bool,
    /// Rendezvous: the block kept for `verify`, which the requests and
    /// answers taken since would have overwritten in `rbuf`.
    kept_block: Vec<u8>,
}

impl UdpLink {
    /// Binds a socket on `ip`.
    pub fn bind(spec: &TestSpec, ip: IpAddr, _side: Side) -> Result<UdpLink> {
        let sock = UdpSocket::bind(SocketAddr::new(ip, 0))?;
        // Big enough for a burst of a few MiB; what the kernel allows otherwise.
        let _ = set_socket_buffers(&sock, 16 << 20);
        let timeout = Duration::from_millis(spec.timeout_ms);
        match spec.wait {
            Wait::Poll => sock.set_nonblocking(true)?,
            Wait::Block => sock.set_read_timeout(Some(timeout))?,
        }
        let payload = spec.segment.map(|s| s as usize).unwrap_or_else(|| udp_payload(&spec.device)).min(MAX_DATAGRAM);
        let cap = spec.max_block.max(ACK_BYTES);
        // Coalesced receives where the kernel has them; single datagrams otherwise.
        let _ = set_int_option(&sock, libc::SOL_UDP, libc::UDP_GRO, 1);
        Ok(UdpLink {
            sock,
            wait: spec.wait,
            timeout,
            payload,
            bufs: [vec![0; cap], vec![0; cap], vec![0; cap]],
            rbuf: vec![0; cap + MAX_READ],
            carry: 0,
            carry_at: 0,
            gso: true,
            kept: 0,
            messages: 0,
            rendezvous: spec.pattern.is_rendezvous(),
            kept_block: Vec::new(),
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

/// Sends `data` as datagrams of `segment` bytes in one segmentation-offload
/// buffer.
fn send_segmented(sock: &UdpSocket, data: &[u8], segment: u16) -> std::io::Result<usize> {
    let mut iov = libc::iovec { iov_base: data.as_ptr() as *mut libc::c_void, iov_len: data.len() };
    let mut control = [0u64; 3];
    // SAFETY: a zeroed msghdr is valid; it points at `iov` and `control`,
    // which outlive the call, and CMSG_SPACE of a u16 (24 bytes) fits `control`.
    let r = unsafe {
        let mut h: libc::msghdr = std::mem::zeroed();
        h.msg_iov = &mut iov;
        h.msg_iovlen = 1;
        h.msg_control = control.as_mut_ptr() as *mut libc::c_void;
        h.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<u16>() as u32) as _;
        let c = libc::CMSG_FIRSTHDR(&h);
        (*c).cmsg_level = libc::SOL_UDP;
        (*c).cmsg_type = libc::UDP_SEGMENT;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<u16>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut u16, segment);
        libc::sendmsg(sock.as_raw_fd(), &h, 0)
    };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// What `sendmsg` answers when the kernel or device cannot take a
/// segmentation-offload buffer.
const GSO_REFUSED: [i32; 5] = [libc::EIO, libc::EINVAL, libc::EMSGSIZE, libc::EOPNOTSUPP, libc::ENOPROTOOPT];

impl Link for UdpLink {
    fn prepare(&mut self, len: usize, seeds: [u64; 3]) -> Result<()> {
        for (buf, seed) in self.bufs.iter_mut().zip(seeds) {
            pattern::fill(seed, &mut buf[..len]);
        }
        Ok(())
    }

    fn send(&mut self, which: Which, len: usize) -> Result<()> {
        if self.rendezvous {
            self.send_control(REQUEST, len)?;
            self.take_control(ANSWER, len)?;
        }
        let deadline = Deadline::after(self.timeout);
        let mut off = 0;
        let mut spins = 0u32;
        let per_buffer = GSO_MAX_SEGMENTS.min(MAX_DATAGRAM / self.payload).max(1);
        while off < len {
            let datagrams = ((len - off).div_ceil(self.payload)).min(if self.gso { per_buffer } else { 1 });
            let l = (len - off).min(self.payload * datagrams);
            let data = &self.bufs[which as usize][off..off + l];
            let sent = if datagrams > 1 {
                send_segmented(&self.sock, data, self.payload as u16)
            } else {
                self.sock.send(data)
            };
            match sent {
                Ok(_) => {
                    off += l;
                    self.messages += datagrams as u64;
                }
                // A kernel or device without segmentation offload: one
                // datagram per call from now on.
                Err(e) if datagrams > 1 && e.raw_os_error().is_some_and(|c| GSO_REFUSED.contains(&c)) => {
                    self.gso = false;
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
        if self.rendezvous {
            self.take_control(REQUEST, len)?;
            self.send_control(ANSWER, len)?;
        }
        self.take(len)?;
        if keep {
            self.kept = len;
            if self.rendezvous {
                // Untimed but for the last block.
                self.kept_block.clear();
                self.kept_block.extend_from_slice(&self.rbuf[..len]);
            }
        }
        Ok(())
    }

    fn verify(&self, seed: u64, len: usize) -> Result<()> {
        let kept = if self.rendezvous { &self.kept_block } else { &self.rbuf };
        super::verify_kept(self.kept, kept, seed, len, "UDP block is wrong (reordered datagrams?)")
    }

    fn finish(&mut self) -> Result<()> {
        Ok(())
    }

    fn stats(&self) -> LinkStats {
        LinkStats { messages: self.messages, ..Default::default() }
    }
}

impl UdpLink {
    /// Receives `len` bytes into `rbuf`, beginning with those that came
    /// coalesced with the last ones.
    fn take(&mut self, len: usize) -> Result<()> {
        let deadline = Deadline::after(self.timeout);
        // Datagrams of this block that came coalesced with the last one's.
        self.rbuf.copy_within(self.carry_at..self.carry_at + self.carry, 0);
        let mut got = std::mem::take(&mut self.carry);
        let mut spins = 0u32;
        while got < len {
            match self.sock.recv(&mut self.rbuf[got..got + MAX_READ]) {
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
        if got > len {
            // Coalesced datagrams ran on into the next block (streams).
            (self.carry, self.carry_at) = (got - len, len);
        }
        Ok(())
    }

    /// Sends a rendezvous request or answer for a block of `len` bytes.
    fn send_control(&mut self, tag: u32, len: usize) -> Result<()> {
        let deadline = Deadline::after(self.timeout);
        let mut message = [0u8; CONTROL_BYTES];
        message[..4].copy_from_slice(&tag.to_le_bytes());
        message[4..].copy_from_slice(&(len as u64).to_le_bytes());
        let mut spins = 0u32;
        loop {
            match self.sock.send(&message) {
                Ok(_) => {
                    self.messages += 1;
                    return Ok(());
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
    }

    /// Receives the rendezvous request or answer for a block of `len` bytes.
    fn take_control(&mut self, tag: u32, len: usize) -> Result<()> {
        self.take(CONTROL_BYTES)?;
        let got_tag = u32::from_le_bytes(self.rbuf[..4].try_into().expect("4 bytes"));
        let got_len = u64::from_le_bytes(self.rbuf[4..CONTROL_BYTES].try_into().expect("8 bytes"));
        if got_tag != tag || got_len != len as u64 {
            return Err(Error::new(format!(
                "UDP rendezvous: expected tag {tag:#x} for {len} bytes, got {got_tag:#x} for {got_len}"
            )));
        }
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A link on a loopback socket of its own, polling.
    fn loopback(rendezvous: bool, payload: usize) -> UdpLink {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        set_int_option(&sock, libc::SOL_UDP, libc::UDP_GRO, 1).expect("UDP_GRO");
        sock.set_nonblocking(true).unwrap();
        UdpLink {
            sock,
            wait: Wait::Poll,
            timeout: Duration::from_secs(5),
            payload,
            bufs: [vec![0; 20000], vec![0; 20000], vec![0; 20000]],
            rbuf: vec![0; 20000 + MAX_READ],
            carry: 0,
            carry_at: 0,
            gso: true,
            kept: 0,
            messages: 0,
            rendezvous,
            kept_block: Vec::new(),
        }
    }

    fn joined(rendezvous: bool) -> (UdpLink, UdpLink) {
        let (mut a, mut b) = (loopback(rendezvous, 1000), loopback(rendezvous, 1000));
        a.connect_to(b.sock.local_addr().unwrap()).unwrap();
        b.connect_to(a.sock.local_addr().unwrap()).unwrap();
        (a, b)
    }

    #[test]
    fn datagrams_coalesced_past_a_block_begin_the_next() {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        set_int_option(&sock, libc::SOL_UDP, libc::UDP_GRO, 1).expect("UDP_GRO");
        sock.set_nonblocking(true).unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        tx.connect(sock.local_addr().unwrap()).unwrap();
        let mut rx = UdpLink {
            sock,
            wait: Wait::Poll,
            timeout: Duration::from_secs(5),
            payload: 1000,
            bufs: [vec![], vec![], vec![]],
            rbuf: vec![0; 2000 + MAX_READ],
            carry: 0,
            carry_at: 0,
            gso: true,
            kept: 0,
            messages: 0,
            rendezvous: false,
            kept_block: Vec::new(),
        };
        // Two 2000-byte blocks in one offload buffer of four datagrams: the
        // loopback hands them to the socket coalesced, in one read.
        let mut data = vec![0u8; 4000];
        pattern::fill(1, &mut data[..2000]);
        pattern::fill(2, &mut data[2000..]);
        assert_eq!(send_segmented(&tx, &data, 1000).unwrap(), 4000);
        rx.recv(2000, true).unwrap();
        assert_eq!(rx.carry, 2000, "the second block came in the same read");
        rx.verify(1, 2000).unwrap();
        rx.recv(2000, true).unwrap();
        assert_eq!(rx.carry, 0);
        rx.verify(2, 2000).unwrap();
    }

    #[test]
    fn a_rendezvous_block_follows_a_request_and_an_answer() {
        let (mut a, mut b) = joined(true);
        a.prepare(12345, [7, 8, 9]).unwrap();
        let receiver = std::thread::spawn(move || {
            b.recv(12345, true).unwrap();
            b.verify(7, 12345).unwrap();
            b.recv(10, false).unwrap();
            // The block kept stays what it was after later exchanges.
            b.verify(7, 12345).unwrap();
            b.messages
        });
        a.send(Which::First, 12345).unwrap();
        a.send(Which::Middle, 10).unwrap();
        // Two requests from a, and two answers from b.
        assert_eq!(receiver.join().unwrap(), 2);
        assert_eq!(a.messages, 2 + 13 + 1);
    }

    #[test]
    fn a_block_where_a_request_was_due_is_refused() {
        let (mut plain, mut rendezvous) = (joined(false).0, joined(true).1);
        plain.connect_to(rendezvous.sock.local_addr().unwrap()).unwrap();
        rendezvous.connect_to(plain.sock.local_addr().unwrap()).unwrap();
        plain.prepare(3000, [1, 2, 3]).unwrap();
        plain.send(Which::First, 3000).unwrap();
        let e = rendezvous.recv(3000, true).unwrap_err();
        assert!(e.to_string().contains("rendezvous"), "{e}");
    }
}
