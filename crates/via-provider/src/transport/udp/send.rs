//! Outgoing packets of the UDP transport: built back to back in one buffer,
//! and sent with as few system calls as possible, runs of equal-size
//! packets as one GSO buffer.
//!
//! A packet's payload is copied from the application's registered buffers
//! right after its header, and the checksum is computed over the copy while
//! it is in the cache.  A GSO buffer of such packets is then one contiguous
//! iovec: the kernel copies it in long runs, where an iovec per header and
//! per payload piece cost it more than the copy they avoided.  A payload of
//! a large packet (tens of KiB) is not copied: the kernel takes it from the
//! registered buffers themselves, after the header, and the checksum is
//! computed where it lies.

use crate::transport::udp::{Gather, MAX_DATAGRAM};
use smallvec::SmallVec;
use std::os::fd::RawFd;
use via_reliable::Transmit;
use via_wire::HEADER_LEN;

/// Most segments the kernel takes in one GSO send (`UDP_MAX_SEGMENTS` of
/// older kernels; newer ones take 128).
pub(crate) const GSO_MAX_SEGMENTS: usize = 64;
/// Most bytes of packets in one GSO buffer.  A device takes a GSO buffer
/// whole only up to 64 KiB with its link, IP and UDP headers; a longer one
/// the kernel cuts into datagrams in software, several times slower.
pub(crate) const GSO_MAX_BYTES: usize = 65536 - 64;
/// Payloads of at least this many bytes are sent from the application's
/// buffers rather than copied: only a large packet's are.  Below it, the
/// packets of a GSO run each add two iovecs, which cost the kernel more
/// than the copy saves.
const SEND_IN_PLACE_MIN: usize = 16 * 1024;

/// Packets built for sending: their headers and copied payloads back to
/// back in one buffer, and the payloads sent in place as pieces of the
/// registered buffers.
#[derive(Default)]
pub(crate) struct OutPackets {
    /// Headers and copied payloads, then room left from earlier batches.
    bytes: Vec<u8>,
    /// The packets, in order.
    built: Vec<Built>,
    /// Every packet's payload pieces sent in place: address and length.
    pieces: Vec<(u64, usize)>,
}

/// One packet of an [`OutPackets`].
#[derive(Debug, Clone, Copy)]
struct Built {
    /// Where its bytes in the buffer end (the whole packet, or its header
    /// if the payload is sent in place).
    end: usize,
    /// Its payload's pieces sent in place: `pieces[first_piece..end_piece]`,
    /// none if the payload is in the buffer.
    first_piece: u32,
    end_piece: u32,
    /// Its length on the wire.
    len: usize,
}

impl OutPackets {
    /// Forgets the packets, keeping the buffers.
    pub(crate) fn clear(&mut self) {
        self.built.clear();
        self.pieces.clear();
    }

    /// How many packets there are.
    pub(crate) fn len(&self) -> usize {
        self.built.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.built.is_empty()
    }

