//! The kernel's neighbour table (ARP for IPv4, neighbour discovery for
//! IPv6), read over rtnetlink: the Ethernet address a host on one of this
//! host's links has.  A host behind a router has no entry of its own (the
//! table holds the router's), so an entry is also proof that the host is on
//! the link.

use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use via_wire::frame::MAC_LEN;

// linux/netlink.h, linux/rtnetlink.h, linux/neighbour.h
const NETLINK_ROUTE: libc::c_int = 0;
const NLMSG_HEADER: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const RTM_NEWNEIGH: u16 = 28;
const RTM_GETNEIGH: u16 = 30;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_DUMP: u16 = 0x300;
/// `struct ndmsg`: family, padding, ifindex, state, flags, type.
const NDMSG: usize = 12;
const NDA_DST: u16 = 1;
const NDA_LLADDR: u16 = 2;
/// The states in which an entry's address is known: reachable, stale,
/// delay, probe, noarp, permanent.
const NUD_KNOWN: u16 = 0x02 | 0x04 | 0x08 | 0x10 | 0x40 | 0x80;

/// The Ethernet address the neighbour table gives `ip` on interface
/// `ifindex`, if it knows one.
pub(crate) fn lookup(ifindex: i32, ip: IpAddr) -> Option<[u8; MAC_LEN]> {
    let family = match ip {
        IpAddr::V4(_) => libc::AF_INET,
        IpAddr::V6(_) => libc::AF_INET6,
    };
    // SAFETY: plain socket call.
    let raw = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, NETLINK_ROUTE) };
    if raw < 0 {
        return None;
    }
    // SAFETY: a fresh descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let mut request = [0u8; NLMSG_HEADER + NDMSG];
    request[0..4].copy_from_slice(&((NLMSG_HEADER + NDMSG) as u32).to_ne_bytes());
    request[4..6].copy_from_slice(&RTM_GETNEIGH.to_ne_bytes());
    request[6..8].copy_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    request[NLMSG_HEADER] = family as u8;
    // SAFETY: sends a live buffer; the kernel is the default destination.
    if unsafe { libc::send(fd.as_raw_fd(), request.as_ptr() as *const libc::c_void, request.len(), 0) } < 0 {
        return None;
    }
    let mut buf = vec![0u8; 32 << 10];
    loop {
        // SAFETY: receives into a live buffer of its length.
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr() as *mut libc::c_void, buf.len(), 0) };
        if n <= 0 {
            return None;
        }
        match parse(&buf[..n as usize], ifindex, ip) {
            Dump::Found(mac) => return Some(mac),
            Dump::Done => return None,
            Dump::More => {}
        }
    }
}

/// What one read of a neighbour dump gave.
#[derive(Debug, PartialEq, Eq)]
enum Dump {
    Found([u8; MAC_LEN]),
    /// The dump ended (or was malformed) without the entry.
    Done,
    /// More messages follow.
    More,
}

/// Looks for `ip` on `ifindex` in the netlink messages of `buf`.
fn parse(mut buf: &[u8], ifindex: i32, ip: IpAddr) -> Dump {
    let want: &[u8] = &match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    };
    while buf.len() >= NLMSG_HEADER {
        let len = u32::from_ne_bytes(buf[0..4].try_into().expect("4")) as usize;
        let kind = u16::from_ne_bytes(buf[4..6].try_into().expect("2"));
        if len < NLMSG_HEADER || len > buf.len() {
            return Dump::Done;
        }
        match kind {
            NLMSG_DONE | NLMSG_ERROR => return Dump::Done,
            RTM_NEWNEIGH => {
                if let Some(mac) = entry(&buf[NLMSG_HEADER..len], ifindex, want) {
                    return Dump::Found(mac);
                }
            }
            _ => {}
        }
        buf = &buf[align(len).min(buf.len())..];
    }
    Dump::More
}

/// The address of a neighbour entry (`body` after the netlink header) if it
/// is `want`'s on `ifindex` and known.
fn entry(body: &[u8], ifindex: i32, want: &[u8]) -> Option<[u8; MAC_LEN]> {
    if body.len() < NDMSG {
        return None;
    }
    let index = i32::from_ne_bytes(body[4..8].try_into().expect("4"));
    let state = u16::from_ne_bytes(body[8..10].try_into().expect("2"));
    if index != ifindex || state & NUD_KNOWN == 0 {
        return None;
    }
    let (mut dst, mut mac) = (None, None);
    let mut attrs = &body[NDMSG..];
    while attrs.len() >= 4 {
        let len = u16::from_ne_bytes(attrs[0..2].try_into().expect("2")) as usize;
        let kind = u16::from_ne_bytes(attrs[2..4].try_into().expect("2"));
        if len < 4 || len > attrs.len() {
            return None;
        }
        let data = &attrs[4..len];
        match kind {
            NDA_DST => dst = Some(data),
            NDA_LLADDR => mac = <[u8; MAC_LEN]>::try_from(data).ok(),
            _ => {}
        }
        attrs = &attrs[align(len).min(attrs.len())..];
    }
    (dst == Some(want)).then_some(mac).flatten()
}

