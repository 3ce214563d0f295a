//! Which of a port's sources a poll reads (in the provider, its sockets).
//! Reading an empty socket is a system call that a packet arriving
//! meanwhile waits behind, so sockets that rarely carry anything are read
//! less often.
//!
//! - The sockets connected to a peer each carry that peer's datagrams:
//!   read at every poll, except on a port that takes Ethernet frames
//!   once they have been empty for `UDP_QUIET` polls; then, while
//!   the packets come as frames, at every `UDP_QUIET_EVERY`th poll, until
//!   one gives a packet again.
//! - The unconnected socket only keeps what no connected one takes
//!   (datagrams before a connection is complete, a peer without a socket of
//!   its own): read at the first poll after `UNCONNECTED_EVERY` that found
//!   the peer sockets empty, so that a message just taken is answered
//!   first, and after `UNCONNECTED_LATEST` at the latest; on a port with
//!   frames only at polls that read the peer sockets too.

const UNCONNECTED_EVERY: u32 = 16;
const UNCONNECTED_LATEST: u32 = 64;
const UDP_QUIET: u32 = 64;
const UDP_QUIET_EVERY: u32 = 16;

/// What a port remembers of its polls to decide the next one's reads.
#[derive(Debug, Default)]
pub struct ReadSchedule {
    /// Polls since the unconnected socket was last read.
    since_unconnected: u32,
    /// Polls since the peer sockets last gave a packet.
    udp_quiet: u32,
}

impl ReadSchedule {
    /// Whether this poll reads the peer sockets, on a port that takes
    /// frames if `frames`; `everything` reads every socket.
    pub fn peers_due(&self, frames: bool, everything: bool) -> bool {
        let q = self.udp_quiet;
        !frames || everything || q < UDP_QUIET || q.is_multiple_of(UDP_QUIET_EVERY)
    }

    /// This poll's peer sockets gave a packet (`got`), or nothing, or were
    /// not read.
    pub fn peers_done(&mut self, got: bool) {
        self.udp_quiet = if got { 0 } else { self.udp_quiet.saturating_add(1) };
    }

    /// Whether this poll reads the unconnected socket too: `peers_read`
    /// tells whether it read the peer sockets, `busy` whether anything came
    /// so far, `no_peers` that the port has no peer sockets (it reads the
    /// unconnected one at every poll then).
    pub fn unconnected_due(&mut self, peers_read: bool, busy: bool, no_peers: bool, everything: bool) -> bool {
        self.since_unconnected = self.since_unconnected.saturating_add(1);
        let n = self.since_unconnected;
        let due = (n >= UNCONNECTED_EVERY && !busy) || n >= UNCONNECTED_LATEST;
        let read = everything || no_peers || (due && peers_read);
        if read {
            self.since_unconnected = 0;
        }
        read
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `n` polls on a port with `frames`, where the peer sockets give
    /// a packet at the polls `gives` says; returns the polls (from 1) that
    /// read the peer sockets and those that read the unconnected one.
    fn run(s: &mut ReadSchedule, n: u32, frames: bool, gives: impl Fn(u32) -> bool) -> (Vec<u32>, Vec<u32>) {
        let (mut peers, mut unconnected) = (Vec::new(), Vec::new());
        for i in 1..=n {
            let read = s.peers_due(frames, false);
            let got = read && gives(i);
            s.peers_done(got);
            if read {
                peers.push(i);
            }
            if s.unconnected_due(read, got, false, false) {
                unconnected.push(i);
            }
        }
        (peers, unconnected)
    }

    #[test]
    fn without_frames_the_peers_are_read_always_and_the_unconnected_socket_when_idle_or_overdue() {
        let mut s = ReadSchedule::default();
        let (peers, unconnected) = run(&mut s, 64, false, |_| false);
        assert_eq!(peers, (1..=64).collect::<Vec<_>>());
        assert_eq!(unconnected, vec![16, 32, 48, 64]);
        // Peers busy at every poll: the 64th poll reads it anyway.
        let mut s = ReadSchedule::default();
        let (_, unconnected) = run(&mut s, 130, false, |_| true);
        assert_eq!(unconnected, vec![64, 128]);
        // Busy until poll 20: the first idle poll after the 16th.
        let mut s = ReadSchedule::default();
        let (_, unconnected) = run(&mut s, 21, false, |i| i <= 20);
        assert_eq!(unconnected, vec![21]);
    }

    #[test]
    fn with_frames_quiet_peer_sockets_are_read_every_sixteenth_poll_until_one_gives() {
        let mut s = ReadSchedule::default();
        let (peers, unconnected) = run(&mut s, 160, true, |_| false);
        // Every poll while they have been empty for fewer than 64, then
        // every 16th; the unconnected socket only at such polls.
        let mut want: Vec<u32> = (1..=64).collect();
        want.extend([65, 81, 97, 113, 129, 145]);
        assert_eq!(peers, want);
        assert!(unconnected.iter().all(|i| peers.contains(i)), "{unconnected:?}");
        assert!(unconnected.windows(2).all(|w| w[1] - w[0] <= UNCONNECTED_LATEST), "{unconnected:?}");
        // A datagram at the next read (poll 161) makes every poll read
        // them again.
        let (peers, _) = run(&mut s, 20, true, |i| i == 1);
        assert_eq!(peers, (1..=20).collect::<Vec<_>>());
    }

    #[test]
    fn everything_and_a_port_without_peers_read_every_socket() {
        let mut s = ReadSchedule::default();
        run(&mut s, 100, true, |_| false);
        assert!(s.peers_due(true, true));
        assert!(s.unconnected_due(true, true, false, true));
        assert!(s.unconnected_due(false, true, true, false));
    }
}
