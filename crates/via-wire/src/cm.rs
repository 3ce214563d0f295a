//! Connection-management (CM) messages between host agents.
//!
//! Host agents talk on UDP port [`CM_PORT`], from that port to that port:
//! an agent takes CM messages only from the CM port of the other host.
//! Each message has its own 10-byte framing:
//!
//! ```text
//! off size field
//! 0   2   magic 0x5643 ("VC")
//! 2   1   version = 1
//! 3   1   kind (Request=1, Accept=2, Reject=3, NoMatch=4, Ack=5, KeepAlive=6, KeepAliveReply=7,
//!             Withdraw=8, Taken=9)
//! 4   2   length of the body that follows
//! 6   4   CRC-32C over the whole message with this field taken as zero
//! 10  ..  body
//! ```
//!
//! Body fields are big-endian; byte strings and addresses are prefixed by a
//! one-byte length.  Decoding checks every length against the bytes present
//! and the limits ([`MAX_DISCRIMINATOR`], [`MAX_HOST_ADDR`]) and never panics.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::{crc32c, WireError};

/// The UDP port host agents listen on, and send their CM messages from.
///
/// It is a privileged port (below 1024, where `ip_unprivileged_port_start`
/// is the default 1024): only root or a process with
/// `CAP_NET_BIND_SERVICE` can bind it, so no other local user can take it
/// before the agent, and a CM message whose source port is this one proves
/// that a privileged process of its host sent it.  60 is unassigned in the
/// IANA registry and in the `/etc/services` of common distributions, and it
/// lies below 512, outside the ranges from which `bindresvport(3)`,
/// `rresvport(3)` (512-1023) and the kernel's RPC client (665-1023) hand
/// reserved ports to their clients, which could otherwise hold it when the
/// agent starts.  Another port (`VIA_CM_PORT`, `viad --cm-port`) must be the
/// same on every host; an unprivileged one gives that protection up.
pub const CM_PORT: u16 = 60;
/// The first two bytes of every CM message ("VC").
pub const CM_MAGIC: u16 = 0x5643;
/// The CM framing version.
pub const CM_VERSION: u8 = 1;
/// Length of the CM framing header.
pub const CM_HEADER_LEN: usize = 10;
/// Longest discriminator a request may carry.
pub const MAX_DISCRIMINATOR: usize = 64;
/// Longest VIA host address a request may carry.
pub const MAX_HOST_ADDR: usize = 16;

const KIND_REQUEST: u8 = 1;
const KIND_ACCEPT: u8 = 2;
const KIND_REJECT: u8 = 3;
const KIND_NO_MATCH: u8 = 4;
const KIND_ACK: u8 = 5;
const KIND_KEEPALIVE: u8 = 6;
const KIND_KEEPALIVE_REPLY: u8 = 7;
const KIND_WITHDRAW: u8 = 8;
const KIND_TAKEN: u8 = 9;

const EP_RDMA_WRITE: u8 = 1;
const EP_RDMA_READ: u8 = 2;
const EP_PAYLOAD_CRC: u8 = 4;
const EP_ETHERNET: u8 = 8;
const EP_LARGE_PACKETS: u8 = 16;
const EP_PLACED_ACKS: u8 = 32;
const REQ_PEER: u8 = 1;

/// One end of a connection as the CM exchange describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmEndpoint {
    /// The process's data socket (IPv4 or IPv6).  Only the IP and port
    /// travel: an IPv6 flow label and scope id do not.
    pub addr: SocketAddr,
    /// The VI id packets for this end carry in `dst_vi`.
    pub vi: u32,
    /// The key packets for this end must carry.
    pub key: u64,
    /// The VI's reliability level (VIA's `VIP_RELIABILITY_LEVEL` bits).
    pub reliability: u16,
    /// The VI's maximum transfer size in bytes.
    pub max_transfer: u32,
    /// Whether RDMA writes into this end are enabled.
    pub rdma_write: bool,
    /// Whether RDMA reads from this end are enabled.
    pub rdma_read: bool,
    /// Payload bytes per packet this end sends and accepts.
    pub segment: u32,
    /// Whether this end wants the CRC-32C over payloads: a connection
    /// checksums its payloads unless both ends decline.
    pub payload_crc: bool,
    /// The Ethernet address where this end also takes its packets as
    /// Ethernet frames (`crate::frame`), if it does.
    pub ether: Option<[u8; crate::frame::MAC_LEN]>,
    /// Whether this end takes packets longer than one datagram: sent as one
    /// segmentation-offload buffer, whose datagrams after the first carry
    /// no header, and put together again by its receive coalescing.
    pub large_packets: bool,
    /// Whether this end, as the target of an RDMA write on a reliable
    /// connection, checks and places each packet before any packet of its
    /// acknowledges it, and refuses a write with a BREAK that does not:
    /// where both ends say so, the acknowledgement of a write's last packet
    /// completes it at the initiator, and the target sends no answer.
    pub placed_acks: bool,
}

