//! The receive side of a port's socket: buffers for a batch of
//! datagrams (`recvmmsg`), with the segment size of the coalesced ones
//! (`UDP_GRO`), and the cutting of coalesced buffers into datagrams.
//! Also the one-datagram receives of an application's poll: into the
//! first buffer (`recv`), or with the payload where it belongs
//! (`recvmsg` with the bytes after the header at a given place).

use std::os::fd::RawFd;
use via_wire::{Packet, FLAG_LAST, HEADER_LEN};

/// Receive buffer of a socket with `UDP_GRO`: the largest coalesced datagram.
pub(crate) const GRO_BUFFER: usize = 65536;

/// Receive buffers for `recvmmsg`, with their headers built once: an
/// empty poll of the socket allocates nothing.
pub(crate) struct Batch {
    pub(crate) bufs: Vec<Vec<u8>>,
    /// Bytes received into each buffer.
    pub(crate) lens: Vec<usize>,
    /// Segment size of each received buffer: 0 for a single datagram, else
    /// the size of the datagrams coalesced into it (`UDP_GRO`).
    pub(crate) segments: Vec<usize>,
    /// One iovec per buffer; points into `bufs`' heap storage, which never moves.
    iov: Vec<libc::iovec>,
    /// Control-message space per buffer (`UDP_GRO`), empty without coalescing.
    control: Vec<[u64; 8]>,
    /// One header per buffer; points into `iov`'s and `control`'s heap
    /// storage, which never moves.
    msgs: Vec<libc::mmsghdr>,
    /// Headers the last `recvmmsg` filled.
    filled: usize,
}

// The raw pointers only point into the batch's own heap buffers.
unsafe impl Send for Batch {}

impl Batch {
    /// `count` buffers of `size` bytes; `gro`: the socket coalesces
    /// datagrams, whose segment size arrives as a control message.
    pub(crate) fn new(count: usize, size: usize, gro: bool) -> Batch {
        let mut bufs: Vec<Vec<u8>> = (0..count).map(|_| vec![0u8; size]).collect();
        let mut iov: Vec<libc::iovec> = bufs
            .iter_mut()
            .map(|b| libc::iovec { iov_base: b.as_mut_ptr() as *mut libc::c_void, iov_len: b.len() })
            .collect();
        let mut control: Vec<[u64; 8]> = vec![[0; 8]; if gro { count } else { 0 }];
        let msgs = iov
            .iter_mut()
            .enumerate()
            .map(|(i, v)| {
                // SAFETY: a zeroed msghdr is valid; the iovec is set below.
                let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
                h.msg_iov = v;
                h.msg_iovlen = 1;
                if let Some(c) = control.get_mut(i) {
                    h.msg_control = c.as_mut_ptr() as *mut libc::c_void;
                    h.msg_controllen = std::mem::size_of_val(c) as _;
                }
                libc::mmsghdr { msg_hdr: h, msg_len: 0 }
            })
            .collect();
        Batch { bufs, lens: vec![0; count], segments: vec![0; count], iov, control, msgs, filled: 0 }
    }

