//! What one side of a connection tells the other, and the messages the two
//! exchange on their socket pair once `viad` has introduced them.
//!
//! Everything here is the peer's claim.  Who the peer is (its pid, for
//! cross-memory attach) is not: the kernel says that
//! ([`crate::peer_channel`]).

/// A connection endpoint as its peer sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Endpoint {
    /// The VI handle, echoed back in CQ inbox entries.
    pub vi: u64,
    /// Inbox index of the VI's receive CQ, or `NO_CQ`.
    pub recv_cq: u32,
    /// Reliability level.
    pub reliability: u16,
    /// Maximum transfer size.
    pub max_transfer: u64,
    /// The VI accepts RDMA writes.
    pub rdma_write: bool,
    /// The VI accepts RDMA reads.
    pub rdma_read: bool,
    /// The VI's protection tag id (compared with region tags on RDMA).
    pub ptag: u32,
}

/// `recv_cq` value of a VI without a receive CQ.
pub const NO_CQ: u32 = u32::MAX;
const ENDPOINT_BYTES: usize = 8 + 4 + 2 + 8 + 1 + 1 + 4;

impl Endpoint {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.vi.to_le_bytes());
        out.extend_from_slice(&self.recv_cq.to_le_bytes());
        out.extend_from_slice(&self.reliability.to_le_bytes());
        out.extend_from_slice(&self.max_transfer.to_le_bytes());
        out.push(self.rdma_write as u8);
        out.push(self.rdma_read as u8);
        out.extend_from_slice(&self.ptag.to_le_bytes());
    }

    fn decode(b: &[u8]) -> Option<Endpoint> {
        if b.len() != ENDPOINT_BYTES {
            return None;
        }
        let mut at = 0;
        let mut take = |n: usize| {
            let s = &b[at..at + n];
            at += n;
            s
        };
        let u32_ = |s: &[u8]| u32::from_le_bytes(s.try_into().unwrap());
        let u64_ = |s: &[u8]| u64::from_le_bytes(s.try_into().unwrap());
        Some(Endpoint {
            vi: u64_(take(8)),
            recv_cq: u32_(take(4)),
            reliability: u16::from_le_bytes(take(2).try_into().unwrap()),
            max_transfer: u64_(take(8)),
            rdma_write: take(1)[0] != 0,
            rdma_read: take(1)[0] != 0,
            ptag: u32_(take(4)),
        })
    }
}

/// Messages on a connection's socket pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerMessage {
    /// "My segment is mapped and my receives are published": who I am.
    Ready(Endpoint),
    /// The server accepted; its endpoint.
    Accept(Endpoint),
    /// The server rejected.
    Reject,
    /// Orderly disconnect.
    Disconnect,
    /// The sender broke the connection; the code is a `VIP_ERROR_CODE` for
    /// the receiver, one of the specification's (checked when decoded).
    Break(u32),
    /// "Push the completions you make for me into this lane": sent with
    /// the lane's fd once the peer's introduction named it (one lane per
    /// peer process, so it is chosen only then).
    Lane,
}

impl PeerMessage {
    /// Bytes of the message.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(1 + ENDPOINT_BYTES);
        match self {
            PeerMessage::Ready(e) => {
                out.push(1);
                e.encode(&mut out)
            }
            PeerMessage::Accept(e) => {
                out.push(2);
                e.encode(&mut out)
            }
            PeerMessage::Reject => out.push(3),
            PeerMessage::Disconnect => out.push(4),
            PeerMessage::Break(code) => {
                out.push(5);
                out.extend_from_slice(&code.to_le_bytes())
            }
            PeerMessage::Lane => out.push(6),
        }
        out
    }

    /// Parses a message from the peer; `None` if malformed.
    pub fn decode(b: &[u8]) -> Option<PeerMessage> {
        let (&tag, rest) = b.split_first()?;
        match tag {
            1 => Endpoint::decode(rest).map(PeerMessage::Ready),
            2 => Endpoint::decode(rest).map(PeerMessage::Accept),
            3 if rest.is_empty() => Some(PeerMessage::Reject),
            4 if rest.is_empty() => Some(PeerMessage::Disconnect),
            5 if rest.len() == 4 => {
                let code = u32::from_le_bytes(rest.try_into().ok()?);
                // The code reaches the application's error callback.
                (code <= via_core::consts::error_code::CATASTROPHIC).then_some(PeerMessage::Break(code))
            }
            6 if rest.is_empty() => Some(PeerMessage::Lane),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_garbage_is_refused() {
        let e = Endpoint {
            vi: 1 << 60,
            recv_cq: 3,
            reliability: 2,
            max_transfer: 77,
            rdma_write: true,
            rdma_read: false,
            ptag: 5,
        };
        for m in [
            PeerMessage::Ready(e),
            PeerMessage::Accept(e),
            PeerMessage::Reject,
            PeerMessage::Disconnect,
            PeerMessage::Break(4),
            PeerMessage::Lane,
        ] {
            assert_eq!(PeerMessage::decode(&m.encode()), Some(m));
        }
        assert_eq!(PeerMessage::decode(&[]), None);
        assert_eq!(PeerMessage::decode(&[1, 2, 3]), None);
        assert_eq!(PeerMessage::decode(&[9]), None);
        // Only the specification's error codes.
        assert_eq!(PeerMessage::decode(&PeerMessage::Break(10).encode()), Some(PeerMessage::Break(10)));
        assert_eq!(PeerMessage::decode(&PeerMessage::Break(11).encode()), None);
        assert_eq!(PeerMessage::decode(&PeerMessage::Break(3_735_928_559).encode()), None);
        let mut long = PeerMessage::Reject.encode();
        long.push(0);
        assert_eq!(PeerMessage::decode(&long), None);
    }
}
