//! Timeouts in the specification's milliseconds, and the adaptive spin
//! that precedes sleeping.

use crate::tuning::{tuning, Spin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// `VIP_INFINITE`: values at or above it wait for ever.
pub const INFINITE_MS: u64 = 0xFFFF_FFFF;

/// A deadline, or none for ever.
#[derive(Debug, Clone, Copy)]
pub struct Deadline(Option<Instant>);

impl Deadline {
    /// The deadline `ms` milliseconds from now (`INFINITE_MS` and above: never).
    pub fn after_ms(ms: u64) -> Deadline {
        Deadline((ms < INFINITE_MS).then(|| crate::clock::deadline_now() + Duration::from_millis(ms)))
    }
    /// Time left; `None` for ever.
    pub fn remaining(&self) -> Option<Duration> {
        self.0.map(|d| d.saturating_duration_since(crate::clock::deadline_now()))
    }
    /// True once the deadline has passed.
    pub fn passed(&self) -> bool {
        matches!(self.0, Some(d) if crate::clock::deadline_now() >= d)
    }
    /// The later of this deadline and `grace` from now.
    pub fn extended_by(&self, grace: Duration) -> Deadline {
        Deadline(self.0.map(|d| d.max(crate::clock::deadline_now() + grace)))
    }
    /// `max` from now, or sooner if this deadline comes first.
    pub fn capped(&self, max: Duration) -> Deadline {
        let cap = crate::clock::deadline_now() + max;
        Deadline(Some(self.0.map_or(cap, |d| d.min(cap))))
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
        Spin::Adaptive => ADAPTIVE.lock().window(),
    }
}

/// Tells the adaptive spin how long a wait that succeeded took.
fn waited(took: Duration) {
    if tuning().spin == Spin::Adaptive {
        ADAPTIVE.lock().record(took);
    }
}

/// The spinning part of a wait (`VipRecvWait`, `VipCQWait`).  A clock read
/// costs about as much as a poll, so the spin reads it on every
/// `CLOCK_EVERY`-th empty poll only (the first included, for a wait of no
/// time), and a wait that succeeds reads it again only for the adaptive
/// spin: an answer within the window is noticed about as soon as polling
/// would notice it.
pub struct SpinWait {
    start: Instant,
    /// The end of the window, or the deadline if that is sooner.
    until: Instant,
    /// How long the spin may go on past `until` while the transfer it
    /// waits for is under way (`spin_while`): `BUSY_MAX`, or the deadline.
    busy_until: Instant,
    polls: u32,
    spinning: bool,
}

/// How long a wait spins on past its window while what it waits for is
/// visibly arriving (`SpinWait::spin_while`): a 16 MiB copy between
/// processes takes about 1.5 ms here.  Sleeping in the middle of a
/// transfer costs a wake-up, tens of µs on a VM whose idle vCPU halts,
/// for every message longer than the window.
pub const BUSY_MAX: Duration = Duration::from_millis(2);

impl SpinWait {
    /// A wait starting now, with `deadline`.
    pub fn start(deadline: &Deadline) -> SpinWait {
        let start = crate::clock::now();
        let window = start + spin_window();
        let until = deadline.0.map_or(window, |d| d.min(window));
        let busy = start + BUSY_MAX;
        let busy_until = deadline.0.map_or(busy, |d| d.min(busy)).max(until);
        SpinWait { start, until, busy_until, polls: 0, spinning: true }
    }

    /// After an empty poll: whether to poll again at once (still within the
    /// window).  Once false, it stays false.
    pub fn spin(&mut self) -> bool {
        self.spin_while(|| false)
    }

    /// As `spin`, and past the window while `under_way` says that the
    /// transfer this wait is for is arriving (a message partly placed, a
    /// peer's copy into this process), up to `BUSY_MAX`: that wait ends
    /// soon, and a sleep now would cost a wake-up.  `under_way` is asked
    /// at the looks at the clock past the window only.
    pub fn spin_while(&mut self, under_way: impl FnOnce() -> bool) -> bool {
        if crate::clock::simulating() {
            return false;
        }
        if self.spinning && self.polls.is_multiple_of(CLOCK_EVERY) {
            let now = crate::clock::now();
            if now >= self.until && !(now < self.busy_until && under_way()) {
                self.spinning = false;
            }
        }
        self.polls = self.polls.wrapping_add(1);
        if self.spinning {
            std::hint::spin_loop();
        }
        self.spinning
    }

    /// The wait succeeded.
    pub fn done(&self) {
        if tuning().spin == Spin::Adaptive {
            waited(self.start.elapsed());
        }
    }
}

/// What the adaptive spin has seen of recent waits.
static ADAPTIVE: parking_lot::Mutex<Adaptive> = parking_lot::Mutex::new(Adaptive::new());

/// The longest adaptive spin.
const ADAPTIVE_MAX: Duration = Duration::from_micros(500);

/// The adaptive spin, as interrupt coalescing waits a little for the next
/// packet: it spins twice as long as quick answers have been taking, if
/// most answers are quick.  A wait is quick when it ends within
/// `ADAPTIVE_MAX`; a long one (the peer computing, or idle) only lowers the
/// share of quick ones, so one idle spell does not stop the spinning for
/// the quick answers that follow.  When most waits are long, spinning only
/// burns the CPU the peer may need: sleep at once.
#[derive(Debug, Clone, Copy)]
struct Adaptive {
    /// Mean of recent quick waits, ns (0: none yet).
    quick_ns: u64,
    /// Share of quick waits among recent ones, in 1/1024.
    quick_share: u32,
}

impl Adaptive {
    const fn new() -> Adaptive {
        Adaptive { quick_ns: 0, quick_share: 1024 }
    }

    /// Moving averages over about eight waits.
    fn record(&mut self, took: Duration) {
        let ns = took.as_nanos().min(u64::MAX as u128) as u64;
        let quick = took <= ADAPTIVE_MAX;
        self.quick_share = self.quick_share - self.quick_share / 8 + if quick { 1024 / 8 } else { 0 };
        if quick {
            self.quick_ns =
                if self.quick_ns == 0 { ns.max(1) } else { (self.quick_ns - self.quick_ns / 8 + ns / 8).max(1) };
        }
    }

    fn window(&self) -> Duration {
        if self.quick_share < 512 {
            return Duration::ZERO;
        }
        if self.quick_ns == 0 {
            return Duration::from_micros(50);
        }
        Duration::from_nanos(self.quick_ns.saturating_mul(2)).clamp(Duration::from_micros(2), ADAPTIVE_MAX)
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
/// share it with the peer that must answer: once its polls have found
/// nothing for `YIELD_AFTER` (at once), it offers the CPU to whoever else is ready
/// there (`sched_yield`), so a polling application waits about as long as
/// the peer needs, not a scheduler tick.  A yield that comes back at once
/// found nobody else ready: the thread then polls without yielding for
/// `ALONE_FOR`, so a peer on a CPU of its own that is merely late costs no
/// system calls.  The clock is read every `CLOCK_EVERY` empty polls only.
/// A process that may use several CPUs makes no system call on an empty
/// poll.
#[inline]
pub fn idle_poll() {
    if ONE_CPU.load(Ordering::Relaxed) {
        idle_poll_on_one_cpu();
    }
}

/// `idle_poll` where the process has one CPU, kept out of the polls' code.
#[cold]
#[inline(never)]
fn idle_poll_on_one_cpu() {
    STREAK.with(|s| {
        let empty = s.empty.get().wrapping_add(1);
        s.empty.set(empty);
        if empty % CLOCK_EVERY == 0 {
            let now = crate::clock::now();
            let since = s.since.get().unwrap_or(now);
            s.since.set(Some(since));
            if now.duration_since(since) >= YIELD_AFTER && s.quiet_until.get().is_none_or(|q| now >= q) {
                // SAFETY: no arguments; cannot fail in a way that matters here.
                unsafe { libc::sched_yield() };
                let back = crate::clock::now();
                s.quiet_until.set((back.duration_since(now) < YIELDED_TO_NOBODY).then_some(back + ALONE_FOR));
            }
        }
    });
}

/// What `take` finds (a completion); if nothing, what it finds after
/// `progress` if that may have completed something (it read the network):
/// a completion already there costs no system call.
pub(crate) fn done_first<T>(progress: impl FnOnce() -> bool, mut take: impl FnMut() -> Option<T>) -> Option<T> {
    let got = take();
    if got.is_some() || !progress() {
        return got;
    }
    take()
}

/// The answer of a `Done` call to what its poll found, with the spin
/// bookkeeping of a busy or an idle poll.
pub(crate) fn poll_answer<T>(got: Option<T>) -> via_core::error::ViaResult<T> {
    match got {
        Some(x) => {
            busy_poll();
            Ok(x)
        }
        None => {
            idle_poll();
            Err(via_core::error::ViaError::NotDone)
        }
    }
}

/// A poll found something: the next empty poll starts a new streak.
#[inline]
pub fn busy_poll() {
    if ONE_CPU.load(Ordering::Relaxed) {
        STREAK.with(|s| {
            s.empty.set(0);
            s.since.set(None);
        });
    }
}

/// How long a thread confined to one CPU polls in vain before it yields:
/// not at all past its first look at the clock (`CLOCK_EVERY` empty
/// polls).  The peer that must answer may be waiting for this CPU, and
/// polls of a few µs before each yield made a 4-byte ping-pong of two
/// processes on one CPU 1.5-2× TCP's; a thread alone on its CPU yields once
/// per `ALONE_FOR`.
const YIELD_AFTER: Duration = Duration::ZERO;
/// A yield shorter than this let nobody else run.
const YIELDED_TO_NOBODY: Duration = Duration::from_micros(2);
/// How long a thread that found nobody else ready polls without yielding.
const ALONE_FOR: Duration = Duration::from_micros(200);
/// Empty polls between two looks at the clock.
const CLOCK_EVERY: u32 = 16;

/// A thread's current streak of empty polls, each part in a cell of its
/// own: an empty poll touches only its count.
struct Streak {
    empty: std::cell::Cell<u32>,
    /// When the streak was first seen on the clock.
    since: std::cell::Cell<Option<Instant>>,
    /// No yield before then: the last one found nobody else ready.
    quiet_until: std::cell::Cell<Option<Instant>>,
}

thread_local! {
    static STREAK: Streak = const {
        Streak {
            empty: std::cell::Cell::new(0),
            since: std::cell::Cell::new(None),
            quiet_until: std::cell::Cell::new(None),
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spin_ends_with_its_window_or_its_deadline() {
        // A wait of no time does not spin at all.
        assert!(!SpinWait::start(&Deadline::after_ms(0)).spin());
        // A later deadline: spins until the window (50 µs by default) is
        // over, noticed within CLOCK_EVERY polls, and then no more.
        let mut spin = SpinWait::start(&Deadline::after_ms(10_000));
        assert!(spin.spin());
        std::thread::sleep(spin_window() + Duration::from_millis(1));
        let polls = (0..=CLOCK_EVERY).take_while(|_| spin.spin()).count();
        assert!(polls < CLOCK_EVERY as usize, "still spinning after {polls} polls past the window");
        assert!(!spin.spin());
    }

    #[test]
    fn a_spin_goes_on_past_its_window_while_the_transfer_is_under_way() {
        use crate::clock::simulated;
        let t0 = Instant::now();
        let at = |d: Duration| simulated::set(Some(t0 + d));
        let past_window = spin_window() + Duration::from_millis(1);
        at(Duration::ZERO);
        let mut spin = SpinWait::start(&Deadline::after_ms(10_000));
        at(past_window);
        // Past the window, still spinning while the transfer is under way ...
        for _ in 0..4 * CLOCK_EVERY {
            assert!(spin.spin_while(|| true));
        }
        // ... and no longer once it is not.
        let polls = (0..=CLOCK_EVERY).take_while(|_| spin.spin_while(|| false)).count();
        assert!(polls < CLOCK_EVERY as usize, "still spinning after {polls} polls");
        assert!(!spin.spin_while(|| true), "a spin that ended stays ended");

        // Never past BUSY_MAX, however long the transfer takes.
        at(Duration::ZERO);
        let mut spin = SpinWait::start(&Deadline::after_ms(10_000));
        at(past_window);
        assert!(spin.spin_while(|| true));
        at(BUSY_MAX);
        let polls = (0..=CLOCK_EVERY).take_while(|_| spin.spin_while(|| true)).count();
        assert!(polls < CLOCK_EVERY as usize, "spinning past BUSY_MAX");
        simulated::set(None);

        // Nor past the deadline: a wait of no time does not spin.
        assert!(!SpinWait::start(&Deadline::after_ms(0)).spin_while(|| true));
    }

    fn after(waits_us: &[u64]) -> Duration {
        let mut a = Adaptive::new();
        for &w in waits_us {
            a.record(Duration::from_micros(w));
        }
        a.window()
    }

    #[test]
    fn adaptive_window_follows_quick_waits() {
        assert_eq!(after(&[]), Duration::from_micros(50));
        assert_eq!(after(&[10; 20]), Duration::from_micros(20));
        assert_eq!(after(&[0; 20]), Duration::from_micros(2));
        assert_eq!(after(&[300; 20]), ADAPTIVE_MAX);
    }

    #[test]
    fn one_long_wait_does_not_stop_the_spin() {
        let mut waits = vec![10; 20];
        waits.push(50_000);
        waits.push(10);
        assert_eq!(after(&waits), Duration::from_micros(20));
    }

    #[test]
    fn mostly_long_waits_sleep_at_once() {
        assert_eq!(after(&[5_000; 20]), Duration::ZERO);
        let mut waits = vec![5_000; 20];
        waits.extend([10; 3]);
        assert_eq!(after(&waits), Duration::ZERO);
        waits.extend([10; 10]);
        assert_eq!(after(&waits), Duration::from_micros(20));
    }
}
