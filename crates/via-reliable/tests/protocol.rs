//! Rules of the protocol, one at a time, with packets moved by hand.

use std::time::Duration;
use via_reliable::Time;

use via_reliable::sim::{run, Script, SimConfig};
use via_reliable::{BreakReason, Config, Event, MsgKind, OutMessage, PayloadRef, Peer, SendError, Session, Transmit};
use via_wire::{Header, Kind, Packet, FLAG_FIRST, FLAG_HEADER_CRC, FLAG_IMMEDIATE, FLAG_LAST, FLAG_RELIABLE};

const A: Peer = Peer { vi: 11, key: 0xA11C_E000_0000_0001 };
const B: Peer = Peer { vi: 22, key: 0xB0B0_0000_0000_0002 };

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

fn us(v: u64) -> Duration {
    Duration::from_micros(v)
}

fn pair(config: Config, now: Time) -> (Session, Session) {
    (Session::new(config.clone(), A, B, now), Session::new(config, B, A, now))
}

/// The bytes of message `token`: a pure function, so any side can check them.
fn byte(token: u64, at: u32) -> u8 {
    (token.wrapping_mul(31) as u32).wrapping_add(at.wrapping_mul(7)) as u8
}

fn gather(r: Option<PayloadRef>) -> Vec<u8> {
    match r {
        None => Vec::new(),
        Some(r) => (0..r.len).map(|i| byte(r.token, r.offset + i)).collect(),
    }
}

fn msg(token: u64, len: u32) -> OutMessage {
    OutMessage { kind: MsgKind::Send, len, imm: None, token }
}

fn drain(s: &mut Session, now: Time) -> Vec<Transmit> {
    std::iter::from_fn(|| s.poll_transmit(now)).collect()
}

fn events(s: &mut Session) -> Vec<Event> {
    std::iter::from_fn(|| s.poll_event()).collect()
}

/// Parses an encoded packet as the I/O layer would.
fn parsed(t: &Transmit) -> (Header, Vec<u8>) {
    let bytes = via_wire::encode(&t.header, &gather(t.payload));
    let p = Packet::new_checked(&bytes[..]).expect("valid packet");
    (Header::parse(&p).expect("valid header"), p.payload().to_vec())
}

/// Encodes the packet as the I/O layer would and hands it to `to`.
fn deliver(to: &mut Session, now: Time, t: &Transmit) {
    let (h, payload) = parsed(t);
    to.handle_packet(now, &h, &payload);
}

fn data_packets(ts: &[Transmit]) -> Vec<Transmit> {
    ts.iter().filter(|t| t.header.kind == Kind::Data).copied().collect()
}

fn only_ack(ts: &[Transmit]) -> Transmit {
    let acks: Vec<_> = ts.iter().filter(|t| t.header.kind == Kind::Ack).collect();
    assert_eq!(acks.len(), 1, "{ts:?}");
    *acks[0]
}

#[test]
fn rtt_is_measured_and_karn_skips_retransmitted_packets() {
    let t0 = Time::default();
    let (mut a, mut b) = pair(Config::default(), t0);
    a.send(msg(1, 10)).unwrap();
    let p = drain(&mut a, t0);
    assert_eq!(p.len(), 1);
    deliver(&mut b, t0 + ms(2), &p[0]);
    // One packet is below ack_every: the ACK waits for the delay.
    assert!(drain(&mut b, t0 + ms(2)).is_empty());
    let due = b.poll_timeout().unwrap();
    assert_eq!(due, t0 + ms(2) + us(200));
    b.handle_timeout(due);
    let ack = only_ack(&drain(&mut b, due));
    assert_eq!(ack.header.ack, 2);
    deliver(&mut a, due + ms(2), &ack);
    let s = a.stats();
    assert_eq!(s.srtt, us(4200));
    // srtt + 4 * rttvar + ack delay = 4.2 + 8.4 + 0.2 ms.
    assert_eq!(s.rto, us(12_800));
    assert_eq!(events(&mut a), [Event::Sent { token: 1 }]);

    // The next packet is lost; its retransmission is acknowledged, and
    // Karn's rule takes no sample from it: srtt stays, the backoff stays.
    let t1 = t0 + ms(100);
    a.send(msg(2, 10)).unwrap();
    assert_eq!(drain(&mut a, t1).len(), 1);
    let expiry = a.poll_timeout().unwrap();
    assert_eq!(expiry, t1 + us(12_800));
    a.handle_timeout(expiry);
    let r = drain(&mut a, expiry);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].header.seq, 2);
    assert_eq!(a.stats().retransmits, 1);
    assert_eq!(a.stats().rto, us(25_600));
    deliver(&mut b, expiry + ms(1), &r[0]);
    b.handle_timeout(b.poll_timeout().unwrap());
    let ack = only_ack(&drain(&mut b, expiry + ms(2)));
    deliver(&mut a, expiry + ms(50), &ack);
    assert_eq!(events(&mut a), [Event::Sent { token: 2 }]);
    assert_eq!(a.stats().srtt, us(4200));
    assert_eq!(a.stats().rto, us(25_600));
}

#[test]
fn timeouts_back_off_to_the_cap_then_break() {
    let t0 = Time::default();
    let config = Config {
        // Keep liveness timers out of the way.
        keepalive: Duration::from_secs(100),
        idle_timeout: Duration::from_secs(100),
        ..Config::default()
    };
    let (mut a, _b) = pair(config, t0);
    a.send(msg(1, 10)).unwrap();
    assert_eq!(drain(&mut a, t0).len(), 1);
    let mut retransmitted_at = Vec::new();
    loop {
        let t = a.poll_timeout().expect("a timer while a packet is out");
        a.handle_timeout(t);
        let out = drain(&mut a, t);
        if a.is_closed() {
            assert_eq!(out.len(), 1);
            assert_eq!(out[0].header.kind, Kind::Break);
            assert_eq!(out[0].header.status, via_wire::BREAK_RETRANSMITS);
            assert_eq!(t - t0, ms(3130));
            break;
        }
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].header.seq, 1);
        retransmitted_at.push((t - t0).as_millis());
    }
    assert_eq!(retransmitted_at, [10, 30, 70, 150, 310, 630, 1130, 1630, 2130, 2630]);
    assert_eq!(events(&mut a), [Event::Broken(BreakReason::Retransmits)]);
    assert_eq!(a.poll_timeout(), None);
    assert_eq!(a.send(msg(2, 1)), Err(SendError::Closed));
}

