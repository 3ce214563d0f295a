//! Seeded random workloads over the whole-provider simulator, checked
//! against the VIA specification at every step: the Rust counterpart of
//! tests/c/workload.c, across simulated hosts.
//!
//! Each seed draws its plan (`plan.rs`) from `SimRng` before anything
//! runs: 2 to 4 hosts; 1 to 4 VI pairs, each between two distinct hosts;
//! the reliability level; whether RDMA writes and reads are enabled (reads
//! on reliable levels only); whether each host's VIs complete their
//! receives through one CQ they share; the network's faults (loss,
//! duplication, reordering, and in some seeds corruption and misdirection,
//! on reliable levels; none that lose a packet on an unreliable seed,
//! except in its lossy variety); rounds of transfers on random pairs in
//! either direction (sends of 0 B to 64 KiB in 1 to 4 data segments with
//! or without immediate data, RDMA writes with and without immediate data
//! at random places of the peer's write area, RDMA reads of random ranges
//! of its read area), each round ending with a send on every VI and
//! direction it used; in one seed of four the last of those sends is
//! longer than its receive, in one of six more (reliable levels) it finds
//! no receive posted, in one of eight others (not lossy) the target of an
//! RDMA write (or read, `plan::REFUSED_READS`) refuses it: a VI or region
//! without that RDMA enabled, a range across the end of the region, a
//! forged memory handle; in some seeds a host dies after a round, or a
//! pair of hosts is cut off for longer than the sessions' idle timeout, or
//! for a short while at a random moment; and an ending where one end of
//! each pair disconnects with receives left posted on both.  Where no
//! host died or stayed cut off and receives cannot go missing (not
//! lossy), every pair then connects again, the same VIs with new keys,
//! while packets of the ended connections may still be on the way, repeats
//! the first round (which breaks nothing) and ends again.
//!
//! `world.rs` carries it out in one thread between `Sim::step` calls,
//! reaping by polling and, a quarter of the times it would step with
//! nothing reaped, by waiting instead: `VipSendWait` or `VipRecvWait` on
//! an end with descriptors pending there, or `VipCQWait` on a host's CQ,
//! with a timeout of 0 to 200 ms, during which the simulation moves on
//! where the wait would sleep (`clock::simulated::stepping`; virtual time
//! never waits for real time).  It checks:
//! - a wait returns the completion a poll would, or `VIP_TIMEOUT` no
//!   sooner than its timeout in virtual time;
//! - every descriptor completes exactly once, in the order of its queue,
//!   with its whole status word, length and immediate data;
//! - a shared CQ names each receive completion once, naming the right VI,
//!   before `VipRecvDone` returns it, and is empty after each round;
//! - received bytes are the sent ones; no byte past a message in its
//!   receive buffer, nor past the buffer, changes; a receive that an RDMA
//!   write with immediate data consumed is untouched, and the write is in
//!   place when it completes;
//! - an RDMA write lands exactly in its range (visible once the round's
//!   closing send arrived), and nothing else of the target area changes;
//!   an RDMA read brings exactly the bytes of its range and nothing past them;
//! - a send longer than its receive: the receive completes with a length
//!   error and no byte past its buffer changes; the send's status by level
//!   (notes/contract.md, CHECK_TOO_LONG_SEND of tests/c/vt.h); reliable
//!   levels break that connection (both ends in the error state,
//!   VIP_ERROR_CONN_LOST at both), unreliable ones go on;
//! - a send that finds no receive (reliable levels) breaks its connection
//!   after everything before it arrived: VIP_ERROR_RECVQ_EMPTY at the
//!   receiver, VIP_ERROR_CONN_LOST at the sender, both in the error state;
//! - a refused RDMA write (notes/contract.md, "Forbidden RDMA write"):
//!   DONE|RDMA_PROT_ERROR at its initiator on every level, and no byte of
//!   it lands, in the target's areas, its region without RDMA access or
//!   the unregistered memory past its data region; reliable levels break
//!   that connection (VIP_ERROR_RDMAW_PROT at the target, CONN_LOST at the
//!   initiator) and flush what its VI posted after it, at both ends;
//!   unreliable ones report nothing and go on; a refused read (reliable
//!   levels, posted last) the same, with RDMAR_PROT, and no byte comes;
//! - what the sender posted before a send that breaks the connection
//!   completes as usual, but for an RDMA read, which may be flushed (its
//!   answer lost or overtaken by the BREAK: it had not completed when the
//!   connection broke);
//! - a host's death, or a partition longer than the idle timeout, breaks
//!   the connections across it and no other: the surviving ends reach the
//!   error state, VIP_ERROR_CONN_LOST is reported, and what they had posted
//!   completes flushed (a send on an unreliable VI goes out and completes);
//!   a short partition is survived without loss on reliable levels;
//! - lossy unreliable seeds: what arrives arrives at most once, in order,
//!   whole and uncorrupted, an RDMA write whole or not at all;
//! - the ending: the end that disconnects is idle at once with its
//!   receives flushed; the other reaches the error state, hears
//!   VIP_ERROR_CONN_LOST (unless its connection broke before), its
//!   receives flushed in order, and disconnects;
//! - no error callback but those; then every VI, CQ, region and tag goes.
//!
//! A failure names its seed, and the VI pair, end, round, op and
//! descriptor; `VIA_PROVIDER_SIM_SEED=n cargo test -p via-provider sim::`
//! replays seed `n` alone; `VIA_PROVIDER_SIM_SEEDS=n` runs seeds 1 to `n`.

