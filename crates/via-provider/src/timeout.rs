//! Timeouts in the specification's milliseconds, and the adaptive spin
//! that precedes sleeping.

use crate::tuning::{tuning, Spin};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
/// default 50 µs, or `adaptive`).  Each empty poll of the spin goes
/// through `idle_poll`, so a spin on one CPU lets the peer run.
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

/// Whether this process may run on one CPU only (its affinity, or the
/// machine), as seen when a NIC last opened.
static ONE_CPU: AtomicBool = AtomicBool::new(false);

/// Looks at the CPUs this process may run on (`VipOpenNic`).
pub fn check_cpus() {
    // SAFETY: cpu_set_t is plain data, filled by the kernel.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: our own affinity into a set of the right size.
    let ok = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) } == 0;
    // SAFETY: a set the kernel filled.
    let one = ok && unsafe { libc::CPU_COUNT(&set) } == 1;
    ONE_CPU.store(one, Ordering::Relaxed);
}

/// Called when a poll (`VipRecvDone`, `VipSendDone`, `VipCQDone`, and the
/// spin of the waits) found nothing.  A process confined to one CPU may
/// share it with the peer that must answer, so it offers the CPU to
/// whoever else is ready there (`sched_yield`, which returns at once when
/// nobody is): a polling application then waits as long as the peer needs,
/// not a scheduler tick.  A process that may use several CPUs makes no
/// system call on an empty poll.
pub fn idle_poll() {
    if ONE_CPU.load(Ordering::Relaxed) {
        // SAFETY: no arguments; cannot fail in a way that matters here.
        unsafe { libc::sched_yield() };
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