/// A message longer than a packet goes as full packets and the rest, but
/// a message of two packets as halves (rounded up to 64 bytes); the
/// packets cover the message in order and arrive as it.
#[test]
fn a_message_of_two_packets_goes_as_halves() {
    let t0 = Time::default();
    let lens = |max: usize, len: u32| {
        let config = Config { window: 64, max_payload: max, ..Config::default() };
        let (mut a, mut b) = pair(config, t0);
        a.send(msg(1, len)).unwrap();
        let sent = data_packets(&drain(&mut a, t0));
        let mut at = 0;
        for t in &sent {
            let p = t.payload.unwrap();
            assert_eq!((p.offset, t.header.offset), (at, at));
            at += p.len;
            deliver(&mut b, t0, t);
        }
        assert_eq!(at, len);
        let got: Vec<(u32, bool, usize)> = events(&mut b)
            .into_iter()
            .filter_map(|e| match e {
                Event::Segment { offset, last, data, .. } => Some((offset, last, data.len())),
                _ => None,
            })
            .collect();
        let want: Vec<(u32, bool, usize)> = sent
            .iter()
            .enumerate()
            .map(|(i, t)| (t.header.offset, i + 1 == sent.len(), t.payload.unwrap().len as usize))
            .collect();
        assert_eq!(got, want);
        sent.iter().map(|t| t.payload.unwrap().len).collect::<Vec<u32>>()
    };
    // A large packet's payload: a 64 KiB GSO buffer less the headers.
    let large = 65_427;
    assert_eq!(lens(large, 65_427), [65_427]);
    assert_eq!(lens(large, 65_536), [32_768, 32_768]);
    assert_eq!(lens(large, 100_001), [50_048, 49_953]);
    // Rounding up to 64 never passes the limit.
    assert_eq!(lens(large, 2 * 65_427), [65_427, 65_427]);
    assert_eq!(lens(large, 2 * 65_427 - 1), [65_427, 65_426]);
    // Three packets or more: full ones, the rest last.
    assert_eq!(lens(large, 2 * 65_427 + 1), [65_427, 65_427, 1]);
    let mib = lens(large, 1 << 20);
    assert_eq!(mib[..16], [65_427; 16]);
    assert_eq!(mib[16..], [(1 << 20) - 16 * 65_427]);
    // Packets of a datagram each, as without large packets.
    assert_eq!(lens(1372, 2000), [1024, 976]);
    assert_eq!(lens(1372, 4096), [1372, 1372, 1352]);
    assert_eq!(lens(8, 9), [8, 1]);
}

#[test]
fn the_window_limits_packets_in_flight() {
    let t0 = Time::default();
    let config = Config { window: 4, max_payload: 100, ..Config::default() };
    let (mut a, mut b) = pair(config, t0);
    a.send(msg(1, 1000)).unwrap();
    let first = drain(&mut a, t0);
    assert_eq!(first.len(), 4);
    assert_eq!(a.in_flight(), 4);
    assert_eq!(first.iter().map(|t| t.header.seq).collect::<Vec<_>>(), [1, 2, 3, 4]);
    assert_eq!(first[0].header.flags, FLAG_FIRST | FLAG_RELIABLE);
    assert_eq!(first[0].header.window, 4);
    for t in &first[..2] {
        deliver(&mut b, t0, t);
    }
    // Two packets reach ack_every: the ACK goes at once.
    let ack = only_ack(&drain(&mut b, t0));
    assert_eq!(ack.header.ack, 3);
    deliver(&mut a, t0 + ms(1), &ack);
    assert_eq!(a.in_flight(), 2);
    let more = drain(&mut a, t0 + ms(1));
    assert_eq!(more.iter().map(|t| t.header.seq).collect::<Vec<_>>(), [5, 6]);
    assert_eq!(a.in_flight(), 4);

    // The receiver expects seq 3..=6; it buffers 6 and drops 7.
    deliver(&mut b, t0 + ms(1), &more[1]);
    let beyond = Transmit {
        header: Header { seq: 7, offset: 600, ..more[1].header },
        payload: Some(PayloadRef { offset: 600, ..more[1].payload.unwrap() }),
    };
    deliver(&mut b, t0 + ms(1), &beyond);
    assert_eq!(b.stats().out_of_window, 1);
    let acks = drain(&mut b, t0 + ms(1));
    let last = acks.last().unwrap().header;
    // Seq 6 is ack + 1 + 2.
    assert_eq!((last.ack, last.sack), (3, 0b100));
}

