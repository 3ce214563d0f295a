//! Outgoing packets of the UDP transport: built with their payload left in
//! the application's registered buffers, and sent with as few system calls
//! as possible, runs of equal-size packets as one GSO buffer.
//!
//! A packet is its header, in a buffer of its own, and an iovec per piece of
//! payload, pointing into the buffers the descriptor gathers from: the
//! kernel copies the bytes once, straight from where the application put
//! them.  Short payloads, and payloads in more pieces than a packet
//! carries, are copied after the header instead.

use crate::net::{Gather, MAX_DATAGRAM};
use std::os::fd::RawFd;
use via_reliable::Transmit;
use via_wire::HEADER_LEN;

/// `UDP_SEGMENT` (linux/udp.h): the segment size of a GSO send.
pub(crate) const UDP_SEGMENT: libc::c_int = 103;
/// Most segments the kernel takes in one GSO send (`UDP_MAX_SEGMENTS` of
/// older kernels; newer ones take 128).
pub(crate) const GSO_MAX_SEGMENTS: usize = 64;
/// Payloads up to this many bytes are copied after the header: cheaper
/// than a second iovec, and a small message leaves as one buffer.
const COPY_BELOW: usize = 512;
/// Most payload pieces a packet points at; a payload in more is copied.
const MAX_PIECES: usize = 4;

/// One packet built for sending.
pub(crate) struct OutPacket {
    /// The header, and room for a payload copied after it.
    buf: Vec<u8>,
    /// Bytes of the packet, header included.
    len: usize,
    /// The payload where it lies (address, length); none when it is in `buf`.
    pieces: [(u64, usize); MAX_PIECES],
    npieces: usize,
}

impl OutPacket {
    /// An empty packet of up to `size` bytes.
    pub(crate) fn new(size: usize) -> OutPacket {
        OutPacket { buf: vec![0; size.max(HEADER_LEN)], len: 0, pieces: [(0, 0); MAX_PIECES], npieces: 0 }
    }

    /// A packet whose bytes are all in its buffer.
    #[cfg(test)]
    pub(crate) fn copied(bytes: &[u8]) -> OutPacket {
        let mut p = OutPacket::new(bytes.len());
        p.buf[..bytes.len()].copy_from_slice(bytes);
        p.len = bytes.len();
        p
    }

    /// Builds `t`, its payload from `gather` (a message that is gone sends
    /// zeros; the peer has acknowledged it already), and fills the checksum.
    pub(crate) fn build(&mut self, t: &Transmit, gather: Option<&Gather>) {
        let plen = t.payload.map_or(0, |p| p.len as usize).min(self.buf.len() - HEADER_LEN);
        t.header.emit(&mut self.buf, plen);
        self.len = HEADER_LEN + plen;
        self.npieces = 0;
        let (Some(p), Some(gather)) = (t.payload, gather) else {
            self.buf[HEADER_LEN..self.len].fill(0);
            via_wire::finish(&mut self.buf[..self.len]);
            return;
        };
        if plen >= COPY_BELOW {
            if let Some(n) = pieces(gather, p.offset as u64, plen, &mut self.pieces) {
                self.npieces = n;
                // SAFETY: the buffers were validated against the registry when
                // posted and stay registered until the descriptor completes.
                let payload =
                    self.pieces[..n].iter().map(|&(a, l)| unsafe { std::slice::from_raw_parts(a as *const u8, l) });
                via_wire::finish_split(&mut self.buf[..HEADER_LEN], payload);
                return;
            }
        }
        gather_bytes(gather, p.offset as u64, &mut self.buf[HEADER_LEN..self.len]);
        via_wire::finish(&mut self.buf[..self.len]);
    }

    /// The packet's iovecs: the header (with the payload when it was
    /// copied), then the payload's pieces; and how many of them there are.
    fn iovecs(&self) -> ([libc::iovec; 1 + MAX_PIECES], usize) {
        let empty = libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 };
        let mut iov = [empty; 1 + MAX_PIECES];
        let head = if self.npieces == 0 { self.len } else { HEADER_LEN };
        iov[0] = libc::iovec { iov_base: self.buf.as_ptr() as *mut libc::c_void, iov_len: head };
        for (v, &(addr, len)) in iov[1..].iter_mut().zip(&self.pieces[..self.npieces]) {
            *v = libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: len };
        }
        (iov, 1 + self.npieces)
    }
}

