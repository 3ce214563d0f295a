//! The sockets of a network port: one unconnected, and one connected to
//! each peer.
//!
//! An unconnected socket costs the kernel a route lookup for every
//! datagram it sends (the destination comes with each one) and for every
//! one it receives (only connected sockets are found early, with the route
//! they keep).  A port therefore opens, for each peer its VIs talk to, a
//! socket connected to that peer and bound to the port's own address
//! (`SO_REUSEPORT`): the kernel hands it that peer's datagrams, since a
//! connected socket wins the lookup for its peer and is never chosen for
//! another one, and sends on it need no lookup.  The unconnected socket
//! keeps everything else (datagrams that arrive before a connection is
//! complete, peers whose socket could not be opened).

use std::net::{IpAddr, Ipv6Addr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};

/// A socket of the port connected to one peer.
pub struct PeerSocket {
    socket: UdpSocket,
    /// The peer it is connected to.
    pub peer: SocketAddr,
}

impl PeerSocket {
    /// Opens a socket bound to `local` (the port's address, shared) and
    /// connected to `peer`.
    pub fn connect(local: SocketAddr, peer: SocketAddr) -> std::io::Result<PeerSocket> {
        let socket = bind_shared(local)?;
        socket.connect(peer)?;
        Ok(PeerSocket { socket, peer })
    }

    /// The socket's descriptor.
    pub fn fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }

    /// The socket itself, for socket options.
    pub fn socket(&self) -> &UdpSocket {
        &self.socket
    }
}

/// Binds the port's unconnected socket to a free port of `ip` (the IPv6
/// wildcard for a dual-stack socket), shared with the peer sockets opened
/// later.  The kernel may give a port of another `SO_REUSEPORT` socket of
/// the same user to a socket that asks for any port, which would then
/// share its datagrams: so a plain socket finds a port nobody has first.
pub fn bind_port(ip: IpAddr) -> std::io::Result<UdpSocket> {
    let mut last = None;
    for _ in 0..8 {
        let free = UdpSocket::bind(SocketAddr::new(ip, 0))?.local_addr()?;
        match bind_shared(free) {
            Ok(s) => return Ok(s),
            // Someone took the port in between: try another.
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::ErrorKind::AddrInUse.into()))
}

/// A non-blocking UDP socket with `SO_REUSEPORT`, bound to `addr`;
/// dual-stack if `addr` is the IPv6 wildcard.
fn bind_shared(addr: SocketAddr) -> std::io::Result<UdpSocket> {
    use socket2::{Domain, Socket, Type};
    // Close-on-exec, as socket2 makes every socket.
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM.nonblocking(), None)?;
    socket.set_reuse_port(true)?;
    if addr.ip() == IpAddr::V6(Ipv6Addr::UNSPECIFIED) {
        socket.set_only_v6(false)?;
    }
    socket.bind(&addr.into())?;
    Ok(socket.into())
}

/// Sets an integer socket option that socket2 has no call for (`UDP_GRO`).
pub(crate) fn set_option(
    socket: &impl AsRawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> std::io::Result<()> {
    set_option_to(socket.as_raw_fd(), level, name, &value)
}

/// Sets socket option `name` of `fd` to `value`, a plain C value (an int,
/// a `tpacket_req`, a `sock_fprog`) passed with its own size: the options
/// of packet sockets and UDP offload, which socket2 does not set.
pub(crate) fn set_option_to<T>(fd: RawFd, level: libc::c_int, name: libc::c_int, value: &T) -> std::io::Result<()> {
    // SAFETY: setsockopt reads size_of::<T>() bytes of a live value.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            value as *const T as *const libc::c_void,
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn recv_from(s: &UdpSocket) -> Option<(Vec<u8>, SocketAddr)> {
        let mut buf = [0u8; 64];
        for _ in 0..1000 {
            match s.recv_from(&mut buf) {
                Ok((n, from)) => return Some((buf[..n].to_vec(), from)),
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(1)),
            }
        }
        None
    }

    #[test]
    fn a_connected_socket_takes_its_peer_and_only_its_peer() {
        let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let port = bind_port(lo).expect("port");
        let local = port.local_addr().unwrap();
        let a = UdpSocket::bind((lo, 0)).unwrap();
        let b = UdpSocket::bind((lo, 0)).unwrap();
        let to_a = PeerSocket::connect(local, a.local_addr().unwrap()).expect("peer socket");
        to_a.socket().set_nonblocking(true).unwrap();

        // The peer's datagrams reach the connected socket, others the port's.
        a.send_to(b"from a", local).unwrap();
        b.send_to(b"from b", local).unwrap();
        let (got, from) = recv_from(to_a.socket()).expect("a's datagram");
        assert_eq!((got.as_slice(), from), (&b"from a"[..], a.local_addr().unwrap()));
        let (got, from) = recv_from(&port).expect("b's datagram");
        assert_eq!((got.as_slice(), from), (&b"from b"[..], b.local_addr().unwrap()));
        assert!(to_a.socket().recv(&mut [0u8; 8]).is_err(), "b's datagram must not reach a's socket");

        // Sends on the connected socket leave from the port's address.
        to_a.socket().send(b"to a").unwrap();
        let (got, from) = recv_from(&a).expect("reply");
        assert_eq!((got.as_slice(), from), (&b"to a"[..], local));
    }

    #[test]
    fn the_port_is_nobody_elses() {
        let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let port = bind_port(lo).expect("port");
        let local = port.local_addr().unwrap();
        // A plain socket cannot join it; a socket of ours with SO_REUSEPORT can.
        assert!(UdpSocket::bind(local).is_err());
        assert!(bind_shared(local).is_ok());
    }
}
