//! Connections across hosts: two network namespaces joined by a veth pair,
//! a real `viad` in each (started with `ip netns exec`), and the client API
//! driven from threads that entered a namespace with `setns` (abstract Unix
//! sockets, like UDP sockets, belong to the namespace of the thread that
//! creates them).
//!
//! The tests need root and iproute2; without them each one prints
//! "skipped: needs root and iproute2" and returns.

use std::collections::HashMap;
use std::fs::File;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use via_wire::cm::{CmEndpoint, CmMessage, CM_PORT};
use viad::agent::ANSWER_TIME;
use viad::client::{decode_endpoint, encode_endpoint, Agent, AgentError, Incoming, Matched, Request, Side, Transport};

mod odd_cm;

const VIAD: &str = env!("CARGO_BIN_EXE_viad");
const SECOND: Duration = Duration::from_secs(1);

/// Serialises `ip` invocations that change namespaces.
static IP_LOCK: Mutex<()> = Mutex::new(());
/// Per-test subnet number: 10.77.N.0/24.
static SUBNET: AtomicU8 = AtomicU8::new(1);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn v6(last: u8) -> [u8; 16] {
    let mut a = [0u8; 16];
    a[..2].copy_from_slice(&[0xfd, 0x77]);
    a[15] = last;
    a
}

/// Whether the cross-host tests can run here; prints why not.
fn can_run(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let ip =
        Command::new("ip").arg("-V").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success());
    if !(root && ip) {
        eprintln!("{test}: skipped: needs root and iproute2");
    }
    root && ip
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().unwrap();
    assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

/// Two hosts: namespaces `a` (10.77.N.1, fd77::1) and `b` (10.77.N.2,
/// fd77::2) joined by a veth pair, `veth0` on both sides.  Dropping it
/// deletes both namespaces.
struct Net {
    a: String,
    b: String,
    a4: [u8; 4],
    b4: [u8; 4],
}

impl Net {
    /// Sets up the two hosts, or prints the skip message and returns `None`.
    fn new(test: &str) -> Option<Net> {
        if !can_run(test) {
            return None;
        }
        let n = SUBNET.fetch_add(1, Ordering::Relaxed);
        let tag = format!("ovt-{}-{n}", std::process::id());
        let net = Net { a: format!("{tag}-a"), b: format!("{tag}-b"), a4: [10, 77, n, 1], b4: [10, 77, n, 2] };
        let _serial = IP_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let (a, b) = (net.a.as_str(), net.b.as_str());
        ip(&["netns", "add", a]);
        ip(&["netns", "add", b]);
        ip(&["-n", a, "link", "add", "veth0", "type", "veth", "peer", "name", "veth0", "netns", b]);
        for (ns, last) in [(a, 1), (b, 2)] {
            ip(&["-n", ns, "addr", "add", &format!("10.77.{n}.{last}/24"), "dev", "veth0"]);
            ip(&["-n", ns, "addr", "add", &format!("fd77::{last}/64"), "dev", "veth0", "nodad"]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
            ip(&["-n", ns, "link", "set", "veth0", "up"]);
        }
        Some(net)
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        let _serial = IP_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        for ns in [&self.a, &self.b] {
            let _ = Command::new("ip").args(["netns", "del", ns]).stderr(Stdio::null()).status();
        }
    }
}

/// Moves the calling thread into network namespace `ns`.
fn enter(ns: &str) {
    let file = ["/run/netns", "/var/run/netns"]
        .iter()
        .find_map(|dir| File::open(format!("{dir}/{ns}")).ok())
        .unwrap_or_else(|| panic!("no namespace {ns}"));
    // SAFETY: setns on an open namespace file affects this thread only.
    let r = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(r, 0, "setns {ns}: {}", std::io::Error::last_os_error());
}

/// Runs `f` on a new thread inside namespace `ns`.
fn in_ns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> JoinHandle<T> {
    let ns = ns.to_string();
    thread::spawn(move || {
        enter(&ns);
        f()
    })
}

/// A `viad` running in a namespace.
struct NsAgent {
    child: Child,
    ns: String,
    agent: Agent,
}

impl NsAgent {
    fn start(ns: &str, env: &[(&str, &str)], args: &[&str]) -> NsAgent {
        let socket = format!("openvia-xh-{ns}");
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns, "env"]).arg(format!("VIA_AGENT_SOCKET={socket}"));
        for (k, v) in env {
            cmd.arg(format!("{k}={v}"));
        }
        let child = cmd.arg(VIAD).args(["--idle-timeout", "0"]).args(args).spawn().unwrap();
        let mut me = NsAgent { child, ns: ns.to_string(), agent: Agent::with_socket(&socket) };
        let deadline = Instant::now() + 5 * SECOND;
        loop {
            let agent = me.agent.clone();
            if me.run(move |_| agent.stats().is_ok()) {
                return me;
            }
            assert!(me.child.try_wait().unwrap().is_none(), "viad exited early");
            assert!(Instant::now() < deadline, "viad did not come up in {ns}");
            thread::sleep(ms(10));
        }
    }

    /// Runs `f` with this agent's client handle in its namespace.
    fn spawn<T: Send + 'static>(&self, f: impl FnOnce(Agent) -> T + Send + 'static) -> JoinHandle<T> {
        let agent = self.agent.clone();
        in_ns(&self.ns, move || f(agent))
    }

    fn run<T: Send + 'static>(&self, f: impl FnOnce(Agent) -> T + Send + 'static) -> T {
        self.spawn(f).join().unwrap()
    }

    fn stats(&self) -> HashMap<String, u64> {
        self.run(|a| a.stats().unwrap()).into_iter().collect()
    }

    fn stat(&self, name: &str) -> u64 {
        *self.stats().get(name).unwrap_or_else(|| panic!("no counter {name}"))
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
            thread::sleep(ms(10));
        }
    }
}

