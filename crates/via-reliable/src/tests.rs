//! Unit tests that reach into the session's state.

use super::*;

const A: Peer = Peer { vi: 1, key: 10 };
const B: Peer = Peer { vi: 2, key: 20 };

/// Moves `x`'s packets to `y`, dropping those `lose` picks by running count.
fn pump(x: &mut Session, y: &mut Session, now: Time, n: &mut u64, lose: &dyn Fn(u64) -> bool) -> bool {
    let mut moved = false;
    while let Some(t) = x.poll_transmit(now) {
        moved = true;
        *n += 1;
        if lose(*n) {
            continue;
        }
        let len = t.payload.map_or(0, |p| p.len) as usize;
        y.handle_packet(now, &t.header, &vec![0x5a; len]);
    }
    moved
}

/// Moves every packet between the two sessions until both are quiet,
/// dropping the packets `lose` picks, and runs timers.
fn exchange(a: &mut Session, b: &mut Session, mut now: Time, lose: &dyn Fn(u64) -> bool) -> Time {
    let mut n = 0u64;
    for _ in 0..10_000 {
        let moved = pump(a, b, now, &mut n, lose) | pump(b, a, now, &mut n, lose);
        if !moved {
            if a.queued_messages() == 0 && b.queued_messages() == 0 {
                return now;
            }
            let t = [a.poll_timeout(), b.poll_timeout()].into_iter().flatten().min().unwrap();
            now = now.max(t);
            a.handle_timeout(now);
            b.handle_timeout(now);
        }
    }
    panic!("no progress");
}

#[test]
fn sequence_numbers_wrap() {
    let t0 = Time::default();
    let config = Config { max_payload: 8, window: 8, ..Config::default() };
    let mut a = Session::new(config.clone(), A, B, t0);
    let mut b = Session::new(config, B, A, t0);
    let start = u32::MAX - 20;
    a.snd_una = start;
    a.snd_nxt = start;
    b.rcv_next = start;
    for token in 0..20 {
        a.send(OutMessage { kind: MsgKind::Send, len: 20, imm: None, token }).unwrap();
    }
    // Lose every seventh packet, either direction.
    exchange(&mut a, &mut b, t0, &|n| n % 7 == 0);
    let mut sent = 0;
    while let Some(e) = a.poll_event() {
        assert_eq!(e, Event::Sent { token: sent });
        sent += 1;
    }
    assert_eq!(sent, 20);
    let mut bytes = 0;
    let mut msgs = 0;
    while let Some(e) = b.poll_event() {
        match e {
            Event::Segment { data, last, msg, .. } => {
                bytes += data.len();
                if last {
                    msgs += 1;
                    assert_eq!(msg, msgs);
                }
            }
            e => panic!("{e:?}"),
        }
    }
    assert_eq!((msgs, bytes), (20, 400));
    // 60 packets from u32::MAX - 20 on: the counters went round.
    assert!(a.snd_una < 100 && b.rcv_next == a.snd_una);
    assert!(a.stats().retransmits > 0);
    // What a port adds to its counters after each flush: the same counts.
    for s in [&a, &b] {
        let (all, losses) = (s.stats(), s.loss_counts());
        assert_eq!(
            (losses.retransmits, losses.duplicates, losses.bad_key),
            (all.retransmits, all.duplicates, all.bad_key)
        );
    }
    assert!(b.loss_counts().duplicates > 0 || a.loss_counts().duplicates > 0);
}

#[test]
fn unreliable_sequence_numbers_wrap() {
    let t0 = Time::default();
    let config = Config { reliable: false, max_payload: 8, ..Config::default() };
    let mut a = Session::new(config.clone(), A, B, t0);
    let mut b = Session::new(config, B, A, t0);
    a.snd_nxt = u32::MAX - 3;
    b.rcv_next = u32::MAX - 3;
    for token in 0..5 {
        a.send(OutMessage { kind: MsgKind::Send, len: 20, imm: None, token }).unwrap();
    }
    exchange(&mut a, &mut b, t0, &|_| false);
    let delivered = std::iter::from_fn(|| b.poll_event()).count();
    assert_eq!(delivered, 5);
}

#[test]
fn order_tracking_keeps_the_three_largest() {
    let mut o = [0; 3];
    for x in [5, 1, 9, 3, 7, 8, 2] {
        insert_order(&mut o, x);
    }
    assert_eq!(o, [9, 8, 7]);
}

/// A lone packet is acknowledged only after the delay, unless the receiver
/// asks for it now (its application is away); with nothing unacknowledged,
/// asking sends nothing.
#[test]
fn a_delayed_acknowledgement_goes_at_once_when_asked_for() {
    let t0 = Time::default();
    let config = Config::default();
    let mut a = Session::new(config.clone(), A, B, t0);
    let mut b = Session::new(config, B, A, t0);
    assert!(!b.ack_pending());
    b.acknowledge_now();
    assert!(b.poll_transmit(t0).is_none(), "nothing to acknowledge");
    a.send(OutMessage { kind: MsgKind::Send, len: 4, imm: None, token: 0 }).unwrap();
    let t = a.poll_transmit(t0).expect("the message");
    b.handle_packet(t0, &t.header, &[1, 2, 3, 4]);
    // One packet: less than `ack_every`, so the acknowledgement waits.
    assert!(b.ack_pending() && !b.ack_owed());
    assert!(b.poll_transmit(t0).is_none(), "the acknowledgement waits for its delay");
    b.acknowledge_now();
    let ack = b.poll_transmit(t0).expect("the acknowledgement, at once");
    assert_eq!(ack.header.kind, Kind::Ack);
    assert_eq!(ack.header.ack, t.header.seq.wrapping_add(1));
    assert!(!b.ack_pending());
    assert!(b.poll_transmit(t0).is_none());
}