/// The pieces of `gather` that hold bytes `offset..offset + len`, into
/// `out`; `None` if there are more than `out` holds or the buffers end first.
fn pieces(gather: &Gather, mut offset: u64, len: usize, out: &mut [(u64, usize); MAX_PIECES]) -> Option<usize> {
    let mut n = 0;
    let mut left = len;
    for &(addr, seg) in gather {
        let seg = seg as u64;
        if offset >= seg {
            offset -= seg;
            continue;
        }
        if left == 0 {
            break;
        }
        if n == MAX_PIECES {
            return None;
        }
        let take = ((seg - offset) as usize).min(left);
        out[n] = (addr + offset, take);
        n += 1;
        left -= take;
        offset = 0;
    }
    (left == 0).then_some(n)
}

/// Copies bytes `offset..offset + out.len()` of the buffers `gather` into
/// `out`, zeros past their end.
pub(crate) fn gather_bytes(gather: &Gather, mut offset: u64, out: &mut [u8]) {
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

/// What [`send_groups`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sent {
    /// Packets handed to the kernel.
    pub packets: usize,
    /// Of which GSO buffers (of more than one packet).
    pub gso_buffers: usize,
    /// The kernel refused the GSO buffer starting at this packet (and it
    /// and the rest were not sent).
    pub refused: Option<usize>,
}

/// Sends `packets` to `addr` (`None`: the peer `fd` is connected to) on
/// `fd` with `sendmmsg`, runs of them as GSO buffers of segments up to
/// `max_segment` bytes (0: no GSO).  A full socket buffer drops the rest
/// (the session retransmits).
pub(crate) fn send_groups(
    fd: RawFd,
    addr: Option<&(libc::sockaddr_storage, libc::socklen_t)>,
    packets: &[OutPacket],
    max_segment: usize,
) -> Sent {
    if let [p] = packets {
        return send_one(fd, addr, p);
    }
    let groups = gso_groups(packets.iter().map(|p| p.len), max_segment);
    // Every iovec first: the vector must not move once messages point into it.
    let mut iov: Vec<libc::iovec> = Vec::with_capacity(packets.len() * 2);
    let mut spans = Vec::with_capacity(groups.len());
    for g in &groups {
        let start = iov.len();
        for p in &packets[g.start..g.start + g.count] {
            let (v, n) = p.iovecs();
            iov.extend_from_slice(&v[..n]);
        }
        spans.push((start, iov.len() - start));
    }
    let mut control: Vec<[u64; 3]> = vec![[0; 3]; groups.len()];
    let mut msgs: Vec<libc::mmsghdr> = Vec::with_capacity(groups.len());
    for ((g, ctrl), &(start, count)) in groups.iter().zip(control.iter_mut()).zip(&spans) {
        // SAFETY: a zeroed msghdr is valid; fields set below.
        let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
        if let Some((name, len)) = addr {
            h.msg_name = name as *const libc::sockaddr_storage as *mut libc::c_void;
            h.msg_namelen = *len;
        }
        h.msg_iov = iov[start..].as_mut_ptr();
        h.msg_iovlen = count;
        if g.count > 1 {
            set_segment_cmsg(&mut h, ctrl, g.segment as u16);
        }
        msgs.push(libc::mmsghdr { msg_hdr: h, msg_len: 0 });
    }
    let mut done = 0;
    let mut refused = None;
    while done < msgs.len() {
        let rest = &mut msgs[done..];
        // SAFETY: every header points at live buffers, iovecs, control
        // data and the address above.
        let r = unsafe { libc::sendmmsg(fd, rest.as_mut_ptr(), rest.len() as u32, 0) };
        if r > 0 {
            done += r as usize;
            continue;
        }
        let err = std::io::Error::last_os_error();
        if err.kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        // EIO: the device cannot checksum a GSO buffer; EINVAL, EMSGSIZE:
        // a limit of this kernel or route; ENOPROTOOPT, EOPNOTSUPP: no GSO.
        let gso_error = matches!(
            err.raw_os_error(),
            Some(libc::EIO | libc::EINVAL | libc::EMSGSIZE | libc::EOPNOTSUPP | libc::ENOPROTOOPT)
        );
        if groups[done].count > 1 && gso_error {
            refused = Some(groups[done].start);
        }
        break;
    }
    Sent {
        packets: groups[..done].iter().map(|g| g.count).sum(),
        gso_buffers: groups[..done].iter().filter(|g| g.count > 1).count(),
        refused,
    }
}

/// A run of packets that leaves as one message: `count` packets from
/// `start`, every one `segment` bytes but the last, which may be shorter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Group {
    start: usize,
    count: usize,
    segment: usize,
}

