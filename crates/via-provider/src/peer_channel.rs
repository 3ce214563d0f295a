//! A shared-memory connection's socket pair: the control messages between
//! the two processes, with the kernel's word on who sent them.
//!
//! Every message goes out with the sender's credentials (`SCM_CREDENTIALS`,
//! which the kernel checks: an unprivileged process can state only its own
//! pid, uid and gid), and each end sets `SO_PASSCRED` before it reads, so
//! the pid that cross-memory copies target is the one the kernel vouches
//! for, never a number the peer wrote into a message.  `Ready` and `Accept`
//! carry the sender's registry table (one fd, `SCM_RIGHTS`), which the
//! receiver maps read-only.

use crate::endpoint::PeerMessage;
use crate::timeout::Deadline;
use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// Who sent a message, as the kernel says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sender {
    /// Process id in this process's pid namespace (never 0).
    pub pid: i32,
    /// User id.
    pub uid: u32,
}

/// One message as received.
#[derive(Debug)]
pub struct Received {
    /// The message.
    pub msg: PeerMessage,
    /// Its sender; `None` when the kernel vouched for nobody (the peer
    /// sent no credentials, or lives in a pid namespace we cannot see).
    pub sender: Option<Sender>,
    /// The fd that came with it, if exactly one did (others are closed).
    pub fd: Option<OwnedFd>,
}

/// Largest message on the channel.
const MAX_MESSAGE: usize = 128;
/// Fds a message may bring; more are closed, and the message refused.
const MAX_FDS: usize = 4;

/// Makes the kernel attach the sender's credentials to whatever this end
/// receives from now on.
pub fn expect_credentials(socket: BorrowedFd<'_>) -> io::Result<()> {
    socket2::SockRef::from(&socket).set_passcred(true)
}

/// Sends `msg` with this process's credentials and, for `Ready` and
/// `Accept`, the fd of this process's registry table.
pub fn send(socket: BorrowedFd<'_>, msg: &PeerMessage, fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
    // SAFETY: getpid, geteuid and getegid cannot fail.
    let pid = unsafe { libc::getpid() };
    send_claiming(socket, &msg.encode(), pid, fd)
}

/// Sends `bytes` with credentials that state `pid` (and this process's
/// effective uid and gid) and, if given, one fd.  The kernel refuses
/// (`EPERM`) a pid that is not the caller's unless the caller is
/// privileged: that check is what [`send`] and its receivers rely on.
pub fn send_claiming(socket: BorrowedFd<'_>, bytes: &[u8], pid: i32, fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
    let mut iov = libc::iovec { iov_base: bytes.as_ptr() as *mut libc::c_void, iov_len: bytes.len() };
    // SAFETY: geteuid and getegid cannot fail.
    let creds = libc::ucred { pid, uid: unsafe { libc::geteuid() }, gid: unsafe { libc::getegid() } };
    // SAFETY: CMSG_SPACE is a pure computation.
    let space =
        unsafe { libc::CMSG_SPACE(size_of::<libc::ucred>() as u32) + libc::CMSG_SPACE(size_of::<i32>() as u32) };
    let mut control = vec![0u64; (space as usize).div_ceil(8)];
    // SAFETY: `control` holds room for both control messages, written
    // through the CMSG macros within `msg_controllen`.
    unsafe {
        let mut hdr: libc::msghdr = zeroed();
        hdr.msg_iov = &mut iov;
        hdr.msg_iovlen = 1;
        hdr.msg_control = control.as_mut_ptr().cast();
        hdr.msg_controllen = space as usize;
        let c = libc::CMSG_FIRSTHDR(&hdr);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_CREDENTIALS;
        (*c).cmsg_len = libc::CMSG_LEN(size_of::<libc::ucred>() as u32) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<libc::ucred>(), creds);
        let mut used = libc::CMSG_SPACE(size_of::<libc::ucred>() as u32) as usize;
        if let Some(fd) = fd {
            let c = libc::CMSG_NXTHDR(&hdr, c);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(size_of::<i32>() as u32) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<i32>(), fd.as_raw_fd());
            used += libc::CMSG_SPACE(size_of::<i32>() as u32) as usize;
        }
        hdr.msg_controllen = used;
        let n = libc::sendmsg(socket.as_raw_fd(), &hdr, libc::MSG_NOSIGNAL);
        if n == bytes.len() as isize {
            Ok(())
        } else if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Err(io::ErrorKind::WriteZero.into())
        }
    }
}

/// Receives one message, waiting up to the deadline or until `cancel`
/// (if any) becomes readable.  `Ok(None)` on timeout; a cancelled wait is
/// an `Interrupted` error; a closed socket or garbage is an error.
pub fn recv(
    socket: BorrowedFd<'_>,
    cancel: Option<BorrowedFd<'_>>,
    deadline: &Deadline,
) -> io::Result<Option<Received>> {
    loop {
        let ms = deadline.remaining().map_or(-1, |d| d.as_millis().min(i32::MAX as u128) as i32);
        let fds = [socket.as_raw_fd(), cancel.map_or(-1, |c| c.as_raw_fd())];
        let mut pfd = fds.map(|fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 });
        // SAFETY: two pollfds (a negative fd is ignored).
        let r = unsafe { libc::poll(pfd.as_mut_ptr(), 2, ms) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if r == 0 {
            return Ok(None);
        }
        if pfd[1].revents != 0 {
            return Err(io::Error::new(io::ErrorKind::Interrupted, "cancelled"));
        }
        return read(socket);
    }
}

