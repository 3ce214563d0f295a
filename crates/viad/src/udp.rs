//! The agent's UDP socket on the CM port.

use std::io;
use std::net::{IpAddr, SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};

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
    pub fn bind(port: u16) -> io::Result<CmSocket> {
        match bind6(port) {
            Ok(sock) => Ok(CmSocket { sock, v6: true }),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EADDRINUSE | libc::EACCES)) => Err(e),
            Err(e) => {
                tracing::debug!("IPv6 CM socket unavailable ({e}); using IPv4 only");
                let sock = UdpSocket::bind((std::net::Ipv4Addr::UNSPECIFIED, port))?;
                sock.set_nonblocking(true)?;
                Ok(CmSocket { sock, v6: false })
            }
        }
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
    let kind = libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
    // SAFETY: plain syscalls; the fd is owned from here on, and `sa` is a
    // valid sockaddr_in6 of the size passed.
    unsafe {
        let fd = libc::socket(libc::AF_INET6, kind, 0);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = OwnedFd::from_raw_fd(fd);
        let off: libc::c_int = 0;
        if libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            libc::IPPROTO_IPV6,
            libc::IPV6_V6ONLY,
            (&off as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        ) != 0
        {
            return Err(io::Error::last_os_error());
        }
        let mut sa: libc::sockaddr_in6 = std::mem::zeroed();
        sa.sin6_family = libc::AF_INET6 as libc::sa_family_t;
        sa.sin6_port = port.to_be();
        if libc::bind(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            (&sa as *const libc::sockaddr_in6).cast(),
            std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
        ) != 0
        {
            return Err(io::Error::last_os_error());
        }
        Ok(UdpSocket::from(fd))
    }
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
    fn canonical_addresses() {
        let m: SocketAddr = "[::ffff:10.1.2.3]:7".parse().unwrap();
        assert_eq!(canonical(m), "10.1.2.3:7".parse().unwrap());
        let v6: SocketAddr = "[fd77::1]:7".parse().unwrap();
        assert_eq!(canonical(v6), v6);
    }
}