    /// Receives up to a batch of datagrams without blocking; `None` when
    /// there are none.
    pub(crate) fn receive(&mut self, fd: RawFd) -> Option<usize> {
        self.reset_control();
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
            let n = r as usize;
            self.filled = n;
            for i in 0..n {
                self.settle(i, self.msgs[i].msg_len as usize);
            }
            return Some(n);
        }
    }

    /// Receives one datagram into the first buffer without blocking: one
    /// system call where `recvmmsg` would make a second attempt, which
    /// finds nothing when a single small message came.  It is `recv(2)`,
    /// without a message header to copy in, since most application polls
    /// find nothing: a coalesced buffer's segment size is then the length
    /// of its first packet by that packet's header (all but the last
    /// datagram of a coalesced buffer are that long).
    pub(crate) fn receive_one(&mut self, fd: RawFd) -> bool {
        let cap = self.bufs[0].len();
        loop {
            // SAFETY: the first buffer has `cap` bytes.  MSG_TRUNC: the
            // result is the datagram's length, even when it did not fit.
            let r = unsafe {
                libc::recv(
                    fd,
                    self.bufs[0].as_mut_ptr() as *mut libc::c_void,
                    cap,
                    libc::MSG_DONTWAIT | libc::MSG_TRUNC,
                )
            };
            if r < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            if r < 0 {
                return false;
            }
            let len = r as usize;
            let got = len.min(cap);
            let first = first_packet_len(&self.bufs[0][..got]);
            let coalescing = !self.control.is_empty();
            let segment = if coalescing && first > 0 && first < len { first } else { 0 };
            self.lens[0] = received_len(len, cap, len > cap, segment);
            self.segments[0] = segment;
            return true;
        }
    }

    /// Receives one datagram without blocking into the first buffer, but
    /// with the bytes after its header at `place` (`room` bytes; the
    /// buffer's bytes beside them take any more): a packet of that payload
    /// arrives where it belongs.  False when there is none.
    pub(crate) fn receive_beside(&mut self, fd: RawFd, place: *mut u8, room: usize) -> bool {
        let buf = self.bufs[0].as_mut_ptr();
        let rest = HEADER_LEN + room;
        assert!(rest <= self.bufs[0].len(), "no room beside the place");
        let mut iov = [
            libc::iovec { iov_base: buf as *mut libc::c_void, iov_len: HEADER_LEN },
            libc::iovec { iov_base: place as *mut libc::c_void, iov_len: room },
            // SAFETY: `rest` is within the buffer, checked above.
            libc::iovec { iov_base: unsafe { buf.add(rest) } as *mut libc::c_void, iov_len: self.bufs[0].len() - rest },
        ];
        self.reset_control();
        let m = &mut self.msgs[0].msg_hdr;
        let own = (m.msg_iov, m.msg_iovlen);
        (m.msg_iov, m.msg_iovlen) = (iov.as_mut_ptr(), iov.len() as _);
        let r = loop {
            // SAFETY: the header points at the iovecs above, `place` has
            // `room` bytes (the caller's), and the control space is ours.
            let r = unsafe { libc::recvmsg(fd, m, libc::MSG_DONTWAIT) };
            if r >= 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                break r;
            }
        };
        (m.msg_iov, m.msg_iovlen) = own;
        if r < 0 {
            return false;
        }
        self.filled = 1;
        self.settle(0, r as usize);
        true
    }

    /// Whether buffer `i` suggests more datagrams are on their way: it
    /// holds several coalesced ones, or one packet of `full` bytes or more
    /// (a message longer than a packet continues).
    pub(crate) fn more_likely(&self, i: usize, full: usize) -> bool {
        let (len, segment) = (self.lens[i], self.segments[i]);
        (segment > 0 && len > segment) || len >= full
    }

    /// The kernel shortened the control length of the headers it filled
    /// last time to what it wrote: restores them.
    fn reset_control(&mut self) {
        debug_assert_eq!(self.iov.len(), self.msgs.len());
        for (m, c) in self.msgs.iter_mut().zip(&self.control).take(self.filled) {
            m.msg_hdr.msg_controllen = std::mem::size_of_val(c) as _;
        }
        self.filled = 0;
    }

    /// Records the length and segment size of buffer `i`, which received
    /// `len` bytes.
    fn settle(&mut self, i: usize, len: usize) {
        let m = &self.msgs[i].msg_hdr;
        let segment = match self.control.get(i) {
            Some(c) => {
                // SAFETY: `control` holds `size_of_val(c)` initialised bytes.
                let bytes = unsafe { std::slice::from_raw_parts(c.as_ptr() as *const u8, std::mem::size_of_val(c)) };
                // `msg_controllen` is a size_t in glibc, a socklen_t in musl.
                #[allow(clippy::unnecessary_cast)]
                let written = (m.msg_controllen as usize).min(bytes.len());
                gro_segment(&bytes[..written])
            }
            None => 0,
        };
        let truncated = m.msg_flags & libc::MSG_TRUNC != 0;
        self.lens[i] = received_len(len, self.bufs[i].len(), truncated, segment);
        self.segments[i] = segment;
    }

    /// Whether buffer `i`'s last datagram says it is the last packet of a
    /// message (only a hint: its header is not checked yet).
    pub(crate) fn ends_message(&self, i: usize) -> bool {
        let last = split(&self.bufs[i][..self.lens[i]], self.segments[i]).last().unwrap_or_default();
        last.len() >= HEADER_LEN
            && u16::from_be_bytes([last[0], last[1]]) == via_wire::MAGIC
            && Packet::new_unchecked(&last[..HEADER_LEN]).flags() & FLAG_LAST != 0
    }

    /// The datagrams of the first `n` buffers, coalesced ones cut apart.
    pub(crate) fn datagrams(&self, n: usize) -> impl Iterator<Item = &[u8]> {
        self.bufs.iter().zip(&self.lens).zip(&self.segments).take(n).flat_map(|((b, &len), &seg)| split(&b[..len], seg))
    }
}

