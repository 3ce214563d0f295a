//! The control connection: the test plan and the results travel as one JSON
//! object per line over TCP (port 5198 by default); the data goes over the
//! transport under test.
//!
//! A session: `Hello`/`Welcome`; per test `Start`, `Ready`, the data-path
//! connection, `Peer`, `Connected`; per measured run `Run` and `RunDone`;
//! then `End`; finally `Bye`.  A connect test (`--pattern connect`) has no
//! data-path connection: after `Ready`, each `Run` is `reps` connections
//! that the server takes one after the other ([`crate::connect`]).

use crate::error::{Error, Result};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;

/// The version both sides must agree on (`/2`: the connect pattern came;
/// `/3`: raw-cma and the rendezvous patterns).
pub const PROTOCOL: &str = concat!("viabench-", env!("CARGO_PKG_VERSION"), "/3");

/// Default TCP port of the control connection.
pub const DEFAULT_PORT: u16 = 5198;

/// Bytes of the acknowledgement that ends a stream or a burst.
pub const ACK_BYTES: usize = 4;

/// The transport under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// VIA send/receive through pre-posted descriptors.
    ViaSend,
    /// VIA RDMA write, immediate data on the last chunk as the completion.
    ViaRdma,
    /// TCP sockets with TCP_NODELAY.
    Tcp,
    /// A bare shared-memory ping-pong: the physical floor on one host.
    RawShm,
    /// A bare UDP ping-pong: the physical floor across hosts.
    RawUdp,
    /// A bare ping-pong of Ethernet frames on a packet socket: the floor
    /// under openvia's frames between hosts on one link.
    RawEther,
    /// A bare cross-memory ping-pong: each side writes the block and a flag
    /// word straight into the peer's memory with one `process_vm_writev`,
    /// the peer polls the flag: the floor under openvia's RDMA write on one
    /// host.
    RawCma,
}

impl Mode {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Mode::ViaSend => "via-send",
            Mode::ViaRdma => "via-rdma",
            Mode::Tcp => "tcp",
            Mode::RawShm => "raw-shm",
            Mode::RawUdp => "raw-udp",
            Mode::RawEther => "raw-ether",
            Mode::RawCma => "raw-cma",
        }
    }
    /// Whether the mode goes through VIPL.
    pub fn is_via(self) -> bool {
        matches!(self, Mode::ViaSend | Mode::ViaRdma)
    }
}

/// How the measured messages flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Pattern {
    /// A block there, a block back: one-way time is half the round trip.
    PingPong,
    /// Blocks one way, one acknowledgement at the end.
    Stream,
    /// TTCP-VIA: N back-to-back blocks, then one reply.
    Burst(u32),
    /// Connection set-up: connections one after the other, each carrying
    /// one small message there and back ([`crate::connect`]).
    Connect,
    /// A block there, a block back, each moved as message-passing libraries
    /// of the VIA era move mid-size messages: a request (send), an answer
    /// naming a registered buffer (send), the payload by RDMA write, its
    /// completion as immediate data (`via-rdma`) or a message after it
    /// (`via-send`).  `raw-udp` sends a request and an answer before each
    /// block, one datagram each way; other modes move the same blocks as
    /// plain messages.
    Rendezvous,
    /// Blocks one way as in [`Pattern::Rendezvous`], one acknowledgement at
    /// the end.
    RendezvousStream,
}

