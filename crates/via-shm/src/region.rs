//! A `MAP_SHARED` mapping of a sealed memfd.

use rustix::fs::{self, MemfdFlags, SealFlags};
use rustix::mm::{self, MapFlags, ProtFlags};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::{self, NonNull};

/// A read-write shared mapping of a whole memfd; unmapped on drop.
///
/// The file is sealed against shrinking, so no process holding the fd can
/// truncate it under our mapping (which would turn accesses into SIGBUS).
pub struct SharedRegion {
    fd: OwnedFd,
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the region is plain memory shared with other processes anyway;
// every access through it goes through atomics or raw copies that tolerate
// concurrent writers.
unsafe impl Send for SharedRegion {}
// SAFETY: as above.
unsafe impl Sync for SharedRegion {}

impl SharedRegion {
    /// Creates an anonymous memfd of `len` bytes (close-on-exec, sealed
    /// against resizing) and maps it.
    pub fn create(name: &str, len: usize) -> io::Result<SharedRegion> {
        Self::create_sealed(name, len, Populate::Now)
    }

    /// As [`SharedRegion::create`], but pages are allocated when first
    /// touched: for large segments of which a process uses a small part
    /// (a completion lane: only the queues of the CQs that exist).
    pub fn create_lazy(name: &str, len: usize) -> io::Result<SharedRegion> {
        Self::create_sealed(name, len, Populate::OnTouch)
    }

    fn create_sealed(name: &str, len: usize, populate: Populate) -> io::Result<SharedRegion> {
        let region = Self::create_unsealed(name, len, populate)?;
        fs::fcntl_add_seals(&region.fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
        Ok(region)
    }

    /// Creates a memfd of `len` bytes that only this process may write:
    /// mapped read-write here, then sealed against every new writable
    /// mapping (`F_SEAL_FUTURE_WRITE`), so that a process that receives the
    /// fd can map it read-only and nothing else, however it reopens it.
    pub fn create_owner_written(name: &str, len: usize) -> io::Result<SharedRegion> {
        let region = Self::create_unsealed(name, len, Populate::Now)?;
        let seals = SealFlags::SHRINK | SealFlags::GROW | SealFlags::FUTURE_WRITE | SealFlags::SEAL;
        fs::fcntl_add_seals(&region.fd, seals)?;
        Ok(region)
    }

    fn create_unsealed(name: &str, len: usize, populate: Populate) -> io::Result<SharedRegion> {
        let size = i64::try_from(len)
            .ok()
            .filter(|&s| s > 0)
            .ok_or_else(|| invalid(io::ErrorKind::InvalidInput, "bad shared region size"))?;
        if name.contains('\0') {
            return Err(invalid(io::ErrorKind::InvalidInput, "NUL in region name"));
        }
        let fd = fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
        fs::ftruncate(&fd, size as u64)?;
        Self::mmap(fd, len, ProtFlags::READ | ProtFlags::WRITE, populate)
    }

    /// Maps the whole of a memfd received from another process.
    ///
    /// The file must be sealed against shrinking, or sealable now; anything
    /// else (a regular file, an unsealable memfd) is refused.
    pub fn map(fd: OwnedFd) -> io::Result<SharedRegion> {
        let len = Self::sealed_len(&fd)?;
        Self::mmap(fd, len, ProtFlags::READ | ProtFlags::WRITE, Populate::Now)
    }

    /// Maps a memfd received from another process if it is exactly `len`
    /// bytes long: the size is checked before anything is mapped, so that a
    /// peer cannot make this process map (and populate) more than it chose.
    pub fn map_exact(fd: OwnedFd, len: usize) -> io::Result<SharedRegion> {
        match Self::sealed_len(&fd)? {
            l if l == len => Self::mmap(fd, len, ProtFlags::READ | ProtFlags::WRITE, Populate::Now),
            _ => Err(invalid(io::ErrorKind::InvalidData, "shared region of the wrong size")),
        }
    }

    /// As [`SharedRegion::map_exact`], with pages mapped when first touched.
    pub fn map_exact_lazy(fd: OwnedFd, len: usize) -> io::Result<SharedRegion> {
        match Self::sealed_len(&fd)? {
            l if l == len => Self::mmap(fd, len, ProtFlags::READ | ProtFlags::WRITE, Populate::OnTouch),
            _ => Err(invalid(io::ErrorKind::InvalidData, "shared region of the wrong size")),
        }
    }

    /// Maps a memfd of exactly `len` bytes read-only: memory another
    /// process writes and this one only reads.  Nothing may be written
    /// through [`SharedRegion::as_ptr`] of such a region.
    pub fn map_read_only(fd: OwnedFd, len: usize) -> io::Result<SharedRegion> {
        match Self::sealed_len(&fd)? {
            l if l == len => Self::mmap(fd, len, ProtFlags::READ, Populate::Now),
            _ => Err(invalid(io::ErrorKind::InvalidData, "shared region of the wrong size")),
        }
    }

    /// The size of a memfd, after making sure it cannot shrink.
    fn sealed_len(fd: &OwnedFd) -> io::Result<usize> {
        // Sealed before fstat so the size cannot shrink after we read it.
        if !fs::fcntl_get_seals(fd)?.contains(SealFlags::SHRINK) {
            fs::fcntl_add_seals(fd, SealFlags::SHRINK)?;
        }
        let len = fs::fstat(fd)?.st_size;
        usize::try_from(len)
            .ok()
            .filter(|&l| l > 0)
            .ok_or_else(|| invalid(io::ErrorKind::InvalidData, "empty shared region"))
    }

    fn mmap(fd: OwnedFd, len: usize, prot: ProtFlags, populate: Populate) -> io::Result<SharedRegion> {
        // Populated now unless asked otherwise, so that the data path never
        // takes a page fault (a ring's slots are first written one page at
        // a time otherwise).  A writable region of a huge page or more asks
        // for transparent huge pages first (see `advise_huge_and_populate`).
        let huge = populate == Populate::Now && prot.contains(ProtFlags::WRITE) && len >= HUGE_PAGE;
        let flags = match populate {
            Populate::Now if !huge => MapFlags::SHARED | MapFlags::POPULATE,
            _ => MapFlags::SHARED,
        };
        // SAFETY: a fresh shared mapping (at an address the kernel picks) of
        // a file that cannot shrink below `len`.
        let p = unsafe { mm::mmap(ptr::null_mut(), len, prot, flags, &fd, 0) }?;
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| invalid(io::ErrorKind::Other, "null mapping"))?;
        let region = SharedRegion { fd, ptr, len };
        if huge {
            region.advise_huge_and_populate();
        }
        Ok(region)
    }