    /// The packets from the `at`th on.
    pub(crate) fn from(&self, at: usize) -> Packets<'_> {
        let start = at.checked_sub(1).map_or(0, |i| self.built[i].end);
        Packets { bytes: &self.bytes, pieces: &self.pieces, start, built: &self.built[at..] }
    }

    /// Builds `t` after the packets there are: its payload copied from
    /// `gather` (zeros for a message that is gone: the peer has
    /// acknowledged it already), or left in place if it is long, then the
    /// checksum.  The caller has made sure that `gather` is still
    /// registered memory (`Outbound::check`).
    pub(crate) fn push(&mut self, t: &Transmit, gather: Option<&Gather>) {
        let plen = t.payload.map_or(0, |p| p.len as usize).min(MAX_DATAGRAM - HEADER_LEN);
        if let (Some(p), Some(gather)) = (t.payload, gather) {
            if plen >= SEND_IN_PLACE_MIN && self.push_in_place(t, gather, p.offset as u64, plen) {
                return;
            }
        }
        let room = self.grow(HEADER_LEN + plen, HEADER_LEN + plen);
        let packet = &mut self.bytes[room];
        t.header.emit(packet, plen);
        match (t.payload, gather) {
            (Some(p), Some(gather)) => gather_bytes(gather, p.offset as u64, &mut packet[HEADER_LEN..]),
            _ => packet[HEADER_LEN..].fill(0),
        }
        via_wire::finish(packet);
    }

    /// Builds `t` with its `plen` payload bytes at `offset` of `gather` sent
    /// in place.  Returns false (and builds nothing) if `gather` ends
    /// before them.
    fn push_in_place(&mut self, t: &Transmit, gather: &Gather, offset: u64, plen: usize) -> bool {
        let first_piece = self.pieces.len();
        if gather_pieces(gather, offset, plen, &mut self.pieces) < plen {
            self.pieces.truncate(first_piece);
            return false;
        }
        let room = self.grow(HEADER_LEN, HEADER_LEN + plen);
        let header = &mut self.bytes[room];
        t.header.emit(header, plen);
        let pieces = self.pieces[first_piece..].iter().map(|&(addr, len)| {
            // SAFETY: the buffers were validated against the registry when
            // posted, and checked again before this packet was built where
            // a region was deregistered since (`Outbound::check`, in
            // `NetState::flush_with`): a message whose buffer went is not
            // built.  An application that writes to them meanwhile breaks
            // the VIA contract; its packet then fails the receiver's checksum.
            unsafe { std::slice::from_raw_parts(addr as *const u8, len) }
        });
        via_wire::finish_split(header, pieces);
        let built = self.built.last_mut().expect("just grown");
        built.first_piece = first_piece as u32;
        built.end_piece = self.pieces.len() as u32;
        true
    }

    /// A packet of exactly `bytes`.
    #[cfg(test)]
    pub(crate) fn push_bytes(&mut self, bytes: &[u8]) {
        let room = self.grow(bytes.len(), bytes.len());
        self.bytes[room].copy_from_slice(bytes);
    }

    /// Room in `bytes` for `here` bytes of one more packet, `len` bytes
    /// long in all.
    fn grow(&mut self, here: usize, len: usize) -> std::ops::Range<usize> {
        let start = self.built.last().map_or(0, |b| b.end);
        let end = start + here;
        if self.bytes.len() < end {
            // Zeroed once; later batches overwrite it.
            self.bytes.resize(end.max(2 * self.bytes.len()), 0);
        }
        let at = self.pieces.len() as u32;
        self.built.push(Built { end, first_piece: at, end_piece: at, len });
        start..end
    }
}

/// Consecutive packets of an [`OutPackets`].
#[derive(Clone, Copy)]
pub(crate) struct Packets<'a> {
    bytes: &'a [u8],
    pieces: &'a [(u64, usize)],
    /// Where the first packet's bytes begin.
    start: usize,
    built: &'a [Built],
}

impl<'a> Packets<'a> {
    pub(crate) fn len(&self) -> usize {
        self.built.len()
    }

    /// Where packet `i`'s bytes in the buffer begin.
    fn begin(&self, i: usize) -> usize {
        if i == 0 {
            self.start
        } else {
            self.built[i - 1].end
        }
    }

