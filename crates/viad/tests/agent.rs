//! End-to-end tests against the real `viad` binary, one agent per test.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use via_wire::cm::CmEndpoint;
use viad::client::{encode_endpoint, Agent, AgentError, ConnFds, Incoming, Request, Side, Transport};
use viad::proto::{self, ListenReq};
use viad::sock;

mod odd_cm;

const LO: [u8; 4] = [127, 0, 0, 1];
/// The one size of connection segment the agent creates.
const SEGMENT: usize = via_shm::CONN_SEGMENT_BYTES;
const VIAD: &str = env!("CARGO_BIN_EXE_viad");

struct Viad {
    child: Child,
    agent: Agent,
}

impl Viad {
    fn start(tag: &str, extra: &[&str]) -> Viad {
        let name = format!("openvia-test-{}-{tag}", std::process::id());
        // No CM port unless a test asks: agents of parallel tests share
        // this network namespace.
        let child = Command::new(VIAD)
            .args(["--socket", &name, "--idle-timeout", "0", "--cm-port", "0"])
            .args(extra)
            .spawn()
            .unwrap();
        let agent = Agent::with_socket(&name);
        let mut viad = Viad { child, agent };
        let deadline = Instant::now() + Duration::from_secs(5);
        while viad.agent.stats().is_err() {
            assert!(viad.child.try_wait().unwrap().is_none(), "viad exited early");
            assert!(Instant::now() < deadline, "viad did not come up");
            thread::sleep(Duration::from_millis(10));
        }
        viad
    }

    fn stat(&self, name: &str) -> u64 {
        let stats = self.agent.stats().unwrap();
        stats.into_iter().find(|(n, _)| n == name).unwrap().1
    }

    /// Waits until counter `name` reads `value`.
    fn await_stat(&self, name: &str, value: u64) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.stat(name) != value {
            assert!(Instant::now() < deadline, "{name} never became {value}");
            thread::sleep(Duration::from_millis(5));
        }
    }

    fn await_exit(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "viad still runs");
            thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Viad {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The descriptors of a same-host connection.
fn local(inc: &Incoming) -> &ConnFds {
    match &inc.transport {
        Transport::Local(fds) => fds,
        Transport::Remote(_) => panic!("a same-host request came as remote"),
    }
}

/// A stand-in bell: any file will do, identified by its inode.
fn bell() -> OwnedFd {
    let fd = unsafe { libc::memfd_create(c"bell".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    unsafe { OwnedFd::from_raw_fd(fd) }
}

fn stat(fd: BorrowedFd) -> libc::stat {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) }, 0);
    st
}

fn same_file(a: BorrowedFd, b: BorrowedFd) -> bool {
    let (a, b) = (stat(a), stat(b));
    (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)
}

fn map(fd: BorrowedFd, len: usize) -> *mut u8 {
    let prot = libc::PROT_READ | libc::PROT_WRITE;
    let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd.as_raw_fd(), 0) };
    assert_ne!(p, libc::MAP_FAILED);
    p.cast()
}

/// Checks that both sides got one segment, two connected socket ends and each other's bell.
fn check_linked(a: &ConnFds, a_bell: BorrowedFd, b: &ConnFds, b_bell: BorrowedFd, len: usize) {
    assert_eq!(stat(a.segment.as_fd()).st_size as usize, len);
    assert!(same_file(a.segment.as_fd(), b.segment.as_fd()));
    assert!(same_file(a.peer_bell.as_fd(), b_bell));
    assert!(same_file(b.peer_bell.as_fd(), a_bell));
    let (pa, pb) = (map(a.segment.as_fd(), len), map(b.segment.as_fd(), len));
    unsafe {
        pa.add(len - 1).write_volatile(0x5a);
        assert_eq!(pb.add(len - 1).read_volatile(), 0x5a);
        libc::munmap(pa.cast(), len);
        libc::munmap(pb.cast(), len);
    }
    for (from, to) in [(a, b), (b, a)] {
        sock::send(from.socket.as_fd(), b"ping", &[]).unwrap();
        assert_eq!(sock::recv(to.socket.as_fd()).unwrap().unwrap().data, b"ping");
    }
}

fn request<'a>(local: &'a [u8], remote_host: &'a [u8], remote: &'a [u8], bell: BorrowedFd<'a>) -> Request<'a> {
    Request {
        local_host: &LO,
        local_disc: local,
        remote_host,
        remote_disc: remote,
        info: local,
        bell,
        segment_bytes: SEGMENT as u64,
    }
}

