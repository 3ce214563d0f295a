//! Packet parsing: `Packet::new_checked` + `Header::parse` never panic, and
//! whatever they accept re-encodes to the same bytes.

#![no_main]

use libfuzzer_sys::fuzz_target;
use via_wire::{encode, finish, Header, Packet, HEADER_LEN};

fn check(bytes: &[u8]) {
    // Accessors on an unchecked view of any length must not panic either.
    let _ = Header::parse(&Packet::new_unchecked(bytes));
    if let Ok(p) = Packet::new_checked(bytes) {
        let h = Header::parse(&p).expect("a checked packet parses");
        assert_eq!(encode(&h, p.payload()), bytes, "re-emitted packet differs");
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
