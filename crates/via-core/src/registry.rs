//! The memory registry: handle -> (address, length, protection tag, RDMA enables).
//!
//! Regions live in a fixed table whose slots never move, so that a peer
//! process can read a slot of it (by cross-memory attach) to check an RDMA
//! request against this process's registrations.  A handle is 16 bits of
//! slot index and 16 bits of generation: a stale or forged handle finds a
//! slot whose generation differs and is refused.  Lookups are lock-free.

use crate::consts::limits;
use crate::error::{ViaError, ViaResult};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Region flag: RDMA write into the region is allowed.
pub const REGION_RDMA_WRITE: u32 = 1;
/// Region flag: RDMA read from the region is allowed.
pub const REGION_RDMA_READ: u32 = 2;
/// Size in bytes of one slot of the table, as a peer reads it.
pub const REGION_SLOT_BYTES: usize = 32;

const SLOTS: usize = limits::MAX_REGISTER_REGIONS + 1; // slot 0 is never used

/// One slot of the table, laid out for readers in other processes.
#[repr(C)]
struct Slot {
    generation: AtomicU32,
    ptag: AtomicU32,
    flags: AtomicU32,
    _pad: u32,
    addr: AtomicU64,
    len: AtomicU64,
}

/// A registered region as seen by a lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    /// First byte.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Protection tag id.
    pub ptag: u32,
    /// `REGION_RDMA_WRITE` | `REGION_RDMA_READ`.
    pub flags: u32,
}

impl Region {
    /// True when `[addr, addr + len)` lies inside the region.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        match addr.checked_add(len) {
            Some(end) => addr >= self.addr && end <= self.addr + self.len,
            None => false,
        }
    }

    /// Decodes a slot read from another process and checks it against the
    /// handle that named it.  Untrusted bytes: any inconsistency is `None`.
    pub fn from_remote_slot(bytes: &[u8; REGION_SLOT_BYTES], handle: u32) -> Option<Region> {
        let word = |i: usize| u32::from_ne_bytes(bytes[i..i + 4].try_into().unwrap());
        let dword = |i: usize| u64::from_ne_bytes(bytes[i..i + 8].try_into().unwrap());
        let generation = word(0);
        if generation == 0 || generation != handle >> 16 {
            return None;
        }
        let region = Region { ptag: word(4), flags: word(8), addr: dword(16), len: dword(24) };
        region.addr.checked_add(region.len)?;
        Some(region)
    }
}

/// Where a peer finds the slot of `handle` in this process, given the table base.
pub fn slot_address(table: u64, handle: u32) -> Option<u64> {
    let index = (handle & 0xFFFF) as u64;
    if index == 0 {
        return None;
    }
    table.checked_add(index * REGION_SLOT_BYTES as u64)
}

struct Allocation {
    free: Vec<u16>,
    next_generation: Vec<u16>,
    ptag_users: std::collections::HashMap<u32, usize>,
    pinned: Vec<bool>,
}

/// The registry of one NIC.
pub struct Registry {
    table: *mut Slot,
    alloc: Mutex<Allocation>,
}

// The table is only touched through atomics; allocation state is behind a mutex.
unsafe impl Send for Registry {}
unsafe impl Sync for Registry {}

impl Registry {
    /// An empty registry.  The table is reserved, not touched: pages appear as regions do.
    pub fn new() -> ViaResult<Registry> {
        let bytes = SLOTS * std::mem::size_of::<Slot>();
        // SAFETY: anonymous private mapping, checked below.
        let table = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if table == libc::MAP_FAILED {
            return Err(ViaError::Resource);
        }
        Ok(Registry {
            table: table as *mut Slot,
            alloc: Mutex::new(Allocation {
                free: (1..SLOTS as u32).rev().map(|i| i as u16).collect(),
                next_generation: vec![1; SLOTS],
                ptag_users: Default::default(),
                pinned: vec![false; SLOTS],
            }),
        })
    }

    /// Address of the slot table, published to peers for RDMA checks.
    pub fn table_address(&self) -> u64 {
        self.table as u64
    }

    fn slot(&self, index: usize) -> &Slot {
        debug_assert!(index < SLOTS);
        // SAFETY: index < SLOTS, the mapping lives as long as self.
        unsafe { &*self.table.add(index) }
    }