/// A CM message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmMessage {
    /// A connection request (client-server or peer-to-peer).
    Request {
        /// Chosen by the requester; answers and their ACK carry it.
        id: u64,
        /// VIA host address of the requester.
        from_host: Vec<u8>,
        /// The requester's discriminator.
        from_disc: Vec<u8>,
        /// VIA host address the request is for.
        to_host: Vec<u8>,
        /// The discriminator the request is for.
        to_disc: Vec<u8>,
        /// Peer-to-peer model (`VipConnectPeerRequest`).
        peer: bool,
        /// The requesting VI.
        endpoint: CmEndpoint,
    },
    /// The request was accepted by the VI in `endpoint`.
    Accept {
        /// The request's id.
        id: u64,
        /// The accepting VI.
        endpoint: CmEndpoint,
    },
    /// The request was rejected.
    Reject {
        /// The request's id.
        id: u64,
    },
    /// Nobody waits on the requested discriminator.
    NoMatch {
        /// The request's id.
        id: u64,
    },
    /// Stops retransmission of Accept, Reject or NoMatch.
    Ack {
        /// The request's id.
        id: u64,
    },
    /// Liveness probe between host agents.
    KeepAlive {
        /// Echoed in the reply.
        nonce: u64,
    },
    /// Answer to a KeepAlive.
    KeepAliveReply {
        /// The probe's nonce.
        nonce: u64,
    },
    /// The requester no longer waits for its request: the holder drops it
    /// before any listener takes it.  Answered with `Ack`.
    Withdraw {
        /// The request's id.
        id: u64,
    },
    /// A listener has the request and is about to answer: the requester
    /// waits for that answer a while past its own timeout.
    Taken {
        /// The request's id.
        id: u64,
    },
}

impl CmMessage {
    fn kind(&self) -> u8 {
        match self {
            CmMessage::Request { .. } => KIND_REQUEST,
            CmMessage::Accept { .. } => KIND_ACCEPT,
            CmMessage::Reject { .. } => KIND_REJECT,
            CmMessage::NoMatch { .. } => KIND_NO_MATCH,
            CmMessage::Ack { .. } => KIND_ACK,
            CmMessage::KeepAlive { .. } => KIND_KEEPALIVE,
            CmMessage::KeepAliveReply { .. } => KIND_KEEPALIVE_REPLY,
            CmMessage::Withdraw { .. } => KIND_WITHDRAW,
            CmMessage::Taken { .. } => KIND_TAKEN,
        }
    }

    /// Encodes the message with its framing.
    ///
    /// # Panics
    /// If a discriminator or host address is over its limit; see
    /// [`CmMessage::try_encode`].
    pub fn encode(&self) -> Vec<u8> {
        self.try_encode().expect("CM message field over its limit")
    }

    /// Encodes the message, or `BadLength` if a discriminator is longer than
    /// [`MAX_DISCRIMINATOR`] or a host address longer than [`MAX_HOST_ADDR`].
    pub fn try_encode(&self) -> Result<Vec<u8>, WireError> {
        let mut b = vec![0u8; CM_HEADER_LEN];
        match self {
            CmMessage::Request { id, from_host, from_disc, to_host, to_disc, peer, endpoint } => {
                b.extend_from_slice(&id.to_be_bytes());
                put_bytes(&mut b, from_host, MAX_HOST_ADDR)?;
                put_bytes(&mut b, from_disc, MAX_DISCRIMINATOR)?;
                put_bytes(&mut b, to_host, MAX_HOST_ADDR)?;
                put_bytes(&mut b, to_disc, MAX_DISCRIMINATOR)?;
                b.push(if *peer { REQ_PEER } else { 0 });
                put_endpoint(&mut b, endpoint);
            }
            CmMessage::Accept { id, endpoint } => {
                b.extend_from_slice(&id.to_be_bytes());
                put_endpoint(&mut b, endpoint);
            }
            CmMessage::Reject { id }
            | CmMessage::NoMatch { id }
            | CmMessage::Ack { id }
            | CmMessage::Withdraw { id }
            | CmMessage::Taken { id } => b.extend_from_slice(&id.to_be_bytes()),
            CmMessage::KeepAlive { nonce } | CmMessage::KeepAliveReply { nonce } => {
                b.extend_from_slice(&nonce.to_be_bytes())
            }
        }
        // The largest body (a request) is well under 64 KiB.
        let body = (b.len() - CM_HEADER_LEN) as u16;
        b[0..2].copy_from_slice(&CM_MAGIC.to_be_bytes());
        b[2] = CM_VERSION;
        b[3] = self.kind();
        b[4..6].copy_from_slice(&body.to_be_bytes());
        let c = crc32c::crc32c(&b);
        b[6..10].copy_from_slice(&c.to_be_bytes());
        Ok(b)
    }

