//! VI device names and the host addresses of this host's devices.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Host address of `via_lo`.
pub const LOOPBACK: [u8; 4] = [127, 0, 0, 1];
/// The IPv6 loopback address `::1`.
pub const LOOPBACK6: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];

/// A resolved VI device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Canonical device name, e.g. `via_lo`.
    pub name: String,
    /// Network interface behind the device, e.g. `lo`.
    pub interface: String,
    /// Host address of the device (4 bytes, IPv4).
    pub host_addr: Vec<u8>,
    /// The interface's global IPv6 address (16 bytes), if it has one; `::1`
    /// for `via_lo` when loopback has it.  Link-local addresses do not count.
    pub host_addr6: Option<Vec<u8>>,
    /// MTU of the interface.
    pub mtu: u32,
}

/// Resolves `/dev/via_IF` or `via_IF` to interface `IF`, its first IPv4
/// address (127.0.0.1 for `lo`), its first global IPv6 address and its MTU.
pub fn resolve(device: &str) -> Result<DeviceInfo, String> {
    let name = device.strip_prefix("/dev/").unwrap_or(device);
    let interface = name
        .strip_prefix("via_")
        .filter(|i| !i.is_empty() && i.len() < libc::IFNAMSIZ && !i.contains(['/', '\0']))
        .ok_or_else(|| format!("{device:?} is not a VI device name"))?;
    let mtu = mtu(interface).map_err(|e| format!("{device:?}: interface {interface}: {e}"))?;
    let addrs: Vec<Vec<u8>> =
        interface_addrs().into_iter().filter_map(|(n, a)| (n == interface).then_some(a)).collect();
    let host = match interface {
        "lo" => Some(LOOPBACK.to_vec()),
        _ => addrs.iter().find(|a| a.len() == 4).cloned(),
    };
    let host = host.ok_or_else(|| format!("{device:?}: interface {interface} has no IPv4 address"))?;
    let host6 = match interface {
        "lo" => addrs.iter().find(|a| a[..] == LOOPBACK6).cloned(),
        _ => addrs.iter().find(|a| is_global6(a)).cloned(),
    };
    Ok(DeviceInfo { name: name.to_string(), interface: interface.to_string(), host_addr: host, host_addr6: host6, mtu })
}

/// Whether `a` is an IPv6 address a remote host can reach: not unspecified,
/// loopback, link-local (fe80::/10) or multicast.
fn is_global6(a: &[u8]) -> bool {
    a.len() == 16 && a != [0; 16] && a != LOOPBACK6 && !(a[0] == 0xfe && a[1] & 0xc0 == 0x80) && a[0] != 0xff
}

/// Host addresses (4 bytes each) of this host's VI devices: 127.0.0.1 and
/// each interface's IPv4 addresses.
pub fn local_host_addrs() -> Vec<Vec<u8>> {
    let mut out = vec![LOOPBACK.to_vec()];
    for (_, a) in interface_addrs() {
        if a.len() == 4 && a[0] != 127 && !out.contains(&a) {
            out.push(a);
        }
    }
    out
}

/// Whether `host` names this host: any 127.0.0.0/8 address, `::1`, an
/// IPv4-mapped IPv6 form of a local IPv4 address, or an address (IPv4 or
/// IPv6) of one of this host's interfaces.
pub fn is_local(host: &[u8]) -> bool {
    let host = canonical_host(host);
    match host.len() {
        4 if host[0] == 127 => true,
        16 if host == LOOPBACK6 => true,
        4 | 16 => interface_addrs().iter().any(|(_, a)| a[..] == *host),
        _ => false,
    }
}

/// The interface that owns a local host address (`lo` for loopback ones).
pub fn interface_of(host: &[u8]) -> Option<String> {
    let host = canonical_host(host);
    if host == LOOPBACK || host == LOOPBACK6 {
        return Some("lo".to_string());
    }
    interface_addrs().into_iter().find(|(_, a)| a[..] == *host).map(|(name, _)| name)
}

/// The form used to compare host addresses: every loopback IPv4 address is
/// 127.0.0.1 and an IPv4-mapped IPv6 address is its IPv4 address.
pub fn canonical_host(host: &[u8]) -> &[u8] {
    match host {
        [127, _, _, _] => &LOOPBACK,
        [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, v4 @ ..] => canonical_host(v4),
        _ => host,
    }
}

