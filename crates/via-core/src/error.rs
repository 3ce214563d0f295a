//! The error type of the provider: one variant per `VIP_RETURN` failure code.

/// A failed VIPL operation. The C layer maps each variant to its `VIP_RETURN`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ViaError {
    /// Nothing completed yet (`VIP_NOT_DONE`).
    #[error("not done")]
    NotDone,
    /// A handle, pointer or value was invalid (`VIP_INVALID_PARAMETER`).
    #[error("invalid parameter")]
    InvalidParameter,
    /// Out of a resource (`VIP_ERROR_RESOURCE`).
    #[error("out of resources")]
    Resource,
    /// The timeout passed (`VIP_TIMEOUT`).
    #[error("timed out")]
    Timeout,
    /// The peer rejected the connection (`VIP_REJECT`).
    #[error("connection rejected")]
    Reject,
    /// Reliability levels conflict or are unsupported (`VIP_INVALID_RELIABILITY_LEVEL`).
    #[error("invalid reliability level")]
    InvalidReliabilityLevel,
    /// Transfer sizes conflict or are out of range (`VIP_INVALID_MTU`).
    #[error("invalid maximum transfer size")]
    InvalidMtu,
    /// Unsupported quality of service (`VIP_INVALID_QOS`).
    #[error("invalid quality of service")]
    InvalidQos,
    /// Protection tags mismatch or the tag is unknown (`VIP_INVALID_PTAG`).
    #[error("invalid protection tag")]
    InvalidPtag,
    /// RDMA read requested where it is not supported (`VIP_INVALID_RDMAREAD`).
    #[error("RDMA read not supported")]
    InvalidRdmaRead,
    /// The descriptor itself is unusable (`VIP_DESCRIPTOR_ERROR`).
    #[error("descriptor error")]
    Descriptor,
    /// The object is in the wrong state (`VIP_INVALID_STATE`).
    #[error("invalid state")]
    InvalidState,
    /// The name service failed (`VIP_ERROR_NAMESERVICE`).
    #[error("name service error")]
    NameService,
    /// Nobody waited for the connection (`VIP_NO_MATCH`).
    #[error("no matching connection request")]
    NoMatch,
    /// The remote host cannot be reached (`VIP_NOT_REACHABLE`).
    #[error("not reachable")]
    NotReachable,
    /// Not supported by this provider (`VIP_ERROR_NOT_SUPPORTED`).
    #[error("not supported")]
    NotSupported,
}

/// Result of provider operations.
pub type ViaResult<T> = Result<T, ViaError>;