#[test]
fn no_ack_goes_between_the_packets_of_a_message_unless_the_window_needs_it() {
    let t0 = Time::default();
    let config = Config { window: 16, max_payload: 100, ..Config::default() };
    let (mut a, mut b) = pair(config, t0);
    a.send(msg(1, 1000)).unwrap();
    let packets = drain(&mut a, t0);
    assert_eq!(packets.len(), 10);

    // Two packets of a message in progress: nothing is owed, busy or idle.
    for t in &packets[..2] {
        deliver(&mut b, t0, t);
    }
    assert!(!b.ack_owed());
    assert!(b.poll_transmit(t0).is_none());

    // A quarter of the window (4) unacknowledged, with 6 more to come, is
    // more than half the window before the message ends: urgent, even busy.
    deliver(&mut b, t0, &packets[2]);
    assert!(b.poll_transmit_busy(t0).is_none());
    deliver(&mut b, t0, &packets[3]);
    let ack = b.poll_transmit_busy(t0).expect("an urgent ACK");
    assert_eq!((ack.header.kind, ack.header.ack), (Kind::Ack, 5));

    // Four more with two to come fit in half the window: held, busy or idle.
    for t in &packets[4..9] {
        deliver(&mut b, t0, t);
        assert!(b.poll_transmit(t0).is_none(), "held at seq {}", t.header.seq);
    }
    // The last packet ends the message: the ACK is owed, for a reply to
    // carry; an idle receiver sends it.
    deliver(&mut b, t0, &packets[9]);
    assert!(b.ack_owed());
    assert!(b.poll_transmit_busy(t0).is_none());
    let ack = b.poll_transmit(t0).expect("the ACK of the message");
    assert_eq!((ack.header.kind, ack.header.ack), (Kind::Ack, 11));
    assert!(!b.ack_owed());

    // Half the window unacknowledged is urgent, message or not.
    deliver(&mut a, t0, &ack);
    a.send(msg(2, 800)).unwrap();
    let packets = drain(&mut a, t0);
    for t in &packets[..7] {
        deliver(&mut b, t0, t);
        assert!(b.poll_transmit_busy(t0).is_none(), "held at seq {}", t.header.seq);
    }
    deliver(&mut b, t0, &packets[7]);
    let ack = b.poll_transmit_busy(t0).expect("an urgent ACK");
    assert_eq!((ack.header.kind, ack.header.ack), (Kind::Ack, 19));
}

#[test]
fn a_busy_receiver_holds_an_owed_ack_until_it_is_idle_or_a_reply_carries_it() {
    let t0 = Time::default();
    let config = Config { window: 16, max_payload: 100, ..Config::default() };
    let (mut a, mut b) = pair(config.clone(), t0);
    a.send(msg(1, 100)).unwrap();
    a.send(msg(2, 100)).unwrap();
    let packets = drain(&mut a, t0);
    assert_eq!(packets.len(), 2);

    // Two messages reach ack_every: the ACK is owed, and a busy receiver holds it.
    for t in &packets {
        deliver(&mut b, t0, t);
    }
    assert!(b.ack_owed());
    assert!(b.poll_transmit_busy(t0).is_none());
    // Idle, it sends it.
    let ack = b.poll_transmit(t0).expect("the owed ACK");
    assert_eq!((ack.header.kind, ack.header.ack), (Kind::Ack, 3));
    assert!(!b.ack_owed());
    assert!(b.poll_transmit(t0).is_none());

    // Two more: a reply carries the owed ACK, no pure ACK goes.
    a.send(msg(3, 100)).unwrap();
    a.send(msg(4, 100)).unwrap();
    for t in &drain(&mut a, t0) {
        deliver(&mut b, t0, t);
    }
    assert!(b.ack_owed());
    b.send(msg(5, 50)).unwrap();
    let reply: Vec<_> = std::iter::from_fn(|| b.poll_transmit_busy(t0)).collect();
    assert_eq!(reply.len(), 1);
    assert_eq!((reply[0].header.kind, reply[0].header.ack), (Kind::Data, 5));
    assert!(!b.ack_owed());

    // Held and forgotten, the ACK still goes when the delay runs out.
    let (mut a, mut b) = pair(config.clone(), t0);
    a.send(msg(3, 200)).unwrap();
    for t in &drain(&mut a, t0) {
        deliver(&mut b, t0, t);
    }
    assert!(b.poll_transmit_busy(t0).is_none());
    assert_eq!(b.poll_timeout(), Some(t0 + config.ack_delay));
    b.handle_timeout(t0 + config.ack_delay);
    let ack = b.poll_transmit_busy(t0 + config.ack_delay).expect("the delayed ACK");
    assert_eq!((ack.header.kind, ack.header.ack), (Kind::Ack, 3));
}

/// A pair whose first end has sent three messages of one packet each.
fn three_one_packet_messages(t0: Time) -> (Session, Session, Vec<Transmit>) {
    let config = Config { window: 16, max_payload: 100, ..Config::default() };
    let (mut a, b) = pair(config, t0);
    for token in 1..=3 {
        a.send(msg(token, 100)).unwrap();
    }
    let p = drain(&mut a, t0);
    (a, b, p)
}

/// `three_one_packet_messages`, all three delivered to `b` while it holds
/// its acknowledgements.
fn three_arrived_while_acks_are_held(t0: Time) -> (Session, Session, Vec<Transmit>) {
    let (a, mut b, p) = three_one_packet_messages(t0);
    b.hold_acks();
    for t in &p {
        deliver(&mut b, t0, t);
    }
    (a, b, p)
}

#[test]
fn held_acks_cover_only_what_arrived_before_the_hold_until_released() {
    let t0 = Time::default();
    let (mut a, mut b, p) = three_one_packet_messages(t0);
    assert_eq!(p.len(), 3);
    deliver(&mut b, t0, &p[0]);

    // Held after seq 1: packets say ack 2 and no SACK, and no pure ACK goes
    // however much is owed, or the delay runs out.
    b.hold_acks();
    assert!(!b.acks_held());
    deliver(&mut b, t0, &p[2]);
    deliver(&mut b, t0, &p[1]);
    assert!(b.acks_held());
    assert!(b.poll_transmit(t0 + ms(1)).is_none());
    b.send(msg(10, 50)).unwrap();
    let reply = drain(&mut b, t0);
    assert_eq!(reply.len(), 1);
    assert_eq!((reply[0].header.ack, reply[0].header.sack), (2, 0));
    deliver(&mut a, t0, &reply[0]);
    assert_eq!(events(&mut a).iter().filter(|e| matches!(e, Event::Sent { .. })).count(), 1);

    // Released: the acknowledgement that fell due goes, covering all three.
    b.release_acks();
    let ack = only_ack(&drain(&mut b, t0 + ms(1)));
    assert_eq!(ack.header.ack, 4);
    deliver(&mut a, t0, &ack);
    assert_eq!(events(&mut a).iter().filter(|e| matches!(e, Event::Sent { .. })).count(), 2);
}

