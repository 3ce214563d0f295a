//! The clock of the data path: times read from the CPU's time-stamp
//! counter where the kernel keeps its own clock on it.
//!
//! Every packet a session takes or sends is stamped with the time (RTT
//! samples, acknowledgement and retransmission deadlines), and a thread
//! that spins in a wait, or polls confined to one CPU, looks at the time
//! every sixteenth empty poll.  `Instant::now` costs about 50 ns on the
//! network path: the vDSO orders its counter read after every load before
//! it, among them the datagram just received.  Here the
//! counter is read unordered and scaled from an anchor, the system clock
//! and the counter read together, which each thread renews every few
//! milliseconds, so the time never strays from the system clock by more
//! than the drift of one such interval (microseconds at most; the
//! transport's timers are 200 µs and longer).  Without the kernel's
//! `tsc` clock source (or off x86-64) it is `Instant::now`.
//!
//! The sessions count time as `via_reliable::Time`, nanoseconds from an
//! epoch: [`now_time`] reads it in that form, [`time_of`] and
//! [`instant_of`] go between the two.

use std::sync::OnceLock;
use std::time::{Duration, Instant};
use via_reliable::Time;

/// The time now, as close to `Instant::now()` as the anchors keep it, and
/// never earlier than a previous reading on the same thread.
#[inline]
pub(crate) fn now() -> Instant {
    #[cfg(test)]
    if let Some(t) = simulated::now() {
        return t;
    }
    #[cfg(target_arch = "x86_64")]
    return instant_of(tsc::now());
    #[cfg(not(target_arch = "x86_64"))]
    Instant::now()
}

/// [`now`] as the sessions count time.
#[inline]
pub(crate) fn now_time() -> Time {
    #[cfg(test)]
    if let Some(t) = simulated::now() {
        return time_of(t);
    }
    #[cfg(target_arch = "x86_64")]
    return tsc::now();
    #[cfg(not(target_arch = "x86_64"))]
    time_of(Instant::now())
}

/// The epoch of [`Time`]s: ten years before the first call (an `Instant`
/// may lie before the boot), so that every `Instant` of the process and of
/// the whole-provider simulator lies after it.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(|| {
        let now = Instant::now();
        now.checked_sub(Duration::from_secs(10 * 365 * 86_400)).unwrap_or(now)
    })
}

/// `t` as the sessions count time.
#[inline]
pub(crate) fn time_of(t: Instant) -> Time {
    Time::from_nanos(t.saturating_duration_since(epoch()).as_nanos() as u64)
}

/// The `Instant` of `t`.
#[inline]
pub(crate) fn instant_of(t: Time) -> Instant {
    epoch() + Duration::from_nanos(t.as_nanos())
}

/// The time the waits' deadlines are counted in: the system's clock, or
/// in the whole-provider simulator its virtual time.
#[inline]
pub(crate) fn deadline_now() -> Instant {
    #[cfg(test)]
    if let Some(t) = simulated::now() {
        return t;
    }
    Instant::now()
}

/// Whether a wait on this thread runs inside the whole-provider
/// simulator's `simulated::stepping`: then it does not spin (virtual time
/// stands still meanwhile) but moves the simulation on where it would
/// sleep (`simulated_sleep`).
#[inline(always)]
pub(crate) fn simulating() -> bool {
    #[cfg(test)]
    return simulated::stepping_now();
    #[cfg(not(test))]
    false
}

/// Where a wait would sleep for `nap`: in the whole-provider simulator,
/// moves the simulation one step on instead, by at most `nap` of virtual
/// time, and returns true; elsewhere false (the caller sleeps).
#[inline(always)]
pub(crate) fn simulated_sleep(nap: std::time::Duration) -> bool {
    // On virtual time a real sleep would never reach the deadline: the
    // step panics if `stepping` did not install one.
    #[cfg(test)]
    if simulated::now().is_some() {
        simulated::step(nap);
        return true;
    }
    let _ = nap;
    false
}

/// The virtual time of the whole-provider simulator (`crate::sim`), on
/// the thread that runs it, and what a wait does there in place of
/// sleeping.
#[cfg(test)]
pub(crate) mod simulated {
    use std::cell::Cell;
    use std::time::{Duration, Instant};