impl Pattern {
    /// The name used in labels.
    pub fn name(self) -> String {
        match self {
            Pattern::PingPong => "pingpong".into(),
            Pattern::Stream => "stream".into(),
            Pattern::Burst(n) => format!("burst{n}"),
            Pattern::Connect => "connect".into(),
            Pattern::Rendezvous => "rendezvous".into(),
            Pattern::RendezvousStream => "rendezvous-stream".into(),
        }
    }
    /// Parses `pingpong`, `stream`, `burst`, `burst:N`, `burst=N`,
    /// `burst N`, `connect`, `rendezvous` (`rndv`) or `rendezvous-stream`
    /// (`rndv-stream`); a bare `burst` takes `default_burst`.
    pub fn parse(s: &str, default_burst: u32) -> Result<Pattern> {
        let s = s.trim();
        let (word, n) = match s.find([':', '=', ' ']) {
            Some(i) => (&s[..i], Some(s[i + 1..].trim())),
            None => (s, None),
        };
        match (word, n) {
            ("pingpong" | "ping-pong", None) => Ok(Pattern::PingPong),
            ("stream", None) => Ok(Pattern::Stream),
            ("connect", None) => Ok(Pattern::Connect),
            ("rendezvous" | "rndv", None) => Ok(Pattern::Rendezvous),
            ("rendezvous-stream" | "rndv-stream", None) => Ok(Pattern::RendezvousStream),
            ("burst", n) => {
                let n = match n {
                    Some(n) => n.parse::<u32>().map_err(|_| Error::new(format!("bad burst length {n:?}")))?,
                    None => default_burst,
                };
                if !(1..=4096).contains(&n) {
                    return Err(Error::new(format!("burst length {n} is not in 1..4096")));
                }
                Ok(Pattern::Burst(n))
            }
            _ => Err(Error::new(format!(
                "unknown pattern {s:?} (pingpong, stream, burst[:N], connect, rendezvous, rendezvous-stream)"
            ))),
        }
    }
    /// Messages per timed iteration that the time is divided by.
    pub fn messages_per_rep(self) -> u64 {
        match self {
            Pattern::PingPong | Pattern::Connect | Pattern::Rendezvous => 2,
            Pattern::Stream | Pattern::RendezvousStream => 1,
            Pattern::Burst(n) => n as u64,
        }
    }
    /// Whether VIA links move the blocks by rendezvous.
    pub fn is_rendezvous(self) -> bool {
        matches!(self, Pattern::Rendezvous | Pattern::RendezvousStream)
    }
    /// The plain pattern whose blocks and replies this one has: a
    /// rendezvous is timed as a ping-pong or a stream.
    pub fn flow(self) -> Pattern {
        match self {
            Pattern::Rendezvous => Pattern::PingPong,
            Pattern::RendezvousStream => Pattern::Stream,
            p => p,
        }
    }
}

/// How a side learns that a message arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Wait {
    /// `VipRecvDone` / `VipCQDone` in a loop; non-blocking `recv` for sockets.
    Poll,
    /// `VipRecvWait` / `VipCQWait`; blocking `recv` for sockets.
    Block,
}

impl Wait {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Wait::Poll => "poll",
            Wait::Block => "block",
        }
    }
}

/// The reliability level of the VIs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Reliability {
    /// `VIP_SERVICE_UNRELIABLE`.
    Unreliable,
    /// `VIP_SERVICE_RELIABLE_DELIVERY`.
    Delivery,
    /// `VIP_SERVICE_RELIABLE_RECEPTION`.
    Reception,
}

impl Reliability {
    /// The `VIP_RELIABILITY_LEVEL` value.
    pub fn level(self) -> u16 {
        use crate::vipl_api::*;
        match self {
            Reliability::Unreliable => VIP_SERVICE_UNRELIABLE,
            Reliability::Delivery => VIP_SERVICE_RELIABLE_DELIVERY,
            Reliability::Reception => VIP_SERVICE_RELIABLE_RECEPTION,
        }
    }
}

/// One test: a transport, a pattern and a way of waiting, as both sides
/// set it up.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TestSpec {
    /// The transport.
    pub mode: Mode,
    /// The message pattern.
    pub pattern: Pattern,
    /// Polling or blocking.
    pub wait: Wait,
    /// VIs driven at once on one CQ; `None`: one VI without a CQ.
    pub vis: Option<u32>,
    /// The VIA device the client opens (the server uses it too unless it was
    /// given its own).
    pub device: String,
    /// The VIs' reliability level.
    pub reliability: Reliability,
    /// `VIA_SEGMENT_SIZE` for the UDP transport, and the datagram payload of
    /// `raw-udp`.
    pub segment: Option<u32>,
    /// `tcp`: SO_SNDBUF and SO_RCVBUF of both ends, in bytes; `None`: the
    /// kernel's default (autotuned).
    #[serde(default)]
    pub sockbuf: Option<u32>,
    /// The largest block of the test.
    pub max_block: usize,
    /// Bytes per descriptor: larger blocks are split.
    pub desc_size: usize,
    /// Receive descriptors kept posted per VI.
    pub ring: u32,
    /// A tag unique to this test, part of the discriminators and names.
    pub tag: String,
    /// How long any one wait may take before the run fails, in ms.
    pub timeout_ms: u64,
}

