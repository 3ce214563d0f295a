//! The Ethernet side of a port: openvia packets as Ethernet frames
//! (`via_wire::frame`) between hosts on one link, past both kernels' IP
//! and UDP layers.
//!
//! A packet socket on the interface that holds the device's address sends
//! the frames.  It takes the frames for this port only (a socket filter on
//! the frame's port) into a ring it shares with the kernel
//! (`PACKET_RX_RING`): a poll that finds nothing reads memory instead of
//! making a system call, and a frame that arrives is read without one.
//! Opening it needs `CAP_NET_RAW`; without it the port is UDP only.

use crate::transport::udp::peer_socket::{set_option, set_option_to};
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};
use via_wire::frame::{frame_header, ETHERTYPE, FRAME_HEADER_LEN, MAC_LEN};

/// Bytes of one ring slot: the kernel's slot header, then the frame.
const SLOT: usize = 2048;
/// Bytes of one block of the ring (a multiple of the page size and of `SLOT`).
const BLOCK: usize = 64 << 10;
/// Blocks in the ring: 512 slots.
const BLOCKS: usize = 16;
/// Frames taken in one poll at most, so other sockets get their turn.
const BATCH: usize = 64;

/// Frame bytes a slot holds: what is left after the header and the
/// kernel's alignment of the frame (`TPACKET2_HDRLEN` rounded, plus room
/// for a link header it may reserve).
const SLOT_ROOM: usize = SLOT - 128;

/// The Ethernet side of one port.
pub(crate) struct EtherSocket {
    fd: OwnedFd,
    ring: *mut u8,
    /// This interface's Ethernet address.
    pub mac: [u8; MAC_LEN],
    /// The interface, for the neighbour table.
    ifindex: i32,
    /// The longest packet a frame may carry on this interface.
    pub max_packet: usize,
}

// SAFETY: the ring is only read through `take`, whose caller holds the
// port's engine lock (the only cursor); the pointer itself never changes.
unsafe impl Send for EtherSocket {}
unsafe impl Sync for EtherSocket {}

impl EtherSocket {
    /// Opens the Ethernet side of the port at `ip`:`port`, if `ip` belongs
    /// to an Ethernet interface and the process may open a packet socket.
    pub(crate) fn open(ip: Ipv4Addr, port: u16) -> std::io::Result<EtherSocket> {
        let (ifindex, mac, mtu) = interface_of(ip)?;
        // SAFETY: plain socket call; protocol 0 takes nothing until bind.
        let raw =
            unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK, 0) };
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        attach_filter(fd.as_raw_fd(), port)?;
        let version = libc::tpacket_versions::TPACKET_V2 as libc::c_int;
        set_option_to(fd.as_raw_fd(), libc::SOL_PACKET, libc::PACKET_VERSION, &version)?;
        let req = libc::tpacket_req {
            tp_block_size: BLOCK as u32,
            tp_block_nr: BLOCKS as u32,
            tp_frame_size: SLOT as u32,
            tp_frame_nr: (BLOCK / SLOT * BLOCKS) as u32,
        };
        set_option_to(fd.as_raw_fd(), libc::SOL_PACKET, libc::PACKET_RX_RING, &req)?;
        // Frames skip the queueing discipline: the session paces itself.
        set_option(&fd, libc::SOL_PACKET, libc::PACKET_QDISC_BYPASS, 1)?;
        // SAFETY: maps the ring the kernel just allocated for this socket.
        let ring = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                BLOCK * BLOCKS,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ring == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let socket = EtherSocket {
            fd,
            ring: ring as *mut u8,
            mac,
            ifindex,
            max_packet: (mtu + 14).min(SLOT_ROOM) - FRAME_HEADER_LEN,
        };
        // SAFETY: a zeroed sockaddr_ll is valid; the fields are set below.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = ETHERTYPE.to_be();
        addr.sll_ifindex = ifindex;
        // SAFETY: binds to a valid address of the right length.
        let r = unsafe {
            libc::bind(
                socket.fd.as_raw_fd(),
                &addr as *const libc::sockaddr_ll as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(socket)
    }

    pub(crate) fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Hands each frame waiting in the ring, from slot `*cursor` on, to
    /// `f` (an empty slice for one the kernel cut short), then gives its
    /// slot back.  The caller must be the ring's only reader.  Returns
    /// whether any came.
    pub(crate) fn take(&self, cursor: &mut usize, mut f: impl FnMut(&[u8])) -> bool {
        let slots = BLOCK / SLOT * BLOCKS;
        let mut n = 0;
        while n < BATCH {
            // SAFETY: `*cursor < slots`, so the slot lies inside the mapping.
            let slot = unsafe { self.ring.add(*cursor * SLOT) };
            let header = slot as *mut libc::tpacket2_hdr;
            // SAFETY: slots are aligned to SLOT and start with the kernel's
            // header, whose status word the kernel and we share.
            let status = unsafe { AtomicU32::from_ptr(std::ptr::addr_of_mut!((*header).tp_status)) };
            if status.load(Ordering::Acquire) & libc::TP_STATUS_USER == 0 {
                break;
            }
            // SAFETY: the status says the kernel is done with the header;
            // its fields are read through the pointer, without a reference
            // over the status word that is stored to below.
            let (start, len, full) = unsafe { ((*header).tp_mac, (*header).tp_snaplen, (*header).tp_len) };
            // The kernel owns nothing of this slot until the status is
            // written back; its offsets are still checked against the slot.
            let (start, len) = (start as usize, len as usize);
            let whole =
                full as usize == len && start >= std::mem::size_of::<libc::tpacket2_hdr>() && start + len <= SLOT;
            let bytes: &[u8] = if whole {
                // SAFETY: `start..start + len` lies inside this slot, which
                // is ours until the status store below.
                unsafe { std::slice::from_raw_parts(slot.add(start), len) }
            } else {
                &[]
            };
            f(bytes);
            status.store(0, Ordering::Release);
            *cursor = (*cursor + 1) % slots;
            n += 1;
        }
        n > 0
    }

    /// Sends `packet` as a frame to the port `port` of the host at `dst`.
    /// Returns false if the kernel did not take it whole.
    pub(crate) fn send(&self, dst: [u8; MAC_LEN], port: u16, packet: &[u8]) -> bool {
        let header = frame_header(dst, self.mac, port, packet.len() as u16);
        let mut iov = [
            libc::iovec { iov_base: header.as_ptr() as *mut libc::c_void, iov_len: header.len() },
            libc::iovec { iov_base: packet.as_ptr() as *mut libc::c_void, iov_len: packet.len() },
        ];
        // SAFETY: a zeroed msghdr is valid; it points at the two live buffers.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = 2;
        // SAFETY: sends from valid buffers on our socket.
        let sent = unsafe { libc::sendmsg(self.fd.as_raw_fd(), &msg, 0) };
        sent == (header.len() + packet.len()) as isize
    }

    /// Whether the host at `peer` is on this interface's link with the
    /// Ethernet address `mac`: the kernel's neighbour table says so.
    pub(crate) fn on_link(&self, peer: IpAddr, mac: [u8; MAC_LEN]) -> bool {
        crate::transport::udp::neighbours::lookup(self.ifindex, peer) == Some(mac)
    }
}

