//! The VIPL C API as viabench calls it.
//!
//! Every function is declared here with its `vipl.h` signature and resolved
//! at link time against the `#[no_mangle] extern "C"` definitions of the
//! `vipl` crate, so the benchmark goes through exactly the C ABI that VIA
//! applications use.  The descriptor layout and the `VIP_*` constants that
//! `vipl::types` does not carry are spelled out after `vipl.h`.

#![allow(non_snake_case)]

use libc::{c_char, c_ulong};
use std::fmt;
pub use vipl::types::{
    VIP_BOOLEAN, VIP_MEM_ATTRIBUTES, VIP_MEM_HANDLE, VIP_NET_ADDRESS, VIP_NIC_ATTRIBUTES, VIP_PVOID, VIP_RETURN,
    VIP_VI_ATTRIBUTES,
};

/// `VIP_SUCCESS`.
pub const VIP_SUCCESS: VIP_RETURN = vipl::VIP_SUCCESS;
/// `VIP_NOT_DONE`.
pub const VIP_NOT_DONE: VIP_RETURN = 1;
/// `VIP_TIMEOUT`.
pub const VIP_TIMEOUT: VIP_RETURN = 4;
/// `VIP_INFINITE`.
pub const VIP_INFINITE: c_ulong = 0xFFFF_FFFF;

/// `VIP_SERVICE_UNRELIABLE`.
pub const VIP_SERVICE_UNRELIABLE: u16 = 0x01;
/// `VIP_SERVICE_RELIABLE_DELIVERY`.
pub const VIP_SERVICE_RELIABLE_DELIVERY: u16 = 0x02;
/// `VIP_SERVICE_RELIABLE_RECEPTION`.
pub const VIP_SERVICE_RELIABLE_RECEPTION: u16 = 0x04;

/// `VIP_CONTROL_OP_SENDRECV`.
pub const VIP_CONTROL_OP_SENDRECV: u16 = 0x0000;
/// `VIP_CONTROL_OP_RDMAWRITE`.
pub const VIP_CONTROL_OP_RDMAWRITE: u16 = 0x0001;
/// `VIP_CONTROL_IMMEDIATE`.
pub const VIP_CONTROL_IMMEDIATE: u16 = 0x0004;

/// `VIP_STATUS_DONE`.
pub const VIP_STATUS_DONE: u32 = 0x0000_0001;
/// `VIP_STATUS_ERROR_MASK`.
pub const VIP_STATUS_ERROR_MASK: u32 = 0x0000_01FE;
/// `VIP_STATUS_IMMEDIATE`.
pub const VIP_STATUS_IMMEDIATE: u32 = 0x0008_0000;
/// `VIP_STATUS_OP_MASK`.
pub const VIP_STATUS_OP_MASK: u32 = 0x0007_0000;
/// `VIP_STATUS_OP_RECEIVE`.
pub const VIP_STATUS_OP_RECEIVE: u32 = 0x0001_0000;
/// `VIP_STATUS_OP_REMOTE_RDMA_WRITE`.
pub const VIP_STATUS_OP_REMOTE_RDMA_WRITE: u32 = 0x0003_0000;

/// `VIP_DESCRIPTOR_ALIGNMENT`.
pub const VIP_DESCRIPTOR_ALIGNMENT: usize = 64;

/// `VIP_CONTROL_SEGMENT`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ControlSegment {
    /// `Next` (unused by openvia).
    pub next: u64,
    /// `NextHandle`.
    pub next_handle: u32,
    /// `SegCount`.
    pub seg_count: u16,
    /// `Control`.
    pub control: u16,
    /// `Reserved`.
    pub reserved: u32,
    /// `ImmediateData`.
    pub immediate: u32,
    /// `Length`.
    pub length: u32,
    /// `Status`, written by the provider last.
    pub status: u32,
}

/// `VIP_DATA_SEGMENT` (also the layout of `VIP_ADDRESS_SEGMENT`, whose
/// last field is reserved).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct DataSegment {
    /// `Data`: a 64-bit address.
    pub data: u64,
    /// `Handle`: the memory handle of the buffer.
    pub handle: u32,
    /// `Length` (`Reserved` in an address segment).
    pub length: u32,
}

