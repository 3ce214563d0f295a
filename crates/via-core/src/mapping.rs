//! Whether an address range is mapped readable and writable in this process.
//!
//! `VipRegisterMem` is handed an address and a length by the application.
//! The provider reads and writes registered memory from its own code (a
//! message copied out of a ring, an RDMA write placed from a packet), so a
//! range that is not entirely mapped readable and writable would turn a
//! later access into a SIGSEGV inside the library.  Registration is the
//! control path, so the check asks the kernel once per registration:
//!
//! - `PROCMAP_QUERY` (Linux 6.11 and later), an `ioctl` on
//!   `/proc/self/maps` that answers with the mapping covering an address and
//!   its permissions: one call per mapping the range spans, whatever the
//!   number of mappings in the process;
//! - else the text of `/proc/self/maps`, one read per registration;
//! - and where `/proc` is not there at all, `msync`, which sees whether the
//!   range is mapped but not how: then a mapped range is taken as usable.
//!
//! Mappings change under the check if another thread maps or unmaps
//! meanwhile; that is the application's race, as is unmapping a region
//! that is still registered.

use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;

/// True when every byte of `[addr, addr + len)` lies in a mapping of this
/// process that is readable and writable.  An empty range or one that
/// wraps around the address space is not.
pub fn mapped_rw(addr: u64, len: u64) -> bool {
    let Some(end) = addr.checked_add(len) else {
        return false;
    };
    if len == 0 {
        return false;
    }
    let Ok(mut maps) = File::open("/proc/self/maps") else {
        return msync_mapped(addr, end);
    };
    if let Some(answer) = query_vmas(&maps, addr, end) {
        return answer;
    }
    let mut text = Vec::with_capacity(16 << 10);
    if maps.read_to_end(&mut text).is_err() {
        return msync_mapped(addr, end);
    }
    covered_rw(&text, addr, end)
}

/// `struct procmap_query` of `linux/fs.h`.
#[repr(C)]
#[derive(Default)]
struct ProcmapQuery {
    size: u64,
    query_flags: u64,
    query_addr: u64,
    vma_start: u64,
    vma_end: u64,
    vma_flags: u64,
    vma_page_size: u64,
    vma_offset: u64,
    inode: u64,
    dev_major: u32,
    dev_minor: u32,
    vma_name_size: u32,
    build_id_size: u32,
    vma_name_addr: u64,
    build_id_addr: u64,
}

/// `_IOWR('f', 17, struct procmap_query)`.
const PROCMAP_QUERY: u64 = (3 << 30) | ((std::mem::size_of::<ProcmapQuery>() as u64) << 16) | (0x66 << 8) | 17;
const PROCMAP_QUERY_VMA_READABLE: u64 = 0x01;
const PROCMAP_QUERY_VMA_WRITABLE: u64 = 0x02;

/// Walks the mappings covering `[addr, end)` with `PROCMAP_QUERY`; `None`
/// where the kernel does not know the request (before 6.11).
fn query_vmas(maps: &File, addr: u64, end: u64) -> Option<bool> {
    let mut at = addr;
    while at < end {
        let mut q =
            ProcmapQuery { size: std::mem::size_of::<ProcmapQuery>() as u64, query_addr: at, ..Default::default() };
        // SAFETY: `q` is a `struct procmap_query` with no name or build id
        // buffers (their sizes are 0); the kernel writes only into it.
        let rc = unsafe { libc::ioctl(maps.as_raw_fd(), PROCMAP_QUERY as _, &mut q as *mut ProcmapQuery) };
        if rc != 0 {
            return match std::io::Error::last_os_error().raw_os_error() {
                // No mapping covers `at`.
                Some(libc::ENOENT) => Some(false),
                // Anything else (ENOTTY before 6.11): read the text instead.
                _ => None,
            };
        }
        let rw = PROCMAP_QUERY_VMA_READABLE | PROCMAP_QUERY_VMA_WRITABLE;
        if q.vma_start > at || q.vma_end <= at {
            return None; // not the covering mapping: do not trust the answer
        }
        if q.vma_flags & rw != rw {
            return Some(false);
        }
        at = q.vma_end;
    }
    Some(true)
}