#[test]
fn a_reply_acknowledges_what_the_owner_says_it_placed_while_acks_are_held() {
    let t0 = Time::default();
    let (mut a, mut b, p) = three_arrived_while_acks_are_held(t0);
    // Messages 1 and 2 placed; message 3 (seq 3) not yet.
    b.placed_before(p[2].header.seq);
    assert!(b.acks_held());
    b.send(msg(10, 50)).unwrap();
    let reply = drain(&mut b, t0);
    assert_eq!(reply.len(), 1);
    assert_eq!(reply[0].header.ack, 3);
    deliver(&mut a, t0, &reply[0]);
    assert_eq!(events(&mut a).iter().filter(|e| matches!(e, Event::Sent { .. })).count(), 2);
    // The hold never moves back, nor past what arrived.
    b.placed_before(p[0].header.seq);
    b.placed_before(p[2].header.seq + 5);
    b.send(msg(11, 50)).unwrap();
    assert_eq!(drain(&mut b, t0)[0].header.ack, 3);
}

#[test]
fn a_disconnect_acknowledges_everything_even_while_acks_are_held() {
    let t0 = Time::default();
    let (mut a, mut b) = pair(Config::default(), t0);
    a.send(msg(1, 100)).unwrap();
    let p = drain(&mut a, t0);
    b.hold_acks();
    deliver(&mut b, t0, &p[0]);
    b.disconnect();
    let out = drain(&mut b, t0);
    assert_eq!(out.len(), 1);
    assert_eq!((out[0].header.kind, out[0].header.ack), (Kind::Disconnect, 2));
    deliver(&mut a, t0, &out[0]);
    assert_eq!(events(&mut a), [Event::Sent { token: 1 }, Event::Broken(BreakReason::PeerDisconnect)]);
}

#[test]
fn a_refusing_break_acknowledges_only_the_packets_before_the_refused_one() {
    let t0 = Time::default();
    let (mut a, mut b, p) = three_arrived_while_acks_are_held(t0);
    // The owner placed message 1 and refused message 2 (seq 2).
    b.close_refusing(p[1].header.seq, 7);
    let out = drain(&mut b, t0);
    assert_eq!(out.len(), 1);
    assert_eq!((out[0].header.kind, out[0].header.status, out[0].header.ack), (Kind::Break, 7, 2));
    deliver(&mut a, t0, &out[0]);
    assert_eq!(events(&mut a), [Event::Sent { token: 1 }, Event::Broken(BreakReason::PeerBreak(7))]);
}

#[test]
fn a_lost_break_is_said_again_to_the_peers_retransmission() {
    let t0 = Time::default();
    let (mut a, mut b, p) = three_arrived_while_acks_are_held(t0);
    b.close_refusing(p[1].header.seq, 7);
    let out = drain(&mut b, t0);
    assert_eq!(out.len(), 1);
    let word = b.last_word().expect("the BREAK went");
    assert_eq!(word.header, out[0].header);
    // The BREAK is lost: `a` hears nothing and sends its packets again.
    let t = a.poll_timeout().unwrap();
    a.handle_timeout(t);
    let again = drain(&mut a, t);
    assert!(!again.is_empty());
    for r in &again {
        let (h, _) = parsed(r);
        assert!(word.answers(&h), "{h:?} is a packet of the ended connection");
    }
    // The owner of `b` says the word again; `a` completes what `b` placed.
    deliver(&mut a, t, &Transmit { header: word.header, payload: None });
    assert_eq!(events(&mut a), [Event::Sent { token: 1 }, Event::Broken(BreakReason::PeerBreak(7))]);
    // No answer to another connection's packets, nor to the peer's own last word.
    let (h, _) = parsed(&again[0]);
    assert!(!word.answers(&Header { key: h.key ^ 1, ..h }));
    assert!(!word.answers(&Header { src_vi: h.src_vi + 1, ..h }));
    assert!(!word.answers(&Header { kind: Kind::Break, ..h }));
    assert!(!word.answers(&Header { kind: Kind::Disconnect, ..h }));
    // A session that ended without a word (the peer's break) keeps none.
    assert_eq!(a.last_word(), None);
}

#[test]
fn sack_spares_received_packets_from_retransmission() {
    let t0 = Time::default();
    let config = Config { max_payload: 10, ..Config::default() };
    let (mut a, mut b) = pair(config, t0);
    a.send(msg(7, 40)).unwrap();
    let p = drain(&mut a, t0);
    assert_eq!(p.len(), 4);
    // Seq 2 is lost.
    for i in [0, 2, 3] {
        deliver(&mut b, t0 + ms(1), &p[i]);
    }
    let acks = drain(&mut b, t0 + ms(1));
    let last = acks.last().unwrap().header;
    assert_eq!((last.ack, last.sack), (2, 0b11));
    for t in &acks {
        deliver(&mut a, t0 + ms(2), t);
    }
    // Two later packets acknowledged: not yet a fast retransmit.
    assert!(drain(&mut a, t0 + ms(2)).is_empty());
    assert_eq!(a.in_flight(), 3);
    // The acknowledged packets gave a 2 ms sample: 2 + 4 * 1 + 0.2 ms.
    let t = a.poll_timeout().unwrap();
    assert_eq!(t, t0 + us(6200));
    a.handle_timeout(t);
    let r = drain(&mut a, t);
    assert_eq!(r.len(), 1, "only the hole is sent again");
    assert_eq!(r[0].header.seq, 2);
    assert_eq!(r[0].payload.unwrap().offset, 10);
    deliver(&mut b, t + ms(1), &r[0]);
    let got: Vec<u8> = events(&mut b)
        .into_iter()
        .flat_map(|e| match e {
            Event::Segment { data, .. } => data,
            e => panic!("{e:?}"),
        })
        .collect();
    assert_eq!(got, gather(Some(PayloadRef { token: 7, offset: 0, len: 40 })));
    let ack = only_ack(&drain(&mut b, t + ms(1)));
    assert_eq!((ack.header.ack, ack.header.sack), (5, 0));
    deliver(&mut a, t + ms(2), &ack);
    assert_eq!(events(&mut a), [Event::Sent { token: 7 }]);
    assert_eq!(a.in_flight(), 0);
}