/// Cuts packets of lengths `lens` into GSO runs: consecutive packets of the
/// first one's length (at most `max_segment` bytes, at most
/// `GSO_MAX_SEGMENTS` of them, at most a UDP datagram in all), closed by
/// a shorter packet.  With `max_segment` 0, every packet is a run of its own.
fn gso_groups(lens: impl Iterator<Item = usize>, max_segment: usize) -> Vec<Group> {
    let mut groups: Vec<Group> = Vec::new();
    let mut total = 0;
    for (i, len) in lens.enumerate() {
        if let Some(g) = groups.last_mut() {
            let open = g.segment <= max_segment
                && g.count < GSO_MAX_SEGMENTS
                && len <= g.segment
                && total + len <= MAX_DATAGRAM
                && (g.count == 1 || total == g.count * g.segment);
            if open {
                g.count += 1;
                total += len;
                continue;
            }
        }
        groups.push(Group { start: i, count: 1, segment: len });
        total = len;
    }
    groups
}

/// Sends one packet, without building a batch or allocating: the path of
/// small messages and acknowledgements.
fn send_one(fd: RawFd, addr: Option<&(libc::sockaddr_storage, libc::socklen_t)>, packet: &OutPacket) -> Sent {
    let (name, len) = match addr {
        Some((name, len)) => (name as *const libc::sockaddr_storage as *const libc::sockaddr, *len),
        None => (std::ptr::null(), 0),
    };
    let (mut iov, n) = packet.iovecs();
    loop {
        let r = if n == 1 {
            // SAFETY: the packet and the address (if any) are live for the call.
            unsafe { libc::sendto(fd, iov[0].iov_base, iov[0].iov_len, 0, name, len) }
        } else {
            // SAFETY: a zeroed msghdr is valid; fields set below.
            let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
            h.msg_name = name as *mut libc::c_void;
            h.msg_namelen = len;
            h.msg_iov = iov.as_mut_ptr();
            h.msg_iovlen = n;
            // SAFETY: the header points at the iovecs above, whose buffers
            // are live for the call, and at the address, if any.
            unsafe { libc::sendmsg(fd, &h, 0) }
        };
        if r < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        return Sent { packets: (r >= 0) as usize, gso_buffers: 0, refused: None };
    }
}

