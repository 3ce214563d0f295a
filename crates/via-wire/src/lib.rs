//! Packet formats of openvia's VIA-over-UDP protocol, version 1.
//!
//! Nothing here does I/O.  [`Packet`] is a typed view over a byte buffer
//! with one accessor per header field; [`Header`] is the parsed form that
//! the protocol core works with, and emits itself back into a buffer.  The
//! [`cm`] module holds the connection-management messages that host agents
//! exchange.  `docs/wire.md` describes the protocol around these formats.
//!
//! All integers are big-endian.  Every packet is an 80-byte header followed
//! by `payload_len` bytes of payload, and carries a CRC-32C of the whole
//! packet, or of its header alone when it has [`FLAG_HEADER_CRC`].

#![warn(missing_docs)]

pub mod cm;
pub mod crc32c;
pub mod frame;

use std::fmt;

/// Length of the fixed packet header in bytes.
pub const HEADER_LEN: usize = 80;
/// The protocol version this crate speaks.
pub const VERSION: u8 = 1;
/// The first two bytes of every data-path packet ("VI").
pub const MAGIC: u16 = 0x5649;
/// The most payload one packet can describe (`payload_len` is 16 bits).
/// Over UDP the datagram limit (65,507 bytes on IPv4) is lower still.
pub const MAX_PAYLOAD: usize = u16::MAX as usize;

/// The first packet of a message.
pub const FLAG_FIRST: u16 = 1;
/// The last packet of a message.
pub const FLAG_LAST: u16 = 2;
/// The `imm` field carries immediate data.
pub const FLAG_IMMEDIATE: u16 = 4;
/// The sender runs a reliable session (reliable delivery or reception).
pub const FLAG_RELIABLE: u16 = 8;
/// The checksum covers the header only: the payload rests on UDP's own
/// checksum, as TCP's does (both ends declined the payload CRC when they
/// connected).
pub const FLAG_HEADER_CRC: u16 = 16;
/// Every flag bit version 1 defines; the others must be zero.
pub const FLAGS_KNOWN: u16 = FLAG_FIRST | FLAG_LAST | FLAG_IMMEDIATE | FLAG_RELIABLE | FLAG_HEADER_CRC;

/// BREAK code a session sends when a packet exhausted its retransmissions.
pub const BREAK_RETRANSMITS: u32 = 0xFFFF_0001;
/// BREAK code a session sends when it heard nothing for its idle timeout.
pub const BREAK_IDLE: u32 = 0xFFFF_0002;
/// BREAK code of a reliable-reception receiver whose receive was shorter
/// than the message it was to take: the BREAK acknowledges only the packets
/// before that message's first, and the sender completes the message, its
/// oldest unacknowledged send, with REMOTE_DESC_ERROR.
pub const BREAK_RECEIVE_TOO_SHORT: u32 = 0xFFFF_0003;

/// Byte offsets of the header fields.
mod field {
    use std::ops::Range;
    pub const MAGIC: Range<usize> = 0..2;
    pub const VERSION: usize = 2;
    pub const KIND: usize = 3;
    pub const FLAGS: Range<usize> = 4..6;
    pub const PAYLOAD_LEN: Range<usize> = 6..8;
    pub const DST_VI: Range<usize> = 8..12;
    pub const SRC_VI: Range<usize> = 12..16;
    pub const KEY: Range<usize> = 16..24;
    pub const SEQ: Range<usize> = 24..28;
    pub const ACK: Range<usize> = 28..32;
    pub const SACK: Range<usize> = 32..40;
    pub const MSG: Range<usize> = 40..44;
    pub const OFFSET: Range<usize> = 44..48;
    pub const TOTAL: Range<usize> = 48..52;
    pub const IMM: Range<usize> = 52..56;
    pub const ADDR: Range<usize> = 56..64;
    pub const HANDLE: Range<usize> = 64..68;
    pub const STATUS: Range<usize> = 68..72;
    pub const WINDOW: Range<usize> = 72..76;
    pub const CHECKSUM: Range<usize> = 76..80;
}

