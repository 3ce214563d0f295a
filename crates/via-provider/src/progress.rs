//! The provider's progress engine: one helper thread per process.
//!
//! It sleeps in `epoll` and wakes only for work the application is not
//! doing itself.  What it serves registers as a [`Source`]: a shared-memory
//! connection (its socket pair tells of a peer that disconnects, breaks the
//! connection or dies: it hangs up when the peer's process exits, however
//! it exits), a network port (packets while nobody polls it, and the
//! sessions' timers: acknowledgements, retransmissions, keep-alives).  It
//! also runs the application's error callbacks, outside any provider lock.
//! The engine knows nothing of connections or ports: it calls their
//! `Source` methods.

use parking_lot::Mutex;
use rustix::event::{epoll, eventfd, EventfdFlags};
use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

type Job = Box<dyn FnOnce() + Send>;

/// Something the engine serves.
pub(crate) trait Source: Send + Sync {
    /// A file descriptor registered under its token was reported (readable
    /// or hung up).
    fn ready(&self);

    /// Runs what is due by `now` (timed sources only); returns when the
    /// engine should call again (`None`: only when its descriptors are
    /// reported).
    fn service(&self, _now: Instant) -> Option<Instant> {
        None
    }
}

/// A source's token: its key in the engine and its epoll data.  Tokens are
/// never reused, so a late event of a source that went cannot reach another.
pub(crate) type Token = u64;

struct Engine {
    epoll: OwnedFd,
    wakeup: OwnedFd,
    sources: Mutex<HashMap<Token, Weak<dyn Source>>>,
    /// The sources that asked for `service` calls.
    timed: Mutex<Vec<(Token, Weak<dyn Source>)>>,
    next_token: AtomicU64,
    jobs: Mutex<VecDeque<Job>>,
    /// When the thread plans to wake next, in ns after `epoch` (u64::MAX: never).
    sleep_until: AtomicU64,
    epoch: Instant,
}

const WAKEUP_TOKEN: Token = u64::MAX;

/// The process's engine, started at the first use.  A child that `fork`
/// made has no helper thread: it starts an engine of its own at its first
/// use, for the pointer to the parent's reads as null there (`engine_slot`).
fn engine() -> &'static Engine {
    let slot = engine_slot();
    let e = slot.load(Ordering::Acquire);
    if e.is_null() {
        return start(slot);
    }
    // SAFETY: a non-null pointer is an engine leaked by `start`, never freed.
    unsafe { &*e }
}

/// Where the pointer to the engine lives: a page the kernel zeroes in a
/// child made by `fork` (`MADV_WIPEONFORK`, Linux 4.14), however the fork
/// was made (a fork by the system call itself skips libc's handlers).
/// Where the kernel refuses, a `pthread_atfork` handler clears it instead.
fn engine_slot() -> &'static AtomicPtr<Engine> {
    static SLOT: std::sync::OnceLock<&'static AtomicPtr<Engine>> = std::sync::OnceLock::new();
    SLOT.get_or_init(|| {
        let page = 4096;
        // SAFETY: an anonymous private mapping of one page, checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Box::leak(Box::new(AtomicPtr::new(std::ptr::null_mut())));
        }
        // SAFETY: `p` is the page just mapped.
        if unsafe { libc::madvise(p, page, libc::MADV_WIPEONFORK) } != 0 {
            tracing::debug!("no MADV_WIPEONFORK: a forked child's helper thread rests on pthread_atfork");
        }
        // SAFETY: the page is zeroed (a null pointer), aligned, mapped for
        // the process's life, and only ever used as this atomic.
        unsafe { &*(p as *const AtomicPtr<Engine>) }
    })
}

#[cold]
fn start(slot: &'static AtomicPtr<Engine>) -> &'static Engine {
    static AT_FORK: std::sync::Once = std::sync::Once::new();
    AT_FORK.call_once(|| {
        // SAFETY: registers a handler that only stores to an atomic.
        unsafe { libc::pthread_atfork(None, None, Some(forget_in_child)) };
    });
    let epoll = epoll::create(epoll::CreateFlags::CLOEXEC);
    let wakeup = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK);
    let (epoll, wakeup) = match (epoll, wakeup) {
        (Ok(epoll), Ok(wakeup)) => (epoll, wakeup),
        (Err(e), _) | (_, Err(e)) => panic!("epoll/eventfd: {}", std::io::Error::from(e)),
    };
    let fresh = Box::into_raw(Box::new(Engine {
        epoll,
        wakeup,
        sources: Mutex::new(HashMap::new()),
        timed: Mutex::new(Vec::new()),
        next_token: AtomicU64::new(1),
        jobs: Mutex::new(VecDeque::new()),
        sleep_until: AtomicU64::new(u64::MAX),
        epoch: Instant::now(),
    }));
    match slot.compare_exchange(std::ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {
            // SAFETY: `fresh` is now the engine, leaked for the process's life.
            let engine: &'static Engine = unsafe { &*fresh };
            add(&engine.epoll, engine.wakeup.as_fd(), WAKEUP_TOKEN);
            std::thread::Builder::new()
                .name(THREAD_NAME.into())
                .spawn(move || run(engine))
                .expect("spawn the provider helper thread");
            engine
        }
        Err(first) => {
            // Another thread started it first: this one was never shared.
            // SAFETY: `fresh` came from `Box::into_raw` above, `first` is leaked.
            unsafe {
                drop(Box::from_raw(fresh));
                &*first
            }
        }
    }
}

