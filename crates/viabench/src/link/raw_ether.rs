//! A bare Ethernet ping-pong: blocks cut into frames that fill the
//! interface's MTU, sent with `sendmmsg` on a packet socket and taken from a
//! receive ring shared with the kernel (`PACKET_RX_RING`), polled by reading
//! the next slot's status.  No header past Ethernet's but a length, no
//! reliability: a lost frame fails the run.  The floor under openvia's
//! Ethernet frames, as `raw-udp` is under its datagrams.  Needs
//! `CAP_NET_RAW`.

use super::{interface_of, set_int_option, set_option, Deadline, Link, LinkServer, LinkStats, Pending, Side};
use crate::error::{Error, Result};
use crate::pattern::{self, Which};
use crate::proto::{PeerInfo, ServerInfo, TestSpec, Wait, ACK_BYTES};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// IEEE 802's "local experimental EtherType 2": never openvia's own.
const ETHERTYPE: u16 = 0x88B6;
/// Ethernet header and the 2-byte length of the payload.
const HEADER: usize = 16;
/// Frames in one `sendmmsg`.
const BATCH: usize = 64;
/// Bytes of the receive ring.
const RING_BYTES: usize = 32 << 20;
/// Bytes of a ring block.
const BLOCK: usize = 1 << 20;
/// Room for the kernel's slot header in front of a frame.
const SLOT_HEADROOM: usize = 128;

/// A packet socket on the device's interface, with its receive ring.
pub struct EtherLink {
    fd: OwnedFd,
    ring: *mut u8,
    slot: usize,
    slots: usize,
    next: usize,
    mac: [u8; 6],
    peer: [u8; 6],
    wait: Wait,
    timeout: Duration,
    /// Payload bytes per frame.
    payload: usize,
    bufs: [Vec<u8>; 3],
    rbuf: Vec<u8>,
    kept: usize,
    messages: u64,
}