mod memory;
mod plan;
mod world;

use plan::Plan;
pub(crate) use world::Summary;
use world::World;

/// Seeds a run takes by default (seeds 1 to this): thousands in the
/// optimized build that `make test` runs (about 40 s on two vCPUs), fewer
/// in a debug build (about 20 s).
const DEFAULT_SEEDS: u64 = if cfg!(debug_assertions) { 300 } else { OPTIMIZED_SEEDS };

/// Seeds the optimized build takes by default, the run that CI makes.
const OPTIMIZED_SEEDS: u64 = 3000;

/// A wrong expectation put into the checks on purpose, to see them fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Inject {
    None,
    /// Every received immediate datum is expected one bit off.
    WrongImmediate,
    /// Every received message is expected with its first byte inverted.
    WrongByte,
}

/// Runs seed `seed`; the error names the step that failed and the plan.
pub(crate) fn run_seed(seed: u64, inject: Inject) -> Result<Summary, String> {
    let plan = Plan::new(seed);
    run_plan(&plan, inject).map_err(|e| format!("{e}\n  plan: {plan}"))
}

fn run_plan(plan: &Plan, inject: Inject) -> Result<Summary, String> {
    let mut world = World::new(plan, inject)?;
    for k in 0..plan.rounds.len() {
        world.round(k)?;
        if plan.disrupted_after() == Some(k) {
            world.disrupt()?;
        }
    }
    world.ending()?;
    if plan.again() {
        world.connect_again()?;
        world.round(0)?;
        world.ending()?;
    }
    world.teardown()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    const SEED_VAR: &str = "VIA_PROVIDER_SIM_SEED";
    const SEEDS_VAR: &str = "VIA_PROVIDER_SIM_SEEDS";

    fn env_number(name: &str) -> Option<u64> {
        let v = std::env::var(name).ok()?;
        Some(v.trim().parse().unwrap_or_else(|_| panic!("{name}={v}: not a number")))
    }

    /// Runs a seed, turning a panic into its error.
    fn run_caught(seed: u64, inject: Inject) -> Result<Summary, String> {
        std::panic::catch_unwind(|| run_seed(seed, inject)).unwrap_or_else(|p| {
            let what = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
            Err(format!("panicked: {}", what.unwrap_or_default()))
        })
    }

    #[test]
    fn seeded_workloads_across_simulated_hosts() {
        let seeds: Vec<u64> = match env_number(SEED_VAR) {
            Some(seed) => vec![seed],
            None => (1..=env_number(SEEDS_VAR).unwrap_or(DEFAULT_SEEDS)).collect(),
        };
        let began = Instant::now();
        let (mut elapsed, mut completions, mut lost, mut sent, mut again) = (Duration::ZERO, 0, 0, 0, 0);
        let (mut waits, mut timeouts, mut scanned, mut declined) = (0, 0, 0, 0);
        let (mut local, mut ring) = (0, 0);
        let mut failures = Vec::new();
        for &seed in &seeds {
            match run_caught(seed, Inject::None) {
                Ok(s) => {
                    elapsed += s.elapsed;
                    completions += s.completions;
                    lost += s.stats.lost + s.stats.partitioned + s.stats.vanished;
                    sent += s.stats.sent;
                    again += s.again as usize;
                    waits += s.waits;
                    timeouts += s.timeouts;
                    scanned += s.scanned_entries;
                    declined += s.declined_crc as usize;
                    local += s.local_links;
                    ring += s.ring_links;
                }
                Err(e) => failures.push((seed, e)),
            }
        }
        let took = began.elapsed();
        println!(
            "{} seeds in {took:.1?} ({:.1} seeds/s): {completions} descriptors judged, {elapsed:.1?} of virtual time, \
             {sent} packets sent, {lost} lost; {again} connected again; {waits} waits, {timeouts} timed out; \
             {scanned} CQ entries found by scanning (CQ2); {declined} seeds with a host declining the payload CRC; \
             {local} connections over shared memory, {ring} of them through the ring",
            seeds.len(),
            seeds.len() as f64 / took.as_secs_f64()
        );
        // Among many seeds, some connect their VIs again.
        assert!(seeds.len() < 100 || again > 0, "no seed connected again");
        // Among many seeds, waits end both ways: a completion, the timeout.
        assert!(seeds.len() < 100 || (timeouts > 0 && timeouts < waits), "waits: {waits}, timed out: {timeouts}");
        // Among many seeds, hosts differ in their settings: some CQs scan,
        // some hosts decline the payload CRC (unless this process does).
        assert!(seeds.len() < 100 || scanned > 0, "no CQ entry found by scanning");
        assert!(seeds.len() < 100 || declined > 0, "no host declined the payload CRC");
        // Among many seeds, VIs of one host connect over shared memory,
        // some through the ring.
        assert!(seeds.len() < 100 || (ring > 0 && ring < local), "{local} over shared memory, {ring} through the ring");
        for (seed, e) in failures.iter().take(20) {
            println!("seed {seed}: {}", e.lines().next().unwrap_or_default());
        }
        if let Some((seed, e)) = failures.first() {
            let all: Vec<String> = failures.iter().map(|(s, _)| s.to_string()).collect();
            panic!(
                "{} of {} seeds failed: {}\nseed {seed}: {e}\nreplay it alone: VIA_PROVIDER_SIM_SEED={seed} cargo test -p via-provider sim::",
                failures.len(),
                seeds.len(),
                all.join(", ")
            );
        }
    }

    /// The first seed, from `from` on, whose plan has a send of at least
    /// one byte with immediate data that must arrive as it was sent.
    fn seed_with_a_plain_immediate_send(from: u64) -> u64 {
        (from..)
            .find(|&seed| {
                let plan = Plan::new(seed);
                !plan.lossy
                    && plan.disruption.is_none()
                    && plan.rounds.iter().enumerate().any(|(k, ops)| {
                        ops.iter().enumerate().any(|(i, op)| {
                            op.kind == plan::Kind::Send
                                && op.immediate.is_some()
                                && op.len > 0
                                && !plan.is_breaking(k, i)
                                && !plan.after_refusal(k, i)
                        })
                    })
            })
            .unwrap()
    }

    #[test]
    fn the_checks_fail_on_a_wrong_expectation() {
        let seed = seed_with_a_plain_immediate_send(1);
        run_caught(seed, Inject::None).unwrap_or_else(|e| panic!("seed {seed} fails as it is: {e}"));
        for (inject, says) in
            [(Inject::WrongImmediate, "immediate data 0x"), (Inject::WrongByte, "the bytes received differ")]
        {
            match run_caught(seed, inject) {
                Ok(_) => panic!("seed {seed} with {inject:?} passed"),
                Err(e) => assert!(e.contains(says), "seed {seed} with {inject:?} failed otherwise: {e}"),
            }
        }
    }

    #[test]
    fn a_workload_replays_exactly() {
        for seed in [seed_with_a_plain_immediate_send(1), 2, 3] {
            let first = run_caught(seed, Inject::None).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            let again = run_caught(seed, Inject::None).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            assert_eq!(first, again, "seed {seed} replayed otherwise");
        }
    }
}