#[test]
fn devices_and_sessions() {
    let v = Viad::start("dev", &[]);
    let (session, dev) = v.agent.open_session("/dev/via_lo", None).unwrap();
    assert_eq!((dev.name.as_str(), dev.interface.as_str()), ("via_lo", "lo"));
    assert_eq!((dev.host_addr, dev.mtu > 0), (LO.to_vec(), true));
    // Loopback's IPv6 address, when it has one.
    let lo6 = std::net::Ipv6Addr::LOCALHOST.octets().to_vec();
    assert!(dev.host_addr6.is_none() || dev.host_addr6 == Some(lo6));
    let (session2, dev2) = v.agent.open_session("via_lo", None).unwrap();
    assert_eq!(dev2.name, "via_lo");
    assert_eq!(v.stat("sessions"), 2);
    for bad in ["via_bogus0", "/dev/via_", "eth0"] {
        let err = v.agent.open_session(bad, None).unwrap_err();
        assert!(matches!(err, AgentError::UnknownDevice(_)), "{bad}: {err:?}");
    }
    drop((session, session2));
    v.await_stat("sessions", 0);
}

#[test]
fn listen_then_connect_shares_resources() {
    let v = Viad::start("lc", &[]);
    let agent = v.agent.clone();
    let listener = thread::spawn(move || {
        let ib = bell();
        let inc = agent.listen(&LO, b"svc", b"L-info", ib.as_fd(), Some(Duration::from_secs(10)));
        (inc.unwrap(), ib)
    });
    v.await_stat("listeners_waiting", 1);
    let ib = bell();
    // Any loopback address reaches a listener on 127.0.0.1.
    let m = v.agent.connect(&request(b"cli", &[127, 1, 2, 3], b"svc", ib.as_fd()), Duration::from_secs(5)).unwrap();
    let (inc, lib) = listener.join().unwrap();
    assert_eq!((m.side, m.remote_info.as_slice()), (Side::A, &b"L-info"[..]));
    assert_eq!((inc.remote_host.as_slice(), inc.remote_disc.as_slice()), (&LO[..], &b"cli"[..]));
    assert_eq!(inc.remote_info, b"cli");
    check_linked(m.fds.as_ref().unwrap(), ib.as_fd(), local(&inc), lib.as_fd(), SEGMENT);
    assert_eq!((v.stat("matched"), v.stat("listeners_waiting")), (1, 0));
}

#[test]
fn connect_then_listen_and_timeouts() {
    let v = Viad::start("cl", &[]);
    let agent = v.agent.clone();
    let requester = thread::spawn(move || {
        let ib = bell();
        let m = agent.connect(&request(b"c", &LO, b"late", ib.as_fd()), Duration::from_secs(10));
        (m.unwrap(), ib)
    });
    v.await_stat("connects_pending", 1);
    let ib = bell();
    let inc = v.agent.listen(&LO, b"late", b"", ib.as_fd(), None).unwrap();
    let (m, cib) = requester.join().unwrap();
    check_linked(m.fds.as_ref().unwrap(), cib.as_fd(), local(&inc), ib.as_fd(), SEGMENT);

    // A listen nobody answers ends with Timeout; a connect with NoMatch.
    let t = Instant::now();
    let err = v.agent.listen(&LO, b"x", b"", ib.as_fd(), Some(Duration::from_millis(100)));
    assert!(matches!(err, Err(AgentError::Timeout)), "{err:?}");
    let req = request(b"c", &[127, 0, 0, 2], b"nobody", ib.as_fd());
    let err = v.agent.connect(&req, Duration::from_millis(200)).unwrap_err();
    assert!(matches!(err, AgentError::NoMatch), "{err:?}");
    assert!(t.elapsed() >= Duration::from_millis(300));
    assert_eq!((v.stat("no_match"), v.stat("listen_timeouts")), (1, 1));
}

