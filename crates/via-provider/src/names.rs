//! The name service: host names to VI host addresses and back.

use std::ffi::CString;
use std::net::Ipv4Addr;
use via_core::error::{ViaError, ViaResult};

/// An IPv6 literal's 16 bytes (IPv6 hosts are named by address).
pub fn ipv6_literal(name: &str) -> Option<[u8; 16]> {
    name.parse::<std::net::Ipv6Addr>().ok().map(|ip| ip.octets())
}

/// IPv4 addresses of `name`, in resolver order, without duplicates.
pub fn host_addresses(name: &str) -> ViaResult<Vec<[u8; 4]>> {
    if let Ok(ip) = name.parse::<Ipv4Addr>() {
        return Ok(vec![ip.octets()]);
    }
    let cname = CString::new(name).map_err(|_| ViaError::NameService)?;
    let mut hints: libc::addrinfo = unsafe { std::mem::zeroed() };
    hints.ai_family = libc::AF_INET;
    hints.ai_socktype = libc::SOCK_DGRAM;
    let mut res: *mut libc::addrinfo = std::ptr::null_mut();
    // SAFETY: standard getaddrinfo call; freed below.
    if unsafe { libc::getaddrinfo(cname.as_ptr(), std::ptr::null(), &hints, &mut res) } != 0 {
        return Err(ViaError::NameService);
    }
    let mut out = Vec::new();
    let mut cur = res;
    while !cur.is_null() {
        // SAFETY: walking the list getaddrinfo returned.
        let ai = unsafe { &*cur };
        if ai.ai_family == libc::AF_INET && !ai.ai_addr.is_null() {
            let sin = unsafe { &*(ai.ai_addr as *const libc::sockaddr_in) };
            let octets = sin.sin_addr.s_addr.to_ne_bytes();
            if !out.contains(&octets) {
                out.push(octets);
            }
        }
        cur = ai.ai_next;
    }
    // SAFETY: the list from getaddrinfo.
    unsafe { libc::freeaddrinfo(res) };
    if out.is_empty() {
        Err(ViaError::NameService)
    } else {
        Ok(out)
    }
}

/// The host name of a 4-byte address (a 16-byte one is named by its literal).
pub fn host_name(addr: &[u8]) -> ViaResult<String> {
    if let Ok(v6) = <[u8; 16]>::try_from(addr) {
        return Ok(std::net::Ipv6Addr::from(v6).to_string());
    }
    let octets: [u8; 4] = addr.try_into().map_err(|_| ViaError::NameService)?;
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as u16,
        sin_port: 0,
        sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(octets) },
        sin_zero: [0; 8],
    };
    let mut host = [0 as libc::c_char; 1025];
    // SAFETY: getnameinfo with a valid sockaddr and buffer.
    let r = unsafe {
        libc::getnameinfo(
            &sin as *const _ as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_in>() as u32,
            host.as_mut_ptr(),
            host.len() as u32,
            std::ptr::null_mut(),
            0,
            libc::NI_NAMEREQD,
        )
    };
    if r != 0 {
        return Err(ViaError::NameService);
    }
    // SAFETY: getnameinfo NUL-terminates.
    Ok(unsafe { std::ffi::CStr::from_ptr(host.as_ptr()) }.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn localhost_resolves_both_ways() {
        assert!(host_addresses("localhost").unwrap().contains(&[127, 0, 0, 1]));
        assert_eq!(host_addresses("10.1.2.3").unwrap(), vec![[10, 1, 2, 3]]);
        assert!(host_addresses("no-such-host.invalid").is_err());
        assert!(!host_name(&[127, 0, 0, 1]).unwrap().is_empty());
        assert!(host_name(&[1, 2, 3]).is_err());
    }
}
