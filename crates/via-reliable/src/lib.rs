//! The reliability protocol of openvia's VIA-over-UDP transport, without I/O.
//!
//! A [`Session`] is one end of one VI connection.  It does no I/O and reads
//! no clock: the caller feeds it received packets ([`Session::handle_packet`])
//! and the time ([`Session::handle_timeout`], a [`Time`] in nanoseconds on
//! the caller's monotonic clock), and asks it for packets to
//! send ([`Session::poll_transmit`]), things that happened
//! ([`Session::poll_event`]) and when to wake it next
//! ([`Session::poll_timeout`]).  Given the same inputs it always produces the
//! same outputs, which is what lets [`sim`] test it over a deterministic
//! network with thousands of seeds.
//!
//! The session never touches message bytes it sends: a [`Transmit`] names
//! them with a [`PayloadRef`] and the I/O layer gathers them from its own
//! (registered) buffers, straight after the header.  Received payload is
//! handed back in [`Event::Segment`], or, with
//! [`Session::handle_packet_in_place`], the session says where the payload
//! of an in-order packet belongs and the caller places it from its own
//! receive buffer, without a copy.
//!
//! An [`endpoint::Endpoint`] is one port that carries many sessions: it
//! routes received packets to them, has them acknowledge what they held
//! back once the port is idle, schedules the port's reads, and decides
//! when a packet may go as a frame, driven through an [`endpoint::Datapath`].
//!
//! `docs/wire.md` describes the protocol on the wire.

#![warn(missing_docs)]

pub mod endpoint;
pub mod netsim;
mod rtt;
pub mod sim;
pub mod time;

use std::collections::VecDeque;
use std::time::Duration;

pub use time::Time;

use via_wire::{Header, Kind, FLAG_FIRST, FLAG_HEADER_CRC, FLAG_IMMEDIATE, FLAG_LAST, FLAG_RELIABLE};

use rtt::RttEstimator;

/// The largest window a session accepts; larger configured values are
/// clamped to it (sequence numbers compare by serial arithmetic, and the
/// reorder buffer is sized by the window).
pub const MAX_WINDOW: u32 = 1 << 16;

/// Number of selective-acknowledgement bits in a header.
const SACK_BITS: usize = 64;

/// Tuning of one session.  Both ends of a connection should use the same
/// values for `reliable` and `window`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Reliable delivery/reception (retransmit, deliver in order) or
    /// unreliable (never retransmit, deliver whole messages at most once).
    pub reliable: bool,
    /// Segment size: payload bytes per packet (clamped to 1..=65535).
    pub max_payload: usize,
    /// Most packets in flight, and the size of the reorder buffer
    /// (clamped to 1..=[`MAX_WINDOW`]).
    pub window: u32,
    /// Retransmission timeout before the first RTT sample.
    pub rto_initial: Duration,
    /// Lower bound of the retransmission timeout.
    pub rto_min: Duration,
    /// Upper bound of the retransmission timeout, backoff included.
    pub rto_max: Duration,
    /// Consecutive timeouts of one packet before the session breaks: a
    /// packet is retransmitted at most this many times by timeout.
    pub max_retransmits: u32,
    /// Send an ACK after this many unacknowledged data packets.
    pub ack_every: u32,
    /// ...or after this long.
    pub ack_delay: Duration,
    /// Send a KEEPALIVE after hearing nothing from the peer for this long.
    pub keepalive: Duration,
    /// Break the session after hearing nothing from the peer for this long.
    pub idle_timeout: Duration,
    /// Longest message (in bytes) this session sends or accepts; the
    /// provider sets it to the VI's maximum transfer size.
    pub max_message: u32,
    /// Checksum payloads with the CRC-32C (the default).  Without it the
    /// session's packets carry [`FLAG_HEADER_CRC`] and their payloads rest
    /// on UDP's checksum; with it the session refuses packets that carry
    /// that flag.
    pub payload_crc: bool,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            reliable: true,
            // An Ethernet MTU of 1500 minus IPv6, UDP and our header.
            max_payload: 1500 - 40 - 8 - via_wire::HEADER_LEN,
            window: 256,
            rto_initial: Duration::from_millis(10),
            rto_min: Duration::from_millis(1),
            rto_max: Duration::from_millis(500),
            max_retransmits: 10,
            ack_every: 2,
            ack_delay: Duration::from_micros(200),
            keepalive: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(10),
            max_message: u32::MAX,
            payload_crc: true,
        }
    }
}

/// One end's identity on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Peer {
    /// The VI id.
    pub vi: u32,
    /// The key packets for this VI must carry.
    pub key: u64,
}

/// What a message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MsgKind {
    /// A send, matched with a posted receive.
    Send,
    /// An RDMA write into the peer's registered memory.
    RdmaWrite {
        /// Remote address of the first byte.
        addr: u64,
        /// Remote memory handle.
        handle: u32,
    },
    /// A request to read `len` bytes of the peer's registered memory.
    RdmaReadRequest {
        /// Remote address of the first byte.
        addr: u64,
        /// Remote memory handle.
        handle: u32,
        /// Bytes to read.
        len: u32,
    },
    /// The answer to an RDMA read request: the bytes read, or an error.
    RdmaReadResponse {
        /// Message number of the request.
        request: u32,
        /// 0, or error status bits.
        status: u32,
    },
}

/// A message to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutMessage {
    /// What it is.
    pub kind: MsgKind,
    /// Payload bytes; for a read request it is ignored (the request carries
    /// no payload).
    pub len: u32,
    /// Immediate data (sends and RDMA writes only; ignored otherwise).
    pub imm: Option<u32>,
    /// Opaque to the session; handed back in [`Transmit`] and [`Event::Sent`].
    pub token: u64,
}

/// A packet to send: the header, and which message bytes follow it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// The header; the I/O layer emits it with `via_wire::Header::emit`.
    pub header: Header,
    /// The payload, `None` for a packet without one.
    pub payload: Option<PayloadRef>,
}

/// Bytes `offset..offset + len` of the message sent with `token`.  The I/O
/// layer keeps those bytes until [`Event::Sent`] (or the session's end),
/// since a retransmission names them again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PayloadRef {
    /// The message's token.
    pub token: u64,
    /// Offset within the message.
    pub offset: u32,
    /// Number of bytes.
    pub len: u32,
}