/// `poll_transmit` skips its call when the inline checks find nothing to
/// send: through a lossy exchange with timeouts, both kinds of poll, every
/// time they say so `transmit` itself finds nothing either.
#[test]
fn nothing_to_transmit_never_hides_a_packet() {
    let t0 = Time::default();
    let config = Config { max_payload: 8, window: 8, ..Config::default() };
    let mut a = Session::new(config.clone(), A, B, t0);
    let mut b = Session::new(config, B, A, t0);
    for token in 0..40 {
        a.send(OutMessage { kind: MsgKind::Send, len: 1 + (token as u32 * 7) % 30, imm: None, token }).unwrap();
        if token % 3 == 0 {
            b.send(OutMessage { kind: MsgKind::Send, len: 5, imm: None, token }).unwrap();
        }
    }
    let (mut now, mut n, mut quiet, mut sent) = (t0, 0u64, 0, 0);
    let lose = |n: u64| n.is_multiple_of(5) || n.is_multiple_of(11);
    for round in 0..20_000 {
        let owed_too = round % 2 == 0;
        let mut moved = false;
        for from_a in [true, false] {
            let (x, y) = if from_a { (&mut a, &mut b) } else { (&mut b, &mut a) };
            loop {
                let nothing = x.nothing_to_transmit(now, owed_too);
                let Some(t) = x.transmit(now, owed_too) else {
                    quiet += usize::from(nothing);
                    break;
                };
                assert!(!nothing, "round {round}: a {:?} packet was there", t.header.kind);
                (moved, sent, n) = (true, sent + 1, n + 1);
                if !lose(n) {
                    let len = t.payload.map_or(0, |p| p.len) as usize;
                    y.handle_packet(now, &t.header, &vec![0x5a; len]);
                }
            }
        }
        if !moved {
            if a.queued_messages() == 0 && b.queued_messages() == 0 && !a.ack_pending() && !b.ack_pending() {
                break;
            }
            let t = [a.poll_timeout(), b.poll_timeout()].into_iter().flatten().min().unwrap();
            now = now.max(t);
            // Now and then the polls, not the timers, find a deadline passed.
            if round % 4 != 1 {
                a.handle_timeout(now);
                b.handle_timeout(now);
            }
        }
    }
    assert_eq!((a.queued_messages(), b.queued_messages()), (0, 0), "everything went");
    assert!(quiet > 100 && sent > 100, "both answers were asked for: {quiet} quiet, {sent} sent");
    assert!(a.stats().retransmits > 0 && b.stats().acks_sent > 0);
    // A closed session's last word goes too.
    a.disconnect();
    assert!(!a.nothing_to_transmit(now, false));
    assert_eq!(a.poll_transmit_busy(now).map(|t| t.header.kind), Some(Kind::Disconnect));
}

/// `quiet` is what a flush would find: nothing to send and no event.  A
/// receiver that holds its acknowledgement while it places a message has
/// the message's event until it takes it, then is quiet until it releases
/// the acknowledgement, which then goes.
#[test]
fn quiet_means_no_packet_and_no_event() {
    let t0 = Time::default();
    let config = Config { max_payload: 8, window: 8, ack_every: 1, ..Config::default() };
    let mut a = Session::new(config.clone(), A, B, t0);
    let mut b = Session::new(config, B, A, t0);
    assert!(a.quiet(t0, true) && b.quiet(t0, true));
    a.send(OutMessage { kind: MsgKind::Send, len: 4, imm: None, token: 7 }).unwrap();
    assert!(!a.quiet(t0, true) && !a.quiet(t0, false), "a message to send");
    let t = a.poll_transmit(t0).unwrap();
    b.hold_acks();
    b.handle_packet(t0, &t.header, &[1, 2, 3, 4]);
    assert!(!b.quiet(t0, false), "the message's event waits");
    assert!(matches!(b.poll_event(), Some(Event::Segment { last: true, .. })));
    assert!(b.quiet(t0, false) && b.quiet(t0, true), "the acknowledgement is held");
    assert!(b.poll_transmit(t0).is_none());
    b.release_acks();
    assert!(b.quiet(t0, false), "owed, not urgent: a busy receiver holds it");
    assert!(!b.quiet(t0, true));
    let ack = b.poll_transmit(t0).unwrap();
    assert_eq!(ack.header.kind, Kind::Ack);
    assert!(b.quiet(t0, true));
    a.handle_packet(t0, &ack.header, &[]);
    assert!(!a.quiet(t0, true), "the sent event waits");
    assert_eq!(a.poll_event(), Some(Event::Sent { token: 7 }));
    assert!(a.quiet(t0, true));
}
