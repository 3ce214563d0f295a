//! openvia's hostile peer.
//!
//! A process that connects to a VIA program through the real host agent
//! and then speaks the peer protocol as an attacker would: it lies where a
//! peer can lie and tries what a peer of another user can try.  Each
//! subcommand is one attack; it exits 0 when every attempt was refused as
//! `docs/security.md` says it must be, 1 (with the reason on stderr) when
//! an attempt got through, 2 on a usage or set-up error.  `run.sh` pairs
//! each attack with a victim (`victim.c`, a VIA program written against
//! `vipl.h`) and, where the attack aims at a third process, a bystander.
//!
//! ```text
//! via-hostile bystander DIR ADDR             memory at ADDR, pid and checksum in DIR
//! via-hostile forge-pid DISC DIR ADDR LEN    a receive at ADDR; claims the bystander's pid
//! via-hostile table-write DISC               tries to write the victim's registry table
//! via-hostile break-code DISC                breaks the connection with a code not in the specification
//! via-hostile rdma-write DISC DIR            RDMA writes through the ring the victim must refuse
//! via-hostile cq-lanes DISC DIR              forges, stalls and floods CQ entries in its lane
//! via-hostile rdma-read DISC DIR             RDMA read requests through the ring the victim must refuse
//! via-hostile silent DISC SECONDS            connects and never says Ready
//! via-hostile big-segment DISC               asks for a 256 MiB connection segment
//! via-hostile impostor NAME DIR SECONDS       poses as the agent on @NAME; writes what it got to DIR
//! via-hostile cm-bind PORT                   tries to bind the CM port before the agent (EACCES expected)
//! via-hostile cm-forge ADDR PORT ID DIR SECS forged CM answers for request ID (and guessed ids) to the
//!                                            agent at ADDR:PORT, from an unprivileged port; the count
//!                                            sent goes to DIR/forged.count
//! ```

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use via_core::consts::{SERVICE_RELIABLE_DELIVERY, SERVICE_UNRELIABLE, STATUS_RDMA_PROT_ERROR};
use via_provider::endpoint::{Endpoint, PeerMessage, NO_CQ};
use via_provider::peer_channel;
use via_provider::timeout::Deadline;
use via_shm::{Bell, ConnSegment, Inbox, RecvSeg, SharedRegion, Side, TableSegment, CONN_SEGMENT_BYTES};
use via_wire::cm::{CmEndpoint, CmMessage};
use viad::client::{self, ConnFds, Request, Session};

/// The VI attributes both sides of every attack use (victim.c agrees).
const MAX_TRANSFER: u64 = 65536;
/// Byte the bystander fills its memory with.
const BYSTANDER_BYTE: u8 = 0xB7;
/// Byte the victim sends.
const VICTIM_BYTE: u8 = 0x5A;

type Outcome = Result<(), String>;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let outcome = match a.as_slice() {
        ["bystander", dir, addr] => bystander(Path::new(dir), parse(addr)),
        ["forge-pid", disc, dir, addr, len] => forge_pid(disc, Path::new(dir), parse(addr), parse(len)),
        ["table-write", disc] => table_write(disc),
        ["break-code", disc] => break_code(disc),
        ["rdma-write", disc, dir] => rdma_write(disc, Path::new(dir)),
        ["cq-lanes", disc, dir] => cq_lanes(disc, Path::new(dir)),
        ["rdma-read", disc, dir] => rdma_read(disc, Path::new(dir)),
        ["silent", disc, secs] => silent(disc, parse(secs)),
        ["big-segment", disc] => big_segment(disc),
        ["impostor", name, dir, secs] => impostor(name, Path::new(dir), parse(secs)),
        ["cm-bind", port] => cm_bind(parse(port) as u16),
        ["cm-forge", addr, port, id, dir, secs] => match addr.parse() {
            Ok(addr) => cm_forge(addr, parse(port) as u16, parse(id), Path::new(dir), parse(secs)),
            Err(_) => Err(format!("not an IP address: {addr}")),
        },
        _ => {
            eprintln!("usage: see the module documentation of tests/hostile/src/main.rs");
            return ExitCode::from(2);
        }
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(why) => {
            eprintln!("via-hostile {}: ATTACK SUCCEEDED OR SET-UP FAILED: {why}", a.first().unwrap_or(&""));
            ExitCode::from(1)
        }
    }
}

fn parse(s: &str) -> u64 {
    let parsed = match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    };
    parsed.unwrap_or_else(|_| {
        eprintln!("not a number: {s}");
        std::process::exit(2)
    })
}

