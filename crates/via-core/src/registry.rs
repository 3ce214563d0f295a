//! The memory registry: handle -> (address, length, protection tag, RDMA enables).
//!
//! Regions live in a fixed table whose slots never move.  The provider
//! keeps the table in memory it shares read-only with the processes this
//! one is connected to on the host, so that a peer checks an RDMA request
//! against this process's registrations with a few loads
//! ([`PublishedTable`]).  A handle is 16 bits of slot index and 16 bits of
//! generation: a stale or forged handle finds a slot whose generation
//! differs and is refused.  Lookups are lock-free.

use crate::consts::limits;
use crate::error::{ViaError, ViaResult};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Region flag: RDMA write into the region is allowed.
pub const REGION_RDMA_WRITE: u32 = 1;
/// Region flag: RDMA read from the region is allowed.
pub const REGION_RDMA_READ: u32 = 2;

const SLOTS: usize = limits::MAX_REGISTER_REGIONS + 1; // slot 0 is never used
/// Bytes of a registry's table, as [`Registry::in_table`] takes it.
pub const TABLE_BYTES: usize = SLOTS * std::mem::size_of::<Slot>();

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
        match (addr.checked_add(len), self.addr.checked_add(self.len)) {
            (Some(end), Some(region_end)) => addr >= self.addr && end <= region_end,
            _ => false,
        }
    }
}

/// The slot index of `handle`, or `None` for the never-used slot 0.
fn index_of(handle: u32) -> Option<usize> {
    let index = (handle & 0xFFFF) as usize;
    (index != 0 && handle >> 16 != 0).then_some(index)
}

