//! Completion queues.

use crate::types::*;
use crate::{call, h, need, p, put};
use libc::c_ulong;
use std::sync::atomic::Ordering;
use via_core::ViaError;
use via_provider::{Cq, Nic};

#[no_mangle]
pub unsafe extern "C" fn VipCreateCQ(nic: VIP_PVOID, entries: c_ulong, out: *mut VIP_PVOID) -> VIP_RETURN {
    call(|| {
        let nic = Nic::get(h(nic))?;
        need(out)?;
        put(out, p(Cq::create(&nic, entries as usize)?))
    })
}

#[no_mangle]
pub unsafe extern "C" fn VipDestroyCQ(cq: VIP_PVOID) -> VIP_RETURN {
    call(|| Cq::destroy(h(cq)))
}

#[no_mangle]
pub unsafe extern "C" fn VipResizeCQ(cq: VIP_PVOID, entries: c_ulong) -> VIP_RETURN {
    call(|| Cq::get(h(cq))?.resize(entries as usize))
}

#[no_mangle]
pub unsafe extern "C" fn VipCQDone(cq: VIP_PVOID, vi: *mut VIP_PVOID, recv: *mut VIP_BOOLEAN) -> VIP_RETURN {
    call(|| {
        need(vi)?;
        need(recv)?;
        let e = Cq::with(h(cq), |cq| cq.done())?;
        put(vi, p(e.vi))?;
        put(recv, e.recv as VIP_BOOLEAN)
    })
}

#[no_mangle]
pub unsafe extern "C" fn VipCQWait(
    cq: VIP_PVOID,
    timeout: c_ulong,
    vi: *mut VIP_PVOID,
    recv: *mut VIP_BOOLEAN,
) -> VIP_RETURN {
    call(|| {
        need(vi)?;
        need(recv)?;
        let e = Cq::with(h(cq), |cq| cq.wait(timeout as u64))?;
        put(vi, p(e.vi))?;
        put(recv, e.recv as VIP_BOOLEAN)
    })
}

#[no_mangle]
pub unsafe extern "C" fn VipCQNotify(cq: VIP_PVOID, context: VIP_PVOID, callback: VIP_CQ_CALLBACK) -> VIP_RETURN {
    call(|| {
        let cq = Cq::get(h(cq))?;
        let callback = callback.ok_or(ViaError::InvalidParameter)?;
        let context = context as usize;
        std::thread::Builder::new()
            .name("via-cq-notify".into())
            .spawn(move || loop {
                match cq.wait(100) {
                    // SAFETY: the application's callback, as vipl.h declares it.
                    Ok(e) => unsafe {
                        callback(context as VIP_PVOID, p(cq.nic.handle), p(e.vi), e.recv as VIP_BOOLEAN);
                        return;
                    },
                    Err(ViaError::Timeout) if !cq.destroyed.load(Ordering::Acquire) => continue,
                    Err(_) => return,
                }
            })
            .map_err(|_| ViaError::Resource)?;
        Ok(())
    })
}
