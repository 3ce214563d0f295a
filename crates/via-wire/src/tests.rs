//! Round-trip and rejection tests of the packet format.

use super::*;

fn sample_header() -> Header {
    Header {
        kind: Kind::RdmaWrite,
        flags: FLAG_FIRST | FLAG_IMMEDIATE | FLAG_RELIABLE,
        dst_vi: 0x0102_0304,
        src_vi: 0x0506_0708,
        key: 0x1122_3344_5566_7788,
        seq: 0xdead_beef,
        ack: 17,
        sack: 0x8000_0000_0000_0001,
        msg: 3,
        offset: 0,
        total: 4096,
        imm: 0xcafe_f00d,
        addr: 0x7fff_0000_1000,
        handle: 42,
        status: 0,
        window: 256,
    }
}

#[test]
fn round_trip_all_kinds() {
    for k in 1u8..=8 {
        let kind = Kind::try_from(k).unwrap();
        assert_eq!(kind as u8, k);
        for payload in [&b""[..], b"x", &[0xa5; 1400][..]] {
            let h = Header { kind, ..sample_header() };
            let bytes = encode(&h, payload);
            assert_eq!(bytes.len(), HEADER_LEN + payload.len());
            let p = Packet::new_checked(&bytes[..]).unwrap();
            assert_eq!(Header::parse(&p).unwrap(), h);
            assert_eq!(p.payload(), payload);
            assert_eq!(p.payload_len() as usize, payload.len());
        }
    }
    assert_eq!(Kind::try_from(0), Err(WireError::UnknownKind(0)));
    assert_eq!(Kind::try_from(9), Err(WireError::UnknownKind(9)));
}

#[test]
fn layout_matches_the_table() {
    let h = sample_header();
    let b = encode(&h, b"abc");
    assert_eq!(&b[0..2], &[0x56, 0x49]);
    assert_eq!(b[2], 1);
    assert_eq!(b[3], 2);
    assert_eq!(&b[4..6], &(FLAG_FIRST | FLAG_IMMEDIATE | FLAG_RELIABLE).to_be_bytes());
    assert_eq!(&b[6..8], &3u16.to_be_bytes());
    assert_eq!(&b[8..12], &h.dst_vi.to_be_bytes());
    assert_eq!(&b[12..16], &h.src_vi.to_be_bytes());
    assert_eq!(&b[16..24], &h.key.to_be_bytes());
    assert_eq!(&b[24..28], &h.seq.to_be_bytes());
    assert_eq!(&b[28..32], &h.ack.to_be_bytes());
    assert_eq!(&b[32..40], &h.sack.to_be_bytes());
    assert_eq!(&b[40..44], &h.msg.to_be_bytes());
    assert_eq!(&b[44..48], &h.offset.to_be_bytes());
    assert_eq!(&b[48..52], &h.total.to_be_bytes());
    assert_eq!(&b[52..56], &h.imm.to_be_bytes());
    assert_eq!(&b[56..64], &h.addr.to_be_bytes());
    assert_eq!(&b[64..68], &h.handle.to_be_bytes());
    assert_eq!(&b[68..72], &h.status.to_be_bytes());
    assert_eq!(&b[72..76], &h.window.to_be_bytes());
    // The checksum is CRC-32C of the packet with the field zeroed.
    let mut z = b.clone();
    z[76..80].fill(0);
    assert_eq!(&b[76..80], &crc32c::crc32c(&z).to_be_bytes());
    assert_eq!(&b[80..], b"abc");
}

#[test]
fn emit_then_gather_then_finish() {
    // The I/O layer's path: header first, payload copied in, then finish.
    let h = sample_header();
    let payload = [9u8; 100];
    let mut buf = vec![0xeeu8; HEADER_LEN + payload.len()];
    h.emit(&mut buf, payload.len());
    buf[HEADER_LEN..].copy_from_slice(&payload);
    finish(&mut buf);
    assert_eq!(buf, encode(&h, &payload));
}