/// In the child of a `fork`: the parent's engine has no thread here, and
/// its locks may have been held at the fork.  The child leaves it alone
/// and starts its own at its first use.  (Async-signal-safe: one store.)
extern "C" fn forget_in_child() {
    engine_slot().store(std::ptr::null_mut(), Ordering::Release);
}

const THREAD_NAME: &str = "via-progress";

/// Registers `source`; `timed` ones are asked for `service` on every turn
/// of the engine.  The engine holds it weakly: a source that goes is
/// forgotten.
pub(crate) fn register(source: Weak<dyn Source>, timed: bool) -> Token {
    let e = engine();
    let token = e.next_token.fetch_add(1, Ordering::Relaxed);
    e.sources.lock().insert(token, source.clone());
    if timed {
        e.timed.lock().push((token, source));
        wake(e);
    }
    token
}

/// Forgets a source; false if it was not registered.  Its descriptors must
/// leave the epoll set ([`unwatch_fd`]) before they are closed.
pub(crate) fn unregister(token: Token) -> bool {
    let e = engine();
    e.timed.lock().retain(|(t, _)| *t != token);
    e.sources.lock().remove(&token).is_some()
}

/// Reports `fd` to its source whenever it is readable or hangs up.
pub(crate) fn watch_fd(fd: BorrowedFd<'_>, token: Token) {
    add(&engine().epoll, fd, token);
}

fn add(epoll: &OwnedFd, fd: BorrowedFd<'_>, token: Token) {
    let events = epoll::EventFlags::IN | epoll::EventFlags::RDHUP | epoll::EventFlags::HUP;
    let _ = epoll::add(epoll, fd, epoll::EventData::new_u64(token), events);
}

/// Stops reporting `fd` (before it is closed).
pub(crate) fn unwatch_fd(fd: BorrowedFd<'_>) {
    let _ = epoll::delete(&engine().epoll, fd);
}

/// The engine's epoll set, for sources that report their descriptors once
/// (`EPOLLONESHOT`) and arm them again themselves.
pub(crate) fn epoll_fd() -> RawFd {
    engine().epoll.as_raw_fd()
}

/// Makes sure the engine calls its timed sources by `deadline`.
pub(crate) fn kick_before(deadline: Instant) {
    let e = engine();
    let at = deadline.saturating_duration_since(e.epoch).as_nanos() as u64;
    if at < e.sleep_until.load(Ordering::Acquire) {
        wake(e);
    }
}

/// True on the helper thread itself (where waiting for a callback to end
/// would wait for ourselves).
pub fn on_helper_thread() -> bool {
    std::thread::current().name() == Some(THREAD_NAME)
}

/// Runs `job` on the helper thread (error callbacks).
pub fn defer(job: Job) {
    let e = engine();
    e.jobs.lock().push_back(job);
    wake(e);
}

fn wake(e: &Engine) {
    let _ = rustix::io::write(&e.wakeup, &1u64.to_ne_bytes());
}

/// Serves the timed sources; returns how long to sleep (None: until woken).
fn service(e: &Engine) -> Option<Duration> {
    let timed: Vec<Arc<dyn Source>> = e.timed.lock().iter().filter_map(|(_, s)| s.upgrade()).collect();
    let now = Instant::now();
    match timed.iter().filter_map(|s| s.service(now)).min() {
        None => {
            e.sleep_until.store(u64::MAX, Ordering::Release);
            None
        }
        Some(t) => {
            e.sleep_until.store(t.saturating_duration_since(e.epoch).as_nanos() as u64, Ordering::Release);
            Some(t.saturating_duration_since(Instant::now()))
        }
    }
}

fn run(e: &'static Engine) {
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 64];
    loop {
        let n = wait(e, &mut events, service(e));
        e.sleep_until.store(0, Ordering::Release);
        for ev in events.iter().take(n.max(0) as usize) {
            let token = ev.u64;
            if token == WAKEUP_TOKEN {
                // Drains our eventfd.
                let _ = rustix::io::read(&e.wakeup, &mut [0u8; 8]);
                loop {
                    let job = e.jobs.lock().pop_front();
                    match job {
                        Some(job) => job(),
                        None => break,
                    }
                }
            } else {
                let source = e.sources.lock().get(&token).and_then(Weak::upgrade);
                if let Some(source) = source {
                    source.ready();
                }
            }
        }
    }
}