/// Why bytes were refused as a packet or a CM message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Shorter than its header, or a field runs past the end.
    #[error("truncated packet")]
    Truncated,
    /// The magic number is wrong: not an openvia packet.
    #[error("bad magic number")]
    BadMagic,
    /// A protocol version this implementation does not speak.
    #[error("unsupported version {0}")]
    BadVersion(u8),
    /// A kind this version does not define.
    #[error("unknown packet kind {0}")]
    UnknownKind(u8),
    /// A reserved flag bit is set.
    #[error("reserved flag bits set")]
    ReservedFlags,
    /// A length field disagrees with the buffer or exceeds its limit.
    #[error("bad length")]
    BadLength,
    /// The CRC-32C does not match.
    #[error("bad checksum")]
    BadChecksum,
}

/// What a packet is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum Kind {
    /// A segment of a send message.
    #[default]
    Data = 1,
    /// A segment of an RDMA write.
    RdmaWrite = 2,
    /// An RDMA read request (one packet, no payload).
    RdmaReadReq = 3,
    /// A segment of the answer to an RDMA read request.
    RdmaReadResp = 4,
    /// A pure acknowledgement (not sequenced).
    Ack = 5,
    /// The sender broke the connection; `status` says why.
    Break = 6,
    /// The sender disconnected.
    Disconnect = 7,
    /// A liveness probe, answered by an ACK (not sequenced).
    KeepAlive = 8,
}

impl Kind {
    /// Whether packets of this kind carry a sequence number.
    pub fn is_sequenced(self) -> bool {
        !matches!(self, Kind::Ack | Kind::KeepAlive)
    }

    /// Whether packets of this kind carry (part of) a message.
    pub fn is_message(self) -> bool {
        matches!(self, Kind::Data | Kind::RdmaWrite | Kind::RdmaReadReq | Kind::RdmaReadResp)
    }
}

impl TryFrom<u8> for Kind {
    type Error = WireError;

    fn try_from(v: u8) -> Result<Kind, WireError> {
        Ok(match v {
            1 => Kind::Data,
            2 => Kind::RdmaWrite,
            3 => Kind::RdmaReadReq,
            4 => Kind::RdmaReadResp,
            5 => Kind::Ack,
            6 => Kind::Break,
            7 => Kind::Disconnect,
            8 => Kind::KeepAlive,
            other => return Err(WireError::UnknownKind(other)),
        })
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Kind::Data => "DATA",
            Kind::RdmaWrite => "RDMA_WRITE",
            Kind::RdmaReadReq => "RDMA_READ_REQ",
            Kind::RdmaReadResp => "RDMA_READ_RESP",
            Kind::Ack => "ACK",
            Kind::Break => "BREAK",
            Kind::Disconnect => "DISCONNECT",
            Kind::KeepAlive => "KEEPALIVE",
        };
        f.write_str(name)
    }
}

fn get_u16(b: &[u8], r: std::ops::Range<usize>) -> u16 {
    u16::from_be_bytes(b[r].try_into().expect("two bytes"))
}
fn get_u32(b: &[u8], r: std::ops::Range<usize>) -> u32 {
    u32::from_be_bytes(b[r].try_into().expect("four bytes"))
}
fn get_u64(b: &[u8], r: std::ops::Range<usize>) -> u64 {
    u64::from_be_bytes(b[r].try_into().expect("eight bytes"))
}

/// The checksum of a packet, computed as if its checksum field were zero:
/// over the whole packet, or over the header alone if its flags say so (a
/// flipped flag bit then fails the header's checksum).  `buf` must hold at
/// least [`HEADER_LEN`] bytes.
fn compute_checksum(buf: &[u8]) -> u32 {
    let (header, payload) = buf.split_at(HEADER_LEN);
    split_checksum(header, [payload])
}

