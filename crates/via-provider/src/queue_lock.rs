//! The lock of a VI's work queue.
//!
//! Every post and every poll takes it, nearly always uncontended, and
//! nearly always from one thread: the application's.  So the lock is
//! *biased* to the thread that takes it `BIAS_AFTER` times in a row first
//! (the progress thread may take it while a connection is set up), which
//! then takes and releases it with plain stores, without the
//! compare-exchange that costs about 5 ns on the 4-byte path (twice per
//! message and once per empty poll).  The first time another thread wants
//! the lock, it revokes the bias for good: from then on every thread, the
//! former owner included, takes the lock word with a compare-exchange.
//! Since a lock is biased at most once, a thread that lost the bias and
//! still writes `owner_in` (it was preempted in the fast path) can never
//! overwrite the announcement of a later owner.
//!
//! The owner announces itself in `owner_in` and then checks that the lock
//! is still biased to it, with only a compiler fence between the store and
//! the load; the revoker marks the bias revoked and calls `membarrier(2)`,
//! which runs a full memory barrier on every thread of the process, before
//! it looks at `owner_in`.  One of the two sees the other, as if both had
//! fenced (the asymmetric fence of liburcu and folly).  Without
//! `membarrier` nothing is biased.
//!
//! A release of the lock word is a plain store as well.  The price is paid
//! by a waiter instead: it spins briefly, then yields, then naps in short
//! timed futex waits that nobody needs to end, since a holder keeps the
//! lock for one copy at most.

