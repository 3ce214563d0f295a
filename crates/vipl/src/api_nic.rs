//! NIC, protection tags, memory, errors, system management and name service.

use crate::types::*;
use crate::{call, h, need, p, put};
use libc::{c_char, c_ulong};
use std::ffi::CStr;
use std::sync::Arc;
use via_core::consts::{limits, SERVICE_RELIABLE_DELIVERY, SERVICE_RELIABLE_RECEPTION, SERVICE_UNRELIABLE};
use via_core::registry::{REGION_RDMA_READ, REGION_RDMA_WRITE};
use via_core::ViaError;
use via_provider::{names, ErrorEvent, Nic, ViaResult};

#[no_mangle]
pub unsafe extern "C" fn VipOpenNic(name: *const c_char, out: *mut VIP_PVOID) -> VIP_RETURN {
    call(|| {
        need(name)?;
        need(out)?;
        let name = CStr::from_ptr(name).to_str().map_err(|_| ViaError::InvalidParameter)?;
        let (handle, _) = Nic::open(name)?;
        put(out, p(handle))
    })
}

#[no_mangle]
pub unsafe extern "C" fn VipCloseNic(nic: VIP_PVOID) -> VIP_RETURN {
    call(|| via_provider::close_nic(h(nic)))
}

#[no_mangle]
pub unsafe extern "C" fn VipQueryNic(nic: VIP_PVOID, out: *mut VIP_NIC_ATTRIBUTES) -> VIP_RETURN {
    call(|| {
        let nic = Nic::get(h(nic))?;
        need(out)?;
        let mut name = [0 as c_char; 64];
        for (d, s) in name.iter_mut().zip(nic.device.name.bytes().take(63)) {
            *d = s as c_char;
        }
        let mtu = limits::MAX_TRANSFER_SIZE as c_ulong;
        put(
            out,
            VIP_NIC_ATTRIBUTES {
                Name: name,
                HardwareVersion: 1,
                ProviderVersion: 0x0001_0000,
                NicAddressLen: nic.device.host_addr.len() as u16,
                LocalNicAddress: nic.device.host_addr.as_ptr(),
                ThreadSafe: 1,
                MaxDiscriminatorLen: limits::MAX_DISCRIMINATOR_LEN as u16,
                MaxRegisterBytes: limits::MAX_REGISTER_BYTES as c_ulong,
                MaxRegisterRegions: limits::MAX_REGISTER_REGIONS as c_ulong,
                MaxRegisterBlockBytes: limits::MAX_REGISTER_BYTES as c_ulong,
                MaxVI: limits::MAX_VI as c_ulong,
                MaxDescriptorsPerQueue: limits::MAX_DESCRIPTORS_PER_QUEUE as c_ulong,
                MaxSegmentsPerDesc: limits::MAX_SEGMENTS_PER_DESC as c_ulong,
                MaxCQ: limits::MAX_CQ as c_ulong,
                MaxCQEntries: via_shm::inbox::INBOX_ENTRIES.min(limits::MAX_CQ_ENTRIES) as c_ulong,
                MaxTransferSize: mtu,
                NativeMTU: mtu,
                MaxPtags: limits::MAX_PTAGS as c_ulong,
                ReliabilityLevelSupport: SERVICE_UNRELIABLE | SERVICE_RELIABLE_DELIVERY | SERVICE_RELIABLE_RECEPTION,
                RDMAReadSupport: SERVICE_RELIABLE_DELIVERY | SERVICE_RELIABLE_RECEPTION,
            },
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn VipCreatePtag(nic: VIP_PVOID, out: *mut VIP_PVOID) -> VIP_RETURN {
    call(|| {
        let nic = Nic::get(h(nic))?;
        need(out)?;
        put(out, p(nic.create_ptag()?))
    })
}

#[no_mangle]
pub unsafe extern "C" fn VipDestroyPtag(nic: VIP_PVOID, ptag: VIP_PVOID) -> VIP_RETURN {
    call(|| Nic::get(h(nic))?.destroy_ptag(h(ptag)))
}

unsafe fn mem_attrs(nic: &Nic, attrs: *const VIP_MEM_ATTRIBUTES) -> ViaResult<(u32, u32)> {
    need(attrs)?;
    let a = &*attrs;
    let tag = nic.ptag(h(a.Ptag))?;
    let mut flags = 0;
    if a.EnableRdmaWrite != 0 {
        flags |= REGION_RDMA_WRITE;
    }
    if a.EnableRdmaRead != 0 {
        flags |= REGION_RDMA_READ;
    }
    Ok((tag.id, flags))
}

#[no_mangle]
pub unsafe extern "C" fn VipRegisterMem(
    nic: VIP_PVOID,
    addr: VIP_PVOID,
    len: c_ulong,
    attrs: *const VIP_MEM_ATTRIBUTES,
    out: *mut VIP_MEM_HANDLE,
) -> VIP_RETURN {
    call(|| {
        let nic = Nic::get(h(nic))?;
        need(out)?;
        let (ptag, flags) = mem_attrs(&nic, attrs)?;
        let handle = nic.registry.register(addr as u64, len as u64, ptag, flags, nic.tuning.pin_memory)?;
        put(out, handle)
    })
}

#[no_mangle]
pub unsafe extern "C" fn VipDeregisterMem(nic: VIP_PVOID, addr: VIP_PVOID, mem: VIP_MEM_HANDLE) -> VIP_RETURN {
    call(|| Nic::get(h(nic))?.deregister(mem, addr as u64))
}

#[no_mangle]
pub unsafe extern "C" fn VipQueryMem(
    nic: VIP_PVOID,
    addr: VIP_PVOID,
    mem: VIP_MEM_HANDLE,
    out: *mut VIP_MEM_ATTRIBUTES,
) -> VIP_RETURN {
    call(|| {
        let nic = Nic::get(h(nic))?;
        need(out)?;
        let region = nic.registry.lookup_at(mem, addr as u64)?;
        put(
            out,
            VIP_MEM_ATTRIBUTES {
                Ptag: p(nic.ptag_of_id(region.ptag).unwrap_or(0)),
                EnableRdmaWrite: (region.flags & REGION_RDMA_WRITE != 0) as VIP_BOOLEAN,
                EnableRdmaRead: (region.flags & REGION_RDMA_READ != 0) as VIP_BOOLEAN,
            },
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn VipSetMemAttributes(
    nic: VIP_PVOID,
    addr: VIP_PVOID,
    mem: VIP_MEM_HANDLE,
    attrs: *const VIP_MEM_ATTRIBUTES,
) -> VIP_RETURN {
    call(|| {
        let nic = Nic::get(h(nic))?;
        nic.registry.lookup_at(mem, addr as u64)?;
        let (ptag, flags) = mem_attrs(&nic, attrs)?;
        nic.registry.set_attributes(mem, addr as u64, ptag, flags)
    })
}

#[no_mangle]
pub unsafe extern "C" fn VipErrorCallback(
    nic: VIP_PVOID,
    context: VIP_PVOID,
    handler: VIP_ERROR_HANDLER,
) -> VIP_RETURN {
    call(|| {
        let nic = Nic::get(h(nic))?;
        let context = context as usize;
        nic.set_error_handler(handler.map(|f| {
            Arc::new(move |e: &ErrorEvent| {
                let mut d = VIP_ERROR_DESCRIPTOR {
                    NicHandle: p(e.nic),
                    ViHandle: p(e.vi),
                    CQHandle: p(e.cq),
                    DescriptorPtr: e.descriptor as VIP_PVOID,
                    OpCode: 0,
                    ResourceCode: e.resource as i32,
                    ErrorCode: e.code as i32,
                };
                // SAFETY: the application's handler, called as vipl.h declares it.
                unsafe { f(context as VIP_PVOID, &mut d) };
            }) as via_provider::nic::ErrorHandler
        }));
        Ok(())
    })
}

/// Writes host address `host` (and keeps the caller's discriminator) into a `VIP_NET_ADDRESS`.
pub(crate) unsafe fn write_host(addr: *mut VIP_NET_ADDRESS, host: &[u8]) {
    (*addr).HostAddressLen = host.len() as u16;
    std::ptr::copy_nonoverlapping(host.as_ptr(), std::ptr::addr_of_mut!((*addr).HostAddress) as *mut u8, host.len());
}

#[no_mangle]
pub unsafe extern "C" fn VipQuerySystemManagementInfo(nic: VIP_PVOID, info: c_ulong, out: VIP_PVOID) -> VIP_RETURN {
    call(|| {
        Nic::get(h(nic))?;
        need(out)?;
        if info != VIP_SMI_AUTODISCOVERY {
            return Err(ViaError::InvalidParameter);
        }
        let list = &mut *(out as *mut VIP_AUTODISCOVERY_LIST);
        let hosts = viad_client::client::local_host_addrs();
        let room = list.NumAdAddrs as usize;
        if room > 0 {
            need(list.ADAddrArray)?;
        }
        for (i, host) in hosts.iter().take(room).enumerate() {
            let a = *list.ADAddrArray.add(i);
            need(a)?;
            write_host(a, host);
            (*a).DiscriminatorLen = 0;
        }
        list.NumAdAddrs = hosts.len() as c_ulong;
        list.NumberOfHops = 0;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn VipNSInit(nic: VIP_PVOID, _info: VIP_PVOID) -> VIP_RETURN {
    call(|| Nic::get(h(nic)).map(|_| ()))
}

#[no_mangle]
pub unsafe extern "C" fn VipNSShutdown(nic: VIP_PVOID) -> VIP_RETURN {
    call(|| Nic::get(h(nic)).map(|_| ()))
}

#[no_mangle]
pub unsafe extern "C" fn VipNSGetHostByName(
    nic: VIP_PVOID,
    name: *const c_char,
    addr: *mut VIP_NET_ADDRESS,
    index: c_ulong,
) -> VIP_RETURN {
    call(|| {
        Nic::get(h(nic))?;
        need(name)?;
        need(addr)?;
        let name = CStr::from_ptr(name).to_str().map_err(|_| ViaError::NameService)?;
        // An IPv6 literal needs room for 16 bytes: the caller says so in HostAddressLen.
        if let Some(v6) = names::ipv6_literal(name) {
            if (*addr).HostAddressLen < 16 || index != 0 {
                return Err(ViaError::NameService);
            }
            write_host(addr, &v6);
            return Ok(());
        }
        let all = names::host_addresses(name)?;
        let host = all.get(index as usize).ok_or(ViaError::NameService)?;
        write_host(addr, host);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn VipNSGetHostByAddr(
    nic: VIP_PVOID,
    addr: *const VIP_NET_ADDRESS,
    name: *mut c_char,
    len: *mut c_ulong,
) -> VIP_RETURN {
    call(|| {
        Nic::get(h(nic))?;
        need(addr)?;
        need(name)?;
        need(len)?;
        let a = &*addr;
        let host =
            std::slice::from_raw_parts(std::ptr::addr_of!(a.HostAddress) as *const u8, a.HostAddressLen as usize);
        let found = names::host_name(host)?;
        let needed = found.len() + 1;
        if (*len as usize) < needed {
            *len = needed as c_ulong;
            return Err(ViaError::Resource);
        }
        std::ptr::copy_nonoverlapping(found.as_ptr() as *const c_char, name, found.len());
        *name.add(found.len()) = 0;
        *len = needed as c_ulong;
        Ok(())
    })
}
