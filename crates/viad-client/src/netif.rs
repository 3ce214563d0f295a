//! This host's network interfaces: the one walk of `getifaddrs(3)` that the
//! agent (device names, local addresses), the provider (the Ethernet side of
//! a port) and `viainfo` share.

use std::ffi::CStr;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// `ARPHRD_ETHER` (linux/if_arp.h): the link type of Ethernet interfaces.
const ARPHRD_ETHER: u16 = 1;

/// One network interface, as `getifaddrs` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    /// The interface's name, e.g. `eth0`.
    pub name: String,
    /// Its index (0 when the walk did not say and `if_nametoindex` failed).
    pub index: u32,
    /// Its `IFF_*` flags.
    pub flags: u32,
    /// Its Ethernet address, if it is an Ethernet interface (link type
    /// `ARPHRD_ETHER`, six-byte address).
    pub mac: Option<[u8; 6]>,
    /// Its IPv4 and IPv6 addresses, in the kernel's order.
    pub addrs: Vec<IpAddr>,
}

impl Interface {
    /// Whether this is a loopback interface.
    pub fn is_loopback(&self) -> bool {
        self.flags & libc::IFF_LOOPBACK as u32 != 0
    }

    /// Whether the interface is up.
    pub fn is_up(&self) -> bool {
        self.flags & libc::IFF_UP as u32 != 0
    }

    /// Its IPv4 addresses, in the kernel's order.
    pub fn ipv4(&self) -> impl Iterator<Item = Ipv4Addr> + '_ {
        self.addrs.iter().filter_map(|a| match a {
            IpAddr::V4(v4) => Some(*v4),
            IpAddr::V6(_) => None,
        })
    }

    /// Its IPv6 addresses, in the kernel's order.
    pub fn ipv6(&self) -> impl Iterator<Item = Ipv6Addr> + '_ {
        self.addrs.iter().filter_map(|a| match a {
            IpAddr::V6(v6) => Some(*v6),
            IpAddr::V4(_) => None,
        })
    }
}

/// Every interface of this host (of this network namespace), in the order
/// the kernel first lists them, each with all its addresses.  Fails only
/// when `getifaddrs` does.
pub fn interfaces() -> io::Result<Vec<Interface>> {
    let mut out: Vec<Interface> = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list that is walked read-only
    // below and freed once.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut p = head;
    while !p.is_null() {
        // SAFETY: `p` is an entry of the list getifaddrs returned.
        let ifa = unsafe { &*p };
        p = ifa.ifa_next;
        if ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_name is a NUL-terminated string of the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }.to_string_lossy().into_owned();
        let at = match out.iter().position(|i| i.name == name) {
            Some(at) => at,
            None => {
                out.push(Interface { name, index: 0, flags: ifa.ifa_flags, mac: None, addrs: Vec::new() });
                out.len() - 1
            }
        };
        let entry = &mut out[at];
        entry.flags |= ifa.ifa_flags;
        if ifa.ifa_addr.is_null() {
            continue;
        }
        // SAFETY: a non-null ifa_addr starts with the family.
        match unsafe { (*ifa.ifa_addr).sa_family } as libc::c_int {
            libc::AF_INET => {
                // SAFETY: an AF_INET address is a sockaddr_in; s_addr is in
                // network order, so its bytes in memory are the address.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                entry.addrs.push(IpAddr::from(sin.sin_addr.s_addr.to_ne_bytes()));
            }
            libc::AF_INET6 => {
                // SAFETY: an AF_INET6 address is a sockaddr_in6.
                let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                entry.addrs.push(IpAddr::from(sin6.sin6_addr.s6_addr));
            }
            libc::AF_PACKET => {
                // SAFETY: an AF_PACKET address is a sockaddr_ll.
                let ll = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_ll) };
                entry.index = ll.sll_ifindex.max(0) as u32;
                if ll.sll_hatype == ARPHRD_ETHER && ll.sll_halen == 6 {
                    entry.mac = <[u8; 6]>::try_from(&ll.sll_addr[..6]).ok();
                }
            }
            _ => {}
        }
    }
    // SAFETY: releases the list; nothing refers into it any more.
    unsafe { libc::freeifaddrs(head) };
    for i in out.iter_mut().filter(|i| i.index == 0) {
        if let Ok(name) = std::ffi::CString::new(i.name.as_str()) {
            // SAFETY: a NUL-terminated name.
            i.index = unsafe { libc::if_nametoindex(name.as_ptr()) };
        }
    }
    Ok(out)
}

/// Every (interface, address) pair, IPv4 and IPv6, in the kernel's order;
/// empty when the interfaces cannot be listed.
pub fn addresses() -> Vec<(String, IpAddr)> {
    interfaces()
        .unwrap_or_default()
        .into_iter()
        .flat_map(|i| {
            let name = i.name;
            i.addrs.into_iter().map(move |a| (name.clone(), a))
        })
        .collect()
}

/// The MTU of `interface`; fails when there is no such interface or the
/// name is not a valid interface name.
pub fn mtu(interface: &str) -> io::Result<u32> {
    if interface.is_empty() || interface.len() >= libc::IFNAMSIZ || interface.contains(['/', '\0']) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "not an interface name"));
    }
    // SAFETY: plain socket call.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: a zeroed ifreq is valid; the name is shorter than IFNAMSIZ
    // (checked above), so it stays NUL-terminated.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(interface.as_bytes()) {
        *d = *s as libc::c_char;
    }
    // SAFETY: SIOCGIFMTU fills the ifreq it is given.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCGIFMTU as _, &mut req) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: SIOCGIFMTU wrote the MTU member of the union.
    Ok(unsafe { req.ifr_ifru.ifru_mtu }.max(0) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_listed_once_with_its_address() {
        let all = interfaces().unwrap();
        let lo: Vec<_> = all.iter().filter(|i| i.name == "lo").collect();
        assert_eq!(lo.len(), 1, "{all:?}");
        let lo = lo[0];
        assert!(lo.is_loopback() && lo.index > 0 && lo.mac.is_none(), "{lo:?}");
        assert!(lo.ipv4().any(|a| a.is_loopback()), "{lo:?}");
        for i in &all {
            assert_eq!(all.iter().filter(|j| j.name == i.name).count(), 1, "{} twice", i.name);
        }
        // The flat list is the same walk.
        let flat = addresses();
        assert_eq!(flat.len(), all.iter().map(|i| i.addrs.len()).sum::<usize>());
        assert!(flat.iter().any(|(n, a)| n == "lo" && *a == IpAddr::from([127, 0, 0, 1])));
    }

    #[test]
    fn mtus() {
        assert!(mtu("lo").unwrap() > 0);
        for bad in ["", "nosuchif9", "a/b", "0123456789abcdef", "x\0y"] {
            assert!(mtu(bad).is_err(), "{bad:?}");
        }
    }
}