impl Drop for NsAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A stand-in bell.
fn bell() -> OwnedFd {
    // SAFETY: plain syscall; the fd is owned from here on.
    let fd = unsafe { libc::memfd_create(c"bell".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    unsafe { OwnedFd::from_raw_fd(fd) }
}

fn endpoint(addr: &str, vi: u32) -> CmEndpoint {
    CmEndpoint {
        addr: addr.parse().unwrap(),
        vi,
        key: 0x5eed_0000_0000_0000 | u64::from(vi),
        reliability: 2,
        max_transfer: 32768,
        rdma_write: vi.is_multiple_of(2),
        rdma_read: true,
        segment: 1400,
        payload_crc: true,
        ether: None,
        large_packets: false,
        placed_acks: false,
    }
}

/// What a test asks for, owned so it can move into a namespace thread.
#[derive(Clone)]
struct Ask {
    local_host: Vec<u8>,
    local_disc: Vec<u8>,
    remote_host: Vec<u8>,
    remote_disc: Vec<u8>,
    info: Vec<u8>,
}

impl Ask {
    fn new(local: (&[u8], &[u8]), remote: (&[u8], &[u8]), ep: &CmEndpoint) -> Ask {
        Ask {
            local_host: local.0.to_vec(),
            local_disc: local.1.to_vec(),
            remote_host: remote.0.to_vec(),
            remote_disc: remote.1.to_vec(),
            info: encode_endpoint(ep),
        }
    }

    fn connect(&self, agent: &Agent, timeout: Duration) -> Result<Matched, AgentError> {
        self.call(agent, timeout, false)
    }

    fn peer(&self, agent: &Agent, timeout: Duration) -> Result<Matched, AgentError> {
        self.call(agent, timeout, true)
    }

    fn call(&self, agent: &Agent, timeout: Duration, peer: bool) -> Result<Matched, AgentError> {
        let ib = bell();
        let req = Request {
            local_host: &self.local_host,
            local_disc: &self.local_disc,
            remote_host: &self.remote_host,
            remote_disc: &self.remote_disc,
            info: &self.info,
            bell: ib.as_fd(),
            segment_bytes: 0,
        };
        match peer {
            true => agent.peer_connect(&req, timeout),
            false => agent.connect(&req, timeout),
        }
    }
}

/// Listens on `host`/`disc` with an bell of its own.
fn listen(agent: &Agent, host: &[u8], disc: &[u8], timeout: Duration) -> Result<Incoming, AgentError> {
    let ib = bell();
    agent.listen(host, disc, b"", ib.as_fd(), Some(timeout))
}

/// A listener on another host that answers with `answer` (an endpoint to
/// accept with, or `None` to reject); returns what it saw and the answer's result.
type Seen = (Vec<u8>, Vec<u8>, Option<CmEndpoint>, Result<(), AgentError>);

fn answering_listener(
    agent: &NsAgent,
    host: [u8; 4],
    disc: &'static [u8],
    answer: Option<CmEndpoint>,
) -> JoinHandle<Seen> {
    answering_listener_on(agent, host.to_vec(), disc, answer)
}

fn answering_listener_on(
    agent: &NsAgent,
    host: Vec<u8>,
    disc: &'static [u8],
    answer: Option<CmEndpoint>,
) -> JoinHandle<Seen> {
    agent.spawn(move |agent| {
        let inc = listen(&agent, &host, disc, 10 * SECOND).unwrap();
        let Transport::Remote(responder) = inc.transport else {
            panic!("a request from another host came with descriptors");
        };
        let result = match answer {
            Some(ep) => responder.accept(&encode_endpoint(&ep)),
            None => responder.reject(),
        };
        let ep = decode_endpoint(&inc.remote_info);
        (inc.remote_host, inc.remote_disc, ep, result)
    })
}

fn remote_matched(m: &Matched, side: Side, ep: &CmEndpoint) {
    assert_eq!(m.side, side);
    assert!(m.fds.is_none(), "descriptors across hosts");
    assert_eq!(decode_endpoint(&m.remote_info).as_ref(), Some(ep));
}

#[test]
fn accept_across_hosts() {
    let Some(net) = Net::new("accept_across_hosts") else {
        return;
    };
    let a = NsAgent::start(&net.a, &[], &[]);
    let b = NsAgent::start(&net.b, &[], &[]);
    assert_eq!(a.stat("cm_port"), u64::from(CM_PORT));
    // The default CM port is privileged; these agents run as root.
    assert_eq!((a.stat("cm_port_privileged"), a.stat("cm_bind_errno")), (1, 0));
    let (a4, b4) = (net.a4, net.b4);
    let ep_a = endpoint(&format!("10.77.{}.1:40001", a4[2]), 1);
    let ep_b = endpoint(&format!("10.77.{}.2:40002", a4[2]), 2);

    // The listener waits first.
    let listener = answering_listener(&b, b4, b"svc", Some(ep_b.clone()));
    b.await_stat("listeners_waiting", 1);
    let ask = Ask::new((&a4, b"cli"), (&b4, b"svc"), &ep_a);
    let m = a.run(move |agent| ask.connect(&agent, 5 * SECOND)).unwrap();
    remote_matched(&m, Side::A, &ep_b);
    let (host, disc, ep, result) = listener.join().unwrap();
    assert_eq!((host, disc), (a4.to_vec(), b"cli".to_vec()));
    assert_eq!(ep, Some(ep_a.clone()));
    result.unwrap();
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!((sa["cm_requests_sent"], sa["cm_accepts"]), (1, 1));
    assert_eq!((sa["remote_pending"], sa["cm_no_match"]), (0, 0));
    assert_eq!((sb["cm_requests_received"], sb["cm_accepts"]), (1, 1));
    assert_eq!(sb["remote_listeners_matched"], 1);
    assert_eq!((sa["matched"], sb["matched"]), (0, 0));

    // The request comes first and is held, longer than a held request
    // lives without copies: the retransmissions keep it alive.
    let ask = Ask::new((&a4, b"cli2"), (&b4, b"late"), &ep_a);
    let requester = a.spawn(move |agent| ask.connect(&agent, 10 * SECOND));
    b.await_stat("cm_requests_received", 2);
    let sent = a.stat("cm_retransmits");
    thread::sleep(ms(2500));
    assert!(a.stat("cm_retransmits") >= sent + 4);
    assert_eq!(b.stat("cm_requests_received"), 2);
    let listener = answering_listener(&b, b4, b"late", Some(ep_b.clone()));
    let m = requester.join().unwrap().unwrap();
    remote_matched(&m, Side::A, &ep_b);
    let (_, disc, ep, result) = listener.join().unwrap();
    assert_eq!((disc, ep), (b"cli2".to_vec(), Some(ep_a)));
    result.unwrap();
    assert_eq!(b.stat("remote_listeners_matched"), 2);
    assert!(b.stat("cm_duplicates") >= 4);
    assert_eq!(a.stat("cm_accepts"), 2);
}

#[test]
fn reject_across_hosts() {
    let Some(net) = Net::new("reject_across_hosts") else {
        return;
    };
    let a = NsAgent::start(&net.a, &[], &[]);
    let b = NsAgent::start(&net.b, &[], &[]);
    let (a4, b4) = (net.a4, net.b4);
    let ep_a = endpoint(&format!("10.77.{}.1:40001", a4[2]), 1);
    let listener = answering_listener(&b, b4, b"svc", None);
    b.await_stat("listeners_waiting", 1);
    let ask = Ask::new((&a4, b"cli"), (&b4, b"svc"), &ep_a);
    let err = a.run(move |agent| ask.connect(&agent, 5 * SECOND)).unwrap_err();
    assert!(matches!(err, AgentError::Rejected), "{err:?}");
    let (_, _, ep, result) = listener.join().unwrap();
    assert_eq!(ep, Some(ep_a));
    result.unwrap();
    assert_eq!((a.stat("cm_rejects"), a.stat("cm_accepts")), (1, 0));
    assert_eq!((b.stat("cm_rejects"), b.stat("cm_accepts")), (1, 0));
}

#[test]
fn a_listener_that_leaves_gives_the_request_to_the_next() {
    let Some(net) = Net::new("a_listener_that_leaves_gives_the_request_to_the_next") else {
        return;
    };
    let a = NsAgent::start(&net.a, &[], &[]);
    let b = NsAgent::start(&net.b, &[], &[]);
    let (a4, b4) = (net.a4, net.b4);
    let ep_a = endpoint(&format!("10.77.{}.1:40001", a4[2]), 1);
    let ep_b = endpoint(&format!("10.77.{}.2:40002", a4[2]), 2);
    let ask = Ask::new((&a4, b"cli"), (&b4, b"svc"), &ep_a);
    let requester = a.spawn(move |agent| ask.connect(&agent, 10 * SECOND));
    b.await_stat("cm_requests_received", 1);

    // The first listener drops the request unanswered.
    let inc = b.run(move |agent| listen(&agent, &b4, b"svc", 5 * SECOND).unwrap());
    assert!(matches!(inc.transport, Transport::Remote(_)));
    drop(inc);
    // The second one answers with something that is not an endpoint.
    let err = b.run(move |agent| {
        let inc = listen(&agent, &b4, b"svc", 5 * SECOND).unwrap();
        let Transport::Remote(responder) = inc.transport else {
            panic!("local transport");
        };
        responder.accept(b"garbage").unwrap_err()
    });
    assert!(matches!(err, AgentError::Protocol(_)), "{err:?}");
    // The third one accepts.
    let listener = answering_listener(&b, b4, b"svc", Some(ep_b.clone()));
    let (_, _, ep, result) = listener.join().unwrap();
    result.unwrap();
    assert_eq!(ep, Some(ep_a));
    remote_matched(&requester.join().unwrap().unwrap(), Side::A, &ep_b);
    let s = b.stats();
    assert_eq!(s["cm_requests_received"], 1);
    assert_eq!(s["remote_listeners_matched"], 3);
    assert_eq!((s["cm_accepts"], s["protocol_errors"]), (1, 1));
}

#[test]
fn no_listener_is_no_match() {
    let Some(net) = Net::new("no_listener_is_no_match") else {
        return;
    };
    let a = NsAgent::start(&net.a, &[], &[]);
    let b = NsAgent::start(&net.b, &[], &[]);
    let (a4, b4) = (net.a4, net.b4);
    let ep_a = endpoint(&format!("10.77.{}.1:40001", a4[2]), 1);
    let ask = Ask::new((&a4, b"cli"), (&b4, b"nobody"), &ep_a);
    let t = Instant::now();
    let err = a.run(move |agent| ask.connect(&agent, ms(800))).unwrap_err();
    assert!(matches!(err, AgentError::NoMatch), "{err:?}");
    assert!(t.elapsed() >= ms(800));
    assert_eq!((a.stat("cm_no_match"), a.stat("cm_unreachable")), (1, 0));
    assert_eq!((a.stat("no_match"), a.stat("remote_pending")), (1, 0));
    assert_eq!(b.stat("cm_requests_received"), 1);
    // Without copies, the held request expires: a later listener gets nothing.
    b.await_stat("remote_held", 0);
    let err = b.run(move |agent| listen(&agent, &b4, b"nobody", ms(300))).unwrap_err();
    assert!(matches!(err, AgentError::Timeout), "{err:?}");
    assert_eq!(b.stat("remote_listeners_matched"), 0);
}

#[test]
fn a_host_up_without_an_agent_is_no_match_and_a_silent_one_unreachable() {
    let Some(net) = Net::new("a_host_up_without_an_agent_is_no_match_and_a_silent_one_unreachable") else {
        return;
    };
    let a = NsAgent::start(&net.a, &[], &[]);
    let (a4, b4) = (net.a4, net.b4);
    let ep_a = endpoint(&format!("10.77.{}.1:40001", a4[2]), 1);
    // Host b is up, with no agent: its kernel answers "port unreachable",
    // and a request nobody takes ends at its deadline as NoMatch.
    let ask = Ask::new((&a4, b"cli"), (&b4, b"svc"), &ep_a);
    let t = Instant::now();
    let err = a.run(move |agent| ask.connect(&agent, ms(700))).unwrap_err();
    assert!(matches!(err, AgentError::NoMatch), "{err:?}");
    assert!(t.elapsed() >= ms(700));
    let s = a.stats();
    assert_eq!((s["cm_no_match"], s["cm_unreachable"], s["unreachable"]), (1, 0, 0));
    assert!(s["cm_port_unreachable"] >= 1, "{}", s["cm_port_unreachable"]);
    // Copies at 0, 100, ..., 600 ms; the request is withdrawn at its end.
    assert!(s["cm_retransmits"] >= 5, "{}", s["cm_retransmits"]);
    assert_eq!(s["cm_withdrawn_sent"], 1);

    // An address on the link that nobody has does not answer at all.
    let silent = [10, 77, a4[2], 9];
    let ask = Ask::new((&a4, b"cli"), (&silent, b"svc"), &ep_a);
    let err = a.run(move |agent| ask.connect(&agent, ms(700))).unwrap_err();
    assert!(matches!(err, AgentError::Unreachable), "{err:?}");
    assert_eq!((a.stat("cm_unreachable"), a.stat("unreachable")), (1, 1));

    // The smaller host never forwards a peer request: it waits, and ends
    // with NoMatch.
    let ask = Ask::new((&a4, b"p1"), (&b4, b"p2"), &ep_a);
    let err = a.run(move |agent| ask.peer(&agent, ms(300))).unwrap_err();
    assert!(matches!(err, AgentError::NoMatch), "{err:?}");
    assert_eq!(a.stat("cm_requests_sent"), 2);
    // The larger host does (the agent takes the local host address as the
    // process gives it: here one larger than b's), and finds nobody there.
    let ask = Ask::new((&[10, 77, a4[2], 3], b"p1"), (&b4, b"p2"), &ep_a);
    let err = a.run(move |agent| ask.peer(&agent, ms(300))).unwrap_err();
    assert!(matches!(err, AgentError::NoMatch), "{err:?}");
    assert_eq!((a.stat("cm_requests_sent"), a.stat("cm_no_match")), (3, 3));
}

/// Receives CM messages on `sock` until `want` says stop or 3 s pass.
fn receive(sock: &UdpSocket, mut want: impl FnMut(&CmMessage) -> bool) -> Vec<CmMessage> {
    let deadline = Instant::now() + 3 * SECOND;
    let mut got = Vec::new();
    let mut buf = [0u8; 2048];
    while Instant::now() < deadline {
        sock.set_read_timeout(Some(ms(50))).unwrap();
        if let Ok((n, _)) = sock.recv_from(&mut buf) {
            let msg = CmMessage::decode(&buf[..n]).expect("the agent sent a malformed message");
            let stop = want(&msg);
            got.push(msg);
            if stop {
                break;
            }
        }
    }
    got
}

/// Throws away whatever already arrived on `sock`.
fn drain(sock: &UdpSocket) {
    sock.set_read_timeout(Some(ms(100))).unwrap();
    let mut buf = [0u8; 2048];
    while sock.recv_from(&mut buf).is_ok() {}
}

#[test]
fn retransmitted_requests_are_delivered_once() {
    let Some(net) = Net::new("retransmitted_requests_are_delivered_once") else {
        return;
    };
    let b = NsAgent::start(&net.b, &[], &[]);
    let (a4, b4) = (net.a4, net.b4);
    let agent_b: SocketAddr = (std::net::Ipv4Addr::from(b4), CM_PORT).into();
    // A fake requesting agent: a plain UDP socket on host a's CM port (as
    // root: the port is privileged).
    let sock = in_ns(&net.a, || UdpSocket::bind(("0.0.0.0", CM_PORT)).unwrap()).join().unwrap();
    let ep_a = endpoint(&format!("10.77.{}.1:40001", a4[2]), 1);
    let ep_b = endpoint(&format!("10.77.{}.2:40002", a4[2]), 2);
    let request = |id: u64, to_host: &[u8]| {
        CmMessage::Request {
            id,
            from_host: a4.to_vec(),
            from_disc: b"raw".to_vec(),
            to_host: to_host.to_vec(),
            to_disc: b"svc".to_vec(),
            peer: false,
            endpoint: ep_a.clone(),
        }
        .encode()
    };

    let first = b.spawn(move |agent| listen(&agent, &b4, b"svc", 10 * SECOND).unwrap());
    b.await_stat("listeners_waiting", 1);
    for _ in 0..5 {
        sock.send_to(&request(77, &b4), agent_b).unwrap();
    }
    // The first copy is acknowledged and taken by the listener at once:
    // the requester hears `Taken`, and so does every later copy.
    let mut answers = 0;
    let got = receive(&sock, |_| {
        answers += 1;
        answers == 6
    });
    let mut want = vec![CmMessage::Taken { id: 77 }; 6];
    want[0] = CmMessage::Ack { id: 77 };
    assert_eq!(got, want, "every copy is answered");
    let inc = first.join().unwrap();
    assert_eq!(decode_endpoint(&inc.remote_info), Some(ep_a.clone()));
    assert_eq!((inc.remote_host.as_slice(), inc.remote_disc.as_slice()), (&a4[..], &b"raw"[..]));
    // No second delivery.
    let err = b.run(move |agent| listen(&agent, &b4, b"svc", ms(300))).unwrap_err();
    assert!(matches!(err, AgentError::Timeout), "{err:?}");
    let s = b.stats();
    assert_eq!((s["cm_requests_received"], s["cm_duplicates"]), (1, 4));
    assert_eq!((s["remote_listeners_matched"], s["remote_held"]), (1, 1));

    // The accept is retransmitted until acknowledged, and sent again for a
    // late copy of the request.
    let Transport::Remote(responder) = inc.transport else { panic!("local transport") };
    let info = encode_endpoint(&ep_b);
    let accepting = thread::spawn(move || responder.accept(&info));
    let want = CmMessage::Accept { id: 77, endpoint: ep_b.clone() };
    let got = receive(&sock, |m| {
        assert_eq!(m, &want);
        false
    });
    assert!(got.len() >= 3, "{} copies of the accept", got.len());
    sock.send_to(&request(77, &b4), agent_b).unwrap();
    assert_eq!(receive(&sock, |_| true), vec![want.clone()]);
    assert!(!accepting.is_finished());
    sock.send_to(&CmMessage::Ack { id: 77 }.encode(), agent_b).unwrap();
    accepting.join().unwrap().unwrap();
    // A copy sent before the Ack was seen may still be on its way.
    drain(&sock);
    assert!(b.stat("cm_retransmits") >= 2);
    assert_eq!((b.stat("cm_accepts"), b.stat("cm_requests_received")), (1, 1));

    // A request for an address that is not b's is refused; a new id is a
    // new request; a keep-alive is answered; garbage is counted.
    sock.send_to(&request(78, &[10, 77, a4[2], 9]), agent_b).unwrap();
    assert_eq!(receive(&sock, |_| true), vec![CmMessage::NoMatch { id: 78 }]);
    sock.send_to(&request(79, &b4), agent_b).unwrap();
    assert_eq!(receive(&sock, |_| true), vec![CmMessage::Ack { id: 79 }]);
    sock.send_to(&CmMessage::KeepAlive { nonce: 5 }.encode(), agent_b).unwrap();
    assert_eq!(
        receive(&sock, |m| matches!(m, CmMessage::KeepAliveReply { .. })).last(),
        Some(&CmMessage::KeepAliveReply { nonce: 5 })
    );
    let mut bad = request(80, &b4);
    bad[12] ^= 1;
    for garbage in [&b"hello"[..], &[], &bad] {
        sock.send_to(garbage, agent_b).unwrap();
    }
    b.await_stat("cm_malformed", 3);
    assert_eq!(b.stat("cm_requests_received"), 2);
    // An accept for a request the agent does not know is refused.
    let stray = CmMessage::Accept { id: 12345, endpoint: ep_a.clone() };
    sock.send_to(&stray.encode(), agent_b).unwrap();
    let got = receive(&sock, |m| matches!(m, CmMessage::NoMatch { .. }));
    assert_eq!(got.last(), Some(&CmMessage::NoMatch { id: 12345 }));

    // The same messages from another port of host a are dropped unread
    // and unanswered.
    let other = in_ns(&net.a, || UdpSocket::bind("0.0.0.0:0").unwrap()).join().unwrap();
    let forged = [request(81, &b4), CmMessage::KeepAlive { nonce: 6 }.encode(), stray.encode(), b"hello".to_vec()];
    for d in &forged {
        other.send_to(d, agent_b).unwrap();
    }
    b.await_stat("cm_refused_source", forged.len() as u64);
    other.set_read_timeout(Some(ms(300))).unwrap();
    assert!(other.recv_from(&mut [0u8; 2048]).is_err(), "an answer to another port");
    let s = b.stats();
    assert_eq!((s["cm_requests_received"], s["cm_malformed"]), (2, 3));
}

#[test]
fn cm_port_survives_garbage_and_odd_messages() {
    let Some(net) = Net::new("cm_port_survives_garbage_and_odd_messages") else {
        return;
    };
    let b = NsAgent::start(&net.b, &[], &[]);
    let agent_b: SocketAddr = (std::net::Ipv4Addr::from(net.b4), CM_PORT).into();
    // From host a's CM port, so that the agent reads every one.
    let sock = in_ns(&net.a, || UdpSocket::bind(("0.0.0.0", CM_PORT)).unwrap()).join().unwrap();
    let (datagrams, malformed) = odd_cm::datagrams(3000);
    for (i, bytes) in datagrams.iter().enumerate() {
        sock.send_to(bytes, agent_b).unwrap();
        if i % 100 == 0 {
            // Stay below the socket buffer, so nothing is dropped uncounted.
            thread::sleep(ms(5));
        }
    }
    b.await_stat("cm_malformed", malformed);
    assert!(b.stat("cm_requests_received") > 0);
    assert_eq!(b.stat("cm_refused_source"), 0);
    // The agent still serves its own host.
    let (_, dev) = b.run(|agent| agent.open_session("via_veth0", None).unwrap());
    assert_eq!(dev.host_addr, net.b4.to_vec());
}

#[test]
fn a_cm_port_that_is_not_privileged_here_is_reported() {
    let Some(net) = Net::new("a_cm_port_that_is_not_privileged_here_is_reported") else {
        return;
    };
    // Host a lets every user bind every port.
    let lowered = Command::new("ip")
        .args(["netns", "exec", &net.a, "sh", "-c", "echo 0 > /proc/sys/net/ipv4/ip_unprivileged_port_start"])
        .status()
        .unwrap();
    assert!(lowered.success());
    let a = NsAgent::start(&net.a, &[], &[]);
    let b = NsAgent::start(&net.b, &[], &[]);
    assert_eq!((a.stat("cm_port"), a.stat("cm_port_privileged")), (u64::from(CM_PORT), 0));
    assert_eq!((b.stat("cm_port"), b.stat("cm_port_privileged")), (u64::from(CM_PORT), 1));
}

#[test]
fn peers_across_hosts_in_both_orders() {
    let Some(net) = Net::new("peers_across_hosts_in_both_orders") else {
        return;
    };
    let a = NsAgent::start(&net.a, &[], &[]);
    let b = NsAgent::start(&net.b, &[], &[]);
    // b has the larger address: it forwards, a holds.
    let (a4, b4) = (net.a4, net.b4);
    let ep_a = endpoint(&format!("10.77.{}.1:40001", a4[2]), 1);
    let ep_b = endpoint(&format!("10.77.{}.2:40002", a4[2]), 2);
    let ask_a = Ask::new((&a4, b"pa"), (&b4, b"pb"), &ep_a);
    let ask_b = Ask::new((&b4, b"pb"), (&a4, b"pa"), &ep_b);

    // The smaller host's request first.
    let early = {
        let ask = ask_a.clone();
        a.spawn(move |agent| ask.peer(&agent, 10 * SECOND))
    };
    a.await_stat("remote_pending", 1);
    thread::sleep(ms(300));
    assert_eq!(b.stat("cm_requests_received"), 0, "the smaller host forwarded");
    let ask = ask_b.clone();
    let late = b.run(move |agent| ask.peer(&agent, 5 * SECOND)).unwrap();
    remote_matched(&late, Side::A, &ep_a);
    remote_matched(&early.join().unwrap().unwrap(), Side::B, &ep_b);

    // The larger host's request first: held at the smaller host, where a
    // request that is not its mirror image does not take it.
    let early = {
        let ask = ask_b.clone();
        b.spawn(move |agent| ask.peer(&agent, 10 * SECOND))
    };
    a.await_stat("cm_requests_received", 2);
    let wrong = Ask::new((&a4, b"pa"), (&b4, b"px"), &ep_a);
    let err = a.run(move |agent| wrong.peer(&agent, ms(300))).unwrap_err();
    assert!(matches!(err, AgentError::NoMatch), "{err:?}");
    let ask = ask_a.clone();
    let late = a.run(move |agent| ask.peer(&agent, 5 * SECOND)).unwrap();
    remote_matched(&late, Side::B, &ep_b);
    remote_matched(&early.join().unwrap().unwrap(), Side::A, &ep_a);

    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!((sa["cm_requests_sent"], sb["cm_requests_sent"]), (0, 2));
    assert_eq!((sa["cm_requests_received"], sb["cm_requests_received"]), (2, 0));
    assert_eq!((sa["cm_accepts"], sb["cm_accepts"]), (2, 2));
    assert_eq!((sa["peers_pending"], sa["remote_pending"]), (0, 0));
    assert_eq!((sa["peer_matched"], sb["peer_matched"]), (0, 0));
}

#[test]
fn ipv6_across_hosts() {
    let Some(net) = Net::new("ipv6_across_hosts") else {
        return;
    };
    // Both agents on another CM port, from the environment.
    let env = [("VIA_CM_PORT", "6197")];
    let a = NsAgent::start(&net.a, &env, &[]);
    let b = NsAgent::start(&net.b, &env, &[]);
    assert_eq!(b.stat("cm_port"), 6197);
    let (a6, b6) = (v6(1), v6(2));
    let (_, dev) = a.run(|agent| agent.open_session("via_veth0", None).unwrap());
    assert_eq!(dev.host_addr, net.a4.to_vec());
    assert_eq!(dev.host_addr6, Some(a6.to_vec()));

    let ep_a = endpoint("[fd77::1]:40001", 1);
    let ep_b = endpoint("[fd77::2]:40002", 2);
    let listener = answering_listener_on(&b, b6.to_vec(), b"svc6", Some(ep_b.clone()));
    b.await_stat("listeners_waiting", 1);
    let ask = Ask::new((&a6, b"cli6"), (&b6, b"svc6"), &ep_a);
    let m = a.run(move |agent| ask.connect(&agent, 5 * SECOND)).unwrap();
    remote_matched(&m, Side::A, &ep_b);
    let (host, disc, ep, result) = listener.join().unwrap();
    result.unwrap();
    assert_eq!((host, disc, ep), (a6.to_vec(), b"cli6".to_vec(), Some(ep_a.clone())));

    // Peers over IPv6 too.
    let ask_a = Ask::new((&a6, b"pa"), (&b6, b"pb"), &ep_a);
    let ask_b = Ask::new((&b6, b"pb"), (&a6, b"pa"), &ep_b);
    let early = a.spawn(move |agent| ask_a.peer(&agent, 10 * SECOND));
    a.await_stat("remote_pending", 1);
    let late = b.run(move |agent| ask_b.peer(&agent, 5 * SECOND)).unwrap();
    remote_matched(&late, Side::A, &ep_a);
    remote_matched(&early.join().unwrap().unwrap(), Side::B, &ep_b);
    assert_eq!((a.stat("cm_accepts"), b.stat("cm_accepts")), (2, 2));
}

#[test]
fn a_listener_that_never_answers_loses_the_request() {
    let Some(net) = Net::new("a_listener_that_never_answers_loses_the_request") else {
        return;
    };
    let a = NsAgent::start(&net.a, &[], &[]);
    let b = NsAgent::start(&net.b, &[], &[]);
    let (a4, b4) = (net.a4, net.b4);
    let ep_a = endpoint(&format!("10.77.{}.1:40001", a4[2]), 1);
    let ep_b = endpoint(&format!("10.77.{}.2:40002", a4[2]), 2);
    let ask = Ask::new((&a4, b"cli"), (&b4, b"svc"), &ep_a);
    let requester = a.spawn(move |agent| ask.connect(&agent, 20 * SECOND));
    b.await_stat("cm_requests_received", 1);

    // The first listener takes the request and sits on it; a second one waits.
    let inc = b.run(move |agent| listen(&agent, &b4, b"svc", 5 * SECOND).unwrap());
    let taken = Instant::now();
    let Transport::Remote(silent) = inc.transport else {
        panic!("local transport");
    };
    let listener = answering_listener(&b, b4, b"svc", Some(ep_b.clone()));
    // After ANSWER_TIME the request goes to the second listener.
    let m = requester.join().unwrap().unwrap();
    assert!(taken.elapsed() >= ANSWER_TIME - ms(100), "requeued after {:?}", taken.elapsed());
    remote_matched(&m, Side::A, &ep_b);
    let (_, disc, ep, result) = listener.join().unwrap();
    result.unwrap();
    assert_eq!((disc, ep), (b"cli".to_vec(), Some(ep_a)));
    // The first listener's late answer finds the request gone.
    let err = silent.accept(&encode_endpoint(&ep_b)).unwrap_err();
    assert!(matches!(err, AgentError::NoMatch), "{err:?}");
    let s = b.stats();
    assert_eq!((s["answer_timeouts"], s["remote_listeners_matched"]), (1, 2));
    assert_eq!((s["cm_accepts"], s["clients"]), (1, 1));
}

/// An eventfd that ends a client's wait once written.
fn cancel_fd() -> std::sync::Arc<OwnedFd> {
    // SAFETY: plain syscall; the fd is owned from here on.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    assert!(fd >= 0);
    std::sync::Arc::new(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn cancel(fd: &OwnedFd) {
    let one = 1u64.to_ne_bytes();
    // SAFETY: an 8-byte write to an eventfd.
    assert_eq!(unsafe { libc::write(fd.as_raw_fd(), one.as_ptr().cast(), 8) }, 8);
}

/// Waits until `agent`'s counter `name` is at least `value`.
fn await_at_least(agent: &NsAgent, name: &str, value: u64) {
    let deadline = Instant::now() + 5 * SECOND;
    while agent.stat(name) < value {
        assert!(Instant::now() < deadline, "{name} never reached {value}");
        thread::sleep(ms(10));
    }
}

#[test]
fn a_request_whose_requester_gave_up_is_never_handed_to_a_listener() {
    let Some(net) = Net::new("a_request_whose_requester_gave_up_is_never_handed_to_a_listener") else {
        return;
    };
    let a = NsAgent::start(&net.a, &[], &[]);
    let b = NsAgent::start(&net.b, &[], &[]);
    let (a4, b4) = (net.a4, net.b4);
    let ep_a = endpoint(&format!("10.77.{}.1:40001", a4[2]), 1);
    let ep_b = endpoint(&format!("10.77.{}.2:40002", a4[2]), 2);

    // Timed out: held at b (acknowledged), so NoMatch, then withdrawn.
    let ask = Ask::new((&a4, b"cli"), (&b4, b"svc"), &ep_a);
    let err = a.run(move |agent| ask.connect(&agent, ms(500))).unwrap_err();
    assert!(matches!(err, AgentError::NoMatch), "{err:?}");
    b.await_stat("cm_withdrawn_received", 1);
    assert_eq!(b.stat("remote_held"), 0);
    let err = b.run(move |agent| listen(&agent, &b4, b"svc", ms(300))).unwrap_err();
    assert!(matches!(err, AgentError::Timeout), "a withdrawn request was delivered: {err:?}");

    // Given up by its process (the connection to the agent closes, as when
    // the process dies): withdrawn too.
    let stop = cancel_fd();
    let ask = Ask::new((&a4, b"cli"), (&b4, b"svc"), &ep_a);
    let (agent_a, stop2) = (a.agent.clone(), stop.clone());
    let asking = in_ns(&net.a, move || ask.connect(&agent_a.cancelled_by(stop2), 30 * SECOND));
    await_at_least(&b, "remote_held", 1);
    cancel(&stop);
    assert!(matches!(asking.join().unwrap(), Err(AgentError::Cancelled)));
    b.await_stat("cm_withdrawn_received", 2);
    let err = b.run(move |agent| listen(&agent, &b4, b"svc", ms(300))).unwrap_err();
    assert!(matches!(err, AgentError::Timeout), "an abandoned request was delivered: {err:?}");

    // The same VI asking again while its earlier copies may still be held:
    // the listener gets the newest request, and it is accepted.
    let ask = Ask::new((&a4, b"cli"), (&b4, b"svc"), &ep_a);
    let asking = a.spawn(move |agent| ask.connect(&agent, 5 * SECOND));
    await_at_least(&b, "remote_held", 1);
    let (_, _, seen, result) = answering_listener(&b, b4, b"svc", Some(ep_b.clone())).join().unwrap();
    result.unwrap();
    assert_eq!(seen, Some(ep_a));
    remote_matched(&asking.join().unwrap().unwrap(), Side::A, &ep_b);
    assert_eq!(a.stat("cm_withdrawn_sent"), 2);
}

#[test]
fn a_listener_that_took_a_request_at_its_deadline_still_connects() {
    let Some(net) = Net::new("a_listener_that_took_a_request_at_its_deadline_still_connects") else {
        return;
    };
    let a = NsAgent::start(&net.a, &[], &[]);
    let b = NsAgent::start(&net.b, &[], &[]);
    let (a4, b4) = (net.a4, net.b4);
    let ep_a = endpoint(&format!("10.77.{}.1:40001", a4[2]), 1);
    let ep_b = endpoint(&format!("10.77.{}.2:40002", a4[2]), 2);
    // The listener takes the request at once and answers 1.5 s later,
    // past the requester's 1 s timeout.
    let ep = ep_b.clone();
    let listener = b.spawn(move |agent| {
        let inc = listen(&agent, &b4, b"svc", 10 * SECOND).unwrap();
        let Transport::Remote(responder) = inc.transport else { panic!("local transport") };
        thread::sleep(ms(1500));
        responder.accept(&encode_endpoint(&ep))
    });
    b.await_stat("listeners_waiting", 1);
    let ask = Ask::new((&a4, b"cli"), (&b4, b"svc"), &ep_a);
    let t = Instant::now();
    let m = a.run(move |agent| ask.connect(&agent, SECOND)).unwrap();
    assert!(t.elapsed() >= ms(1400), "{:?}", t.elapsed());
    remote_matched(&m, Side::A, &ep_b);
    listener.join().unwrap().unwrap();
    assert_eq!(a.stat("cm_withdrawn_sent"), 0);
}

#[test]
fn a_host_whose_agent_starts_during_the_request_connects() {
    let Some(net) = Net::new("a_host_whose_agent_starts_during_the_request_connects") else {
        return;
    };
    let a = NsAgent::start(&net.a, &[], &[]);
    let (a4, b4) = (net.a4, net.b4);
    let ep_a = endpoint(&format!("10.77.{}.1:40001", a4[2]), 1);
    let ep_b = endpoint(&format!("10.77.{}.2:40002", a4[2]), 2);
    let ask = Ask::new((&a4, b"cli"), (&b4, b"svc"), &ep_a);
    let asking = a.spawn(move |agent| ask.connect(&agent, 5 * SECOND));
    await_at_least(&a, "cm_port_unreachable", 1);
    thread::sleep(ms(1200));
    let b = NsAgent::start(&net.b, &[], &[]);
    let (_, _, seen, result) = answering_listener(&b, b4, b"svc", Some(ep_b.clone())).join().unwrap();
    result.unwrap();
    assert_eq!(seen, Some(ep_a));
    remote_matched(&asking.join().unwrap().unwrap(), Side::A, &ep_b);
}