    /// Packet `i` as one run of bytes, if its payload is not sent in place.
    pub(crate) fn whole(&self, i: usize) -> Option<&'a [u8]> {
        let b = &self.built[i];
        (b.first_piece == b.end_piece).then(|| &self.bytes[self.begin(i)..b.end])
    }

    /// Packet `i`'s bytes, gathered into one buffer.
    #[cfg(test)]
    pub(crate) fn bytes(&self, i: usize) -> Vec<u8> {
        let mut iovecs = Iovecs::new();
        self.iovecs(i, 1, &mut iovecs);
        let mut bytes = Vec::with_capacity(self.built[i].len);
        for v in iovecs {
            // SAFETY: each iovec is a part of this buffer or a piece of a
            // registered buffer checked before the packet was built, as
            // for `sendmsg`.
            bytes.extend_from_slice(unsafe { std::slice::from_raw_parts(v.iov_base as *const u8, v.iov_len) });
        }
        bytes
    }

    /// Appends the iovecs of packets `i..i + count` to `out`: the bytes
    /// in the buffer as long runs, each payload sent in place after its
    /// header.
    fn iovecs(&self, i: usize, count: usize, out: &mut Iovecs) {
        let mut run = self.begin(i);
        for b in &self.built[i..i + count] {
            if b.first_piece == b.end_piece {
                continue;
            }
            out.push(iovec(self.bytes[run..b.end].as_ptr(), b.end - run));
            for &(addr, len) in &self.pieces[b.first_piece as usize..b.end_piece as usize] {
                out.push(iovec(addr as *const u8, len));
            }
            run = b.end;
        }
        let end = self.built[i + count - 1].end;
        if end > run {
            out.push(iovec(self.bytes[run..end].as_ptr(), end - run));
        }
    }

    fn lens(&self) -> impl Iterator<Item = usize> + 'a {
        self.built.iter().map(|b| b.len)
    }
}

fn iovec(base: *const u8, len: usize) -> libc::iovec {
    libc::iovec { iov_base: base as *mut libc::c_void, iov_len: len }
}

/// The pieces of the buffers `gather` that hold bytes `offset..offset +
/// len`, in order, as address and length (of nonzero length): fewer bytes
/// than `len` if `gather` ends first.
fn pieces(gather: &[(u64, u32)], mut offset: u64, len: usize) -> impl Iterator<Item = (u64, usize)> + '_ {
    let mut left = len;
    gather.iter().filter_map(move |&(addr, piece)| {
        let piece = piece as u64;
        if left == 0 || offset >= piece {
            offset -= piece.min(offset);
            return None;
        }
        let n = ((piece - offset) as usize).min(left);
        let at = addr + offset;
        offset = 0;
        left -= n;
        Some((at, n))
    })
}

/// Copies bytes `offset..offset + out.len()` of the buffers `gather` into
/// `out`, zeros past their end.
pub(crate) fn gather_bytes(gather: &[(u64, u32)], offset: u64, out: &mut [u8]) {
    let mut filled = 0;
    for (addr, n) in pieces(gather, offset, out.len()) {
        // SAFETY: the buffers were validated against the registry when posted
        // and checked again before this packet was built where a region was
        // deregistered since (`Outbound::check`, in `NetState::flush_with`).
        unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, out[filled..].as_mut_ptr(), n) };
        filled += n;
    }
    out[filled..].fill(0);
}