#[test]
fn unreachable_host() {
    // Without a CM port, another host is unreachable at once, and the agent
    // says why.
    let v = Viad::start("unr", &[]);
    let ib = bell();
    let ep = CmEndpoint {
        addr: "127.0.0.1:9".parse().unwrap(),
        vi: 1,
        key: 2,
        reliability: 0,
        max_transfer: 4096,
        rdma_write: false,
        rdma_read: false,
        segment: 1400,
        payload_crc: true,
        ether: None,
        large_packets: false,
        placed_acks: false,
    };
    let info = encode_endpoint(&ep);
    let t = Instant::now();
    let mut req = request(b"c", &[10, 255, 255, 1], b"svc", ib.as_fd());
    req.info = &info;
    let no_cm_port = |r: Result<_, AgentError>| match r {
        Err(AgentError::NoCmPort(why)) => why,
        other => panic!("{other:?}"),
    };
    let why = no_cm_port(v.agent.connect(&req, Duration::from_secs(5)));
    assert!(why.contains("without a CM port"), "{why}");
    // A peer request for a host with a smaller address would wait for that
    // host's request; one with a larger address would be forwarded.
    req.local_host = &[10, 255, 255, 2];
    no_cm_port(v.agent.peer_connect(&req, Duration::from_secs(5)));
    req.local_host = &[10, 255, 255, 0];
    no_cm_port(v.agent.peer_connect(&req, Duration::from_secs(5)));
    req.local_host = &[127, 0, 0, 1];
    assert!(t.elapsed() < Duration::from_secs(2));
    assert_eq!((v.stat("unreachable"), v.stat("cm_unreachable")), (3, 3));
    assert_eq!((v.stat("cm_port"), v.stat("cm_bind_errno")), (0, 0));

    // A CM port another process holds: the agent serves this host, and a
    // request for another host fails at once with the reason.
    let squatter = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    let taken = squatter.local_addr().unwrap().port().to_string();
    let v = Viad::start("unr-taken", &["--cm-port", &taken]);
    assert_eq!((v.stat("cm_port"), v.stat("cm_bind_errno")), (0, libc::EADDRINUSE as u64));
    let t = Instant::now();
    let why = no_cm_port(v.agent.connect(&req, Duration::from_secs(5)));
    assert!(t.elapsed() < Duration::from_secs(2));
    assert!(why.contains(&format!("cannot bind CM port {taken}")) && why.contains("another process holds"), "{why}");
    let (_session, dev) = v.agent.open_session("via_lo", None).unwrap();
    assert_eq!(dev.name, "via_lo");
    drop(squatter);

    // With one, the request is sent until its timeout, then Unreachable.
    let port = {
        // A port nobody uses right now.
        let probe = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
        probe.local_addr().unwrap().port().to_string()
    };
    let v = Viad::start("unr2", &["--cm-port", &port]);
    assert_eq!(v.stat("cm_port").to_string(), port);
    // A host that never answers, not even with an ICMP error: a multicast
    // group nobody here joined (no host sends ICMP errors for multicast).
    // A routed unicast address may be refused by a firewall on the way.
    req.remote_host = &[224, 0, 0, 123];
    let t = Instant::now();
    let err = v.agent.connect(&req, Duration::from_millis(400));
    assert!(matches!(err, Err(AgentError::Unreachable)), "{err:?}");
    assert!(t.elapsed() >= Duration::from_millis(400));
    assert_eq!(v.stat("cm_requests_sent"), 1);
    assert!(v.stat("cm_retransmits") >= 2);
    // Host addresses that are neither IPv4 nor IPv6 are unreachable at once.
    req.remote_host = &[10, 0, 0];
    let err = v.agent.connect(&req, Duration::from_secs(5));
    assert!(matches!(err, Err(AgentError::Unreachable)), "{err:?}");
    // The info of a request for another host must be an endpoint.
    req.remote_host = &[10, 255, 255, 1];
    req.info = b"not an endpoint";
    let err = v.agent.connect(&req, Duration::from_secs(5));
    assert!(matches!(err, Err(AgentError::Protocol(_))), "{err:?}");
    assert_eq!(v.stat("protocol_errors"), 1);
    assert_eq!((v.stat("unreachable"), v.stat("cm_unreachable")), (2, 2));
    assert!(t.elapsed() < Duration::from_secs(2));
}

#[test]
fn peers_match_in_both_orders() {
    let v = Viad::start("peer", &[]);
    for (first, second) in [(&b"p1"[..], &b"p2"[..]), (b"p2", b"p1")] {
        let agent = v.agent.clone();
        let early = thread::spawn(move || {
            let ib = bell();
            let m = agent.peer_connect(&request(first, &LO, second, ib.as_fd()), Duration::from_secs(10));
            (m.unwrap(), ib)
        });
        v.await_stat("peers_pending", 1);
        // A request that is not the mirror image does not match.
        let ib = bell();
        let wrong = request(second, &LO, b"p3", ib.as_fd());
        assert!(matches!(v.agent.peer_connect(&wrong, Duration::from_millis(50)), Err(AgentError::NoMatch)));
        let late = v.agent.peer_connect(&request(second, &LO, first, ib.as_fd()), Duration::from_secs(5)).unwrap();
        let (early, eib) = early.join().unwrap();
        assert_eq!((early.side, late.side), (Side::A, Side::B));
        assert_eq!((early.remote_info.as_slice(), late.remote_info.as_slice()), (second, first));
        check_linked(early.fds.as_ref().unwrap(), eib.as_fd(), late.fds.as_ref().unwrap(), ib.as_fd(), SEGMENT);
    }
    assert_eq!((v.stat("peer_matched"), v.stat("peers_pending")), (2, 0));
}