/// Maps `len` zeroed bytes at exactly `addr` in this process.
fn map_at(addr: u64, len: usize) -> Result<*mut u8, String> {
    // SAFETY: a fresh anonymous mapping at an address nothing else uses
    // (MAP_FIXED_NOREPLACE fails rather than replace a mapping).
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED || p as u64 != addr {
        return Err(format!("cannot map {len} bytes at {addr:#x}: {}", io::Error::last_os_error()));
    }
    Ok(p.cast())
}

/// A third process that never uses VIA: memory at a known address, which
/// no attack may change.  Writes its pid to DIR/bystander.pid, then waits
/// for DIR/done and checks its memory.
fn bystander(dir: &Path, addr: u64) -> Outcome {
    const LEN: usize = 1 << 20;
    let p = map_at(addr, LEN)?;
    // SAFETY: `p` is LEN bytes of our own mapping.
    let mem = unsafe { std::slice::from_raw_parts_mut(p, LEN) };
    mem.fill(BYSTANDER_BYTE);
    std::fs::write(dir.join("bystander.pid"), std::process::id().to_string()).map_err(|e| e.to_string())?;
    let until = Instant::now() + Duration::from_secs(60);
    while !dir.join("done").exists() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    match mem.iter().position(|&b| b != BYSTANDER_BYTE) {
        None => Ok(()),
        Some(at) => Err(format!("the bystander's memory changed at {:#x}", addr + at as u64)),
    }
}

/// What an attacker holds to connect through the agent: a session, its
/// own bell and registry table, the host's address.
struct Attacker {
    _session: Session,
    bell: Bell,
    table: TableSegment,
    host: Vec<u8>,
}

impl Attacker {
    fn new() -> Result<Attacker, String> {
        let (session, info) = Session::open("/dev/via_lo").map_err(|e| format!("open /dev/via_lo: {e}"))?;
        let bell = Bell::create().map_err(|e| e.to_string())?;
        let table = TableSegment::create().map_err(|e| e.to_string())?;
        Ok(Attacker { _session: session, bell, table, host: info.host_addr })
    }

    /// Asks the agent for the listener on `disc`.
    fn connect(&self, disc: &str, segment_bytes: u64) -> Result<ConnFds, client::AgentError> {
        let local_disc = format!("hostile-{}", std::process::id());
        let req = Request {
            local_host: &self.host,
            local_disc: local_disc.as_bytes(),
            remote_host: &self.host,
            remote_disc: disc.as_bytes(),
            info: &[],
            bell: self.bell.fd(),
            segment_bytes,
        };
        let matched = client::connect(&req, Duration::from_secs(20))?;
        matched.fds.ok_or(client::AgentError::Unreachable)
    }

    /// Connects honestly up to the victim's Accept: maps the segment, runs
    /// `before_ready` on it, says Ready, and returns the Accept's fd (the
    /// victim's registry table).
    fn handshake(&self, disc: &str, before_ready: impl FnOnce(&ConnSegment) -> Outcome) -> Result<Connection, String> {
        self.handshake_as(disc, endpoint(), before_ready)
    }

    /// [`Attacker::handshake`], stating `ep` as this side's endpoint.
    fn handshake_as(
        &self,
        disc: &str,
        ep: Endpoint,
        before_ready: impl FnOnce(&ConnSegment) -> Outcome,
    ) -> Result<Connection, String> {
        let fds = self.connect(disc, CONN_SEGMENT_BYTES as u64).map_err(|e| format!("connect: {e}"))?;
        peer_channel::expect_credentials(fds.socket.as_fd()).map_err(|e| e.to_string())?;
        let region = SharedRegion::map(fds.segment).map_err(|e| e.to_string())?;
        let seg = ConnSegment::new(region, Side::A).map_err(|e| e.to_string())?;
        before_ready(&seg)?;
        let ready = PeerMessage::Ready(ep);
        peer_channel::send(fds.socket.as_fd(), &ready, Some(self.table.fd())).map_err(|e| format!("Ready: {e}"))?;
        let accept = peer_channel::recv(fds.socket.as_fd(), None, &Deadline::after_ms(20_000))
            .map_err(|e| format!("waiting for Accept: {e}"))?
            .ok_or("no Accept within 20 s")?;
        let victim = match accept.msg {
            PeerMessage::Accept(e) => e,
            other => return Err(format!("the victim answered {other:?}")),
        };
        let table = accept.fd.ok_or("the Accept brought no registry table")?;
        let victim_lane = exchange_lanes(&fds.socket)?;
        Ok(Connection {
            _seg: seg,
            socket: fds.socket,
            victim,
            victim_table: table,
            victim_lane,
            victim_bell: fds.peer_bell,
        })
    }
}