impl EtherLink {
    /// Opens the socket on the interface behind `spec.device`.
    pub fn open(spec: &TestSpec, _side: Side) -> Result<EtherLink> {
        let ifname = interface_of(&spec.device).to_string();
        // On the loopback both ends' sockets would take every frame, their
        // own included, from the same all-zero address.
        if ifname == "lo" {
            return Err(Error::new("raw-ether needs an Ethernet interface between two hosts, not the loopback"));
        }
        let sys = |what: &str| format!("/sys/class/net/{ifname}/{what}");
        let read = |what: &str| std::fs::read_to_string(sys(what)).map(|s| s.trim().to_string());
        let mtu: usize = read("mtu").ok().and_then(|s| s.parse().ok()).unwrap_or(1500);
        let mac = parse_mac(&read("address").map_err(|e| Error::new(format!("interface {ifname}: {e}")))?)
            .ok_or_else(|| Error::new(format!("interface {ifname} has no Ethernet address")))?;
        let ifindex: i32 = read("ifindex").ok().and_then(|s| s.parse().ok()).unwrap_or(0);
        // SAFETY: plain socket call; protocol 0 takes nothing until bind.
        let raw = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            let e = std::io::Error::last_os_error();
            return Err(Error::new(format!("raw-ether needs a packet socket (CAP_NET_RAW): {e}")));
        }
        // SAFETY: a fresh descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        set_int_option(&fd, libc::SOL_PACKET, libc::PACKET_VERSION, libc::tpacket_versions::TPACKET_V2 as libc::c_int)?;
        let slot = (mtu + 14 + SLOT_HEADROOM).next_power_of_two();
        let req = libc::tpacket_req {
            tp_block_size: BLOCK.max(slot) as u32,
            tp_block_nr: (RING_BYTES / BLOCK.max(slot)) as u32,
            tp_frame_size: slot as u32,
            tp_frame_nr: (RING_BYTES / slot) as u32,
        };
        set_option(&fd, libc::SOL_PACKET, libc::PACKET_RX_RING, &req)?;
        set_int_option(&fd, libc::SOL_PACKET, libc::PACKET_QDISC_BYPASS, 1)?;
        // SAFETY: maps the ring the kernel just allocated for the socket.
        let ring = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                RING_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ring == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error().into());
        }
        // SAFETY: a zeroed sockaddr_ll is valid; the fields are set below.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = ETHERTYPE.to_be();
        addr.sll_ifindex = ifindex;
        let link = EtherLink {
            fd,
            ring: ring as *mut u8,
            slot,
            slots: RING_BYTES / slot,
            next: 0,
            mac,
            peer: [0; 6],
            wait: spec.wait,
            timeout: Duration::from_millis(spec.timeout_ms),
            payload: mtu - 2,
            bufs: std::array::from_fn(|_| vec![0; spec.max_block.max(ACK_BYTES)]),
            rbuf: vec![0; spec.max_block.max(ACK_BYTES)],
            kept: 0,
            messages: 0,
        };
        // SAFETY: binds to a valid address of the right length.
        let r = unsafe {
            libc::bind(
                link.fd.as_raw_fd(),
                &addr as *const libc::sockaddr_ll as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        Ok(link)
    }

    /// This side's Ethernet address.
    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }

    /// Sends to and receives from the interface at `peer` only.
    pub fn connect_to(&mut self, peer: [u8; 6]) {
        self.peer = peer;
    }

    /// The payload of the next frame in the ring, copied to `out` (at most
    /// its length); `None` if none has come.  Returns the payload length.
    fn take_frame(&mut self, out: &mut [u8]) -> Result<Option<usize>> {
        // SAFETY: next < slots: the slot lies inside the mapping.
        let base = unsafe { self.ring.add(self.next * self.slot) };
        let h = base as *mut libc::tpacket2_hdr;
        // SAFETY: a slot begins with the kernel's header, whose status word
        // the kernel and we share.
        let status = unsafe { AtomicU32::from_ptr(std::ptr::addr_of_mut!((*h).tp_status)) };
        if status.load(Ordering::Acquire) & libc::TP_STATUS_USER == 0 {
            return Ok(None);
        }
        // SAFETY: the kernel is done with the header; read through the
        // pointer, without a reference over the status word.
        let (start, len, full) = unsafe { ((*h).tp_mac as usize, (*h).tp_snaplen as usize, (*h).tp_len as usize) };
        let got = if start + len <= self.slot && len >= HEADER && full == len {
            // SAFETY: start..start + len lies inside the slot, ours until released.
            let frame = unsafe { std::slice::from_raw_parts(base.add(start), len) };
            let n = u16::from_be_bytes([frame[14], frame[15]]) as usize;
            if frame[6..12] != self.peer[..] || n > len - HEADER || n > out.len() {
                Err(Error::new("a frame from elsewhere or of a bad length"))
            } else {
                out[..n].copy_from_slice(&frame[HEADER..HEADER + n]);
                Ok(Some(n))
            }
        } else {
            Err(Error::new("a frame cut short by the ring"))
        };
        status.store(0, Ordering::Release);
        self.next = (self.next + 1) % self.slots;
        got
    }

    /// Sleeps until the ring may hold a frame (blocking waits).
    fn sleep(&self) {
        let mut p = libc::pollfd { fd: self.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, 100) };
    }
}

fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let bytes: Vec<u8> = s.split(':').map(|b| u8::from_str_radix(b, 16)).collect::<std::result::Result<_, _>>().ok()?;
    bytes.try_into().ok()
}

impl Link for EtherLink {
    fn prepare(&mut self, len: usize, seeds: [u64; 3]) -> Result<()> {
        for (buf, seed) in self.bufs.iter_mut().zip(seeds) {
            pattern::fill(seed, &mut buf[..len]);
        }
        Ok(())
    }

