//! A bare cross-memory ping-pong: the floor under openvia's RDMA write on
//! one host.
//!
//! Each side maps a buffer of its own and, in the set-up, tells the peer its
//! process id and the buffer's address (as raw-shm tells the peer its file).
//! A block goes with one `process_vm_writev` straight into the next of `K`
//! slots of the peer's buffer; the same call writes, after the block, a flag
//! word that the peer polls: the block's sequence number.  Nothing else
//! moves per block, no shared mapping and no system call on the reader's
//! side.
//!
//! A slot, written by the peer in one call from three local pieces:
//!
//! ```text
//!   | ack (8) | block (len, padded to 8) | flag (8) | ...
//! ```
//!
//! starting at the slot's first byte where the three fit one cache line (a
//! block of up to 40 bytes), else with the block at the slot's second line
//! (aligned, as the buffers a copy of many pages starts from).  The kernel
//! copies the local pieces one after the other, and x86 does not reorder
//! the stores of one copy after those of a later one, so the block and the
//! ack are in place once the flag is.  The reader waits for the exact
//! sequence number it expects, so a flag caught half written never passes;
//! what an earlier block of another size left where a flag is now polled
//! is an earlier flag (a smaller number) or pattern bytes, which equal the
//! expected number with a chance of 2^-64.
//!
//! Flow control: the ack in front of a block is the count of blocks its
//! writer has received (free in a ping-pong, where every block answers one).
//! A reader about to wait that has taken half the slots without writing
//! anything back writes that count alone into the writer's header, with a
//! check word, so that a count caught half written is ignored.  There are
//! eight slots a direction, fewer for blocks above 256 KiB (two of a MiB:
//! large blocks cycle through little memory, as VIA's RDMA writes land in
//! one buffer).
//!
//! The flag lies in memory of the reader's own that no other process maps,
//! so there is no futex to sleep on: raw-cma polls only (`--wait poll`).

use super::{round_up, Deadline, Link, LinkServer, LinkStats, Mapping, Pending, Side};
use crate::error::{Error, Result};
use crate::pattern::{self, mix, Which};
use crate::proto::{PeerInfo, ServerInfo, TestSpec, Wait, ACK_BYTES};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Most slots per direction.
const MAX_SLOTS: usize = 8;
/// Bytes of slots per direction, as far as two slots allow: large blocks
/// cycle through few buffers, as VIA's RDMA writes land in one.
const SLOT_BUDGET: usize = 2 << 20;
/// Bytes before the slots: the standalone acknowledgement (count, check).
const HEADER: usize = 64;

/// Where the pieces of a block of `len` bytes lie in a slot: the offsets of
/// the ack, the block and the flag.
pub fn slot_layout(len: usize) -> (usize, usize, usize) {
    let padded = round_up(len, 8);
    // Small: ack, block and flag in the first line, the flag short of byte
    // 56, where a large block's ack lies.
    let block = if padded <= 40 { 8 } else { 64 };
    (block - 8, block, block + padded)
}

/// Slot stride, slots and bytes of the buffer for blocks of up to
/// `max_block` bytes.
pub fn geometry(max_block: usize) -> (usize, usize, usize) {
    let stride = round_up(slot_layout(max_block.max(ACK_BYTES)).2 + 8, 64);
    let slots = (SLOT_BUDGET / stride).clamp(2, MAX_SLOTS);
    (stride, slots, HEADER + slots * stride)
}

/// The check word of a standalone acknowledgement of `count` blocks.
fn ack_check(count: u64) -> u64 {
    mix(count ^ 0x636d_615f_6163_6b00)
}

/// A cross-memory link.
pub struct CmaLink {
    mem: Mapping,
    side: Side,
    timeout: Duration,
    stride: usize,
    slots: usize,
    /// The send buffers: first, middle, last (page-aligned, as VIA's).
    bufs: [Mapping; 3],
    /// The peer's process and buffer.
    peer: Option<(libc::pid_t, u64)>,
    sent: u64,
    received: u64,
    /// Blocks of ours the peer has taken.
    acked: u64,
    /// The received count last written to the peer.
    announced: u64,
    kept: Option<(usize, usize)>,
    messages: u64,
    acks: u64,
}

