//! Timeouts in the specification's milliseconds, and the adaptive spin
//! that precedes sleeping.

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

/// How long a waiter spins before sleeping (`VIA_SPIN_US`, default 50 µs).
pub fn spin_window() -> Duration {
    static SPIN: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *SPIN.get_or_init(|| {
        let us = std::env::var("VIA_SPIN_US").ok().and_then(|v| v.parse().ok()).unwrap_or(50);
        Duration::from_micros(us)
    })
}