    /// Decodes one CM message occupying all of `buf`.
    pub fn decode(buf: &[u8]) -> Result<CmMessage, WireError> {
        if buf.len() < CM_HEADER_LEN {
            return Err(WireError::Truncated);
        }
        if u16::from_be_bytes([buf[0], buf[1]]) != CM_MAGIC {
            return Err(WireError::BadMagic);
        }
        if buf[2] != CM_VERSION {
            return Err(WireError::BadVersion(buf[2]));
        }
        let kind = buf[3];
        if !(KIND_REQUEST..=KIND_TAKEN).contains(&kind) {
            return Err(WireError::UnknownKind(kind));
        }
        let body = u16::from_be_bytes([buf[4], buf[5]]) as usize;
        if CM_HEADER_LEN + body > buf.len() {
            return Err(WireError::Truncated);
        }
        if CM_HEADER_LEN + body != buf.len() {
            return Err(WireError::BadLength);
        }
        let sum = u32::from_be_bytes([buf[6], buf[7], buf[8], buf[9]]);
        let c = crc32c::crc32c(&buf[..6]);
        let c = crc32c::crc32c_append(c, &[0; 4]);
        if crc32c::crc32c_append(c, &buf[CM_HEADER_LEN..]) != sum {
            return Err(WireError::BadChecksum);
        }
        let mut r = Reader { buf: &buf[CM_HEADER_LEN..] };
        let msg = match kind {
            KIND_REQUEST => {
                let id = r.u64()?;
                let from_host = r.bytes(MAX_HOST_ADDR)?;
                let from_disc = r.bytes(MAX_DISCRIMINATOR)?;
                let to_host = r.bytes(MAX_HOST_ADDR)?;
                let to_disc = r.bytes(MAX_DISCRIMINATOR)?;
                let flags = r.u8()?;
                if flags & !REQ_PEER != 0 {
                    return Err(WireError::ReservedFlags);
                }
                CmMessage::Request {
                    id,
                    from_host,
                    from_disc,
                    to_host,
                    to_disc,
                    peer: flags & REQ_PEER != 0,
                    endpoint: r.endpoint()?,
                }
            }
            KIND_ACCEPT => CmMessage::Accept { id: r.u64()?, endpoint: r.endpoint()? },
            KIND_REJECT => CmMessage::Reject { id: r.u64()? },
            KIND_NO_MATCH => CmMessage::NoMatch { id: r.u64()? },
            KIND_ACK => CmMessage::Ack { id: r.u64()? },
            KIND_KEEPALIVE => CmMessage::KeepAlive { nonce: r.u64()? },
            KIND_KEEPALIVE_REPLY => CmMessage::KeepAliveReply { nonce: r.u64()? },
            KIND_WITHDRAW => CmMessage::Withdraw { id: r.u64()? },
            _ => CmMessage::Taken { id: r.u64()? },
        };
        if !r.buf.is_empty() {
            // Trailing bytes the body length covered but no field used.
            return Err(WireError::BadLength);
        }
        Ok(msg)
    }
}

fn put_bytes(b: &mut Vec<u8>, v: &[u8], max: usize) -> Result<(), WireError> {
    if v.len() > max {
        return Err(WireError::BadLength);
    }
    b.push(v.len() as u8);
    b.extend_from_slice(v);
    Ok(())
}

