//! Futex wait and wake on a 32-bit word, shared between processes.
//!
//! The futexes are not `FUTEX_PRIVATE`: the word lives in a shared mapping
//! and the waiter and the waker are different processes.

use rustix::io::Errno;
use rustix::thread::futex;
use rustix::thread::futex::Timespec;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// Sleeps while `word` holds `expected`, until woken or `timeout` passes.
///
/// Returns false only on timeout; a wake-up, a changed value, a signal or a
/// spurious return give true, so callers re-check their condition.
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) -> bool {
    let ts = timeout.map(|d| Timespec {
        tv_sec: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        tv_nsec: i64::from(d.subsec_nanos()),
    });
    // Shared (not FUTEX_PRIVATE): the waker is another process.
    futex::wait(word, futex::Flags::empty(), expected, ts.as_ref()) != Err(Errno::TIMEDOUT)
}

/// Wakes up to `n` waiters sleeping on `word` in any process.
pub fn futex_wake(word: &AtomicU32, n: i32) {
    // Nothing to do about a failure: the word is ours and aligned.
    let _ = futex::wake(word, futex::Flags::empty(), n as u32);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn times_out_when_nobody_wakes() {
        let w = AtomicU32::new(7);
        let t = Instant::now();
        assert!(!futex_wait(&w, 7, Some(Duration::from_millis(60))));
        assert!(t.elapsed() >= Duration::from_millis(55));
    }

    #[test]
    fn returns_at_once_when_the_value_differs() {
        let w = AtomicU32::new(1);
        assert!(futex_wait(&w, 2, Some(Duration::from_secs(10))));
    }

    #[test]
    fn an_endless_timeout_still_sleeps_until_woken() {
        let w = AtomicU32::new(0);
        let t = Instant::now();
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(80));
                w.store(1, std::sync::atomic::Ordering::SeqCst);
                futex_wake(&w, 1);
            });
            // An overflowing deadline must not make the kernel refuse to sleep.
            assert!(futex_wait(&w, 0, Some(Duration::MAX)));
        });
        assert!(t.elapsed() >= Duration::from_millis(70));
    }
}
