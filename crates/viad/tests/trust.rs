//! The agent and its clients against a hostile local user: impostors,
//! stops by strangers, connection floods, no random source.
//!
//! The hostile user is uid/gid 65534.  A thread takes that identity with the
//! raw `setresuid` family of system calls, which (unlike glibc's wrappers)
//! change the calling thread only, so the rest of the test process stays
//! root; a child process takes it in `pre_exec`.  Every test needs root and
//! prints "skipped: needs root" without it.

use std::fs;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use viad::client::{self, Agent, AgentError};
use viad::proto::{self, ErrorKind, ListenReq, Reply};
use viad::sock;

const VIAD: &str = env!("CARGO_BIN_EXE_viad");
const LO: [u8; 4] = [127, 0, 0, 1];
const NOBODY: u32 = 65534;
const SECOND: Duration = Duration::from_secs(1);

/// Whether this test can run (it needs root); prints why not.
fn root(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        eprintln!("{test}: skipped: needs root");
    }
    root
}

/// Makes the calling thread uid/gid 65534 with no supplementary groups (the
/// thread only: raw system calls, not glibc's process-wide wrappers).
fn become_nobody_thread() {
    let id = libc::c_long::from(NOBODY);
    // SAFETY: credential system calls of the calling thread.
    unsafe {
        assert_eq!(libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()), 0);
        assert_eq!(libc::syscall(libc::SYS_setresgid, id, id, id), 0);
        assert_eq!(libc::syscall(libc::SYS_setresuid, id, id, id), 0);
        assert_eq!(libc::geteuid(), NOBODY);
    }
}

/// Runs `f` on a new thread of uid 65534.
fn as_nobody<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> JoinHandle<T> {
    thread::spawn(move || {
        become_nobody_thread();
        f()
    })
}

/// Makes a child process uid/gid 65534 before it runs its program.
fn nobody_process(cmd: &mut Command) {
    // SAFETY: only async-signal-safe system calls between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let ok = libc::setgroups(0, std::ptr::null()) == 0
                && libc::setresgid(NOBODY, NOBODY, NOBODY) == 0
                && libc::setresuid(NOBODY, NOBODY, NOBODY) == 0;
            match ok {
                true => Ok(()),
                false => Err(std::io::Error::last_os_error()),
            }
        });
    }
}

/// What an impostor saw of the one connection it accepted.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    bytes: usize,
    fds: usize,
}