/// Sleeps in epoll until an event or the timeout.  Session timers (delayed
/// acknowledgements) need microseconds: `epoll_pwait2` where the kernel has
/// it, otherwise `epoll_wait` rounded up to whole milliseconds.  (rustix
/// picks one of the two when it is built, not by what the kernel has.)
fn wait(e: &Engine, events: &mut [libc::epoll_event], timeout: Option<Duration>) -> i32 {
    static NO_PWAIT2: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let max = events.len() as i32;
    if !NO_PWAIT2.load(Ordering::Relaxed) {
        let ts = timeout
            .map(|d| libc::timespec { tv_sec: d.as_secs() as libc::time_t, tv_nsec: d.subsec_nanos() as libc::c_long });
        let tsp = ts.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec);
        // SAFETY: the buffer holds `max` events; tsp is null or a valid timespec.
        let n = unsafe { libc::epoll_pwait2(e.epoll.as_raw_fd(), events.as_mut_ptr(), max, tsp, std::ptr::null()) };
        if n >= 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ENOSYS) {
            return n;
        }
        NO_PWAIT2.store(true, Ordering::Relaxed);
    }
    let ms = timeout.map_or(-1, |d| d.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32);
    // SAFETY: the buffer holds `max` events.
    unsafe { libc::epoll_wait(e.epoll.as_raw_fd(), events.as_mut_ptr(), max, ms) }
}

/// Waits up to 5 s for `f` to hold, else fails with `what` (the tests of
/// the helper thread's work).
#[cfg(test)]
pub(crate) fn eventually(what: &str, f: impl Fn() -> bool) {
    let until = Instant::now() + Duration::from_secs(5);
    while !f() {
        assert!(Instant::now() < until, "{what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// A source that counts the engine's calls, with an eventfd to report.
    struct Counted {
        fd: OwnedFd,
        ready: AtomicUsize,
        serviced: AtomicUsize,
        every: Duration,
    }

    impl Source for Counted {
        fn ready(&self) {
            let _ = rustix::io::read(&self.fd, &mut [0u8; 8]);
            self.ready.fetch_add(1, Ordering::SeqCst);
        }
        fn service(&self, now: Instant) -> Option<Instant> {
            self.serviced.fetch_add(1, Ordering::SeqCst);
            Some(now + self.every)
        }
    }

    fn counted(every: Duration) -> Arc<Counted> {
        let fd = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK).unwrap();
        Arc::new(Counted { fd, ready: AtomicUsize::new(0), serviced: AtomicUsize::new(0), every })
    }

    #[test]
    fn a_registered_descriptor_reaches_its_source_and_an_unregistered_one_does_not() {
        let s = counted(Duration::from_secs(3600));
        let weak: Weak<dyn Source> = Arc::downgrade(&s) as Weak<dyn Source>;
        let token = register(weak, false);
        watch_fd(s.fd.as_fd(), token);
        rustix::io::write(&s.fd, &1u64.to_ne_bytes()).unwrap();
        eventually("the source hears of its descriptor", || s.ready.load(Ordering::SeqCst) >= 1);
        assert_eq!(s.serviced.load(Ordering::SeqCst), 0, "an untimed source is never serviced");
        assert!(unregister(token));
        assert!(!unregister(token), "a token is forgotten once");
        let before = s.ready.load(Ordering::SeqCst);
        rustix::io::write(&s.fd, &1u64.to_ne_bytes()).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(s.ready.load(Ordering::SeqCst), before, "an unregistered source hears nothing");
        unwatch_fd(s.fd.as_fd());
    }

    #[test]
    fn a_timed_source_is_serviced_when_it_asks_until_it_goes() {
        let s = counted(Duration::from_millis(2));
        let weak: Weak<dyn Source> = Arc::downgrade(&s) as Weak<dyn Source>;
        let token = register(weak, true);
        eventually("serviced again and again", || s.serviced.load(Ordering::SeqCst) >= 5);
        drop(s);
        // A source that went is skipped, not called: nothing to assert on
        // it but that the engine goes on serving others.
        let t = counted(Duration::from_millis(2));
        let token2 = register(Arc::downgrade(&t) as Weak<dyn Source>, true);
        eventually("a second source is served", || t.serviced.load(Ordering::SeqCst) >= 3);
        assert!(unregister(token) && unregister(token2));
        let after = t.serviced.load(Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(30));
        assert!(t.serviced.load(Ordering::SeqCst) <= after + 1, "an unregistered source is not serviced");
    }

    #[test]
    fn deferred_jobs_run_on_the_helper_thread_in_order() {
        let (tx, rx) = std::sync::mpsc::channel();
        for i in 0..3 {
            let tx = tx.clone();
            defer(Box::new(move || tx.send((i, on_helper_thread())).unwrap()));
        }
        let got: Vec<_> = (0..3).map(|_| rx.recv_timeout(Duration::from_secs(5)).unwrap()).collect();
        assert_eq!(got, vec![(0, true), (1, true), (2, true)]);
        assert!(!on_helper_thread());
    }
}