/// The segment size in the control messages `control` of a received
/// datagram (`UDP_GRO`), or 0 if there is none or it is malformed.
fn gro_segment(control: &[u8]) -> usize {
    let header = std::mem::size_of::<libc::cmsghdr>();
    // Control messages are aligned to a `long` (CMSG_ALIGN).
    let align = |n: usize| n.div_ceil(std::mem::size_of::<libc::c_long>()) * std::mem::size_of::<libc::c_long>();
    // SAFETY: CMSG_LEN only computes a size.
    let data_at = unsafe { libc::CMSG_LEN(0) } as usize;
    let mut at = 0;
    while at + header <= control.len() {
        // SAFETY: `header` bytes from `at` lie inside `control`; unaligned read.
        let c: libc::cmsghdr = unsafe { std::ptr::read_unaligned(control[at..].as_ptr() as *const libc::cmsghdr) };
        let len = c.cmsg_len as usize;
        if len < data_at || len > control.len() - at {
            return 0;
        }
        let data = &control[at + data_at..at + len];
        if c.cmsg_level == libc::SOL_UDP && c.cmsg_type == libc::UDP_GRO {
            return match data.len() {
                2 => u16::from_ne_bytes([data[0], data[1]]) as usize,
                n if n >= 4 => i32::from_ne_bytes([data[0], data[1], data[2], data[3]]).max(0) as usize,
                _ => 0,
            };
        }
        at += align(len).max(data_at);
    }
    0
}

/// The length of the packet at the start of `buf` by its header (header
/// and payload), 0 when `buf` is shorter than a header.  Only a guess at a
/// segment size: the packets it cuts are checked like any other.
pub(crate) fn first_packet_len(buf: &[u8]) -> usize {
    if buf.len() < HEADER_LEN {
        return 0;
    }
    HEADER_LEN + Packet::new_unchecked(buf).payload_len() as usize
}

/// Bytes of a received buffer of `cap` bytes to use, when the datagram
/// was `len` bytes long (`truncated`: longer than the buffer), coalesced
/// at `segment` bytes (0: a single datagram).  A truncated single datagram
/// is longer than any packet we accept: none of it; of a truncated
/// coalesced one, the whole segments that arrived.
fn received_len(len: usize, cap: usize, truncated: bool, segment: usize) -> usize {
    match (truncated, segment) {
        (false, _) => len.min(cap),
        (true, 0) => 0,
        (true, s) => cap / s * s,
    }
}

/// The datagrams of a received buffer coalesced at `segment` bytes: every
/// `segment` bytes one, the last possibly shorter, except that a large
/// packet (longer than a segment) is one piece as long as its header says.
/// A segment size of 0 or of the whole buffer or more means a single
/// datagram (an empty buffer is one empty datagram, which fails the checks).
fn split(buf: &[u8], segment: usize) -> Split<'_> {
    Split { rest: Some(buf), step: if segment == 0 { usize::MAX } else { segment } }
}

/// The iterator of [`split`]: each step takes at least one byte, or ends.
struct Split<'a> {
    rest: Option<&'a [u8]>,
    step: usize,
}

