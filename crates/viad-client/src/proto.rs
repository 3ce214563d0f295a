//! Wire format of the control protocol between clients and the agent.
//!
//! Every message is one `SOCK_SEQPACKET` datagram: a version byte, a tag byte,
//! then the fields in order.  Integers are little-endian, byte strings carry a
//! 16-bit length.  File descriptors travel beside the message (`SCM_RIGHTS`).

use std::time::Duration;

use thiserror::Error;

/// An answer nobody acknowledges is given up after this long.
pub const ANSWER_GIVE_UP: Duration = Duration::from_secs(5);
/// How long past its deadline a request that a listener took waits for that
/// listener's answer: the listener's agent gives it at most its answer time
/// (5 s), and its answer needs a round trip.
pub const TAKEN_GRACE: Duration = Duration::from_secs(6);

/// Protocol version carried in the first byte of every message.
///
/// Version 2 added cross-host connections: the `remote` flags, `Rejected`,
/// the listener's `Accept`/`Reject` answers and the device's IPv6 address.
pub const VERSION: u8 = 2;
/// Largest message either side sends or accepts.
pub const MAX_MESSAGE: usize = 4096;
/// Largest discriminator (VIA `MaxDiscriminatorLen`).
pub const MAX_DISC: usize = 64;
/// Largest opaque connection info blob forwarded between the two sides.
pub const MAX_INFO: usize = 1024;
/// Largest host address.
pub const MAX_HOST: usize = 16;
/// Largest device name, interface name or counter name.
pub const MAX_TEXT: usize = 256;
/// Largest error text: an unknown device's lists the valid names.
pub const MAX_ERROR_TEXT: usize = 2048;
/// Largest connection segment the agent creates.
pub const MAX_SEGMENT_BYTES: u64 = 256 << 20;
/// Largest number of counters in a stats reply.
pub const MAX_STATS: usize = 64;
/// Bytes of counters a stats reply carries at most, leaving room for framing.
pub const STATS_BUDGET: usize = MAX_MESSAGE - 64;
/// A timeout in milliseconds that never passes.
pub const FOREVER: u64 = u64::MAX;

/// A message that cannot be encoded or decoded.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("malformed message: {0}")]
pub struct ProtoError(pub &'static str);

/// A listen request (`VipConnectWait`).  One fd travels with it: the bell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenReq {
    /// Host address of the listening device.
    pub host: Vec<u8>,
    /// Discriminator to wait for.
    pub disc: Vec<u8>,
    /// Opaque blob handed to the requester.
    pub info: Vec<u8>,
    /// How long the agent keeps the listen, in ms; `FOREVER` for ever.
    pub timeout_ms: u64,
    /// Process id of the caller (for logs).
    pub pid: u32,
}

/// A client-server or peer connection request.  One fd travels with it: the bell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectReq {
    /// Host address of the requesting device.
    pub local_host: Vec<u8>,
    /// Discriminator of the requesting endpoint.
    pub local_disc: Vec<u8>,
    /// Host address asked for.
    pub remote_host: Vec<u8>,
    /// Discriminator asked for.
    pub remote_disc: Vec<u8>,
    /// Opaque blob handed to the other side.
    pub info: Vec<u8>,
    /// How long to wait for a match, in ms; `FOREVER` for ever.
    pub timeout_ms: u64,
    /// Size of the connection segment wanted.
    pub segment_bytes: u64,
    /// Process id of the caller (for logs).
    pub pid: u32,
}

/// A request from a client to the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Opens a session for a device; the connection stays open for the NIC's lifetime.
    Hello {
        /// Device name as given to `VipOpenNic`.
        device: String,
    },
    /// Waits for one connection request.
    Listen(ListenReq),
    /// Asks for a listener (client-server model).
    Connect(ConnectReq),
    /// Asks for the mirror-image peer request (peer-to-peer model).
    PeerConnect(ConnectReq),
    /// Asks for the counters (a reply holds as many as fit).
    Stats {
        /// Index of the first counter wanted.
        start: u32,
    },
    /// Asks the agent to exit.
    Stop,
    /// A listener's answer to a remote `Incoming`: accept with this
    /// endpoint (see [`crate::client::encode_endpoint`]).  Sent on the
    /// connection that carried the `Incoming`; the agent replies `Done` once
    /// the requester's agent has acknowledged, `NoMatch` when the requester
    /// no longer waits, `Unreachable` when it never answered.
    Accept {
        /// The listener's endpoint, encoded.
        info: Vec<u8>,
    },
    /// A listener's answer to a remote `Incoming`: reject.  The agent
    /// replies `Done`.
    Reject,
}

