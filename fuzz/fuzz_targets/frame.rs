//! Ethernet frame parsing: `Frame::new_checked` never panics, what it
//! accepts lies inside the bytes and re-emits to the same frame header,
//! and the packet it carries goes through the packet checks unharmed.

#![no_main]

use libfuzzer_sys::fuzz_target;
use via_wire::frame::{frame_header, Frame, ETHERTYPE, FRAME_HEADER_LEN};
use via_wire::{Header, Packet};

fn check(data: &[u8]) {
    let Ok(f) = Frame::new_checked(data) else { return };
    let packet = f.packet();
    assert!(FRAME_HEADER_LEN + packet.len() <= data.len());
    assert_eq!(packet, &data[FRAME_HEADER_LEN..FRAME_HEADER_LEN + packet.len()]);
    let header = frame_header(f.dst_mac(), f.src_mac(), f.port(), packet.len() as u16);
    assert_eq!(&header[..], &data[..FRAME_HEADER_LEN], "re-emitted frame header differs");
    if let Ok(p) = Packet::new_checked(packet) {
        let _ = Header::parse(&p);
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    // Random bytes seldom carry the EtherType: set it so the checks
    // behind it are reached too.
    if data.len() >= 14 {
        let mut fixed = data.to_vec();
        fixed[12..14].copy_from_slice(&ETHERTYPE.to_be_bytes());
        check(&fixed);
    }
});