/// [`compute_checksum`] of a packet whose payload is `payload`'s pieces in
/// order, wherever they lie.
///
/// The header's bytes before its checksum field are read in place, the
/// field counted as zeros, and an empty piece of payload not at all: a
/// packet without payload (an acknowledgement) or with a header-only
/// checksum (`FLAG_HEADER_CRC`) is a dozen `crc32` instructions.
fn split_checksum<'a>(header: &[u8], payload: impl IntoIterator<Item = &'a [u8]>) -> u32 {
    const _: () = assert!(field::CHECKSUM.end == HEADER_LEN, "the checksum ends the header");
    const ZEROED: [u8; field::CHECKSUM.end - field::CHECKSUM.start] = [0; 4];
    let c = crc32c::crc32c_append(crc32c::crc32c(&header[..field::CHECKSUM.start]), &ZEROED);
    if get_u16(header, field::FLAGS) & FLAG_HEADER_CRC != 0 {
        return c;
    }
    payload.into_iter().filter(|p| !p.is_empty()).fold(c, crc32c::crc32c_append)
}

/// A read/write view of a packet in a byte buffer.
///
/// Accessors read the field straight from the buffer.  On a view made by
/// [`Packet::new_unchecked`] over fewer than [`HEADER_LEN`] bytes they
/// panic; [`Packet::new_checked`] guarantees they do not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps `buffer` without looking at it.
    pub fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps `buffer` after checking that it is a whole, intact packet:
    /// see [`Packet::check`].
    pub fn new_checked(buffer: T) -> Result<Packet<T>, WireError> {
        let p = Packet::new_unchecked(buffer);
        p.check()?;
        Ok(p)
    }

    /// Checks the structure ([`Packet::check_structure`]) and the checksum.
    pub fn check(&self) -> Result<(), WireError> {
        self.check_structure()?;
        if self.checksum() != compute_checksum(self.buffer.as_ref()) {
            return Err(WireError::BadChecksum);
        }
        Ok(())
    }

    /// Checks everything but the checksum: length at least
    /// [`HEADER_LEN`], magic, version, a known kind, no reserved flag bits,
    /// and `HEADER_LEN + payload_len` equal to the buffer length.
    pub fn check_structure(&self) -> Result<(), WireError> {
        self.check_header(self.buffer.as_ref().len())
    }

    /// [`Packet::check_structure`] of a packet `len` bytes long whose
    /// header is this buffer's start (its payload may lie elsewhere).
    fn check_header(&self, len: usize) -> Result<(), WireError> {
        if self.buffer.as_ref().len() < HEADER_LEN {
            return Err(WireError::Truncated);
        }
        if self.magic() != MAGIC {
            return Err(WireError::BadMagic);
        }
        if self.version() != VERSION {
            return Err(WireError::BadVersion(self.version()));
        }
        Kind::try_from(self.kind_raw())?;
        if self.flags() & !FLAGS_KNOWN != 0 {
            return Err(WireError::ReservedFlags);
        }
        if HEADER_LEN + self.payload_len() as usize != len {
            return Err(WireError::BadLength);
        }
        Ok(())
    }

    /// Gives the buffer back.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Whether the checksum field matches the packet's content.
    pub fn verify_checksum(&self) -> bool {
        self.checksum() == compute_checksum(self.buffer.as_ref())
    }

    /// The magic number (0x5649 in a valid packet).
    pub fn magic(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::MAGIC)
    }
    /// The protocol version.
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VERSION]
    }
    /// The kind byte as it is on the wire.
    pub fn kind_raw(&self) -> u8 {
        self.buffer.as_ref()[field::KIND]
    }
    /// The kind, or `UnknownKind` for a byte version 1 does not define.
    pub fn kind(&self) -> Result<Kind, WireError> {
        Kind::try_from(self.kind_raw())
    }
    /// The flag bits (`FLAG_*`).
    pub fn flags(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::FLAGS)
    }
    /// Payload bytes after the header.
    pub fn payload_len(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::PAYLOAD_LEN)
    }
    /// The receiver's VI id.
    pub fn dst_vi(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::DST_VI)
    }
    /// The sender's VI id.
    pub fn src_vi(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::SRC_VI)
    }
    /// The receiver's per-connection key.
    pub fn key(&self) -> u64 {
        get_u64(self.buffer.as_ref(), field::KEY)
    }
    /// The packet sequence number (sequenced kinds only).
    pub fn seq(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::SEQ)
    }
    /// The cumulative acknowledgement: every seq below it was received.
    pub fn ack(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::ACK)
    }
    /// Selective acknowledgements: bit i set means seq `ack + 1 + i` arrived.
    pub fn sack(&self) -> u64 {
        get_u64(self.buffer.as_ref(), field::SACK)
    }
    /// The message number (per direction).
    pub fn msg(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::MSG)
    }
    /// Byte offset of the payload within its message.
    pub fn offset(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::OFFSET)
    }
    /// Length of the whole message in bytes.
    pub fn total(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::TOTAL)
    }
    /// Immediate data (meaningful with `FLAG_IMMEDIATE`).
    pub fn imm(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::IMM)
    }
    /// RDMA remote address.
    pub fn addr(&self) -> u64 {
        get_u64(self.buffer.as_ref(), field::ADDR)
    }
    /// RDMA remote memory handle.
    pub fn handle(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::HANDLE)
    }
    /// BREAK code or RDMA read status.
    pub fn status(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::STATUS)
    }
    /// The sender's free reorder slots (advisory).
    pub fn window(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::WINDOW)
    }
    /// The checksum field as it is in the buffer.
    pub fn checksum(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::CHECKSUM)
    }
    /// The bytes after the header (up to `payload_len` of them).
    pub fn payload(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        let end = (HEADER_LEN + self.payload_len() as usize).min(b.len());
        &b[HEADER_LEN.min(end)..end]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    fn put(&mut self, r: std::ops::Range<usize>, v: &[u8]) {
        self.buffer.as_mut()[r].copy_from_slice(v);
    }
    /// Sets the magic number.
    pub fn set_magic(&mut self, v: u16) {
        self.put(field::MAGIC, &v.to_be_bytes());
    }
    /// Sets the version.
    pub fn set_version(&mut self, v: u8) {
        self.buffer.as_mut()[field::VERSION] = v;
    }
    /// Sets the kind.
    pub fn set_kind(&mut self, v: Kind) {
        self.buffer.as_mut()[field::KIND] = v as u8;
    }
    /// Sets the kind byte, even to a value version 1 does not define.
    pub fn set_kind_raw(&mut self, v: u8) {
        self.buffer.as_mut()[field::KIND] = v;
    }
    /// Sets the flag bits.
    pub fn set_flags(&mut self, v: u16) {
        self.put(field::FLAGS, &v.to_be_bytes());
    }
    /// Sets the payload length.
    pub fn set_payload_len(&mut self, v: u16) {
        self.put(field::PAYLOAD_LEN, &v.to_be_bytes());
    }
    /// Sets the receiver's VI id.
    pub fn set_dst_vi(&mut self, v: u32) {
        self.put(field::DST_VI, &v.to_be_bytes());
    }
    /// Sets the sender's VI id.
    pub fn set_src_vi(&mut self, v: u32) {
        self.put(field::SRC_VI, &v.to_be_bytes());
    }
    /// Sets the receiver's key.
    pub fn set_key(&mut self, v: u64) {
        self.put(field::KEY, &v.to_be_bytes());
    }
    /// Sets the sequence number.
    pub fn set_seq(&mut self, v: u32) {
        self.put(field::SEQ, &v.to_be_bytes());
    }
    /// Sets the cumulative acknowledgement.
    pub fn set_ack(&mut self, v: u32) {
        self.put(field::ACK, &v.to_be_bytes());
    }
    /// Sets the selective acknowledgement bits.
    pub fn set_sack(&mut self, v: u64) {
        self.put(field::SACK, &v.to_be_bytes());
    }
    /// Sets the message number.
    pub fn set_msg(&mut self, v: u32) {
        self.put(field::MSG, &v.to_be_bytes());
    }
    /// Sets the payload's offset within its message.
    pub fn set_offset(&mut self, v: u32) {
        self.put(field::OFFSET, &v.to_be_bytes());
    }
    /// Sets the message length.
    pub fn set_total(&mut self, v: u32) {
        self.put(field::TOTAL, &v.to_be_bytes());
    }
    /// Sets the immediate data.
    pub fn set_imm(&mut self, v: u32) {
        self.put(field::IMM, &v.to_be_bytes());
    }
    /// Sets the RDMA remote address.
    pub fn set_addr(&mut self, v: u64) {
        self.put(field::ADDR, &v.to_be_bytes());
    }
    /// Sets the RDMA remote memory handle.
    pub fn set_handle(&mut self, v: u32) {
        self.put(field::HANDLE, &v.to_be_bytes());
    }
    /// Sets the BREAK code or RDMA read status.
    pub fn set_status(&mut self, v: u32) {
        self.put(field::STATUS, &v.to_be_bytes());
    }
    /// Sets the advertised window.
    pub fn set_window(&mut self, v: u32) {
        self.put(field::WINDOW, &v.to_be_bytes());
    }
    /// Sets the checksum field.
    pub fn set_checksum(&mut self, v: u32) {
        self.put(field::CHECKSUM, &v.to_be_bytes());
    }
    /// The payload, writable (up to `payload_len` bytes, within the buffer).
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let len = self.payload_len() as usize;
        let b = self.buffer.as_mut();
        let end = (HEADER_LEN + len).min(b.len());
        &mut b[HEADER_LEN.min(end)..end]
    }
    /// Computes the checksum over the whole buffer and stores it.
    pub fn fill_checksum(&mut self) {
        let c = compute_checksum(self.buffer.as_ref());
        self.set_checksum(c);
    }
}