#[test]
fn a_packet_finished_from_pieces_checksums_as_one_built_whole() {
    // The payload in pieces elsewhere: long enough to fold, cut at odd places
    // (and into empty pieces).
    let payload: Vec<u8> = (0..70_000u32).map(|i| (i * 7 + i / 251) as u8).take(65_000).collect();
    for flags in [FLAG_FIRST, FLAG_FIRST | FLAG_HEADER_CRC] {
        let h = Header { flags, ..sample_header() };
        let whole = encode(&h, &payload);
        for cuts in [vec![], vec![1], vec![3, 4097, 60_000], vec![64_999], vec![0, 3, 3, 65_000]] {
            let mut pieces = Vec::new();
            let mut at = 0;
            for &cut in cuts.iter().chain([&payload.len()]) {
                pieces.push(&payload[at..cut]);
                at = cut;
            }
            let mut header = [0xeeu8; HEADER_LEN];
            h.emit(&mut header, payload.len());
            finish_split(&mut header, pieces);
            assert_eq!(header[..], whole[..HEADER_LEN], "flags {flags:#x}, cut at {cuts:?}");
        }
    }
}

#[test]
fn a_packet_received_in_two_places_is_checked_like_a_whole_one() {
    let payload: Vec<u8> = (0..5000u32).map(|i| (i * 7) as u8).collect();
    for flags in [FLAG_FIRST, FLAG_FIRST | FLAG_HEADER_CRC] {
        let h = Header { flags, ..sample_header() };
        let whole = encode(&h, &payload);
        let (head, body) = whole.split_at(HEADER_LEN);
        assert_eq!(Header::parse_split(head, body), Ok(h));
        // The payload is short or long by a byte: its length field disagrees.
        assert_eq!(Header::parse_split(head, &body[1..]), Err(WireError::BadLength));
        assert_eq!(Header::parse_split(&whole[..HEADER_LEN - 1], body), Err(WireError::BadLength));
        // A flipped payload bit fails the checksum unless only the header is covered.
        let mut bent = body.to_vec();
        bent[4321] ^= 0x10;
        let expected = if flags & FLAG_HEADER_CRC != 0 { Ok(h) } else { Err(WireError::BadChecksum) };
        assert_eq!(Header::parse_split(head, &bent), expected);
        // A flipped header bit always does.
        let mut bent_head = head.to_vec();
        bent_head[field::SEQ.start] ^= 1;
        assert_eq!(Header::parse_split(&bent_head, body), Err(WireError::BadChecksum));
        let mut bad_magic = head.to_vec();
        bad_magic[0] ^= 0xff;
        assert_eq!(Header::parse_split(&bad_magic, body), Err(WireError::BadMagic));
    }
}

#[test]
fn setters_and_getters_agree() {
    let mut buf = [0u8; HEADER_LEN + 4];
    let mut p = Packet::new_unchecked(&mut buf[..]);
    p.set_magic(MAGIC);
    p.set_version(VERSION);
    p.set_kind(Kind::Data);
    p.set_flags(FLAG_LAST);
    p.set_payload_len(4);
    p.set_seq(5);
    p.set_window(6);
    p.payload_mut().copy_from_slice(b"wxyz");
    p.fill_checksum();
    assert!(p.verify_checksum());
    assert_eq!(p.kind(), Ok(Kind::Data));
    assert_eq!(p.seq(), 5);
    assert_eq!(p.window(), 6);
    let p = Packet::new_checked(&buf[..]).unwrap();
    assert_eq!(p.payload(), b"wxyz");
    assert_eq!(p.flags(), FLAG_LAST);
}

#[test]
fn truncation_at_every_length_fails() {
    let b = encode(&sample_header(), &[1, 2, 3, 4, 5, 6, 7]);
    for n in 0..b.len() {
        assert!(Packet::new_checked(&b[..n]).is_err(), "cut at {n}");
    }
    for n in 0..HEADER_LEN {
        assert_eq!(Packet::new_checked(&b[..n]).unwrap_err(), WireError::Truncated);
    }
    // A cut payload is a length mismatch.
    assert_eq!(Packet::new_checked(&b[..HEADER_LEN + 3]).unwrap_err(), WireError::BadLength);
    // So is an extra byte.
    let mut longer = b.clone();
    longer.push(0);
    assert_eq!(Packet::new_checked(&longer[..]).unwrap_err(), WireError::BadLength);
}

#[test]
fn every_flipped_byte_is_caught() {
    let b = encode(&sample_header(), b"some payload bytes");
    for i in 0..b.len() {
        for bit in 0..8 {
            let mut c = b.clone();
            c[i] ^= 1 << bit;
            assert!(Packet::new_checked(&c[..]).is_err(), "byte {i} bit {bit}");
        }
        let mut c = b.clone();
        c[i] ^= 0xff;
        assert!(Packet::new_checked(&c[..]).is_err(), "byte {i}");
    }
}