/// After the victim's Accept: takes the lane the victim gives this peer
/// (for the completions it makes for the victim) and gives one back.
fn exchange_lanes(socket: &OwnedFd) -> Result<OwnedFd, String> {
    let got = peer_channel::recv(socket.as_fd(), None, &Deadline::after_ms(20_000))
        .map_err(|e| format!("waiting for the victim's lane: {e}"))?
        .ok_or("no lane within 20 s")?;
    if got.msg != PeerMessage::Lane {
        return Err(format!("the victim sent {:?} instead of its lane", got.msg));
    }
    let lane = got.fd.ok_or("the victim's Lane brought no fd")?;
    let mine = Inbox::create_lane().map_err(|e| e.to_string())?;
    peer_channel::send(socket.as_fd(), &PeerMessage::Lane, Some(mine.fd())).map_err(|e| format!("Lane: {e}"))?;
    Ok(lane)
}

/// An established connection to the victim.
struct Connection {
    _seg: ConnSegment,
    socket: OwnedFd,
    /// The endpoint the victim stated in its Accept.
    victim: Endpoint,
    victim_table: OwnedFd,
    /// The lane the victim gave this peer, and its bell.
    victim_lane: OwnedFd,
    victim_bell: OwnedFd,
}

/// The endpoint an attacker states: what victim.c's VI expects.
fn endpoint() -> Endpoint {
    Endpoint {
        vi: 1,
        recv_cq: NO_CQ,
        reliability: SERVICE_UNRELIABLE,
        max_transfer: MAX_TRANSFER,
        rdma_write: true,
        rdma_read: false,
        ptag: 1,
    }
}

/// The confused deputy: the victim's large send is written by cross-memory
/// attach into the receive this peer publishes.  The peer publishes the
/// bystander's address and claims to be the bystander.  The kernel refuses
/// the claim, the victim targets the process the kernel names, and the
/// victim's bytes land here, at the same address, not in the bystander.
fn forge_pid(disc: &str, dir: &Path, addr: u64, len: u64) -> Outcome {
    let bystander: i32 = std::fs::read_to_string(dir.join("bystander.pid"))
        .map_err(|e| format!("no bystander pid: {e}"))?
        .trim()
        .parse()
        .map_err(|_| "bad bystander pid")?;
    let len = len as usize;
    let here = map_at(addr, len)?;
    let attacker = Attacker::new()?;
    let fds = attacker.connect(disc, CONN_SEGMENT_BYTES as u64).map_err(|e| format!("connect: {e}"))?;
    let region = SharedRegion::map(fds.segment).map_err(|e| e.to_string())?;
    let seg = ConnSegment::new(region, Side::A).map_err(|e| e.to_string())?;
    // Registered in this process's own table, as an honest receiver's is.
    // SAFETY: the table is zeroed, writable here, and outlives `registry`
    // (both live until this function returns; `registry` is dropped first).
    let registry = unsafe { via_core::registry::Registry::in_table(attacker.table.as_ptr()) };
    let handle = registry.register(addr, len as u64, 1, 0, false).map_err(|e| format!("register: {e:?}"))?;
    seg.my_recvs().publish([RecvSeg { addr, len: len as u32, handle }]).map_err(|e| e.to_string())?;
    // The lie: Ready in the bystander's name.
    let ready = PeerMessage::Ready(endpoint());
    match peer_channel::send_claiming(fds.socket.as_fd(), &ready.encode(), bystander, Some(attacker.table.fd())) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => {}
        Err(e) => return Err(format!("sending forged credentials failed oddly: {e}")),
        Ok(()) => return Err("the kernel carried credentials naming another process".into()),
    }
    // The truth, since the lie did not go out.
    peer_channel::send(fds.socket.as_fd(), &ready, Some(attacker.table.fd())).map_err(|e| e.to_string())?;
    let accept = peer_channel::recv(fds.socket.as_fd(), None, &Deadline::after_ms(20_000))
        .map_err(|e| format!("waiting for Accept: {e}"))?
        .ok_or("no Accept within 20 s")?;
    if !matches!(accept.msg, PeerMessage::Accept(_)) {
        return Err(format!("the victim answered {:?}", accept.msg));
    }
    let _lane = exchange_lanes(&fds.socket)?;
    // SAFETY: `here` is `len` bytes of our own mapping.
    let mem = unsafe { std::slice::from_raw_parts(here, len) };
    let until = Instant::now() + Duration::from_secs(20);
    // SAFETY: a volatile read of our own memory, which the victim writes.
    while unsafe { std::ptr::read_volatile(here.add(len - 1)) } != VICTIM_BYTE && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    match mem.iter().position(|&b| b != VICTIM_BYTE) {
        None => Ok(()),
        Some(at) => Err(format!("the victim's send did not land here (byte {at} is {:#x})", mem[at])),
    }
}