/// A parsed packet header: every field but the payload length, which
/// follows from the payload, and the checksum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Header {
    /// What the packet is.
    pub kind: Kind,
    /// `FLAG_*` bits.
    pub flags: u16,
    /// The receiver's VI id.
    pub dst_vi: u32,
    /// The sender's VI id.
    pub src_vi: u32,
    /// The receiver's per-connection key.
    pub key: u64,
    /// Packet sequence number (sequenced kinds only, else 0).
    pub seq: u32,
    /// Cumulative acknowledgement: every seq below it was received.
    pub ack: u32,
    /// Bit i set: seq `ack + 1 + i` was received.
    pub sack: u64,
    /// Message number, per direction.
    pub msg: u32,
    /// Byte offset of this payload within the message.
    pub offset: u32,
    /// Message length in bytes (for an RDMA read request: bytes to read).
    pub total: u32,
    /// Immediate data; for an RDMA read response, the request's message number.
    pub imm: u32,
    /// RDMA remote address.
    pub addr: u64,
    /// RDMA remote memory handle.
    pub handle: u32,
    /// BREAK: error code; RDMA_READ_RESP: 0 or error status bits.
    pub status: u32,
    /// The sender's receive window (advisory).
    pub window: u32,
}

impl Header {
    /// Whether `flag` (one of the `FLAG_*` bits) is set.
    pub fn has(&self, flag: u16) -> bool {
        self.flags & flag != 0
    }