fn align(n: usize) -> usize {
    (n + 3) & !3
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC: [u8; 6] = [0x02, 0x11, 0x22, 0x33, 0x44, 0x55];

    fn neigh(ifindex: i32, state: u16, dst: &[u8], mac: &[u8]) -> Vec<u8> {
        let mut body = vec![0u8; NDMSG];
        body[0] = if dst.len() == 4 { libc::AF_INET as u8 } else { libc::AF_INET6 as u8 };
        body[4..8].copy_from_slice(&ifindex.to_ne_bytes());
        body[8..10].copy_from_slice(&state.to_ne_bytes());
        for (kind, data) in [(NDA_DST, dst), (NDA_LLADDR, mac)] {
            body.extend_from_slice(&((4 + data.len()) as u16).to_ne_bytes());
            body.extend_from_slice(&kind.to_ne_bytes());
            body.extend_from_slice(data);
            body.resize(align(body.len()), 0);
        }
        message(RTM_NEWNEIGH, &body)
    }

    fn message(kind: u16, body: &[u8]) -> Vec<u8> {
        let mut m = vec![0u8; NLMSG_HEADER];
        m[0..4].copy_from_slice(&((NLMSG_HEADER + body.len()) as u32).to_ne_bytes());
        m[4..6].copy_from_slice(&kind.to_ne_bytes());
        m.extend_from_slice(body);
        m
    }

    #[test]
    fn a_known_entry_of_the_interface_is_found_among_others() {
        let v6: IpAddr = "fd77:1::2".parse().unwrap();
        let v4: IpAddr = "10.77.0.2".parse().unwrap();
        let IpAddr::V6(a6) = v6 else { unreachable!() };
        let buf = [
            neigh(3, 0x02, &[10, 77, 0, 2], &MAC), // another interface
            neigh(7, 0x01, &a6.octets(), &MAC),    // incomplete
            neigh(7, 0x04, &a6.octets(), &MAC),    // stale: known
        ]
        .concat();
        assert_eq!(parse(&buf, 7, v6), Dump::Found(MAC));
        assert_eq!(parse(&buf, 7, v4), Dump::More);
        assert_eq!(parse(&neigh(3, 0x80, &[10, 77, 0, 2], &MAC), 3, v4), Dump::Found(MAC));
        // Incomplete only, then the end of the dump.
        let buf = [neigh(7, 0x01, &a6.octets(), &MAC), message(NLMSG_DONE, &[0; 4])].concat();
        assert_eq!(parse(&buf, 7, v6), Dump::Done);
    }

    #[test]
    fn malformed_messages_end_the_search_without_a_panic() {
        let v4: IpAddr = "10.77.0.2".parse().unwrap();
        let good = neigh(3, 0x02, &[10, 77, 0, 2], &MAC);
        // Cut anywhere before the last attribute's padding.
        for cut in 0..good.len() - 2 {
            let mut m = good[..cut].to_vec();
            if m.len() >= 4 {
                m[0..4].copy_from_slice(&(cut as u32).to_ne_bytes());
            }
            assert_ne!(parse(&m, 3, v4), Dump::Found(MAC), "cut at {cut}");
        }
        let mut long = good.clone();
        long[0..4].copy_from_slice(&(good.len() as u32 + 8).to_ne_bytes());
        assert_eq!(parse(&long, 3, v4), Dump::Done);
        // An address of the wrong length is no address.
        assert_eq!(parse(&neigh(3, 0x02, &[10, 77, 0, 2], &MAC[..4]), 3, v4), Dump::More);
    }

    #[test]
    fn the_live_table_has_no_entry_for_a_documentation_address() {
        // The dump is read to its end and finds nothing.
        assert_eq!(lookup(1, "192.0.2.1".parse().unwrap()), None);
        assert_eq!(lookup(1, "2001:db8::1".parse().unwrap()), None);
    }
}