/// `VIP_DESCRIPTOR` with its two inline segments: 64 bytes, the alignment
/// VIA requires.
#[repr(C, align(64))]
#[derive(Debug, Clone, Copy, Default)]
pub struct Descriptor {
    /// The control segment.
    pub cs: ControlSegment,
    /// Data segments; for RDMA, `ds[0]` is the remote address segment.
    pub ds: [DataSegment; 2],
}

const _: () = assert!(std::mem::size_of::<Descriptor>() == 64);

impl Descriptor {
    /// Reads `Status` as the provider left it.
    ///
    /// # Safety
    /// `this` must point at a descriptor of the caller's memory.
    pub unsafe fn status(this: *const Descriptor) -> u32 {
        // SAFETY: the caller's promise.
        unsafe { std::ptr::read_volatile(std::ptr::addr_of!((*this).cs.status)) }
    }
    /// Reads `Length`.
    ///
    /// # Safety
    /// As for [`Descriptor::status`].
    pub unsafe fn length(this: *const Descriptor) -> u32 {
        // SAFETY: the caller's promise.
        unsafe { std::ptr::read_volatile(std::ptr::addr_of!((*this).cs.length)) }
    }
    /// Reads `ImmediateData`.
    ///
    /// # Safety
    /// As for [`Descriptor::status`].
    pub unsafe fn immediate(this: *const Descriptor) -> u32 {
        // SAFETY: the caller's promise.
        unsafe { std::ptr::read_volatile(std::ptr::addr_of!((*this).cs.immediate)) }
    }
}

extern "C" {
    /// `VipOpenNic`.
    pub fn VipOpenNic(device: *const c_char, nic: *mut VIP_PVOID) -> VIP_RETURN;
    /// `VipCloseNic`.
    pub fn VipCloseNic(nic: VIP_PVOID) -> VIP_RETURN;
    /// `VipQueryNic`.
    pub fn VipQueryNic(nic: VIP_PVOID, attrs: *mut VIP_NIC_ATTRIBUTES) -> VIP_RETURN;
    /// `VipCreatePtag`.
    pub fn VipCreatePtag(nic: VIP_PVOID, ptag: *mut VIP_PVOID) -> VIP_RETURN;
    /// `VipDestroyPtag`.
    pub fn VipDestroyPtag(nic: VIP_PVOID, ptag: VIP_PVOID) -> VIP_RETURN;
    /// `VipRegisterMem`.
    pub fn VipRegisterMem(
        nic: VIP_PVOID,
        addr: VIP_PVOID,
        len: c_ulong,
        attrs: *const VIP_MEM_ATTRIBUTES,
        mem: *mut VIP_MEM_HANDLE,
    ) -> VIP_RETURN;
    /// `VipDeregisterMem`.
    pub fn VipDeregisterMem(nic: VIP_PVOID, addr: VIP_PVOID, mem: VIP_MEM_HANDLE) -> VIP_RETURN;
    /// `VipCreateVi`.
    pub fn VipCreateVi(
        nic: VIP_PVOID,
        attrs: *const VIP_VI_ATTRIBUTES,
        send_cq: VIP_PVOID,
        recv_cq: VIP_PVOID,
        vi: *mut VIP_PVOID,
    ) -> VIP_RETURN;
    /// `VipDestroyVi`.
    pub fn VipDestroyVi(vi: VIP_PVOID) -> VIP_RETURN;
    /// `VipPostSend`.
    pub fn VipPostSend(vi: VIP_PVOID, desc: *mut Descriptor, mem: VIP_MEM_HANDLE) -> VIP_RETURN;
    /// `VipSendDone`.
    pub fn VipSendDone(vi: VIP_PVOID, desc: *mut *mut Descriptor) -> VIP_RETURN;
    /// `VipSendWait`.
    pub fn VipSendWait(vi: VIP_PVOID, timeout: c_ulong, desc: *mut *mut Descriptor) -> VIP_RETURN;
    /// `VipPostRecv`.
    pub fn VipPostRecv(vi: VIP_PVOID, desc: *mut Descriptor, mem: VIP_MEM_HANDLE) -> VIP_RETURN;
    /// `VipRecvDone`.
    pub fn VipRecvDone(vi: VIP_PVOID, desc: *mut *mut Descriptor) -> VIP_RETURN;
    /// `VipRecvWait`.
    pub fn VipRecvWait(vi: VIP_PVOID, timeout: c_ulong, desc: *mut *mut Descriptor) -> VIP_RETURN;
    /// `VipConnectWait`.
    pub fn VipConnectWait(
        nic: VIP_PVOID,
        local: *const VIP_NET_ADDRESS,
        timeout: c_ulong,
        remote: *mut VIP_NET_ADDRESS,
        remote_attrs: *mut VIP_VI_ATTRIBUTES,
        conn: *mut VIP_PVOID,
    ) -> VIP_RETURN;
    /// `VipConnectAccept`.
    pub fn VipConnectAccept(conn: VIP_PVOID, vi: VIP_PVOID) -> VIP_RETURN;
    /// `VipConnectRequest`.
    pub fn VipConnectRequest(
        vi: VIP_PVOID,
        local: *const VIP_NET_ADDRESS,
        remote: *const VIP_NET_ADDRESS,
        timeout: c_ulong,
        remote_attrs: *mut VIP_VI_ATTRIBUTES,
    ) -> VIP_RETURN;
    /// `VipDisconnect`.
    pub fn VipDisconnect(vi: VIP_PVOID) -> VIP_RETURN;
    /// `VipCreateCQ`.
    pub fn VipCreateCQ(nic: VIP_PVOID, entries: c_ulong, cq: *mut VIP_PVOID) -> VIP_RETURN;
    /// `VipDestroyCQ`.
    pub fn VipDestroyCQ(cq: VIP_PVOID) -> VIP_RETURN;
    /// `VipCQDone`.
    pub fn VipCQDone(cq: VIP_PVOID, vi: *mut VIP_PVOID, recv: *mut VIP_BOOLEAN) -> VIP_RETURN;
    /// `VipCQWait`.
    pub fn VipCQWait(cq: VIP_PVOID, timeout: c_ulong, vi: *mut VIP_PVOID, recv: *mut VIP_BOOLEAN) -> VIP_RETURN;
}

