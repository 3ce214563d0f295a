//! Abstract-namespace `SOCK_SEQPACKET` sockets and descriptor passing.

use rustix::event::Timespec;
use rustix::event::{PollFd, PollFlags};
use rustix::io::Errno;
use rustix::net::{
    self, AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};
use std::io::{self, IoSlice, IoSliceMut};
use std::mem::{size_of, zeroed, MaybeUninit};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
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

/// Retries `f` while a signal interrupts it.
fn retry<T>(mut f: impl FnMut() -> rustix::io::Result<T>) -> io::Result<T> {
    loop {
        match f() {
            Err(Errno::INTR) => continue,
            r => return r.map_err(io::Error::from),
        }
    }
}

/// The abstract address `name` (the leading NUL byte of the address puts
/// it in the abstract namespace).
fn address(name: &str) -> io::Result<SocketAddrUnix> {
    let name = name.as_bytes();
    // sun_path holds the leading NUL byte and the name.
    let room = size_of::<libc::sockaddr_un>() - size_of::<libc::sa_family_t>();
    if name.is_empty() || name.len() >= room {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "bad agent socket name"));
    }
    Ok(SocketAddrUnix::new_abstract_name(name)?)
}

fn socket(flags: SocketFlags) -> io::Result<OwnedFd> {
    Ok(net::socket_with(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC | flags, None)?)
}

/// Binds a non-blocking listening socket to the abstract name `name`.
pub fn listen(name: &str) -> io::Result<OwnedFd> {
    let addr = address(name)?;
    let fd = socket(SocketFlags::NONBLOCK)?;
    net::bind(&fd, &addr)?;
    net::listen(&fd, 128)?;
    Ok(fd)
}

/// Connects a blocking socket to the abstract name `name`.
pub fn connect(name: &str) -> io::Result<OwnedFd> {
    let addr = address(name)?;
    let fd = socket(SocketFlags::empty())?;
    retry(|| net::connect(&fd, &addr))?;
    Ok(fd)
}

/// Accepts one connection as a non-blocking, close-on-exec socket.
pub fn accept(listener: BorrowedFd) -> io::Result<OwnedFd> {
    Ok(net::accept_with(listener, SocketFlags::NONBLOCK | SocketFlags::CLOEXEC)?)
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
    Ok(net::socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)?)
}

/// Control-message buffer, aligned for `cmsghdr`.
#[repr(C, align(8))]
struct Control([MaybeUninit<u8>; 64]);

impl Control {
    fn new() -> Control {
        Control([MaybeUninit::uninit(); 64])
    }
}

/// Sends one message with `fds` attached; never raises SIGPIPE.
pub fn send(fd: BorrowedFd, data: &[u8], fds: &[BorrowedFd]) -> io::Result<()> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "too many fds"));
    }
    let mut control = Control::new();
    let mut ancillary = SendAncillaryBuffer::new(&mut control.0);
    if !fds.is_empty() && !ancillary.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "too many fds"));
    }
    retry(|| net::sendmsg(fd, &[IoSlice::new(data)], &mut ancillary, SendFlags::NOSIGNAL))?;
    Ok(())
}

/// Receives one message; `None` when the peer closed the connection.
pub fn recv(fd: BorrowedFd) -> io::Result<Option<Received>> {
    let mut data = vec![0u8; MAX_MESSAGE];
    let mut control = Control::new();
    let mut ancillary = RecvAncillaryBuffer::new(&mut control.0);
    let msg = retry(|| net::recvmsg(fd, &mut [IoSliceMut::new(&mut data)], &mut ancillary, RecvFlags::CMSG_CLOEXEC))?;
    // Every descriptor the kernel installed is taken; the rest of the
    // buffer's messages (none expected) are dropped with it.
    let mut fds = Vec::new();
    for m in ancillary.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = m {
            fds.extend(received);
        }
    }
    if msg.bytes == 0 && fds.is_empty() {
        return Ok(None);
    }
    data.truncate(msg.bytes.min(MAX_MESSAGE));
    let truncated = msg.flags.intersects(ReturnFlags::TRUNC | ReturnFlags::CTRUNC);
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
        let timeout =
            (ms >= 0).then(|| Timespec { tv_sec: i64::from(ms / 1000), tv_nsec: i64::from(ms % 1000) * 1_000_000 });
        let mut p = [fd, cancel.unwrap_or(fd)].map(|fd| PollFd::from_borrowed_fd(fd, PollFlags::IN));
        let watched = if cancel.is_some() { 2 } else { 1 };
        match rustix::event::poll(&mut p[..watched], timeout.as_ref()) {
            Ok(0) if ms == 0 => return Ok(Readiness::TimedOut),
            Ok(0) => continue,
            Ok(_) if watched == 2 && !p[1].revents().is_empty() => return Ok(Readiness::Cancelled),
            Ok(_) => return Ok(Readiness::Readable),
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}