impl TestSpec {
    /// A label for tables, plots and file names.
    pub fn label(&self) -> String {
        let mut l = format!("{}/{}/{}", self.mode.name(), self.pattern.name(), self.wait.name());
        if let Some(n) = self.vis {
            l.push_str(&format!("/vis{n}"));
        }
        l
    }
}

/// What the server tells the client once its side of a test is ready.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerInfo {
    /// Host address of the server's VIA NIC.
    pub nic_addr: Vec<u8>,
    /// Per VI: the RDMA target area (address, memory handle).
    pub rdma: Vec<(u64, u32)>,
    /// TCP or UDP port of the data path (tcp, raw-udp).
    pub port: u16,
    /// The shared-memory file (raw-shm).
    pub shm_path: Option<String>,
    /// The server's Ethernet address (raw-ether).
    #[serde(default)]
    pub mac: Option<[u8; 6]>,
    /// The server's process and the address of the buffer the client
    /// writes into (raw-cma).
    #[serde(default)]
    pub cma: Option<(u32, u64)>,
}

/// What the client tells the server once connected.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PeerInfo {
    /// Per VI: the client's RDMA target area.
    pub rdma: Vec<(u64, u32)>,
    /// The client's UDP port (raw-udp).
    pub port: u16,
    /// The client's Ethernet address (raw-ether).
    #[serde(default)]
    pub mac: Option<[u8; 6]>,
    /// The client's process and the address of the buffer the server
    /// writes into (raw-cma).
    #[serde(default)]
    pub cma: Option<(u32, u64)>,
}

/// One measured run of one size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunSpec {
    /// Block size in bytes.
    pub size: usize,
    /// Timed iterations.
    pub reps: u64,
    /// Seed of the data patterns of this run.
    pub seed: u64,
}

/// The server's side of a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunOutcome {
    /// The server checked the first and the last block it received.
    pub verified: bool,
    /// What failed, if anything.
    pub error: Option<String>,
}

/// Messages from the client.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ClientMsg {
    /// The first message: protocol version and the CPU the server should use.
    Hello {
        /// [`PROTOCOL`].
        version: String,
        /// CPU to pin the server to.
        cpu: Option<usize>,
    },
    /// Set up a test.
    Start(TestSpec),
    /// The client's side is connected.
    Peer(PeerInfo),
    /// Measure one run.
    Run(RunSpec),
    /// The test is over: tear it down.
    End,
    /// The session is over.
    Bye,
}

/// Messages from the server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ServerMsg {
    /// Answer to `Hello`.
    Welcome {
        /// [`PROTOCOL`].
        version: String,
        /// The server's host name.
        host: String,
    },
    /// The server's side of the test is set up.
    Ready(ServerInfo),
    /// Both sides are connected.
    Connected,
    /// A run is over on the server.
    RunDone(RunOutcome),
    /// The test is torn down (answer to `End`).
    Ended,
    /// The request failed on the server.
    Error(String),
}

/// One side of the control connection.
pub struct Control {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    line: String,
}

impl Control {
    /// Wraps a connected stream.
    pub fn new(stream: TcpStream) -> Result<Control> {
        stream.set_nodelay(true)?;
        Ok(Control { reader: BufReader::new(stream.try_clone()?), writer: stream, line: String::new() })
    }

    /// The underlying stream.
    pub fn stream(&self) -> &TcpStream {
        &self.writer
    }

    /// Sends one message.
    pub fn send<T: Serialize>(&mut self, msg: &T) -> Result<()> {
        let mut bytes = serde_json::to_vec(msg)?;
        bytes.push(b'\n');
        self.writer.write_all(&bytes)?;
        Ok(())
    }

    /// Receives one message; `None` when the peer closed the connection.
    pub fn recv<T: DeserializeOwned>(&mut self) -> Result<Option<T>> {
        self.line.clear();
        if self.reader.read_line(&mut self.line)? == 0 {
            return Ok(None);
        }
        Ok(Some(serde_json::from_str(self.line.trim_end())?))
    }

