//! The transports under the VIs: shared memory between processes of one
//! host (`shm`), and UDP with its Ethernet side
//! between hosts (`udp`).

pub mod shm;
pub mod udp;

use crate::endpoint::Endpoint;
use std::sync::Arc;

/// A connection being completed: shared memory or network.
pub(crate) enum Linked {
    Shm(Arc<shm::Conn>),
    Net(Arc<udp::NetLink>, Endpoint),
}