/// Which end of a connection a process got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The requester, or the earlier of two peers.
    A,
    /// The listener, or the later of two peers.
    B,
}

/// Why the agent refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The device name does not resolve to a VI device of this host.
    UnknownDevice,
    /// The request was acceptable on the wire but not otherwise.
    Invalid,
    /// The client's uid may not do this (e.g. stop an agent that is neither
    /// its own nor root's).
    PermissionDenied,
    /// The client's uid holds as many connections to the agent as it may
    /// (see `agent::Config::max_connections_per_uid`); the connection is closed.
    Limit,
    /// A request for another host, and this agent has no CM port (it could
    /// not bind it, or runs without one); the message says why.
    NoCmPort,
}

impl ErrorKind {
    /// The kind's byte on the wire.
    fn code(self) -> u8 {
        match self {
            ErrorKind::UnknownDevice => 1,
            ErrorKind::Invalid => 2,
            ErrorKind::PermissionDenied => 3,
            ErrorKind::Limit => 4,
            ErrorKind::NoCmPort => 5,
        }
    }

    /// The kind of wire byte `code`.
    fn from_code(code: u8) -> Result<ErrorKind, ProtoError> {
        match code {
            1 => Ok(ErrorKind::UnknownDevice),
            2 => Ok(ErrorKind::Invalid),
            3 => Ok(ErrorKind::PermissionDenied),
            4 => Ok(ErrorKind::Limit),
            5 => Ok(ErrorKind::NoCmPort),
            _ => Err(ProtoError("bad error kind")),
        }
    }
}

/// A reply from the agent.  `Incoming`, `Matched` and `PeerMatched` carry three
/// fds: the connection segment, this side's socket-pair end, the peer's bell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// The device a `Hello` resolved to.
    Device {
        /// Canonical device name.
        name: String,
        /// Network interface behind it.
        interface: String,
        /// Host address of the device.
        host_addr: Vec<u8>,
        /// The interface's global IPv6 address (16 bytes), empty if none.
        host_addr6: Vec<u8>,
        /// Interface MTU.
        mtu: u32,
    },
    /// A request matched a listen (sent to the listener).
    Incoming {
        /// Host address of the requester.
        remote_host: Vec<u8>,
        /// Discriminator of the requester.
        remote_disc: Vec<u8>,
        /// The requester's info blob.
        remote_info: Vec<u8>,
        /// The requester is on another host: no fds come with the reply,
        /// and the listener answers with `Accept` or `Reject`.
        remote: bool,
    },
    /// A connect request matched a listener (sent to the requester).
    Matched {
        /// The listener's info blob.
        remote_info: Vec<u8>,
        /// The listener is on another host: no fds come with the reply.
        remote: bool,
    },
    /// A peer request matched its mirror image.
    PeerMatched {
        /// This side.
        side: Side,
        /// The other peer's info blob.
        remote_info: Vec<u8>,
        /// The other peer is on another host: no fds come with the reply.
        remote: bool,
    },
    /// The remote listener rejected the connect request.
    Rejected,
    /// Nothing matched before the timeout.
    NoMatch,
    /// The host address asked for is not this host.
    Unreachable,
    /// Counters, by name.
    Stats {
        /// The counters from the index asked for on.
        counters: Vec<(String, u64)>,
        /// How many counters there are in all.
        total: u32,
    },
    /// The request was carried out.
    Done,
    /// The request was refused.
    Error {
        /// Why.
        kind: ErrorKind,
        /// Human-readable detail.
        message: String,
    },
}

struct Writer {
    buf: Vec<u8>,
    err: Option<ProtoError>,
}

impl Writer {
    fn new(tag: u8) -> Self {
        Writer { buf: vec![VERSION, tag], err: None }
    }
    fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes(&mut self, b: &[u8], max: usize, what: &'static str) {
        if b.len() > max {
            self.err.get_or_insert(ProtoError(what));
            return;
        }
        self.buf.extend_from_slice(&(b.len() as u16).to_le_bytes());
        self.buf.extend_from_slice(b);
    }
    fn finish(self) -> Result<Vec<u8>, ProtoError> {
        match self.err {
            Some(e) => Err(e),
            None if self.buf.len() > MAX_MESSAGE => Err(ProtoError("message too long")),
            None => Ok(self.buf),
        }
    }
}

struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    /// Checks the envelope and returns the reader positioned after the tag.
    fn open(buf: &'a [u8]) -> Result<(Self, u8), ProtoError> {
        if buf.len() > MAX_MESSAGE {
            return Err(ProtoError("message too long"));
        }
        let mut r = Reader { buf };
        if r.u8()? != VERSION {
            return Err(ProtoError("unknown protocol version"));
        }
        let tag = r.u8()?;
        Ok((r, tag))
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], ProtoError> {
        if self.buf.len() < n {
            return Err(ProtoError("truncated"));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, ProtoError> {
        Ok(self.take(1)?[0])
    }
    fn flag(&mut self) -> Result<bool, ProtoError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(ProtoError("bad flag")),
        }
    }
    fn u32(&mut self) -> Result<u32, ProtoError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap_or_default()))
    }
    fn u64(&mut self) -> Result<u64, ProtoError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap_or_default()))
    }
    fn bytes(&mut self, max: usize, what: &'static str) -> Result<Vec<u8>, ProtoError> {
        let len = u16::from_le_bytes([self.u8()?, self.u8()?]) as usize;
        if len > max {
            return Err(ProtoError(what));
        }
        Ok(self.take(len)?.to_vec())
    }
    fn text(&mut self) -> Result<String, ProtoError> {
        String::from_utf8(self.bytes(MAX_TEXT, "text too long")?).map_err(|_| ProtoError("text is not UTF-8"))
    }
    fn end(self) -> Result<(), ProtoError> {
        match self.buf.is_empty() {
            true => Ok(()),
            false => Err(ProtoError("trailing bytes")),
        }
    }
}

fn put_connect(w: &mut Writer, c: &ConnectReq) {
    w.bytes(&c.local_host, MAX_HOST, "host address too long");
    w.bytes(&c.local_disc, MAX_DISC, "discriminator too long");
    w.bytes(&c.remote_host, MAX_HOST, "host address too long");
    w.bytes(&c.remote_disc, MAX_DISC, "discriminator too long");
    w.bytes(&c.info, MAX_INFO, "info too long");
    w.u64(c.timeout_ms);
    if c.segment_bytes > MAX_SEGMENT_BYTES {
        w.err.get_or_insert(ProtoError("segment too large"));
    }
    w.u64(c.segment_bytes);
    w.u32(c.pid);
}

fn get_connect(r: &mut Reader) -> Result<ConnectReq, ProtoError> {
    let c = ConnectReq {
        local_host: r.bytes(MAX_HOST, "host address too long")?,
        local_disc: r.bytes(MAX_DISC, "discriminator too long")?,
        remote_host: r.bytes(MAX_HOST, "host address too long")?,
        remote_disc: r.bytes(MAX_DISC, "discriminator too long")?,
        info: r.bytes(MAX_INFO, "info too long")?,
        timeout_ms: r.u64()?,
        segment_bytes: r.u64()?,
        pid: r.u32()?,
    };
    match c.segment_bytes > MAX_SEGMENT_BYTES {
        true => Err(ProtoError("segment too large")),
        false => Ok(c),
    }
}

impl Request {
    /// Encodes the request; fails if a field is over its limit.
    pub fn encode(&self) -> Result<Vec<u8>, ProtoError> {
        let mut w;
        match self {
            Request::Hello { device } => {
                w = Writer::new(1);
                w.bytes(device.as_bytes(), MAX_TEXT, "device name too long");
            }
            Request::Listen(l) => {
                w = Writer::new(2);
                w.bytes(&l.host, MAX_HOST, "host address too long");
                w.bytes(&l.disc, MAX_DISC, "discriminator too long");
                w.bytes(&l.info, MAX_INFO, "info too long");
                w.u64(l.timeout_ms);
                w.u32(l.pid);
            }
            Request::Connect(c) => {
                w = Writer::new(3);
                put_connect(&mut w, c);
            }
            Request::PeerConnect(c) => {
                w = Writer::new(4);
                put_connect(&mut w, c);
            }
            Request::Stats { start } => {
                w = Writer::new(5);
                w.u32(*start);
            }
            Request::Stop => w = Writer::new(6),
            Request::Accept { info } => {
                w = Writer::new(7);
                w.bytes(info, MAX_INFO, "info too long");
            }
            Request::Reject => w = Writer::new(8),
        }
        w.finish()
    }