    /// Registers `[addr, addr + len)` and returns its handle.
    pub fn register(&self, addr: u64, len: u64, ptag: u32, flags: u32, pin: bool) -> ViaResult<u32> {
        if addr == 0 || len == 0 || addr.checked_add(len).is_none() {
            return Err(ViaError::InvalidParameter);
        }
        if len > limits::MAX_REGISTER_BYTES {
            return Err(ViaError::Resource);
        }
        let mut alloc = self.alloc.lock();
        let index = alloc.free.pop().ok_or(ViaError::Resource)? as usize;
        if pin {
            // SAFETY: mlock only changes residency of the caller's pages.
            if unsafe { libc::mlock(addr as *const libc::c_void, len as usize) } != 0 {
                alloc.free.push(index as u16);
                return Err(ViaError::Resource);
            }
        }
        alloc.pinned[index] = pin;
        let generation = alloc.next_generation[index];
        alloc.next_generation[index] = if generation == u16::MAX { 1 } else { generation + 1 };
        *alloc.ptag_users.entry(ptag).or_default() += 1;
        let slot = self.slot(index);
        slot.ptag.store(ptag, Ordering::Relaxed);
        slot.flags.store(flags, Ordering::Relaxed);
        slot.addr.store(addr, Ordering::Relaxed);
        slot.len.store(len, Ordering::Relaxed);
        slot.generation.store(generation as u32, Ordering::Release);
        Ok(((generation as u32) << 16) | index as u32)
    }

    /// Looks a handle up; `None` for a free, stale or forged handle.
    pub fn lookup(&self, handle: u32) -> Option<Region> {
        let index = (handle & 0xFFFF) as usize;
        let generation = handle >> 16;
        if index == 0 || generation == 0 {
            return None;
        }
        let slot = self.slot(index);
        if slot.generation.load(Ordering::Acquire) != generation {
            return None;
        }
        let region = Region {
            addr: slot.addr.load(Ordering::Relaxed),
            len: slot.len.load(Ordering::Relaxed),
            ptag: slot.ptag.load(Ordering::Relaxed),
            flags: slot.flags.load(Ordering::Relaxed),
        };
        std::sync::atomic::fence(Ordering::Acquire);
        (slot.generation.load(Ordering::Relaxed) == generation).then_some(region)
    }

    /// Looks a handle up and checks that it was registered at `addr`.
    pub fn lookup_at(&self, handle: u32, addr: u64) -> ViaResult<Region> {
        match self.lookup(handle) {
            Some(region) if region.addr == addr => Ok(region),
            _ => Err(ViaError::InvalidParameter),
        }
    }

    /// Removes a registration; `addr` must be the address it was registered at.
    pub fn deregister(&self, handle: u32, addr: u64) -> ViaResult<()> {
        let mut alloc = self.alloc.lock();
        let region = self.lookup_at(handle, addr)?;
        let index = (handle & 0xFFFF) as usize;
        self.slot(index).generation.store(0, Ordering::Release);
        if std::mem::take(&mut alloc.pinned[index]) {
            // SAFETY: undoes the mlock of register.
            unsafe { libc::munlock(region.addr as *const libc::c_void, region.len as usize) };
        }
        if let Some(users) = alloc.ptag_users.get_mut(&region.ptag) {
            *users -= 1;
        }
        alloc.free.push(index as u16);
        Ok(())
    }

    /// Changes the protection tag and RDMA enables of a region.
    pub fn set_attributes(&self, handle: u32, addr: u64, ptag: u32, flags: u32) -> ViaResult<()> {
        let mut alloc = self.alloc.lock();
        let region = self.lookup_at(handle, addr)?;
        if let Some(users) = alloc.ptag_users.get_mut(&region.ptag) {
            *users -= 1;
        }
        *alloc.ptag_users.entry(ptag).or_default() += 1;
        let slot = self.slot((handle & 0xFFFF) as usize);
        slot.ptag.store(ptag, Ordering::Release);
        slot.flags.store(flags, Ordering::Release);
        Ok(())
    }

    /// Number of regions registered with `ptag`.
    pub fn ptag_users(&self, ptag: u32) -> usize {
        self.alloc.lock().ptag_users.get(&ptag).copied().unwrap_or(0)
    }