    /// Asks for transparent huge pages, then populates the mapping.
    ///
    /// A connection segment keeps the lines its messages touch in its first
    /// pages; at a thousand connections those pages outnumber the TLB's
    /// entries.  Where the kernel backs shared memory with huge pages on
    /// request (`/sys/kernel/mm/transparent_hugepage/shmem_enabled` is
    /// `advise`, `always` or `within_size`) they take one entry each.
    /// Elsewhere the advice changes nothing.
    fn advise_huge_and_populate(&self) {
        let (p, len) = (self.ptr.as_ptr().cast(), self.len);
        // SAFETY: advice on our own fresh mapping; neither call changes its
        // contents (MADV_POPULATE_WRITE faults pages in as writes would).
        let populated = unsafe {
            let _ = mm::madvise(p, len, mm::Advice::LinuxHugepage);
            mm::madvise(p, len, mm::Advice::LinuxPopulateWrite)
        };
        // Other errors are left to the first touch, as MAP_POPULATE
        // leaves them.
        if populated != Err(rustix::io::Errno::INVAL) {
            return;
        }
        // Kernels before 5.14: a read faults a shared page in, as
        // MAP_POPULATE would have.
        for offset in (0..len).step_by(4096) {
            // SAFETY: inside the mapping, which the sealed file backs whole.
            unsafe { ptr::read_volatile(self.ptr.as_ptr().add(offset)) };
        }
    }

    /// The identity of the file behind `fd` (device and inode): two fds of
    /// one memfd, received at different times, have the same identity.
    pub fn file_identity(fd: BorrowedFd<'_>) -> io::Result<(u64, u64)> {
        let st = fs::fstat(fd)?;
        Ok((st.st_dev, st.st_ino))
    }

