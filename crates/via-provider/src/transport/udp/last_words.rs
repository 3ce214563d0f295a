//! The last words of a port's ended connections: the BREAK or DISCONNECT
//! each ended with ([`LastWord`]), kept for a while to be said again to a
//! peer that goes on retransmitting because it never heard it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use via_reliable::LastWord;
use via_wire::Header;

/// How long a word is said again: longer than a peer that never heard it
/// retransmits before it gives up (its idle timeout, 10 s by default).
pub(crate) const LINGER: Duration = Duration::from_secs(30);

/// The most words a port keeps: beyond, a connection that ends keeps none
/// (its peer notices through its own timeouts, as without them).
const MAX_KEPT: usize = 1 << 16;

/// A word and where it goes, until when.
struct Kept {
    word: LastWord,
    peer: SocketAddr,
    until: Instant,
}

/// The words of one port's ended connections, by local VI id.
pub(crate) struct LastWords {
    by_vi: HashMap<u32, Kept>,
    /// The count at which the expired words are dropped next: twice the
    /// count left by the last pruning, so that a port whose connections
    /// come and go fast prunes in amortized constant time per word.
    prune_at: usize,
}

impl Default for LastWords {
    fn default() -> LastWords {
        LastWords { by_vi: HashMap::new(), prune_at: 64 }
    }
}

impl LastWords {
    /// VI id `vi`'s connection ended with `word`, sent to `peer`, at `now`.
    pub(crate) fn keep(&mut self, vi: u32, word: LastWord, peer: SocketAddr, now: Instant) {
        if self.by_vi.len() >= self.prune_at {
            self.by_vi.retain(|_, k| k.until > now);
            self.prune_at = (2 * self.by_vi.len()).max(64);
        }
        if self.by_vi.len() < MAX_KEPT || self.by_vi.contains_key(&vi) {
            self.by_vi.insert(vi, Kept { word, peer, until: now + LINGER });
        }
    }

    /// Whether a word of VI id `vi` is still said at `now`.
    pub(crate) fn holds(&self, vi: u32, now: Instant) -> bool {
        self.by_vi.get(&vi).is_some_and(|k| k.until > now)
    }

    /// The word to say again, and where, if `packets` (arrived at `now`
    /// for VI id `vi`, which has no connection) include one that
    /// [`LastWord::answers`].
    pub(crate) fn answer(&self, vi: u32, packets: &[(Header, &[u8])], now: Instant) -> Option<(Header, SocketAddr)> {
        let kept = self.by_vi.get(&vi).filter(|k| k.until > now)?;
        packets.iter().any(|(h, _)| kept.word.answers(h)).then_some((kept.word.header, kept.peer))
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_vi.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use via_reliable::{Config, Peer, Session};
    use via_wire::Kind;

    const LOCAL: Peer = Peer { vi: 5, key: 0x55 };
    const REMOTE: Peer = Peer { vi: 9, key: 0x99 };

    /// The word of a session between `LOCAL` and `REMOTE` that broke.
    fn word(now: Instant) -> LastWord {
        let now = crate::clock::time_of(now);
        let mut s = Session::new(Config::default(), LOCAL, REMOTE, now);
        s.close(7);
        while s.poll_transmit(now).is_some() {}
        s.last_word().expect("the BREAK went")
    }

    /// A packet of the peer for the ended connection.
    fn from_peer(kind: Kind, key: u64) -> Header {
        Header { kind, dst_vi: LOCAL.vi, src_vi: REMOTE.vi, key, ..Header::default() }
    }

    #[test]
    fn a_kept_word_answers_the_peers_packets_until_it_lingered() {
        let t0 = Instant::now();
        let peer: SocketAddr = "10.0.0.2:4791".parse().unwrap();
        let mut words = LastWords::default();
        let w = word(t0);
        words.keep(LOCAL.vi, w, peer, t0);
        let data = [(from_peer(Kind::Data, LOCAL.key), &[][..])];
        assert_eq!(words.answer(LOCAL.vi, &data, t0), Some((w.header, peer)));
        // Not to a stranger's packet, nor to another VI id, nor to the
        // peer's own last word.
        assert_eq!(words.answer(LOCAL.vi, &[(from_peer(Kind::Data, 1), &[][..])], t0), None);
        assert_eq!(words.answer(LOCAL.vi + 1, &data, t0), None);
        assert_eq!(words.answer(LOCAL.vi, &[(from_peer(Kind::Break, LOCAL.key), &[][..])], t0), None);
        // Gone after LINGER.
        assert!(words.holds(LOCAL.vi, t0) && !words.holds(LOCAL.vi + 1, t0));
        assert_eq!(words.answer(LOCAL.vi, &data, t0 + LINGER), None);
        assert!(!words.holds(LOCAL.vi, t0 + LINGER));
    }

    #[test]
    fn expired_words_are_dropped_as_connections_come_and_go() {
        let t0 = Instant::now();
        let peer: SocketAddr = "10.0.0.2:4791".parse().unwrap();
        let mut words = LastWords::default();
        let w = word(t0);
        // A connection ends every millisecond for five minutes: no more
        // words are kept than end within LINGER, give or take the slack
        // of pruning by doubling.
        for i in 0..300_000u32 {
            words.keep(i, w, peer, t0 + Duration::from_millis(i as u64));
        }
        assert!(words.len() <= 2 * 30_000 + 64, "{} words kept", words.len());
    }
}