// SAFETY: the mapping is plain memory owned by the link.
unsafe impl Send for CmaLink {}

impl CmaLink {
    /// Maps this side's buffer.
    pub fn new(spec: &TestSpec, side: Side) -> Result<CmaLink> {
        if spec.wait != Wait::Poll {
            return Err(Error::new("raw-cma polls only: nothing to sleep on"));
        }
        let (stride, slots, len) = geometry(spec.max_block);
        let cap = spec.max_block.max(ACK_BYTES);
        let bufs = [Mapping::new(cap)?, Mapping::new(cap)?, Mapping::new(cap)?];
        Ok(CmaLink {
            mem: Mapping::new(len)?,
            side,
            timeout: Duration::from_millis(spec.timeout_ms),
            stride,
            slots,
            peer: None,
            sent: 0,
            received: 0,
            acked: 0,
            announced: 0,
            bufs,
            kept: None,
            messages: 0,
            acks: 0,
        })
    }

    /// This process and the address of its buffer, for the peer.
    pub fn buffer(&self) -> (u32, u64) {
        (std::process::id(), self.mem.ptr() as u64)
    }

    /// Takes the peer's process and buffer, and lets that process write
    /// into this one where Yama restricts ptrace (`PR_SET_PTRACER`; without
    /// Yama the call fails and the same user is permission enough).
    pub fn connect_to(&mut self, pid: u32, addr: u64) {
        self.peer = Some((pid as libc::pid_t, addr));
        // SAFETY: prctl with integer arguments only.
        unsafe { libc::prctl(libc::PR_SET_PTRACER, pid as libc::c_ulong, 0, 0, 0) };
    }

    fn slot(&self, i: usize) -> usize {
        HEADER + i * self.stride
    }

    /// Writes `pieces` into the peer's buffer at `offset`, one call.
    fn write_peer(&self, offset: usize, pieces: &[&[u8]]) -> Result<()> {
        let (pid, base) = self.peer.ok_or_else(|| Error::new("raw-cma: no peer"))?;
        let total: usize = pieces.iter().map(|p| p.len()).sum();
        let local: [libc::iovec; 3] = std::array::from_fn(|k| match pieces.get(k) {
            Some(p) => libc::iovec { iov_base: p.as_ptr() as *mut libc::c_void, iov_len: p.len() },
            None => libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 },
        });
        let remote = libc::iovec { iov_base: (base as usize + offset) as *mut libc::c_void, iov_len: total };
        // SAFETY: the local iovecs describe live slices; the kernel checks
        // the remote range against the peer's mappings.
        let n = unsafe { libc::process_vm_writev(pid, local.as_ptr(), pieces.len() as libc::c_ulong, &remote, 1, 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            return Err(Error::new(format!("raw-cma: process_vm_writev into process {pid}: {e}")));
        }
        if n as usize != total {
            return Err(Error::new(format!("raw-cma: process_vm_writev moved {n} of {total} bytes")));
        }
        Ok(())
    }

    fn word(&self, offset: usize) -> &AtomicU64 {
        debug_assert!(offset.is_multiple_of(8) && offset + 8 <= self.mem.len());
        // SAFETY: an aligned word inside the mapping, which lives as long as `self`.
        unsafe { &*(self.mem.ptr().add(offset) as *const AtomicU64) }
    }

    /// The standalone acknowledgement in the header, if it is whole and newer.
    fn header_ack(&self) -> Option<u64> {
        let count = self.word(0).load(Ordering::Acquire);
        let check = self.word(8).load(Ordering::Acquire);
        (check == ack_check(count) && count > self.acked && count <= self.sent).then_some(count)
    }

    /// Writes the received count alone into the peer's header.
    fn send_ack(&mut self) -> Result<()> {
        let count = self.received;
        let words = [count.to_ne_bytes(), ack_check(count).to_ne_bytes()].concat();
        self.write_peer(0, &[&words])?;
        self.announced = count;
        self.acks += 1;
        Ok(())
    }
}