/// Appends to `out` the pieces of the buffers `gather` that hold bytes
/// `offset..offset + len`, and returns how many bytes they cover: fewer
/// than `len` if `gather` ends first.
fn gather_pieces(gather: &[(u64, u32)], offset: u64, len: usize, out: &mut Vec<(u64, usize)>) -> usize {
    let before = out.len();
    out.extend(pieces(gather, offset, len));
    out[before..].iter().map(|&(_, n)| n).sum()
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

/// Messages of one `sendmmsg` kept on the stack (more spill to the heap):
/// a flush hands over at most a few large packets or GSO runs at a time.
const MESSAGES: usize = 8;

/// The iovecs of one `sendmmsg`: a header and a payload piece or two per
/// packet of its runs, on the stack for the usual few.
type Iovecs = SmallVec<[libc::iovec; 4 * MESSAGES]>;

/// Sends `packets` to `addr` (`None`: the peer `fd` is connected to) on
/// `fd` with `sendmmsg`, runs of them as GSO buffers of segments up to
/// `max_segment` bytes (0: no GSO), and a packet longer than that as a GSO
/// buffer of its own, which the kernel cuts into a datagram with the
/// header and headerless ones after it.  A full socket buffer drops the
/// rest (the session retransmits).
pub(crate) fn send_groups(
    fd: RawFd,
    addr: Option<&(libc::sockaddr_storage, libc::socklen_t)>,
    packets: Packets<'_>,
    max_segment: usize,
) -> Sent {
    if packets.len() == 1 {
        if let Some(packet) = packets.whole(0).filter(|p| max_segment == 0 || p.len() <= max_segment) {
            return send_one(fd, addr, packet);
        }
    }
    let groups = gso_groups(packets.lens(), max_segment);
    let mut iov = Iovecs::new();
    let mut control: SmallVec<[[u64; 3]; MESSAGES]> = smallvec::smallvec![[0; 3]; groups.len()];
    let mut msgs: SmallVec<[libc::mmsghdr; MESSAGES]> = SmallVec::with_capacity(groups.len());
    for (g, ctrl) in groups.iter().zip(control.iter_mut()) {
        // SAFETY: a zeroed msghdr is valid; fields set below.
        let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
        if let Some((name, len)) = addr {
            h.msg_name = name as *const libc::sockaddr_storage as *mut libc::c_void;
            h.msg_namelen = *len;
        }
        let first = iov.len();
        packets.iovecs(g.start, g.count, &mut iov);
        h.msg_iovlen = (iov.len() - first) as _;
        if g.count > 1 {
            set_segment_cmsg(&mut h, ctrl, g.segment as u16);
        } else if is_gso(g, max_segment) {
            set_segment_cmsg(&mut h, ctrl, max_segment as u16);
        }
        msgs.push(libc::mmsghdr { msg_hdr: h, msg_len: 0 });
    }
    // Each message's iovecs, now that the vector no longer moves.
    let mut next = iov.as_mut_ptr();
    for m in &mut msgs {
        m.msg_hdr.msg_iov = next;
        // SAFETY: the messages' iovec counts add up to `iov.len()`.
        next = unsafe { next.add(m.msg_hdr.msg_iovlen as _) };
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
        if is_gso(&groups[done], max_segment) && gso_error {
            refused = Some(groups[done].start);
        }
        break;
    }
    Sent {
        packets: groups[..done].iter().map(|g| g.count).sum(),
        gso_buffers: groups[..done].iter().filter(|g| is_gso(g, max_segment)).count(),
        refused,
    }
}

/// Whether `g` leaves as a GSO buffer: a run of several packets, or one
/// packet longer than a segment.
fn is_gso(g: &Group, max_segment: usize) -> bool {
    g.count > 1 || (max_segment > 0 && g.segment > max_segment)
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
/// `GSO_MAX_SEGMENTS` of them, at most `GSO_MAX_BYTES` in all), closed by
/// a shorter packet.  With `max_segment` 0, every packet is a run of its own.
fn gso_groups(lens: impl Iterator<Item = usize>, max_segment: usize) -> SmallVec<[Group; MESSAGES]> {
    let mut groups: SmallVec<[Group; MESSAGES]> = SmallVec::new();
    let mut total = 0;
    for (i, len) in lens.enumerate() {
        if let Some(g) = groups.last_mut() {
            let open = g.segment <= max_segment
                && g.count < GSO_MAX_SEGMENTS
                && len <= g.segment
                && total + len <= GSO_MAX_BYTES
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
fn send_one(fd: RawFd, addr: Option<&(libc::sockaddr_storage, libc::socklen_t)>, packet: &[u8]) -> Sent {
    let (name, len) = match addr {
        Some((name, len)) => (name as *const libc::sockaddr_storage as *const libc::sockaddr, *len),
        None => (std::ptr::null(), 0),
    };
    loop {
        // SAFETY: the packet and the address (if any) are live for the call.
        let r = unsafe { libc::sendto(fd, packet.as_ptr() as *const libc::c_void, packet.len(), 0, name, len) };
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
        (*c).cmsg_type = libc::UDP_SEGMENT;
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

    /// The packet a transmit of `len` bytes at `offset` of message 1 builds.
    fn transmit(offset: u32, len: u32) -> Transmit {
        let header = Header { kind: Kind::Data, msg: 1, offset, total: 1 << 20, ..Header::default() };
        Transmit { header, payload: Some(PayloadRef { token: 1, offset, len }) }
    }

    #[test]
    fn packets_lie_back_to_back_with_their_payload_copied_and_checksummed() {
        let a: Vec<u8> = (0..3000u32).map(|i| (i * 13) as u8).collect();
        let b: Vec<u8> = (0..3000u32).map(|i| (i * 29 + 1) as u8).collect();
        let gather: Gather = smallvec::smallvec![(a.as_ptr() as u64, 3000), (b.as_ptr() as u64, 3000)];
        let whole: Vec<u8> = a.iter().chain(&b).copied().collect();
        let many: Gather = whole.chunks(100).map(|c| (c.as_ptr() as u64, c.len() as u32)).collect();
        // Across two buffers; short; in many pieces; a message that is gone.
        let cases =
            [(2500u32, 1400u32, Some(&gather)), (10, 100, Some(&gather)), (0, 1400, Some(&many)), (0, 1400, None)];
        let mut out = OutPackets::default();
        for round in 0..2 {
            // The second round reuses the buffer of the first.
            out.clear();
            for (offset, len, g) in cases {
                out.push(&transmit(offset, len), g);
            }
            assert_eq!(out.len(), cases.len(), "round {round}");
            let all = out.from(0);
            let mut at = 0;
            for (i, (offset, len, g)) in cases.into_iter().enumerate() {
                let bytes = all.whole(i).expect("copied payload");
                assert_eq!(bytes.len(), HEADER_LEN + len as usize);
                // Back to back: packet i begins where i - 1 ended.
                assert_eq!(bytes.as_ptr(), all.whole(0).unwrap().as_ptr().wrapping_add(at));
                at += bytes.len();
                let checked = Packet::new_checked(bytes).expect("a valid packet");
                let want = match g {
                    Some(_) => &whole[offset as usize..(offset + len) as usize],
                    None => &vec![0u8; len as usize][..],
                };
                assert_eq!(checked.payload(), want, "round {round} packet {i}");
            }
            assert_eq!(
                all.lens().collect::<Vec<_>>(),
                vec![HEADER_LEN + 1400, HEADER_LEN + 100, HEADER_LEN + 1400, HEADER_LEN + 1400]
            );
            assert_eq!(out.from(2).lens().count(), 2);
            assert_eq!(out.from(2).whole(0), all.whole(2));
        }
    }

    /// One packet leaves with one `sendto` and arrives as it was built.
    #[test]
    fn a_lone_packet_goes_out_whole() {
        use std::net::UdpSocket;
        let data: Vec<u8> = (0..2000u32).map(|i| (i * 3) as u8).collect();
        let gather: Gather = smallvec::smallvec![(data.as_ptr() as u64, 700), (data.as_ptr() as u64 + 700, 1300)];
        let mut out = OutPackets::default();
        out.push(&transmit(100, 1400), Some(&gather));
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = crate::transport::udp::socket_addr(rx.local_addr().unwrap());
        assert_eq!(send_groups(std::os::fd::AsRawFd::as_raw_fd(&tx), Some(&addr), out.from(0), 0).packets, 1);
        rx.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 2048];
        let n = rx.recv(&mut buf).unwrap();
        let checked = Packet::new_checked(&buf[..n]).expect("a valid packet");
        assert_eq!(checked.payload(), &data[100..1500]);
    }

    /// The bytes of packets `i..i + count` as the kernel reads them from
    /// their iovecs.
    fn gathered(packets: Packets<'_>, i: usize, count: usize) -> Vec<u8> {
        let mut iov = Iovecs::new();
        packets.iovecs(i, count, &mut iov);
        // SAFETY: every iovec points into the packets' buffer or into the
        // test's payload, both alive.
        iov.iter()
            .flat_map(|v| unsafe { std::slice::from_raw_parts(v.iov_base as *const u8, v.iov_len) })
            .copied()
            .collect()
    }

    /// A long payload is not copied: its packet's header is followed on
    /// the wire by the application's buffers themselves, and the checksum
    /// covers them.  Short packets around it keep their copies.
    #[test]
    fn a_long_payload_is_sent_in_place_and_checksummed_where_it_lies() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 + i / 97) as u8).collect();
        // Three buffers, the message's bytes from the middle of the first.
        let gather: Gather = smallvec::smallvec![
            (data.as_ptr() as u64, 30_000),
            (data.as_ptr() as u64 + 30_000, 5),
            (data.as_ptr() as u64 + 30_005, 69_995)
        ];
        let cases = [
            (0u32, 1000u32, true),
            (20_000, 40_000, true),
            (5000, 300, true),
            (50_000, 20_000, true),
            (0, 20_000, false),
        ];
        let mut out = OutPackets::default();
        for (offset, len, present) in cases {
            out.push(&transmit(offset, len), present.then_some(&gather));
        }
        let all = out.from(0);
        let in_place: Vec<bool> = (0..cases.len()).map(|i| all.whole(i).is_none()).collect();
        // A message that is gone has no buffers: its zeros are copied.
        assert_eq!(in_place, vec![false, true, false, true, false]);
        let mut expected = Vec::new();
        for (i, (offset, len, present)) in cases.into_iter().enumerate() {
            let one = gathered(all, i, 1);
            let checked = Packet::new_checked(&one[..]).expect("a valid packet");
            let want = match present {
                true => data[offset as usize..(offset + len) as usize].to_vec(),
                false => vec![0; len as usize],
            };
            assert_eq!(checked.payload(), &want[..], "packet {i}");
            expected.extend(one);
        }
        // All of them as one message: the same bytes, in order.
        assert_eq!(gathered(all, 0, cases.len()), expected);
        assert_eq!(all.lens().collect::<Vec<_>>(), cases.iter().map(|c| HEADER_LEN + c.1 as usize).collect::<Vec<_>>());

        // Over loopback, one datagram each, and the large one as a GSO
        // buffer where the kernel takes them (taken back whole with UDP_GRO).
        use std::net::UdpSocket;
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        crate::transport::udp::peer_socket::set_option_to(
            std::os::fd::AsRawFd::as_raw_fd(&rx),
            libc::SOL_UDP,
            libc::UDP_GRO,
            &1i32,
        )
        .unwrap();
        rx.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
        let addr = crate::transport::udp::socket_addr(rx.local_addr().unwrap());
        let mut buf = vec![0u8; 65536];
        for max_segment in [0, 1472] {
            let sent = send_groups(std::os::fd::AsRawFd::as_raw_fd(&tx), Some(&addr), out.from(1), max_segment);
            if sent.refused.is_some() {
                continue;
            }
            assert_eq!(sent.packets, cases.len() - 1, "segments of {max_segment}");
            for i in 1..cases.len() {
                let n = rx.recv(&mut buf).unwrap();
                assert_eq!(&buf[..n], &gathered(all, i, 1)[..], "packet {i}, segments of {max_segment}");
            }
        }
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
        // Every buffer fits a device's 64 KiB with the headers in front:
        // 46 packets of 1424 bytes would not.
        assert_eq!(groups(&[1424; 50], 1472), vec![(0, 45, 1424), (45, 5, 1424)]);
        for segment in [1424, 1452, 8972] {
            for g in gso_groups([segment; 100].into_iter(), segment) {
                assert!(g.count * g.segment <= GSO_MAX_BYTES);
            }
        }
    }
}
