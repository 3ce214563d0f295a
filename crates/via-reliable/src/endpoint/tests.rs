use super::*;
use std::collections::VecDeque;
use via_wire::{Kind, FLAG_FIRST, FLAG_LAST};

/// Packets waiting on each source, as bytes.
#[derive(Default)]
struct Queues {
    frames: VecDeque<Vec<u8>>,
    peers: VecDeque<Vec<u8>>,
    shared: VecDeque<Vec<u8>>,
    takes_frames: bool,
    peer_paths: bool,
    /// Which sources were read, in order.
    reads: Vec<&'static str>,
}

impl Datapath for Queues {
    fn takes_frames(&self) -> bool {
        self.takes_frames
    }
    fn has_peer_paths(&self) -> bool {
        self.peer_paths
    }
    fn read_frames(&mut self, arrivals: &mut Arrivals<'_>) -> bool {
        self.reads.push("frames");
        let any = !self.frames.is_empty();
        for f in self.frames.drain(..) {
            arrivals.frame(&f);
        }
        any
    }
    fn read_peers(&mut self, arrivals: &mut Arrivals<'_>) -> bool {
        self.reads.push("peers");
        let batch: Vec<Vec<u8>> = self.peers.drain(..).collect();
        arrivals.datagrams(batch.iter().map(|d| &d[..]));
        !batch.is_empty()
    }
    fn read_shared(&mut self, arrivals: &mut Arrivals<'_>) -> bool {
        self.reads.push("shared");
        let batch: Vec<Vec<u8>> = self.shared.drain(..).collect();
        arrivals.datagrams(batch.iter().map(|d| &d[..]));
        !batch.is_empty()
    }
}

/// VIs that record what they were handed, and owe an acknowledgement for
/// every run of packets.
#[derive(Default)]
struct Recorder {
    vis: Vec<u32>,
    /// (vi, seqs of the run, frame, app_away)
    runs: Vec<(u32, Vec<u32>, bool, bool)>,
    acks: Vec<(u32, bool)>,
}

impl Routes for Recorder {
    fn deliver(&mut self, vi: u32, packets: &[(Header, &[u8])], frame: bool, app_away: bool) -> Option<bool> {
        if !self.vis.contains(&vi) {
            return None;
        }
        self.runs.push((vi, packets.iter().map(|(h, _)| h.seq).collect(), frame, app_away));
        Some(true)
    }
    fn send_owed_ack(&mut self, vi: u32, app_away: bool) {
        self.acks.push((vi, app_away));
    }
}

fn packet(dst_vi: u32, seq: u32, payload: &[u8]) -> Vec<u8> {
    let header = Header {
        kind: Kind::Data,
        flags: FLAG_FIRST | FLAG_LAST,
        dst_vi,
        src_vi: 7,
        key: 99,
        seq,
        ..Header::default()
    };
    via_wire::encode(&header, payload)
}

#[test]
fn consecutive_packets_of_one_vi_go_together_and_strangers_are_counted() {
    let mut ep = Endpoint::new(1000);
    let mut dp = Queues { peer_paths: true, ..Queues::default() };
    let mut vis = Recorder { vis: vec![1, 2], ..Recorder::default() };
    let mut bad = packet(1, 9, b"x");
    *bad.last_mut().unwrap() ^= 0xFF;
    dp.peers.extend([packet(1, 1, b"a"), packet(1, 2, b"b"), packet(2, 1, b"c"), bad, packet(3, 1, b"d")]);
    dp.peers.push_back(packet(1, 3, b"e"));
    assert!(ep.poll(&mut dp, &mut vis, false));
    assert_eq!(vis.runs, vec![(1, vec![1, 2], false, false), (2, vec![1], false, false), (1, vec![3], false, false)]);
    let tally = ep.take_tally();
    assert_eq!((tally.packets, tally.frames, tally.malformed, tally.unknown_vi), (4, 0, 1, 1));
    assert_eq!(tally.last_malformed, Some(via_wire::WireError::BadChecksum));
    assert_eq!(ep.take_tally(), Tally::default(), "taken");
}

