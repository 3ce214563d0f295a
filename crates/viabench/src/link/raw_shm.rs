//! A bare shared-memory ping-pong: the physical floor on one host.
//!
//! Both processes map one file of `/dev/shm`.  Per direction there is a
//! channel: a sequence word the writer bumps after copying a block into the
//! next of `K` slots (one copy, as openvia's cross-memory attach does), and
//! an acknowledgement word the reader advances.  The reader polls the
//! sequence word (`--wait poll`) or sleeps on it with a futex (`--wait
//! block`); the writer wakes it only if it said it sleeps.

use super::{futex_wait, futex_wake, round_up, Deadline, Link, LinkServer, LinkStats, Pending, Side};
use crate::error::{Error, Result};
use crate::pattern::{self, Which};
use crate::proto::{PeerInfo, ServerInfo, TestSpec, Wait, ACK_BYTES};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// Most slots per direction.
const MAX_SLOTS: usize = 8;
/// Bytes before the data slots.
const HEADER: usize = 4096;
/// Channel pairs are page-aligned, as each VI's connection segment is.
const PAGE: usize = 4096;

/// One direction's control words: the writer's line, then the reader's.
#[repr(C, align(64))]
struct Channel {
    seq: AtomicU32,
    reader_sleeping: AtomicU32,
    lens: [AtomicU32; MAX_SLOTS],
    _pad: [u32; 6],
    ack: AtomicU32,
    writer_sleeping: AtomicU32,
    _pad2: [u32; 14],
}

const _: () = assert!(std::mem::size_of::<Channel>() == 128);

/// A shared-memory link.
pub struct ShmLink {
    base: *mut u8,
    len: usize,
    side: Side,
    wait: Wait,
    timeout: Duration,
    slots: usize,
    slot_bytes: usize,
    /// Bytes of one channel pair and its slots.
    pair_bytes: usize,
    /// The pair `select` chose.
    cur: usize,
    /// Per pair: blocks sent, received and acknowledged by the reader.
    counts: Vec<Counts>,
    bufs: [Vec<u8>; 3],
    /// The kept block: pair, slot, length.
    kept: Option<(usize, usize, usize)>,
    path: Option<String>,
    messages: u64,
}

/// One channel pair's sequence numbers.
#[derive(Debug, Clone, Copy, Default)]
struct Counts {
    sent: u32,
    received: u32,
    acked: u32,
}

/// Bytes per slot, slots per direction, bytes per pair, pairs.
fn geometry(spec: &TestSpec) -> (usize, usize, usize, usize) {
    let slot_bytes = round_up(spec.max_block.max(ACK_BYTES), 64);
    let slots = ((64 << 20) / slot_bytes).clamp(2, MAX_SLOTS);
    let pair_bytes = round_up(HEADER + 2 * slots * slot_bytes, PAGE);
    (slot_bytes, slots, pair_bytes, spec.vis.unwrap_or(1).max(1) as usize)
}

fn map(path: &str, len: usize, create: bool) -> Result<*mut u8> {
    use rustix::fs::{self, Mode, OFlags};
    use rustix::mm::{self, MapFlags, ProtFlags};
    if path.contains('\0') {
        return Err(Error::new("bad path"));
    }
    let flags = OFlags::RDWR | OFlags::CLOEXEC | if create { OFlags::CREATE | OFlags::EXCL } else { OFlags::empty() };
    let fd = fs::open(path, flags, Mode::from_raw_mode(0o600)).map_err(|e| {
        Error::new(format!("{path}: {} (raw-shm needs both sides on one host)", std::io::Error::from(e)))
    })?;
    if create {
        fs::ftruncate(&fd, len as u64).map_err(|e| Error::new(format!("{path}: {}", std::io::Error::from(e))))?;
    }
    let prot = ProtFlags::READ | ProtFlags::WRITE;
    // SAFETY: a fresh shared mapping of the file at an address the kernel picks.
    let p = unsafe { mm::mmap(std::ptr::null_mut(), len, prot, MapFlags::SHARED | MapFlags::POPULATE, &fd, 0) }
        .map_err(|e| Error::new(format!("mmap {path}: {}", std::io::Error::from(e))))?;
    Ok(p as *mut u8)
}