impl<'a> Iterator for Split<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let rest = self.rest?;
        // A packet longer than a segment (a large packet: its datagrams
        // after the first carry no header) takes as many bytes as its
        // header says; it never starts anywhere but at a segment's start.
        let magic = rest.len() >= 2 && u16::from_be_bytes([rest[0], rest[1]]) == via_wire::MAGIC;
        let step = match first_packet_len(rest) {
            len if magic && len > self.step => len,
            _ => self.step,
        };
        if rest.len() <= step {
            self.rest = None;
            return Some(rest);
        }
        let (datagram, more) = rest.split_at(step);
        self.rest = Some(more);
        Some(datagram)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::udp::peer_socket::set_option;
    use crate::transport::udp::send::{send_groups, OutPackets};
    use crate::transport::udp::{kernel_has_gso, socket_addr};
    use std::net::UdpSocket;
    use std::os::fd::AsRawFd;
    use std::time::Instant;

    #[test]
    fn split_never_loops_and_covers_the_buffer() {
        let buf: Vec<u8> = (0..10).collect();
        let parts = |seg| split(&buf, seg).map(|p| p.to_vec()).collect::<Vec<_>>();
        assert_eq!(parts(0), vec![buf.clone()]);
        assert_eq!(parts(10), vec![buf.clone()]);
        assert_eq!(parts(usize::MAX), vec![buf.clone()]);
        assert_eq!(parts(4), vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7], vec![8, 9]]);
        assert_eq!(parts(1).len(), 10);
        // An empty buffer is one empty datagram (counted as malformed).
        assert_eq!(split(&[], 0).collect::<Vec<_>>(), vec![&[] as &[u8]]);
        assert_eq!(split(&[], 7).collect::<Vec<_>>(), vec![&[] as &[u8]]);
    }

    #[test]
    fn received_len_keeps_only_whole_segments() {
        assert_eq!(received_len(1000, 2000, false, 0), 1000);
        assert_eq!(received_len(1000, 2000, false, 300), 1000);
        assert_eq!(received_len(5000, 2000, true, 0), 0);
        assert_eq!(received_len(5000, 2000, true, 300), 1800);
        assert_eq!(received_len(5000, 2000, true, 3000), 0);
    }

    /// A control message as the kernel lays it out.
    fn cmsg(level: libc::c_int, kind: libc::c_int, data: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; unsafe { libc::CMSG_SPACE(data.len() as u32) } as usize];
        let h = libc::cmsghdr {
            cmsg_len: unsafe { libc::CMSG_LEN(data.len() as u32) } as _,
            cmsg_level: level,
            cmsg_type: kind,
        };
        unsafe { std::ptr::write_unaligned(b.as_mut_ptr() as *mut libc::cmsghdr, h) };
        let at = unsafe { libc::CMSG_LEN(0) } as usize;
        b[at..at + data.len()].copy_from_slice(data);
        b
    }

    #[test]
    fn gro_segment_reads_only_well_formed_control_messages() {
        assert_eq!(gro_segment(&[]), 0);
        assert_eq!(gro_segment(&cmsg(libc::SOL_UDP, libc::UDP_GRO, &1452i32.to_ne_bytes())), 1452);
        assert_eq!(gro_segment(&cmsg(libc::SOL_UDP, libc::UDP_GRO, &1452u16.to_ne_bytes())), 1452);
        assert_eq!(gro_segment(&cmsg(libc::SOL_UDP, libc::UDP_GRO, &(-5i32).to_ne_bytes())), 0);
        assert_eq!(gro_segment(&cmsg(libc::SOL_UDP, libc::UDP_GRO, &[7])), 0);
        assert_eq!(gro_segment(&cmsg(libc::SOL_IP, libc::UDP_GRO, &1452i32.to_ne_bytes())), 0);
        // After another control message.
        let mut two = cmsg(libc::SOL_SOCKET, 29, &[1, 2, 3, 4, 5, 6, 7, 8]);
        two.extend(cmsg(libc::SOL_UDP, libc::UDP_GRO, &900i32.to_ne_bytes()));
        assert_eq!(gro_segment(&two), 900);
        // Lengths that are zero, too short or past the end end the search.
        let mut bad = cmsg(libc::SOL_UDP, libc::UDP_GRO, &1452i32.to_ne_bytes());
        for len in [0usize, 1, 8, bad.len() + 1, usize::MAX] {
            unsafe { std::ptr::write_unaligned(bad.as_mut_ptr() as *mut usize, len) };
            assert_eq!(gro_segment(&bad), 0, "cmsg_len {len}");
        }
        assert_eq!(gro_segment(&two[..two.len() - 9]), 0);
        // Arbitrary bytes never crash or loop.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for n in 0..2000 {
            let junk: Vec<u8> = (0..n % 96)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    if x.is_multiple_of(5) {
                        0
                    } else {
                        x as u8
                    }
                })
                .collect();
            let _ = gro_segment(&junk);
        }
    }

    /// Two loopback sockets, the receiver with `UDP_GRO` where the kernel
    /// has it, and `datagrams` sent to it as one GSO buffer (as separate
    /// datagrams without GSO); `None` when the kernel refused GSO.
    struct Loopback {
        rx: UdpSocket,
        tx: UdpSocket,
        gro: bool,
        batch: Batch,
        max_segment: usize,
        sent: crate::transport::udp::send::Sent,
    }

    impl Loopback {
        fn send(datagrams: &[Vec<u8>]) -> Option<Loopback> {
            let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
            let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
            rx.set_nonblocking(true).unwrap();
            let gro = set_option(&rx, libc::SOL_UDP, libc::UDP_GRO, 1).is_ok();
            let batch = Batch::new(8, if gro { GRO_BUFFER } else { 2048 }, gro);
            let mut packets = OutPackets::default();
            for d in datagrams {
                packets.push_bytes(d);
            }
            let addr = socket_addr(rx.local_addr().unwrap());
            let max_segment = if kernel_has_gso(&tx) { 1472 } else { 0 };
            let sent = send_groups(tx.as_raw_fd(), Some(&addr), packets.from(0), max_segment);
            if sent.refused.is_some() {
                eprintln!("the kernel refused GSO on loopback: {sent:?}");
                return None;
            }
            assert_eq!(sent.packets, datagrams.len());
            Some(Loopback { rx, tx, gro, batch, max_segment, sent })
        }
    }

    /// A packet longer than a segment leaves as a GSO buffer of its own
    /// and is taken back whole, among packets of one datagram each.
    #[test]
    fn a_large_packet_leaves_as_one_gso_buffer_and_comes_back_whole() {
        let packet = |fill: u8, len: usize| {
            let mut b = vec![fill; len];
            let mut p = Packet::new_unchecked(&mut b[..]);
            p.set_magic(via_wire::MAGIC);
            p.set_payload_len((len - HEADER_LEN) as u16);
            b
        };
        let datagrams = vec![packet(1, 1000), packet(2, 5000), packet(3, 1472 * 3), packet(4, 1000), packet(5, 200)];
        let Some(Loopback { rx, tx: _, gro, mut batch, max_segment, sent }) = Loopback::send(&datagrams) else {
            return;
        };
        if !gro || max_segment == 0 {
            return;
        }
        // The two large packets, each a GSO buffer of its own, and the
        // last two packets as a run.
        assert_eq!(sent.gso_buffers, 3, "{sent:?}");
        let mut got: Vec<Vec<u8>> = Vec::new();
        let deadline = Instant::now() + std::time::Duration::from_secs(5);
        while got.len() < datagrams.len() && Instant::now() < deadline {
            if let Some(n) = batch.receive(rx.as_raw_fd()) {
                got.extend(batch.datagrams(n).map(|d| d.to_vec()));
            }
        }
        assert_eq!(got, datagrams);
        // Cut from one buffer: a large packet that fills whole segments,
        // then packets of a segment each.
        let joined = [packet(6, 1472 * 2), packet(7, 1472), packet(8, 900)].concat();
        let pieces: Vec<usize> = split(&joined, 1472).map(<[u8]>::len).collect();
        assert_eq!(pieces, vec![1472 * 2, 1472, 900]);
    }

    /// A packet that ends a message is told apart by its last datagram's
    /// flags, whether it came alone, large or coalesced with others.
    #[test]
    fn a_buffer_ends_a_message_when_its_last_datagram_says_so() {
        let packet = |len: usize, flags: u16| {
            let mut b = vec![7u8; len];
            let mut p = Packet::new_unchecked(&mut b[..]);
            p.set_magic(via_wire::MAGIC);
            p.set_flags(flags);
            p.set_payload_len((len - HEADER_LEN) as u16);
            b
        };
        let datagrams = vec![packet(5000, 0), packet(5000, FLAG_LAST), packet(300, FLAG_LAST)];
        let Some(Loopback { rx, tx: _, gro: _, mut batch, max_segment: _, sent: _ }) = Loopback::send(&datagrams)
        else {
            return;
        };
        let mut ends = Vec::new();
        let deadline = Instant::now() + std::time::Duration::from_secs(5);
        while ends.len() < datagrams.len() && Instant::now() < deadline {
            if batch.receive_one(rx.as_raw_fd()) {
                ends.push(batch.ends_message(0));
            }
        }
        assert_eq!(ends, vec![false, true, true]);
        // Coalesced: the last datagram decides; junk and short buffers never do.
        let mut b = Batch::new(1, GRO_BUFFER, true);
        let joined = [packet(1472, FLAG_LAST), packet(900, 0)].concat();
        b.bufs[0][..joined.len()].copy_from_slice(&joined);
        (b.lens[0], b.segments[0]) = (joined.len(), 1472);
        assert!(!b.ends_message(0));
        let joined = [packet(1472, 0), packet(900, FLAG_LAST)].concat();
        b.bufs[0][..joined.len()].copy_from_slice(&joined);
        assert!(b.ends_message(0));
        (b.lens[0], b.segments[0]) = (HEADER_LEN - 1, 0);
        assert!(!b.ends_message(0));
        b.bufs[0][..HEADER_LEN].fill(0xff);
        (b.lens[0], b.segments[0]) = (HEADER_LEN, 0);
        assert!(!b.ends_message(0), "no magic");
        b.lens[0] = 0;
        assert!(!b.ends_message(0));
    }

    /// `receive_beside` puts the bytes after a datagram's header at the
    /// place it is given and only there, however much room that has.
    #[test]
    fn a_receive_beside_puts_the_bytes_after_the_header_in_place_and_the_rest_behind() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_nonblocking(true).unwrap();
        let mut batch = Batch::new(2, GRO_BUFFER, false);
        let fd = rx.as_raw_fd();
        let datagram = |len: usize| (0..len).map(|i| (i * 31 + i / 256) as u8).collect::<Vec<u8>>();
        let mut place = vec![0u8; 6000];
        assert!(!batch.receive_beside(fd, place.as_mut_ptr(), place.len()), "nothing sent yet");
        // Room for the whole payload: it is all in place, nothing after it is touched.
        let d = datagram(HEADER_LEN + 5000);
        tx.send_to(&d, rx.local_addr().unwrap()).unwrap();
        assert!(batch.receive_beside(fd, place.as_mut_ptr(), place.len()));
        assert_eq!(batch.lens[0], d.len());
        assert_eq!(batch.bufs[0][..HEADER_LEN], d[..HEADER_LEN]);
        assert_eq!(place[..5000], d[HEADER_LEN..]);
        assert!(place[5000..].iter().all(|&b| b == 0));
        // Less room: the rest follows in the buffer, where it would have been.
        let d = datagram(HEADER_LEN + 5000);
        let mut short = vec![0u8; 3000];
        tx.send_to(&d, rx.local_addr().unwrap()).unwrap();
        assert!(batch.receive_beside(fd, short.as_mut_ptr(), short.len()));
        assert_eq!(batch.lens[0], d.len());
        assert_eq!(batch.bufs[0][..HEADER_LEN], d[..HEADER_LEN]);
        assert_eq!(short[..], d[HEADER_LEN..HEADER_LEN + 3000]);
        assert_eq!(batch.bufs[0][HEADER_LEN + 3000..d.len()], d[HEADER_LEN + 3000..]);
        // Shorter than a header: all of it in the buffer, nothing in place.
        let mut untouched = vec![0u8; 100];
        tx.send_to(&d[..20], rx.local_addr().unwrap()).unwrap();
        assert!(batch.receive_beside(fd, untouched.as_mut_ptr(), untouched.len()));
        assert_eq!(batch.lens[0], 20);
        assert_eq!(batch.bufs[0][..20], d[..20]);
        assert!(untouched.iter().all(|&b| b == 0));
        // The batch's own receives still land in its buffers afterwards.
        tx.send_to(&d, rx.local_addr().unwrap()).unwrap();
        assert_eq!(batch.receive(fd), Some(1));
        assert_eq!(batch.bufs[0][..d.len()], d[..]);
    }

    /// `receive_one` reads no control message: it cuts a coalesced buffer
    /// at the length its first packet's header gives, and a lone packet
    /// stays whole.
    #[test]
    fn a_single_receive_cuts_a_coalesced_buffer_by_its_first_header() {
        let packet = |fill: u8, len: usize| {
            let mut b = vec![fill; len];
            Packet::new_unchecked(&mut b[..]).set_payload_len((len - HEADER_LEN) as u16);
            b
        };
        let datagrams: Vec<Vec<u8>> = (0..30u8).map(|i| packet(i, if i == 29 { 333 } else { 1000 })).collect();
        let Some(Loopback { rx, tx, gro, mut batch, max_segment, sent: _ }) = Loopback::send(&datagrams) else {
            return;
        };
        let mut got: Vec<Vec<u8>> = Vec::new();
        let mut first_segment = None;
        let deadline = Instant::now() + std::time::Duration::from_secs(5);
        while got.len() < 30 && Instant::now() < deadline {
            if batch.receive_one(rx.as_raw_fd()) {
                first_segment.get_or_insert(batch.segments[0]);
                got.extend(batch.datagrams(1).map(|d| d.to_vec()));
            }
        }
        assert_eq!(got, datagrams);
        // Loopback hands the GSO buffer to a socket with UDP_GRO whole.
        if gro && max_segment > 0 {
            assert_eq!(first_segment, Some(1000));
        }
        // A lone packet, and bytes too short for a header, are single datagrams.
        for d in [packet(7, 80), vec![9u8; 20]] {
            tx.send_to(&d, rx.local_addr().unwrap()).unwrap();
            let mut got = Vec::new();
            while got.is_empty() && Instant::now() < deadline {
                if batch.receive_one(rx.as_raw_fd()) {
                    assert_eq!(batch.segments[0], 0);
                    got.extend(batch.datagrams(1).map(|d| d.to_vec()));
                }
            }
            assert_eq!(got, vec![d]);
        }
    }

    /// A GSO buffer sent over loopback to a socket with `UDP_GRO` comes
    /// back as the same datagrams, in order, whether or not the kernel
    /// coalesced them.
    #[test]
    fn gso_send_and_gro_receive_over_loopback() {
        let datagrams: Vec<Vec<u8>> = (0..30u8).map(|i| vec![i; if i == 29 { 333 } else { 1000 }]).collect();
        let Some(Loopback { rx, tx, gro, mut batch, max_segment, sent }) = Loopback::send(&datagrams) else {
            return;
        };
        assert_eq!(sent.gso_buffers, if max_segment > 0 { 1 } else { 0 });
        let mut got: Vec<Vec<u8>> = Vec::new();
        let mut coalesced = 0;
        let deadline = Instant::now() + std::time::Duration::from_secs(5);
        while got.len() < 30 && Instant::now() < deadline {
            if let Some(n) = batch.receive(rx.as_raw_fd()) {
                coalesced += batch.segments[..n].iter().filter(|&&s| s > 0).count();
                got.extend(batch.datagrams(n).map(|d| d.to_vec()));
            }
        }
        assert_eq!(got, datagrams);
        // Loopback hands a GSO buffer to a socket with UDP_GRO whole.
        if gro && max_segment > 0 {
            assert_eq!(coalesced, 1);
        }
        // A single packet goes on its own.
        let mut one = OutPackets::default();
        one.push_bytes(&[7u8; 80]);
        assert_eq!(
            send_groups(tx.as_raw_fd(), Some(&socket_addr(rx.local_addr().unwrap())), one.from(0), max_segment).packets,
            1
        );
        let mut got = Vec::new();
        while got.is_empty() && Instant::now() < deadline {
            if let Some(n) = batch.receive(rx.as_raw_fd()) {
                got.extend(batch.datagrams(n).map(|d| d.to_vec()));
            }
        }
        assert_eq!(got, vec![vec![7u8; 80]]);
    }
}