    /// Decodes one request, validating every length.
    pub fn decode(buf: &[u8]) -> Result<Request, ProtoError> {
        let (mut r, tag) = Reader::open(buf)?;
        let req = match tag {
            1 => Request::Hello { device: r.text()? },
            2 => Request::Listen(ListenReq {
                host: r.bytes(MAX_HOST, "host address too long")?,
                disc: r.bytes(MAX_DISC, "discriminator too long")?,
                info: r.bytes(MAX_INFO, "info too long")?,
                timeout_ms: r.u64()?,
                pid: r.u32()?,
            }),
            3 => Request::Connect(get_connect(&mut r)?),
            4 => Request::PeerConnect(get_connect(&mut r)?),
            5 => Request::Stats { start: r.u32()? },
            6 => Request::Stop,
            7 => Request::Accept { info: r.bytes(MAX_INFO, "info too long")? },
            8 => Request::Reject,
            _ => return Err(ProtoError("unknown request")),
        };
        r.end()?;
        Ok(req)
    }
}

impl Reply {
    /// Encodes the reply; fails if a field is over its limit.
    pub fn encode(&self) -> Result<Vec<u8>, ProtoError> {
        let mut w;
        match self {
            Reply::Device { name, interface, host_addr, host_addr6, mtu } => {
                w = Writer::new(0x81);
                w.bytes(name.as_bytes(), MAX_TEXT, "device name too long");
                w.bytes(interface.as_bytes(), MAX_TEXT, "interface name too long");
                w.bytes(host_addr, MAX_HOST, "host address too long");
                w.bytes(host_addr6, MAX_HOST, "host address too long");
                w.u32(*mtu);
            }
            Reply::Incoming { remote_host, remote_disc, remote_info, remote } => {
                w = Writer::new(0x82);
                w.bytes(remote_host, MAX_HOST, "host address too long");
                w.bytes(remote_disc, MAX_DISC, "discriminator too long");
                w.bytes(remote_info, MAX_INFO, "info too long");
                w.u8(*remote as u8);
            }
            Reply::Matched { remote_info, remote } => {
                w = Writer::new(0x83);
                w.bytes(remote_info, MAX_INFO, "info too long");
                w.u8(*remote as u8);
            }
            Reply::PeerMatched { side, remote_info, remote } => {
                w = Writer::new(0x84);
                w.u8(matches!(side, Side::B) as u8);
                w.bytes(remote_info, MAX_INFO, "info too long");
                w.u8(*remote as u8);
            }
            Reply::Rejected => w = Writer::new(0x8a),
            Reply::NoMatch => w = Writer::new(0x85),
            Reply::Unreachable => w = Writer::new(0x86),
            Reply::Stats { counters, total } => {
                w = Writer::new(0x87);
                w.u32(*total);
                if counters.len() > MAX_STATS {
                    w.err.get_or_insert(ProtoError("too many counters"));
                }
                w.u8(counters.len() as u8);
                for (name, value) in counters {
                    w.bytes(name.as_bytes(), MAX_TEXT, "counter name too long");
                    w.u64(*value);
                }
            }
            Reply::Done => w = Writer::new(0x88),
            Reply::Error { kind, message } => {
                w = Writer::new(0x89);
                w.u8(kind.code());
                // Error text is advisory: cut it rather than fail the reply.
                let mut end = message.len().min(MAX_ERROR_TEXT);
                while !message.is_char_boundary(end) {
                    end -= 1;
                }
                w.bytes(&message.as_bytes()[..end], MAX_ERROR_TEXT, "error text too long");
            }
        }
        w.finish()
    }

