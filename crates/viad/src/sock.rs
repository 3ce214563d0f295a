//! Abstract-namespace `SOCK_SEQPACKET` sockets and descriptor passing.

use std::io;
use std::mem::{size_of, size_of_val, zeroed};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use crate::proto::MAX_MESSAGE;

/// Most descriptors one message carries.
pub const MAX_FDS: usize = 4;

/// One received message.
#[derive(Debug)]
pub struct Received {
    /// The message bytes.
    pub data: Vec<u8>,
    /// Descriptors that came with it (close-on-exec).
    pub fds: Vec<OwnedFd>,
    /// The message or its descriptors did not fit and were cut.
    pub truncated: bool,
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    match r {
        -1 => Err(io::Error::last_os_error()),
        r => Ok(r),
    }
}

fn address(name: &str) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: sockaddr_un is plain data; all-zero is a valid value.
    let mut sa: libc::sockaddr_un = unsafe { zeroed() };
    sa.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let name = name.as_bytes();
    if name.is_empty() || name.len() >= sa.sun_path.len() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "bad agent socket name"));
    }
    // The leading NUL byte (already zero) puts the name in the abstract namespace.
    for (d, s) in sa.sun_path[1..].iter_mut().zip(name) {
        *d = *s as libc::c_char;
    }
    let len = size_of::<libc::sa_family_t>() + 1 + name.len();
    Ok((sa, len as libc::socklen_t))
}

fn socket(flags: libc::c_int) -> io::Result<OwnedFd> {
    let kind = libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC | flags;
    // SAFETY: plain syscall; the returned fd is owned from here on.
    let fd = cvt(unsafe { libc::socket(libc::AF_UNIX, kind, 0) })?;
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Binds a non-blocking listening socket to the abstract name `name`.
pub fn listen(name: &str) -> io::Result<OwnedFd> {
    let (sa, len) = address(name)?;
    let fd = socket(libc::SOCK_NONBLOCK)?;
    // SAFETY: `sa` is a valid sockaddr_un of `len` bytes.
    cvt(unsafe { libc::bind(fd.as_raw_fd(), (&sa as *const libc::sockaddr_un).cast(), len) })?;
    cvt(unsafe { libc::listen(fd.as_raw_fd(), 128) })?;
    Ok(fd)
}

/// Connects a blocking socket to the abstract name `name`.
pub fn connect(name: &str) -> io::Result<OwnedFd> {
    let (sa, len) = address(name)?;
    let fd = socket(0)?;
    loop {
        // SAFETY: `sa` is a valid sockaddr_un of `len` bytes.
        let r = unsafe { libc::connect(fd.as_raw_fd(), (&sa as *const libc::sockaddr_un).cast(), len) };
        match cvt(r) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
            Ok(_) => return Ok(fd),
        }
    }
}

