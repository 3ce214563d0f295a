//! The control messages of the same host never panic when decoded, and
//! what decodes re-encodes to a message that decodes the same: those
//! between two connected processes (`via_provider::endpoint`), the
//! requests a host agent takes from any local user, and its replies.

#![no_main]

use libfuzzer_sys::fuzz_target;
use via_provider::endpoint::PeerMessage;
use viad::proto::{Reply, Request};

fuzz_target!(|data: &[u8]| {
    if let Some(m) = PeerMessage::decode(data) {
        assert_eq!(PeerMessage::decode(&m.encode()), Some(m));
    }
    if let Ok(r) = Request::decode(data) {
        let again = r.encode().expect("a decoded request encodes");
        assert_eq!(Request::decode(&again), Ok(r));
    }
    if let Ok(r) = Reply::decode(data) {
        let again = r.encode().expect("a decoded reply encodes");
        assert_eq!(Reply::decode(&again), Ok(r));
    }
});