    /// Checks that `[addr, addr + len)` is inside the region of `handle` and carries `ptag`.
    pub fn check_local(&self, handle: u32, addr: u64, len: u64, ptag: u32) -> bool {
        matches!(self.lookup(handle), Some(r) if r.ptag == ptag && r.contains(addr, len))
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let pinned = std::mem::take(&mut self.alloc.get_mut().pinned);
        for (index, _) in pinned.iter().enumerate().filter(|(_, p)| **p) {
            {
                let slot = self.slot(index);
                // SAFETY: undoes the mlock of register.
                unsafe {
                    libc::munlock(
                        slot.addr.load(Ordering::Relaxed) as *const libc::c_void,
                        slot.len.load(Ordering::Relaxed) as usize,
                    )
                };
            }
        }
        // SAFETY: the mapping made in new().
        unsafe { libc::munmap(self.table as *mut libc::c_void, SLOTS * std::mem::size_of::<Slot>()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_lookup_deregister() {
        let reg = Registry::new().unwrap();
        let buf = vec![0u8; 4096];
        let addr = buf.as_ptr() as u64;
        let h = reg.register(addr, 4096, 7, REGION_RDMA_WRITE, false).unwrap();
        assert_ne!(h, 0);
        let r = reg.lookup(h).unwrap();
        assert_eq!((r.addr, r.len, r.ptag, r.flags), (addr, 4096, 7, REGION_RDMA_WRITE));
        assert!(reg.check_local(h, addr + 100, 100, 7));
        assert!(!reg.check_local(h, addr + 4000, 100, 7));
        assert!(!reg.check_local(h, addr, 10, 8));
        assert_eq!(reg.ptag_users(7), 1);
        assert_eq!(reg.deregister(h, addr + 1), Err(ViaError::InvalidParameter));
        reg.deregister(h, addr).unwrap();
        assert!(reg.lookup(h).is_none());
        assert_eq!(reg.ptag_users(7), 0);
        // The slot is reused with another generation: the old handle stays dead.
        let h2 = reg.register(addr, 16, 7, 0, false).unwrap();
        assert_eq!(h2 & 0xFFFF, h & 0xFFFF);
        assert_ne!(h2, h);
        assert!(reg.lookup(h).is_none());
    }

    #[test]
    fn forged_handles_are_refused() {
        let reg = Registry::new().unwrap();
        for h in [0u32, 1, 0xFFFF, 0x1_0000, 0xDEAD_BEEF, u32::MAX] {
            assert!(reg.lookup(h).is_none(), "{h:#x}");
        }
        assert_eq!(reg.register(0, 10, 1, 0, false), Err(ViaError::InvalidParameter));
        assert_eq!(reg.register(4096, 0, 1, 0, false), Err(ViaError::InvalidParameter));
    }

    #[test]
    fn remote_slot_decoding_checks_the_generation() {
        let reg = Registry::new().unwrap();
        let buf = [0u8; 64];
        let h = reg.register(buf.as_ptr() as u64, 64, 3, REGION_RDMA_READ, false).unwrap();
        let at = slot_address(reg.table_address(), h).unwrap();
        let mut bytes = [0u8; REGION_SLOT_BYTES];
        // SAFETY: reading our own table as a peer would.
        unsafe { std::ptr::copy_nonoverlapping(at as *const u8, bytes.as_mut_ptr(), REGION_SLOT_BYTES) };
        let r = Region::from_remote_slot(&bytes, h).unwrap();
        assert_eq!(r, reg.lookup(h).unwrap());
        assert!(Region::from_remote_slot(&bytes, h ^ 0x1_0000).is_none());
        bytes[24..32].copy_from_slice(&u64::MAX.to_ne_bytes());
        assert!(Region::from_remote_slot(&bytes, h).is_none());
    }

    #[test]
    fn the_table_runs_out_cleanly() {
        let reg = Registry::new().unwrap();
        let buf = [0u8; 8];
        let mut n = 0;
        while reg.register(buf.as_ptr() as u64, 8, 1, 0, false).is_ok() {
            n += 1;
        }
        assert_eq!(n, limits::MAX_REGISTER_REGIONS);
    }
}
