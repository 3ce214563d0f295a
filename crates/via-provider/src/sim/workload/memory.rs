//! Registered memory the workload owns, and the descriptors it writes
//! into it and reads back, as an application does.

use crate::nic::Nic;
use std::sync::Arc;
use via_core::consts::*;
use via_core::descriptor::DescPtr;

/// Page-aligned, zeroed memory registered on a NIC for as long as it lives:
/// an anonymous mapping of its own, so that pages the workload never
/// touches cost nothing, and nothing else of the process lies in it.
pub(super) struct Region {
    nic: Arc<Nic>,
    base: *mut u8,
    /// Bytes mapped: those registered and an unregistered tail.
    size: usize,
    /// Its memory handle.
    pub mem: u32,
}

impl Region {
    /// `len` bytes registered with tag `ptag_id` and `flags` (`REGION_RDMA_*`),
    /// then `tail` bytes mapped but registered nowhere, where a refused
    /// RDMA write past the region's end would land.
    pub fn new(nic: &Arc<Nic>, len: usize, tail: usize, ptag_id: u32, flags: u32) -> Result<Region, String> {
        let registered = len.next_multiple_of(4096);
        let size = registered + tail.next_multiple_of(4096);
        // SAFETY: a fresh private anonymous mapping, checked below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(format!("no memory for {len} bytes: {}", std::io::Error::last_os_error()));
        }
        let base = base as *mut u8;
        match nic.registry.register(base as u64, registered as u64, ptag_id, flags, nic.tuning.pin_memory) {
            Ok(mem) => Ok(Region { nic: nic.clone(), base, size, mem }),
            Err(e) => {
                // SAFETY: mapped just now, this size.
                unsafe { libc::munmap(base as *mut libc::c_void, size) };
                Err(format!("registering {len} bytes: {e:?}"))
            }
        }
    }

    /// The address of byte `offset`.
    pub fn addr(&self, offset: usize) -> u64 {
        assert!(offset <= self.size);
        self.base as u64 + offset as u64
    }

    /// Bytes `offset..offset + len`.  The provider writes this memory only
    /// inside the calls this thread makes, so the borrow must end before
    /// the next one.
    pub fn bytes(&self, offset: usize, len: usize) -> &[u8] {
        assert!(offset + len <= self.size);
        // SAFETY: within the allocation, and nobody writes it while the borrow lasts (above).
        unsafe { std::slice::from_raw_parts(self.base.add(offset), len) }
    }

    /// Writes `data` at `offset`.
    pub fn write(&self, offset: usize, data: &[u8]) {
        assert!(offset + data.len() <= self.size);
        // SAFETY: within the allocation.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.base.add(offset), data.len()) }
    }

    /// Sets `len` bytes at `offset` to `byte`.
    pub fn fill(&self, offset: usize, len: usize, byte: u8) {
        assert!(offset + len <= self.size);
        // SAFETY: within the allocation.
        unsafe { std::ptr::write_bytes(self.base.add(offset), byte, len) }
    }

    /// Deregisters it, as `VipDeregisterMem` does.
    pub fn deregister(&mut self) -> Result<(), String> {
        let mem = std::mem::take(&mut self.mem);
        match mem {
            0 => Ok(()),
            _ => self.nic.deregister(mem, self.base as u64).map_err(|e| format!("VipDeregisterMem: {e:?}")),
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // Deregistered first: the fence after which no byte lands in it.
        let _ = self.deregister();
        // SAFETY: mapped in `new`, this size, and no longer registered.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.size) };
    }
}

// Offsets in a descriptor (vipl.h VIP_CONTROL_SEGMENT, VIP_DATA_SEGMENT).
const CS_SEG_COUNT: usize = 12;
const CS_CONTROL: usize = 14;
const CS_IMMEDIATE: usize = 20;
const CS_LENGTH: usize = 24;
const CS_STATUS: usize = 28;

/// Room of one descriptor: the control segment, an address segment and
/// `SEGS` data segments, 64-byte aligned.
pub(super) const DESC_STRIDE: usize = 128;
const _: () = assert!(CONTROL_SEGMENT_BYTES + (1 + super::plan::SEGS as usize) * DATA_SEGMENT_BYTES <= DESC_STRIDE);

/// A descriptor in registered memory, written and read as an application
/// does (volatile: the provider writes it too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Desc(pub usize);

impl Desc {
    fn put<T: Copy>(self, offset: usize, v: T) {
        // SAFETY: a descriptor of a `Region` (the caller's), `DESC_STRIDE` bytes.
        unsafe { std::ptr::write_volatile((self.0 + offset) as *mut T, v) }
    }

    fn get<T: Copy>(self, offset: usize) -> T {
        // SAFETY: as for `put`.
        unsafe { std::ptr::read_volatile((self.0 + offset) as *const T) }
    }