#[test]
fn a_hole_is_retransmitted_fast_after_three_later_packets() {
    let t0 = Time::default();
    let config = Config { max_payload: 10, ..Config::default() };
    let (mut a, mut b) = pair(config, t0);
    a.send(msg(3, 50)).unwrap();
    let p = drain(&mut a, t0);
    assert_eq!(p.len(), 5);
    for i in [0, 2, 3, 4] {
        deliver(&mut b, t0 + ms(1), &p[i]);
    }
    let acks = drain(&mut b, t0 + ms(1));
    assert_eq!(acks.last().unwrap().header.sack, 0b111);
    for t in &acks {
        deliver(&mut a, t0 + ms(2), t);
    }
    // Long before the 10 ms timeout.
    let r = drain(&mut a, t0 + ms(2));
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].header.seq, 2);
    assert_eq!(a.stats().retransmits, 1);
    // Acks of the retransmission do not trigger it again.
    deliver(&mut b, t0 + ms(3), &r[0]);
    let ack = only_ack(&drain(&mut b, t0 + ms(3)));
    assert_eq!(ack.header.ack, 6);
    deliver(&mut a, t0 + ms(4), &ack);
    assert!(drain(&mut a, t0 + ms(4)).is_empty());
    assert_eq!(a.stats().retransmits, 1);
    assert_eq!(events(&mut a), [Event::Sent { token: 3 }]);
}

#[test]
fn packets_with_a_wrong_key_or_vi_are_counted_and_ignored() {
    let t0 = Time::default();
    let (mut a, mut b) = pair(Config::default(), t0);
    a.send(msg(1, 5)).unwrap();
    let p = drain(&mut a, t0)[0];
    for bad in [
        Header { key: B.key ^ 1, ..p.header },
        Header { key: A.key, ..p.header },
        Header { src_vi: 99, ..p.header },
        Header { dst_vi: A.vi, ..p.header },
    ] {
        deliver(&mut b, t0, &Transmit { header: bad, ..p });
    }
    assert_eq!(b.stats().bad_key, 4);
    assert_eq!(b.stats().packets_received, 0);
    assert!(events(&mut b).is_empty());
    assert!(drain(&mut b, t0).is_empty());
    deliver(&mut b, t0, &p);
    assert_eq!(b.stats().packets_received, 1);
    assert!(matches!(events(&mut b).as_slice(), [Event::Segment { first: true, last: true, .. }]));
    // A forged BREAK does not break anything.
    let brk = Header { kind: Kind::Break, key: 12345, seq: 2, ..p.header };
    b.handle_packet(t0, &brk, &[]);
    assert!(!b.is_closed());
}

#[test]
fn without_the_payload_crc_packets_say_so_and_a_checking_session_refuses_them() {
    let t0 = Time::default();
    let unchecked = Config { payload_crc: false, ..Config::default() };
    let (mut a, mut b) = pair(unchecked.clone(), t0);
    a.send(msg(1, 300)).unwrap();
    let p = drain(&mut a, t0)[0];
    assert_eq!(p.header.flags, FLAG_FIRST | FLAG_LAST | FLAG_RELIABLE | FLAG_HEADER_CRC);
    // The checksum covers the header alone: a changed payload byte passes
    // (UDP's checksum is what guards it), a changed header byte does not.
    let bytes = via_wire::encode(&p.header, &gather(p.payload));
    let mut payload_hit = bytes.clone();
    payload_hit[via_wire::HEADER_LEN + 5] ^= 1;
    assert!(Packet::new_checked(&payload_hit[..]).is_ok());
    let mut header_hit = bytes.clone();
    header_hit[40] ^= 1;
    assert!(Packet::new_checked(&header_hit[..]).is_err());
    deliver(&mut b, t0, &p);
    assert!(matches!(events(&mut b).as_slice(), [Event::Segment { first: true, last: true, .. }]));

    // A session that checksums payloads refuses the same packet unread.
    let mut checking = Session::new(Config::default(), B, A, t0);
    deliver(&mut checking, t0, &p);
    assert_eq!(checking.stats().invalid, 1);
    assert_eq!(checking.stats().packets_received, 0);
    assert!(events(&mut checking).is_empty());
    // ...and a session that does not still takes packets checked whole.
    let (mut c, _) = pair(Config::default(), t0);
    c.send(msg(2, 300)).unwrap();
    let q = drain(&mut c, t0)[0];
    assert_eq!(q.header.flags & FLAG_HEADER_CRC, 0);
    let mut d = Session::new(unchecked, B, A, t0);
    deliver(&mut d, t0, &q);
    assert!(matches!(events(&mut d).as_slice(), [Event::Segment { first: true, last: true, .. }]));
}