    /// Decodes one reply, validating every length.
    pub fn decode(buf: &[u8]) -> Result<Reply, ProtoError> {
        let (mut r, tag) = Reader::open(buf)?;
        let reply = match tag {
            0x81 => Reply::Device {
                name: r.text()?,
                interface: r.text()?,
                host_addr: r.bytes(MAX_HOST, "host address too long")?,
                host_addr6: r.bytes(MAX_HOST, "host address too long")?,
                mtu: r.u32()?,
            },
            0x82 => Reply::Incoming {
                remote_host: r.bytes(MAX_HOST, "host address too long")?,
                remote_disc: r.bytes(MAX_DISC, "discriminator too long")?,
                remote_info: r.bytes(MAX_INFO, "info too long")?,
                remote: r.flag()?,
            },
            0x83 => Reply::Matched { remote_info: r.bytes(MAX_INFO, "info too long")?, remote: r.flag()? },
            0x84 => Reply::PeerMatched {
                side: match r.u8()? {
                    0 => Side::A,
                    1 => Side::B,
                    _ => return Err(ProtoError("bad side")),
                },
                remote_info: r.bytes(MAX_INFO, "info too long")?,
                remote: r.flag()?,
            },
            0x8a => Reply::Rejected,
            0x85 => Reply::NoMatch,
            0x86 => Reply::Unreachable,
            0x87 => {
                let total = r.u32()?;
                let n = r.u8()? as usize;
                if n > MAX_STATS {
                    return Err(ProtoError("too many counters"));
                }
                let mut counters = Vec::with_capacity(n);
                for _ in 0..n {
                    counters.push((r.text()?, r.u64()?));
                }
                Reply::Stats { counters, total }
            }
            0x88 => Reply::Done,
            0x89 => Reply::Error {
                kind: ErrorKind::from_code(r.u8()?)?,
                message: String::from_utf8(r.bytes(MAX_ERROR_TEXT, "error text too long")?)
                    .map_err(|_| ProtoError("text is not UTF-8"))?,
            },
            _ => return Err(ProtoError("unknown reply")),
        };
        r.end()?;
        Ok(reply)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connect_req() -> ConnectReq {
        ConnectReq {
            local_host: vec![127, 0, 0, 1],
            local_disc: b"client".to_vec(),
            remote_host: vec![10, 0, 0, 2],
            remote_disc: vec![0xff; MAX_DISC],
            info: vec![7; MAX_INFO],
            timeout_ms: FOREVER,
            segment_bytes: MAX_SEGMENT_BYTES,
            pid: 4242,
        }
    }

    fn requests() -> Vec<Request> {
        vec![
            Request::Hello { device: "/dev/via_lo".into() },
            Request::Listen(ListenReq {
                host: vec![127, 0, 0, 1],
                disc: b"svc".to_vec(),
                info: vec![],
                timeout_ms: 1500,
                pid: 1,
            }),
            Request::Connect(connect_req()),
            Request::PeerConnect(connect_req()),
            Request::Stats { start: 70 },
            Request::Stop,
            Request::Accept { info: vec![3; MAX_INFO] },
            Request::Accept { info: vec![] },
            Request::Reject,
        ]
    }

    fn replies() -> Vec<Reply> {
        vec![
            Reply::Device {
                name: "via_lo".into(),
                interface: "lo".into(),
                host_addr: vec![127, 0, 0, 1],
                host_addr6: vec![],
                mtu: 65536,
            },
            Reply::Device {
                name: "via_eth0".into(),
                interface: "eth0".into(),
                host_addr: vec![10, 0, 0, 1],
                host_addr6: vec![0xfd; 16],
                mtu: 1500,
            },
            Reply::Incoming {
                remote_host: vec![1, 2, 3, 4],
                remote_disc: b"d".to_vec(),
                remote_info: vec![9; 100],
                remote: false,
            },
            Reply::Incoming {
                remote_host: vec![0xfd; 16],
                remote_disc: vec![],
                remote_info: vec![9; 60],
                remote: true,
            },
            Reply::Matched { remote_info: vec![], remote: false },
            Reply::Matched { remote_info: vec![1], remote: true },
            Reply::PeerMatched { side: Side::B, remote_info: b"x".to_vec(), remote: true },
            Reply::Rejected,
            Reply::NoMatch,
            Reply::Unreachable,
            Reply::Stats { counters: vec![("sessions".into(), 3), ("uptime_seconds".into(), 9)], total: 80 },
            Reply::Done,
            Reply::Error { kind: ErrorKind::UnknownDevice, message: "no such device".into() },
            Reply::Error { kind: ErrorKind::Invalid, message: "bad segment size".into() },
            Reply::Error { kind: ErrorKind::PermissionDenied, message: "only uid 0 may stop".into() },
            Reply::Error { kind: ErrorKind::Limit, message: String::new() },
            Reply::Error { kind: ErrorKind::NoCmPort, message: "cannot bind CM port 60".into() },
        ]
    }

    #[test]
    fn round_trips() {
        for req in requests() {
            assert_eq!(Request::decode(&req.encode().unwrap()).unwrap(), req);
        }
        for reply in replies() {
            assert_eq!(Reply::decode(&reply.encode().unwrap()).unwrap(), reply);
        }
    }

    #[test]
    fn every_truncation_is_rejected() {
        for req in requests() {
            let buf = req.encode().unwrap();
            for n in 0..buf.len() {
                assert!(Request::decode(&buf[..n]).is_err(), "{req:?} cut at {n}");
            }
        }
        for reply in replies() {
            let buf = reply.encode().unwrap();
            for n in 0..buf.len() {
                assert!(Reply::decode(&buf[..n]).is_err(), "{reply:?} cut at {n}");
            }
        }
    }

    #[test]
    fn trailing_bytes_version_and_tag_are_checked() {
        let mut buf = Request::Stats { start: 0 }.encode().unwrap();
        buf.push(0);
        assert_eq!(Request::decode(&buf), Err(ProtoError("trailing bytes")));
        assert!(Request::decode(&[VERSION + 1, 5]).is_err());
        assert!(Request::decode(&[VERSION, 0x77]).is_err());
        assert!(Reply::decode(&[VERSION, 5]).is_err());
        assert!(Reply::decode(&[VERSION, 0x84, 2, 0, 0, 0]).is_err());
        // A remote flag other than 0 or 1.
        assert_eq!(Reply::decode(&[VERSION, 0x83, 0, 0, 2]), Err(ProtoError("bad flag")));
        assert_eq!(Reply::decode(&[VERSION, 0x83, 0, 0, 1]), Ok(Reply::Matched { remote_info: vec![], remote: true }));
        // Error kinds are 1 to 5.
        for (code, ok) in [(0, false), (1, true), (5, true), (6, false), (0xff, false)] {
            assert_eq!(Reply::decode(&[VERSION, 0x89, code, 0, 0]).is_ok(), ok, "kind {code}");
        }
        // An answer carries no more than its info.
        assert!(Request::decode(&[VERSION, 8, 0]).is_err());
    }

    #[test]
    fn oversized_fields_are_refused_both_ways() {
        let mut c = connect_req();
        c.remote_disc = vec![0; MAX_DISC + 1];
        assert!(Request::Connect(c).encode().is_err());
        let mut c = connect_req();
        c.info = vec![0; MAX_INFO + 1];
        assert!(Request::PeerConnect(c).encode().is_err());
        let mut c = connect_req();
        c.segment_bytes = MAX_SEGMENT_BYTES + 1;
        assert!(Request::Connect(c).encode().is_err());

        // Hand-made: a discriminator length of 65 on the wire.
        let mut buf = vec![VERSION, 2, 4, 0, 127, 0, 0, 1, MAX_DISC as u8 + 1, 0];
        buf.extend_from_slice(&[0; MAX_DISC + 1]);
        assert_eq!(Request::decode(&buf), Err(ProtoError("discriminator too long")));
        // A segment over the limit on the wire.
        let mut buf = Request::Connect(connect_req()).encode().unwrap();
        let at = buf.len() - 12;
        buf[at..at + 8].copy_from_slice(&(MAX_SEGMENT_BYTES + 1).to_le_bytes());
        assert_eq!(Request::decode(&buf), Err(ProtoError("segment too large")));
        assert!(Request::decode(&vec![VERSION; MAX_MESSAGE + 1]).is_err());
    }

    #[test]
    fn garbage_never_panics() {
        // A small deterministic generator keeps the test reproducible.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for round in 0..20_000 {
            let len = round % 64;
            let buf: Vec<u8> = (0..len)
                .map(|i| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    if i == 0 {
                        VERSION
                    } else {
                        x as u8
                    }
                })
                .collect();
            let _ = Request::decode(&buf);
            let _ = Reply::decode(&buf);
        }
        let err = Reply::Error { kind: ErrorKind::Invalid, message: "é".repeat(MAX_ERROR_TEXT) };
        match Reply::decode(&err.encode().unwrap()) {
            Ok(Reply::Error { message, .. }) => assert_eq!(message, "é".repeat(MAX_ERROR_TEXT / 2)),
            other => panic!("{other:?}"),
        }
        // An error text over the limit on the wire is refused.
        let mut buf = vec![VERSION, 0x89, 1];
        buf.extend_from_slice(&(MAX_ERROR_TEXT as u16 + 1).to_le_bytes());
        buf.extend_from_slice(&vec![b'x'; MAX_ERROR_TEXT + 1]);
        assert_eq!(Reply::decode(&buf), Err(ProtoError("error text too long")));
    }
}
