//! The table a process publishes to the processes it is connected to on
//! this host: its memory registry's, so that a peer checks an RDMA request
//! against it with a few loads instead of a system call.
//!
//! The table is a memfd of its own, apart from the CQ inbox that peers
//! write: its owner maps it read-write and then seals it against every new
//! writable mapping (`F_SEAL_FUTURE_WRITE`), so a peer that receives the fd
//! can map it read-only and nothing else, and cannot change what this
//! process has registered.

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};

use crate::SharedRegion;

/// Bytes of a published table (the memory registry's table fits).
pub const TABLE_SEGMENT_BYTES: usize = 2 << 20;

/// A mapped table segment, as its owner (writable) or as a peer (read-only).
pub struct TableSegment {
    region: SharedRegion,
}

impl TableSegment {
    /// Creates, maps and seals a zeroed table (for its owner).
    pub fn create() -> io::Result<TableSegment> {
        Ok(TableSegment { region: SharedRegion::create_owner_written("openvia-registry", TABLE_SEGMENT_BYTES)? })
    }

    /// Maps a peer's table read-only; anything but a sealed memfd of
    /// exactly [`TABLE_SEGMENT_BYTES`] is refused before it is mapped.
    pub fn map(fd: OwnedFd) -> io::Result<TableSegment> {
        Ok(TableSegment { region: SharedRegion::map_read_only(fd, TABLE_SEGMENT_BYTES)? })
    }

    /// The memfd, to hand to peers.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.region.fd()
    }

    /// The table: [`TABLE_SEGMENT_BYTES`], page aligned, zeroed when
    /// created.  Only the owner's mapping may be written through it.
    pub fn as_ptr(&self) -> *mut u8 {
        self.region.as_ptr()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_see_the_owners_writes_and_cannot_write() {
        let owner = TableSegment::create().unwrap();
        let peer = TableSegment::map(owner.fd().try_clone_to_owned().unwrap()).unwrap();
        // SAFETY: inside the owner's writable mapping and the peer's mapping.
        unsafe {
            owner.as_ptr().add(TABLE_SEGMENT_BYTES - 8).cast::<u64>().write_volatile(0x5eed);
            assert_eq!(peer.as_ptr().add(TABLE_SEGMENT_BYTES - 8).cast::<u64>().read_volatile(), 0x5eed);
        }
        assert_eq!(&mapping_permissions(peer.as_ptr() as usize).unwrap()[..2], "r-");
        assert_eq!(&mapping_permissions(owner.as_ptr() as usize).unwrap()[..2], "rw");
        // A peer that asks for a writable mapping of the same file is refused.
        assert!(SharedRegion::map(owner.fd().try_clone_to_owned().unwrap()).is_err());
        // SAFETY: mprotect of the peer's own read-only mapping.
        let r =
            unsafe { libc::mprotect(peer.as_ptr().cast(), TABLE_SEGMENT_BYTES, libc::PROT_READ | libc::PROT_WRITE) };
        assert_ne!(r, 0, "a read-only mapping of a sealed table became writable");
    }

    #[test]
    fn a_segment_of_another_size_is_refused() {
        let other = SharedRegion::create("t", TABLE_SEGMENT_BYTES * 2).unwrap();
        assert!(TableSegment::map(other.fd().try_clone_to_owned().unwrap()).is_err());
    }

    /// The permissions (`rw-s` and the like) of the mapping holding `addr`.
    fn mapping_permissions(addr: usize) -> Option<String> {
        std::fs::read_to_string("/proc/self/maps").unwrap().lines().find_map(|line| {
            let (range, rest) = line.split_once(' ')?;
            let (start, end) = range.split_once('-')?;
            let (start, end) = (usize::from_str_radix(start, 16).ok()?, usize::from_str_radix(end, 16).ok()?);
            (start <= addr && addr < end).then(|| rest[..4].to_string())
        })
    }
}