/// Something the session has to tell its owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Received message data.  In order for reliable sessions; for
    /// unreliable ones only whole messages (one segment with `first` and
    /// `last`), each at most once, never a partial one.  For an RDMA read
    /// request `total` is 0 and the length to read is in the kind.
    Segment {
        /// What the message is.
        kind: MsgKind,
        /// The sender's message number.
        msg: u32,
        /// Offset of `data` within the message.
        offset: u32,
        /// Message length in bytes.
        total: u32,
        /// Immediate data, if the message has some.
        imm: Option<u32>,
        /// The message's first segment.
        first: bool,
        /// The message's last segment: the message is complete.
        last: bool,
        /// The sequence number of the packet that carried it.
        seq: u32,
        /// The bytes.
        data: Vec<u8>,
    },
    /// Every byte of the message was acknowledged (reliable) or sent
    /// (unreliable): the send may complete.  Reliable sessions report
    /// messages in the order they were sent.
    Sent {
        /// The message's token.
        token: u64,
    },
    /// The connection is over; the session sends and accepts nothing more.
    Broken(BreakReason),
}

/// A received segment without its bytes: what [`Event::Segment`] says
/// about them.  [`Session::handle_packet_in_place`] returns one for a packet
/// whose payload is delivered as it stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// What the message is.
    pub kind: MsgKind,
    /// The sender's message number.
    pub msg: u32,
    /// Offset of the bytes within the message.
    pub offset: u32,
    /// Message length in bytes (0 for an RDMA read request).
    pub total: u32,
    /// Immediate data, if the message has some.
    pub imm: Option<u32>,
    /// The message's first segment.
    pub first: bool,
    /// The message's last segment: the message is complete.
    pub last: bool,
    /// The sequence number of the packet that carried it (for
    /// [`Session::close_refusing`]).
    pub seq: u32,
}

impl Segment {
    /// The segment of the packet with header `h`.
    fn of(h: &Header) -> Segment {
        let (kind, total) = match h.kind {
            Kind::RdmaWrite => (MsgKind::RdmaWrite { addr: h.addr, handle: h.handle }, h.total),
            Kind::RdmaReadReq => (MsgKind::RdmaReadRequest { addr: h.addr, handle: h.handle, len: h.total }, 0),
            Kind::RdmaReadResp => (MsgKind::RdmaReadResponse { request: h.imm, status: h.status }, h.total),
            _ => (MsgKind::Send, h.total),
        };
        Segment {
            kind,
            msg: h.msg,
            offset: h.offset,
            total,
            imm: h.has(FLAG_IMMEDIATE).then_some(h.imm),
            first: h.has(FLAG_FIRST),
            last: h.has(FLAG_LAST),
            seq: h.seq,
        }
    }

    /// The [`Event::Segment`] of these bytes.
    pub fn with_data(self, data: Vec<u8>) -> Event {
        let Segment { kind, msg, offset, total, imm, first, last, seq } = self;
        Event::Segment { kind, msg, offset, total, imm, first, last, seq, data }
    }
}

/// Why a session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakReason {
    /// A packet timed out more than `max_retransmits` times.
    Retransmits,
    /// Nothing was heard from the peer for `idle_timeout`.
    Idle,
    /// The peer sent BREAK with this code.
    PeerBreak(u32),
    /// The peer sent DISCONNECT.
    PeerDisconnect,
    /// [`Session::close`] was called with this code.
    Local(u32),
}

/// Why [`Session::send`] refused a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// The session is closed.
    #[error("session closed")]
    Closed,
    /// The message is longer than `Config::max_message`.
    #[error("message too large")]
    TooLarge,
}

/// Counters of one session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stats {
    /// Packets handed out by `poll_transmit`.
    pub packets_sent: u64,
    /// Packets accepted by the key check.
    pub packets_received: u64,
    /// Packets sent again (timeout or fast retransmit).
    pub retransmits: u64,
    /// Sequenced packets received again (or, unreliable, late).
    pub duplicates: u64,
    /// Sequenced packets beyond the reorder window.
    pub out_of_window: u64,
    /// Packets with the wrong key, source VI or destination VI.
    pub bad_key: u64,
    /// Pure ACK packets sent.
    pub acks_sent: u64,
    /// Smoothed round-trip time (zero before the first sample).
    pub srtt: Duration,
    /// Current retransmission timeout.
    pub rto: Duration,
    /// Packets dropped as inconsistent: segments that contradict their
    /// message or themselves, acknowledgements of unsent data, wrong mode.
    pub invalid: u64,
}

/// The counts of [`Stats`] that a port adds to its own after each flush.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LossCounts {
    /// [`Stats::retransmits`].
    pub retransmits: u64,
    /// [`Stats::duplicates`].
    pub duplicates: u64,
    /// [`Stats::bad_key`].
    pub bad_key: u64,
}

/// A message accepted by `send` and not yet completed.
#[derive(Debug, Clone)]
struct OutState {
    msg: OutMessage,
    number: u32,
    /// Payload bytes already cut into packets.
    next_offset: u32,
    /// Every packet of it has a sequence number.
    segmented: bool,
    /// Sequence number of its last packet (valid once segmented).
    last_seq: u32,
}

/// A packet sent and not yet cumulatively acknowledged (reliable only).
#[derive(Debug, Clone)]
struct SentPacket {
    /// The header as first sent; ack fields are refreshed on every send.
    header: Header,
    payload: Option<PayloadRef>,
    sent_at: Time,
    /// Transmissions so far (Karn: only 1 gives an RTT sample).
    tx_count: u32,
    /// Global order of its latest transmission, for loss detection.
    tx_order: u64,
    /// Timer expiries of this packet.
    rto_count: u32,
    /// Selectively acknowledged.
    acked: bool,
    /// Deemed lost and queued for retransmission.
    lost: bool,
}

/// One transmission, in time order, for the retransmission timer.
#[derive(Debug, Clone, Copy)]
struct TxRecord {
    at: Time,
    seq: u32,
    order: u64,
}

/// The message being received, reliable mode.
#[derive(Debug, Clone, Copy)]
struct RxMessage {
    /// Header of its first packet, to compare later segments with.
    first: Header,
    next_offset: u32,
}

/// The message being assembled, unreliable mode.
#[derive(Debug, Clone)]
struct Assembly {
    first: Header,
    data: Vec<u8>,
}

/// BREAK or DISCONNECT waiting for `poll_transmit`.
#[derive(Debug, Clone, Copy)]
enum Control {
    Break(u32),
    Disconnect,
}