#[test]
fn a_header_crc_packet_checks_its_header_and_leaves_its_payload_to_udp() {
    let header = Header { flags: FLAG_FIRST | FLAG_HEADER_CRC, ..sample_header() };
    let b = encode(&header, b"payload bytes");
    let mut whole = b.clone();
    whole[5] &= !(FLAG_HEADER_CRC as u8);
    finish(&mut whole);
    assert_ne!(Packet::new_unchecked(&b[..]).checksum(), Packet::new_unchecked(&whole[..]).checksum());
    for i in HEADER_LEN..b.len() {
        let mut c = b.clone();
        c[i] ^= 0xff;
        assert!(Packet::new_checked(&c[..]).is_ok(), "payload byte {i}");
    }
    for i in 0..HEADER_LEN {
        let mut c = b.clone();
        c[i] ^= 0x01;
        assert!(Packet::new_checked(&c[..]).is_err(), "header byte {i}");
    }
    // The flag itself is covered: set or cleared on the way, it fails.
    let mut cleared = b.clone();
    cleared[5] &= !(FLAG_HEADER_CRC as u8);
    assert_eq!(Packet::new_checked(&cleared[..]).unwrap_err(), WireError::BadChecksum);
    let mut set = whole.clone();
    set[5] |= FLAG_HEADER_CRC as u8;
    assert_eq!(Packet::new_checked(&set[..]).unwrap_err(), WireError::BadChecksum);
}

#[test]
fn field_checks_come_before_the_checksum() {
    let b = encode(&sample_header(), b"");
    let refill = |mut c: Vec<u8>| {
        finish(&mut c);
        Packet::new_checked(c).unwrap_err()
    };
    let mut c = b.clone();
    c[0] = 0x00;
    assert_eq!(refill(c), WireError::BadMagic);
    let mut c = b.clone();
    c[2] = 2;
    assert_eq!(refill(c), WireError::BadVersion(2));
    let mut c = b.clone();
    c[3] = 0;
    assert_eq!(refill(c), WireError::UnknownKind(0));
    let mut c = b.clone();
    c[3] = 200;
    assert_eq!(refill(c), WireError::UnknownKind(200));
    let mut c = b.clone();
    c[5] |= 0x20;
    assert_eq!(refill(c), WireError::ReservedFlags);
    let mut c = b.clone();
    c[4] = 0x80;
    assert_eq!(refill(c), WireError::ReservedFlags);
    let mut c = b.clone();
    c[6..8].copy_from_slice(&u16::MAX.to_be_bytes());
    assert_eq!(refill(c), WireError::BadLength);
    let mut c = b;
    c[77] ^= 1;
    assert_eq!(Packet::new_checked(c).unwrap_err(), WireError::BadChecksum);
}

#[test]
fn parse_checks_structure_of_unchecked_views() {
    let short = [0u8; 10];
    assert_eq!(Header::parse(&Packet::new_unchecked(&short[..])), Err(WireError::Truncated));
    let mut b = encode(&sample_header(), b"abc");
    b[3] = 77;
    assert_eq!(Header::parse(&Packet::new_unchecked(&b[..])), Err(WireError::UnknownKind(77)));
    // Accessors on an unchecked view that claims more payload than it has
    // stay within the buffer.
    let mut b = encode(&sample_header(), b"abc");
    b[6..8].copy_from_slice(&1000u16.to_be_bytes());
    assert_eq!(Packet::new_unchecked(&b[..]).payload(), b"abc");
}

#[test]
fn largest_payload() {
    let payload = vec![0x5a; MAX_PAYLOAD];
    let b = encode(&Header::default(), &payload);
    let p = Packet::new_checked(&b[..]).unwrap();
    assert_eq!(p.payload().len(), MAX_PAYLOAD);
}

#[test]
#[should_panic]
fn emit_refuses_a_short_buffer() {
    Header::default().emit(&mut [0u8; HEADER_LEN - 1], 0);
}

#[test]
fn sequenced_kinds() {
    for k in [Kind::Data, Kind::RdmaWrite, Kind::RdmaReadReq, Kind::RdmaReadResp, Kind::Break, Kind::Disconnect] {
        assert!(k.is_sequenced(), "{k}");
    }
    assert!(!Kind::Ack.is_sequenced());
    assert!(!Kind::KeepAlive.is_sequenced());
}