fn put_endpoint(b: &mut Vec<u8>, e: &CmEndpoint) {
    match e.addr.ip() {
        IpAddr::V4(ip) => {
            b.push(4);
            b.extend_from_slice(&ip.octets());
        }
        IpAddr::V6(ip) => {
            b.push(16);
            b.extend_from_slice(&ip.octets());
        }
    }
    b.extend_from_slice(&e.addr.port().to_be_bytes());
    b.extend_from_slice(&e.vi.to_be_bytes());
    b.extend_from_slice(&e.key.to_be_bytes());
    b.extend_from_slice(&e.reliability.to_be_bytes());
    b.extend_from_slice(&e.max_transfer.to_be_bytes());
    let mut flags = 0;
    if e.rdma_write {
        flags |= EP_RDMA_WRITE;
    }
    if e.rdma_read {
        flags |= EP_RDMA_READ;
    }
    if e.payload_crc {
        flags |= EP_PAYLOAD_CRC;
    }
    if e.ether.is_some() {
        flags |= EP_ETHERNET;
    }
    if e.large_packets {
        flags |= EP_LARGE_PACKETS;
    }
    if e.placed_acks {
        flags |= EP_PLACED_ACKS;
    }
    b.push(flags);
    b.extend_from_slice(&e.segment.to_be_bytes());
    if let Some(mac) = e.ether {
        b.extend_from_slice(&mac);
    }
}