impl Link for CmaLink {
    fn prepare(&mut self, len: usize, seeds: [u64; 3]) -> Result<()> {
        for (buf, seed) in self.bufs.iter().zip(seeds) {
            assert!(len <= buf.len());
            // SAFETY: inside the mapping, which no send is reading now.
            pattern::fill(seed, unsafe { std::slice::from_raw_parts_mut(buf.ptr(), len) });
        }
        Ok(())
    }

    fn send(&mut self, which: Which, len: usize) -> Result<()> {
        if self.sent - self.acked >= self.slots as u64 {
            let deadline = Deadline::after(self.timeout);
            let mut spins = 0u32;
            loop {
                if let Some(a) = self.header_ack() {
                    self.acked = a;
                }
                if self.sent - self.acked < self.slots as u64 {
                    break;
                }
                spins = spins.wrapping_add(1);
                if spins.is_multiple_of(65536) {
                    deadline.check("raw-cma: waiting for the reader")?;
                }
                std::hint::spin_loop();
            }
        }
        let i = (self.sent % self.slots as u64) as usize;
        let (ack_at, _, _) = slot_layout(len);
        let ack = self.received.to_ne_bytes();
        // The padding after the block, then the flag: the sequence number.
        let mut tail = [0u8; 16];
        tail[8..].copy_from_slice(&(self.sent + 1).to_ne_bytes());
        let pad = round_up(len, 8) - len;
        // SAFETY: `len` bytes of the buffer `prepare` filled.
        let block = unsafe { std::slice::from_raw_parts(self.bufs[which as usize].ptr(), len) };
        self.write_peer(self.slot(i) + ack_at, &[&ack, block, &tail[8 - pad..]])?;
        self.sent += 1;
        self.announced = self.received;
        self.messages += 1;
        Ok(())
    }

    fn recv(&mut self, len: usize, keep: bool) -> Result<()> {
        // Before waiting, as VIA posts its receives again: the slots taken
        // since this side last wrote to the peer, if they are half of them.
        // In a ping-pong the answer has carried the count already; the
        // block kept for checking stays until the next wait.
        if self.received - self.announced >= (self.slots as u64 / 2).max(1) {
            self.send_ack()?;
        }
        let i = (self.received % self.slots as u64) as usize;
        let (ack_at, block_at, flag_at) = slot_layout(len);
        let base = self.slot(i);
        let expected = self.received + 1;
        let deadline = Deadline::after(self.timeout);
        let mut spins = 0u32;
        while self.word(base + flag_at).load(Ordering::Acquire) != expected {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(65536) {
                deadline.check("raw-cma: waiting for a block")?;
            }
            std::hint::spin_loop();
        }
        let ack = self.word(base + ack_at).load(Ordering::Acquire);
        if ack > self.acked && ack <= self.sent {
            self.acked = ack;
        }
        self.received = expected;
        if keep {
            self.kept = Some((base + block_at, len));
        }
        Ok(())
    }

    fn verify(&self, seed: u64, len: usize) -> Result<()> {
        let Some((at, l)) = self.kept else { return Err(Error::new("no block kept")) };
        if l != len {
            return Err(Error::new(format!("kept {l} bytes of a {len}-byte block")));
        }
        // SAFETY: inside the mapping; the peer does not write the slot again
        // before this side has acknowledged it, which it has not yet.
        let data = unsafe { std::slice::from_raw_parts(self.mem.ptr().add(at), len) };
        pattern::check(seed, 0, data)
            .map_err(|k| Error::new(format!("byte {k} of a {len}-byte raw-cma block is wrong ({:?})", self.side)))
    }

    fn finish(&mut self) -> Result<()> {
        Ok(())
    }

    fn stats(&self) -> LinkStats {
        LinkStats { messages: self.messages, continues: self.acks, ..Default::default() }
    }
}

impl Pending for CmaLink {
    fn info(&self) -> ServerInfo {
        ServerInfo { cma: Some(self.buffer()), ..Default::default() }
    }

    fn accept(self: Box<Self>) -> Result<Box<dyn LinkServer>> {
        Ok(self)
    }
}