/// An impostor agent: a thread of uid 65534 that binds `name`, accepts one
/// connection and reports what arrived on it until the client hung up.
/// Returns once the name is bound.
fn impostor(name: &str) -> JoinHandle<Seen> {
    let name = name.to_string();
    let (bound, is_bound) = mpsc::channel();
    let handle = as_nobody(move || {
        let listener = sock::listen(&name).unwrap();
        bound.send(()).unwrap();
        assert!(sock::wait_readable(listener.as_fd(), Some(10 * SECOND)).unwrap(), "nobody came");
        let conn = sock::accept(listener.as_fd()).unwrap();
        let mut seen = Seen { bytes: 0, fds: 0 };
        loop {
            assert!(sock::wait_readable(conn.as_fd(), Some(10 * SECOND)).unwrap(), "the client never hung up");
            match sock::recv(conn.as_fd()) {
                Ok(None) => return seen,
                Ok(Some(msg)) => {
                    seen.bytes += msg.data.len();
                    seen.fds += msg.fds.len();
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("impostor: {e}"),
            }
        }
    });
    is_bound.recv().unwrap();
    handle
}

/// A stand-in bell.
fn bell() -> OwnedFd {
    // SAFETY: plain syscall; the fd is owned from here on.
    let fd = unsafe { libc::memfd_create(c"bell".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    unsafe { OwnedFd::from_raw_fd(fd) }
}

fn name(tag: &str) -> String {
    format!("openvia-trust-{}-{tag}", std::process::id())
}

/// A `viad` of this test, root's.
struct Viad {
    child: Child,
    agent: Agent,
}

impl Viad {
    /// Starts `viad` on its own socket; `setup` may adjust the command.
    fn start(tag: &str, args: &[&str], setup: impl FnOnce(&mut Command)) -> Viad {
        let socket = name(tag);
        let mut cmd = Command::new(VIAD);
        cmd.args(["--socket", &socket, "--idle-timeout", "0", "--cm-port", "0"]).args(args);
        setup(&mut cmd);
        let child = cmd.spawn().unwrap();
        let mut viad = Viad { child, agent: Agent::with_socket(&socket) };
        let deadline = Instant::now() + 5 * SECOND;
        while viad.agent.stats().is_err() {
            assert!(viad.child.try_wait().unwrap().is_none(), "viad exited early");
            assert!(Instant::now() < deadline, "viad did not come up");
            thread::sleep(Duration::from_millis(10));
        }
        viad
    }

    fn stat(&self, name: &str) -> u64 {
        let stats = self.agent.stats().unwrap();
        stats.into_iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("no counter {name}")).1
    }

    /// Waits until counter `name` reads `value`.
    fn await_stat(&self, name: &str, value: u64) {
        let deadline = Instant::now() + 5 * SECOND;
        loop {
            let now = self.stat(name);
            if now == value {
                return;
            }
            assert!(Instant::now() < deadline, "{name} is {now}, never became {value}");
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// CPU time (user and system) the agent has used, in seconds.
    fn cpu_seconds(&self) -> f64 {
        let stat = fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap();
        // The fields after the command name, which may hold spaces, from
        // field 3 on: utime and stime are fields 14 and 15.
        let rest: Vec<&str> = stat[stat.rfind(')').unwrap() + 1..].split_whitespace().collect();
        let ticks: u64 = rest[11].parse::<u64>().unwrap() + rest[12].parse::<u64>().unwrap();
        // SAFETY: sysconf has no preconditions.
        ticks as f64 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
    }

    /// Asserts the agent uses little CPU over one second.
    fn assert_quiet(&self) {
        let before = self.cpu_seconds();
        thread::sleep(SECOND);
        let used = self.cpu_seconds() - before;
        assert!(used < 0.25, "the agent used {used:.2} s of CPU in 1 s");
    }

    /// The agent's open-files limits (soft, hard), from /proc.
    fn fd_limits(&self) -> (String, String) {
        let limits = fs::read_to_string(format!("/proc/{}/limits", self.child.id())).unwrap();
        let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap();
        let f: Vec<&str> = line.split_whitespace().collect();
        (f[3].to_string(), f[4].to_string())
    }
}

impl Drop for Viad {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Gives a child process `soft`/`hard` open-files limits.
fn fd_limit(cmd: &mut Command, soft: u64, hard: u64) {
    // SAFETY: setrlimit is async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            let lim = libc::rlimit { rlim_cur: soft, rlim_max: hard };
            match libc::setrlimit(libc::RLIMIT_NOFILE, &lim) {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            }
        });
    }
}

/// A listen request for `disc` on loopback that waits for ever.
fn listen_bytes(disc: &[u8]) -> Vec<u8> {
    let req = ListenReq { host: LO.to_vec(), disc: disc.to_vec(), info: vec![], timeout_ms: proto::FOREVER, pid: 0 };
    proto::Request::Listen(req).encode().unwrap()
}

/// What the agent said on `conn` so far: `None` if nothing, else its reply
/// (a refused connection may report the reset before the reason).
fn said(conn: BorrowedFd) -> Option<Reply> {
    if !sock::wait_readable(conn, Some(Duration::ZERO)).unwrap() {
        return None;
    }
    let msg = match sock::recv(conn) {
        Err(e) if e.raw_os_error() == Some(libc::ECONNRESET) => sock::recv(conn).unwrap(),
        other => other.unwrap(),
    };
    Some(Reply::decode(&msg.expect("closed without a reply").data).unwrap())
}

#[test]
fn an_agent_of_another_user_is_refused_before_anything_is_sent() {
    if !root("an_agent_of_another_user_is_refused_before_anything_is_sent") {
        return;
    }
    let socket = name("impostor");
    let fake = impostor(&socket);
    let ib = bell();
    let err = Agent::with_socket(&socket).listen(&LO, b"svc", b"secret", ib.as_fd(), Some(SECOND)).unwrap_err();
    let AgentError::Untrusted { socket: s, uid, pid } = &err else {
        panic!("{err:?}");
    };
    // The impostor is a thread of this process.
    assert_eq!((s.as_str(), *uid, *pid), (socket.as_str(), NOBODY, std::process::id() as i32));
    let text = err.to_string();
    for part in [format!("@{socket}"), format!("uid {NOBODY}"), format!("pid {}", std::process::id())] {
        assert!(text.contains(&part), "{text:?} lacks {part:?}");
    }
    assert_eq!(fake.join().unwrap(), Seen { bytes: 0, fds: 0 }, "the impostor got something");
}

#[test]
fn a_user_falls_back_to_an_agent_of_its_own() {
    if !root("a_user_falls_back_to_an_agent_of_its_own") {
        return;
    }
    let socket = name("fallback");
    let own = client::user_socket_name(&socket);
    assert_eq!(own, format!("{socket}.0"));

    // The configured name is taken by another user: the client starts and
    // uses an agent of its own on `<name>.0`.
    let fake = impostor(&socket);
    let (session, dev) = Agent::with_socket(&socket).autostart(true).open_session("via_lo", None).unwrap();
    assert_eq!(dev.host_addr, LO.to_vec());
    assert_eq!(fake.join().unwrap(), Seen { bytes: 0, fds: 0 });
    let own_agent = Agent::with_socket(&own);
    assert!(own_agent.stats().unwrap().contains(&("sessions".to_string(), 1)));
    drop(session);
    own_agent.stop().unwrap();
    let deadline = Instant::now() + 5 * SECOND;
    while own_agent.stats().is_ok() {
        assert!(Instant::now() < deadline, "the agent on @{own} did not stop");
        thread::sleep(Duration::from_millis(10));
    }

    // Without starting agents, and nothing on `<name>.0`: the refusal.
    let fake = impostor(&socket);
    let err = Agent::with_socket(&socket).stats().unwrap_err();
    assert!(matches!(&err, AgentError::Untrusted { socket: s, .. } if *s == socket), "{err:?}");
    assert_eq!(fake.join().unwrap(), Seen { bytes: 0, fds: 0 });

    // An impostor on `<name>.0` too is refused in turn.
    let (fake, fake_own) = (impostor(&socket), impostor(&own));
    let err = Agent::with_socket(&socket).autostart(true).open_session("via_lo", None).unwrap_err();
    assert!(matches!(&err, AgentError::Untrusted { socket: s, uid: NOBODY, .. } if *s == own), "{err:?}");
    assert_eq!(fake.join().unwrap(), Seen { bytes: 0, fds: 0 });
    assert_eq!(fake_own.join().unwrap(), Seen { bytes: 0, fds: 0 });
}

#[test]
fn only_root_or_the_owner_may_stop_the_agent() {
    if !root("only_root_or_the_owner_may_stop_the_agent") {
        return;
    }
    let mut v = Viad::start("stop", &[], |_| {});
    // A client of another uid trusts root's agent, which refuses it.
    let agent = v.agent.clone();
    let err = as_nobody(move || agent.stop().unwrap_err()).join().unwrap();
    match err {
        AgentError::PermissionDenied(m) => assert!(m.contains("only root or uid 0"), "{m}"),
        other => panic!("{other:?}"),
    }
    // So does `viad --stop` run by that uid.
    let mut cmd = Command::new(VIAD);
    cmd.args(["--stop", "--socket", v.agent.socket()]).stderr(Stdio::piped());
    nobody_process(&mut cmd);
    let out = cmd.output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("refused"), "{out:?}");

    assert!(v.child.try_wait().unwrap().is_none(), "a stranger stopped the agent");
    assert_eq!(v.stat("stops_refused"), 2);
    v.agent.stop().unwrap();
    let deadline = Instant::now() + 5 * SECOND;
    while v.child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "root could not stop the agent");
        thread::sleep(Duration::from_millis(10));
    }
}

