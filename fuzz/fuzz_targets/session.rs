//! Two sessions driven by arbitrary operations: sends, packets between them
//! (dropped or not), forged packets with arbitrary fields, time jumps,
//! closes.  Nothing may panic, and basic invariants must hold.

#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use via_reliable::{Config, Event, MsgKind, OutMessage, Peer, Session, Time, Transmit};
use via_wire::{Header, Kind, Packet, FLAGS_KNOWN};

const A: Peer = Peer { vi: 1, key: 0xAAAA };
const B: Peer = Peer { vi: 2, key: 0xBBBB };

struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn u8(&mut self) -> u8 {
        let Some((&b, rest)) = self.0.split_first() else {
            return 0;
        };
        self.0 = rest;
        b
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    fn u64(&mut self) -> u64 {
        (self.u32() as u64) << 32 | self.u32() as u64
    }
    /// Small values most of the time: sequence numbers near the start.
    fn number(&mut self) -> u32 {
        match self.u8() % 4 {
            0 => self.u32(),
            1 => u32::MAX - self.u8() as u32,
            _ => self.u8() as u32,
        }
    }
    fn bytes(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        head
    }
}

/// What the I/O layer would gather: the sim's content does not matter here.
fn payload(t: &Transmit) -> Vec<u8> {
    vec![0x5a; t.payload.map_or(0, |p| p.len as usize)]
}

fn check(s: &mut Session, window: u32) {
    let cfg = s.config().clone();
    assert!(!cfg.reliable || s.in_flight() <= window.clamp(1, via_reliable::MAX_WINDOW));
    while let Some(e) = s.poll_event() {
        if let Event::Segment { offset, total, data, .. } = e {
            assert!(offset as u64 + data.len() as u64 <= total as u64 || total == 0);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let mode = input.u8();
    let window = [1, 2, 4, 8, 256][(input.u8() % 5) as usize];
    let config = Config {
        reliable: mode & 1 == 0,
        max_payload: 1 + (input.u8() as usize % 64),
        window,
        ack_every: 1 + (input.u8() % 4) as u32,
        max_message: if mode & 2 != 0 { 1000 } else { u32::MAX },
        payload_crc: mode & 4 == 0,
        ..Config::default()
    };
    let mut now = Time::default();
    let mut s = [
        Session::new(config.clone(), A, B, now),
        Session::new(config, B, A, now),
    ];
    let mut token = 0u64;
    for _ in 0..500 {
        if input.0.is_empty() {
            break;
        }
        let op = input.u8();
        let i = (op >> 7) as usize;
        match op & 0x7f {
            0..=19 => {
                token += 1;
                let kind = match input.u8() % 4 {
                    0 => MsgKind::Send,
                    1 => MsgKind::RdmaWrite { addr: input.u64(), handle: input.u32() },
                    2 => MsgKind::RdmaReadRequest { addr: input.u64(), handle: input.u32(), len: input.u16() as u32 },
                    _ => MsgKind::RdmaReadResponse { request: input.u32(), status: input.u32() },
                };
                let len = input.u16() as u32 % 400;
                let imm = (input.u8() & 1 == 1).then(|| input.u32());
                let _ = s[i].send(OutMessage { kind, len, imm, token });
            }
            20..=59 => {
                // Move packets from i to the other side; each bit of a mask
                // byte drops one.
                let mut mask = input.u64();
                for _ in 0..10_000 {
                    let Some(t) = s[i].poll_transmit(now) else { break };
                    let drop = mask & 1 == 1;
                    mask >>= 1;
                    if drop {
                        continue;
                    }
                    let bytes = via_wire::encode(&t.header, &payload(&t));
                    let p = Packet::new_checked(&bytes[..]).expect("own packets are valid");
                    let h = Header::parse(&p).expect("own headers parse");
                    s[1 - i].handle_packet(now, &h, p.payload());
                }
            }
            60..=84 => {
                // A forged packet with arbitrary fields, with the right key
                // and VI ids most of the time.
                let right = input.u8();
                let (me, peer) = if i == 0 { (A, B) } else { (B, A) };
                let h = Header {
                    kind: Kind::try_from(1 + input.u8() % 8).unwrap(),
                    flags: input.u16() & FLAGS_KNOWN,
                    dst_vi: if right & 1 == 0 { me.vi } else { input.u32() },
                    src_vi: if right & 2 == 0 { peer.vi } else { input.u32() },
                    key: if right & 4 == 0 { me.key } else { input.u64() },
                    seq: input.number(),
                    ack: input.number(),
                    sack: input.u64(),
                    msg: input.number(),
                    offset: input.number(),
                    total: input.number(),
                    imm: input.u32(),
                    addr: input.u64(),
                    handle: input.u32(),
                    status: input.u32(),
                    window: input.number(),
                };
                let n = input.u8() as usize;
                let body = input.bytes(n).to_vec();
                s[i].handle_packet(now, &h, &body);
            }
            85..=104 => {
                now += Duration::from_micros(input.u16() as u64 * (1 + input.u8() as u64));
                for x in s.iter_mut() {
                    if x.poll_timeout().is_some_and(|t| t <= now) {
                        x.handle_timeout(now);
                    }
                }
            }
            105..=119 => {
                if let Some(t) = s[i].poll_timeout() {
                    now = now.max(t);
                    s[i].handle_timeout(now);
                }
            }
            120..=123 => s[i].close(input.u32()),
            124..=125 => s[i].disconnect(),
            _ => {
                let _ = s[i].stats();
                let _ = s[i].queued_messages();
            }
        }
        check(&mut s[0], window);
        check(&mut s[1], window);
    }
});