/// A cursor over a CM body that fails with `Truncated` instead of panicking.
struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.buf.len() < n {
            return Err(WireError::Truncated);
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_be_bytes(self.take(2)?.try_into().expect("2")))
    }
    fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_be_bytes(self.take(4)?.try_into().expect("4")))
    }
    fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_be_bytes(self.take(8)?.try_into().expect("8")))
    }
    fn bytes(&mut self, max: usize) -> Result<Vec<u8>, WireError> {
        let n = self.u8()? as usize;
        if n > max {
            return Err(WireError::BadLength);
        }
        Ok(self.take(n)?.to_vec())
    }
    fn endpoint(&mut self) -> Result<CmEndpoint, WireError> {
        let ip = match self.u8()? {
            4 => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(self.take(4)?).expect("4"))),
            16 => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(self.take(16)?).expect("16"))),
            _ => return Err(WireError::BadLength),
        };
        let port = self.u16()?;
        let vi = self.u32()?;
        let key = self.u64()?;
        let reliability = self.u16()?;
        let max_transfer = self.u32()?;
        let flags = self.u8()?;
        let known = EP_RDMA_WRITE | EP_RDMA_READ | EP_PAYLOAD_CRC | EP_ETHERNET | EP_LARGE_PACKETS | EP_PLACED_ACKS;
        if flags & !known != 0 {
            return Err(WireError::ReservedFlags);
        }
        let segment = self.u32()?;
        let ether = match flags & EP_ETHERNET {
            0 => None,
            _ => Some(<[u8; crate::frame::MAC_LEN]>::try_from(self.take(crate::frame::MAC_LEN)?).expect("6")),
        };
        Ok(CmEndpoint {
            addr: SocketAddr::new(ip, port),
            vi,
            key,
            reliability,
            max_transfer,
            rdma_write: flags & EP_RDMA_WRITE != 0,
            rdma_read: flags & EP_RDMA_READ != 0,
            segment,
            payload_crc: flags & EP_PAYLOAD_CRC != 0,
            ether,
            large_packets: flags & EP_LARGE_PACKETS != 0,
            placed_acks: flags & EP_PLACED_ACKS != 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(v6: bool) -> CmEndpoint {
        CmEndpoint {
            addr: if v6 { "[fd00::1:2]:40000".parse().unwrap() } else { "10.1.2.3:40001".parse().unwrap() },
            vi: 7,
            key: 0x0123_4567_89ab_cdef,
            reliability: 2,
            max_transfer: 4 << 20,
            rdma_write: true,
            rdma_read: v6,
            segment: 1400,
            payload_crc: !v6,
            ether: (!v6).then_some([0x02, 0, 0x5e, 1, 2, 3]),
            large_packets: v6,
            placed_acks: !v6,
        }
    }

    fn samples() -> Vec<CmMessage> {
        vec![
            CmMessage::Request {
                id: 1,
                from_host: vec![10, 0, 0, 1],
                from_disc: b"client".to_vec(),
                to_host: vec![10, 0, 0, 2],
                to_disc: vec![0xAB; MAX_DISCRIMINATOR],
                peer: false,
                endpoint: endpoint(false),
            },
            CmMessage::Request {
                id: u64::MAX,
                from_host: vec![0xfd; MAX_HOST_ADDR],
                from_disc: vec![],
                to_host: vec![],
                to_disc: b"x".to_vec(),
                peer: true,
                endpoint: endpoint(true),
            },
            CmMessage::Accept { id: 9, endpoint: endpoint(true) },
            CmMessage::Accept { id: 10, endpoint: endpoint(false) },
            CmMessage::Reject { id: 2 },
            CmMessage::NoMatch { id: 3 },
            CmMessage::Ack { id: 4 },
            CmMessage::KeepAlive { nonce: 5 },
            CmMessage::KeepAliveReply { nonce: 6 },
            CmMessage::Withdraw { id: 7 },
            CmMessage::Taken { id: 8 },
        ]
    }

    #[test]
    fn round_trip() {
        for m in samples() {
            let b = m.encode();
            assert_eq!(CmMessage::decode(&b).unwrap(), m);
        }
    }

    #[test]
    fn truncation_at_every_length_fails() {
        for m in samples() {
            let b = m.encode();
            for n in 0..b.len() {
                assert!(CmMessage::decode(&b[..n]).is_err(), "{m:?} cut at {n}");
            }
            let mut longer = b.clone();
            longer.push(0);
            assert!(CmMessage::decode(&longer).is_err());
        }
    }

    #[test]
    fn every_flipped_byte_is_caught() {
        for m in samples() {
            let b = m.encode();
            for i in 0..b.len() {
                for x in [0x01u8, 0x80, 0xff] {
                    let mut c = b.clone();
                    c[i] ^= x;
                    assert!(CmMessage::decode(&c).is_err(), "{m:?} byte {i} ^ {x:#x}");
                }
            }
        }
    }

    #[test]
    fn oversized_fields_are_refused() {
        let long_disc = CmMessage::Request {
            id: 1,
            from_host: vec![1; 4],
            from_disc: vec![0; MAX_DISCRIMINATOR + 1],
            to_host: vec![1; 4],
            to_disc: vec![],
            peer: false,
            endpoint: endpoint(false),
        };
        assert_eq!(long_disc.try_encode(), Err(WireError::BadLength));
        let long_host = CmMessage::Request {
            id: 1,
            from_host: vec![1; MAX_HOST_ADDR + 1],
            from_disc: vec![],
            to_host: vec![1; 4],
            to_disc: vec![],
            peer: false,
            endpoint: endpoint(false),
        };
        assert_eq!(long_host.try_encode(), Err(WireError::BadLength));

        // Hand-build a message whose discriminator length byte says 65, with
        // the bytes present and a valid checksum: the limit must still hold.
        let mut body = Vec::new();
        body.extend_from_slice(&1u64.to_be_bytes());
        body.push(0);
        body.push(65);
        body.extend_from_slice(&[7u8; 65]);
        let buf = frame(KIND_REQUEST, &body);
        assert_eq!(CmMessage::decode(&buf), Err(WireError::BadLength));

        // An address length that is neither 4 nor 16.
        let mut body = Vec::new();
        body.extend_from_slice(&1u64.to_be_bytes());
        body.push(8);
        body.extend_from_slice(&[0u8; 40]);
        assert_eq!(CmMessage::decode(&frame(KIND_ACCEPT, &body)), Err(WireError::BadLength));

        // A body length beyond the buffer.
        let mut b = CmMessage::Ack { id: 1 }.encode();
        b[4..6].copy_from_slice(&u16::MAX.to_be_bytes());
        assert_eq!(CmMessage::decode(&b), Err(WireError::Truncated));
    }

    #[test]
    fn header_checks() {
        let b = CmMessage::KeepAlive { nonce: 1 }.encode();
        let mut c = b.clone();
        c[0] = 0;
        assert_eq!(CmMessage::decode(&c), Err(WireError::BadMagic));
        let mut c = b.clone();
        c[2] = 2;
        assert_eq!(CmMessage::decode(&c), Err(WireError::BadVersion(2)));
        let mut c = b.clone();
        c[3] = 99;
        assert_eq!(CmMessage::decode(&c), Err(WireError::UnknownKind(99)));
        let mut c = b;
        c[12] ^= 1;
        assert_eq!(CmMessage::decode(&c), Err(WireError::BadChecksum));
    }

    #[test]
    fn reserved_bits_are_refused() {
        let mut body = Vec::new();
        body.extend_from_slice(&1u64.to_be_bytes());
        body.extend_from_slice(&[0; 4]);
        body.push(0x80);
        assert_eq!(CmMessage::decode(&frame(KIND_REQUEST, &body)), Err(WireError::ReservedFlags));
    }

    fn frame(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; CM_HEADER_LEN];
        b[0..2].copy_from_slice(&CM_MAGIC.to_be_bytes());
        b[2] = CM_VERSION;
        b[3] = kind;
        b[4..6].copy_from_slice(&(body.len() as u16).to_be_bytes());
        b.extend_from_slice(body);
        let c = crc32c::crc32c(&b);
        b[6..10].copy_from_slice(&c.to_be_bytes());
        b
    }
}