/// Accepts one connection as a non-blocking, close-on-exec socket.
pub fn accept(listener: BorrowedFd) -> io::Result<OwnedFd> {
    let flags = libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
    // SAFETY: plain syscall; the returned fd is owned from here on.
    let fd = cvt(unsafe { libc::accept4(listener.as_raw_fd(), std::ptr::null_mut(), std::ptr::null_mut(), flags) })?;
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Who is at the other end of a connected Unix socket, as the kernel saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cred {
    /// Process id (0 when that process is not visible from this pid namespace).
    pub pid: i32,
    /// Effective user id.
    pub uid: u32,
    /// Effective group id.
    pub gid: u32,
}

/// The credentials of the peer of `fd` (`SO_PEERCRED`): for a connecting
/// socket, those of the process that called `listen` on the other side; for
/// an accepted one, those of the process that called `connect`.  The kernel
/// records them, so neither side can lie about them.
pub fn peer_cred(fd: BorrowedFd) -> io::Result<Cred> {
    // SAFETY: ucred is plain data; all-zero is a valid value.
    let mut cred: libc::ucred = unsafe { zeroed() };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` has room for `len` bytes, which the kernel fills.
    cvt(unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    })?;
    if len as usize != size_of::<libc::ucred>() {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "short SO_PEERCRED"));
    }
    Ok(Cred { pid: cred.pid, uid: cred.uid, gid: cred.gid })
}

/// Creates a connected `SOCK_SEQPACKET` socket pair (close-on-exec).
pub fn pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    let kind = libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC;
    // SAFETY: `fds` has room for the two descriptors, owned from here on.
    cvt(unsafe { libc::socketpair(libc::AF_UNIX, kind, 0, fds.as_mut_ptr()) })?;
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Control-message buffer, aligned for `cmsghdr`.
#[repr(C, align(8))]
struct Control([u8; 64]);

/// Sends one message with `fds` attached; never raises SIGPIPE.
pub fn send(fd: BorrowedFd, data: &[u8], fds: &[BorrowedFd]) -> io::Result<()> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "too many fds"));
    }
    let mut iov = libc::iovec { iov_base: data.as_ptr() as *mut libc::c_void, iov_len: data.len() };
    let mut control = Control([0; 64]);
    // SAFETY: msghdr is plain data; the pointers set below outlive the call,
    // and the cmsg header and payload fit in `control` (checked by MAX_FDS).
    unsafe {
        let mut msg: libc::msghdr = zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if !fds.is_empty() {
            let size = (fds.len() * size_of::<libc::c_int>()) as u32;
            msg.msg_control = control.0.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(size) as _;
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(size) as _;
            let p = libc::CMSG_DATA(c) as *mut libc::c_int;
            for (i, f) in fds.iter().enumerate() {
                p.add(i).write_unaligned(f.as_raw_fd());
            }
        }
        loop {
            let n = libc::sendmsg(fd.as_raw_fd(), &msg, libc::MSG_NOSIGNAL);
            if n >= 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

/// Receives one message; `None` when the peer closed the connection.
pub fn recv(fd: BorrowedFd) -> io::Result<Option<Received>> {
    let mut data = vec![0u8; MAX_MESSAGE];
    let mut iov = libc::iovec { iov_base: data.as_mut_ptr().cast(), iov_len: data.len() };
    let mut control = Control([0; 64]);
    let mut fds = Vec::new();
    // SAFETY: msghdr is plain data; the buffers outlive the call, and every
    // descriptor the kernel installed is taken into an OwnedFd exactly once.
    let (n, flags) = unsafe {
        let mut msg: libc::msghdr = zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.0.as_mut_ptr().cast();
        msg.msg_controllen = size_of_val(&control.0) as _;
        let n = loop {
            let n = libc::recvmsg(fd.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC);
            if n >= 0 {
                break n as usize;
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        };
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let bytes = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let p = libc::CMSG_DATA(c) as *const libc::c_int;
                for i in 0..bytes / size_of::<libc::c_int>() {
                    fds.push(OwnedFd::from_raw_fd(p.add(i).read_unaligned()));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
        (n, msg.msg_flags)
    };
    if n == 0 && fds.is_empty() {
        return Ok(None);
    }
    data.truncate(n);
    let truncated = flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0;
    Ok(Some(Received { data, fds, truncated }))
}

/// Waits until `fd` is readable or hung up; `false` when `timeout` passed first.
pub fn wait_readable(fd: BorrowedFd, timeout: Option<Duration>) -> io::Result<bool> {
    wait_readable_unless(fd, None, timeout).map(|r| r == Readiness::Readable)
}

/// What [`wait_readable_unless`] saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    /// `fd` is readable (or hung up).
    Readable,
    /// The cancel fd became readable first.
    Cancelled,
    /// The timeout passed.
    TimedOut,
}

/// Waits until `fd` is readable, `cancel` (if any) is readable, or the
/// timeout passes (`None`: never).
pub fn wait_readable_unless(
    fd: BorrowedFd,
    cancel: Option<BorrowedFd>,
    timeout: Option<Duration>,
) -> io::Result<Readiness> {
    let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
    loop {
        let ms = match deadline {
            None => -1,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                // Round up so a short wait does not become a busy poll.
                left.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32
            }
        };
        let cancel_fd = cancel.map_or(-1, |c| c.as_raw_fd());
        let mut p = [fd.as_raw_fd(), cancel_fd].map(|fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 });
        // SAFETY: two valid pollfds (a negative fd is ignored).
        match cvt(unsafe { libc::poll(p.as_mut_ptr(), 2, ms) }) {
            Ok(0) if ms == 0 => return Ok(Readiness::TimedOut),
            Ok(0) => continue,
            Ok(_) if p[1].revents != 0 => return Ok(Readiness::Cancelled),
            Ok(_) => return Ok(Readiness::Readable),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}
