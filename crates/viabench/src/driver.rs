//! The NetPIPE driver: what both sides do in one run of one block size, and
//! how the client takes the time.
//!
//! Every run starts with an untimed first iteration (a block there, the
//! reply back) whose data both sides check at once; then the clock runs over
//! `reps` iterations of the pattern; the last iteration sends from a third
//! buffer with a pattern of its own, and both sides check the last block
//! they received once the clock has stopped.  A run's patterns depend on its
//! seed, so stale data from an earlier run, size or iteration cannot pass.

use crate::error::{Error, Result};
use crate::link::{Link, Side};
use crate::pattern::{seed, Which};
use crate::proto::{Pattern, RunSpec, ACK_BYTES};
use std::time::{Duration, Instant};

/// The three seeds of the blocks `side` sends in a run.
pub fn send_seeds(run: u64, side: Side) -> [u64; 3] {
    [Which::First, Which::Middle, Which::Last].map(|w| seed(run, side.dir(), w))
}

/// The seed of the blocks `side` receives from buffer `which`.
pub fn recv_seed(run: u64, side: Side, which: Which) -> u64 {
    seed(run, 1 - side.dir(), which)
}

fn buffer(last: bool) -> Which {
    if last {
        Which::Last
    } else {
        Which::Middle
    }
}

/// Bytes of the server's reply in `pattern`.
pub fn reply_bytes(pattern: Pattern, size: usize) -> usize {
    match pattern.flow() {
        Pattern::PingPong => size,
        _ => ACK_BYTES,
    }
}

fn checked(link: &dyn Link, seed: u64, len: usize, what: &str) -> Result<()> {
    link.verify(seed, len).map_err(|e| e.context(what))
}

/// The client's side of a run; returns the time of the timed iterations.
pub fn client_run(link: &mut dyn Link, pattern: Pattern, run: RunSpec) -> Result<Duration> {
    let RunSpec { size, reps, seed: s } = run;
    if reps == 0 {
        return Err(Error::new("a run needs at least one repetition"));
    }
    if pattern == Pattern::Connect {
        return Err(Error::new("the connect pattern has no block-size run"));
    }
    // A rendezvous is the link's business: the driver times it as the
    // ping-pong or stream it is.
    let pattern = pattern.flow();
    let side = Side::Client;
    let reply = reply_bytes(pattern, size);
    let n = link.vis() as u64;
    link.prepare(size, send_seeds(s, side))?;

    // The first iteration: untimed, checked on both sides.
    link.select(0);
    link.send(Which::First, size)?;
    link.recv(reply, true)?;
    checked(link, recv_seed(s, side, Which::First), reply, "first reply")?;

    let start = Instant::now();
    match pattern {
        Pattern::PingPong => {
            for i in 1..=reps {
                link.select(turn(i, n));
                link.send(buffer(i == reps), size)?;
                link.recv(size, i == reps)?;
            }
        }
        Pattern::Stream => {
            for i in 1..=reps {
                link.select(turn(i, n));
                link.send(buffer(i == reps), size)?;
            }
            link.recv(ACK_BYTES, true)?;
        }
        Pattern::Burst(b) => {
            for r in 1..=reps {
                link.select(turn(r, n));
                for j in 1..=b {
                    link.send(buffer(r == reps && j == b), size)?;
                }
                link.recv(ACK_BYTES, r == reps)?;
            }
        }
        Pattern::Connect | Pattern::Rendezvous | Pattern::RendezvousStream => unreachable!("refused or mapped above"),
    }
    let elapsed = start.elapsed();
    checked(link, recv_seed(s, side, Which::Last), reply, "last reply")?;
    link.finish()?;
    Ok(elapsed)
}

/// The server's side of a run.
pub fn server_run(link: &mut dyn Link, pattern: Pattern, run: RunSpec) -> Result<()> {
    let RunSpec { size, reps, seed: s } = run;
    if pattern == Pattern::Connect {
        return Err(Error::new("the connect pattern has no block-size run"));
    }
    let pattern = pattern.flow();
    let side = Side::Server;
    let reply = reply_bytes(pattern, size);
    let n = link.vis() as u64;
    link.prepare(reply, send_seeds(s, side))?;

    link.select(0);
    link.recv(size, true)?;
    checked(link, recv_seed(s, side, Which::First), size, "first block")?;
    link.send(Which::First, reply)?;

    match pattern {
        Pattern::PingPong => {
            for i in 1..=reps {
                link.select(turn(i, n));
                link.recv(size, i == reps)?;
                link.send(buffer(i == reps), size)?;
            }
        }
        Pattern::Stream => {
            for i in 1..=reps {
                link.select(turn(i, n));
                link.recv(size, i == reps)?;
            }
            link.send(Which::Last, ACK_BYTES)?;
        }
        Pattern::Burst(b) => {
            for r in 1..=reps {
                link.select(turn(r, n));
                for j in 1..=b {
                    link.recv(size, r == reps && j == b)?;
                }
                link.send(buffer(r == reps), ACK_BYTES)?;
            }
        }
        Pattern::Connect | Pattern::Rendezvous | Pattern::RendezvousStream => unreachable!("refused or mapped above"),
    }
    checked(link, recv_seed(s, side, Which::Last), size, "last block")?;
    link.finish()
}