    /// The memfd, e.g. to hand it to another process.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The size of the mapping in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a region is never empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The start of the mapping (page aligned).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for SharedRegion {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `mmap`, which nothing
        // uses once the region is dropped.
        let _ = unsafe { mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// When the pages of a mapping are allocated.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Populate {
    Now,
    OnTouch,
}

/// The size of an x86-64 (and arm64 4K-granule) huge page.
const HUGE_PAGE: usize = 2 << 20;

fn invalid(kind: io::ErrorKind, msg: &'static str) -> io::Error {
    io::Error::new(kind, msg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;
    use std::os::fd::AsRawFd;

    /// The `smaps` entry of the mapping that starts at `at`: its fields
    /// (`Rss`, `VmFlags`, ...) by name.
    fn smaps(at: *mut u8) -> std::collections::HashMap<String, String> {
        let text = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let start = format!("{:x}-", at as usize);
        let mut lines = text.lines().skip_while(|l| !l.starts_with(&start)).skip(1);
        // Field lines ("Rss:  8 kB") up to the next mapping's line.
        std::iter::from_fn(|| lines.next().and_then(|l| l.split_once(':')).filter(|(k, _)| !k.contains(' ')))
            .map(|(k, v)| (k.to_string(), v.trim().to_string()))
            .collect()
    }

    #[test]
    fn large_regions_ask_for_huge_pages_and_come_populated() {
        let len = 3 * HUGE_PAGE / 2 + 4096;
        let created = SharedRegion::create("huge", len).unwrap();
        let mapped = SharedRegion::map_exact(created.fd().try_clone_to_owned().unwrap(), len).unwrap();
        for region in [&created, &mapped] {
            let fields = smaps(region.as_ptr());
            // A kernel built without transparent huge pages refuses the advice.
            let thp = std::path::Path::new("/sys/kernel/mm/transparent_hugepage").exists();
            assert_eq!(fields["VmFlags"].split(' ').any(|f| f == "hg"), thp, "huge-page advice: {fields:?}");
            assert_eq!(fields["Rss"], format!("{} kB", len / 1024), "not populated: {fields:?}");
        }
        // A small one is mapped as before.
        let small = SharedRegion::create("small", 8192).unwrap();
        assert!(!smaps(small.as_ptr())["VmFlags"].split(' ').any(|f| f == "hg"));
        assert_eq!(smaps(small.as_ptr())["Rss"], "8 kB");
    }

    #[test]
    fn two_mappings_share_bytes() {
        let a = SharedRegion::create("t", 8192).unwrap();
        let b = SharedRegion::map(a.fd().try_clone_to_owned().unwrap()).unwrap();
        assert_eq!(b.len(), 8192);
        // SAFETY: both offsets are inside the 8192-byte mappings.
        unsafe {
            a.as_ptr().add(5000).write(0x5a);
            assert_eq!(b.as_ptr().add(5000).read(), 0x5a);
        }
    }

    #[test]
    fn an_owner_written_region_cannot_be_mapped_writable_by_anyone_else() {
        let owner = SharedRegion::create_owner_written("t", 8192).unwrap();
        // SAFETY: inside the owner's writable mapping.
        unsafe { owner.as_ptr().add(100).write(7) };
        let fd = || owner.fd().try_clone_to_owned().unwrap();
        assert!(SharedRegion::map(fd()).is_err());
        // Not even through a fresh open of the file.
        let path = format!("/proc/self/fd/{}", owner.fd().as_raw_fd());
        let reopened = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
        assert!(SharedRegion::map(reopened.into()).is_err());
        let reader = SharedRegion::map_read_only(fd(), 8192).unwrap();
        // SAFETY: inside the reader's mapping.
        assert_eq!(unsafe { reader.as_ptr().add(100).read() }, 7);
        assert!(SharedRegion::map_read_only(fd(), 4096).is_err());
    }

    #[test]
    fn map_exact_checks_the_size_before_mapping() {
        let a = SharedRegion::create("t", 8192).unwrap();
        assert!(SharedRegion::map_exact(a.fd().try_clone_to_owned().unwrap(), 4096).is_err());
        assert_eq!(SharedRegion::map_exact(a.fd().try_clone_to_owned().unwrap(), 8192).unwrap().len(), 8192);
    }

    #[test]
    fn refuses_what_is_not_a_sealable_memfd() {
        assert!(SharedRegion::create("t", 0).is_err());
        assert!(SharedRegion::create("a\0b", 4096).is_err());
        let f = File::open("/proc/self/exe").unwrap();
        assert!(SharedRegion::map(f.into()).is_err());
    }
}