    /// Reads the header of `packet`, checking its structure (but not its
    /// checksum, which [`Packet::new_checked`] verifies).
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Header, WireError> {
        packet.check_structure()?;
        Header::fields(packet)
    }

    /// Reads and checks a packet that arrived in two places: its header in
    /// `header` ([`HEADER_LEN`] bytes), its payload in `payload` (received
    /// straight where it belongs).  The same checks as
    /// [`Packet::new_checked`] and [`Header::parse`] of the whole packet.
    pub fn parse_split(header: &[u8], payload: &[u8]) -> Result<Header, WireError> {
        if header.len() != HEADER_LEN {
            return Err(WireError::BadLength);
        }
        let packet = Packet::new_unchecked(header);
        packet.check_header(HEADER_LEN + payload.len())?;
        if packet.checksum() != split_checksum(header, [payload]) {
            return Err(WireError::BadChecksum);
        }
        Header::fields(&packet)
    }

    /// The fields of a packet whose structure was checked.
    fn fields<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Header, WireError> {
        Ok(Header {
            kind: packet.kind()?,
            flags: packet.flags(),
            dst_vi: packet.dst_vi(),
            src_vi: packet.src_vi(),
            key: packet.key(),
            seq: packet.seq(),
            ack: packet.ack(),
            sack: packet.sack(),
            msg: packet.msg(),
            offset: packet.offset(),
            total: packet.total(),
            imm: packet.imm(),
            addr: packet.addr(),
            handle: packet.handle(),
            status: packet.status(),
            window: packet.window(),
        })
    }