/// Puts a `UDP_SEGMENT` control message with `segment` into `h`, in `buf`.
fn set_segment_cmsg(h: &mut libc::msghdr, buf: &mut [u64; 3], segment: u16) {
    // SAFETY: CMSG_SPACE of a u16 is 24 bytes on 64-bit Linux (and less
    // on 32-bit), which `buf` holds, suitably aligned; the header and data
    // are written inside it.
    unsafe {
        let space = libc::CMSG_SPACE(std::mem::size_of::<u16>() as u32) as usize;
        debug_assert!(space <= std::mem::size_of_val(buf));
        h.msg_control = buf.as_mut_ptr() as *mut libc::c_void;
        h.msg_controllen = space as _;
        let c = libc::CMSG_FIRSTHDR(h);
        (*c).cmsg_level = libc::SOL_UDP;
        (*c).cmsg_type = UDP_SEGMENT;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<u16>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut u16, segment);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use via_reliable::PayloadRef;
    use via_wire::{Header, Kind, Packet};

    #[test]
    fn gather_crosses_segment_boundaries() {
        let a = *b"hello ";
        let b = *b"world";
        let gather = vec![(a.as_ptr() as u64, 6), (b.as_ptr() as u64, 5)];
        let mut out = [0u8; 7];
        gather_bytes(&gather, 3, &mut out);
        assert_eq!(&out, b"lo worl");
        let mut past = [9u8; 4];
        gather_bytes(&gather, 9, &mut past);
        assert_eq!(&past, b"ld\0\0");
    }

    #[test]
    fn pieces_cover_the_range_or_give_up() {
        let gather: Gather = vec![(1000, 10), (2000, 5), (3000, 100)];
        let mut out = [(0, 0); MAX_PIECES];
        assert_eq!(pieces(&gather, 8, 10, &mut out), Some(3));
        assert_eq!(&out[..3], &[(1008, 2), (2000, 5), (3000, 3)]);
        assert_eq!(pieces(&gather, 15, 100, &mut out), Some(1));
        assert_eq!(out[0], (3000, 100));
        // Past the end of the buffers.
        assert_eq!(pieces(&gather, 15, 101, &mut out), None);
        // More pieces than a packet points at.
        let many: Gather = (0..8).map(|i| (i * 100, 1)).collect();
        assert_eq!(pieces(&many, 0, 4, &mut out), Some(4));
        assert_eq!(pieces(&many, 0, 5, &mut out), None);
    }

    /// The packet a transmit of `len` bytes at `offset` of message 1 builds.
    fn transmit(offset: u32, len: u32) -> Transmit {
        let header = Header { kind: Kind::Data, msg: 1, offset, total: 1 << 20, ..Header::default() };
        Transmit { header, payload: Some(PayloadRef { token: 1, offset, len }) }
    }

    /// The bytes the kernel would send for `p`, from its iovecs.
    fn wire_bytes(p: &OutPacket) -> Vec<u8> {
        let (iov, n) = p.iovecs();
        // SAFETY: the iovecs point at the live buffers of the test.
        iov[..n]
            .iter()
            .flat_map(|v| unsafe { std::slice::from_raw_parts(v.iov_base as *const u8, v.iov_len) })
            .copied()
            .collect()
    }

    #[test]
    fn a_packet_points_at_the_payload_or_copies_it_and_checksums_either() {
        let a: Vec<u8> = (0..3000u32).map(|i| (i * 13) as u8).collect();
        let b: Vec<u8> = (0..3000u32).map(|i| (i * 29 + 1) as u8).collect();
        let gather: Gather = vec![(a.as_ptr() as u64, 3000), (b.as_ptr() as u64, 3000)];
        let whole: Vec<u8> = a.iter().chain(&b).copied().collect();
        let mut p = OutPacket::new(HEADER_LEN + 1400);
        // In place across two buffers; copied when short; copied when the
        // buffers are in too many pieces; zeros for a message that is gone.
        let many: Gather = whole.chunks(100).map(|c| (c.as_ptr() as u64, c.len() as u32)).collect();
        for (offset, len, g, in_place) in [
            (2500u32, 1400u32, Some(&gather), true),
            (10, 100, Some(&gather), false),
            (0, 1400, Some(&many), false),
            (0, 1400, None, false),
        ] {
            p.build(&transmit(offset, len), g);
            assert_eq!(p.npieces > 0, in_place, "offset {offset} len {len}");
            let bytes = wire_bytes(&p);
            assert_eq!(bytes.len(), HEADER_LEN + len as usize);
            let checked = Packet::new_checked(&bytes[..]).expect("a valid packet");
            let want = match g {
                Some(_) => &whole[offset as usize..(offset + len) as usize],
                None => &vec![0u8; len as usize][..],
            };
            assert_eq!(checked.payload(), want);
        }
    }

    /// One packet whose payload stays in the application's buffer leaves
    /// with one `sendmsg` and arrives as the packet it was built as.
    #[test]
    fn a_lone_packet_in_place_goes_out_whole() {
        use std::net::UdpSocket;
        let data: Vec<u8> = (0..2000u32).map(|i| (i * 3) as u8).collect();
        let gather: Gather = vec![(data.as_ptr() as u64, 700), (data.as_ptr() as u64 + 700, 1300)];
        let mut p = OutPacket::new(HEADER_LEN + 1400);
        p.build(&transmit(100, 1400), Some(&gather));
        assert_eq!(p.npieces, 2);
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = crate::net::socket_addr(rx.local_addr().unwrap());
        assert_eq!(send_groups(std::os::fd::AsRawFd::as_raw_fd(&tx), Some(&addr), &[p], 0).packets, 1);
        rx.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 2048];
        let n = rx.recv(&mut buf).unwrap();
        let checked = Packet::new_checked(&buf[..n]).expect("a valid packet");
        assert_eq!(checked.payload(), &data[100..1500]);
    }

    fn groups(lens: &[usize], max_segment: usize) -> Vec<(usize, usize, usize)> {
        gso_groups(lens.iter().copied(), max_segment).iter().map(|g| (g.start, g.count, g.segment)).collect()
    }

    #[test]
    fn gso_groups_cut_at_limits_and_shorter_packets() {
        // Full packets of an MTU of 1500: 45 fit a UDP datagram.
        let full = vec![1452; 100];
        assert_eq!(groups(&full, 1472), vec![(0, 45, 1452), (45, 45, 1452), (90, 10, 1452)]);
        // Small packets: at most GSO_MAX_SEGMENTS per buffer.
        assert_eq!(groups(&[200; 70], 1472), vec![(0, 64, 200), (64, 6, 200)]);
        // A shorter packet ends its run; a longer one starts a new one.
        assert_eq!(groups(&[1000, 1000, 500, 1000, 80, 1000], 1472), vec![(0, 3, 1000), (3, 2, 1000), (5, 1, 1000)]);
        assert_eq!(groups(&[80, 1000, 1000], 1472), vec![(0, 1, 80), (1, 2, 1000)]);
        // Without GSO, or with segments over the MTU, every packet alone.
        assert_eq!(groups(&[1000, 1000], 0), vec![(0, 1, 1000), (1, 1, 1000)]);
        assert_eq!(groups(&[1500, 1500], 1472), vec![(0, 1, 1500), (1, 1, 1500)]);
        assert_eq!(groups(&[], 1472), vec![]);
        // Every buffer fits a UDP datagram.
        for g in gso_groups([9000; 20].into_iter(), 8972) {
            assert!(g.count * g.segment <= MAX_DATAGRAM || g.count == 1);
        }
    }
}
