//! Values shared with `vipl.h`: control and status bits, reliability levels,
//! and the limits this provider reports in `VIP_NIC_ATTRIBUTES`.

/// Descriptor control field: operation mask and values.
pub const CONTROL_OP_SENDRECV: u16 = 0x0000;
/// RDMA write.
pub const CONTROL_OP_RDMAWRITE: u16 = 0x0001;
/// RDMA read.
pub const CONTROL_OP_RDMAREAD: u16 = 0x0002;
/// Reserved operation (a format error).
pub const CONTROL_OP_RESERVED: u16 = 0x0003;
/// Mask of the operation bits.
pub const CONTROL_OP_MASK: u16 = 0x0003;
/// The descriptor carries immediate data.
pub const CONTROL_IMMEDIATE: u16 = 0x0004;
/// Queue fence: wait for earlier RDMA reads before this descriptor.
pub const CONTROL_QFENCE: u16 = 0x0008;
/// Bits that must be zero.
pub const CONTROL_RESERVED: u16 = 0xFFF0;

/// Status: the descriptor is complete.
pub const STATUS_DONE: u32 = 0x0000_0001;
/// Status: malformed descriptor.
pub const STATUS_FORMAT_ERROR: u32 = 0x0000_0002;
/// Status: a segment is outside registered memory or of another protection tag.
pub const STATUS_PROTECTION_ERROR: u32 = 0x0000_0004;
/// Status: the data did not fit, or exceeded the transfer size.
pub const STATUS_LENGTH_ERROR: u32 = 0x0000_0008;
/// Status: partial packet (unreliable service).
pub const STATUS_PARTIAL_ERROR: u32 = 0x0000_0010;
/// Status: flushed by a disconnect or an error.
pub const STATUS_DESC_FLUSHED_ERROR: u32 = 0x0000_0020;
/// Status: transport error (the connection broke).
pub const STATUS_TRANSPORT_ERROR: u32 = 0x0000_0040;
/// Status: the RDMA target refused access.
pub const STATUS_RDMA_PROT_ERROR: u32 = 0x0000_0080;
/// Status: the remote descriptor had an error (reliable reception).
pub const STATUS_REMOTE_DESC_ERROR: u32 = 0x0000_0100;
/// Mask of all error bits.
pub const STATUS_ERROR_MASK: u32 = 0x0000_01FE;
/// Status operation: send.
pub const STATUS_OP_SEND: u32 = 0x0000_0000;
/// Status operation: receive.
pub const STATUS_OP_RECEIVE: u32 = 0x0001_0000;
/// Status operation: RDMA write (initiator).
pub const STATUS_OP_RDMA_WRITE: u32 = 0x0002_0000;
/// Status operation: RDMA write with immediate data (target receive descriptor).
pub const STATUS_OP_REMOTE_RDMA_WRITE: u32 = 0x0003_0000;
/// Status operation: RDMA read.
pub const STATUS_OP_RDMA_READ: u32 = 0x0004_0000;
/// Status: immediate data is valid.
pub const STATUS_IMMEDIATE: u32 = 0x0008_0000;

/// Reliability level: unreliable delivery.
pub const SERVICE_UNRELIABLE: u16 = 0x01;
/// Reliability level: reliable delivery.
pub const SERVICE_RELIABLE_DELIVERY: u16 = 0x02;
/// Reliability level: reliable reception.
pub const SERVICE_RELIABLE_RECEPTION: u16 = 0x04;

/// Descriptors must be aligned to this many bytes.
pub const DESCRIPTOR_ALIGNMENT: usize = 64;
/// Size of the control segment.
pub const CONTROL_SEGMENT_BYTES: usize = 32;
/// Size of one data or address segment.
pub const DATA_SEGMENT_BYTES: usize = 16;

/// Limits reported by `VipQueryNic`.
pub mod limits {
    /// Descriptors a work queue holds.
    pub const MAX_DESCRIPTORS_PER_QUEUE: usize = 1024;
    /// Segments in one descriptor, address segment included.
    pub const MAX_SEGMENTS_PER_DESC: usize = 32;
    /// Largest message or RDMA transfer.
    pub const MAX_TRANSFER_SIZE: u64 = 4 << 20;
    /// VIs per NIC.
    pub const MAX_VI: usize = 1024;
    /// Completion queues per NIC.
    pub const MAX_CQ: usize = 256;
    /// Entries per completion queue.
    pub const MAX_CQ_ENTRIES: usize = 65536;
    /// Protection tags per NIC.
    pub const MAX_PTAGS: usize = 1024;
    /// Registered regions per NIC.
    pub const MAX_REGISTER_REGIONS: usize = 65535;
    /// Bytes that may be registered in all.
    pub const MAX_REGISTER_BYTES: u64 = 1 << 40;
    /// Discriminator bytes in an address.
    pub const MAX_DISCRIMINATOR_LEN: usize = 64;
}

/// `VIP_ERROR_CODE` values used by the provider.
pub mod error_code {
    /// A descriptor failed at post time.
    pub const POST_DESC: u32 = 0;
    /// The connection was lost.
    pub const CONN_LOST: u32 = 1;
    /// A message arrived with no receive posted.
    pub const RECVQ_EMPTY: u32 = 2;
    /// RDMA write protection error at the target.
    pub const RDMAW_PROT: u32 = 4;
    /// RDMA read protection error at the target.
    pub const RDMAR_PROT: u32 = 7;
    /// Completion queue overflow.
    pub const CATASTROPHIC: u32 = 10;
}

/// `VIP_RESOURCE_CODE` values.
pub mod resource_code {
    /// The VI.
    pub const VI: u32 = 1;
    /// The CQ.
    pub const CQ: u32 = 2;
}