    /// Receives one message, treating a closed connection as an error.
    pub fn expect<T: DeserializeOwned>(&mut self) -> Result<T> {
        self.recv()?.ok_or_else(|| Error::new("the peer closed the control connection"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_parse() {
        assert_eq!(Pattern::parse("pingpong", 16).unwrap(), Pattern::PingPong);
        assert_eq!(Pattern::parse("stream", 16).unwrap(), Pattern::Stream);
        assert_eq!(Pattern::parse("burst", 16).unwrap(), Pattern::Burst(16));
        assert_eq!(Pattern::parse("burst:8", 16).unwrap(), Pattern::Burst(8));
        assert_eq!(Pattern::parse("burst 4096", 16).unwrap(), Pattern::Burst(4096));
        assert!(Pattern::parse("burst=0", 16).is_err());
        assert!(Pattern::parse("burst:4097", 16).is_err());
        assert!(Pattern::parse("flood", 16).is_err());
        assert_eq!(Pattern::parse("connect", 16).unwrap(), Pattern::Connect);
        assert!(Pattern::parse("connect:4", 16).is_err());
        assert_eq!(Pattern::Connect.name(), "connect");
        assert_eq!(Pattern::Burst(8).name(), "burst8");
        assert_eq!(Pattern::parse("rendezvous", 16).unwrap(), Pattern::Rendezvous);
        assert_eq!(Pattern::parse("rndv", 16).unwrap(), Pattern::Rendezvous);
        assert_eq!(Pattern::parse("rendezvous-stream", 16).unwrap(), Pattern::RendezvousStream);
        assert_eq!(Pattern::parse("rndv-stream", 16).unwrap(), Pattern::RendezvousStream);
        assert!(Pattern::parse("rendezvous:4", 16).is_err());
        assert_eq!(Pattern::RendezvousStream.name(), "rendezvous-stream");
        assert_eq!(Pattern::Rendezvous.flow(), Pattern::PingPong);
        assert_eq!(Pattern::RendezvousStream.flow(), Pattern::Stream);
        assert_eq!(Pattern::Burst(3).flow(), Pattern::Burst(3));
        assert!(Pattern::Rendezvous.is_rendezvous() && !Pattern::Stream.is_rendezvous());
        assert_eq!(Pattern::Rendezvous.messages_per_rep(), 2);
        assert_eq!(Pattern::RendezvousStream.messages_per_rep(), 1);
    }

    #[test]
    fn messages_are_one_json_object_per_line() {
        let spec = TestSpec {
            mode: Mode::ViaRdma,
            pattern: Pattern::Burst(4),
            wait: Wait::Block,
            vis: Some(128),
            device: "/dev/via_lo".into(),
            reliability: Reliability::Reception,
            segment: Some(8192),
            sockbuf: None,
            max_block: 1 << 20,
            desc_size: 65536,
            ring: 16,
            tag: "t1".into(),
            timeout_ms: 1000,
        };
        let msg = ClientMsg::Start(spec.clone());
        let text = serde_json::to_string(&msg).unwrap();
        assert!(!text.contains('\n'));
        assert!(text.contains("\"via-rdma\"") && text.contains("\"reception\""));
        let back: ClientMsg = serde_json::from_str(&text).unwrap();
        assert_eq!(back, msg);
        assert_eq!(spec.label(), "via-rdma/burst4/block/vis128");
    }

    #[test]
    fn control_round_trip_over_tcp() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            let mut c = Control::new(s).unwrap();
            let m: ClientMsg = c.expect().unwrap();
            assert_eq!(m, ClientMsg::Run(RunSpec { size: 4, reps: 10, seed: 7 }));
            c.send(&ServerMsg::RunDone(RunOutcome { verified: true, error: None })).unwrap();
        });
        let mut c = Control::new(TcpStream::connect(addr).unwrap()).unwrap();
        c.send(&ClientMsg::Run(RunSpec { size: 4, reps: 10, seed: 7 })).unwrap();
        let m: ServerMsg = c.expect().unwrap();
        assert_eq!(m, ServerMsg::RunDone(RunOutcome { verified: true, error: None }));
        t.join().unwrap();
        assert!(c.recv::<ServerMsg>().unwrap().is_none());
    }
}