/// Reads one message that poll said is there; `Ok(None)` if there is none.
pub fn read(socket: BorrowedFd<'_>) -> io::Result<Option<Received>> {
    let mut buf = [0u8; MAX_MESSAGE];
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: CMSG_SPACE is a pure computation.
    let space = unsafe {
        libc::CMSG_SPACE(size_of::<libc::ucred>() as u32) + libc::CMSG_SPACE((MAX_FDS * size_of::<i32>()) as u32)
    } as usize;
    let mut control = vec![0u64; space.div_ceil(8)];
    // SAFETY: recvmsg into local buffers whose sizes the header states; the
    // control messages are walked with the CMSG macros within what the
    // kernel reported, and each fd it passed is owned exactly once.
    unsafe {
        let mut hdr: libc::msghdr = zeroed();
        hdr.msg_iov = &mut iov;
        hdr.msg_iovlen = 1;
        hdr.msg_control = control.as_mut_ptr().cast();
        hdr.msg_controllen = space;
        let n = libc::recvmsg(socket.as_raw_fd(), &mut hdr, libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC);
        if n < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::WouldBlock { Ok(None) } else { Err(e) };
        }
        let mut sender = None;
        let mut fds = Vec::new();
        let mut c = libc::CMSG_FIRSTHDR(&hdr);
        while !c.is_null() {
            let data = libc::CMSG_DATA(c);
            let len = (*c).cmsg_len - (data as usize - c as usize);
            match ((*c).cmsg_level, (*c).cmsg_type) {
                (libc::SOL_SOCKET, libc::SCM_CREDENTIALS) if len >= size_of::<libc::ucred>() => {
                    let cred = std::ptr::read_unaligned(data.cast::<libc::ucred>());
                    sender = (cred.pid > 0).then_some(Sender { pid: cred.pid, uid: cred.uid });
                }
                (libc::SOL_SOCKET, libc::SCM_RIGHTS) => {
                    for i in 0..len / size_of::<i32>() {
                        let fd = std::ptr::read_unaligned(data.cast::<i32>().add(i));
                        fds.push(OwnedFd::from_raw_fd(fd));
                    }
                }
                _ => {}
            }
            c = libc::CMSG_NXTHDR(&hdr, c);
        }
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let malformed = || io::Error::new(io::ErrorKind::InvalidData, "malformed peer message");
        if hdr.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0 || fds.len() > 1 {
            return Err(malformed());
        }
        let msg = PeerMessage::decode(&buf[..n as usize]).ok_or_else(malformed)?;
        Ok(Some(Received { msg, sender, fd: fds.pop() }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint::Endpoint;
    use std::os::fd::AsFd;

    fn pair() -> (OwnedFd, OwnedFd) {
        let mut sv = [0; 2];
        // SAFETY: socketpair into a local array.
        assert_eq!(unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0, sv.as_mut_ptr()) }, 0);
        // SAFETY: both fds are fresh and ours.
        unsafe { (OwnedFd::from_raw_fd(sv[0]), OwnedFd::from_raw_fd(sv[1])) }
    }

    #[test]
    fn the_kernel_names_the_sender_and_the_fd_arrives() {
        let (a, b) = pair();
        let table = via_shm::TableSegment::create().unwrap();
        let msg = PeerMessage::Ready(Endpoint::default());
        // Sent before the receiver asks for credentials: they come anyway.
        send(a.as_fd(), &msg, Some(table.fd())).unwrap();
        expect_credentials(b.as_fd()).unwrap();
        let got = read(b.as_fd()).unwrap().unwrap();
        assert_eq!(got.msg, msg);
        assert_eq!(got.sender, Some(Sender { pid: std::process::id() as i32, uid: unsafe { libc::geteuid() } }));
        let fd = got.fd.unwrap();
        assert_eq!(
            via_shm::SharedRegion::file_identity(fd.as_fd()).unwrap(),
            via_shm::SharedRegion::file_identity(table.fd()).unwrap()
        );
    }

    #[test]
    fn a_message_without_credentials_names_nobody() {
        let (a, b) = pair();
        expect_credentials(b.as_fd()).unwrap();
        // A plain send from a peer that did not ask for SO_PASSCRED: the
        // kernel still attaches the truth, since the receiver asked.
        let bytes = PeerMessage::Disconnect.encode();
        // SAFETY: plain send of a local buffer.
        unsafe { libc::send(a.as_raw_fd(), bytes.as_ptr().cast(), bytes.len(), 0) };
        let got = read(b.as_fd()).unwrap().unwrap();
        assert_eq!(got.sender.map(|s| s.pid), Some(std::process::id() as i32));
        // Without SO_PASSCRED on either end, a plain send carries nobody.
        let (c, d) = pair();
        // SAFETY: as above.
        unsafe { libc::send(c.as_raw_fd(), bytes.as_ptr().cast(), bytes.len(), 0) };
        expect_credentials(d.as_fd()).unwrap();
        assert_eq!(read(d.as_fd()).unwrap().unwrap().sender, None);
    }

    #[test]
    fn garbage_is_an_error() {
        let (a, b) = pair();
        // SAFETY: plain send of a local buffer.
        unsafe { libc::send(a.as_raw_fd(), [9u8, 9, 9].as_ptr().cast(), 3, 0) };
        assert_eq!(read(b.as_fd()).unwrap_err().kind(), io::ErrorKind::InvalidData);
        drop(a);
        assert_eq!(read(b.as_fd()).unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
    }
}