/// The packet that ended a session with a word to its peer, a BREAK or a
/// DISCONNECT ([`Session::last_word`]), to be said again.  It goes once,
/// and the network may lose it; a peer that never heard it goes on
/// retransmitting until it gives up, and then takes every message it sent
/// for lost, those this end placed among them, against what the BREAK's
/// acknowledgement would have told it.  So the session's owner keeps the
/// word after the session, for as long as the peer may retransmit, and
/// sends it again to each batch of the peer's packets that
/// [`LastWord::answers`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LastWord {
    /// The word as it went, acknowledgement included.
    pub header: Header,
    local: Peer,
    remote: Peer,
}

impl LastWord {
    /// Whether `incoming` is owed the word again: a packet of the ended
    /// connection (from the peer's VI, to this end's, with this end's key)
    /// other than the peer's own last word, which needs no answer.
    pub fn answers(&self, incoming: &Header) -> bool {
        incoming.key == self.local.key
            && incoming.dst_vi == self.local.vi
            && incoming.src_vi == self.remote.vi
            && !matches!(incoming.kind, Kind::Break | Kind::Disconnect)
    }
}

/// The payload of each packet of a message of `total` bytes but its last,
/// for packets of at most `max`: full packets, the rest in the last, but a
/// message of two packets goes as halves (rounded up to 64 bytes).  The
/// receiver's work on a first packet overlaps only the next one's sending:
/// after a full packet a short tail would leave it to do nearly all of
/// it once the sender is done (65,427 bytes then 109 for a 64 KiB
/// message), halves leave half.  With more packets a short tail is best:
/// the middle ones cover the receiver's work on those before.
fn packet_payload(total: u32, max: u32) -> u32 {
    if total <= max || total > 2 * max {
        return max;
    }
    total.div_ceil(2).next_multiple_of(64).min(max)
}

/// Serial-number difference: positive when `a` is after `b`.
fn diff(a: u32, b: u32) -> i32 {
    a.wrapping_sub(b) as i32
}

/// One end of a VI connection: the protocol state machine.
#[derive(Debug)]
pub struct Session {
    config: Config,
    window: u32,
    max_payload: u32,
    local: Peer,
    remote: Peer,
    closed: bool,
    control: Option<Control>,
    /// The BREAK or DISCONNECT that ended the session, once sent.
    last_word: Option<LastWord>,
    events: VecDeque<Event>,
    stats: Stats,

    // Sending.
    next_msg: u32,
    out: VecDeque<OutState>,
    /// Index in `out` of the first message not fully segmented.
    seg: usize,
    /// Oldest unacknowledged sequence number.
    snd_una: u32,
    /// Next sequence number to assign.
    snd_nxt: u32,
    /// Packets `snd_una..snd_nxt` (reliable only).
    inflight: VecDeque<SentPacket>,
    /// Sequence numbers to retransmit, oldest first.
    retx: VecDeque<u32>,
    /// Transmissions in time order; stale records are skipped lazily.
    timers: VecDeque<TxRecord>,
    tx_order: u64,
    /// The three largest `tx_order`s of acknowledged packets, largest first.
    acked_orders: [u64; 3],
    /// Loss detection already ran for this third-largest order.
    loss_mark: u64,
    peer_window: u32,
    rtt: RttEstimator,

    // Receiving.
    /// Reliable: next expected sequence number.  Unreliable: one past the
    /// newest accepted.
    rcv_next: u32,
    /// Out-of-order packets, index i holding seq `rcv_next + i` (reliable).
    reorder: VecDeque<Option<(Header, Vec<u8>)>>,
    rx: Option<RxMessage>,
    rx_next_msg: u32,
    assembly: Option<Assembly>,
    /// Newest message delivered (unreliable).
    last_delivered: u32,

    // Acknowledgements.
    unacked: u32,
    ack_deadline: Option<Time>,
    /// An acknowledgement must go out with the next transmission.  One that
    /// is merely owed (`ack_every` packets unacknowledged, `owes_ack`) a
    /// receiver with more input to take may hold until it is idle
    /// (`poll_transmit_busy`), and a reply that goes first carries it.
    ack_now: bool,
    /// While set, packets acknowledge nothing from this seq on
    /// ([`Session::hold_acks`]): what arrived since is not yet placed.
    ack_hold: Option<u32>,

    // Liveness.
    last_heard: Time,
    last_probe: Option<Time>,
    keepalive_due: bool,
}

impl Session {
    /// A session between `local` and `remote`, connected at `now`.
    /// `local.key` is the key peers must put in packets to us; `remote.key`
    /// goes into the packets we send.
    pub fn new(config: Config, local: Peer, remote: Peer, now: Time) -> Session {
        let window = config.window.clamp(1, MAX_WINDOW);
        let max_payload = config.max_payload.clamp(1, via_wire::MAX_PAYLOAD) as u32;
        let rtt = RttEstimator::new(config.rto_initial, config.rto_min, config.rto_max, config.ack_delay);
        Session {
            window,
            max_payload,
            local,
            remote,
            closed: false,
            control: None,
            last_word: None,
            events: VecDeque::new(),
            stats: Stats::default(),
            next_msg: 1,
            out: VecDeque::new(),
            seg: 0,
            snd_una: 1,
            snd_nxt: 1,
            inflight: VecDeque::new(),
            retx: VecDeque::new(),
            timers: VecDeque::new(),
            tx_order: 0,
            acked_orders: [0; 3],
            loss_mark: 0,
            peer_window: window,
            rtt,
            rcv_next: 1,
            reorder: VecDeque::new(),
            rx: None,
            rx_next_msg: 1,
            assembly: None,
            last_delivered: 0,
            unacked: 0,
            ack_deadline: None,
            ack_now: false,
            ack_hold: None,
            last_heard: now,
            last_probe: None,
            keepalive_due: false,
            config,
        }
    }