/// The region in `slot` if it is still the one `handle` names.  The slot
/// may be rewritten meanwhile (by this process, or by the table's owner for
/// a [`PublishedTable`]): the generation is read before and after the
/// fields, and a slot that changed is refused like a stale handle.
fn read_slot(slot: &Slot, handle: u32) -> Option<Region> {
    let generation = handle >> 16;
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

struct Allocation {
    free: Vec<u16>,
    next_generation: Vec<u16>,
    ptag_users: std::collections::HashMap<u32, usize>,
    pinned: Vec<bool>,
}

/// The registry of one NIC.
pub struct Registry {
    table: *mut Slot,
    /// Whether `table` is this registry's own mapping, unmapped on drop.
    owns_table: bool,
    alloc: Mutex<Allocation>,
    /// Counts deregistrations: [`Registry::deregistrations`].
    deregistrations: AtomicU32,
}

// The table is only touched through atomics; allocation state is behind a mutex.
unsafe impl Send for Registry {}
unsafe impl Sync for Registry {}

impl Registry {
    /// An empty registry with a table of its own, which no other process
    /// sees.  The table is reserved, not touched: pages appear as regions do.
    pub fn new() -> ViaResult<Registry> {
        // SAFETY: anonymous private mapping, checked below.
        let table = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                TABLE_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if table == libc::MAP_FAILED {
            return Err(ViaError::Resource);
        }
        Ok(Self::over(table as *mut Slot, true))
    }

    /// An empty registry whose table is the `TABLE_BYTES` at `table`: memory
    /// the caller shares with the processes that check RDMA requests
    /// against this registry through a [`PublishedTable`].
    ///
    /// # Safety
    /// `table` must be 8-byte aligned, zeroed, readable and writable for
    /// `TABLE_BYTES`, written by nobody else, and outlive the registry.
    pub unsafe fn in_table(table: *mut u8) -> Registry {
        Self::over(table.cast::<Slot>(), false)
    }

    fn over(table: *mut Slot, owns_table: bool) -> Registry {
        Registry {
            table,
            owns_table,
            alloc: Mutex::new(Allocation {
                free: (1..SLOTS as u32).rev().map(|i| i as u16).collect(),
                next_generation: vec![1; SLOTS],
                ptag_users: Default::default(),
                pinned: vec![false; SLOTS],
            }),
            deregistrations: AtomicU32::new(0),
        }
    }

    fn slot(&self, index: usize) -> &Slot {
        debug_assert!(index < SLOTS);
        // SAFETY: index < SLOTS, the mapping lives as long as self.
        unsafe { &*self.table.add(index) }
    }

    /// Registers `[addr, addr + len)` and returns its handle.  The range
    /// must be mapped readable and writable in this process, every byte of
    /// it (`VIP_INVALID_PARAMETER` otherwise): the provider reads and
    /// writes registered memory itself ([`crate::mapping`]).
    pub fn register(&self, addr: u64, len: u64, ptag: u32, flags: u32, pin: bool) -> ViaResult<u32> {
        if addr == 0 || len == 0 || addr.checked_add(len).is_none() {
            return Err(ViaError::InvalidParameter);
        }
        if len > limits::MAX_REGISTER_BYTES {
            return Err(ViaError::Resource);
        }
        if !crate::mapping::mapped_rw(addr, len) {
            return Err(ViaError::InvalidParameter);
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
        read_slot(self.slot(index_of(handle)?), handle)
    }

    /// Whether `handle` still names a registered region: its slot's
    /// generation, one load.  What the data path asks before it writes into
    /// a descriptor that was checked when it was posted, since its region
    /// may have been deregistered (and its memory unmapped) meanwhile.  A
    /// region's address and length never change while its handle lives.
    #[inline]
    pub fn is_live(&self, handle: u32) -> bool {
        match index_of(handle) {
            Some(index) => self.slot(index).generation.load(Ordering::Acquire) == handle >> 16,
            None => false,
        }
    }

    /// How many regions were deregistered so far (modulo 2^32).  A posted
    /// receive notes it; where bytes land, an unchanged count means that
    /// no region went since, in one load, and only otherwise are the
    /// descriptor and its buffers asked again
    /// ([`crate::descriptor::buffers_registered`]).  (4 billion
    /// deregistrations while one receive stays posted would fool it.)
    #[inline]
    pub fn deregistrations(&self) -> u32 {
        self.deregistrations.load(Ordering::Acquire)
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
        self.deregistrations.fetch_add(1, Ordering::AcqRel);
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
        if self.owns_table {
            // SAFETY: the mapping made in new().
            unsafe { libc::munmap(self.table as *mut libc::c_void, TABLE_BYTES) };
        }
    }
}

/// Another process's registry table, mapped read-only: what an RDMA
/// request to that process is checked against.  Its owner rewrites slots
/// at any time, and the bytes are untrusted: a slot is taken only if its
/// generation matches the handle before and after it is read, and a region
/// that wraps around the address space contains nothing.
pub struct PublishedTable {
    table: *const Slot,
}

impl PublishedTable {
    /// The table whose `TABLE_BYTES` are mapped at `table`.
    ///
    /// # Safety
    /// `table` must be 8-byte aligned and readable for `TABLE_BYTES` for as
    /// long as the view is used.
    pub unsafe fn new(table: *const u8) -> PublishedTable {
        PublishedTable { table: table.cast::<Slot>() }
    }

    /// The region `handle` names, as the owner last published it; `None`
    /// for a free, stale or forged handle.
    pub fn lookup(&self, handle: u32) -> Option<Region> {
        let index = index_of(handle)?;
        // SAFETY: index < SLOTS (16 bits), inside the table `new` was given;
        // any bit pattern is a valid slot of atomics.
        read_slot(unsafe { &*self.table.add(index) }, handle)
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
    fn a_published_table_shows_what_the_owner_registers() {
        let mut table = vec![0u64; TABLE_BYTES / 8];
        // SAFETY: the table is zeroed, aligned, ours alone, and outlives both views.
        let (reg, peer) =
            unsafe { (Registry::in_table(table.as_mut_ptr().cast()), PublishedTable::new(table.as_ptr().cast())) };
        let buf = [0u8; 64];
        let addr = buf.as_ptr() as u64;
        let h = reg.register(addr, 64, 3, REGION_RDMA_READ, false).unwrap();
        assert_eq!(peer.lookup(h), reg.lookup(h));
        assert_eq!(peer.lookup(h).unwrap(), Region { addr, len: 64, ptag: 3, flags: REGION_RDMA_READ });
        // Changed attributes show at once; stale, forged and slot-0 handles find nothing.
        reg.set_attributes(h, addr, 4, REGION_RDMA_WRITE).unwrap();
        assert_eq!(peer.lookup(h).map(|r| (r.ptag, r.flags)), Some((4, REGION_RDMA_WRITE)));
        for forged in [h ^ 0x1_0000, h & 0xFFFF, h & 0xFFFF_0000, 0, u32::MAX] {
            assert!(peer.lookup(forged).is_none(), "{forged:#x}");
        }
        reg.deregister(h, addr).unwrap();
        assert!(peer.lookup(h).is_none());
        drop(reg);
    }

    #[test]
    fn a_region_that_wraps_around_contains_nothing() {
        let wrapped = Region { addr: u64::MAX - 10, len: 100, ptag: 1, flags: 0 };
        assert!(!wrapped.contains(u64::MAX - 5, 1));
        assert!(!wrapped.contains(0, 1));
        let fine = Region { addr: 4096, len: 100, ptag: 1, flags: 0 };
        assert!(fine.contains(4096, 100) && !fine.contains(4096, 101) && !fine.contains(u64::MAX, 2));
    }

    #[test]
    fn memory_that_is_not_mapped_readable_and_writable_is_refused() {
        let reg = Registry::new().unwrap();
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        // SAFETY: a fresh anonymous mapping of three pages, ours alone.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                3 * page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        let addr = base as u64;
        // SAFETY: pages of our own mapping.
        unsafe {
            libc::mprotect(base.cast::<u8>().add(page).cast(), page, libc::PROT_READ);
            libc::munmap(base.cast::<u8>().add(2 * page).cast(), page);
        }
        let h = reg.register(addr, page as u64, 1, 0, false).unwrap();
        for (at, len) in
            [(addr, 2 * page as u64), (addr + page as u64, 1), (addr + 2 * page as u64, 8), (addr, 1 << 39)]
        {
            assert_eq!(reg.register(at, len, 1, 0, false), Err(ViaError::InvalidParameter), "{at:#x}+{len}");
        }
        // Refusals take no slot and no ptag use.
        assert_eq!(reg.ptag_users(1), 1);
        reg.deregister(h, addr).unwrap();
        // SAFETY: the rest of our mapping.
        unsafe { libc::munmap(base, 2 * page) };
    }

    #[test]
    fn a_handle_lives_until_it_is_deregistered() {
        let reg = Registry::new().unwrap();
        let buf = [0u8; 64];
        let addr = buf.as_ptr() as u64;
        let h = reg.register(addr, 64, 1, 0, false).unwrap();
        assert!(reg.is_live(h));
        for forged in [0, h & 0xFFFF, h & 0xFFFF_0000, h ^ 0x1_0000, u32::MAX] {
            assert!(!reg.is_live(forged), "{forged:#x}");
        }
        reg.deregister(h, addr).unwrap();
        assert!(!reg.is_live(h));
        let h2 = reg.register(addr, 64, 1, 0, false).unwrap();
        assert!(reg.is_live(h2) && !reg.is_live(h));
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
