//! Making a connection between hosts: each end's identity on the network
//! (its NIC's port, a fresh key, its endpoint in the wire encoding) travels
//! in the host agents' connection request and answer, and each end makes
//! its link from what the other sent.

use super::{NetLink, NetPort};
use crate::endpoint::Endpoint;
use crate::vi::Vi;
use std::sync::Arc;
use via_core::consts::SERVICE_UNRELIABLE;
use via_core::error::{ViaError, ViaResult};
use via_wire::cm::CmEndpoint;
use viad_client::client;

/// A VI's identity on the network for one connection.
pub(crate) struct Identity {
    port: Arc<NetPort>,
    key: u64,
    /// The encoded endpoint that travels in the request or the answer.
    pub info: Vec<u8>,
}

/// The VI's identity toward `remote_host` (an address of its family):
/// the NIC's port, a fresh key, and its encoded endpoint.  Devices
/// without an IPv4 address have no port: they connect on this host only.
pub(crate) fn identity(vi: &Vi, remote_host: &[u8]) -> ViaResult<Identity> {
    let port = vi.nic.port()?;
    let key = random_key()?;
    let a = vi.attrs();
    let endpoint = CmEndpoint {
        addr: port.local_for(remote_host)?,
        vi: vi.handle as u32,
        key,
        reliability: a.reliability,
        max_transfer: a.max_transfer.min(u32::MAX as u64) as u32,
        rdma_write: a.rdma_write,
        rdma_read: a.rdma_read,
        segment: port.segment as u32,
        payload_crc: vi.nic.tuning.payload_crc,
        ether: port.local_ether(),
        large_packets: port.takes_large_packets(),
        placed_acks: true,
    };
    Ok(Identity { port, key, info: client::encode_endpoint(&endpoint) })
}

impl Identity {
    /// The link of `vi` to the peer whose endpoint is `remote`.
    pub(crate) fn link(&self, vi: &Vi, remote: &CmEndpoint) -> Arc<NetLink> {
        let port = &self.port;
        let a = vi.attrs();
        // Large packets when both ends take them: a window of 16 (1 MiB at
        // MTU 1500) holds about what 256 packets of a datagram each did.
        let large = remote.large_packets && port.takes_large_packets();
        let (max_payload, window) = match large {
            true => (port.large_payload, 16),
            false => (port.segment.min(remote.segment as usize).max(1), via_reliable::Config::default().window),
        };
        let config = via_reliable::Config {
            reliable: a.reliability != SERVICE_UNRELIABLE,
            max_payload,
            window,
            max_message: a.max_transfer.min(u32::MAX as u64) as u32,
            // Either end may insist on the CRC-32C over payloads.
            payload_crc: vi.nic.tuning.payload_crc || remote.payload_crc,
            ..Default::default()
        };
        let local = via_reliable::Peer { vi: vi.handle as u32, key: self.key };
        let peer = via_reliable::Peer { vi: remote.vi, key: remote.key };
        // An RDMA write completes with the acknowledgement of its last packet
        // where the target places before it acknowledges (reliable levels).
        let placed_acks = remote.placed_acks && config.reliable;
        Arc::new(NetLink::new(port.clone(), remote.addr, remote.ether, config, local, peer, placed_acks))
    }
}

/// A remote endpoint as the VI attributes report it.
pub(crate) fn endpoint_of(e: &CmEndpoint) -> Endpoint {
    Endpoint {
        vi: e.vi as u64,
        recv_cq: crate::endpoint::NO_CQ,
        reliability: e.reliability,
        max_transfer: e.max_transfer as u64,
        rdma_write: e.rdma_write,
        rdma_read: e.rdma_read,
        ptag: 0,
    }
}

/// A connection key from the OS random source: a key anyone could guess
/// would let them inject packets, so without one there is no connection.
fn random_key() -> ViaResult<u64> {
    match getrandom::u64() {
        Ok(key) => Ok(key | 1),
        Err(e) => {
            tracing::warn!("no connection key: the OS random source failed: {e}");
            Err(ViaError::Resource)
        }
    }
}