/// Every (interface, address) pair, IPv4 (4 bytes) and IPv6 (16 bytes), in
/// the kernel's order.
fn interface_addrs() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we walk read-only and free once.
    unsafe {
        if libc::getifaddrs(&mut head) != 0 {
            return out;
        }
        let mut p = head;
        while !p.is_null() {
            let ifa = &*p;
            let family = match ifa.ifa_addr.is_null() {
                true => -1,
                false => (*ifa.ifa_addr).sa_family as libc::c_int,
            };
            let addr = match family {
                libc::AF_INET => {
                    let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                    // s_addr is in network order, so its memory bytes are the address.
                    Some(sin.sin_addr.s_addr.to_ne_bytes().to_vec())
                }
                libc::AF_INET6 => {
                    let sin6 = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                    Some(sin6.sin6_addr.s6_addr.to_vec())
                }
                _ => None,
            };
            if let Some(addr) = addr {
                let name = CStr::from_ptr(ifa.ifa_name).to_string_lossy().into_owned();
                out.push((name, addr));
            }
            p = ifa.ifa_next;
        }
        libc::freeifaddrs(head);
    }
    out
}

/// The MTU of `interface`; fails when there is no such interface.
fn mtu(interface: &str) -> io::Result<u32> {
    // SAFETY: plain syscalls; `req` is plain data with a NUL-terminated name
    // (the name is shorter than IFNAMSIZ, checked by the caller).
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = OwnedFd::from_raw_fd(fd);
        let mut req: libc::ifreq = std::mem::zeroed();
        for (d, s) in req.ifr_name.iter_mut().zip(interface.as_bytes()) {
            *d = *s as libc::c_char;
        }
        if libc::ioctl(fd.as_raw_fd(), libc::SIOCGIFMTU as _, &mut req) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(req.ifr_ifru.ifru_mtu.max(0) as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        let lo = resolve("/dev/via_lo").unwrap();
        assert_eq!((lo.name.as_str(), lo.interface.as_str()), ("via_lo", "lo"));
        assert_eq!(lo.host_addr, LOOPBACK);
        assert!(lo.mtu > 0);
        assert_eq!(resolve("via_lo").unwrap(), lo);
        for bad in ["lo", "/dev/lo", "via_", "via_nosuchif9", "via_a/b", "via_0123456789abcdef"] {
            assert!(resolve(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn hosts() {
        assert_eq!(local_host_addrs()[0], LOOPBACK);
        assert!(is_local(&[127, 9, 9, 9]));
        assert!(!is_local(&[10, 255, 255, 1]) || local_host_addrs().contains(&vec![10, 255, 255, 1]));
        assert!(!is_local(&[127, 0, 0]));
        assert_eq!(canonical_host(&[127, 3, 2, 1]), LOOPBACK);
        assert_eq!(canonical_host(&[10, 0, 0, 1]), [10, 0, 0, 1]);
        for a in local_host_addrs() {
            assert!(is_local(&a));
        }
        // IPv6: loopback, mapped IPv4, and every interface address.
        assert!(is_local(&LOOPBACK6));
        let mapped = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 9];
        assert_eq!(canonical_host(&mapped), LOOPBACK);
        assert!(is_local(&mapped));
        assert!(!is_local(&[0xfd, 0x77, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x7e, 0x57]));
        assert!(!is_local(&[0; 5]) && !is_local(&[]));
        for (_, a) in interface_addrs() {
            assert!(is_local(&a), "{a:?}");
        }
        assert!(local_host_addrs().iter().all(|a| a.len() == 4));
    }

    #[test]
    fn global_ipv6() {
        assert!(is_global6(&[0xfd, 0x77, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]));
        assert!(is_global6(&[0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]));
        assert!(!is_global6(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]));
        assert!(!is_global6(&[0xfe, 0xbf, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]));
        assert!(!is_global6(&[0xff, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]));
        assert!(!is_global6(&LOOPBACK6) && !is_global6(&[0; 16]) && !is_global6(&LOOPBACK));
    }
}