/// Whether the text of a `/proc/<pid>/maps` file shows `[addr, end)`
/// covered by mappings, without a gap, that are all readable and writable.
/// The file lists mappings in address order.
pub fn covered_rw(maps: &[u8], addr: u64, end: u64) -> bool {
    if addr >= end {
        return false;
    }
    let mut at = addr;
    for line in maps.split(|&b| b == b'\n') {
        let Some((start, stop, perms)) = parse_line(line) else {
            continue;
        };
        if stop <= at {
            continue;
        }
        if start > at {
            return false; // a gap
        }
        if perms.len() < 2 || perms[0] != b'r' || perms[1] != b'w' {
            return false;
        }
        at = stop;
        if at >= end {
            return true;
        }
    }
    false
}

/// `start-end perms ...` -> (start, end, perms).
fn parse_line(line: &[u8]) -> Option<(u64, u64, &[u8])> {
    let mut fields = line.split(|&b| b == b' ').filter(|f| !f.is_empty());
    let range = fields.next()?;
    let perms = fields.next()?;
    let dash = range.iter().position(|&b| b == b'-')?;
    let start = hex(&range[..dash])?;
    let stop = hex(&range[dash + 1..])?;
    (start < stop).then_some((start, stop, perms))
}

fn hex(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 16 {
        return None;
    }
    let mut value = 0u64;
    for &d in digits {
        let v = (d as char).to_digit(16)?;
        value = (value << 4) | v as u64;
    }
    Some(value)
}