#[test]
fn segment_sizes_other_than_the_agents_are_refused() {
    let v = Viad::start("seg", &[]);
    let agent = v.agent.clone();
    let listener = thread::spawn(move || {
        let ib = bell();
        let inc = agent.listen(&LO, b"seg", b"", ib.as_fd(), Some(Duration::from_secs(10)));
        (inc.unwrap(), ib)
    });
    v.await_stat("listeners_waiting", 1);
    let ib = bell();
    // Neither 0 nor the agent's size: refused before anything is created,
    // the listener still waits.  For another host too, before forwarding.
    for (size, host, peer) in [
        (8192, &LO[..], false),
        (SEGMENT as u64 + 4096, &LO[..], true),
        (SEGMENT as u64 - 1, &LO[..], false),
        (1, &[10, 255, 255, 1][..], false),
    ] {
        let mut req = request(b"c", host, b"seg", ib.as_fd());
        req.segment_bytes = size;
        let err = match peer {
            true => v.agent.peer_connect(&req, Duration::from_secs(1)),
            false => v.agent.connect(&req, Duration::from_secs(1)),
        }
        .unwrap_err();
        match err {
            AgentError::Protocol(m) => assert!(m.contains("segment size"), "{size}: {m}"),
            other => panic!("{size}: {other:?}"),
        }
    }
    assert_eq!((v.stat("protocol_errors"), v.stat("listeners_waiting")), (4, 1));
    assert_eq!((v.stat("unreachable"), v.stat("cm_requests_sent")), (0, 0));
    // 0 leaves the size to the agent.
    let mut req = request(b"c", &LO, b"seg", ib.as_fd());
    req.segment_bytes = 0;
    let m = v.agent.connect(&req, Duration::from_secs(5)).unwrap();
    let (inc, lib) = listener.join().unwrap();
    check_linked(m.fds.as_ref().unwrap(), ib.as_fd(), local(&inc), lib.as_fd(), SEGMENT);
}

#[test]
fn departed_listener_is_not_matched() {
    let v = Viad::start("gone", &[]);
    let ib = bell();
    let listen = proto::Request::Listen(ListenReq {
        host: LO.to_vec(),
        disc: b"svc".to_vec(),
        info: vec![],
        timeout_ms: proto::FOREVER,
        pid: 0,
    });
    let conn = sock::connect(v.agent.socket()).unwrap();
    sock::send(conn.as_fd(), &listen.encode().unwrap(), &[ib.as_fd()]).unwrap();
    v.await_stat("listeners_waiting", 1);
    drop(conn);
    v.await_stat("listeners_waiting", 0);
    let req = request(b"c", &LO, b"svc", ib.as_fd());
    assert!(matches!(v.agent.connect(&req, Duration::from_millis(100)), Err(AgentError::NoMatch)));
}

#[test]
fn malformed_messages_are_counted_and_closed() {
    let v = Viad::start("bad", &[]);
    let ib = bell();
    let stats = proto::Request::Stats { start: 0 }.encode().unwrap();
    let bad: [(&[u8], &[BorrowedFd]); 4] =
        [(b"\x01\x02garbage", &[]), (b"\x09\x05", &[]), (&stats, &[ib.as_fd()]), (&[1, 3, 200, 0], &[])];
    for (i, (msg, fds)) in bad.iter().enumerate() {
        let conn = sock::connect(v.agent.socket()).unwrap();
        sock::send(conn.as_fd(), msg, fds).unwrap();
        assert!(sock::recv(conn.as_fd()).unwrap().is_none(), "message {i} got an answer");
    }
    assert_eq!(v.stat("protocol_errors"), 4);
}

#[test]
fn stop_and_cli() {
    let mut v = Viad::start("stop", &[]);
    let name = v.agent.socket().to_string();
    let out = Command::new(VIAD).args(["--stats", "--socket", &name]).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.lines().any(|l| l == "sessions 0"), "{text}");
    assert!(Command::new(VIAD).args(["--stop", "--socket", &name]).status().unwrap().success());
    assert!(v.await_exit(Duration::from_secs(5)).success());
    let out = Command::new(VIAD).args(["--stats", "--socket", &name]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no agent running"));
    assert!(matches!(v.agent.stats(), Err(AgentError::Unavailable(_))));
}

