//! Packet parsing: `Packet::new_checked` + `Header::parse` never panic,
//! whatever they accept re-encodes to the same bytes, and a packet received
//! in two places (`Header::parse_split`) is judged as the same bytes whole.

#![no_main]

use libfuzzer_sys::fuzz_target;
use via_wire::{encode, finish, Header, Packet, HEADER_LEN};

fn check(bytes: &[u8]) {
    // Accessors on an unchecked view of any length must not panic either.
    let _ = Header::parse(&Packet::new_unchecked(bytes));
    let whole = Packet::new_checked(bytes).and_then(|p| Header::parse(&p));
    if let Ok(h) = &whole {
        assert_eq!(encode(h, &bytes[HEADER_LEN..]), bytes, "re-emitted packet differs");
    }
    if bytes.len() >= HEADER_LEN {
        let (head, payload) = bytes.split_at(HEADER_LEN);
        assert_eq!(Header::parse_split(head, payload), whole, "split and whole disagree");
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    // Random bytes almost never carry a valid CRC: fix it so the field
    // checks behind it are reached too.
    if data.len() >= HEADER_LEN {
        let mut fixed = data.to_vec();
        finish(&mut fixed);
        check(&fixed);
    }
});