#[test]
fn bulk_transfer_of_10k_messages_at_1_percent_loss() {
    let script = Script {
        net: SimConfig {
            seed: 42,
            loss: 0.01,
            delay_min: us(20),
            delay_max: us(80),
            reorder: 0.001,
            ..SimConfig::default()
        },
        session: Config::default(),
        messages: 10_000,
        spread: ms(500),
        time_limit: Duration::from_secs(120),
        rdma_reads: false,
    };
    let o = run(&script);
    assert!(o.violations.is_empty(), "{o}");
    assert!(o.completed, "{o}");
    assert_eq!(o.delivered, [10_000, 10_000]);
    let sent = o.stats[0].packets_sent + o.stats[1].packets_sent;
    let retx = o.stats[0].retransmits + o.stats[1].retransmits;
    // Every loss costs about one retransmission; allow for reordering by
    // the delay jitter and lost ACKs, but nothing like a storm.
    assert!(retx <= 4 * o.net.lost + 50, "{retx} retransmits for {} losses: {o}", o.net.lost);
    assert!(retx * 100 <= sent * 5, "{retx} of {sent}");
    println!("bulk: {} packets, {} lost, {retx} retransmits, {:?} virtual", o.net.sent, o.net.lost, o.elapsed);
}

#[test]
fn close_and_disconnect_reach_the_peer() {
    let t0 = Time::default();
    let (mut a, mut b) = pair(Config::default(), t0);
    a.close(77);
    assert!(a.is_closed());
    assert_eq!(events(&mut a), [Event::Broken(BreakReason::Local(77))]);
    let out = drain(&mut a, t0);
    assert_eq!(out.len(), 1);
    assert_eq!((out[0].header.kind, out[0].header.status), (Kind::Break, 77));
    deliver(&mut b, t0, &out[0]);
    assert_eq!(events(&mut b), [Event::Broken(BreakReason::PeerBreak(77))]);
    assert!(b.is_closed());
    // The peer's own reason is not echoed back.
    assert!(drain(&mut b, t0).is_empty());
    // Closing twice changes nothing.
    a.close(78);
    assert!(events(&mut a).is_empty());
    assert!(drain(&mut a, t0).is_empty());

    let (mut a, mut b) = pair(Config::default(), t0);
    a.send(msg(1, 3)).unwrap();
    a.disconnect();
    assert!(a.is_closed());
    assert!(events(&mut a).is_empty());
    let out = drain(&mut a, t0);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].header.kind, Kind::Disconnect);
    deliver(&mut b, t0, &out[0]);
    assert_eq!(events(&mut b), [Event::Broken(BreakReason::PeerDisconnect)]);
    assert_eq!(a.send(msg(2, 1)), Err(SendError::Closed));
}

#[test]
fn keepalives_keep_an_idle_connection_alive_and_silence_breaks_it() {
    let t0 = Time::default();
    let (mut a, mut b) = pair(Config::default(), t0);
    let mut now = t0;
    let mut probes = 0;
    // Runs `x`'s timers and answers its probes from `y`.
    fn tick(x: &mut Session, y: &mut Session, now: Time) -> usize {
        let mut probes = 0;
        if x.poll_timeout().unwrap() <= now {
            x.handle_timeout(now);
        }
        for t in drain(x, now) {
            probes += usize::from(t.header.kind == Kind::KeepAlive);
            deliver(y, now, &t);
            for r in drain(y, now) {
                assert_eq!(r.header.kind, Kind::Ack);
                deliver(x, now, &r);
            }
        }
        probes
    }
    // A minute of idleness over a perfect link.
    while now < t0 + Duration::from_secs(60) {
        now = a.poll_timeout().unwrap().min(b.poll_timeout().unwrap());
        probes += tick(&mut a, &mut b, now);
        probes += tick(&mut b, &mut a, now);
    }
    assert!(!a.is_closed() && !b.is_closed());
    assert!((50..=130).contains(&probes), "{probes} probes");

    // Nobody answers: probes every second, then the idle timeout.
    let (mut a, _b) = pair(Config::default(), t0);
    let mut probe_times = Vec::new();
    while let Some(t) = a.poll_timeout() {
        a.handle_timeout(t);
        for x in drain(&mut a, t) {
            match x.header.kind {
                Kind::KeepAlive => probe_times.push((t - t0).as_secs()),
                Kind::Break => assert_eq!(x.header.status, via_wire::BREAK_IDLE),
                k => panic!("{k}"),
            }
        }
    }
    assert_eq!(probe_times, (1..=9).collect::<Vec<_>>());
    assert_eq!(events(&mut a), [Event::Broken(BreakReason::Idle)]);
}

#[test]
fn unreliable_delivers_whole_messages_or_nothing() {
    let t0 = Time::default();
    let config = Config { reliable: false, max_payload: 10, ..Config::default() };
    let (mut a, mut b) = pair(config, t0);
    a.send(msg(1, 30)).unwrap();
    a.send(msg(2, 5)).unwrap();
    a.send(msg(3, 25)).unwrap();
    let p = drain(&mut a, t0);
    assert_eq!(p.len(), 7);
    assert!(p.iter().all(|t| t.header.flags & FLAG_RELIABLE == 0));
    // Sent as soon as the last packet was handed out; nothing waits for acks.
    assert_eq!(events(&mut a), [1, 2, 3].map(|token| Event::Sent { token }));
    assert_eq!(a.in_flight(), 0);
    assert_eq!(a.queued_messages(), 0);
    // Message 1 loses its middle packet; message 3 arrives whole.
    for i in [0, 2, 3, 4, 5, 6] {
        deliver(&mut b, t0, &p[i]);
    }
    // The missing packet turns up late, twice.
    deliver(&mut b, t0, &p[1]);
    deliver(&mut b, t0, &p[1]);
    deliver(&mut b, t0, &p[3]);
    let got = events(&mut b);
    assert_eq!(got.len(), 2, "{got:?}");
    for (e, (m, token, len)) in got.iter().zip([(2u32, 2u64, 5u32), (3, 3, 25)]) {
        match e {
            Event::Segment { msg, offset: 0, total, first: true, last: true, data, .. } => {
                assert_eq!((*msg, *total), (m, len));
                assert_eq!(*data, gather(Some(PayloadRef { token, offset: 0, len })));
            }
            e => panic!("{e:?}"),
        }
    }
    assert_eq!(b.stats().duplicates, 3);
    // Unreliable receivers send no ACKs for data.
    assert!(drain(&mut b, t0).is_empty());
}

