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
    sent: u32,
    received: u32,
    acked: u32,
    bufs: [Vec<u8>; 3],
    kept: Option<(usize, usize)>,
    path: Option<String>,
    messages: u64,
}

fn geometry(spec: &TestSpec) -> (usize, usize, usize) {
    let slot_bytes = round_up(spec.max_block.max(ACK_BYTES), 64);
    let slots = ((64 << 20) / slot_bytes).clamp(2, MAX_SLOTS);
    (slot_bytes, slots, HEADER + 2 * slots * slot_bytes)
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
        let (_, _, len) = geometry(spec);
        let base = map(&path, len, true)?;
        Ok(ShmLink::new(spec, base, len, Side::Server, Some(path)))
    }

    /// Client: maps the server's file.
    pub fn open(spec: &TestSpec, path: &str) -> Result<ShmLink> {
        let (_, _, len) = geometry(spec);
        let base = map(path, len, false)?;
        Ok(ShmLink::new(spec, base, len, Side::Client, None))
    }

    fn new(spec: &TestSpec, base: *mut u8, len: usize, side: Side, path: Option<String>) -> ShmLink {
        let (slot_bytes, slots, _) = geometry(spec);
        let cap = spec.max_block.max(ACK_BYTES);
        ShmLink {
            base,
            len,
            side,
            wait: spec.wait,
            timeout: Duration::from_millis(spec.timeout_ms),
            slots,
            slot_bytes,
            sent: 0,
            received: 0,
            acked: 0,
            bufs: [vec![0; cap], vec![0; cap], vec![0; cap]],
            kept: None,
            path,
            messages: 0,
        }
    }

    fn channel<'a>(&self, dir: u8) -> &'a Channel {
        // SAFETY: the header holds two channels; the mapping lives as long
        // as `self`, and callers use the reference only while they hold it.
        unsafe { &*(self.base.add(dir as usize * std::mem::size_of::<Channel>()) as *const Channel) }
    }

    fn slot(&self, dir: u8, i: usize) -> *mut u8 {
        // SAFETY: inside the mapping (HEADER + 2 * slots * slot_bytes).
        unsafe { self.base.add(HEADER + (dir as usize * self.slots + i) * self.slot_bytes) }
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
        if self.sent.wrapping_sub(self.acked) as usize >= self.slots {
            let floor = self.sent.wrapping_sub(self.slots as u32 - 1);
            self.acked = self.wait_word(
                &ch.ack,
                &ch.writer_sleeping,
                |a| a.wrapping_sub(floor) as i32 >= 0,
                "raw-shm: waiting for the reader",
            )?;
        }
        let i = self.sent as usize % self.slots;
        // SAFETY: the slot holds slot_bytes >= len bytes; the reader is done with it.
        unsafe { std::ptr::copy_nonoverlapping(self.bufs[which as usize].as_ptr(), self.slot(dir, i), len) };
        let ch = self.channel(dir);
        ch.lens[i].store(len as u32, Ordering::Relaxed);
        self.sent = self.sent.wrapping_add(1);
        if self.wait == Wait::Block {
            ch.seq.store(self.sent, Ordering::SeqCst);
            if ch.reader_sleeping.load(Ordering::SeqCst) != 0 {
                futex_wake(&ch.seq);
            }
        } else {
            ch.seq.store(self.sent, Ordering::Release);
        }
        self.messages += 1;
        Ok(())
    }

    fn recv(&mut self, len: usize, keep: bool) -> Result<()> {
        let dir = 1 - self.side.dir();
        let ch = self.channel(dir);
        let mine = self.received;
        self.wait_word(&ch.seq, &ch.reader_sleeping, |s| s != mine, "raw-shm: waiting for a block")?;
        let i = self.received as usize % self.slots;
        let l = ch.lens[i].load(Ordering::Relaxed) as usize;
        if l != len {
            return Err(Error::new(format!("raw-shm: a {l}-byte block where {len} bytes were expected")));
        }
        self.received = self.received.wrapping_add(1);
        if keep {
            self.kept = Some((i, len));
        }
        if self.wait == Wait::Block {
            ch.ack.store(self.received, Ordering::SeqCst);
            if ch.writer_sleeping.load(Ordering::SeqCst) != 0 {
                futex_wake(&ch.ack);
            }
        } else {
            ch.ack.store(self.received, Ordering::Release);
        }
        Ok(())
    }

    fn verify(&self, seed: u64, len: usize) -> Result<()> {
        let Some((i, l)) = self.kept else { return Err(Error::new("no block kept")) };
        if l != len {
            return Err(Error::new(format!("kept {l} bytes of a {len}-byte block")));
        }
        // SAFETY: the slot was filled by the peer and is not written again
        // before the next run.
        let data = unsafe { std::slice::from_raw_parts(self.slot(1 - self.side.dir(), i), len) };
        pattern::check(seed, 0, data)
            .map_err(|k| Error::new(format!("byte {k} of a {len}-byte raw-shm block is wrong")))
    }

    fn finish(&mut self) -> Result<()> {
        Ok(())
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