#[test]
fn idle_timeout_exits_once_clients_are_gone() {
    let mut v = Viad::start("idle", &["--idle-timeout", "1"]);
    let (session, _) = v.agent.open_session("via_lo", None).unwrap();
    thread::sleep(Duration::from_millis(1500));
    assert!(v.child.try_wait().unwrap().is_none(), "exited with a session open");
    drop(session);
    let t = Instant::now();
    assert!(v.await_exit(Duration::from_secs(5)).success());
    assert!(t.elapsed() >= Duration::from_millis(500));
}

#[test]
fn second_agent_on_a_taken_name_exits_quietly() {
    let mut v = Viad::start("race", &[]);
    let name = v.agent.socket().to_string();
    let second = Command::new(VIAD).args(["--socket", &name]).stderr(Stdio::piped()).output().unwrap();
    assert!(second.status.success());
    assert!(second.stderr.is_empty());
    let daemon = Command::new(VIAD).args(["--daemon", "--socket", &name]).status().unwrap();
    assert!(daemon.success());
    assert!(v.child.try_wait().unwrap().is_none());
    v.agent.stop().unwrap();
    assert!(v.await_exit(Duration::from_secs(5)).success());

    // A real start race: every starter returns success, one agent wins.
    let name = format!("{name}-2");
    let starters: Vec<Child> =
        (0..4).map(|_| Command::new(VIAD).args(["--daemon", "--socket", &name]).spawn().unwrap()).collect();
    for mut s in starters {
        assert!(s.wait().unwrap().success());
    }
    let winner = Agent::with_socket(&name);
    assert_eq!(winner.stats().unwrap()[0], ("clients".to_string(), 1));
    winner.stop().unwrap();
}

#[test]
fn sigterm_exits_cleanly() {
    let mut v = Viad::start("term", &[]);
    let (_session, _) = v.agent.open_session("via_lo", None).unwrap();
    assert_eq!(unsafe { libc::kill(v.child.id() as libc::pid_t, libc::SIGTERM) }, 0);
    assert!(v.await_exit(Duration::from_secs(5)).success());
}

/// CM messages from a port other than the CM port (here: every port of
/// this host but the agent's own) are refused before they are read, however
/// well-formed.  (`cross_host.rs` sends the same ones from the CM port.)
#[test]
fn cm_messages_from_another_port_are_refused_unread() {
    let probe = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    let port = probe.local_addr().unwrap().port();
    drop(probe);
    let v = Viad::start("cmfuzz", &["--cm-port", &port.to_string()]);
    assert_eq!(v.stat("cm_port"), u64::from(port));
    // Above ip_unprivileged_port_start, the port proves nothing.
    assert_eq!(v.stat("cm_port_privileged"), 0);
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let dest = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let (datagrams, malformed) = odd_cm::datagrams(3000);
    for (i, bytes) in datagrams.iter().enumerate() {
        sock.send_to(bytes, dest).unwrap();
        if i % 100 == 0 {
            // Stay below the socket buffer, so nothing is dropped uncounted.
            thread::sleep(Duration::from_millis(5));
        }
    }
    assert!(malformed > 0);
    v.await_stat("cm_refused_source", 3000);
    assert_eq!((v.stat("cm_malformed"), v.stat("cm_requests_received")), (0, 0));
    // Nothing was answered.
    sock.set_nonblocking(true).unwrap();
    assert!(sock.recv_from(&mut [0u8; 64]).is_err());
    // The agent still serves its own host.
    let (_session, dev) = v.agent.open_session("via_lo", None).unwrap();
    assert_eq!(dev.name, "via_lo");
}

#[test]
fn stats_report_the_counters_a_session_publishes() {
    let v = Viad::start("pstats", &[]);
    let page = via_shm::stats::StatsPage::create("via_lo", &["packets_sent", "malformed"], 0).unwrap();
    page.add(0, 41);
    page.add(1, 2);
    let (session, _) = v.agent.open_session("via_lo", Some(page.fd())).unwrap();
    page.add(0, 1);
    let stats: std::collections::HashMap<String, u64> = v.agent.stats().unwrap().into_iter().collect();
    let key = |c: &str| format!("process.{}.via_lo.{c}", std::process::id());
    assert_eq!(stats.get(&key("packets_sent")), Some(&42));
    assert_eq!(stats.get(&key("malformed")), Some(&2));
    drop(session);
    // Once the session is gone, so are its counters.
    thread::sleep(Duration::from_millis(200));
    let stats = v.agent.stats().unwrap();
    assert!(!stats.iter().any(|(n, _)| n.starts_with("process.")));
}