impl ShmLink {
    /// Server: creates and maps the shared file.
    pub fn create(spec: &TestSpec) -> Result<ShmLink> {
        let path = format!("/dev/shm/viabench-{}-{}", std::process::id(), spec.tag);
        let (_, _, pair_bytes, pairs) = geometry(spec);
        let len = pair_bytes * pairs;
        let base = map(&path, len, true)?;
        Ok(ShmLink::new(spec, base, len, Side::Server, Some(path)))
    }

    /// Client: maps the server's file.
    pub fn open(spec: &TestSpec, path: &str) -> Result<ShmLink> {
        let (_, _, pair_bytes, pairs) = geometry(spec);
        let len = pair_bytes * pairs;
        let base = map(path, len, false)?;
        Ok(ShmLink::new(spec, base, len, Side::Client, None))
    }

    fn new(spec: &TestSpec, base: *mut u8, len: usize, side: Side, path: Option<String>) -> ShmLink {
        let (slot_bytes, slots, pair_bytes, pairs) = geometry(spec);
        let cap = spec.max_block.max(ACK_BYTES);
        ShmLink {
            base,
            len,
            side,
            wait: spec.wait,
            timeout: Duration::from_millis(spec.timeout_ms),
            slots,
            slot_bytes,
            pair_bytes,
            cur: 0,
            counts: vec![Counts::default(); pairs],
            bufs: [vec![0; cap], vec![0; cap], vec![0; cap]],
            kept: None,
            path,
            messages: 0,
        }
    }

    /// The current pair's channel of direction `dir`.
    fn channel<'a>(&self, dir: u8) -> &'a Channel {
        // SAFETY: each pair's header holds two channels; the mapping lives
        // as long as `self`, and callers use the reference only while they
        // hold it.
        unsafe {
            &*(self.base.add(self.cur * self.pair_bytes + dir as usize * std::mem::size_of::<Channel>())
                as *const Channel)
        }
    }

    /// Slot `i` of direction `dir` in `pair`.
    fn slot(&self, pair: usize, dir: u8, i: usize) -> *mut u8 {
        // SAFETY: inside the pair (HEADER + 2 * slots * slot_bytes <= pair_bytes).
        unsafe { self.base.add(pair * self.pair_bytes + HEADER + (dir as usize * self.slots + i) * self.slot_bytes) }
    }

    /// Waits until `ready(word)`; returns the word.
    fn wait_word(
        &self,
        word: &AtomicU32,
        sleeping: &AtomicU32,
        ready: impl Fn(u32) -> bool,
        what: &str,
    ) -> Result<u32> {
        let deadline = Deadline::after(self.timeout);
        let mut spins = 0u32;
        loop {
            let v = word.load(Ordering::Acquire);
            if ready(v) {
                return Ok(v);
            }
            match self.wait {
                Wait::Poll => {
                    spins = spins.wrapping_add(1);
                    if spins.is_multiple_of(65536) {
                        deadline.check(what)?;
                    }
                }
                Wait::Block => {
                    sleeping.store(1, Ordering::SeqCst);
                    let v = word.load(Ordering::SeqCst);
                    if !ready(v) {
                        futex_wait(word, v, Duration::from_millis(100));
                    }
                    sleeping.store(0, Ordering::SeqCst);
                    deadline.check(what)?;
                }
            }
        }
    }
}

