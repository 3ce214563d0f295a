//! The agent's UDP socket on the CM port.

use std::io;
use std::net::{IpAddr, SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd};

/// A non-blocking UDP socket bound to the CM port: `[::]` dual-stack, or
/// `0.0.0.0` where IPv6 is unavailable.
#[derive(Debug)]
pub struct CmSocket {
    sock: UdpSocket,
    v6: bool,
}

impl CmSocket {
    /// Binds `[::]:port` with `IPV6_V6ONLY` off; falls back to `0.0.0.0:port`
    /// when IPv6 is unavailable (but not when the port is taken).
    /// The kernel's error reports (ICMP) are queued on the socket: see
    /// [`CmSocket::recv_error`].
    pub fn bind(port: u16) -> io::Result<CmSocket> {
        let cm = match bind6(port) {
            Ok(sock) => CmSocket { sock, v6: true },
            Err(e) if matches!(e.raw_os_error(), Some(libc::EADDRINUSE | libc::EACCES)) => return Err(e),
            Err(e) => {
                tracing::debug!("IPv6 CM socket unavailable ({e}); using IPv4 only");
                let sock = UdpSocket::bind((std::net::Ipv4Addr::UNSPECIFIED, port))?;
                sock.set_nonblocking(true)?;
                CmSocket { sock, v6: false }
            }
        };
        // IPv4 reports come through IP_RECVERR on a dual-stack socket too.
        set_int(&cm.sock, libc::SOL_IP, libc::IP_RECVERR, 1)?;
        if cm.v6 {
            set_int(&cm.sock, libc::SOL_IPV6, libc::IPV6_RECVERR, 1)?;
        }
        Ok(cm)
    }

    /// Whether the socket is dual-stack (else IPv4 only).
    pub fn is_v6(&self) -> bool {
        self.v6
    }

    /// The bound address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.local_addr()
    }

    /// Sends one datagram; IPv4 destinations go out v4-mapped on the
    /// dual-stack socket.
    pub fn send_to(&self, dest: SocketAddr, datagram: &[u8]) -> io::Result<()> {
        let dest = match (self.v6, dest) {
            (true, SocketAddr::V4(a)) => SocketAddr::V6(SocketAddrV6::new(a.ip().to_ipv6_mapped(), a.port(), 0, 0)),
            (false, SocketAddr::V6(a)) => match a.ip().to_ipv4_mapped() {
                Some(ip) => SocketAddr::V4(SocketAddrV4::new(ip, a.port())),
                None => {
                    return Err(io::Error::new(
                        io::ErrorKind::Unsupported,
                        "IPv6 destination on an IPv4-only CM socket",
                    ))
                }
            },
            (_, dest) => dest,
        };
        self.sock.send_to(datagram, dest).map(|_| ())
    }

    /// Receives one datagram into `buf`; the source comes back with
    /// v4-mapped addresses turned into IPv4 ones.
    pub fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        let (n, src) = self.sock.recv_from(buf)?;
        Ok((n, canonical(src)))
    }
}

impl CmSocket {
    /// Takes one report off the socket's error queue: `Ok(Some(dest))` when
    /// the host of `dest` answered a datagram to `dest` with ICMP "port
    /// unreachable" (it is up, and nothing listens on that port), `Ok(None)`
    /// for any other report; `WouldBlock` when the queue is empty.
    pub fn recv_error(&self) -> io::Result<Option<SocketAddr>> {
        // SAFETY: recvmsg into buffers of the sizes given; the control
        // messages are walked with the CMSG macros within `msg_controllen`,
        // and each payload is read unaligned within its cmsg_len.
        unsafe {
            let mut name: libc::sockaddr_storage = std::mem::zeroed();
            let mut data = [0u8; 64];
            let mut iov = libc::iovec { iov_base: data.as_mut_ptr().cast(), iov_len: data.len() };
            let mut control = [0u64; 64];
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_name = (&mut name as *mut libc::sockaddr_storage).cast();
            msg.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = std::mem::size_of_val(&control);
            let fd = std::os::fd::AsRawFd::as_raw_fd(&self.sock);
            if libc::recvmsg(fd, &mut msg, libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT) < 0 {
                return Err(io::Error::last_os_error());
            }
            let mut port_unreachable = false;
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                let h = &*c;
                let is_err = (h.cmsg_level == libc::SOL_IP && h.cmsg_type == libc::IP_RECVERR)
                    || (h.cmsg_level == libc::SOL_IPV6 && h.cmsg_type == libc::IPV6_RECVERR);
                let room = h.cmsg_len as usize - (libc::CMSG_DATA(c) as usize - c as usize);
                if is_err && room >= std::mem::size_of::<libc::sock_extended_err>() {
                    let e = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::sock_extended_err);
                    port_unreachable |= is_port_unreachable(e.ee_origin, e.ee_type, e.ee_code);
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
            if !port_unreachable {
                return Ok(None);
            }
            Ok(sockaddr(&name, msg.msg_namelen).map(canonical))
        }
    }
}

