//! VIs and data transfer.

use crate::types::*;
use crate::{call, h, need, p, put};
use libc::{c_int, c_ulong};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use via_core::descriptor::DescPtr;
use via_core::ViaError;
use via_provider::{Cq, Nic, Vi, ViAttrs, ViState, ViaResult};

pub(crate) unsafe fn read_vi_attrs(attrs: *const VIP_VI_ATTRIBUTES) -> ViaResult<ViAttrs> {
    need(attrs)?;
    let a = &*attrs;
    if !a.QoS.is_null() {
        return Err(ViaError::InvalidQos);
    }
    Ok(ViAttrs {
        reliability: a.ReliabilityLevel,
        max_transfer: a.MaxTransferSize as u64,
        ptag: h(a.Ptag),
        rdma_write: a.EnableRdmaWrite != 0,
        rdma_read: a.EnableRdmaRead != 0,
    })
}

pub(crate) fn vi_attrs(a: &ViAttrs) -> VIP_VI_ATTRIBUTES {
    VIP_VI_ATTRIBUTES {
        ReliabilityLevel: a.reliability,
        MaxTransferSize: a.max_transfer as c_ulong,
        QoS: std::ptr::null_mut(),
        Ptag: p(a.ptag),
        EnableRdmaWrite: a.rdma_write as VIP_BOOLEAN,
        EnableRdmaRead: a.rdma_read as VIP_BOOLEAN,
    }
}

fn optional_cq(handle: VIP_PVOID) -> ViaResult<Option<Arc<Cq>>> {
    if handle.is_null() {
        Ok(None)
    } else {
        Cq::get(h(handle)).map(Some)
    }
}

#[no_mangle]
pub unsafe extern "C" fn VipCreateVi(
    nic: VIP_PVOID,
    attrs: *const VIP_VI_ATTRIBUTES,
    send_cq: VIP_PVOID,
    recv_cq: VIP_PVOID,
    out: *mut VIP_PVOID,
) -> VIP_RETURN {
    call(|| {
        let nic = Nic::get(h(nic))?;
        need(out)?;
        let attrs = read_vi_attrs(attrs)?;
        let handle = Vi::create(&nic, attrs, optional_cq(send_cq)?, optional_cq(recv_cq)?)?;
        put(out, p(handle))
    })
}

#[no_mangle]
pub unsafe extern "C" fn VipDestroyVi(vi: VIP_PVOID) -> VIP_RETURN {
    call(|| Vi::destroy(h(vi)))
}

#[no_mangle]
pub unsafe extern "C" fn VipQueryVi(
    vi: VIP_PVOID,
    state: *mut c_int,
    attrs: *mut VIP_VI_ATTRIBUTES,
    send_empty: *mut VIP_BOOLEAN,
    recv_empty: *mut VIP_BOOLEAN,
) -> VIP_RETURN {
    call(|| {
        let vi = Vi::get(h(vi))?;
        need(state)?;
        need(attrs)?;
        need(send_empty)?;
        need(recv_empty)?;
        let s = match vi.state() {
            ViState::Idle => VIP_STATE_IDLE,
            ViState::Connected => VIP_STATE_CONNECTED,
            ViState::ConnectPending => VIP_STATE_CONNECT_PENDING,
            ViState::Error => VIP_STATE_ERROR,
        };
        let (se, re) = vi.queues_empty();
        put(state, s)?;
        put(attrs, vi_attrs(&vi.attrs()))?;
        put(send_empty, se as VIP_BOOLEAN)?;
        put(recv_empty, re as VIP_BOOLEAN)
    })
}

#[no_mangle]
pub unsafe extern "C" fn VipSetViAttributes(vi: VIP_PVOID, attrs: *const VIP_VI_ATTRIBUTES) -> VIP_RETURN {
    call(|| {
        let vi = Vi::get(h(vi))?;
        vi.set_attrs(read_vi_attrs(attrs)?)
    })
}

#[no_mangle]
pub unsafe extern "C" fn VipPostSend(vi: VIP_PVOID, desc: VIP_PVOID, mem: VIP_MEM_HANDLE) -> VIP_RETURN {
    call(|| Vi::with(h(vi), |vi| vi.post_send(DescPtr(desc as usize), mem)))
}

#[no_mangle]
pub unsafe extern "C" fn VipPostRecv(vi: VIP_PVOID, desc: VIP_PVOID, mem: VIP_MEM_HANDLE) -> VIP_RETURN {
    call(|| Vi::with(h(vi), |vi| vi.post_recv(DescPtr(desc as usize), mem)))
}

#[no_mangle]
pub unsafe extern "C" fn VipSendDone(vi: VIP_PVOID, out: *mut VIP_PVOID) -> VIP_RETURN {
    call(|| {
        need(out)?;
        let desc = Vi::with(h(vi), |vi| vi.send_done())?;
        put(out, desc.0 as VIP_PVOID)
    })
}

#[no_mangle]
pub unsafe extern "C" fn VipSendWait(vi: VIP_PVOID, timeout: c_ulong, out: *mut VIP_PVOID) -> VIP_RETURN {
    call(|| {
        need(out)?;
        let desc = Vi::with(h(vi), |vi| vi.send_wait(timeout as u64))?;
        put(out, desc.0 as VIP_PVOID)
    })
}

#[no_mangle]
pub unsafe extern "C" fn VipRecvDone(vi: VIP_PVOID, out: *mut VIP_PVOID) -> VIP_RETURN {
    call(|| {
        need(out)?;
        let desc = Vi::with(h(vi), |vi| vi.recv_done())?;
        put(out, desc.0 as VIP_PVOID)
    })
}

#[no_mangle]
pub unsafe extern "C" fn VipRecvWait(vi: VIP_PVOID, timeout: c_ulong, out: *mut VIP_PVOID) -> VIP_RETURN {
    call(|| {
        need(out)?;
        let desc = Vi::with(h(vi), |vi| vi.recv_wait(timeout as u64))?;
        put(out, desc.0 as VIP_PVOID)
    })
}

/// Runs a one-shot notification: waits on a thread of its own (asleep, not
/// spinning) and calls the application back with the completed descriptor.
fn notify(vi: VIP_PVOID, context: VIP_PVOID, callback: VIP_VI_CALLBACK, recv: bool) -> ViaResult<()> {
    let vi = Vi::get(h(vi))?;
    let callback = callback.ok_or(ViaError::InvalidParameter)?;
    let context = context as usize;
    std::thread::Builder::new()
        .name("via-notify".into())
        .spawn(move || loop {
            let got = if recv { vi.recv_wait(100) } else { vi.send_wait(100) };
            match got {
                // SAFETY: the application's callback, as vipl.h declares it.
                Ok(d) => unsafe {
                    callback(context as VIP_PVOID, p(vi.nic.handle), p(vi.handle), d.0 as VIP_PVOID);
                    return;
                },
                Err(ViaError::Timeout) if !vi.destroyed.load(Ordering::Acquire) => continue,
                Err(_) => return,
            }
        })
        .map_err(|_| ViaError::Resource)?;
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn VipSendNotify(vi: VIP_PVOID, context: VIP_PVOID, callback: VIP_VI_CALLBACK) -> VIP_RETURN {
    call(|| notify(vi, context, callback, false))
}

#[no_mangle]
pub unsafe extern "C" fn VipRecvNotify(vi: VIP_PVOID, context: VIP_PVOID, callback: VIP_VI_CALLBACK) -> VIP_RETURN {
    call(|| notify(vi, context, callback, true))
}
