//! The lock of a VI's work queue.
//!
//! Every post and every poll takes it, nearly always uncontended, so its
//! release is a plain store.  A parking lock's release is a
//! read-modify-write, to learn whether somebody sleeps, and on the 4-byte
//! path the four of those per message cost as much as the ring transfer.
//! The price is paid by a waiter instead: it spins briefly, then yields,
//! then naps in short timed futex waits that nobody needs to end, since a
//! holder keeps the lock for one copy at most.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use via_shm::futex::futex_wait;

const UNLOCKED: u32 = 0;
const LOCKED: u32 = 1;
const SPINS: u32 = 64;
const YIELDS: u32 = 16;
const NAP: Duration = Duration::from_micros(20);

/// The raw lock under [`QueueMutex`].
pub struct RawQueueLock(AtomicU32);

impl RawQueueLock {
    fn try_acquire(&self) -> bool {
        self.0.compare_exchange_weak(UNLOCKED, LOCKED, Ordering::Acquire, Ordering::Relaxed).is_ok()
    }
}

// SAFETY: the lock is exclusive: it is taken only by a successful
// compare-exchange from UNLOCKED, and released only by its holder.
unsafe impl lock_api::RawMutex for RawQueueLock {
    #[allow(clippy::declare_interior_mutable_const)]
    const INIT: RawQueueLock = RawQueueLock(AtomicU32::new(UNLOCKED));
    type GuardMarker = lock_api::GuardSend;

    fn lock(&self) {
        let mut tries = 0u32;
        while !self.try_acquire() {
            tries = tries.saturating_add(1);
            if tries < SPINS {
                std::hint::spin_loop();
            } else if tries < SPINS + YIELDS {
                std::thread::yield_now();
            } else {
                // Returns at once if the lock was released meanwhile.
                futex_wait(&self.0, LOCKED, Some(NAP));
            }
        }
    }

    fn try_lock(&self) -> bool {
        self.0.compare_exchange(UNLOCKED, LOCKED, Ordering::Acquire, Ordering::Relaxed).is_ok()
    }

    unsafe fn unlock(&self) {
        self.0.store(UNLOCKED, Ordering::Release);
    }
}

/// A work queue behind its lock.
pub type QueueMutex<T> = lock_api::Mutex<RawQueueLock, T>;
/// A held work-queue lock.
pub type QueueGuard<'a, T> = lock_api::MutexGuard<'a, RawQueueLock, T>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn contending_threads_never_share_the_lock() {
        // Each thread adds in two non-atomic steps with a yield between:
        // a lock that let two in at once would lose increments.
        let counter = Arc::new(QueueMutex::new(0u64));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let c = counter.clone();
                std::thread::spawn(move || {
                    for i in 0..20_000u64 {
                        let mut g = c.lock();
                        let v = *g;
                        if i % 1000 == 0 {
                            std::thread::yield_now();
                        }
                        *g = v + 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*counter.lock(), 80_000);
    }

    #[test]
    fn a_waiter_gets_the_lock_a_long_holder_releases() {
        let m = Arc::new(QueueMutex::new(0u32));
        let g = m.lock();
        let m2 = m.clone();
        let waiter = std::thread::spawn(move || {
            *m2.lock() += 1;
        });
        // Long enough for the waiter to reach its futex naps.
        std::thread::sleep(Duration::from_millis(30));
        assert!(m.try_lock().is_none());
        drop(g);
        waiter.join().unwrap();
        assert_eq!(*m.lock(), 1);
    }
}
