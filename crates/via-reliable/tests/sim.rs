//! Thousands of seeded runs over the simulated network.
//!
//! `VIA_SIM_SEEDS` sets the number of reliable seeds (default 2000; half as
//! many unreliable ones run too); `VIA_SIM_SEED` reruns one seed of both
//! kinds and prints its outcome.

use via_reliable::sim::{run, Outcome, Script};

fn seeds() -> Vec<u64> {
    if let Ok(s) = std::env::var("VIA_SIM_SEED") {
        return vec![s.parse().expect("VIA_SIM_SEED is a number")];
    }
    let n: u64 =
        std::env::var("VIA_SIM_SEEDS").ok().map(|s| s.parse().expect("VIA_SIM_SEEDS is a number")).unwrap_or(2000);
    (0..n).collect()
}

fn report(kind: &str, script: &Script, o: &Outcome, why: &str) -> String {
    format!(
        "{kind} seed {} failed ({why}); rerun with VIA_SIM_SEED={}\n  script: {script:?}\n  outcome: {o}",
        o.seed, o.seed
    )
}

#[test]
fn reliable_sessions_deliver_everything_exactly_once_in_order() {
    let started = std::time::Instant::now();
    let seeds = seeds();
    let mut failures = Vec::new();
    let (mut completed, mut broken, mut retransmits) = (0, 0, 0u64);
    for &seed in &seeds {
        let script = Script::random(seed, true);
        let o = run(&script);
        if std::env::var("VIA_SIM_SEED").is_ok() {
            println!("{o}");
        }
        retransmits += o.stats[0].retransmits + o.stats[1].retransmits;
        let why = if !o.violations.is_empty() {
            Some("violations")
        } else if o.completed {
            completed += 1;
            None
        } else if script.long_partition() && o.broken.iter().all(Option::is_some) {
            broken += 1;
            None
        } else {
            Some("neither completed nor broken by a long partition")
        };
        if let Some(why) = why {
            failures.push(report("reliable", &script, &o, why));
        }
    }
    println!(
        "reliable: {} seeds, {completed} completed, {broken} broken by a partition, \
         {retransmits} retransmits, {:?}",
        seeds.len(),
        started.elapsed()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn unreliable_sessions_never_deliver_corrupt_partial_or_duplicate_messages() {
    let started = std::time::Instant::now();
    let mut seeds = seeds();
    if std::env::var("VIA_SIM_SEED").is_err() {
        seeds.truncate(seeds.len().div_ceil(2));
    }
    let mut failures = Vec::new();
    let (mut perfect, mut delivered, mut sent) = (0, 0, 0);
    for &seed in &seeds {
        let script = Script::random(seed, false);
        let o = run(&script);
        if std::env::var("VIA_SIM_SEED").is_ok() {
            println!("{o}");
        }
        delivered += o.delivered[0] + o.delivered[1];
        sent += o.sent[0] + o.sent[1];
        let why = if !o.violations.is_empty() {
            Some("violations")
        } else if o.stalled {
            Some("stalled")
        } else if script.net.is_perfect() {
            perfect += 1;
            if !o.completed || o.delivered != [o.sent[1], o.sent[0]] {
                Some("a perfect network lost messages")
            } else {
                None
            }
        } else if !o.completed && o.broken.iter().any(Option::is_none) {
            Some("neither completed nor broken")
        } else {
            None
        };
        if let Some(why) = why {
            failures.push(report("unreliable", &script, &o, why));
        }
    }
    println!(
        "unreliable: {} seeds ({perfect} perfect), {delivered} of {sent} messages delivered, {:?}",
        seeds.len(),
        started.elapsed()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
