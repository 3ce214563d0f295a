//! The provider's helper thread.
//!
//! It sleeps in `epoll` and wakes only for work the application is not
//! doing itself: a peer that disconnects, breaks the connection or dies
//! (its socket pair hangs up when its process exits, however it exits);
//! packets on a network port while nobody polls it; session timers
//! (acknowledgements, retransmissions, keep-alives); and the application's
//! error callbacks, which it runs outside any provider lock.

use crate::connect::Conn;
use crate::endpoint::PeerMessage;
use crate::handles::Handle;
use crate::net::NetPort;
use crate::nic::error_code;
use crate::Vi;
use parking_lot::Mutex;
use rustix::event::{epoll, eventfd, EventfdFlags};
use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Instant;

type Job = Box<dyn FnOnce() + Send>;

struct Helper {
    epoll: OwnedFd,
    wakeup: OwnedFd,
    /// token -> (VI, connection); tokens are never reused, so a late event
    /// of a closed connection cannot reach its successor.
    watched: Mutex<HashMap<u64, (Handle, Weak<Conn>)>>,
    next_token: AtomicU64,
    jobs: Mutex<VecDeque<Job>>,
    /// Network ports whose sockets and timers this thread serves.
    ports: Mutex<Vec<Weak<NetPort>>>,
    /// When the thread plans to wake next, in ns after `epoch` (u64::MAX: never).
    sleep_until: AtomicU64,
    epoch: Instant,
}

const WAKEUP_TOKEN: u64 = u64::MAX;
/// Tokens of port sockets have this bit set; the rest is the port's index.
const PORT_TOKEN: u64 = 1 << 62;

fn helper() -> &'static Helper {
    static HELPER: OnceLock<&'static Helper> = OnceLock::new();
    HELPER.get_or_init(|| {
        let epoll = epoll::create(epoll::CreateFlags::CLOEXEC);
        let wakeup = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK);
        let (epoll, wakeup) = match (epoll, wakeup) {
            (Ok(epoll), Ok(wakeup)) => (epoll, wakeup),
            (Err(e), _) | (_, Err(e)) => panic!("epoll/eventfd: {}", std::io::Error::from(e)),
        };
        let helper: &'static Helper = Box::leak(Box::new(Helper {
            epoll,
            wakeup,
            watched: Mutex::new(HashMap::new()),
            next_token: AtomicU64::new(1),
            jobs: Mutex::new(VecDeque::new()),
            ports: Mutex::new(Vec::new()),
            sleep_until: AtomicU64::new(u64::MAX),
            epoch: Instant::now(),
        }));
        add(helper, helper.wakeup.as_fd(), WAKEUP_TOKEN);
        std::thread::Builder::new()
            .name("via-progress".into())
            .spawn(move || run(helper))
            .expect("spawn the provider helper thread");
        helper
    })
}

fn add(h: &Helper, fd: BorrowedFd<'_>, token: u64) {
    let events = epoll::EventFlags::IN | epoll::EventFlags::RDHUP | epoll::EventFlags::HUP;
    let _ = epoll::add(&h.epoll, fd, epoll::EventData::new_u64(token), events);
}

/// Starts watching a shared-memory connection of VI `vi`.
pub fn watch(conn: &Arc<Conn>, vi: Handle) {
    let h = helper();
    let token = h.next_token.fetch_add(1, Ordering::Relaxed);
    conn.token.store(token, Ordering::Release);
    h.watched.lock().insert(token, (vi, Arc::downgrade(conn)));
    add(h, conn.socket.as_fd(), token);
}

/// Stops watching a connection (before its socket is closed).
pub fn unwatch(conn: &Arc<Conn>) {
    let h = helper();
    let token = conn.token.swap(0, Ordering::AcqRel);
    if token != 0 && h.watched.lock().remove(&token).is_some() {
        // The fd is still open (the Conn is alive).
        let _ = epoll::delete(&h.epoll, &conn.socket);
    }
}

/// Serves a network port: its socket when the application is not polling
/// it (`net::Handover`), and its sessions' timers.
pub fn watch_port(port: &Arc<NetPort>) {
    let h = helper();
    let mut ports = h.ports.lock();
    let index = ports.len() as u64;
    ports.push(Arc::downgrade(port));
    drop(ports);
    port.token.store(PORT_TOKEN | index, Ordering::Release);
    port.handover.armed.store(true, Ordering::SeqCst);
    port.watch(h.epoll.as_raw_fd(), PORT_TOKEN | index);
}

/// Arms the one-shot report of a port's sockets again (the caller has set
/// `armed`): a datagram already waiting is reported at once.
pub fn arm_port(port: &NetPort) {
    let h = helper();
    port.watch(h.epoll.as_raw_fd(), port.token.load(Ordering::Acquire));
}

/// The helper thread drains a port and arms its report again; false if
/// another thread is draining it (then `service_ports` tries again soon).
fn take_over(port: &NetPort) -> bool {
    if !port.poll(true) {
        return false;
    }
    port.handover.armed.store(true, Ordering::SeqCst);
    arm_port(port);
    true
}

/// How soon the helper thread tries again to take over a port that another
/// thread was draining.
const BUSY_RETRY: std::time::Duration = std::time::Duration::from_micros(20);

/// Makes sure the helper thread wakes by `deadline` (a session timer).
pub fn kick_before(deadline: Instant) {
    let h = helper();
    let at = deadline.saturating_duration_since(h.epoch).as_nanos() as u64;
    if at < h.sleep_until.load(Ordering::Acquire) {
        wake(h);
    }
}