    fn send(&mut self, which: Which, len: usize) -> Result<()> {
        let deadline = Deadline::after(self.timeout);
        let data = &self.bufs[which as usize][..len];
        // A block of 0 bytes is one empty frame.
        let frames = len.div_ceil(self.payload).max(1);
        // On the stack, so that a block costs no allocation.
        let mut headers = [[0u8; HEADER]; BATCH];
        let mut iov = [[libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; 2]; BATCH];
        // SAFETY: a zeroed mmsghdr is valid; the iovecs are set below.
        let mut msgs: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
        let mut spins = 0u32;
        let mut first = 0;
        while first < frames {
            let count = (frames - first).min(BATCH);
            let chunk = |k: usize| {
                let off = ((first + k) * self.payload).min(len);
                &data[off..(off + self.payload).min(len)]
            };
            for (k, h) in headers[..count].iter_mut().enumerate() {
                h[..6].copy_from_slice(&self.peer);
                h[6..12].copy_from_slice(&self.mac);
                h[12..14].copy_from_slice(&ETHERTYPE.to_be_bytes());
                h[14..16].copy_from_slice(&(chunk(k).len() as u16).to_be_bytes());
            }
            for (k, v) in iov[..count].iter_mut().enumerate() {
                let c = chunk(k);
                *v = [
                    libc::iovec { iov_base: headers[k].as_ptr() as *mut libc::c_void, iov_len: HEADER },
                    libc::iovec { iov_base: c.as_ptr() as *mut libc::c_void, iov_len: c.len() },
                ];
            }
            for (m, v) in msgs[..count].iter_mut().zip(iov.iter_mut()) {
                m.msg_hdr.msg_iov = v.as_mut_ptr();
                m.msg_hdr.msg_iovlen = 2;
            }
            let mut done = 0;
            while done < count {
                let rest = &mut msgs[done..count];
                // SAFETY: every message points at live buffers.
                let r = unsafe { libc::sendmmsg(self.fd.as_raw_fd(), rest.as_mut_ptr(), rest.len() as u32, 0) };
                if r > 0 {
                    done += r as usize;
                    continue;
                }
                let e = std::io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EAGAIN | libc::ENOBUFS | libc::EINTR) => {
                        spins = spins.wrapping_add(1);
                        if spins.is_multiple_of(4096) {
                            deadline.check("sending frames")?;
                        }
                    }
                    _ => return Err(e.into()),
                }
            }
            self.messages += count as u64;
            first += count;
        }
        Ok(())
    }

    fn recv(&mut self, len: usize, keep: bool) -> Result<()> {
        let deadline = Deadline::after(self.timeout);
        let mut got = 0;
        let mut frames = 0;
        let mut spins = 0u32;
        let want_frames = len.div_ceil(self.payload).max(1);
        let mut rbuf = std::mem::take(&mut self.rbuf);
        while frames < want_frames {
            match self.take_frame(&mut rbuf[got..]) {
                Ok(Some(n)) => {
                    got += n;
                    frames += 1;
                }
                Ok(None) => {
                    spins = spins.wrapping_add(1);
                    if self.wait == Wait::Block {
                        self.sleep();
                    }
                    if self.wait == Wait::Block || spins.is_multiple_of(65536) {
                        if let Err(e) = deadline.check("frames (one was lost?)") {
                            self.rbuf = rbuf;
                            return Err(e);
                        }
                    }
                }
                Err(e) => {
                    self.rbuf = rbuf;
                    return Err(e);
                }
            }
        }
        self.rbuf = rbuf;
        if got != len {
            return Err(Error::new(format!("{got} bytes in the frames of a {len}-byte block")));
        }
        if keep {
            self.kept = len;
        }
        Ok(())
    }

    fn verify(&self, seed: u64, len: usize) -> Result<()> {
        super::verify_kept(self.kept, &self.rbuf, seed, len, "block in frames is wrong")
    }

    fn finish(&mut self) -> Result<()> {
        Ok(())
    }

    fn stats(&self) -> LinkStats {
        LinkStats { messages: self.messages, ..Default::default() }
    }
}

impl Drop for EtherLink {
    fn drop(&mut self) {
        // SAFETY: unmaps the ring mapped in `open`.
        unsafe { libc::munmap(self.ring as *mut libc::c_void, RING_BYTES) };
    }
}

impl Pending for EtherLink {
    fn info(&self) -> ServerInfo {
        ServerInfo { mac: Some(self.mac), ..Default::default() }
    }

    fn accept(self: Box<Self>) -> Result<Box<dyn LinkServer>> {
        Ok(self)
    }
}

impl LinkServer for EtherLink {
    fn complete(mut self: Box<Self>, peer: &PeerInfo, _peer_ip: std::net::IpAddr) -> Result<Box<dyn Link>> {
        let mac = peer.mac.ok_or_else(|| Error::new("the client sent no Ethernet address"))?;
        self.connect_to(mac);
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_as_sysfs_prints_them() {
        assert_eq!(parse_mac("1a:c7:4b:a0:8f:d2"), Some([0x1a, 0xc7, 0x4b, 0xa0, 0x8f, 0xd2]));
        assert_eq!(parse_mac("00:00:00:00:00"), None);
        assert_eq!(parse_mac("zz:00:00:00:00:00"), None);
    }
}