#[test]
fn hostile_headers_are_dropped_and_counted() {
    let t0 = Time::default();
    let config = Config { max_message: 1 << 20, ..Config::default() };
    let (mut a, mut b) = pair(config, t0);
    let base = Header {
        kind: Kind::Data,
        flags: FLAG_FIRST | FLAG_LAST | FLAG_RELIABLE,
        dst_vi: B.vi,
        src_vi: A.vi,
        key: B.key,
        seq: 1,
        ack: 1,
        msg: 1,
        total: 4,
        window: 256,
        ..Header::default()
    };
    let hostile = [
        // Offset far beyond the message.
        Header { offset: u32::MAX - 1, flags: FLAG_RELIABLE, ..base },
        // Payload longer than the message.
        Header { total: 2, ..base },
        // FIRST somewhere in the middle.
        Header { offset: 2, total: 6, ..base },
        // LAST where the message does not end.
        Header { total: 100, ..base },
        // A message larger than the limit.
        Header { total: 1 << 21, flags: FLAG_FIRST | FLAG_RELIABLE, ..base },
        // An unreliable packet on a reliable session.
        Header { flags: FLAG_FIRST | FLAG_LAST, ..base },
        // An RDMA read request with payload, or with immediate data.
        Header { kind: Kind::RdmaReadReq, ..base },
        Header { kind: Kind::RdmaReadResp, flags: base.flags | FLAG_IMMEDIATE, ..base },
    ];
    for h in hostile {
        b.handle_packet(t0, &h, &[1, 2, 3, 4]);
    }
    assert_eq!(b.stats().invalid, hostile.len() as u64);
    // A zero-length segment that is not the last one.
    b.handle_packet(t0, &Header { flags: FLAG_FIRST | FLAG_RELIABLE, ..base }, &[]);
    assert_eq!(b.stats().invalid, hostile.len() as u64 + 1);
    assert!(events(&mut b).is_empty());

    // Totals that disagree between segments of one message.
    let s1 = Header { flags: FLAG_FIRST | FLAG_RELIABLE, total: 8, ..base };
    let s2 = Header { seq: 2, flags: FLAG_LAST | FLAG_RELIABLE, offset: 4, total: 9, ..base };
    b.handle_packet(t0, &s1, &[1, 2, 3, 4]);
    b.handle_packet(t0, &s2, &[5, 6, 7, 8, 9]);
    let got = events(&mut b);
    assert_eq!(got.len(), 1, "only the consistent first segment: {got:?}");
    // The wrong message number, or a second FIRST, is refused too.
    b.handle_packet(t0, &Header { seq: 2, msg: 5, ..s2 }, &[5, 6, 7, 8]);
    b.handle_packet(t0, &Header { seq: 2, ..s1 }, &[5, 6, 7, 8]);
    assert!(events(&mut b).is_empty());
    assert_eq!(b.stats().invalid, hostile.len() as u64 + 4);

    // Acknowledgements of packets never sent, and sack bits beyond them.
    a.send(msg(1, 5)).unwrap();
    assert_eq!(drain(&mut a, t0).len(), 1);
    let ack = Header {
        kind: Kind::Ack,
        flags: 0,
        dst_vi: A.vi,
        src_vi: B.vi,
        key: A.key,
        ack: 1000,
        sack: u64::MAX,
        ..Header::default()
    };
    a.handle_packet(t0, &ack, &[]);
    assert_eq!(a.stats().invalid, 1);
    a.handle_packet(t0, &Header { ack: 1, ..ack }, &[]);
    a.handle_packet(t0, &Header { ack: 0x8000_0000, sack: 0, ..ack }, &[]);
    assert_eq!(a.in_flight(), 1);
    assert!(events(&mut a).is_empty());
    a.handle_packet(t0, &Header { ack: 2, ..ack }, &[]);
    assert_eq!(a.in_flight(), 0);
    assert_eq!(events(&mut a), [Event::Sent { token: 1 }]);
    // A zero window cannot stall the session.
    a.handle_packet(t0, &Header { ack: 2, window: 0, ..ack }, &[]);
    a.send(msg(2, 5)).unwrap();
    assert_eq!(drain(&mut a, t0).len(), 1);
}