#[test]
fn acknowledgements_wait_until_a_poll_finds_nothing_and_go_once_per_vi() {
    let mut ep = Endpoint::new(1000);
    let mut dp = Queues { peer_paths: true, ..Queues::default() };
    let mut vis = Recorder { vis: vec![1, 2], ..Recorder::default() };
    dp.peers.extend([packet(1, 1, b"a"), packet(2, 1, b"b")]);
    ep.poll(&mut dp, &mut vis, false);
    assert!(vis.acks.is_empty(), "owed while the poll found packets");
    assert_eq!(ep.owed(), &[1, 2]);
    dp.peers.push_back(packet(1, 2, b"c"));
    ep.poll(&mut dp, &mut vis, false);
    assert!(vis.acks.is_empty());
    assert_eq!(ep.owed(), &[1, 2], "each VI once");
    assert!(!ep.poll(&mut dp, &mut vis, false));
    assert_eq!(vis.acks, vec![(1, false), (2, false)]);
    assert!(ep.owed().is_empty());
    // A reader taking over for an absent application says so.
    dp.peers.push_back(packet(2, 2, b"d"));
    ep.poll(&mut dp, &mut vis, true);
    ep.poll(&mut dp, &mut vis, true);
    assert_eq!(vis.acks.last(), Some(&(2, true)));
    assert_eq!(vis.runs.last().map(|r| r.3), Some(true));
}

#[test]
fn frames_are_read_first_and_large_packets_name_their_vi() {
    let mut ep = Endpoint::new(4);
    let mut dp = Queues { peer_paths: true, takes_frames: true, ..Queues::default() };
    let mut vis = Recorder { vis: vec![1, 2], ..Recorder::default() };
    dp.frames.push_back(packet(2, 5, b"f"));
    dp.peers.push_back(packet(1, 1, b"ab"));
    ep.poll(&mut dp, &mut vis, false);
    assert_eq!(&dp.reads[..2], &["frames", "peers"]);
    assert_eq!(vis.runs[0], (2, vec![5], true, false));
    assert_eq!(ep.take_tally().frames, 1);
    let mut arrivals =
        Arrivals { segment: 4, owed: &mut Vec::new(), tally: &mut Tally::default(), routes: &mut vis, app_away: false };
    let small = packet(1, 2, b"abcd");
    let large = packet(2, 6, b"abcdefgh");
    assert_eq!(arrivals.datagrams([&small[..]]), None);
    assert_eq!(arrivals.datagrams([&large[..], &small[..]]), Some(2));
}

#[test]
fn without_peer_paths_every_poll_reads_the_shared_path() {
    let mut ep = Endpoint::new(1000);
    let mut dp = Queues::default();
    let mut vis = Recorder { vis: vec![1], ..Recorder::default() };
    for seq in 1..=5 {
        dp.shared.push_back(packet(1, seq, b"a"));
        ep.poll(&mut dp, &mut vis, false);
    }
    assert_eq!(vis.runs.len(), 5);
    // With peer paths, the shared one waits for an idle poll after 16.
    let mut ep = Endpoint::new(1000);
    let mut dp = Queues { peer_paths: true, ..Queues::default() };
    for _ in 0..15 {
        dp.peers.push_back(packet(1, 1, b"a"));
        ep.poll(&mut dp, &mut vis, false);
    }
    assert!(!dp.reads.contains(&"shared"));
    ep.poll(&mut dp, &mut vis, false);
    assert_eq!(dp.reads.last(), Some(&"shared"));
}

/// Frames only: the frames of a `Queues` and nothing else.
struct FramesOf(Queues);

impl Datapath for FramesOf {
    fn takes_frames(&self) -> bool {
        true
    }
    fn read_frames(&mut self, arrivals: &mut Arrivals<'_>) -> bool {
        self.0.read_frames(arrivals)
    }
}

#[test]
fn a_datapath_of_frames_beside_one_of_datagrams_reads_each_where_it_is() {
    let mut ring = Queues::default();
    ring.frames.push_back(packet(2, 5, b"f"));
    // Datagrams waiting in the ring's queues are not the ring's to read.
    ring.peers.push_back(packet(2, 99, b"x"));
    let mut sockets = Queues { peer_paths: true, ..Queues::default() };
    sockets.peers.push_back(packet(1, 1, b"a"));
    sockets.frames.push_back(packet(1, 99, b"y"));
    let mut vis = Recorder { vis: vec![1, 2], ..Recorder::default() };
    let mut ep = Endpoint::new(1000);
    let mut both = Beside { frames: Some(FramesOf(ring)), datagrams: sockets };
    assert!(both.takes_frames() && both.has_peer_paths());
    ep.poll(&mut both, &mut vis, false);
    assert_eq!(vis.runs, vec![(2, vec![5], true, false), (1, vec![1], false, false)]);
    assert_eq!(both.datagrams.reads, vec!["peers"], "its frames are not read");
    // Without an Ethernet side: no frames, and the peer paths read at every poll.
    let mut bare = Beside { frames: None::<FramesOf>, datagrams: Queues { peer_paths: true, ..Queues::default() } };
    assert!(!bare.takes_frames());
    ep.poll(&mut bare, &mut vis, false);
    assert_eq!(bare.datagrams.reads, vec!["peers"]);
}