impl Drop for EtherSocket {
    fn drop(&mut self) {
        // SAFETY: unmaps the ring mapped in `open`; nothing refers to it now.
        unsafe { libc::munmap(self.ring as *mut libc::c_void, BLOCK * BLOCKS) };
    }
}

/// The interface that holds `ip`: its index, Ethernet address and MTU.
fn interface_of(ip: Ipv4Addr) -> std::io::Result<(i32, [u8; MAC_LEN], usize)> {
    let missing = || std::io::Error::new(std::io::ErrorKind::NotFound, "no Ethernet interface holds the address");
    let interface = viad_client::netif::interfaces()?
        .into_iter()
        .find(|i| !i.is_loopback() && i.ipv4().any(|a| a == ip))
        .ok_or_else(missing)?;
    let mac = interface.mac.ok_or_else(missing)?;
    let index = i32::try_from(interface.index).ok().filter(|&i| i > 0).ok_or_else(missing)?;
    let mtu = viad_client::netif::mtu(&interface.name).map_or(1500, |m| m as usize);
    Ok((index, mac, mtu))
}

/// Whether a port on the device with IPv4 address `ip` can send Ethernet
/// frames: an Ethernet interface holds the address and this process may
/// open a packet socket (`CAP_NET_RAW`).  The error says why not.
pub fn frames_possible(ip: Ipv4Addr) -> Result<(), String> {
    interface_of(ip).map_err(|e| format!("{e}"))?;
    // SAFETY: plain socket call; protocol 0 takes nothing.
    let raw = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(format!("no packet socket: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: `raw` is a fresh descriptor that nothing else owns.
    drop(unsafe { OwnedFd::from_raw_fd(raw) });
    Ok(())
}

/// A classic BPF program: frames of openvia's EtherType whose port is
/// `port` are taken whole, every other frame is left.
fn attach_filter(fd: RawFd, port: u16) -> std::io::Result<()> {
    const LDH_ABS: u16 = 0x28; // BPF_LD | BPF_H | BPF_ABS
    const JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
    const RET_K: u16 = 0x06; // BPF_RET | BPF_K
    let op = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
    let mut program = [
        op(LDH_ABS, 0, 0, 12),
        op(JEQ_K, 0, 3, ETHERTYPE as u32),
        op(LDH_ABS, 0, 0, 14),
        op(JEQ_K, 0, 1, port as u32),
        op(RET_K, 0, 0, u32::MAX),
        op(RET_K, 0, 0, 0),
    ];
    let prog = libc::sock_fprog { len: program.len() as u16, filter: program.as_mut_ptr() };
    set_option_to(fd, libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, &prog)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_slot_header_is_the_kernels() {
        assert_eq!(std::mem::size_of::<libc::tpacket2_hdr>(), 32);
    }
}