    /// Queues a message and returns its message number.  It is cut into
    /// packets of at most `max_payload` bytes as the window allows; a
    /// message of length 0 is one packet.
    pub fn send(&mut self, msg: OutMessage) -> Result<u32, SendError> {
        if self.closed {
            return Err(SendError::Closed);
        }
        let mut msg = msg;
        match msg.kind {
            MsgKind::RdmaReadRequest { len, .. } => {
                if len > self.config.max_message {
                    return Err(SendError::TooLarge);
                }
                msg.len = 0;
                msg.imm = None;
            }
            MsgKind::RdmaReadResponse { .. } => msg.imm = None,
            MsgKind::Send | MsgKind::RdmaWrite { .. } => {}
        }
        if msg.len > self.config.max_message {
            return Err(SendError::TooLarge);
        }
        let number = self.next_msg;
        self.next_msg = self.next_msg.wrapping_add(1);
        self.out.push_back(OutState { msg, number, next_offset: 0, segmented: false, last_seq: 0 });
        Ok(number)
    }

    /// The next packet to send, if any: a pending BREAK/DISCONNECT,
    /// retransmissions, new data within the window, a KEEPALIVE, or a pure
    /// ACK when one is due.  Every packet carries the current ack and sack.
    #[inline]
    pub fn poll_transmit(&mut self, now: Time) -> Option<Transmit> {
        if self.nothing_to_transmit(now, true) {
            return None;
        }
        self.transmit(now, true)
    }

    /// [`Session::poll_transmit`] for a receiver that has more input to
    /// take: an acknowledgement that is merely owed (every `ack_every`
    /// packets) waits for a later `poll_transmit`, or rides on the next
    /// data packet, so that the receiver puts the data it has before it
    /// spends a send on acknowledging it.  Urgent acknowledgements (a hole,
    /// a duplicate, a probe, a quarter of the window unacknowledged) still go.
    #[inline]
    pub fn poll_transmit_busy(&mut self, now: Time) -> Option<Transmit> {
        if self.nothing_to_transmit(now, false) {
            return None;
        }
        self.transmit(now, false)
    }

    /// Whether a flush would find nothing: [`Session::poll_transmit`] (with
    /// `owed_too`; without, [`Session::poll_transmit_busy`]) would send
    /// nothing and no event waits for [`Session::poll_event`].  Most
    /// flushes of a receiver, after input whose acknowledgement it holds,
    /// find nothing; inline, so that they cost a few loads.
    #[inline]
    pub fn quiet(&self, now: Time, owed_too: bool) -> bool {
        self.events.is_empty() && self.nothing_to_transmit(now, owed_too)
    }

    /// Whether an acknowledgement is owed that [`Session::poll_transmit_busy`]
    /// held back.
    pub fn ack_owed(&self) -> bool {
        self.owes_ack() && !self.closed
    }

    /// Whether anything received is unacknowledged: an acknowledgement is
    /// owed ([`Session::ack_owed`]) or waits for its delay.
    pub fn ack_pending(&self) -> bool {
        self.unacked > 0 && !self.closed
    }

    /// Whether this session should acknowledge once its port finds nothing
    /// more to take ([`endpoint::Routes::deliver`]): it holds back an owed
    /// acknowledgement, or, with `app_away` (no reply will carry one soon),
    /// anything received is unacknowledged.
    pub fn acks_at_idle(&self, app_away: bool) -> bool {
        if app_away {
            self.ack_pending()
        } else {
            self.ack_owed()
        }
    }

    /// Readies the acknowledgement its port found owed once it had nothing
    /// more to take ([`Session::acks_at_idle`]): with `app_away`, of
    /// everything received, without the delay.  Returns whether one is to
    /// go: then the next [`Session::poll_transmit`] carries it.
    pub fn ready_idle_ack(&mut self, app_away: bool) -> bool {
        if app_away {
            self.acknowledge_now();
            true
        } else {
            self.ack_owed()
        }
    }

    /// Makes the next [`Session::poll_transmit`] acknowledge what was
    /// received without waiting for the delay, for a receiver whose
    /// application is not there to reply (and carry the acknowledgement)
    /// soon.
    pub fn acknowledge_now(&mut self) {
        if self.ack_pending() {
            self.ack_now = true;
        }
    }

    /// Until [`Session::release_acks`], packets acknowledge only what
    /// arrived before this call: the owner places what arrives next before
    /// any packet says it arrived, so that an acknowledgement of an RDMA
    /// write tells its initiator that the write was checked and placed.
    /// No pure acknowledgement goes meanwhile; those that fall due go after
    /// the release.
    pub fn hold_acks(&mut self) {
        if self.config.reliable && !self.closed {
            self.ack_hold = Some(self.rcv_next);
        }
    }

    /// Ends [`Session::hold_acks`]: everything received may be acknowledged.
    pub fn release_acks(&mut self) {
        self.ack_hold = None;
    }

    /// Whether [`Session::hold_acks`] keeps back the acknowledgement of
    /// something received.
    pub fn acks_held(&self) -> bool {
        self.ack_hold.is_some_and(|h| h != self.rcv_next)
    }

    /// Breaks the connection with `code` because the owner refused the
    /// segment that packet `seq` carried, while [`Session::hold_acks`] is
    /// in force: the BREAK acknowledges the packets before `seq` (placed)
    /// and none from `seq` on, so the peer learns which message was
    /// refused and never takes it for acknowledged.
    pub fn close_refusing(&mut self, seq: u32, code: u32) {
        self.placed_before(seq);
        self.close(code);
    }

    /// While [`Session::hold_acks`] is in force: the owner placed every
    /// packet before `seq`, so packets sent now acknowledge those (and
    /// none from `seq` on).
    pub fn placed_before(&mut self, seq: u32) {
        if let Some(h) = self.ack_hold {
            if diff(seq, h) >= 0 && diff(seq, self.rcv_next) <= 0 {
                self.ack_hold = Some(seq);
            }
        }
    }

    /// `ack_every` packets are unacknowledged, and no message is partly
    /// received: the rest of a message is on its way, and an acknowledgement
    /// sent between its packets would hold up the next one (on a veth pair
    /// or loopback, sending it runs the peer's input path).  The window's
    /// quarter and the delay still bound how long one waits.
    fn owes_ack(&self) -> bool {
        self.unacked >= self.config.ack_every.max(1) && self.rx.is_none()
    }

    /// Whether [`Session::transmit`] would find nothing to send, by the
    /// checks it makes on its way (a flush ends with such a call, and
    /// most calls of a receiver find nothing): inline, without the call.
    /// A retransmission queued, however stale, goes to `transmit`.
    #[inline]
    fn nothing_to_transmit(&self, now: Time, owed_too: bool) -> bool {
        let no_new =
            self.seg >= self.out.len() || (self.config.reliable && self.inflight.len() as u32 >= self.send_window());
        let no_ack = self.acks_held()
            || !(self.ack_now || (owed_too && self.owes_ack()) || self.ack_deadline.is_some_and(|d| d <= now));
        !self.closed && self.retx.is_empty() && no_new && !self.keepalive_due && no_ack
    }