/// Whether an extended error report is ICMP (or ICMPv6) "port unreachable".
fn is_port_unreachable(origin: u8, kind: u8, code: u8) -> bool {
    const ICMP_DEST_UNREACH: u8 = 3;
    const ICMP_PORT_UNREACH: u8 = 3;
    const ICMPV6_DEST_UNREACH: u8 = 1;
    const ICMPV6_PORT_UNREACH: u8 = 4;
    match origin {
        libc::SO_EE_ORIGIN_ICMP => (kind, code) == (ICMP_DEST_UNREACH, ICMP_PORT_UNREACH),
        libc::SO_EE_ORIGIN_ICMP6 => (kind, code) == (ICMPV6_DEST_UNREACH, ICMPV6_PORT_UNREACH),
        _ => false,
    }
}

/// The socket address in `name`, if it is IPv4 or IPv6.
fn sockaddr(name: &libc::sockaddr_storage, len: libc::socklen_t) -> Option<SocketAddr> {
    let len = len as usize;
    match name.ss_family as libc::c_int {
        libc::AF_INET if len >= std::mem::size_of::<libc::sockaddr_in>() => {
            // SAFETY: the family and length say it is a sockaddr_in.
            let a = unsafe { &*(name as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            let ip = std::net::Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
            Some(SocketAddr::new(IpAddr::V4(ip), u16::from_be(a.sin_port)))
        }
        libc::AF_INET6 if len >= std::mem::size_of::<libc::sockaddr_in6>() => {
            // SAFETY: the family and length say it is a sockaddr_in6.
            let a = unsafe { &*(name as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            let ip = std::net::Ipv6Addr::from(a.sin6_addr.s6_addr);
            Some(SocketAddr::new(IpAddr::V6(ip), u16::from_be(a.sin6_port)))
        }
        _ => None,
    }
}

fn set_int(sock: &UdpSocket, level: libc::c_int, name: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: setsockopt with an int of the size passed.
    let r = unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(sock),
            level,
            name,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    match r {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

impl AsFd for CmSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

/// `src` with an IPv4-mapped IPv6 address turned into its IPv4 address.
pub fn canonical(src: SocketAddr) -> SocketAddr {
    match src.ip() {
        IpAddr::V6(ip) => match ip.to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), src.port()),
            None => src,
        },
        IpAddr::V4(_) => src,
    }
}

/// A dual-stack `[::]:port` socket.
fn bind6(port: u16) -> io::Result<UdpSocket> {
    use socket2::{Domain, Socket, Type};
    // Close-on-exec, as socket2 makes every socket.
    let sock = Socket::new(Domain::IPV6, Type::DGRAM.nonblocking(), None)?;
    sock.set_only_v6(false)?;
    sock.bind(&SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, port)).into())?;
    Ok(sock.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dual_stack_round_trip() {
        let a = CmSocket::bind(0).unwrap();
        let b = CmSocket::bind(0).unwrap();
        let port = b.local_addr().unwrap().port();
        let dest: SocketAddr = (std::net::Ipv4Addr::LOCALHOST, port).into();
        a.send_to(dest, b"hello").unwrap();
        let mut buf = [0u8; 16];
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let (n, src) = loop {
            match b.recv_from(&mut buf) {
                Ok(r) => break r,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    assert!(std::time::Instant::now() < deadline);
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                Err(e) => panic!("{e}"),
            }
        };
        assert_eq!(&buf[..n], b"hello");
        // A dual-stack socket reports the IPv4 source as IPv4.
        assert_eq!(src.ip(), IpAddr::V4(std::net::Ipv4Addr::LOCALHOST));
        assert_eq!(src.port(), a.local_addr().unwrap().port());
        // The port is taken now.
        assert!(CmSocket::bind(port).is_err());
    }

    #[test]
    fn port_unreachable_is_reported_with_its_destination() {
        let a = CmSocket::bind(0).unwrap();
        // A port nobody holds: bound and closed again.
        let closed = CmSocket::bind(0).unwrap().local_addr().unwrap().port();
        let dest: SocketAddr = (std::net::Ipv4Addr::LOCALHOST, closed).into();
        a.send_to(dest, b"anyone?").unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let reported = loop {
            match a.recv_error() {
                Ok(Some(d)) => break d,
                Ok(None) => panic!("a report other than port unreachable"),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    assert!(std::time::Instant::now() < deadline, "no report");
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                Err(e) => panic!("{e}"),
            }
        };
        assert_eq!(reported, dest);
        assert_eq!(a.recv_error().unwrap_err().kind(), io::ErrorKind::WouldBlock);
        assert!(is_port_unreachable(libc::SO_EE_ORIGIN_ICMP6, 1, 4));
        assert!(!is_port_unreachable(libc::SO_EE_ORIGIN_ICMP, 3, 1));
        assert!(!is_port_unreachable(libc::SO_EE_ORIGIN_LOCAL, 3, 3));
    }

    #[test]
    fn canonical_addresses() {
        let m: SocketAddr = "[::ffff:10.1.2.3]:7".parse().unwrap();
        assert_eq!(canonical(m), "10.1.2.3:7".parse().unwrap());
        let v6: SocketAddr = "[fd77::1]:7".parse().unwrap();
        assert_eq!(canonical(v6), v6);
    }
}