    /// What a wait runs in place of a sleep (given its length), for the
    /// span of `stepping`.
    type Step = *mut (dyn FnMut(Duration) + 'static);

    thread_local! {
        static NOW: Cell<Option<Instant>> = const { Cell::new(None) };
        static STEP: Cell<Option<Step>> = const { Cell::new(None) };
    }

    /// Runs `f` (a wait, say) with `step` as what each of its sleeps does
    /// instead: move the simulation on, by at most the sleep's length.
    pub(crate) fn stepping<R>(step: &mut dyn FnMut(Duration), f: impl FnOnce() -> R) -> R {
        /// Puts the outer step back, also when `f` panics.
        struct Restore(Option<Step>);
        impl Drop for Restore {
            fn drop(&mut self) {
                STEP.with(|c| c.set(self.0));
            }
        }
        let short: *mut (dyn FnMut(Duration) + '_) = step;
        // SAFETY: only the lifetime is erased; `Restore` takes the pointer
        // out of the thread's cell before `step` goes out of scope.
        let erased: Step = unsafe { std::mem::transmute::<*mut (dyn FnMut(Duration) + '_), Step>(short) };
        let _restore = Restore(STEP.with(|c| c.replace(Some(erased))));
        f()
    }

    /// Whether `stepping` runs on this thread.
    pub(super) fn stepping_now() -> bool {
        STEP.with(Cell::get).is_some()
    }

    /// A wait would sleep: the step `stepping` installed runs.  Taken out
    /// of its cell meanwhile, so that it is never borrowed twice.
    pub(super) fn step(nap: Duration) {
        /// Puts the step back, also when it panics.
        struct Back(Step);
        impl Drop for Back {
            fn drop(&mut self) {
                STEP.with(|c| c.set(Some(self.0)));
            }
        }
        let step = STEP.with(Cell::take).expect("a wait in a simulation runs inside `simulated::stepping`");
        let _back = Back(step);
        // SAFETY: installed by `stepping`, whose `step` outlives this call.
        unsafe { (*step)(nap) };
    }

    /// The virtual time, if this thread runs a simulation.
    pub(super) fn now() -> Option<Instant> {
        NOW.with(Cell::get)
    }

    /// Sets this thread's virtual time; `None` returns it to the real clock.
    pub(crate) fn set(t: Option<Instant>) {
        NOW.with(|c| c.set(t));
    }
}

#[cfg(target_arch = "x86_64")]
mod tsc {
    use super::time_of;
    use std::cell::Cell;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    use std::time::{Duration, Instant};
    use via_reliable::Time;

    /// [`super::now_time`] on x86-64.
    #[inline]
    pub(super) fn now() -> Time {
        let scale = SCALE.load(Ordering::Relaxed);
        if scale != 0 {
            return ANCHOR.with(|cell| scaled(cell, scale));
        }
        calibrate()
    }

    /// Nanoseconds per counter tick as a 32.32 fixed-point number; 0 while
    /// calibrating or when the counter is not to be used.
    static SCALE: AtomicU64 = AtomicU64::new(0);

    /// A thread renews its anchor after this many ticks (about 4 ms at 4 GHz).
    const RENEW_TICKS: u64 = 1 << 24;

    /// Calibration takes at least this long: the scale is then within a few
    /// parts per million.
    const CALIBRATE_FOR: Duration = Duration::from_millis(2);

    /// The counter and the system clock read together (nanoseconds of
    /// [`Time`]), and the latest reading given out from them.
    #[derive(Clone, Copy)]
    struct Anchor {
        tsc: u64,
        at: u64,
        last: u64,
    }

    thread_local! {
        static ANCHOR: Cell<Anchor> = const { Cell::new(Anchor { tsc: 0, at: 0, last: 0 }) };
    }

    #[inline]
    fn tsc() -> u64 {
        // SAFETY: RDTSC exists on every x86-64 CPU and only reads the counter.
        unsafe { core::arch::x86_64::_rdtsc() }
    }

    #[inline]
    fn scaled(cell: &Cell<Anchor>, scale: u64) -> Time {
        let tsc = tsc();
        let mut a = cell.get();
        // An anchor that is fresh: the usual case.  A counter that went back
        // (another CPU's, a little behind) wraps to a huge distance and
        // renews the anchor as well, as does a thread's first reading.
        if a.at == 0 || tsc.wrapping_sub(a.tsc) >= RENEW_TICKS {
            let at = time_of(Instant::now()).as_nanos().max(a.last);
            a = Anchor { tsc, at, last: at };
        }
        let ns = ((tsc.wrapping_sub(a.tsc) as u128 * scale as u128) >> 32) as u64;
        a.last = a.last.max(a.at + ns);
        cell.set(a);
        Time::from_nanos(a.last)
    }

    /// The first reading and whether the counter may be used at all.
    static START: OnceLock<Option<(u64, Instant)>> = OnceLock::new();

    /// `Instant::now()`, and the scale once `CALIBRATE_FOR` has passed since
    /// the first call, if the kernel keeps its clock on the counter (it has
    /// then checked that the counter is invariant and the same on every CPU).
    fn calibrate() -> Time {
        let start = START.get_or_init(|| kernel_uses_tsc().then(|| (tsc(), Instant::now())));
        let now = Instant::now();
        // Without the counter, nothing more than `Instant::now` on every call.
        let Some((tsc0, t0)) = *start else { return time_of(now) };
        let elapsed = now.duration_since(t0);
        let ticks = tsc().wrapping_sub(tsc0);
        if elapsed >= CALIBRATE_FOR && ticks > 0 && ticks < u64::MAX / 2 {
            let scale = ((elapsed.as_nanos() << 32) / ticks as u128).min(u64::MAX as u128) as u64;
            SCALE.store(scale.max(1), Ordering::Relaxed);
        }
        time_of(now)
    }

    /// Whether the kernel's clock source is the time-stamp counter.
    fn kernel_uses_tsc() -> bool {
        std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
            .is_ok_and(|s| s.trim() == "tsc")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The sessions' time is the same clock: a reading turned into an
    /// `Instant` and back is itself, and it follows the system clock too.
    #[test]
    fn session_time_is_the_same_clock() {
        let slack = Duration::from_micros(20);
        let mut last = now_time();
        let begin = Instant::now();
        while begin.elapsed() < Duration::from_millis(10) {
            let before = time_of(Instant::now());
            let t = now_time();
            let after = time_of(Instant::now());
            assert_eq!(time_of(instant_of(t)), t);
            assert!(t >= last, "the clock went back");
            assert!(t + slack >= before && t <= after + slack, "{t:?} outside {before:?}..{after:?}");
            last = t;
        }
        // An `Instant` from before the first reading still has its time.
        assert!(time_of(begin) > via_reliable::Time::default());
    }

    #[test]
    fn readings_follow_the_system_clock_and_never_go_back() {
        // Within the drift of one anchor interval of the system clock read
        // just before and just after.
        let slack = Duration::from_micros(20);
        let begin = Instant::now();
        let mut last = now();
        // Through calibration and several anchor renewals.
        while begin.elapsed() < Duration::from_millis(30) {
            let before = Instant::now();
            let t = now();
            let after = Instant::now();
            assert!(t >= last, "the clock went back");
            assert!(t + slack >= before && t <= after + slack, "{t:?} outside {before:?}..{after:?}");
            last = t;
        }
        // A pause is measured as long as the system clock measures it: each
        // reading is bracketed by the system clock, so a preemption between
        // two reads widens the bracket instead of failing the check.
        let bracket = || {
            let before = Instant::now();
            let t = now();
            (before, t, Instant::now())
        };
        let (a0, a, a1) = bracket();
        std::thread::sleep(Duration::from_millis(5));
        let (b0, b, b1) = bracket();
        let ours = b - a;
        let slack = Duration::from_micros(50);
        assert!(ours + slack >= b0 - a1 && ours <= b1 - a0 + slack, "{ours:?} outside {:?}..{:?}", b0 - a1, b1 - a0);
    }
}