#[test]
fn rdma_messages_carry_their_fields() {
    let t0 = Time::default();
    let (mut a, mut b) = pair(Config::default(), t0);
    let req = a
        .send(OutMessage {
            kind: MsgKind::RdmaReadRequest { addr: 0x1000, handle: 9, len: 3000 },
            len: 0,
            imm: Some(5),
            token: 1,
        })
        .unwrap();
    a.send(OutMessage { kind: MsgKind::RdmaWrite { addr: 0x2000, handle: 8 }, len: 0, imm: Some(0xfeed), token: 2 })
        .unwrap();
    let p = drain(&mut a, t0);
    assert_eq!(p.len(), 2);
    assert_eq!(p[0].header.kind, Kind::RdmaReadReq);
    assert_eq!(p[0].payload, None);
    assert_eq!(p[0].header.total, 3000);
    assert_eq!(p[1].header.flags, FLAG_FIRST | FLAG_LAST | FLAG_IMMEDIATE | FLAG_RELIABLE);
    for t in &p {
        deliver(&mut b, t0, t);
    }
    assert_eq!(
        events(&mut b),
        [
            Event::Segment {
                kind: MsgKind::RdmaReadRequest { addr: 0x1000, handle: 9, len: 3000 },
                msg: req,
                offset: 0,
                total: 0,
                imm: None,
                first: true,
                last: true,
                seq: p[0].header.seq,
                data: vec![],
            },
            Event::Segment {
                kind: MsgKind::RdmaWrite { addr: 0x2000, handle: 8 },
                msg: req + 1,
                offset: 0,
                total: 0,
                imm: Some(0xfeed),
                first: true,
                last: true,
                seq: p[1].header.seq,
                data: vec![],
            }
        ]
    );
    b.send(OutMessage { kind: MsgKind::RdmaReadResponse { request: req, status: 0 }, len: 3000, imm: None, token: 10 })
        .unwrap();
    let r = drain(&mut b, t0);
    let data = data_packets(&r);
    assert!(data.is_empty());
    let resp: Vec<_> = r.iter().filter(|t| t.header.kind == Kind::RdmaReadResp).collect();
    assert_eq!(resp.len(), 3);
    for t in &resp {
        deliver(&mut a, t0, t);
    }
    let got = events(&mut a);
    let mut bytes = Vec::new();
    for e in &got {
        if let Event::Segment { kind, data, .. } = e {
            assert_eq!(*kind, MsgKind::RdmaReadResponse { request: req, status: 0 });
            bytes.extend_from_slice(data);
        }
    }
    assert_eq!(bytes, gather(Some(PayloadRef { token: 10, offset: 0, len: 3000 })));
}

#[test]
fn sizes_and_limits() {
    let t0 = Time::default();
    let config = Config { max_message: 100, max_payload: 40, ..Config::default() };
    let (mut a, _b) = pair(config, t0);
    assert_eq!(a.send(msg(1, 101)), Err(SendError::TooLarge));
    let read =
        OutMessage { kind: MsgKind::RdmaReadRequest { addr: 0, handle: 0, len: 101 }, len: 0, imm: None, token: 2 };
    assert_eq!(a.send(read), Err(SendError::TooLarge));
    assert_eq!(a.send(msg(3, 0)), Ok(1));
    assert_eq!(a.send(msg(4, 100)), Ok(2));
    assert_eq!(a.queued_messages(), 2);
    let p = drain(&mut a, t0);
    // A zero-length message is one packet without payload.
    assert_eq!(p[0].payload, None);
    assert_eq!(p[0].header.flags, FLAG_FIRST | FLAG_LAST | FLAG_RELIABLE);
    let lens: Vec<u32> = p[1..].iter().map(|t| t.payload.unwrap().len).collect();
    assert_eq!(lens, [40, 40, 20]);
    assert_eq!(p[3].header.flags, FLAG_LAST | FLAG_RELIABLE);
    assert_eq!(a.queued_messages(), 2);
}

#[test]
fn in_place_delivery_returns_in_order_segments_before_released_ones() {
    let t0 = Time::default();
    let config = Config { max_payload: 4, ..Config::default() };
    let (mut a, mut b) = pair(config, t0);
    a.send(msg(7, 12)).unwrap();
    let packets: Vec<(Header, Vec<u8>)> = data_packets(&drain(&mut a, t0)).iter().map(parsed).collect();
    assert_eq!(packets.len(), 3);

    // The third segment arrives first: held, nothing to place.
    let (h3, p3) = &packets[2];
    assert_eq!(b.handle_packet_in_place(t0, h3, p3), None);
    assert!(events(&mut b).is_empty());

    // The first is placed in place; the second is still missing.
    let (h1, p1) = &packets[0];
    let s1 = b.handle_packet_in_place(t0, h1, p1).expect("in order");
    assert_eq!((s1.msg, s1.offset, s1.total, s1.first, s1.last), (1, 0, 12, true, false));
    assert!(events(&mut b).is_empty());

    // The second is returned for placement, and releases the third as an event after it.
    let (h2, p2) = &packets[1];
    let s2 = b.handle_packet_in_place(t0, h2, p2).expect("in order");
    assert_eq!((s2.offset, s2.first, s2.last), (4, false, false));
    match events(&mut b).as_slice() {
        [Event::Segment { offset: 8, last: true, data, .. }] => assert_eq!(data, p3),
        other => panic!("expected the held third segment, got {other:?}"),
    }

    // A duplicate of a placed segment is not returned again.
    assert_eq!(b.handle_packet_in_place(t0, h1, p1), None);
    assert_eq!(b.stats().duplicates, 1);

    // handle_packet queues the same segment as an event with its bytes.
    let (mut c, mut d) = pair(Config::default(), t0);
    c.send(msg(9, 5)).unwrap();
    let (h, p) = parsed(&data_packets(&drain(&mut c, t0))[0]);
    d.handle_packet(t0, &h, &p);
    match events(&mut d).as_slice() {
        [Event::Segment { offset: 0, total: 5, first: true, last: true, data, .. }] => assert_eq!(data, &p),
        other => panic!("expected one whole segment, got {other:?}"),
    }
}

#[test]
fn unreliable_one_packet_messages_are_placed_in_place_once() {
    let t0 = Time::default();
    let (mut a, mut b) = pair(Config { reliable: false, ..Config::default() }, t0);
    a.send(msg(3, 6)).unwrap();
    let (h, p) = parsed(&data_packets(&drain(&mut a, t0))[0]);
    let s = b.handle_packet_in_place(t0, &h, &p).expect("a whole message");
    assert_eq!((s.offset, s.total, s.first, s.last), (0, 6, true, true));
    assert_eq!(b.handle_packet_in_place(t0, &h, &p), None, "never twice");
    assert!(events(&mut b).is_empty());
}
