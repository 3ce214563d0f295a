//! Flow control over fixed-size pre-posted receive descriptors, after
//! NetPIPE-VIA.
//!
//! Each side of a VI keeps a ring of `R` receive descriptors posted.  A
//! message of either kind consumes one of the peer's, so a side may send only
//! while it holds *credits*: receives the peer has posted that it has not
//! used yet.  A receiver posts every descriptor again once it has handled the
//! message (after its answer, if it sends one, and before it waits for the
//! next), and announces the reposted ones to the peer in the immediate data
//! of the next message it sends ([`Immediate`]).  When it has nothing to
//! send and has reposted half its ring without telling the peer, it sends a
//! *continue* message: a zero-byte send that carries only the grant.
//!
//! Data needs two credits and a continue one, so a continue can always be
//! sent: whichever side is blocked, the other holds at least `R - 1`
//! unannounced descriptors and one credit, and sends a continue the next time
//! it handles a message.  Blocks larger than a descriptor are split into
//! descriptor-sized chunks ([`chunks`]).

/// Immediate data of a message: the grant it carries, and whether it is a
/// continue (flow-control only) message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Immediate {
    /// Receive descriptors reposted since the last grant.
    pub grant: u32,
    /// A continue message: no data, only the grant.
    pub control: bool,
}

const CONTROL_BIT: u32 = 1 << 31;

/// The smallest receive ring the flow control works with.
pub const MIN_RING: u32 = 3;
const GRANT_MASK: u32 = 0xFFFF;

impl Immediate {
    /// The 32-bit `ImmediateData` word.
    pub fn encode(self) -> u32 {
        debug_assert!(self.grant <= GRANT_MASK);
        (self.grant & GRANT_MASK) | if self.control { CONTROL_BIT } else { 0 }
    }
    /// Parses an `ImmediateData` word.
    pub fn decode(word: u32) -> Immediate {
        Immediate { grant: word & GRANT_MASK, control: word & CONTROL_BIT != 0 }
    }
}

/// The credit state of one side of one VI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credits {
    /// Receive descriptors each side keeps posted.
    pub ring: u32,
    /// Unannounced reposts that trigger a continue message.
    pub threshold: u32,
    /// Messages this side may still send.
    pub credits: u32,
    /// Receives reposted and not yet announced to the peer.
    pub pending: u32,
    /// Continue messages sent.
    pub continues_sent: u64,
    /// Times a sender had to wait for credits.
    pub stalls: u64,
}

impl Credits {
    /// Both sides start with `ring` receives posted (at least 3).
    ///
    /// A continue goes once half the ring, and at least two descriptors,
    /// wait to be announced: a lone continue never makes the peer answer
    /// with another, and the threshold stays below the ring size.
    pub fn new(ring: u32) -> Credits {
        assert!(ring >= MIN_RING, "the flow control needs at least {MIN_RING} receive descriptors");
        Credits { ring, threshold: (ring / 2).max(2), credits: ring, pending: 0, continues_sent: 0, stalls: 0 }
    }

    /// Whether a data message may go now.
    pub fn can_send_data(&self) -> bool {
        self.credits >= 2
    }

    /// Spends a credit on a message; returns its immediate data.
    pub fn on_send(&mut self, control: bool) -> Immediate {
        assert!(self.credits >= if control { 1 } else { 2 }, "sent without credit");
        self.credits -= 1;
        let grant = std::mem::take(&mut self.pending);
        if control {
            self.continues_sent += 1;
        }
        Immediate { grant, control }
    }

    /// A message arrived: takes its grant.
    pub fn on_receive(&mut self, imm: Immediate) {
        self.credits += imm.grant;
        debug_assert!(self.credits <= self.ring);
    }

    /// A receive descriptor was posted again.
    pub fn on_repost(&mut self) {
        self.pending += 1;
        debug_assert!(self.pending <= self.ring);
    }

    /// Whether a continue message should go now.
    pub fn wants_continue(&self) -> bool {
        self.pending >= self.threshold && self.credits >= 1
    }
}