/// Tries every way to write the victim's registry table: a writable
/// mapping of the fd, of a fresh open of it, a write, a resize, and making
/// a read-only mapping writable.  Each must be refused.
fn table_write(disc: &str) -> Outcome {
    let attacker = Attacker::new()?;
    let conn = attacker.handshake(disc, |_| Ok(()))?;
    let fd = conn.victim_table.as_raw_fd();
    let len = via_shm::TABLE_SEGMENT_BYTES;
    let mut got_through = Vec::new();
    let try_map = |fd: i32, prot: i32| {
        // SAFETY: a mapping of a file we hold; unmapped at once if made.
        unsafe {
            let p = libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd, 0);
            if p == libc::MAP_FAILED {
                None
            } else {
                Some(p)
            }
        }
    };
    if let Some(p) = try_map(fd, libc::PROT_READ | libc::PROT_WRITE) {
        scribble(p, len);
        got_through.push("a writable mapping of the fd");
    }
    let path = format!("/proc/self/fd/{fd}");
    if let Ok(f) = std::fs::OpenOptions::new().read(true).write(true).open(&path) {
        if let Some(p) = try_map(f.as_raw_fd(), libc::PROT_READ | libc::PROT_WRITE) {
            scribble(p, len);
            got_through.push("a writable mapping of a fresh open");
        }
        // SAFETY: write and ftruncate on a file we opened.
        unsafe {
            if libc::pwrite(f.as_raw_fd(), [0xFFu8; 64].as_ptr().cast(), 64, 0) > 0 {
                got_through.push("a write to a fresh open");
            }
            if libc::ftruncate(f.as_raw_fd(), 0) == 0 {
                got_through.push("truncating it");
            }
        }
    }
    match try_map(fd, libc::PROT_READ) {
        // SAFETY: mprotect of our own mapping.
        Some(p) if unsafe { libc::mprotect(p, len, libc::PROT_READ | libc::PROT_WRITE) } == 0 => {
            scribble(p, len);
            got_through.push("making a read-only mapping writable");
        }
        Some(_) => {}
        None => return Err("the victim's table cannot even be mapped read-only".into()),
    }
    drop(conn.socket);
    match got_through.is_empty() {
        true => Ok(()),
        false => Err(format!("the victim's registry table could be written by: {}", got_through.join(", "))),
    }
}

/// Fills a mapping of the victim's table with garbage.
fn scribble(p: *mut libc::c_void, len: usize) {
    // SAFETY: `p` is a writable mapping of `len` bytes.
    unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0xFF, len) };
}

/// Breaks the connection with an error code the specification does not
/// have; the victim's error callback must see `VIP_ERROR_CONN_LOST`.
fn break_code(disc: &str) -> Outcome {
    let attacker = Attacker::new()?;
    let conn = attacker.handshake(disc, |_| Ok(()))?;
    let mut bytes = vec![5u8];
    bytes.extend_from_slice(&0xDEAD_BEEFu32.to_le_bytes());
    // SAFETY: a plain send on our socket.
    let n = unsafe { libc::send(conn.socket.as_raw_fd(), bytes.as_ptr().cast(), bytes.len(), libc::MSG_NOSIGNAL) };
    if n != bytes.len() as isize {
        return Err(format!("send: {}", io::Error::last_os_error()));
    }
    // Keep the connection until the victim has seen it.
    std::thread::sleep(Duration::from_secs(2));
    Ok(())
}

