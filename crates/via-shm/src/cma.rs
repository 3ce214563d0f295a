//! Cross-memory attach: copies between our memory and another process's
//! with `process_vm_writev` / `process_vm_readv`.

use smallvec::SmallVec;
use std::io::{self, IoSlice, IoSliceMut};

/// Most iovecs the kernel takes per call on each side.
const IOV_MAX: usize = 1024;
/// Most bytes asked for per call, far below the kernel's `ssize_t` limit.
const CALL_MAX: usize = 1 << 30;

/// Writes the gathered `local` bytes into the `(address, length)` ranges of
/// process `pid`, in order.
///
/// Transfers `min(sum of local, sum of remote)` bytes over as many calls as
/// needed.  Returns the count moved, which is short when a later remote range
/// is not writable; an error only when nothing could be moved.
pub fn write_remote(pid: i32, local: &[IoSlice<'_>], remote: &[(u64, usize)]) -> io::Result<usize> {
    let local: Ranges = local.iter().map(|s| (s.as_ptr() as usize, s.len())).collect();
    transfer(pid, &local, remote, true)
}

/// Reads the `(address, length)` ranges of process `pid` into the scattered
/// `local` buffers, in order.  Counts and errors as in [`write_remote`].
pub fn read_remote(pid: i32, local: &mut [IoSliceMut<'_>], remote: &[(u64, usize)]) -> io::Result<usize> {
    let local: Ranges = local.iter_mut().map(|s| (s.as_mut_ptr() as usize, s.len())).collect();
    transfer(pid, &local, remote, false)
}

/// Lets `pid` use cross-memory attach on us where Yama restricts ptrace.
///
/// Errors are ignored: without Yama the call fails with `EINVAL` and no
/// permission is needed beyond the same user.
pub fn allow_peer(pid: i32) {
    let Ok(pid) = libc::c_ulong::try_from(pid) else {
        return;
    };
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(libc::PR_SET_PTRACER, pid, 0, 0, 0) };
}

/// True if one byte at `remote_addr` of `pid` can be read, i.e. whether
/// cross-memory attach to that process is permitted.
pub fn probe(pid: i32, remote_addr: u64) -> bool {
    let mut b = [0u8; 1];
    matches!(read_remote(pid, &mut [IoSliceMut::new(&mut b)], &[(remote_addr, 1)]), Ok(1))
}

/// Whether the kernel lets this process cross-memory attach to `pid`:
/// a one-byte read at address 0, which faults (`EFAULT`) where attaching
/// is permitted and is refused (`EPERM`, or `ESRCH` for a process gone)
/// where it is not.
pub fn may_attach(pid: i32) -> bool {
    let mut b = [0u8; 1];
    match read_remote(pid, &mut [IoSliceMut::new(&mut b)], &[(0, 1)]) {
        Ok(_) => true,
        Err(e) => e.raw_os_error() == Some(libc::EFAULT),
    }
}

/// `(address, length)` ranges, inline for the usual few: a copy of a small
/// message allocates nothing.
type Ranges = SmallVec<[(usize, usize); 4]>;

/// The iovecs of one call, inline for the usual few.
type Iovecs = SmallVec<[libc::iovec; 4]>;

/// A position inside a list of `(address, length)` ranges.
struct Cursor<'a> {
    ranges: &'a [(usize, usize)],
    index: usize,
    offset: usize,
}

impl Cursor<'_> {
    /// Fills `out` with up to IOV_MAX iovecs (at most CALL_MAX bytes) from the
    /// current position.
    fn batch(&self, out: &mut Iovecs) {
        out.clear();
        let mut bytes = 0usize;
        let mut offset = self.offset;
        for &(addr, len) in &self.ranges[self.index..] {
            if out.len() == IOV_MAX || bytes == CALL_MAX {
                break;
            }
            let n = (len - offset).min(CALL_MAX - bytes);
            if n > 0 {
                out.push(libc::iovec { iov_base: addr.wrapping_add(offset) as *mut libc::c_void, iov_len: n });
                bytes += n;
            }
            offset = 0;
        }
    }

    fn advance(&mut self, mut n: usize) {
        while n > 0 && self.index < self.ranges.len() {
            let step = (self.ranges[self.index].1 - self.offset).min(n);
            n -= step;
            self.offset += step;
            if self.offset == self.ranges[self.index].1 {
                self.index += 1;
                self.offset = 0;
            }
        }
    }
}

fn transfer(pid: i32, local: &[(usize, usize)], remote: &[(u64, usize)], write: bool) -> io::Result<usize> {
    let remote: Ranges = remote.iter().map(|&(a, l)| (a as usize, l)).collect();
    let sum = |r: &[(usize, usize)]| r.iter().fold(0usize, |acc, &(_, l)| acc.saturating_add(l));
    let total = sum(local).min(sum(&remote));
    let mut lc = Cursor { ranges: local, index: 0, offset: 0 };
    let mut rc = Cursor { ranges: &remote, index: 0, offset: 0 };
    let (mut liov, mut riov) = (Iovecs::new(), Iovecs::new());
    let mut done = 0usize;
    while done < total {
        lc.batch(&mut liov);
        rc.batch(&mut riov);
        // SAFETY: the local iovecs describe slices borrowed for the duration of
        // the call (writable for reads); the kernel checks the remote ones.
        let n = unsafe {
            let f = if write { libc::process_vm_writev } else { libc::process_vm_readv };
            f(pid, liov.as_ptr(), liov.len() as libc::c_ulong, riov.as_ptr(), riov.len() as libc::c_ulong, 0)
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                _ if done == 0 => return Err(e),
                _ => break,
            }
        }
        if n == 0 {
            break;
        }
        let n = n as usize;
        lc.advance(n);
        rc.advance(n);
        done += n;
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_may_attach_to_itself_and_not_to_one_that_is_gone() {
        assert!(may_attach(std::process::id() as i32));
        // Above the kernel's pid limit (4194304): no such process.
        assert!(!may_attach(i32::MAX));
    }
}