    /// Writes the header into the first [`HEADER_LEN`] bytes of `buf`, with
    /// `payload_len` in its length field and a zero checksum.  The payload
    /// goes after it; [`finish`] then fills the checksum.
    ///
    /// # Panics
    /// If `buf` is shorter than [`HEADER_LEN`] or `payload_len` exceeds
    /// [`MAX_PAYLOAD`].
    pub fn emit(&self, buf: &mut [u8], payload_len: usize) {
        assert!(buf.len() >= HEADER_LEN, "buffer shorter than the header");
        assert!(payload_len <= MAX_PAYLOAD, "payload too long");
        let mut p = Packet::new_unchecked(&mut buf[..HEADER_LEN]);
        p.set_magic(MAGIC);
        p.set_version(VERSION);
        p.set_kind(self.kind);
        p.set_flags(self.flags);
        p.set_payload_len(payload_len as u16);
        p.set_dst_vi(self.dst_vi);
        p.set_src_vi(self.src_vi);
        p.set_key(self.key);
        p.set_seq(self.seq);
        p.set_ack(self.ack);
        p.set_sack(self.sack);
        p.set_msg(self.msg);
        p.set_offset(self.offset);
        p.set_total(self.total);
        p.set_imm(self.imm);
        p.set_addr(self.addr);
        p.set_handle(self.handle);
        p.set_status(self.status);
        p.set_window(self.window);
        p.set_checksum(0);
    }
}

/// Fills the checksum of the packet in `buf` (header and payload, exactly
/// the packet's bytes) once the payload is in place.
///
/// # Panics
/// If `buf` is shorter than [`HEADER_LEN`].
pub fn finish(buf: &mut [u8]) {
    assert!(buf.len() >= HEADER_LEN, "buffer shorter than the header");
    Packet::new_unchecked(buf).fill_checksum();
}

/// Fills the checksum of a packet that is sent from pieces: `header` is
/// its first [`HEADER_LEN`] bytes, and its payload is `payload`'s pieces in
/// order (as many bytes as the header's `payload_len`), wherever they lie.
/// A sender that hands the kernel the application's buffers this way
/// checksums them where they are instead of copying them next to the header.
///
/// # Panics
/// If `header` is not [`HEADER_LEN`] bytes long.
pub fn finish_split<'a>(header: &mut [u8], payload: impl IntoIterator<Item = &'a [u8]>) {
    assert_eq!(header.len(), HEADER_LEN, "not a header");
    let c = split_checksum(header, payload);
    Packet::new_unchecked(header).set_checksum(c);
}

/// Builds a complete packet: header, payload and checksum.
///
/// # Panics
/// If `payload` is longer than [`MAX_PAYLOAD`].
pub fn encode(header: &Header, payload: &[u8]) -> Vec<u8> {
    let mut buf = vec![0u8; HEADER_LEN + payload.len()];
    header.emit(&mut buf, payload.len());
    buf[HEADER_LEN..].copy_from_slice(payload);
    finish(&mut buf);
    buf
}

#[cfg(test)]
mod tests;
