//! CM message decoding never panics, and what it accepts re-encodes to the
//! same bytes.

#![no_main]

use libfuzzer_sys::fuzz_target;
use via_wire::cm::{CmMessage, CM_HEADER_LEN};
use via_wire::crc32c::crc32c;

fn check(bytes: &[u8]) {
    if let Ok(m) = CmMessage::decode(bytes) {
        let again = m.try_encode().expect("a decoded message encodes");
        assert_eq!(again, bytes, "re-encoded message differs");
        assert_eq!(CmMessage::decode(&again).as_ref(), Ok(&m));
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    // Fix the length and CRC so the body parser is reached.
    if data.len() >= CM_HEADER_LEN {
        let mut fixed = data.to_vec();
        let body = (fixed.len() - CM_HEADER_LEN).min(u16::MAX as usize) as u16;
        fixed.truncate(CM_HEADER_LEN + body as usize);
        fixed[4..6].copy_from_slice(&body.to_be_bytes());
        fixed[6..10].fill(0);
        let c = crc32c(&fixed);
        fixed[6..10].copy_from_slice(&c.to_be_bytes());
        check(&fixed);
    }
});
