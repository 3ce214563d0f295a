//! Seeded runs of whole ports over the simulated network
//! ([`via_reliable::netsim`]).
//!
//! `VIA_NETSIM_SEEDS` sets the number of seeds (default 4000);
//! `VIA_NETSIM_SEED` reruns one seed and prints its outcome:
//! `VIA_NETSIM_SEED=n cargo test -p via-reliable --test netsim`.

use via_reliable::netsim::{run, Outcome};

fn seeds() -> Vec<u64> {
    let n: u64 = std::env::var("VIA_NETSIM_SEEDS")
        .ok()
        .map(|s| s.parse().expect("VIA_NETSIM_SEEDS is a number"))
        .unwrap_or(4000);
    (0..n).collect()
}

fn failure(o: &Outcome) -> String {
    format!("seed {} failed; rerun with VIA_NETSIM_SEED={}\n{o}", o.seed, o.seed)
}

/// What all the runs did together.
#[derive(Debug, Default)]
struct Totals {
    connections: usize,
    completed: usize,
    broken: usize,
    deaths: usize,
    frames: u64,
    lost: u64,
    partitioned: u64,
    duplicated: u64,
    reordered: u64,
    corrupted: u64,
    malformed: u64,
    misdirected: u64,
    bad_key: u64,
    unknown_vi: u64,
    retransmits: u64,
    owed_acks: u64,
    successors: (usize, usize),
    stale: (u64, u64),
    stale_survived: usize,
    messages: (usize, usize),
    virtual_time: std::time::Duration,
}

impl Totals {
    fn add(&mut self, o: &Outcome) {
        self.connections += o.connections;
        self.completed += o.completed;
        self.broken += o.broken;
        self.deaths += o.died.is_some() as usize;
        self.frames += o.net.frames;
        self.lost += o.net.lost;
        self.partitioned += o.net.partitioned;
        self.duplicated += o.net.duplicated;
        self.reordered += o.net.reordered;
        self.corrupted += o.net.corrupted;
        self.malformed += o.tally.malformed;
        self.misdirected += o.net.misdirected;
        self.bad_key += o.bad_key;
        self.unknown_vi += o.tally.unknown_vi;
        self.retransmits += o.retransmits;
        self.owed_acks += o.owed_acks;
        self.successors.0 += o.successors.0;
        self.successors.1 += o.successors.1;
        self.stale.0 += o.stale.0;
        self.stale.1 += o.stale.1;
        self.stale_survived += o.stale_survived;
        self.messages.0 += o.messages.0;
        self.messages.1 += o.messages.1;
        self.virtual_time += o.elapsed;
    }
}

#[test]
fn ports_deliver_everything_across_faults_frames_and_a_dying_host() {
    if std::env::var("VIA_NETSIM_SEED").is_ok() {
        return; // the replay test below runs that one seed
    }
    let started = std::time::Instant::now();
    let seeds = seeds();
    let mut totals = Totals::default();
    let mut failures = Vec::new();
    for &seed in &seeds {
        let o = run(seed);
        totals.add(&o);
        if !o.violations.is_empty() || o.stalled {
            failures.push(failure(&o));
        }
    }
    println!("netsim: {} seeds in {:?}: {totals:?}", seeds.len(), started.elapsed());
    assert!(failures.is_empty(), "{} of {} seeds failed:\n{}", failures.len(), seeds.len(), failures.join("\n"));
    if seeds.len() >= 200 {
        let t = &totals;
        assert!(t.frames > 0, "no frames sent: {t:?}");
        assert!(t.lost > 0 && t.duplicated > 0 && t.reordered > 0, "faults not exercised: {t:?}");
        assert!(t.corrupted > 0 && t.malformed > 0, "corruption not exercised: {t:?}");
        assert!(t.misdirected > 0 && t.bad_key > 0 && t.unknown_vi > 0, "misdirection not exercised: {t:?}");
        assert!(t.partitioned > 0 && t.deaths > 0 && t.broken > 0, "partitions and deaths not exercised: {t:?}");
        assert!(t.retransmits > 0, "nothing retransmitted: {t:?}");
        assert!(t.owed_acks > 0, "no acknowledgement waited for an idle poll: {t:?}");
        assert!(t.completed * 10 >= t.connections * 7, "most connections should complete: {t:?}");
        // VIs that connect again: packets of their old connection reach
        // the new sessions, which refuse every one and still complete.
        assert!(t.successors.1 > 0, "no VI connected again: {t:?}");
        assert!(t.stale.0 > 0, "no stale packet reached a new connection: {t:?}");
        assert_eq!(t.stale.1, t.stale.0, "a stale packet was not refused: {t:?}");
        assert!(t.stale_survived > 0, "no new connection completed after stale packets: {t:?}");
    }
}

#[test]
fn the_same_seed_gives_the_same_outcome() {
    for seed in [3, 1000, 0xDEAD_BEEF] {
        assert_eq!(format!("{:?}", run(seed)), format!("{:?}", run(seed)), "seed {seed}");
    }
}

#[test]
fn replay_one_seed() {
    let Ok(s) = std::env::var("VIA_NETSIM_SEED") else { return };
    let o = run(s.parse().expect("VIA_NETSIM_SEED is a number"));
    println!("{o}");
    assert!(o.violations.is_empty() && !o.stalled, "{}", failure(&o));
}