/// True on the helper thread itself (where waiting for a callback to end
/// would wait for ourselves).
pub fn on_helper_thread() -> bool {
    std::thread::current().name() == Some("via-progress")
}

/// Runs `job` on the helper thread (error callbacks).
pub fn defer(job: Job) {
    let h = helper();
    h.jobs.lock().push_back(job);
    wake(h);
}

fn wake(h: &Helper) {
    let _ = rustix::io::write(&h.wakeup, &1u64.to_ne_bytes());
}

/// Runs the ports' timers and takes over the sockets the application has
/// stopped polling; returns how long to sleep (None: until woken).
fn service_ports(h: &Helper) -> Option<std::time::Duration> {
    let ports: Vec<Arc<NetPort>> = h.ports.lock().iter().filter_map(Weak::upgrade).collect();
    let now = Instant::now();
    let mut look_again = None;
    for port in ports.iter().filter(|p| !p.handover.armed.load(Ordering::SeqCst)) {
        let at = if !port.handover.helper_drains(crate::net::epoch_ns()) {
            let ns = port.handover.look_again_ns().saturating_sub(crate::net::epoch_ns());
            now + std::time::Duration::from_nanos(ns)
        } else if take_over(port) {
            continue;
        } else {
            now + BUSY_RETRY
        };
        look_again = Some(look_again.map_or(at, |t: Instant| t.min(at)));
    }
    // The sessions' timers of a port the application polls are its polls'.
    let timers = ports.iter().filter(|p| !p.handover.app_is_polling()).filter_map(|p| p.service(now));
    match timers.chain(look_again).min() {
        None => {
            h.sleep_until.store(u64::MAX, Ordering::Release);
            None
        }
        Some(t) => {
            h.sleep_until.store(t.saturating_duration_since(h.epoch).as_nanos() as u64, Ordering::Release);
            Some(t.saturating_duration_since(Instant::now()))
        }
    }
}

fn run(h: &'static Helper) {
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 64];
    loop {
        let n = wait(h, &mut events, service_ports(h));
        h.sleep_until.store(0, Ordering::Release);
        for ev in events.iter().take(n.max(0) as usize) {
            let token = ev.u64;
            if token == WAKEUP_TOKEN {
                // Drains our eventfd.
                let _ = rustix::io::read(&h.wakeup, &mut [0u8; 8]);
                loop {
                    let job = h.jobs.lock().pop_front();
                    match job {
                        Some(job) => job(),
                        None => break,
                    }
                }
            } else if token & PORT_TOKEN != 0 {
                let port = h.ports.lock().get((token & !PORT_TOKEN) as usize).and_then(Weak::upgrade);
                if let Some(port) = port {
                    // One-shot: the report is spent, and the sockets leave the
                    // epoll set until it is armed again.  Drain now if nobody
                    // else will; otherwise `service_ports` looks again later.
                    port.unwatch();
                    port.handover.armed.store(false, Ordering::SeqCst);
                    if port.handover.helper_drains(crate::net::epoch_ns()) {
                        take_over(&port);
                    }
                }
            } else {
                connection_event(h, token);
            }
        }
    }
}

/// Sleeps in epoll until an event or the timeout.  Session timers (delayed
/// acknowledgements) need microseconds: `epoll_pwait2` where the kernel has
/// it, otherwise `epoll_wait` rounded up to whole milliseconds.  (rustix
/// picks one of the two when it is built, not by what the kernel has.)
fn wait(h: &Helper, events: &mut [libc::epoll_event], timeout: Option<std::time::Duration>) -> i32 {
    static NO_PWAIT2: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let max = events.len() as i32;
    if !NO_PWAIT2.load(Ordering::Relaxed) {
        let ts = timeout
            .map(|d| libc::timespec { tv_sec: d.as_secs() as libc::time_t, tv_nsec: d.subsec_nanos() as libc::c_long });
        let tsp = ts.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec);
        // SAFETY: the buffer holds `max` events; tsp is null or a valid timespec.
        let n = unsafe { libc::epoll_pwait2(h.epoll.as_raw_fd(), events.as_mut_ptr(), max, tsp, std::ptr::null()) };
        if n >= 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ENOSYS) {
            return n;
        }
        NO_PWAIT2.store(true, Ordering::Relaxed);
    }
    let ms = timeout.map_or(-1, |d| d.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32);
    // SAFETY: the buffer holds `max` events.
    unsafe { libc::epoll_wait(h.epoll.as_raw_fd(), events.as_mut_ptr(), max, ms) }
}

fn connection_event(h: &Helper, token: u64) {
    let entry = h.watched.lock().get(&token).cloned();
    let Some((vi, conn)) = entry else { return };
    let Some(conn) = conn.upgrade() else { return };
    let code = match crate::peer_channel::read(conn.socket.as_fd()).map(|m| m.map(|m| m.msg)) {
        Ok(Some(PeerMessage::Break(code))) => Some(code),
        Ok(Some(PeerMessage::Disconnect)) => Some(error_code::CONN_LOST),
        Err(e) if e.kind() != std::io::ErrorKind::WouldBlock => Some(error_code::CONN_LOST),
        _ => None,
    };
    if let Some(code) = code {
        unwatch(&conn);
        if let Ok(vi) = Vi::get(vi) {
            vi.peer_lost(&conn, code);
        }
    }
}