use std::sync::atomic::{compiler_fence, AtomicU32, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Duration;
use via_shm::futex::futex_wait;

const UNLOCKED: u32 = 0;
const LOCKED: u32 = 1;
const SPINS: u32 = 64;
const YIELDS: u32 = 16;
const NAP: Duration = Duration::from_micros(20);

/// `owner` of a lock no thread has taken yet.
const NOBODY: usize = 0;
/// `owner` of a lock whose bias is revoked (or was never possible).
const SHARED: usize = usize::MAX;
/// Takes of the word in a row by one thread that bias the lock to it.
const BIAS_AFTER: u32 = 1024;

/// The raw lock under [`QueueMutex`].
pub struct RawQueueLock {
    /// The lock word, for every thread but the owner of the bias.
    word: AtomicU32,
    /// The thread the lock is biased to (its [`thread_token`]), or
    /// `NOBODY`, or `SHARED`.  Set from `NOBODY` only by a holder of the
    /// word; never changes once `SHARED`.
    owner: AtomicUsize,
    /// The owner's token while it holds the lock by its bias, else 0.
    /// Written only by the owner.
    owner_in: AtomicUsize,
    /// Before the bias: the thread that took the word last and how many
    /// times in a row.  Read and written only by holders of the word.
    last_taker: AtomicUsize,
    streak: AtomicU32,
}

/// An address unique to the calling thread among the live ones, never 0
/// or `SHARED`.
#[inline]
fn thread_token() -> usize {
    thread_local! {
        static TOKEN: u8 = const { 0 };
    }
    TOKEN.with(|t| t as *const u8 as usize)
}

impl RawQueueLock {
    /// The bias's fast path: true if the calling thread owns the bias and
    /// now holds the lock.
    #[inline]
    fn lock_biased(&self) -> bool {
        let me = thread_token();
        if self.owner.load(Ordering::Relaxed) != me {
            return false;
        }
        self.owner_in.store(me, Ordering::Relaxed);
        // The revoker's membarrier supplies the hardware barrier.
        compiler_fence(Ordering::SeqCst);
        if self.owner.load(Ordering::Relaxed) == me {
            return true;
        }
        // Revoked meanwhile: the revoker may be waiting for us to leave.
        self.owner_in.store(0, Ordering::Release);
        false
    }

    fn try_acquire(&self) -> bool {
        self.word.compare_exchange_weak(UNLOCKED, LOCKED, Ordering::Acquire, Ordering::Relaxed).is_ok()
    }

    fn lock_word(&self) {
        let mut tries = 0u32;
        while !self.try_acquire() {
            tries = tries.saturating_add(1);
            if tries < SPINS {
                std::hint::spin_loop();
            } else if tries < SPINS + YIELDS {
                std::thread::yield_now();
            } else {
                // Returns at once if the lock was released meanwhile.
                futex_wait(&self.word, LOCKED, Some(NAP));
            }
        }
    }

    /// With the word held: settles the bias.  A holder that has taken the
    /// word `BIAS_AFTER` times in a row takes the bias if the process can
    /// revoke it; a holder that finds the bias another thread's revokes it
    /// and, if `wait`, waits until that thread has left.  Returns false if
    /// the owner is still inside (`!wait`).
    fn settle_bias(&self, wait: bool) -> bool {
        let me = thread_token();
        match self.owner.load(Ordering::Acquire) {
            SHARED => true,
            NOBODY => {
                let streak = if self.last_taker.load(Ordering::Relaxed) == me {
                    self.streak.load(Ordering::Relaxed) + 1
                } else {
                    self.last_taker.store(me, Ordering::Relaxed);
                    1
                };
                self.streak.store(streak, Ordering::Relaxed);
                if streak >= BIAS_AFTER {
                    let next = if membarrier::available() { me } else { SHARED };
                    self.owner.store(next, Ordering::Release);
                }
                true
            }
            // Our own bias, revoked by nobody: we hold the word as well.
            owner if owner == me => true,
            _ => {
                self.owner.store(SHARED, Ordering::SeqCst);
                membarrier::barrier();
                let mut tries = 0u32;
                while self.owner_in.load(Ordering::Acquire) != 0 {
                    if !wait {
                        return false;
                    }
                    tries = tries.saturating_add(1);
                    if tries < SPINS {
                        std::hint::spin_loop();
                    } else {
                        std::thread::yield_now();
                    }
                }
                true
            }
        }
    }
}

// SAFETY: the lock is exclusive.  The owner of the bias holds it when it
// has published `owner_in` and then still found the bias its own; any
// other thread holds it when it has taken the word (a compare-exchange from
// UNLOCKED) and then found the bias revoked, revoked it itself and seen
// `owner_in` empty after a process-wide barrier, or found nobody's bias
// (which only a holder of the word sets, once).
// The barrier pairs with the owner's compiler fence, so the owner and a
// revoker cannot both miss each other.  Each releases what it took: the
// owner clears `owner_in`, the others the word.  Guards are not `Send`,
// so the releasing thread is the taking one.
unsafe impl lock_api::RawMutex for RawQueueLock {
    #[allow(clippy::declare_interior_mutable_const)]
    const INIT: RawQueueLock = RawQueueLock {
        word: AtomicU32::new(UNLOCKED),
        owner: AtomicUsize::new(NOBODY),
        owner_in: AtomicUsize::new(0),
        last_taker: AtomicUsize::new(0),
        streak: AtomicU32::new(0),
    };
    type GuardMarker = lock_api::GuardNoSend;

    #[inline]
    fn lock(&self) {
        if self.lock_biased() {
            return;
        }
        self.lock_word();
        self.settle_bias(true);
    }

    fn try_lock(&self) -> bool {
        if self.lock_biased() {
            return true;
        }
        if self.word.compare_exchange(UNLOCKED, LOCKED, Ordering::Acquire, Ordering::Relaxed).is_err() {
            return false;
        }
        if self.settle_bias(false) {
            return true;
        }
        self.word.store(UNLOCKED, Ordering::Release);
        false
    }

    #[inline]
    unsafe fn unlock(&self) {
        let me = thread_token();
        if self.owner_in.load(Ordering::Relaxed) == me {
            self.owner_in.store(0, Ordering::Release);
        } else {
            self.word.store(UNLOCKED, Ordering::Release);
        }
    }
}

/// Gets the process ready to bias work-queue locks, before any is taken:
/// the kernel's registration for expedited barriers waits for a grace
/// period, milliseconds that a thread holding a lock word (with the other
/// thread waiting for it) must not spend.  Called when a VI is created.
pub(crate) fn prepare() {
    membarrier::available();
}

/// A work queue behind its lock.
pub type QueueMutex<T> = lock_api::Mutex<RawQueueLock, T>;
/// A held work-queue lock.
pub type QueueGuard<'a, T> = lock_api::MutexGuard<'a, RawQueueLock, T>;

/// `membarrier(2)` with `MEMBARRIER_CMD_PRIVATE_EXPEDITED`: a full memory
/// barrier on every running thread of this process.
mod membarrier {
    use super::OnceLock;
    use rustix::thread::{membarrier, membarrier_query, MembarrierCommand};

    /// The process registered for expedited barriers: its pid, or 0 if
    /// the kernel has none.
    pub(super) static REGISTERED: OnceLock<u32> = OnceLock::new();

    fn register() -> bool {
        membarrier_query().contains_command(MembarrierCommand::PrivateExpedited)
            && membarrier(MembarrierCommand::RegisterPrivateExpedited).is_ok()
    }

    /// Whether barriers can be had, registering the process on first use.
    pub(super) fn available() -> bool {
        *REGISTERED.get_or_init(|| if register() { std::process::id() } else { 0 }) != 0
    }

    /// The barrier.  Only called once `available` said yes; a child
    /// process after `fork` registers anew.
    pub(super) fn barrier() {
        loop {
            if membarrier(MembarrierCommand::PrivateExpedited).is_ok() {
                return;
            }
            // Not registered in this process (a child of a fork), or interrupted.
            register();
            std::thread::yield_now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A lock biased to the calling thread (if the kernel allows).
    fn biased<T>(value: T) -> Arc<QueueMutex<T>> {
        let m = Arc::new(QueueMutex::new(value));
        for _ in 0..BIAS_AFTER {
            drop(m.lock());
        }
        m
    }

    #[test]
    fn a_thread_that_takes_the_lock_in_a_row_owns_the_bias_until_another_locks() {
        let m = Arc::new(QueueMutex::new(()));
        // Another thread first, then this one, which must start its streak anew.
        let m1 = m.clone();
        std::thread::spawn(move || drop(m1.lock())).join().unwrap();
        for _ in 0..BIAS_AFTER - 1 {
            drop(m.lock());
        }
        assert_eq!(unsafe { m.raw() }.owner.load(Ordering::Relaxed), NOBODY);
        drop(m.lock());
        let owner = unsafe { m.raw() }.owner.load(Ordering::Relaxed);
        if membarrier::available() {
            assert_eq!(owner, thread_token());
            drop(m.lock());
            assert_eq!(unsafe { m.raw() }.owner_in.load(Ordering::Relaxed), 0, "the owner left");
            let m2 = m.clone();
            std::thread::spawn(move || drop(m2.lock())).join().unwrap();
        }
        assert_eq!(unsafe { m.raw() }.owner.load(Ordering::Relaxed), SHARED);
    }

    /// After `prepare`, taking the bias makes no registration (a system
    /// call of milliseconds) with the word held.  In a process of its own
    /// (this test binary again, running only this test): the registration
    /// is made once per process, and other tests here may have made it.
    #[test]
    fn prepare_registers_before_any_lock_is_biased() {
        const CHILD: &str = "VIA_TEST_PREPARE_CHILD";
        if std::env::var_os(CHILD).is_some() {
            assert!(membarrier::REGISTERED.get().is_none(), "registered before prepare");
            prepare();
            assert!(membarrier::REGISTERED.get().is_some(), "prepare did not register");
            if membarrier::available() {
                assert_eq!(*membarrier::REGISTERED.get().unwrap(), std::process::id());
            }
            return;
        }
        let name = "queue_lock::tests::prepare_registers_before_any_lock_is_biased";
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", name, "--test-threads=1", "--quiet"])
            .env(CHILD, "1")
            .status()
            .unwrap();
        assert!(status.success(), "the test in a process of its own: {status}");
    }

    #[test]
    fn contending_threads_never_share_the_lock() {
        // Each thread adds in two non-atomic steps with a yield between:
        // a lock that let two in at once would lose increments.  A thread
        // that runs ahead owns the bias until another revokes it.
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
    fn the_owner_and_a_revoker_never_share_the_lock() {
        // One thread owns the bias and keeps locking; the other arrives
        // while it works, revokes the bias and then contends on the word.
        for round in 0..50 {
            let m = biased(0u64);
            let m2 = m.clone();
            let other = std::thread::spawn(move || {
                for _ in 0..2_000 {
                    let mut g = m2.lock();
                    let v = *g;
                    std::hint::spin_loop();
                    *g = v + 1;
                }
            });
            for i in 0..2_000u64 {
                let mut g = m.lock();
                let v = *g;
                if (i + round) % 97 == 0 {
                    std::thread::yield_now();
                }
                *g = v + 1;
            }
            other.join().unwrap();
            assert_eq!(*m.lock(), 4_000);
        }
    }

    #[test]
    fn a_revoker_waits_for_the_owner_to_leave() {
        let m = biased(0u32);
        let g = m.lock(); // by the bias, if the kernel has membarrier
        let m2 = m.clone();
        let (tried, try_done) = std::sync::mpsc::channel();
        let waiter = std::thread::spawn(move || {
            assert!(m2.try_lock().is_none(), "try_lock entered beside the holder");
            tried.send(()).unwrap();
            *m2.lock() += 1;
        });
        // The holder keeps the lock until the waiter has tried, then long
        // enough for it to revoke and wait.
        try_done.recv().unwrap();
        std::thread::sleep(Duration::from_millis(30));
        drop(g);
        waiter.join().unwrap();
        assert_eq!(*m.lock(), 1);
    }

    #[test]
    fn a_waiter_gets_the_lock_a_long_holder_releases() {
        // Biased to a thread that is gone: this thread takes the word.
        let m1 = Arc::new(QueueMutex::new(0u32));
        let m = m1.clone();
        std::thread::spawn(move || {
            for _ in 0..BIAS_AFTER {
                drop(m1.lock());
            }
        })
        .join()
        .unwrap();
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