/// RDMA writes through the ring, as a peer that may not attach to the
/// victim sends them, none of which the peer checks: one the victim allows
/// (100 bytes of 0x33 at the start of its enabled region), then writes
/// into its region without RDMA write enable, past the end of the enabled
/// region, at the other region's address under the enabled one's handle,
/// under a handle that names nothing, and of a length that wraps the
/// address space; then a header the protocol cannot have.  The victim
/// (unreliable) must drop the refused writes, land none of their bytes,
/// and break the connection over the bad header.
fn rdma_write(disc: &str, dir: &Path) -> Outcome {
    use via_shm::{SlotHeader, RDMA_TARGET_BYTES, SLOT_RDMA_PIECE, SLOT_RDMA_WRITE};
    let v = read_targets(dir, "rdma.targets")?;
    let [open, open_mh, closed, closed_mh] = v[..] else {
        return Err(format!("bad rdma.targets: {v:?}"));
    };
    let (open_mh, closed_mh) = (open_mh as u32, closed_mh as u32);
    let attacker = Attacker::new()?;
    let conn = attacker.handshake(disc, |_| Ok(()))?;
    let tx = conn._seg.tx();
    let push = |hdr: &SlotHeader, payload: &[u8]| -> Outcome {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match tx.push(hdr, &[payload]) {
                Ok(()) => return Ok(()),
                Err(via_shm::ShmError::Full) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                Err(e) => return Err(format!("push: {e}")),
            }
        }
    };
    let write = |addr: u64, handle: u32, len: u32, byte: u8| -> Outcome {
        let mut target = [0u8; RDMA_TARGET_BYTES];
        target[..8].copy_from_slice(&addr.to_le_bytes());
        target[8..].copy_from_slice(&handle.to_le_bytes());
        push(&SlotHeader { kind: SLOT_RDMA_WRITE, length: len, ..Default::default() }, &target)?;
        let data = vec![byte; 1024];
        let mut at = 0u32;
        while at < len {
            let n = (len - at).min(1024);
            let piece = SlotHeader { kind: SLOT_RDMA_PIECE, length: len, aux: at as u64, ..Default::default() };
            push(&piece, &data[..n as usize])?;
            at += n;
        }
        Ok(())
    };
    write(open, open_mh, 100, 0x33)?;
    write(closed, closed_mh, 100, 0x44)?;
    write(open + 4000, open_mh, 200, 0x44)?;
    write(closed, open_mh, 100, 0x44)?;
    write(open, 0xFFFF_FFF0, 100, 0x44)?;
    write(u64::MAX - 50, open_mh, 100, 0x44)?;
    // A header whose payload is not an address and a handle.
    push(&SlotHeader { kind: SLOT_RDMA_WRITE, length: 4, ..Default::default() }, &open.to_le_bytes()[..4])?;
    // Keep the connection until the victim has seen it all.
    std::thread::sleep(Duration::from_secs(2));
    Ok(())
}

/// Attacks the victim's CQ through the lane the victim gave this peer:
/// entries naming the victim's VI of another peer (which the victim must
/// not take from this lane), entries naming its own VI with nothing behind
/// them, send-queue entries, garbage; rings the victim's bell over and
/// over; claims a cell and never fills it (this lane stalls); then fills
/// the lane until it overflows.  The victim takes every message of its
/// honest peer through the same CQ meanwhile, and must break this peer's
/// connection (and only it) over the overflow.
fn cq_lanes(disc: &str, dir: &Path) -> Outcome {
    use via_provider::cq::CqEntry;
    let attacker = Attacker::new()?;
    let conn = attacker.handshake(disc, |_| Ok(()))?;
    let text = await_file(&dir.join("cq.vis"))?;
    let v: Vec<u64> = text.split_whitespace().map(parse).collect();
    let [honest, mine] = v[..] else {
        return Err(format!("bad cq.vis: {text:?}"));
    };
    let index = conn.victim.recv_cq as usize;
    let dup = |fd: &OwnedFd| fd.try_clone().map_err(|e| e.to_string());
    let lane = Inbox::map(dup(&conn.victim_lane)?).map_err(|e| format!("the victim's lane: {e}"))?;
    let bell = Bell::map(dup(&conn.victim_bell)?).map_err(|e| format!("the victim's bell: {e}"))?;
    let entry = |vi: u64, recv: bool| CqEntry { vi, recv }.encode();
    for _ in 0..100 {
        lane.push_and_ring(&bell, index, entry(honest, true));
        lane.push_and_ring(&bell, index, entry(honest, false));
        lane.push_and_ring(&bell, index, entry(mine, true));
        lane.push_and_ring(&bell, index, u64::MAX);
    }
    for _ in 0..10_000 {
        bell.ring(index);
    }
    // A cell claimed and never filled: the victim's queue of this lane stalls there.
    let raw =
        SharedRegion::map_exact(dup(&conn.victim_lane)?, via_shm::INBOX_SEGMENT_BYTES).map_err(|e| e.to_string())?;
    // SAFETY: the queue's first word (its enqueue position) lies inside the mapping.
    let enqueue = unsafe { &*raw.as_ptr().add(index * via_shm::inbox::QUEUE_BYTES).cast::<AtomicU64>() };
    enqueue.fetch_add(1, Ordering::SeqCst);
    let mut pushed = 0;
    while lane.push_and_ring(&bell, index, entry(honest, true)) {
        pushed += 1;
        if pushed > 2 * via_shm::INBOX_ENTRIES {
            return Err("the lane never filled".into());
        }
    }
    std::fs::write(dir.join("cq.attacked"), b"").map_err(|e| e.to_string())?;
    // The victim breaks this connection once it sees the overflow.
    let got = peer_channel::recv(conn.socket.as_fd(), None, &Deadline::after_ms(20_000))
        .map_err(|e| format!("waiting for the victim to break the connection: {e}"))?;
    match got.map(|g| g.msg) {
        Some(PeerMessage::Break(_)) | Some(PeerMessage::Disconnect) => Ok(()),
        other => Err(format!("the victim did not break the connection of a peer that overflowed its lane: {other:?}")),
    }
}

