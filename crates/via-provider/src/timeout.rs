//! Timeouts in the specification's milliseconds, and the adaptive spin
//! that precedes sleeping.

use crate::tuning::{tuning, Spin};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// `VIP_INFINITE`: values at or above it wait for ever.
pub const INFINITE_MS: u64 = 0xFFFF_FFFF;

/// A deadline, or none for ever.
#[derive(Debug, Clone, Copy)]
pub struct Deadline(Option<Instant>);

impl Deadline {
    /// The deadline `ms` milliseconds from now (`INFINITE_MS` and above: never).
    pub fn after_ms(ms: u64) -> Deadline {
        Deadline((ms < INFINITE_MS).then(|| Instant::now() + Duration::from_millis(ms)))
    }
    /// Time left; `None` for ever.
    pub fn remaining(&self) -> Option<Duration> {
        self.0.map(|d| d.saturating_duration_since(Instant::now()))
    }
    /// True once the deadline has passed.
    pub fn passed(&self) -> bool {
        matches!(self.0, Some(d) if Instant::now() >= d)
    }
    /// Time left as a Duration, with "for ever" as a long time.
    pub fn remaining_or_long(&self) -> Duration {
        self.remaining().unwrap_or(Duration::from_secs(100 * 365 * 24 * 3600))
    }
    /// How long to sleep next: the time left, capped so that sleepers look
    /// around now and then for changes that do not wake them.
    pub fn next_sleep(&self, cap: Duration) -> Duration {
        self.remaining().map_or(cap, |r| r.min(cap))
    }
}

/// How long a waiter spins before sleeping (`VIA_SPIN_US`: a fixed window,
/// default 50 µs, or `adaptive`).
pub fn spin_window() -> Duration {
    match tuning().spin {
        Spin::Fixed(d) => d,
        Spin::Adaptive => adaptive_window(RECENT_WAIT_NS.load(Ordering::Relaxed)),
    }
}

/// Tells the adaptive spin how long a wait that succeeded took.
pub fn waited(took: Duration) {
    if tuning().spin == Spin::Adaptive {
        let ns = took.as_nanos().min(u64::MAX as u128) as u64;
        let old = RECENT_WAIT_NS.load(Ordering::Relaxed);
        // A moving average over about eight waits; races only lose a sample.
        let new = if old == 0 { ns } else { old - old / 8 + ns / 8 };
        RECENT_WAIT_NS.store(new.max(1), Ordering::Relaxed);
    }
}

/// The mean of recent waits, in nanoseconds (0: none yet).
static RECENT_WAIT_NS: AtomicU64 = AtomicU64::new(0);

/// The longest adaptive spin.
const ADAPTIVE_MAX: Duration = Duration::from_micros(500);

/// Spin a little longer than answers have been taking, as interrupt
/// coalescing waits a little for the next packet; when answers take longer
/// than `ADAPTIVE_MAX`, spinning only burns the CPU the peer may need, so
/// sleep at once.
fn adaptive_window(mean_ns: u64) -> Duration {
    let window = Duration::from_nanos(mean_ns.saturating_mul(2));
    match mean_ns {
        0 => Duration::from_micros(50),
        _ if window > ADAPTIVE_MAX => Duration::ZERO,
        _ => window.max(Duration::from_micros(2)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adaptive_window_follows_recent_waits() {
        assert_eq!(adaptive_window(0), Duration::from_micros(50));
        assert_eq!(adaptive_window(10_000), Duration::from_micros(20));
        assert_eq!(adaptive_window(100), Duration::from_micros(2));
        assert_eq!(adaptive_window(400_000), Duration::ZERO);
    }
}
