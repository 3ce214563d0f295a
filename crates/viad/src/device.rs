//! VI device names and the host addresses of this host's devices.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Host address of `via_lo`.
pub const LOOPBACK: [u8; 4] = [127, 0, 0, 1];

/// A resolved VI device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Canonical device name, e.g. `via_lo`.
    pub name: String,
    /// Network interface behind the device, e.g. `lo`.
    pub interface: String,
    /// Host address of the device (4 bytes, IPv4).
    pub host_addr: Vec<u8>,
    /// MTU of the interface.
    pub mtu: u32,
}

/// Resolves `/dev/via_IF` or `via_IF` to interface `IF`, its first IPv4
/// address (127.0.0.1 for `lo`) and its MTU.
pub fn resolve(device: &str) -> Result<DeviceInfo, String> {
    let name = device.strip_prefix("/dev/").unwrap_or(device);
    let interface = name
        .strip_prefix("via_")
        .filter(|i| !i.is_empty() && i.len() < libc::IFNAMSIZ && !i.contains(['/', '\0']))
        .ok_or_else(|| format!("{device:?} is not a VI device name"))?;
    let mtu = mtu(interface).map_err(|e| format!("{device:?}: interface {interface}: {e}"))?;
    let host = match interface {
        "lo" => Some(LOOPBACK),
        _ => interface_addrs()
            .into_iter()
            .find_map(|(n, a)| (n == interface).then_some(a)),
    };
    let host =
        host.ok_or_else(|| format!("{device:?}: interface {interface} has no IPv4 address"))?;
    Ok(DeviceInfo {
        name: name.to_string(),
        interface: interface.to_string(),
        host_addr: host.to_vec(),
        mtu,
    })
}

/// Host addresses (4 bytes each) of this host's VI devices: 127.0.0.1 and
/// each interface's IPv4 addresses.
pub fn local_host_addrs() -> Vec<Vec<u8>> {
    let mut out = vec![LOOPBACK.to_vec()];
    for (_, a) in interface_addrs() {
        if a[0] != 127 && !out.iter().any(|o| o[..] == a[..]) {
            out.push(a.to_vec());
        }
    }
    out
}

/// Whether `host` names this host: any 127.0.0.0/8 address or an interface address.
pub fn is_local(host: &[u8]) -> bool {
    host.len() == 4 && (host[0] == 127 || local_host_addrs().iter().any(|a| a[..] == *host))
}

/// The form used to compare host addresses: every loopback address is 127.0.0.1.
pub fn canonical_host(host: &[u8]) -> &[u8] {
    match host {
        [127, _, _, _] => &LOOPBACK,
        _ => host,
    }
}

/// Every (interface, IPv4 address) pair, in the kernel's order.
fn interface_addrs() -> Vec<(String, [u8; 4])> {
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
            if !ifa.ifa_addr.is_null() && (*ifa.ifa_addr).sa_family as libc::c_int == libc::AF_INET
            {
                let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                let name = CStr::from_ptr(ifa.ifa_name).to_string_lossy().into_owned();
                // s_addr is in network order, so its memory bytes are the address.
                out.push((name, sin.sin_addr.s_addr.to_ne_bytes()));
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
        for bad in [
            "lo",
            "/dev/lo",
            "via_",
            "via_nosuchif9",
            "via_a/b",
            "via_0123456789abcdef",
        ] {
            assert!(resolve(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn hosts() {
        assert_eq!(local_host_addrs()[0], LOOPBACK);
        assert!(is_local(&[127, 9, 9, 9]));
        assert!(
            !is_local(&[10, 255, 255, 1]) || local_host_addrs().contains(&vec![10, 255, 255, 1])
        );
        assert!(!is_local(&[127, 0, 0]));
        assert_eq!(canonical_host(&[127, 3, 2, 1]), LOOPBACK);
        assert_eq!(canonical_host(&[10, 0, 0, 1]), [10, 0, 0, 1]);
        for a in local_host_addrs() {
            assert!(is_local(&a));
        }
    }
}