/// Names of the `VIP_RETURN` codes, in the order of the specification.
const RETURN_NAMES: [&str; 17] = [
    "VIP_SUCCESS",
    "VIP_NOT_DONE",
    "VIP_INVALID_PARAMETER",
    "VIP_ERROR_RESOURCE",
    "VIP_TIMEOUT",
    "VIP_REJECT",
    "VIP_INVALID_RELIABILITY_LEVEL",
    "VIP_INVALID_MTU",
    "VIP_INVALID_QOS",
    "VIP_INVALID_PTAG",
    "VIP_INVALID_RDMAREAD",
    "VIP_DESCRIPTOR_ERROR",
    "VIP_INVALID_STATE",
    "VIP_ERROR_NAMESERVICE",
    "VIP_NO_MATCH",
    "VIP_NOT_REACHABLE",
    "VIP_ERROR_NOT_SUPPORTED",
];

/// A VIPL call that did not return `VIP_SUCCESS`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VipError {
    /// The function.
    pub call: &'static str,
    /// Its return code.
    pub code: VIP_RETURN,
}

impl fmt::Display for VipError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = usize::try_from(self.code).ok().and_then(|c| RETURN_NAMES.get(c)).copied().unwrap_or("unknown");
        write!(f, "{} returned {} ({})", self.call, name, self.code)
    }
}

impl std::error::Error for VipError {}

/// Turns a `VIP_RETURN` into a `Result`.
pub fn check(call: &'static str, code: VIP_RETURN) -> Result<(), VipError> {
    if code == VIP_SUCCESS {
        Ok(())
    } else {
        Err(VipError { call, code })
    }
}

/// A `VIP_NET_ADDRESS` with room for its host address and discriminator.
pub struct NetAddress {
    words: Vec<u64>,
}

impl NetAddress {
    /// Bytes available for host address plus discriminator.
    const ROOM: usize = 256;