    fn transmit(&mut self, now: Time, owed_too: bool) -> Option<Transmit> {
        if self.closed {
            return self.control.take().map(|c| self.control_packet(c));
        }
        if let Some(t) = self.retransmission(now) {
            return Some(t);
        }
        if let Some(t) = self.new_packet(now) {
            return Some(t);
        }
        if self.keepalive_due {
            self.keepalive_due = false;
            self.last_probe = Some(now);
            let h = self.header(Kind::KeepAlive, 0, 0);
            return Some(self.emit(h, None));
        }
        if self.acks_held() {
            return None;
        }
        if self.ack_deadline.is_some_and(|d| d <= now) {
            self.ack_now = true;
        }
        if self.ack_now || (owed_too && self.owes_ack()) {
            let h = self.header(Kind::Ack, 0, 0);
            self.stats.acks_sent += 1;
            return Some(self.emit(h, None));
        }
        None
    }

    /// Takes a received packet addressed to this session.  The caller has
    /// parsed the header and checked the checksum; the session checks the
    /// key and both VI ids and ignores (and counts) packets that fail.
    pub fn handle_packet(&mut self, now: Time, header: &Header, payload: &[u8]) {
        let queued = self.events.len();
        if let Some(segment) = self.handle_packet_in_place(now, header, payload) {
            self.events.insert(queued, segment.with_data(payload.to_vec()));
        }
    }

