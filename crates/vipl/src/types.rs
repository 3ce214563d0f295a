//! The C structures of `vipl.h`, laid out as the header lays them out.

#![allow(non_camel_case_types, non_snake_case)]

use libc::{c_char, c_int, c_ulong, c_void};

/// `VIP_RETURN`.
pub type VIP_RETURN = c_int;
/// `VIP_BOOLEAN`.
pub type VIP_BOOLEAN = c_int;
/// `VIP_ULONG`.
pub type VIP_ULONG = c_ulong;
/// `VIP_PVOID` and every pointer handle.
pub type VIP_PVOID = *mut c_void;
/// `VIP_MEM_HANDLE`.
pub type VIP_MEM_HANDLE = u32;

/// `VIP_NET_ADDRESS`: lengths, then host address bytes and discriminator bytes.
#[repr(C)]
pub struct VIP_NET_ADDRESS {
    pub HostAddressLen: u16,
    pub DiscriminatorLen: u16,
    pub HostAddress: [u8; 1],
}

/// `VIP_NIC_ATTRIBUTES`.
#[repr(C)]
pub struct VIP_NIC_ATTRIBUTES {
    pub Name: [c_char; 64],
    pub HardwareVersion: c_ulong,
    pub ProviderVersion: c_ulong,
    pub NicAddressLen: u16,
    pub LocalNicAddress: *const u8,
    pub ThreadSafe: VIP_BOOLEAN,
    pub MaxDiscriminatorLen: u16,
    pub MaxRegisterBytes: c_ulong,
    pub MaxRegisterRegions: c_ulong,
    pub MaxRegisterBlockBytes: c_ulong,
    pub MaxVI: c_ulong,
    pub MaxDescriptorsPerQueue: c_ulong,
    pub MaxSegmentsPerDesc: c_ulong,
    pub MaxCQ: c_ulong,
    pub MaxCQEntries: c_ulong,
    pub MaxTransferSize: c_ulong,
    pub NativeMTU: c_ulong,
    pub MaxPtags: c_ulong,
    pub ReliabilityLevelSupport: u16,
    pub RDMAReadSupport: u16,
}

/// `VIP_VI_ATTRIBUTES`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct VIP_VI_ATTRIBUTES {
    pub ReliabilityLevel: u16,
    pub MaxTransferSize: c_ulong,
    pub QoS: VIP_PVOID,
    pub Ptag: VIP_PVOID,
    pub EnableRdmaWrite: VIP_BOOLEAN,
    pub EnableRdmaRead: VIP_BOOLEAN,
}

/// `VIP_MEM_ATTRIBUTES`.
#[repr(C)]
pub struct VIP_MEM_ATTRIBUTES {
    pub Ptag: VIP_PVOID,
    pub EnableRdmaWrite: VIP_BOOLEAN,
    pub EnableRdmaRead: VIP_BOOLEAN,
}

/// `VIP_ERROR_DESCRIPTOR`.
#[repr(C)]
pub struct VIP_ERROR_DESCRIPTOR {
    pub NicHandle: VIP_PVOID,
    pub ViHandle: VIP_PVOID,
    pub CQHandle: VIP_PVOID,
    pub DescriptorPtr: VIP_PVOID,
    pub OpCode: c_ulong,
    pub ResourceCode: c_int,
    pub ErrorCode: c_int,
}

/// `VIP_AUTODISCOVERY_LIST`.
#[repr(C)]
pub struct VIP_AUTODISCOVERY_LIST {
    pub NumberOfHops: c_ulong,
    pub ADAddrArray: *mut *mut VIP_NET_ADDRESS,
    pub NumAdAddrs: c_ulong,
}

/// `VIP_ERROR_HANDLER`.
pub type VIP_ERROR_HANDLER = Option<unsafe extern "C" fn(VIP_PVOID, *mut VIP_ERROR_DESCRIPTOR)>;
/// `VIP_VI_CALLBACK`.
pub type VIP_VI_CALLBACK = Option<unsafe extern "C" fn(VIP_PVOID, VIP_PVOID, VIP_PVOID, VIP_PVOID)>;
/// `VIP_CQ_CALLBACK`.
pub type VIP_CQ_CALLBACK = Option<unsafe extern "C" fn(VIP_PVOID, VIP_PVOID, VIP_PVOID, VIP_BOOLEAN)>;

/// `VIP_VI_STATE` values.
pub const VIP_STATE_IDLE: c_int = 0;
/// Connected.
pub const VIP_STATE_CONNECTED: c_int = 1;
/// Connect pending.
pub const VIP_STATE_CONNECT_PENDING: c_int = 2;
/// Error.
pub const VIP_STATE_ERROR: c_int = 3;

/// `VIP_SMI_AUTODISCOVERY`.
pub const VIP_SMI_AUTODISCOVERY: c_ulong = 1;
