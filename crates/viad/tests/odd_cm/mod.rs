//! CM datagrams for the agent tests: garbage, messages with one byte
//! changed, and well-formed messages with odd contents.

use via_wire::cm::{CmEndpoint, CmMessage};

/// `count` datagrams from a small deterministic generator (reproducible),
/// and how many of them do not decode.
pub fn datagrams(count: u64) -> (Vec<Vec<u8>>, u64) {
    let ep = CmEndpoint {
        addr: "[::1]:9".parse().unwrap(),
        vi: 1,
        key: 2,
        reliability: 0,
        max_transfer: 4096,
        rdma_write: true,
        rdma_read: true,
        segment: 1400,
        payload_crc: true,
        ether: None,
        large_packets: false,
        placed_acks: false,
    };
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut out = Vec::new();
    let mut malformed = 0;
    for round in 0..count {
        let r = next();
        let bytes: Vec<u8> = match round % 3 {
            // Raw garbage, and valid messages with one byte changed.
            0 => (0..r % 80).map(|_| next() as u8).collect(),
            1 => {
                let mut b = CmMessage::Ack { id: r }.encode();
                let at = (next() as usize) % b.len();
                b[at] ^= 1 + (next() as u8 % 255);
                b
            }
            // Well-formed messages with odd contents: hosts of every length,
            // this host or not, unknown ids, either model.
            _ => {
                let host = |n: u64| -> Vec<u8> {
                    match n % 4 {
                        0 => vec![127, 0, 0, 1],
                        1 => std::net::Ipv6Addr::LOCALHOST.octets().to_vec(),
                        _ => (0..n % 17).map(|i| i as u8).collect(),
                    }
                };
                let msg = match r % 6 {
                    0 | 1 => CmMessage::Request {
                        id: next() % 8,
                        from_host: host(next()),
                        from_disc: vec![1; (next() % 65) as usize],
                        to_host: host(next()),
                        to_disc: vec![2; (next() % 65) as usize],
                        peer: next() % 2 == 0,
                        endpoint: ep.clone(),
                    },
                    2 => CmMessage::Accept { id: next() % 8, endpoint: ep.clone() },
                    3 => CmMessage::Reject { id: next() % 8 },
                    4 => CmMessage::NoMatch { id: next() % 8 },
                    _ => CmMessage::Ack { id: next() % 8 },
                };
                msg.encode()
            }
        };
        if CmMessage::decode(&bytes).is_err() {
            malformed += 1;
        }
        out.push(bytes);
    }
    (out, malformed)
}
