//! Connection management: client-server and peer-to-peer.

use crate::api_vi::vi_attrs;
use crate::types::*;
use crate::{call, h, need, p, put};
use libc::c_ulong;
use via_core::consts::limits;
use via_core::ViaError;
use via_provider::connect::{self, NetAddress};
use via_provider::endpoint::Endpoint;
use via_provider::{Nic, Vi, ViAttrs, ViaResult};

/// Reads a `VIP_NET_ADDRESS` (host address, then discriminator).
unsafe fn read_addr(addr: *const VIP_NET_ADDRESS) -> ViaResult<NetAddress> {
    need(addr)?;
    let a = &*addr;
    let (hl, dl) = (a.HostAddressLen as usize, a.DiscriminatorLen as usize);
    if hl > 16 || dl > limits::MAX_DISCRIMINATOR_LEN {
        return Err(ViaError::InvalidParameter);
    }
    let bytes = std::slice::from_raw_parts(std::ptr::addr_of!(a.HostAddress) as *const u8, hl + dl);
    Ok(NetAddress { host: bytes[..hl].to_vec(), disc: bytes[hl..].to_vec() })
}

unsafe fn write_addr(out: *mut VIP_NET_ADDRESS, host: &[u8], disc: &[u8]) {
    crate::api_nic::write_host(out, host);
    (*out).DiscriminatorLen = disc.len() as u16;
    let base = std::ptr::addr_of_mut!((*out).HostAddress) as *mut u8;
    std::ptr::copy_nonoverlapping(disc.as_ptr(), base.add(host.len()), disc.len());
}

fn remote_attrs(e: &Endpoint) -> VIP_VI_ATTRIBUTES {
    let mut a = vi_attrs(&ViAttrs {
        reliability: e.reliability,
        max_transfer: e.max_transfer,
        ptag: 0,
        rdma_write: e.rdma_write,
        rdma_read: e.rdma_read,
    });
    a.Ptag = std::ptr::null_mut();
    a
}

#[no_mangle]
pub unsafe extern "C" fn VipConnectWait(
    nic: VIP_PVOID,
    local: *const VIP_NET_ADDRESS,
    timeout: c_ulong,
    remote: *mut VIP_NET_ADDRESS,
    remote_attrs_out: *mut VIP_VI_ATTRIBUTES,
    conn: *mut VIP_PVOID,
) -> VIP_RETURN {
    call(|| {
        let nic = Nic::get(h(nic))?;
        let local = read_addr(local)?;
        need(remote)?;
        need(remote_attrs_out)?;
        need(conn)?;
        let handle = connect::connect_wait(&nic, &local, timeout as u64)?;
        let pending = via_provider::provider().conns.get(handle).ok_or(ViaError::Resource)?;
        write_addr(remote, &pending.remote_host, &pending.remote_disc);
        put(remote_attrs_out, remote_attrs(&pending.peer))?;
        put(conn, p(handle))
    })
}

#[no_mangle]
pub unsafe extern "C" fn VipConnectAccept(conn: VIP_PVOID, vi: VIP_PVOID) -> VIP_RETURN {
    call(|| {
        let vi = Vi::get(h(vi))?;
        connect::accept(h(conn), &vi)
    })
}

#[no_mangle]
pub unsafe extern "C" fn VipConnectReject(conn: VIP_PVOID) -> VIP_RETURN {
    call(|| connect::reject(h(conn)))
}

#[no_mangle]
pub unsafe extern "C" fn VipConnectRequest(
    vi: VIP_PVOID,
    local: *const VIP_NET_ADDRESS,
    remote: *const VIP_NET_ADDRESS,
    timeout: c_ulong,
    remote_attrs_out: *mut VIP_VI_ATTRIBUTES,
) -> VIP_RETURN {
    call(|| {
        let vi = Vi::get(h(vi))?;
        let local = read_addr(local)?;
        let remote = read_addr(remote)?;
        need(remote_attrs_out)?;
        let peer = connect::connect_request(&vi, &local, &remote, timeout as u64)?;
        put(remote_attrs_out, remote_attrs(&peer))
    })
}

#[no_mangle]
pub unsafe extern "C" fn VipDisconnect(vi: VIP_PVOID) -> VIP_RETURN {
    call(|| Vi::get(h(vi))?.disconnect())
}

#[no_mangle]
pub unsafe extern "C" fn VipConnectPeerRequest(
    vi: VIP_PVOID,
    local: *const VIP_NET_ADDRESS,
    remote: *const VIP_NET_ADDRESS,
    timeout: c_ulong,
) -> VIP_RETURN {
    call(|| {
        let vi = Vi::get(h(vi))?;
        let local = read_addr(local)?;
        let remote = read_addr(remote)?;
        connect::peer_request(&vi, &local, &remote, timeout as u64)
    })
}

unsafe fn peer_finish(vi: VIP_PVOID, out: *mut VIP_VI_ATTRIBUTES, wait: bool) -> ViaResult<()> {
    let vi = Vi::get(h(vi))?;
    need(out)?;
    let peer = connect::peer_done(&vi, wait)?;
    put(out, remote_attrs(&peer))
}

#[no_mangle]
pub unsafe extern "C" fn VipConnectPeerDone(vi: VIP_PVOID, out: *mut VIP_VI_ATTRIBUTES) -> VIP_RETURN {
    call(|| peer_finish(vi, out, false))
}

#[no_mangle]
pub unsafe extern "C" fn VipConnectPeerWait(vi: VIP_PVOID, out: *mut VIP_VI_ATTRIBUTES) -> VIP_RETURN {
    call(|| peer_finish(vi, out, true))
}