/// The chunks of a block of `len` bytes over descriptors of `desc` bytes:
/// `(offset, length)` pairs; a zero-byte block is one empty chunk.
pub fn chunks(len: usize, desc: usize) -> impl Iterator<Item = (usize, usize)> {
    assert!(desc > 0);
    let n = chunk_count(len, desc);
    (0..n).map(move |i| (i * desc, (len - i * desc).min(desc)))
}

/// How many chunks a block of `len` bytes takes.
pub fn chunk_count(len: usize, desc: usize) -> usize {
    // A block of one descriptor needs no division.
    if len <= desc {
        1
    } else {
        len.div_ceil(desc)
    }
}

/// Where the next posted receive buffer goes: descriptor-sized slots of an
/// area, taken in turn and wrapping, so that the last `area / desc` chunks
/// received are all still there to be checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    slots: usize,
    next: usize,
}

impl Cursor {
    /// An area of `slots` slots.
    pub fn new(slots: usize) -> Cursor {
        assert!(slots > 0);
        Cursor { slots, next: 0 }
    }
    /// The slot for the next receive.
    pub fn take(&mut self) -> usize {
        let s = self.next;
        self.next = (self.next + 1) % self.slots;
        s
    }
}

/// Slots of the receive area.  When every block fits one descriptor, all
/// receives share one buffer, as NetPIPE receives every block into the
/// same one (a block is checked when it arrives, before another can land).
/// Otherwise every posted descriptor gets its own slot, and a whole block
/// of `max_block` bytes fits without wrapping onto itself.
pub fn receive_slots(ring: usize, desc: usize, max_block: usize) -> usize {
    match chunk_count(max_block, desc) {
        1 => 1,
        n => ring.max(n) + 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn immediate_round_trips() {
        for imm in [
            Immediate { grant: 0, control: false },
            Immediate { grant: 1, control: true },
            Immediate { grant: 1024, control: false },
            Immediate { grant: 0xFFFF, control: true },
        ] {
            assert_eq!(Immediate::decode(imm.encode()), imm);
        }
        assert_eq!(Immediate { grant: 5, control: true }.encode(), 0x8000_0005);
    }

    #[test]
    #[should_panic]
    fn rings_below_three_are_refused() {
        Credits::new(2);
    }

    #[test]
    fn a_lone_continue_is_not_answered() {
        let mut c = Credits::new(3);
        c.on_send(false);
        c.on_receive(Immediate { grant: 1, control: true });
        c.on_repost();
        assert!(!c.wants_continue());
    }

    #[test]
    fn data_keeps_one_credit_for_a_continue() {
        let mut c = Credits::new(4);
        assert!(c.can_send_data());
        c.on_send(false);
        c.on_send(false);
        c.on_send(false);
        assert_eq!(c.credits, 1);
        assert!(!c.can_send_data());
        // The last credit is still good for a continue.
        c.pending = 2;
        assert!(c.wants_continue());
        let imm = c.on_send(true);
        assert_eq!(imm, Immediate { grant: 2, control: true });
        assert_eq!((c.credits, c.pending, c.continues_sent), (0, 0, 1));
        assert!(!c.wants_continue());
    }

    #[test]
    fn grants_come_back_with_messages() {
        let mut c = Credits::new(8);
        for _ in 0..7 {
            c.on_send(false);
        }
        assert_eq!(c.credits, 1);
        c.on_receive(Immediate { grant: 4, control: true });
        assert_eq!((c.credits, c.pending), (5, 0));
        c.on_repost();
        let imm = c.on_send(false);
        assert_eq!(imm.grant, 1);
        assert_eq!(c.pending, 0);
    }

    /// Two sides exchange blocks of many chunks over a lossless in-order
    /// channel; whatever the pattern, neither side may be stuck.
    #[test]
    fn streaming_never_deadlocks_and_never_overruns() {
        for ring in [3u32, 4, 5, 16] {
            for (a_blocks, chunks_a, chunks_b) in [(50, 7, 1), (20, 1, 9), (30, 33, 33), (10, 1, 1)] {
                simulate(ring, a_blocks, chunks_a, chunks_b);
            }
        }
    }

    /// Side 0 sends `blocks` blocks of `ca` chunks and side 1 answers each
    /// with `cb` chunks: a ping-pong of large blocks, or with `cb` = 1 the
    /// acknowledged stream.
    fn simulate(ring: u32, blocks: usize, ca: usize, cb: usize) {
        use std::collections::VecDeque;
        let mut side = [Credits::new(ring), Credits::new(ring)];
        // In-flight messages, per direction: immediates.
        let mut wire: [VecDeque<Immediate>; 2] = [VecDeque::new(), VecDeque::new()];
        // Posted receives at each side (must never go negative).
        let mut posted = [ring as i64, ring as i64];
        // Work: side 0 owes chunks of the current block, then side 1 answers.
        let mut to_send = [ca, 0usize];
        let mut got = [0usize, 0usize];
        let mut done_blocks = 0;
        let mut idle_rounds = 0;
        let mut rounds = 0;
        while done_blocks < blocks {
            rounds += 1;
            assert!(rounds < 100_000, "livelock: ring {ring}, {ca}/{cb} chunks, {side:?}");
            let mut progressed = false;
            for me in 0..2 {
                let peer = 1 - me;
                // Receive everything in flight towards me; the descriptors
                // are posted again after the sends below, as viabench does.
                let mut taken = 0;
                while let Some(imm) = wire[peer].pop_front() {
                    posted[me] -= 1;
                    assert!(posted[me] >= 0, "receive queue overrun");
                    taken += 1;
                    side[me].on_receive(imm);
                    if !imm.control {
                        got[me] += 1;
                    }
                    progressed = true;
                }
                // Send data while allowed.
                while to_send[me] > 0 && side[me].can_send_data() {
                    wire[me].push_back(side[me].on_send(false));
                    to_send[me] -= 1;
                    progressed = true;
                }
                for _ in 0..taken {
                    posted[me] += 1;
                    side[me].on_repost();
                }
                if side[me].wants_continue() {
                    wire[me].push_back(side[me].on_send(true));
                }
            }
            // Side 1 answers a complete block; side 0 starts the next one
            // when the answer is complete.
            if got[1] == ca {
                got[1] = 0;
                to_send[1] = cb;
            }
            if got[0] == cb {
                got[0] = 0;
                done_blocks += 1;
                to_send[0] = ca;
            }
            idle_rounds = if progressed { 0 } else { idle_rounds + 1 };
            assert!(idle_rounds < 3, "stuck: ring {ring}, {ca}/{cb} chunks, {side:?}");
        }
    }

    #[test]
    fn chunks_cover_the_block() {
        assert_eq!(chunks(10, 4).collect::<Vec<_>>(), vec![(0, 4), (4, 4), (8, 2)]);
        assert_eq!(chunks(8, 4).collect::<Vec<_>>(), vec![(0, 4), (4, 4)]);
        assert_eq!(chunks(0, 4).collect::<Vec<_>>(), vec![(0, 0)]);
        assert_eq!(chunks(3, 4).collect::<Vec<_>>(), vec![(0, 3)]);
        assert_eq!(chunk_count(4 << 20, 1 << 20), 4);
    }

    #[test]
    fn cursor_wraps_over_the_slots() {
        let mut c = Cursor::new(3);
        let taken: Vec<usize> = (0..7).map(|_| c.take()).collect();
        assert_eq!(taken, vec![0, 1, 2, 0, 1, 2, 0]);
        assert_eq!(receive_slots(16, 1 << 20, 4 << 20), 17);
        assert_eq!(receive_slots(4, 4096, 100_000), 26);
        assert_eq!(receive_slots(16, 1 << 20, 1 << 20), 1);
    }
}