    /// A zeroed control segment with these fields.
    pub fn control(self, control: u16, segs: usize, immediate: u32, length: u32) {
        // SAFETY: as for `put`.
        unsafe { std::ptr::write_bytes(self.0 as *mut u8, 0, DESC_STRIDE) };
        self.put(CS_SEG_COUNT, segs as u16);
        self.put(CS_CONTROL, control);
        self.put(CS_IMMEDIATE, immediate);
        self.put(CS_LENGTH, length);
    }

    /// Segment `i`: a data segment (`addr`, `handle`, `len`) or an address
    /// segment (remote address and handle, `len` 0).
    pub fn segment(self, i: usize, addr: u64, handle: u32, len: u32) {
        let at = CONTROL_SEGMENT_BYTES + i * DATA_SEGMENT_BYTES;
        self.put(at, addr);
        self.put(at + 8, handle);
        self.put(at + 12, len);
    }

    /// Data segments `first..first + n` over `len` bytes at `addr`, as
    /// evenly as can be (the first `len % n` one byte longer).
    pub fn split(self, first: usize, addr: u64, handle: u32, len: u32, n: u32) {
        let (piece, extra) = (len / n, len % n);
        let mut at = addr;
        for i in 0..n {
            let l = piece + u32::from(i < extra);
            self.segment(first + i as usize, at, handle, l);
            at += l as u64;
        }
    }

    pub fn status(self) -> u32 {
        self.get(CS_STATUS)
    }

    pub fn length(self) -> u32 {
        self.get(CS_LENGTH)
    }

    pub fn immediate(self) -> u32 {
        self.get(CS_IMMEDIATE)
    }

    pub fn ptr(self) -> DescPtr {
        DescPtr(self.0)
    }
}

/// The done and error bits of a status word.
pub(super) const ERRBITS: u32 = STATUS_DONE | STATUS_ERROR_MASK;
/// The operation bits of a status word (`STATUS_OP_*`).
pub(super) const STATUS_OP_BITS: u32 = 0x0007_0000;

/// A status word spelled out, e.g. "0x00090001 DONE|IMMEDIATE|OP_RECEIVE".
pub(super) fn status_str(s: u32) -> String {
    const BITS: [(u32, &str); 10] = [
        (STATUS_DONE, "DONE"),
        (STATUS_FORMAT_ERROR, "FORMAT_ERROR"),
        (STATUS_PROTECTION_ERROR, "PROTECTION_ERROR"),
        (STATUS_LENGTH_ERROR, "LENGTH_ERROR"),
        (STATUS_PARTIAL_ERROR, "PARTIAL_ERROR"),
        (STATUS_DESC_FLUSHED_ERROR, "DESC_FLUSHED_ERROR"),
        (STATUS_TRANSPORT_ERROR, "TRANSPORT_ERROR"),
        (STATUS_RDMA_PROT_ERROR, "RDMA_PROT_ERROR"),
        (STATUS_REMOTE_DESC_ERROR, "REMOTE_DESC_ERROR"),
        (STATUS_IMMEDIATE, "IMMEDIATE"),
    ];
    const OPS: [&str; 8] =
        ["OP_SEND", "OP_RECEIVE", "OP_RDMA_WRITE", "OP_REMOTE_RDMA_WRITE", "OP_RDMA_READ", "OP_5?", "OP_6?", "OP_7?"];
    let mut out = format!("0x{s:08x} ");
    for (bit, name) in BITS {
        if s & bit != 0 {
            out += name;
            out += "|";
        }
    }
    out += OPS[((s & STATUS_OP_BITS) >> 16) as usize];
    let known = BITS.iter().fold(STATUS_OP_BITS, |m, (b, _)| m | b);
    if s & !known != 0 {
        out += &format!("|RESERVED(0x{:x})", s & !known);
    }
    out
}

/// Where `got` first differs from `want`, as a message, or `None`.
pub(super) fn first_difference(want: &[u8], got: &[u8]) -> Option<String> {
    if want == got {
        return None;
    }
    let at = want.iter().zip(got).position(|(w, g)| w != g).unwrap_or(want.len().min(got.len()));
    Some(format!(
        "byte {at} of {}: expected 0x{:02x}, got 0x{:02x}",
        want.len(),
        want.get(at).copied().unwrap_or(0),
        got.get(at).copied().unwrap_or(0)
    ))
}

/// Where `got` first holds something other than `byte`, as a message.
pub(super) fn first_not(byte: u8, got: &[u8]) -> Option<String> {
    let at = got.iter().position(|&b| b != byte)?;
    Some(format!("byte {at} of {} changed to 0x{:02x}", got.len(), got[at]))
}