impl Drop for ShmLink {
    fn drop(&mut self) {
        // SAFETY: unmaps what `map` mapped, unused once the link is dropped.
        let _ = unsafe { rustix::mm::munmap(self.base as *mut std::ffi::c_void, self.len) };
        if let Some(p) = self.path.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl Link for ShmLink {
    fn prepare(&mut self, len: usize, seeds: [u64; 3]) -> Result<()> {
        for (buf, seed) in self.bufs.iter_mut().zip(seeds) {
            pattern::fill(seed, &mut buf[..len]);
        }
        Ok(())
    }

    fn send(&mut self, which: Which, len: usize) -> Result<()> {
        let dir = self.side.dir();
        let ch = self.channel(dir);
        let c = self.counts[self.cur];
        if c.sent.wrapping_sub(c.acked) as usize >= self.slots {
            let floor = c.sent.wrapping_sub(self.slots as u32 - 1);
            self.counts[self.cur].acked = self.wait_word(
                &ch.ack,
                &ch.writer_sleeping,
                |a| a.wrapping_sub(floor) as i32 >= 0,
                "raw-shm: waiting for the reader",
            )?;
        }
        let i = c.sent as usize % self.slots;
        // SAFETY: the slot holds slot_bytes >= len bytes; the reader is done with it.
        unsafe { std::ptr::copy_nonoverlapping(self.bufs[which as usize].as_ptr(), self.slot(self.cur, dir, i), len) };
        ch.lens[i].store(len as u32, Ordering::Relaxed);
        let sent = c.sent.wrapping_add(1);
        self.counts[self.cur].sent = sent;
        if self.wait == Wait::Block {
            ch.seq.store(sent, Ordering::SeqCst);
            if ch.reader_sleeping.load(Ordering::SeqCst) != 0 {
                futex_wake(&ch.seq);
            }
        } else {
            ch.seq.store(sent, Ordering::Release);
        }
        self.messages += 1;
        Ok(())
    }

    fn recv(&mut self, len: usize, keep: bool) -> Result<()> {
        let dir = 1 - self.side.dir();
        let ch = self.channel(dir);
        let mine = self.counts[self.cur].received;
        self.wait_word(&ch.seq, &ch.reader_sleeping, |s| s != mine, "raw-shm: waiting for a block")?;
        let i = mine as usize % self.slots;
        let l = ch.lens[i].load(Ordering::Relaxed) as usize;
        if l != len {
            return Err(Error::new(format!("raw-shm: a {l}-byte block where {len} bytes were expected")));
        }
        let received = mine.wrapping_add(1);
        self.counts[self.cur].received = received;
        if keep {
            self.kept = Some((self.cur, i, len));
        }
        if self.wait == Wait::Block {
            ch.ack.store(received, Ordering::SeqCst);
            if ch.writer_sleeping.load(Ordering::SeqCst) != 0 {
                futex_wake(&ch.ack);
            }
        } else {
            ch.ack.store(received, Ordering::Release);
        }
        Ok(())
    }

    fn verify(&self, seed: u64, len: usize) -> Result<()> {
        let Some((pair, i, l)) = self.kept else { return Err(Error::new("no block kept")) };
        if l != len {
            return Err(Error::new(format!("kept {l} bytes of a {len}-byte block")));
        }
        // SAFETY: the slot was filled by the peer and is not written again
        // before the next run.
        let data = unsafe { std::slice::from_raw_parts(self.slot(pair, 1 - self.side.dir(), i), len) };
        pattern::check(seed, 0, data)
            .map_err(|k| Error::new(format!("byte {k} of a {len}-byte raw-shm block is wrong")))
    }

    fn finish(&mut self) -> Result<()> {
        Ok(())
    }

    fn select(&mut self, vi: usize) {
        self.cur = vi % self.counts.len();
    }

    fn vis(&self) -> usize {
        self.counts.len()
    }

    fn stats(&self) -> LinkStats {
        LinkStats { messages: self.messages, ..Default::default() }
    }
}

impl Pending for ShmLink {
    fn info(&self) -> ServerInfo {
        ServerInfo { shm_path: self.path.clone(), ..Default::default() }
    }

    fn accept(self: Box<Self>) -> Result<Box<dyn LinkServer>> {
        Ok(self)
    }
}

impl LinkServer for ShmLink {
    fn complete(mut self: Box<Self>, _peer: &PeerInfo, _peer_ip: IpAddr) -> Result<Box<dyn Link>> {
        // Both sides have it mapped: the name is no longer needed.
        if let Some(p) = self.path.take() {
            let _ = std::fs::remove_file(p);
        }
        Ok(self)
    }
}