/// Waits up to 20 s for `file` and returns what it holds.
fn await_file(file: &Path) -> Result<String, String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(t) = std::fs::read_to_string(file) {
            return Ok(t);
        }
        if Instant::now() > deadline {
            return Err(format!("no {}", file.display()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits up to 20 s for `DIR/NAME`, written by the victim: the addresses
/// and handles of its regions.
fn read_targets(dir: &Path, name: &str) -> Result<Vec<u64>, String> {
    Ok(await_file(&dir.join(name))?.split_whitespace().map(parse).collect())
}

/// RDMA read requests through the ring, as a peer that may not attach to
/// the victim sends them, none of which the peer checks: one the victim
/// allows (the first 100 bytes of its region with RDMA read enabled, all
/// 0x22), then reads of its region without RDMA read enable (0x11), past
/// the end of the enabled region, of the other region's address under the
/// enabled one's handle, of the enabled region's address under the other's
/// handle, under a handle that names nothing, and of a range that wraps
/// the address space.  The victim (reliable, RDMA read enabled) must
/// answer the first with its 100 bytes and each of the others with one
/// refusal and no byte; then an answer to a read nobody asked for must
/// break the connection.  No byte of any other memory may ever come.
fn rdma_read(disc: &str, dir: &Path) -> Outcome {
    use via_shm::{SlotHeader, RDMA_TARGET_BYTES, SLOT_RDMA_READ, SLOT_RDMA_READ_PIECE};
    let v = read_targets(dir, "rdma-read.targets")?;
    let [open, open_mh, closed, closed_mh] = v[..] else {
        return Err(format!("bad rdma-read.targets: {v:?}"));
    };
    let (open_mh, closed_mh) = (open_mh as u32, closed_mh as u32);
    let attacker = Attacker::new()?;
    let ep = Endpoint { reliability: SERVICE_RELIABLE_DELIVERY, rdma_read: true, ..endpoint() };
    let conn = attacker.handshake_as(disc, ep, |_| Ok(()))?;
    let (tx, rx) = (conn._seg.tx(), conn._seg.rx());
    let requests: [(u64, u32, u32, &str); 7] = [
        (open, open_mh, 100, "allowed"),
        (closed, closed_mh, 100, "a region without RDMA read enable"),
        (open + 4000, open_mh, 200, "past the end of the region"),
        (closed, open_mh, 100, "another region's address under the enabled handle"),
        (open, closed_mh, 100, "the enabled region's address under another region's handle"),
        (open, 0xFFFF_FFF0, 100, "a handle that names nothing"),
        (u64::MAX - 50, open_mh, 100, "a range that wraps the address space"),
    ];
    for (id, &(addr, handle, len, _)) in requests.iter().enumerate() {
        let mut target = [0u8; RDMA_TARGET_BYTES];
        target[..8].copy_from_slice(&addr.to_le_bytes());
        target[8..].copy_from_slice(&handle.to_le_bytes());
        let hdr = SlotHeader { kind: SLOT_RDMA_READ, length: len, recv_seq: id as u64, ..Default::default() };
        tx.push(&hdr, &[&target]).map_err(|e| format!("push: {e}"))?;
    }
    // The answers, in order: every slot the victim sends is looked at.
    let mut got: Vec<u8> = Vec::new();
    let mut answered = 0usize;
    let deadline = Instant::now() + Duration::from_secs(20);
    while answered < requests.len() {
        let hdr = match rx.peek().map_err(|e| format!("the victim's ring: {e}"))? {
            Some(h) => h,
            None if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            None => return Err(format!("the victim answered {answered} of {} reads within 20 s", requests.len())),
        };
        let mut payload = vec![0u8; hdr.inline_len as usize];
        rx.read_payload(&mut [&mut payload[..]]);
        rx.pop();
        let (_, _, len, what) = requests[answered];
        if hdr.kind != SLOT_RDMA_READ_PIECE || hdr.recv_seq != answered as u64 || hdr.length != len {
            return Err(format!("the victim sent {hdr:?} while answering the read of {what}"));
        }
        if answered == 0 {
            if hdr.status != 0 || hdr.aux != got.len() as u64 {
                return Err(format!("the allowed read was answered by {hdr:?}"));
            }
            got.extend_from_slice(&payload);
            if got.iter().any(|&b| b != 0x22) {
                return Err(format!("the allowed read brought bytes other than the region's: {got:02x?}"));
            }
            if got.len() == len as usize {
                answered += 1;
            }
        } else if hdr.status != STATUS_RDMA_PROT_ERROR || hdr.aux != 0 || !payload.is_empty() {
            return Err(format!("the read of {what} was answered by {hdr:?} with {} bytes", payload.len()));
        } else {
            answered += 1;
        }
    }
    // Nothing more: the refusals were the whole answers.
    std::thread::sleep(Duration::from_millis(200));
    if let Some(hdr) = rx.peek().map_err(|e| e.to_string())? {
        return Err(format!("the victim sent more after its answers: {hdr:?}"));
    }
    // An answer to a read this side never asked the victim for.
    let forged = SlotHeader { kind: SLOT_RDMA_READ_PIECE, length: 10, recv_seq: 99, ..Default::default() };
    tx.push(&forged, &[&[0x55u8; 10]]).map_err(|e| format!("push: {e}"))?;
    match peer_channel::recv(conn.socket.as_fd(), None, &Deadline::after_ms(20_000)) {
        Ok(Some(m)) if matches!(m.msg, PeerMessage::Break(_)) => {}
        Ok(Some(m)) => return Err(format!("after the unsolicited answer the victim said {:?}", m.msg)),
        Ok(None) | Err(_) => return Err("the victim did not break the connection over an unsolicited answer".into()),
    }
    // Keep the connection until the victim has seen it all.
    std::thread::sleep(Duration::from_secs(1));
    Ok(())
}

/// Connects, maps nothing and never says Ready, holding the connection for
/// `secs`: the listener must go on to the next request meanwhile.
fn silent(disc: &str, secs: u64) -> Outcome {
    let attacker = Attacker::new()?;
    let fds = attacker.connect(disc, CONN_SEGMENT_BYTES as u64).map_err(|e| format!("connect: {e}"))?;
    std::thread::sleep(Duration::from_secs(secs));
    drop(fds);
    Ok(())
}

/// Asks for a connection segment of 256 MiB: refused by the agent, or by
/// the listener before it maps anything.
fn big_segment(disc: &str) -> Outcome {
    let attacker = Attacker::new()?;
    match attacker.connect(disc, 256 << 20) {
        // The agent's refusal names the size; any other failure tests nothing.
        Err(client::AgentError::Protocol(why)) if why.contains("segment size") => Ok(()),
        Err(e) => Err(format!("the request failed, but not over its segment size: {e}")),
        Ok(fds) => {
            // The agent made it: the victim must refuse to map it, which
            // closes its end of the socket pair at once.
            let got = peer_channel::recv(fds.socket.as_fd(), None, &Deadline::after_ms(10_000));
            match got {
                Err(_) => Ok(()),
                Ok(m) => Err(format!("a 256 MiB segment was accepted by the agent and the listener answered {m:?}")),
            }
        }
    }
}

/// Poses as the host agent on the abstract socket `@name` for `secs`:
/// accepts every connection and reads whatever comes.  A VIA process must
/// refuse an agent of another user before it sends anything, so the
/// impostor must get no byte and no descriptor.  Writes DIR/impostor.ready
/// once bound, and the count of bytes and fds received to
/// DIR/impostor.got at the end.
fn impostor(name: &str, dir: &Path, secs: u64) -> Outcome {
    let listener = viad::sock::listen(name).map_err(|e| format!("bind @{name}: {e}"))?;
    std::fs::write(dir.join("impostor.ready"), "").map_err(|e| e.to_string())?;
    let until = Instant::now() + Duration::from_secs(secs);
    let mut clients = Vec::new();
    let (mut bytes, mut fds, mut connections) = (0usize, 0usize, 0usize);
    while Instant::now() < until {
        while let Ok(c) = viad::sock::accept(listener.as_fd()) {
            connections += 1;
            clients.push(c);
        }
        for c in &clients {
            while let Ok(Some(m)) = viad::sock::recv(c.as_fd()) {
                bytes += m.data.len();
                fds += m.fds.len();
                if m.data.is_empty() {
                    break;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let got = format!("{connections} connections, {bytes} bytes, {fds} descriptors");
    std::fs::write(dir.join("impostor.got"), &got).map_err(|e| e.to_string())?;
    match bytes + fds {
        0 => Ok(()),
        _ => Err(format!("a VIA process talked to the impostor: {got}")),
    }
}

/// A local user squatting the CM port: binds it before the agent does, on
/// both address families.  The port is privileged: the kernel must refuse
/// with `EACCES` (an IPv6 socket may be unavailable: skipped).
fn cm_bind(port: u16) -> Outcome {
    let addrs = [SocketAddr::from((Ipv6Addr::UNSPECIFIED, port)), SocketAddr::from((Ipv4Addr::UNSPECIFIED, port))];
    for addr in addrs {
        match UdpSocket::bind(addr) {
            Ok(_) => return Err(format!("bound UDP {addr}: another user holds the CM port")),
            Err(e) if e.raw_os_error() == Some(libc::EACCES) => println!("hostile: bind UDP {addr}: {e}"),
            Err(e) if addr.is_ipv6() && e.raw_os_error() == Some(libc::EAFNOSUPPORT) => {}
            Err(e) => return Err(format!("bind UDP {addr}: {e}, not EACCES")),
        }
    }
    Ok(())
}

/// A local user answers for the agent: for `secs` seconds it sends the
/// agent at `addr:port` forged CM answers to request `id` (which it saw on
/// the wire, say) and to ids it guesses, from an unprivileged port: an
/// Accept naming its own socket as the listener's endpoint, Ack, NoMatch,
/// Reject, and a Request of its own.  The agent must read none of them:
/// nothing may come back to that socket (no answer from the agent, no
/// datagram from a client that took the forged Accept).  Writes the count
/// sent to DIR/forged.count.
fn cm_forge(addr: IpAddr, port: u16, id: u64, dir: &Path, secs: u64) -> Outcome {
    let agent = SocketAddr::new(addr, port);
    let unspecified: IpAddr = match addr {
        IpAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        IpAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    let sock = UdpSocket::bind((unspecified, 0)).map_err(|e| format!("bind: {e}"))?;
    sock.set_nonblocking(true).map_err(|e| e.to_string())?;
    // This host's address towards the agent: the forged endpoint's.
    let probe = UdpSocket::bind((unspecified, 0)).map_err(|e| format!("bind: {e}"))?;
    probe.connect(agent).map_err(|e| format!("no route to {agent}: {e}"))?;
    let me = SocketAddr::new(probe.local_addr().map_err(|e| e.to_string())?.ip(), sock.local_addr().unwrap().port());
    let endpoint = CmEndpoint {
        addr: me,
        vi: 1,
        key: 0x5eed_5eed_5eed_5eed,
        reliability: via_core::consts::SERVICE_RELIABLE_DELIVERY,
        max_transfer: MAX_TRANSFER as u32,
        rdma_write: true,
        rdma_read: false,
        segment: 1400,
        payload_crc: true,
        ether: None,
        large_packets: false,
        placed_acks: false,
    };
    let own_host = match me.ip() {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    };
    let to_host = match addr {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    };
    let mut guess = id ^ std::process::id() as u64 ^ 0x9e37_79b9_7f4a_7c15;
    let (mut sent, mut got) = (0u64, Vec::new());
    let until = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < until {
        guess = guess.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        for id in [id, guess] {
            let forged = [
                CmMessage::Accept { id, endpoint: endpoint.clone() },
                CmMessage::Ack { id },
                CmMessage::NoMatch { id },
                CmMessage::Reject { id },
                CmMessage::Request {
                    id,
                    from_host: own_host.clone(),
                    from_disc: b"squatter".to_vec(),
                    to_host: to_host.clone(),
                    to_disc: b"squatter".to_vec(),
                    peer: false,
                    endpoint: endpoint.clone(),
                },
            ];
            for msg in &forged {
                sock.send_to(&msg.encode(), agent).map_err(|e| format!("send to {agent}: {e}"))?;
                sent += 1;
            }
        }
        let mut buf = [0u8; 2048];
        while let Ok((n, from)) = sock.recv_from(&mut buf) {
            got.push(format!("{n} bytes from {from}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    std::fs::write(dir.join("forged.count"), sent.to_string()).map_err(|e| e.to_string())?;
    println!("hostile: sent {sent} forged CM datagrams to {agent} from {me} (request {id} and guessed ids)");
    match got.len() {
        0 => Ok(()),
        n => Err(format!("{n} datagrams came to the forger's port (the first: {})", got[..n.min(5)].join(", "))),
    }
}