/// Takes the OS random source away from the command: a seccomp filter
/// fails `getrandom` with ENOSYS (native system calls only: enough for a
/// test), and in a mount namespace of its own `/dev/random` and
/// `/dev/urandom`, where a process without the system call reads instead,
/// are `/dev/null`.
fn no_random_source(cmd: &mut Command) {
    let code = |c: u32| c as u16;
    let filter = [
        // A = the system call number.
        libc::sock_filter { code: code(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS), jt: 0, jf: 0, k: 0 },
        libc::sock_filter {
            code: code(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K),
            jt: 0,
            jf: 1,
            k: libc::SYS_getrandom as u32,
        },
        libc::sock_filter {
            code: code(libc::BPF_RET | libc::BPF_K),
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
        },
        libc::sock_filter { code: code(libc::BPF_RET | libc::BPF_K), jt: 0, jf: 0, k: libc::SECCOMP_RET_ALLOW },
    ];
    // SAFETY: only unshare, mount and prctl between fork and exec, on
    // static strings; `filter` outlives the closure, which owns it.
    unsafe {
        cmd.pre_exec(move || {
            let null = c"/dev/null".as_ptr();
            let ok = libc::unshare(libc::CLONE_NEWNS) == 0
                && libc::mount(
                    std::ptr::null(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ) == 0
                && [c"/dev/random", c"/dev/urandom"]
                    .iter()
                    .all(|dev| libc::mount(null, dev.as_ptr(), std::ptr::null(), libc::MS_BIND, std::ptr::null()) == 0);
            if !ok {
                return Err(std::io::Error::last_os_error());
            }
            let prog = libc::sock_fprog { len: filter.len() as u16, filter: filter.as_ptr() as *mut _ };
            let ok = libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
                && libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, &prog as *const libc::sock_fprog) == 0;
            match ok {
                true => Ok(()),
                false => Err(std::io::Error::last_os_error()),
            }
        });
    }
}