    /// [`Session::handle_packet`] without copying the payload of a packet
    /// that is delivered as it arrived (in order, or a whole unreliable
    /// message): the session returns where it belongs and the caller takes
    /// the bytes from `payload`.  The returned segment comes before any
    /// event this call queued, and after those queued before it.
    #[must_use = "the returned segment is received data"]
    pub fn handle_packet_in_place(&mut self, now: Time, header: &Header, payload: &[u8]) -> Option<Segment> {
        if self.closed {
            return None;
        }
        if header.key != self.local.key || header.src_vi != self.remote.vi || header.dst_vi != self.local.vi {
            self.stats.bad_key += 1;
            return None;
        }
        if header.has(FLAG_HEADER_CRC) && self.config.payload_crc {
            // Its payload was not checked as this connection agreed.
            self.stats.invalid += 1;
            return None;
        }
        self.stats.packets_received += 1;
        self.last_heard = now;
        self.last_probe = None;
        self.keepalive_due = false;

        if self.config.reliable {
            self.on_ack(now, header);
            self.clean_timers();
        }
        match header.kind {
            Kind::Ack => {
                if !payload.is_empty() {
                    self.stats.invalid += 1;
                }
            }
            Kind::KeepAlive => {
                // Answer at once: the prober is waiting to hear from us.
                self.ack_now = true;
            }
            Kind::Break | Kind::Disconnect => {
                if !payload.is_empty() || !self.end_in_window(header.seq) {
                    self.stats.invalid += 1;
                    return None;
                }
                let reason = if header.kind == Kind::Break {
                    BreakReason::PeerBreak(header.status)
                } else {
                    BreakReason::PeerDisconnect
                };
                self.fail(reason);
            }
            Kind::Data | Kind::RdmaWrite | Kind::RdmaReadReq | Kind::RdmaReadResp => {
                if header.has(FLAG_RELIABLE) != self.config.reliable || !self.segment_ok(header, payload.len()) {
                    self.stats.invalid += 1;
                    return None;
                }
                return if self.config.reliable {
                    self.receive_reliable(now, header, payload)
                } else {
                    self.receive_unreliable(header, payload)
                };
            }
        }
        None
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// When [`Session::handle_timeout`] should run next: the earliest of the
    /// retransmission timer, the delayed ACK, the keepalive and the idle
    /// timeout.  `None` once the session is closed.
    pub fn poll_timeout(&self) -> Option<Time> {
        if self.closed {
            return None;
        }
        let mut t = self.last_heard.checked_add(self.config.idle_timeout);
        let mut earliest = |c: Option<Time>| {
            if let Some(c) = c {
                t = Some(t.map_or(c, |t| t.min(c)));
            }
        };
        if !self.keepalive_due {
            let base = self.last_probe.unwrap_or(self.last_heard);
            earliest(base.checked_add(self.config.keepalive));
        }
        earliest(self.ack_deadline);
        if let Some(r) = self.timers.front() {
            earliest(r.at.checked_add_nanos(self.rtt.rto_nanos()));
        }
        t
    }

    /// Runs the timers that are due at `now`.
    pub fn handle_timeout(&mut self, now: Time) {
        if self.closed {
            return;
        }
        if self.last_heard.checked_add(self.config.idle_timeout).is_some_and(|t| t <= now) {
            self.fail(BreakReason::Idle);
            return;
        }
        self.clean_timers();
        let rto = self.rtt.rto_nanos();
        let mut fired = false;
        while let Some(r) = self.timers.front().copied() {
            if r.at.checked_add_nanos(rto).is_none_or(|t| t > now) {
                break;
            }
            self.timers.pop_front();
            let idx = diff(r.seq, self.snd_una) as usize;
            let p = &mut self.inflight[idx];
            p.rto_count += 1;
            p.lost = true;
            let exhausted = p.rto_count > self.config.max_retransmits;
            self.retx.push_back(r.seq);
            fired = true;
            if exhausted {
                self.fail(BreakReason::Retransmits);
                return;
            }
            self.clean_timers();
        }
        if fired {
            self.rtt.on_timeout();
        }
        if self.ack_deadline.is_some_and(|d| d <= now) {
            self.ack_deadline = None;
            self.ack_now = true;
        }
        let base = self.last_probe.unwrap_or(self.last_heard);
        if base.checked_add(self.config.keepalive).is_some_and(|t| t <= now) {
            self.keepalive_due = true;
        }
    }

    /// Breaks the connection: queues a BREAK with `code` as its status (sent
    /// once, best effort) and reports `Broken(Local(code))`.
    pub fn close(&mut self, code: u32) {
        self.fail(BreakReason::Local(code));
    }

    /// Ends the connection: queues a DISCONNECT (sent once, best effort) and
    /// closes the session.  No event follows: the caller asked for it.
    pub fn disconnect(&mut self) {
        if self.closed {
            return;
        }
        // The DISCONNECT is the last packet: it acknowledges all that
        // arrived, or a peer's last send, which the application here has
        // seen complete while another thread still held the acknowledgement,
        // would fail.
        self.ack_hold = None;
        self.shut_down();
        self.control = Some(Control::Disconnect);
    }

    /// Whether the session is over (broken, closed or disconnected).
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// The BREAK or DISCONNECT that ended the session, once it has gone:
    /// what its owner says again to the peer's later packets.
    pub fn last_word(&self) -> Option<LastWord> {
        self.last_word
    }

    /// The session's counters.
    pub fn stats(&self) -> Stats {
        Stats { srtt: self.rtt.srtt(), rto: self.rtt.rto(), ..self.stats }
    }

    /// Three of the counters, read without working out the round-trip
    /// estimates: a port asks for them after every flush.
    pub fn loss_counts(&self) -> LossCounts {
        let s = &self.stats;
        LossCounts { retransmits: s.retransmits, duplicates: s.duplicates, bad_key: s.bad_key }
    }

    /// Packets sent and not yet cumulatively acknowledged (always 0 for an
    /// unreliable session, which waits for nothing).
    pub fn in_flight(&self) -> u32 {
        self.inflight.len() as u32
    }

    /// Messages accepted by `send` whose [`Event::Sent`] has not been
    /// reported yet.  After the session closes, these never complete.
    pub fn queued_messages(&self) -> usize {
        self.out.len()
    }

    /// The configuration in force (window and payload size as clamped).
    pub fn config(&self) -> &Config {
        &self.config
    }

    // ----------------------------------------------------------------
    // Sending.

    /// The window new packets must stay in: our own, and the peer's
    /// advertisement (never below one packet, so a bogus zero cannot stall
    /// the session).
    fn send_window(&self) -> u32 {
        self.window.min(self.peer_window.max(1))
    }

    /// A header addressed to the peer; `emit` fills the acknowledgement
    /// fields when the packet leaves.
    #[inline]
    fn header(&self, kind: Kind, flags: u16, seq: u32) -> Header {
        let mut flags = flags;
        if self.config.reliable {
            flags |= FLAG_RELIABLE;
        }
        if !self.config.payload_crc {
            flags |= FLAG_HEADER_CRC;
        }
        Header {
            kind,
            flags,
            dst_vi: self.remote.vi,
            src_vi: self.local.vi,
            key: self.remote.key,
            seq,
            ..Header::default()
        }
    }

    /// Stamps the current acknowledgement state into `header` and hands the
    /// packet out; it acknowledges everything received so far.
    #[inline]
    fn emit(&mut self, header: Header, payload: Option<PayloadRef>) -> Transmit {
        let (ack, sack, window) = match self.ack_hold {
            // Held: no SACK either, or the peer would count the packets
            // after the hold as arrived past a loss.
            Some(h) if h != self.rcv_next => (h, 0, self.window),
            _ => {
                self.unacked = 0;
                self.ack_deadline = None;
                self.ack_now = false;
                (self.rcv_next, self.sack_bits(), self.window)
            }
        };
        self.stats.packets_sent += 1;
        Transmit { header: Header { ack, sack, window, ..header }, payload }
    }

    fn control_packet(&mut self, c: Control) -> Transmit {
        let (kind, status) = match c {
            Control::Break(code) => (Kind::Break, code),
            Control::Disconnect => (Kind::Disconnect, 0),
        };
        let mut h = self.header(kind, 0, self.snd_nxt);
        h.status = status;
        self.snd_nxt = self.snd_nxt.wrapping_add(1);
        let t = self.emit(h, None);
        self.last_word = Some(LastWord { header: t.header, local: self.local, remote: self.remote });
        t
    }

    fn retransmission(&mut self, now: Time) -> Option<Transmit> {
        while let Some(seq) = self.retx.pop_front() {
            let d = diff(seq, self.snd_una);
            if d < 0 {
                continue;
            }
            let order = self.tx_order + 1;
            let Some(p) = self.inflight.get_mut(d as usize) else {
                continue;
            };
            if p.acked || !p.lost {
                continue;
            }
            p.lost = false;
            p.tx_count += 1;
            p.tx_order = order;
            p.sent_at = now;
            let (header, payload) = (p.header, p.payload);
            self.tx_order = order;
            self.timers.push_back(TxRecord { at: now, seq, order });
            self.stats.retransmits += 1;
            self.clean_timers();
            return Some(self.emit(header, payload));
        }
        None
    }

    fn new_packet(&mut self, now: Time) -> Option<Transmit> {
        if self.seg >= self.out.len() {
            return None;
        }
        if self.config.reliable && self.inflight.len() as u32 >= self.send_window() {
            return None;
        }
        let seq = self.snd_nxt;
        let max_payload = self.max_payload;
        let reliable = self.config.reliable;
        let m = &mut self.out[self.seg];
        let offset = m.next_offset;
        let len = (m.msg.len - offset).min(packet_payload(m.msg.len, max_payload));
        let mut flags = 0;
        if offset == 0 {
            flags |= FLAG_FIRST;
        }
        if offset + len == m.msg.len {
            flags |= FLAG_LAST;
        }
        // Every field in one expression, so that the header is built where
        // it is stored, not stored piecewise and copied (a stalled load).
        let (kind, total, addr, handle, mut imm, status) = match m.msg.kind {
            MsgKind::Send => (Kind::Data, m.msg.len, 0, 0, 0, 0),
            MsgKind::RdmaWrite { addr, handle } => (Kind::RdmaWrite, m.msg.len, addr, handle, 0, 0),
            MsgKind::RdmaReadRequest { addr, handle, len } => (Kind::RdmaReadReq, len, addr, handle, 0, 0),
            MsgKind::RdmaReadResponse { request, status } => (Kind::RdmaReadResp, m.msg.len, 0, 0, request, status),
        };
        if let Some(v) = m.msg.imm {
            flags |= FLAG_IMMEDIATE;
            imm = v;
        }
        let number = m.number;
        let payload = (len > 0).then_some(PayloadRef { token: m.msg.token, offset, len });
        m.next_offset = offset + len;
        let last = flags & FLAG_LAST != 0;
        if last {
            m.segmented = true;
            m.last_seq = seq;
        }
        let token = m.msg.token;
        if last {
            self.seg += 1;
        }
        self.snd_nxt = seq.wrapping_add(1);

        let header = Header { msg: number, offset, total, imm, addr, handle, status, ..self.header(kind, flags, seq) };
        if reliable {
            self.tx_order += 1;
            self.inflight.push_back(SentPacket {
                header,
                payload,
                sent_at: now,
                tx_count: 1,
                tx_order: self.tx_order,
                rto_count: 0,
                acked: false,
                lost: false,
            });
            self.timers.push_back(TxRecord { at: now, seq, order: self.tx_order });
        } else if last {
            // Unreliable: handed out is as good as it gets.
            self.out.pop_front();
            self.seg -= 1;
            self.events.push_back(Event::Sent { token });
        }
        Some(self.emit(header, payload))
    }

    /// Processes the acknowledgement fields of a packet (reliable only).
    fn on_ack(&mut self, now: Time, h: &Header) {
        let a = h.ack;
        if diff(a, self.snd_una) < 0 {
            // Older than what we know: reordered in the network.
            return;
        }
        if diff(a, self.snd_nxt) > 0 {
            // Acknowledges packets we never sent.
            self.stats.invalid += 1;
            return;
        }
        self.peer_window = h.window;
        let mut sample: Option<Time> = None;
        let mut note = |p: &SentPacket, orders: &mut [u64; 3]| {
            if p.tx_count == 1 && sample.is_none_or(|s| p.sent_at > s) {
                sample = Some(p.sent_at);
            }
            insert_order(orders, p.tx_order);
        };
        while self.snd_una != a {
            let p = self.inflight.pop_front().expect("ack within snd_una..=snd_nxt");
            if !p.acked {
                note(&p, &mut self.acked_orders);
            }
            self.snd_una = self.snd_una.wrapping_add(1);
        }
        if h.sack != 0 {
            for i in 0..SACK_BITS {
                if h.sack & (1 << i) == 0 {
                    continue;
                }
                // Bits beyond what was sent are ignored.
                let Some(p) = self.inflight.get_mut(1 + i) else {
                    break;
                };
                if !p.acked {
                    p.acked = true;
                    p.lost = false;
                    note(p, &mut self.acked_orders);
                }
            }
        }
        if let Some(s) = sample {
            self.rtt.sample(now.saturating_duration_since(s));
        }
        // Completed messages, in order.
        while let Some(m) = self.out.front() {
            if self.seg == 0 || !m.segmented || diff(m.last_seq, self.snd_una) >= 0 {
                break;
            }
            let token = m.msg.token;
            self.out.pop_front();
            self.seg -= 1;
            self.events.push_back(Event::Sent { token });
        }
        self.detect_losses();
    }

    /// Fast retransmit: a packet is lost once three packets transmitted
    /// after it were acknowledged while it was not.
    fn detect_losses(&mut self) {
        let third = self.acked_orders[2];
        if third == 0 || third <= self.loss_mark {
            return;
        }
        self.loss_mark = third;
        for (i, p) in self.inflight.iter_mut().enumerate() {
            // First transmissions are ordered by seq, and a retransmission
            // comes later than its original: past the first packet sent
            // once after `third`, nothing qualifies.
            if p.tx_count == 1 && p.tx_order >= third {
                break;
            }
            if !p.acked && !p.lost && p.tx_order < third {
                p.lost = true;
                self.retx.push_back(self.snd_una.wrapping_add(i as u32));
            }
        }
    }

    /// Drops timer records of packets acknowledged, lost or sent again
    /// since, so the front is the oldest live transmission.
    fn clean_timers(&mut self) {
        while let Some(r) = self.timers.front() {
            let d = diff(r.seq, self.snd_una);
            let live =
                d >= 0 && self.inflight.get(d as usize).is_some_and(|p| !p.acked && !p.lost && p.tx_order == r.order);
            if live {
                break;
            }
            self.timers.pop_front();
        }
    }

    // ----------------------------------------------------------------
    // Receiving.

    /// Whether a BREAK or DISCONNECT with `seq` may be genuine: not older
    /// than what was already delivered, not beyond the window.
    fn end_in_window(&self, seq: u32) -> bool {
        let d = diff(seq, self.rcv_next);
        if self.config.reliable {
            d >= 0 && d as u32 <= self.window
        } else {
            d >= 0
        }
    }

    /// Checks a message segment on its own: lengths, offsets and flags that
    /// agree with each other and with the limits.
    fn segment_ok(&self, h: &Header, len: usize) -> bool {
        let first = h.has(FLAG_FIRST);
        let last = h.has(FLAG_LAST);
        if h.total > self.config.max_message {
            return false;
        }
        if h.kind == Kind::RdmaReadReq {
            return first && last && h.offset == 0 && len == 0 && !h.has(FLAG_IMMEDIATE);
        }
        if h.has(FLAG_IMMEDIATE) && !matches!(h.kind, Kind::Data | Kind::RdmaWrite) {
            return false;
        }
        let end = h.offset as u64 + len as u64;
        if end > h.total as u64 || (first && h.offset != 0) {
            return false;
        }
        // LAST exactly when the message ends here; a non-final segment must
        // carry bytes, or a peer could send an endless message.
        last == (end == h.total as u64) && (last || len > 0)
    }

    /// Takes a sequenced packet; returns its segment if it is delivered now.
    fn receive_reliable(&mut self, now: Time, h: &Header, payload: &[u8]) -> Option<Segment> {
        let d = diff(h.seq, self.rcv_next);
        if d < 0 {
            // Already delivered: our ACK was probably lost.
            self.stats.duplicates += 1;
            self.ack_now = true;
            return None;
        }
        if d as u32 >= self.window {
            self.stats.out_of_window += 1;
            self.ack_now = true;
            return None;
        }
        if d > 0 {
            let idx = d as usize;
            if self.reorder.len() <= idx {
                self.reorder.resize(idx + 1, None);
            }
            if self.reorder[idx].is_some() {
                self.stats.duplicates += 1;
            } else {
                self.reorder[idx] = Some((*h, payload.to_vec()));
            }
            // Out of order: tell the sender about the hole at once.
            self.ack_now = true;
            return None;
        }
        if !self.deliver(h, payload.len()) {
            self.stats.invalid += 1;
            return None;
        }
        self.advance();
        let mut filled = false;
        while let Some(Some(_)) = self.reorder.front() {
            let (bh, data) = self.reorder[0].take().expect("checked");
            if !self.deliver(&bh, data.len()) {
                self.stats.invalid += 1;
                break;
            }
            self.events.push_back(Segment::of(&bh).with_data(data));
            self.advance();
            filled = true;
        }
        self.unacked += 1;
        if filled || self.window_needs_ack() {
            self.ack_now = true;
        } else if self.ack_deadline.is_none() {
            self.ack_deadline = now.checked_add(self.config.ack_delay);
        }
        Some(Segment::of(h))
    }

    /// Whether an acknowledgement must go at once so that the sender never
    /// waits for its window to open: half the window is unacknowledged, or
    /// a quarter while a message is in progress that does not end within
    /// half the window.  Between those, none goes between a message's
    /// packets to hold up the next, and at the end of a message it is owed
    /// (`owes_ack`): a reply or the next idle poll carries it.
    fn window_needs_ack(&self) -> bool {
        let quarter = self.config.ack_every.max(1).max(self.window / 4);
        let half = quarter.max(self.window / 2);
        if self.unacked < quarter {
            return false;
        }
        if self.unacked >= half {
            return true;
        }
        let Some(rx) = self.rx else { return false };
        let rest = rx.first.total.saturating_sub(rx.next_offset).div_ceil(self.max_payload);
        self.unacked as u64 + rest as u64 > half as u64
    }

    fn advance(&mut self) {
        self.rcv_next = self.rcv_next.wrapping_add(1);
        self.reorder.pop_front();
    }

    /// Accepts the in-order segment `h` of `len` bytes if it continues the
    /// message being received (or starts the next one); false if it
    /// contradicts it.  The caller delivers its bytes.
    fn deliver(&mut self, h: &Header, len: usize) -> bool {
        match self.rx {
            None => {
                if !h.has(FLAG_FIRST) || h.msg != self.rx_next_msg {
                    return false;
                }
            }
            Some(rx) => {
                let f = &rx.first;
                let same = !h.has(FLAG_FIRST)
                    && h.msg == f.msg
                    && h.kind == f.kind
                    && h.total == f.total
                    && h.offset == rx.next_offset
                    && h.has(FLAG_IMMEDIATE) == f.has(FLAG_IMMEDIATE)
                    && h.imm == f.imm
                    && h.addr == f.addr
                    && h.handle == f.handle
                    && h.status == f.status;
                if !same {
                    return false;
                }
            }
        }
        let last = h.has(FLAG_LAST);
        let next_offset = h.offset + len as u32;
        self.rx = if last {
            self.rx_next_msg = h.msg.wrapping_add(1);
            None
        } else {
            Some(RxMessage { first: self.rx.map_or(*h, |r| r.first), next_offset })
        };
        true
    }

    /// Takes a packet of an unreliable session; returns a one-packet message
    /// that is delivered now.
    fn receive_unreliable(&mut self, h: &Header, payload: &[u8]) -> Option<Segment> {
        let d = diff(h.seq, self.rcv_next);
        if d < 0 {
            // Late or duplicate: never deliver anything twice.
            self.stats.duplicates += 1;
            return None;
        }
        self.rcv_next = h.seq.wrapping_add(1);
        if d > 0 {
            // A packet in between is missing: its message is lost.
            self.assembly = None;
        }
        if h.has(FLAG_FIRST) {
            self.assembly = None;
            if diff(h.msg, self.last_delivered) <= 0 {
                self.stats.invalid += 1;
                return None;
            }
            if h.has(FLAG_LAST) {
                self.last_delivered = h.msg;
                return Some(Segment::of(h));
            }
            self.assembly = Some(Assembly { first: *h, data: payload.to_vec() });
        } else {
            let a = self.assembly.as_mut()?;
            let f = &a.first;
            let same = h.msg == f.msg
                && h.kind == f.kind
                && h.total == f.total
                && h.offset as usize == a.data.len()
                && h.has(FLAG_IMMEDIATE) == f.has(FLAG_IMMEDIATE)
                && h.imm == f.imm
                && h.addr == f.addr
                && h.handle == f.handle
                && h.status == f.status;
            if !same {
                self.assembly = None;
                self.stats.invalid += 1;
                return None;
            }
            a.data.extend_from_slice(payload);
        }
        if h.has(FLAG_LAST) {
            let a = self.assembly.take().expect("assembled above");
            self.last_delivered = a.first.msg;
            let mut first = a.first;
            first.flags |= FLAG_LAST;
            self.events.push_back(Segment { offset: 0, ..Segment::of(&first) }.with_data(a.data));
        }
        None
    }

    /// Selective acknowledgement bits: bit i for seq `rcv_next + 1 + i`.
    fn sack_bits(&self) -> u64 {
        if self.reorder.len() < 2 {
            return 0; // nothing held beyond the next expected packet: every packet in order
        }
        let mut s = 0u64;
        for (i, slot) in self.reorder.iter().skip(1).take(SACK_BITS).enumerate() {
            if slot.is_some() {
                s |= 1 << i;
            }
        }
        s
    }

    // ----------------------------------------------------------------
    // Ending.

    fn shut_down(&mut self) {
        self.closed = true;
        self.inflight.clear();
        self.retx.clear();
        self.timers.clear();
        self.reorder.clear();
        self.assembly = None;
        self.rx = None;
        self.ack_now = false;
        self.ack_deadline = None;
        self.keepalive_due = false;
    }

    fn fail(&mut self, reason: BreakReason) {
        if self.closed {
            return;
        }
        self.shut_down();
        // Tell the peer when the reason is ours; best effort, sent once.
        let code = match reason {
            BreakReason::Retransmits => Some(via_wire::BREAK_RETRANSMITS),
            BreakReason::Idle => Some(via_wire::BREAK_IDLE),
            BreakReason::Local(c) => Some(c),
            BreakReason::PeerBreak(_) | BreakReason::PeerDisconnect => None,
        };
        self.control = code.map(Control::Break);
        self.events.push_back(Event::Broken(reason));
    }
}

/// Keeps the three largest orders, largest first.
fn insert_order(orders: &mut [u64; 3], o: u64) {
    if o > orders[0] {
        *orders = [o, orders[0], orders[1]];
    } else if o > orders[1] {
        *orders = [orders[0], o, orders[1]];
    } else if o > orders[2] {
        orders[2] = o;
    }
}

#[cfg(test)]
mod tests;
