//! VI device names and the host addresses of this host's devices.

use crate::netif;
use std::net::IpAddr;

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
/// Names only devices: aliases are resolved before (see [`crate::aliases`]).
pub fn resolve(device: &str) -> Result<DeviceInfo, String> {
    let interface = interface_name(device).ok_or_else(|| format!("{device:?} is not a VI device name"))?;
    let mtu = netif::mtu(interface).map_err(|e| format!("{device:?}: interface {interface}: {e}"))?;
    let addrs = netif::interfaces()
        .unwrap_or_default()
        .into_iter()
        .find(|i| i.name == interface)
        .map(|i| i.addrs)
        .unwrap_or_default();
    describe(interface, &addrs, mtu).ok_or_else(|| format!("{device:?}: interface {interface} has no IPv4 address"))
}

/// The interface a device name (`/dev/via_IF` or `via_IF`) names, if it is
/// one: `IF` must be a possible interface name.
pub fn interface_name(device: &str) -> Option<&str> {
    device.strip_prefix("/dev/").unwrap_or(device).strip_prefix("via_").filter(|i| {
        !i.is_empty() && i.len() < libc::IFNAMSIZ && !i.contains(['/', '\0']) && !i.contains(char::is_whitespace)
    })
}

/// Every VI device of this host: `via_lo` and `via_IF` for each interface
/// with an IPv4 address, in the kernel's order of interfaces.
pub fn devices() -> Vec<DeviceInfo> {
    netif::interfaces()
        .unwrap_or_default()
        .into_iter()
        .filter_map(|i| describe(&i.name, &i.addrs, netif::mtu(&i.name).ok()?))
        .collect()
}

/// The device of `interface` with addresses `addrs`, if it has one.
fn describe(interface: &str, addrs: &[IpAddr], mtu: u32) -> Option<DeviceInfo> {
    let host = match interface {
        "lo" => LOOPBACK.to_vec(),
        _ => addrs.iter().find_map(|a| match a {
            IpAddr::V4(v4) => Some(v4.octets().to_vec()),
            IpAddr::V6(_) => None,
        })?,
    };
    let v6 = addrs.iter().filter_map(|a| match a {
        IpAddr::V6(v6) => Some(v6.octets()),
        IpAddr::V4(_) => None,
    });
    let host6 = match interface {
        "lo" => v6.clone().find(|a| *a == LOOPBACK6),
        _ => v6.clone().find(|a| is_global6(a)),
    };
    Some(DeviceInfo {
        name: format!("via_{interface}"),
        interface: interface.to_string(),
        host_addr: host,
        host_addr6: host6.map(|a| a.to_vec()),
        mtu,
    })
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
/// the kernel's order (the shared walk of [`crate::netif`]).
fn interface_addrs() -> Vec<(String, Vec<u8>)> {
    crate::netif::addresses()
        .into_iter()
        .map(|(name, a)| {
            let bytes = match a {
                std::net::IpAddr::V4(v4) => v4.octets().to_vec(),
                std::net::IpAddr::V6(v6) => v6.octets().to_vec(),
            };
            (name, bytes)
        })
        .collect()
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
        for bad in ["lo", "/dev/lo", "via_", "via_nosuchif9", "via_a/b", "via_0123456789abcdef", "via_a b"] {
            assert!(resolve(bad).is_err(), "{bad}");
        }
        assert_eq!(interface_name("/dev/via_eth0"), Some("eth0"));
        assert_eq!(interface_name("clanvi0"), None);
    }

    #[test]
    fn every_device_resolves_to_itself() {
        let all = devices();
        assert!(all.contains(&resolve("via_lo").unwrap()), "{all:?}");
        for d in &all {
            assert_eq!(&resolve(&d.name).unwrap(), d);
            assert_eq!(d.host_addr.len(), 4);
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