/// Without `/proc`: whether `[addr, end)` is mapped at all.  `msync` with
/// `MS_ASYNC` writes nothing back and fails with `ENOMEM` where a page of
/// the range is not mapped.
fn msync_mapped(addr: u64, end: u64) -> bool {
    let page = page_size();
    let start = addr & !(page - 1);
    let Some(len) = end.checked_sub(start) else {
        return false;
    };
    // SAFETY: msync only inspects the mappings of the range.
    unsafe { libc::msync(start as *mut libc::c_void, len as usize, libc::MS_ASYNC) == 0 }
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if size > 0 {
        size as u64
    } else {
        4096
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fresh pages, readable and writable, unmapped on drop.
    struct Pages {
        base: u64,
        len: usize,
    }

    impl Pages {
        fn new(n: usize) -> Pages {
            let len = n * page_size() as usize;
            // SAFETY: a fresh anonymous mapping.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(p, libc::MAP_FAILED);
            Pages { base: p as u64, len }
        }

        fn page(&self, i: usize) -> u64 {
            self.base + (i as u64) * page_size()
        }

        fn protect(&self, i: usize, prot: i32) {
            // SAFETY: a page of our own mapping.
            assert_eq!(0, unsafe { libc::mprotect(self.page(i) as *mut libc::c_void, page_size() as usize, prot) });
        }

        fn unmap(&self, i: usize) {
            // SAFETY: a page of our own mapping; nothing refers to it.
            assert_eq!(0, unsafe { libc::munmap(self.page(i) as *mut libc::c_void, page_size() as usize) });
        }
    }

    impl Drop for Pages {
        fn drop(&mut self) {
            // SAFETY: our own mapping (pages already unmapped are skipped by the kernel).
            unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
        }
    }

    /// Both ways of asking, where the kernel has both.
    fn both(addr: u64, len: u64) -> bool {
        let end = addr + len;
        let text = std::fs::read("/proc/self/maps").unwrap();
        let by_text = covered_rw(&text, addr, end);
        if let Some(by_query) = query_vmas(&File::open("/proc/self/maps").unwrap(), addr, end) {
            assert_eq!(by_query, by_text, "{addr:#x}+{len:#x}");
        }
        assert_eq!(mapped_rw(addr, len), by_text, "{addr:#x}+{len:#x}");
        by_text
    }

    #[test]
    fn heap_stack_and_fresh_pages_are_usable() {
        let heap = vec![7u8; 100_000];
        assert!(both(heap.as_ptr() as u64, heap.len() as u64));
        let stack = [0u8; 256];
        assert!(both(stack.as_ptr() as u64, stack.len() as u64));
        let pages = Pages::new(3);
        assert!(both(pages.base, pages.len as u64));
        assert!(both(pages.base + 1, 1));
    }

    #[test]
    fn a_range_over_several_mappings_is_usable_when_all_are() {
        // MADV_DONTFORK on the middle page splits the mapping into three.
        let pages = Pages::new(3);
        // SAFETY: a page of our own mapping; only its fork behaviour changes.
        assert_eq!(0, unsafe {
            libc::madvise(pages.page(1) as *mut libc::c_void, page_size() as usize, libc::MADV_DONTFORK)
        });
        let text = std::fs::read("/proc/self/maps").unwrap();
        let starts = format!("{:x}-", pages.page(1));
        assert!(String::from_utf8_lossy(&text).lines().any(|l| l.starts_with(&starts)), "not split");
        assert!(both(pages.base, pages.len as u64));
        pages.protect(1, libc::PROT_READ);
        assert!(!both(pages.base, pages.len as u64));
        assert!(both(pages.page(0), page_size()));
        assert!(both(pages.page(2), page_size()));
    }

    #[test]
    fn unmapped_inaccessible_and_read_only_memory_is_not() {
        let pages = Pages::new(4);
        let page = page_size();
        pages.protect(1, libc::PROT_NONE);
        pages.protect(2, libc::PROT_READ);
        pages.unmap(3);
        assert!(both(pages.page(0), page));
        assert!(!both(pages.page(1), page));
        assert!(!both(pages.page(2), page));
        assert!(!both(pages.page(3), page));
        // A range whose last byte is in the next page.
        assert!(!both(pages.page(0), page + 1));
        assert!(!both(pages.page(2) + page - 1, 2));
        assert!(!both(pages.base, 4 * page));
    }

    #[test]
    fn huge_empty_and_wrapping_ranges_are_not() {
        let heap = Box::new([0u8; 64]);
        let addr = heap.as_ptr() as u64;
        assert!(!mapped_rw(addr, 1 << 40));
        assert!(!mapped_rw(addr, u64::MAX / 2));
        assert!(!mapped_rw(addr, 0));
        assert!(!mapped_rw(u64::MAX - 10, 100));
        assert!(!mapped_rw(0, 4096));
        assert!(!mapped_rw(0xdead_0000_0000_0000, 4096));
        assert!(!mapped_rw(u64::MAX - 4095, 4095));
    }

    #[test]
    fn the_text_of_the_maps_file() {
        let maps = b"\
1000-3000 rw-p 00000000 00:00 0 \n\
3000-4000 rwxp 00000000 00:00 0\n\
4000-5000 r--p 00000000 08:01 1234  /usr/lib/x\n\
6000-8000 rw-s 00000000 00:05 99    /memfd:seg (deleted)\n\
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0  [vsyscall]\n";
        assert!(covered_rw(maps, 0x1000, 0x4000));
        assert!(covered_rw(maps, 0x2fff, 0x3001));
        assert!(!covered_rw(maps, 0x1000, 0x4001));
        assert!(!covered_rw(maps, 0x4000, 0x4001));
        assert!(!covered_rw(maps, 0x5000, 0x6001)); // a gap
        assert!(covered_rw(maps, 0x6000, 0x8000));
        assert!(!covered_rw(maps, 0x6000, 0x8001));
        assert!(!covered_rw(maps, 0x0fff, 0x1001));
        assert!(!covered_rw(maps, 0x1000, 0x1000));
        assert!(!covered_rw(maps, 0xffff_ffff_ff60_0000, 0xffff_ffff_ff60_0001));
        assert!(!covered_rw(b"", 0x1000, 0x2000));
        assert!(!covered_rw(b"garbage\nzz-yy rw-p\n", 0x1000, 0x2000));
    }

    #[test]
    fn without_proc_mapped_memory_counts() {
        let pages = Pages::new(2);
        pages.unmap(1);
        assert!(msync_mapped(pages.base + 5, pages.base + 100));
        assert!(!msync_mapped(pages.base, pages.base + 2 * page_size()));
    }
}