/// The time of one message: half a round trip for ping-pong, one block of a
/// stream, one message of a burst.
pub fn per_message(pattern: Pattern, elapsed: Duration, reps: u64) -> Duration {
    elapsed.div_f64((reps * pattern.messages_per_rep()) as f64)
}

/// The VI whose turn iteration `i` is, of `n`: no division for one VI, a
/// ping-pong's case, where it would lie between a message and its answer.
fn turn(i: u64, n: u64) -> usize {
    if n == 1 {
        0
    } else {
        (i % n) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::LinkStats;
    use crate::pattern;
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};

    /// An in-process link: two queues of blocks.
    struct Loop {
        side: Side,
        out: Arc<Mutex<VecDeque<Vec<u8>>>>,
        inq: Arc<Mutex<VecDeque<Vec<u8>>>>,
        bufs: [Vec<u8>; 3],
        kept: Vec<u8>,
        corrupt_last: bool,
    }

    impl Link for Loop {
        fn prepare(&mut self, len: usize, seeds: [u64; 3]) -> Result<()> {
            for (b, s) in self.bufs.iter_mut().zip(seeds) {
                b.resize(len, 0);
                pattern::fill(s, b);
            }
            Ok(())
        }
        fn send(&mut self, which: Which, len: usize) -> Result<()> {
            let mut block = self.bufs[which as usize][..len].to_vec();
            if self.corrupt_last && which == Which::Last {
                block[len - 1] ^= 1;
            }
            self.out.lock().unwrap().push_back(block);
            Ok(())
        }
        fn recv(&mut self, len: usize, keep: bool) -> Result<()> {
            loop {
                if let Some(b) = self.inq.lock().unwrap().pop_front() {
                    assert_eq!(b.len(), len, "{:?}", self.side);
                    if keep {
                        self.kept = b;
                    }
                    return Ok(());
                }
                std::thread::yield_now();
            }
        }
        fn verify(&self, seed: u64, len: usize) -> Result<()> {
            assert_eq!(self.kept.len(), len);
            pattern::check(seed, 0, &self.kept).map_err(|k| Error::new(format!("byte {k}")))
        }
        fn finish(&mut self) -> Result<()> {
            Ok(())
        }
        fn stats(&self) -> LinkStats {
            LinkStats::default()
        }
    }

    fn pair(corrupt_server: bool) -> (Loop, Loop) {
        let a = Arc::new(Mutex::new(VecDeque::new()));
        let b = Arc::new(Mutex::new(VecDeque::new()));
        let mk = |side, out: &Arc<_>, inq: &Arc<_>, corrupt_last| Loop {
            side,
            out: Arc::clone(out),
            inq: Arc::clone(inq),
            bufs: Default::default(),
            kept: Vec::new(),
            corrupt_last,
        };
        (mk(Side::Client, &a, &b, false), mk(Side::Server, &b, &a, corrupt_server))
    }

    fn run_both(pattern: Pattern, run: RunSpec, corrupt_server: bool) -> (Result<Duration>, Result<()>) {
        let (mut c, mut s) = pair(corrupt_server);
        let server = std::thread::spawn(move || server_run(&mut s, pattern, run));
        let client = client_run(&mut c, pattern, run);
        (client, server.join().unwrap())
    }

    #[test]
    fn every_pattern_runs_and_verifies() {
        for pattern in
            [Pattern::PingPong, Pattern::Stream, Pattern::Burst(5), Pattern::Rendezvous, Pattern::RendezvousStream]
        {
            for size in [1, 7, 100] {
                let (c, s) = run_both(pattern, RunSpec { size, reps: 4, seed: 99 }, false);
                assert!(c.is_ok(), "{pattern:?} {size}: {c:?}");
                assert!(s.is_ok(), "{pattern:?} {size}: {s:?}");
            }
        }
    }

    #[test]
    fn a_wrong_last_block_is_caught() {
        let (c, s) = run_both(Pattern::PingPong, RunSpec { size: 64, reps: 3, seed: 5 }, true);
        assert!(s.is_ok());
        let e = c.unwrap_err().to_string();
        assert!(e.contains("last reply"), "{e}");
    }

    #[test]
    fn per_message_time_follows_the_pattern() {
        let t = Duration::from_micros(1000);
        assert_eq!(per_message(Pattern::PingPong, t, 10), Duration::from_micros(50));
        assert_eq!(per_message(Pattern::Stream, t, 10), Duration::from_micros(100));
        assert_eq!(per_message(Pattern::Burst(4), t, 10), Duration::from_micros(25));
        assert_eq!(per_message(Pattern::Rendezvous, t, 10), Duration::from_micros(50));
        assert_eq!(per_message(Pattern::RendezvousStream, t, 10), Duration::from_micros(100));
        assert_eq!(reply_bytes(Pattern::Rendezvous, 65536), 65536);
        assert_eq!(reply_bytes(Pattern::RendezvousStream, 65536), ACK_BYTES);
    }

    #[test]
    fn turns_go_round_the_vis() {
        assert_eq!((1..=5).map(|i| turn(i, 1)).collect::<Vec<_>>(), [0; 5]);
        assert_eq!((1..=5).map(|i| turn(i, 3)).collect::<Vec<_>>(), [1, 2, 0, 1, 2]);
    }
}