#[test]
fn the_agent_refuses_to_start_without_the_os_random_source() {
    if !root("the_agent_refuses_to_start_without_the_os_random_source") {
        return;
    }
    let socket = name("norandom");
    let mut cmd = Command::new(VIAD);
    cmd.args(["--socket", &socket, "--idle-timeout", "0", "--cm-port", "0"]).stderr(Stdio::piped());
    no_random_source(&mut cmd);
    let mut child = cmd.spawn().unwrap();
    let deadline = Instant::now() + 5 * SECOND;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("viad runs without a random source");
        }
        thread::sleep(Duration::from_millis(10));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("random source"), "{stderr}");
    assert!(matches!(Agent::with_socket(&socket).stats(), Err(AgentError::Unavailable(_))));
}

#[test]
fn a_uid_at_its_connection_limit_is_refused_and_others_are_served() {
    if !root("a_uid_at_its_connection_limit_is_refused_and_others_are_served") {
        return;
    }
    const LIMIT: usize = 4;
    const EXTRA: usize = 3;
    let v = Viad::start("limit", &["--max-connections-per-uid", &LIMIT.to_string()], |_| {});
    // Another uid opens LIMIT + EXTRA listens, one connection each.
    let socket = v.agent.socket().to_string();
    let conns: Vec<OwnedFd> = as_nobody(move || {
        let ib = bell();
        (0..LIMIT + EXTRA)
            .map(|_| {
                let conn = sock::connect(&socket).unwrap();
                // A refused connection may be closed before the request goes.
                let _ = sock::send(conn.as_fd(), &listen_bytes(b"flood"), &[ib.as_fd()]);
                conn
            })
            .collect()
    })
    .join()
    .unwrap();
    v.await_stat("listeners_waiting", LIMIT as u64);
    v.await_stat("connections_refused", EXTRA as u64);
    let replies: Vec<Option<Reply>> = conns.iter().map(|c| said(c.as_fd())).collect();
    let refused = replies.iter().flatten().filter(|r| matches!(r, Reply::Error { kind: ErrorKind::Limit, .. })).count();
    assert_eq!((refused, replies.iter().filter(|r| r.is_none()).count()), (EXTRA, LIMIT), "{replies:?}");
    // The client library reports the limit as such.
    let agent = v.agent.clone();
    let err = as_nobody(move || agent.open_session("via_lo", None).unwrap_err()).join().unwrap();
    assert!(matches!(&err, AgentError::Limit(m) if m.contains("uid 65534")), "{err:?}");

    // Other clients are still served; root is exempt from the limit.
    let sessions: Vec<_> = (0..LIMIT + EXTRA).map(|_| v.agent.open_session("/dev/via_lo", None).unwrap()).collect();
    assert_eq!(v.stat("sessions"), (LIMIT + EXTRA) as u64);
    v.assert_quiet();
    drop(sessions);

    // Once its connections are gone, that uid is served again.
    drop(conns);
    v.await_stat("listeners_waiting", 0);
    let agent = v.agent.clone();
    as_nobody(move || agent.open_session("via_lo", None).unwrap()).join().unwrap();
    assert_eq!(v.stat("connections_refused"), (EXTRA + 1) as u64);
}

#[test]
fn the_agent_raises_its_descriptor_limit() {
    if !root("the_agent_raises_its_descriptor_limit") {
        return;
    }
    let v = Viad::start("rlimit", &[], |cmd| fd_limit(cmd, 64, 4096));
    assert_eq!(v.fd_limits(), ("4096".to_string(), "4096".to_string()));
}

#[test]
fn an_agent_out_of_descriptors_does_not_spin() {
    if !root("an_agent_out_of_descriptors_does_not_spin") {
        return;
    }
    // Room for a few clients only: the rest wait in the listen backlog,
    // and the listening socket stays readable.
    let v = Viad::start("emfile", &[], |cmd| fd_limit(cmd, 24, 24));
    let conns: Vec<OwnedFd> = (0..40).map(|_| sock::connect(v.agent.socket()).unwrap()).collect();
    thread::sleep(Duration::from_millis(200));
    v.assert_quiet();
    // Clients that go away make room for the waiting ones, and the agent
    // serves again.
    drop(conns);
    let deadline = Instant::now() + 5 * SECOND;
    let stats = loop {
        match v.agent.stats() {
            Ok(s) => break s,
            Err(e) => assert!(Instant::now() < deadline, "never served again: {e}"),
        }
        thread::sleep(Duration::from_millis(20));
    };
    let pauses = stats.iter().find(|(n, _)| n == "accept_pauses").unwrap().1;
    assert!(pauses >= 1, "accept never failed");
    let (_session, dev) = v.agent.open_session("/dev/via_lo", None).unwrap();
    assert_eq!(dev.name, "via_lo");
}