impl LinkServer for CmaLink {
    fn complete(mut self: Box<Self>, peer: &PeerInfo, _peer_ip: IpAddr) -> Result<Box<dyn Link>> {
        let (pid, addr) = peer.cma.ok_or_else(|| Error::new("the client sent no process and buffer (raw-cma)"))?;
        self.connect_to(pid, addr);
        // A zero acknowledgement, which the client ignores: whether this
        // process may write into the client's, before anything is timed.
        let words = [0u64.to_ne_bytes(), 0u64.to_ne_bytes()].concat();
        self.write_peer(0, &[&words]).map_err(|e| {
            e.context("raw-cma needs both sides on one host, of one user, and permission to attach (ptrace)")
        })?;
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_blocks_share_a_line_with_their_flag_and_large_ones_are_aligned() {
        let (stride, slots, len) = geometry(4);
        assert_eq!((stride, slots, len), (64, 8, HEADER + 8 * 64));
        assert_eq!(slot_layout(1), (0, 8, 16));
        assert_eq!(slot_layout(4), (0, 8, 16));
        assert_eq!(slot_layout(40), (0, 8, 48));
        assert_eq!(slot_layout(41), (56, 64, 112));
        let (stride, slots, _) = geometry(1 << 20);
        assert_eq!(stride, (1 << 20) + 128);
        assert_eq!(slots, 2);
        assert_eq!(geometry(200_000).1, 8);
        assert_eq!(geometry(300_000).1, 6);
        for len in [1, 7, 8, 9, 40, 41, 4096, 1 << 20] {
            let (ack, block, flag) = slot_layout(len);
            assert_eq!(ack + 8, block);
            assert!(block + len <= flag && flag - (block + len) < 8, "{len}");
            assert!(flag.is_multiple_of(8) && flag + 8 <= stride);
            // Where a flag is polled no ack is ever written.
            assert!(flag != 0 && flag != 56);
            if len > 40 {
                assert_eq!(block, 64);
            } else {
                assert!(flag + 8 <= 64);
            }
        }
        assert_eq!(geometry(32 << 20).1, 2);
    }

    #[test]
    fn a_torn_acknowledgement_does_not_check() {
        assert_ne!(ack_check(5), ack_check(6));
        assert_ne!(ack_check(0), 0);
    }

    fn spec(max_block: usize) -> TestSpec {
        TestSpec {
            mode: crate::proto::Mode::RawCma,
            pattern: crate::proto::Pattern::PingPong,
            wait: Wait::Poll,
            vis: None,
            device: "/dev/via_lo".into(),
            reliability: crate::proto::Reliability::Delivery,
            segment: None,
            sockbuf: None,
            max_block,
            desc_size: 1 << 20,
            ring: 16,
            tag: "t".into(),
            timeout_ms: 5000,
        }
    }

    /// Both ends in this process (a process may write into itself): a
    /// stream longer than the slots needs the standalone acknowledgements,
    /// and every block arrives whole.
    #[test]
    fn blocks_and_acknowledgements_go_round() {
        let s = spec(100);
        let mut a = CmaLink::new(&s, Side::Client).unwrap();
        let mut b = CmaLink::new(&s, Side::Server).unwrap();
        let (pa, aa) = a.buffer();
        let (pb, ab) = b.buffer();
        a.connect_to(pb, ab);
        b.connect_to(pa, aa);
        for (n, len) in [(3, 1usize), (20, 100), (5, 8)] {
            let seeds = [11 + len as u64, 12, 13];
            a.prepare(len, seeds).unwrap();
            b.prepare(len, seeds).unwrap();
            for k in 0..n {
                // A stream: a writes until it has no slot left, b takes.
                a.send(if k == n - 1 { Which::Last } else { Which::Middle }, len).unwrap();
                b.recv(len, true).unwrap();
            }
            b.verify(13, len).unwrap();
            if len >= 8 {
                assert!(b.verify(12, len).is_err());
            }
            b.send(Which::First, len).unwrap();
            a.recv(len, true).unwrap();
            a.verify(11 + len as u64, len).unwrap();
        }
        assert_eq!(a.sent, 28);
        assert!(b.stats().continues > 0, "the stream needed standalone acknowledgements");
        let e = CmaLink::new(&TestSpec { wait: Wait::Block, ..s }, Side::Client).err().unwrap();
        assert!(e.to_string().contains("polls only"), "{e}");
    }
}
