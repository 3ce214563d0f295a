//! openvia packets carried straight in Ethernet frames, the short way
//! between two hosts on one link: no IP or UDP layer in either kernel.
//!
//! A frame is the Ethernet header with [`ETHERTYPE`], the receiving
//! process's data port (its UDP port number, which names the process on
//! its host), the length of the packet, then the packet exactly as it
//! would travel in a datagram.  The length is needed because Ethernet pads
//! short frames.  The packet's own CRC-32C covers it: a connection without
//! the payload CRC does not use frames, since no UDP checksum stands in.

use crate::WireError;

/// The frames' EtherType: IEEE 802's "local experimental EtherType 1".
pub const ETHERTYPE: u16 = 0x88B5;
/// Bytes in front of the packet: the Ethernet header, the port and the length.
pub const FRAME_HEADER_LEN: usize = 18;
/// Length of an Ethernet (MAC) address.
pub const MAC_LEN: usize = 6;

mod field {
    use std::ops::Range;
    pub const DST_MAC: Range<usize> = 0..6;
    pub const SRC_MAC: Range<usize> = 6..12;
    pub const ETHERTYPE: Range<usize> = 12..14;
    pub const PORT: Range<usize> = 14..16;
    pub const LEN: Range<usize> = 16..18;
}

/// A checked view of a received frame.
#[derive(Debug, Clone, Copy)]
pub struct Frame<'a> {
    buffer: &'a [u8],
}

impl<'a> Frame<'a> {
    /// Checks that `buffer` holds a whole openvia frame: the EtherType, and
    /// a packet length within the buffer (bytes past it are padding).
    pub fn new_checked(buffer: &'a [u8]) -> Result<Frame<'a>, WireError> {
        if buffer.len() < FRAME_HEADER_LEN {
            return Err(WireError::Truncated);
        }
        let frame = Frame { buffer };
        if frame.ethertype() != ETHERTYPE {
            return Err(WireError::BadMagic);
        }
        if frame.packet_len() > buffer.len() - FRAME_HEADER_LEN {
            return Err(WireError::BadLength);
        }
        Ok(frame)
    }

    /// The receiver's Ethernet address.
    pub fn dst_mac(&self) -> [u8; MAC_LEN] {
        self.buffer[field::DST_MAC].try_into().expect("6 bytes")
    }

    /// The sender's Ethernet address.
    pub fn src_mac(&self) -> [u8; MAC_LEN] {
        self.buffer[field::SRC_MAC].try_into().expect("6 bytes")
    }

    fn ethertype(&self) -> u16 {
        u16::from_be_bytes(self.buffer[field::ETHERTYPE].try_into().expect("2 bytes"))
    }

    /// The data port of the receiving process.
    pub fn port(&self) -> u16 {
        u16::from_be_bytes(self.buffer[field::PORT].try_into().expect("2 bytes"))
    }

    fn packet_len(&self) -> usize {
        u16::from_be_bytes(self.buffer[field::LEN].try_into().expect("2 bytes")) as usize
    }

    /// The packet the frame carries, without any padding.
    pub fn packet(&self) -> &'a [u8] {
        &self.buffer[FRAME_HEADER_LEN..FRAME_HEADER_LEN + self.packet_len()]
    }
}

/// The bytes in front of a packet of `packet_len` bytes from `src` to the
/// process with data port `port` at `dst`.
pub fn frame_header(dst: [u8; MAC_LEN], src: [u8; MAC_LEN], port: u16, packet_len: u16) -> [u8; FRAME_HEADER_LEN] {
    let mut h = [0u8; FRAME_HEADER_LEN];
    h[field::DST_MAC].copy_from_slice(&dst);
    h[field::SRC_MAC].copy_from_slice(&src);
    h[field::ETHERTYPE].copy_from_slice(&ETHERTYPE.to_be_bytes());
    h[field::PORT].copy_from_slice(&port.to_be_bytes());
    h[field::LEN].copy_from_slice(&packet_len.to_be_bytes());
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: [u8; 6] = [0x02, 1, 2, 3, 4, 5];
    const B: [u8; 6] = [0x02, 9, 8, 7, 6, 5];

    #[test]
    fn a_frame_reads_back_what_was_written_and_drops_padding() {
        let mut buf = frame_header(A, B, 40123, 5).to_vec();
        buf.extend_from_slice(b"hello");
        buf.resize(60, 0); // Ethernet's minimum frame
        let f = Frame::new_checked(&buf).unwrap();
        assert_eq!((f.dst_mac(), f.src_mac(), f.port()), (A, B, 40123));
        assert_eq!(f.packet(), b"hello");
    }

    #[test]
    fn short_foreign_and_overlong_frames_are_refused() {
        let good = [frame_header(A, B, 1, 4).as_slice(), b"data"].concat();
        assert!(Frame::new_checked(&good).is_ok());
        for cut in 0..FRAME_HEADER_LEN {
            assert_eq!(Frame::new_checked(&good[..cut]).unwrap_err(), WireError::Truncated);
        }
        // A packet length past the frame's end.
        assert_eq!(Frame::new_checked(&good[..good.len() - 1]).unwrap_err(), WireError::BadLength);
        let mut foreign = good.clone();
        foreign[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        assert_eq!(Frame::new_checked(&foreign).unwrap_err(), WireError::BadMagic);
    }
}
