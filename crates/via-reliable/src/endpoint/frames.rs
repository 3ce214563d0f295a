//! Frame or datagram: when a link may send a packet as an Ethernet frame.
//!
//! A frame takes another path than the link's UDP datagrams (a packet
//! ring, no IP or UDP layer) and can overtake them.  So a packet goes as a
//! frame only when it is the one packet of its flush and the only one its
//! session has in flight, and is not a retransmission: then no earlier
//! packet is left for it to overtake.  A closed session's last packet (its
//! BREAK or DISCONNECT) never goes as a frame: the session forgot what it
//! had in flight, which may still be on its way.  Frames that keep getting lost (the
//! peer is not really on this link) turn frames off for the link.

/// Frames lost in a row after which a link sends datagrams only.
pub const FRAMES_LOST: u64 = 3;

/// A link's frames: what it sent and heard, and whether it gave them up.
#[derive(Debug, Default, Clone)]
pub struct FrameChoice {
    /// Frames sent.
    pub sent: u64,
    /// Packets that came from the peer as frames.
    pub heard: u64,
    /// Sequenced packets sent as frames that had to be sent again.
    pub lost: u64,
    /// Frames lost since the last one known to have arrived.
    lost_in_row: u64,
    /// The sequence number of the last sequenced packet sent as a frame,
    /// until it is sent again.
    last_seq: Option<u32>,
    /// `FRAMES_LOST` frames lost in a row: whatever the neighbour table
    /// says, frames do not reach the peer.
    off: bool,
}

impl FrameChoice {
    /// A packet with sequence number `seq` (`None`: not sequenced) leaves.
    /// Sequence numbers only grow: the one a frame carried, seen again, is
    /// a retransmission of that frame.
    pub fn leaving(&mut self, seq: Option<u32>) {
        if seq.is_some() && seq == self.last_seq {
            self.lost += 1;
            self.lost_in_row += 1;
            self.last_seq = None;
            self.off |= self.lost_in_row >= FRAMES_LOST;
        }
    }

    /// Whether the packet a flush leaves with may go as a frame: it is the
    /// only packet of the flush (`lone`) and no retransmission (`fresh`),
    /// its session is open and has no other packet in flight, it fits a
    /// frame (`len <= max`), and frames still reach the peer.
    pub fn may_send(&self, lone: bool, fresh: bool, open: bool, in_flight: u32, len: usize, max: usize) -> bool {
        lone && fresh && open && !self.off && in_flight <= 1 && len <= max
    }

    /// The packet with `seq` left as a frame, the only packet in flight:
    /// the sequenced frame before it was acknowledged without being sent
    /// again, so it arrived.
    pub fn sent_frame(&mut self, seq: Option<u32>) {
        self.sent += 1;
        if seq.is_some() {
            if self.last_seq.is_some() {
                self.lost_in_row = 0;
            }
            self.last_seq = seq;
        }
    }

    /// A packet came from the peer as a frame.
    pub fn heard_frame(&mut self) {
        self.heard += 1;
    }

    /// Whether frames are given up for this link.
    pub fn off(&self) -> bool {
        self.off
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_goes_only_alone_fresh_and_as_the_one_packet_in_flight() {
        let f = FrameChoice::default();
        assert!(f.may_send(true, true, true, 1, 100, 1500));
        assert!(f.may_send(true, true, true, 0, 100, 1500));
        assert!(!f.may_send(false, true, true, 1, 100, 1500), "one of several");
        assert!(!f.may_send(true, false, true, 1, 100, 1500), "a retransmission");
        assert!(!f.may_send(true, true, false, 0, 100, 1500), "the last packet of a closed session");
        assert!(!f.may_send(true, true, true, 2, 100, 1500), "another packet in flight");
        assert!(!f.may_send(true, true, true, 1, 1501, 1500), "too long");
    }

    #[test]
    fn a_link_gives_frames_up_after_three_lost_in_a_row_only() {
        let mut t = FrameChoice::default();
        // Frames that arrive (the next goes out while nothing is in flight)
        // and packets that are not frames' retransmissions.
        for seq in 1..=5 {
            t.leaving(Some(seq));
            t.sent_frame(Some(seq));
        }
        t.leaving(None); // an acknowledgement
        assert_eq!((t.sent, t.lost, t.off), (5, 0, false));
        // Frame 6 goes out and comes back as a retransmission, twice over.
        for seq in [6, 7] {
            t.leaving(Some(seq));
            t.sent_frame(Some(seq));
            t.leaving(Some(seq));
        }
        assert_eq!((t.lost, t.lost_in_row, t.off), (2, 2, false));
        // One that arrives clears the row...
        t.leaving(Some(8));
        t.sent_frame(Some(8));
        t.leaving(Some(9));
        t.sent_frame(Some(9));
        assert_eq!((t.lost_in_row, t.off), (0, false));
        // ...and three lost in a row end frames for the link.
        for seq in [9, 10, 11] {
            if seq != 9 {
                t.leaving(Some(seq));
                t.sent_frame(Some(seq));
            }
            t.leaving(Some(seq));
        }
        assert_eq!((t.lost, t.lost_in_row, t.off), (5, 3, true));
        // An unsequenced frame neither counts as lost nor clears the row.
        t.sent_frame(None);
        assert_eq!(t.lost_in_row, 3);
    }
}