    /// An address made of `host` and `discriminator`.
    pub fn new(host: &[u8], discriminator: &[u8]) -> NetAddress {
        assert!(host.len() + discriminator.len() <= Self::ROOM);
        let mut a = NetAddress::empty();
        let p = a.as_mut_ptr();
        // SAFETY: the buffer holds the 4-byte header and ROOM bytes after it.
        unsafe {
            (*p).HostAddressLen = host.len() as u16;
            (*p).DiscriminatorLen = discriminator.len() as u16;
            let base = std::ptr::addr_of_mut!((*p).HostAddress) as *mut u8;
            std::ptr::copy_nonoverlapping(host.as_ptr(), base, host.len());
            std::ptr::copy_nonoverlapping(discriminator.as_ptr(), base.add(host.len()), discriminator.len());
        }
        a
    }

    /// An empty address, for the provider to fill in.
    pub fn empty() -> NetAddress {
        NetAddress { words: vec![0u64; (4 + Self::ROOM).div_ceil(8)] }
    }

    /// The C view.
    pub fn as_ptr(&self) -> *const VIP_NET_ADDRESS {
        self.words.as_ptr() as *const VIP_NET_ADDRESS
    }

    /// The C view, writable.
    pub fn as_mut_ptr(&mut self) -> *mut VIP_NET_ADDRESS {
        self.words.as_mut_ptr() as *mut VIP_NET_ADDRESS
    }
}

/// The host address of a NIC (`LocalNicAddress`).  The handle is opaque:
/// VIPL looks it up and refuses bad ones.
#[allow(clippy::not_unsafe_ptr_arg_deref)]
pub fn nic_address(nic: VIP_PVOID) -> Result<Vec<u8>, VipError> {
    // SAFETY: VIP_NIC_ATTRIBUTES is plain data; the provider fills it.
    let mut attrs: VIP_NIC_ATTRIBUTES = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out-pointer.
    check("VipQueryNic", unsafe { VipQueryNic(nic, &mut attrs) })?;
    if attrs.LocalNicAddress.is_null() {
        return Ok(Vec::new());
    }
    // SAFETY: the provider keeps the address alive while the NIC is open.
    Ok(unsafe { std::slice::from_raw_parts(attrs.LocalNicAddress, attrs.NicAddressLen as usize) }.to_vec())
}

/// The `MaxTransferSize` of a NIC.
#[allow(clippy::not_unsafe_ptr_arg_deref)]
pub fn nic_max_transfer(nic: VIP_PVOID) -> Result<usize, VipError> {
    // SAFETY: as in `nic_address`.
    let mut attrs: VIP_NIC_ATTRIBUTES = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out-pointer.
    check("VipQueryNic", unsafe { VipQueryNic(nic, &mut attrs) })?;
    Ok(attrs.MaxTransferSize as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptor_layout_matches_vipl_h() {
        assert_eq!(std::mem::size_of::<ControlSegment>(), 32);
        assert_eq!(std::mem::size_of::<DataSegment>(), 16);
        assert_eq!(std::mem::align_of::<Descriptor>(), VIP_DESCRIPTOR_ALIGNMENT);
        let d = Descriptor::default();
        let base = &d as *const Descriptor as usize;
        assert_eq!(std::ptr::addr_of!(d.cs.seg_count) as usize - base, 12);
        assert_eq!(std::ptr::addr_of!(d.cs.control) as usize - base, 14);
        assert_eq!(std::ptr::addr_of!(d.cs.immediate) as usize - base, 20);
        assert_eq!(std::ptr::addr_of!(d.cs.length) as usize - base, 24);
        assert_eq!(std::ptr::addr_of!(d.cs.status) as usize - base, 28);
        assert_eq!(std::ptr::addr_of!(d.ds[1]) as usize - base, 48);
    }

    #[test]
    fn net_address_holds_host_then_discriminator() {
        let a = NetAddress::new(&[127, 0, 0, 1], b"disc");
        // SAFETY: the address was built above.
        unsafe {
            let p = a.as_ptr();
            assert_eq!((*p).HostAddressLen, 4);
            assert_eq!((*p).DiscriminatorLen, 4);
            let bytes = std::slice::from_raw_parts(std::ptr::addr_of!((*p).HostAddress) as *const u8, 8);
            assert_eq!(bytes, b"\x7f\0\0\x01disc");
        }
    }

    #[test]
    fn errors_name_the_return_code() {
        assert_eq!(check("VipPostSend", 12).unwrap_err().to_string(), "VipPostSend returned VIP_INVALID_STATE (12)");
        assert!(check("VipPostSend", VIP_SUCCESS).is_ok());
    }
}
