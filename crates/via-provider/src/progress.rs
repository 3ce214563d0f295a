//! The provider's helper thread.
//!
//! It sleeps in `epoll` on the socket pairs of connected VIs and wakes only
//! when a peer disconnects, breaks the connection or dies (the socket hangs
//! up when its process exits, however it exits).  It also runs the
//! application's error callbacks, outside any provider lock.

use crate::connect::{read_msg, Conn};
use crate::endpoint::PeerMessage;
use crate::handles::Handle;
use crate::nic::error_code;
use crate::Vi;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, OnceLock};

type Job = Box<dyn FnOnce() + Send>;

struct Helper {
    epoll: OwnedFd,
    wakeup: OwnedFd,
    watched: Mutex<HashMap<RawFd, (Handle, std::sync::Weak<Conn>)>>,
    jobs: Mutex<VecDeque<Job>>,
}

const WAKEUP_TOKEN: u64 = u64::MAX;

fn helper() -> &'static Helper {
    static HELPER: OnceLock<&'static Helper> = OnceLock::new();
    HELPER.get_or_init(|| {
        // SAFETY: plain syscalls; results checked.
        let (epoll, wakeup) = unsafe {
            let ep = libc::epoll_create1(libc::EPOLL_CLOEXEC);
            let ev = libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK);
            assert!(
                ep >= 0 && ev >= 0,
                "epoll/eventfd: {}",
                std::io::Error::last_os_error()
            );
            (OwnedFd::from_raw_fd(ep), OwnedFd::from_raw_fd(ev))
        };
        let helper: &'static Helper = Box::leak(Box::new(Helper {
            epoll,
            wakeup,
            watched: Mutex::new(HashMap::new()),
            jobs: Mutex::new(VecDeque::new()),
        }));
        add(helper, helper.wakeup.as_raw_fd(), WAKEUP_TOKEN);
        std::thread::Builder::new()
            .name("via-progress".into())
            .spawn(move || run(helper))
            .expect("spawn the provider helper thread");
        helper
    })
}

fn add(h: &Helper, fd: RawFd, token: u64) {
    let mut ev = libc::epoll_event {
        events: (libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLHUP) as u32,
        u64: token,
    };
    // SAFETY: registering an fd we hold open.
    unsafe { libc::epoll_ctl(h.epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) };
}

/// Starts watching a connection of VI `vi`.
pub fn watch(conn: &Arc<Conn>, vi: Handle) {
    let h = helper();
    let fd = conn.socket.as_raw_fd();
    h.watched.lock().insert(fd, (vi, Arc::downgrade(conn)));
    add(h, fd, fd as u64);
}

/// Stops watching a connection (before its socket is closed).
pub fn unwatch(conn: &Arc<Conn>) {
    let h = helper();
    let fd = conn.socket.as_raw_fd();
    let mut watched = h.watched.lock();
    if watched
        .get(&fd)
        .is_some_and(|(_, w)| std::ptr::eq(w.as_ptr(), Arc::as_ptr(conn)))
    {
        watched.remove(&fd);
        // SAFETY: the fd is still open (the Conn is alive).
        unsafe {
            libc::epoll_ctl(
                h.epoll.as_raw_fd(),
                libc::EPOLL_CTL_DEL,
                fd,
                std::ptr::null_mut(),
            )
        };
    }
}

/// Runs `job` on the helper thread (error callbacks).
pub fn defer(job: Job) {
    let h = helper();
    h.jobs.lock().push_back(job);
    let one: u64 = 1;
    // SAFETY: writing 8 bytes to our eventfd.
    unsafe {
        libc::write(
            h.wakeup.as_raw_fd(),
            &one as *const u64 as *const libc::c_void,
            8,
        )
    };
}

fn run(h: &'static Helper) {
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 64];
    loop {
        // SAFETY: the buffer holds 64 events.
        let n = unsafe { libc::epoll_wait(h.epoll.as_raw_fd(), events.as_mut_ptr(), 64, -1) };
        for ev in events.iter().take(n.max(0) as usize) {
            let token = ev.u64;
            if token == WAKEUP_TOKEN {
                let mut buf = 0u64;
                // SAFETY: draining our eventfd.
                unsafe {
                    libc::read(
                        h.wakeup.as_raw_fd(),
                        &mut buf as *mut u64 as *mut libc::c_void,
                        8,
                    )
                };
                loop {
                    let job = h.jobs.lock().pop_front();
                    match job {
                        Some(job) => job(),
                        None => break,
                    }
                }
                continue;
            }
            let entry = h.watched.lock().get(&(token as RawFd)).cloned();
            let Some((vi, conn)) = entry else { continue };
            let Some(conn) = conn.upgrade() else { continue };
            let code = match read_msg(&conn.socket) {
                Ok(Some(PeerMessage::Break(code))) => Some(code),
                Ok(Some(PeerMessage::Disconnect)) | Err(_) => Some(error_code::CONN_LOST),
                Ok(_) => None,
            };
            if let Some(code) = code {
                unwatch(&conn);
                drop(conn);
                if let Ok(vi) = Vi::get(vi) {
                    vi.peer_lost(code);
                }
            }
        }
    }
}
