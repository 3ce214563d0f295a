//! Tests across real processes.  The test binary re-runs itself as the child
//! (`child_process_entry`) with a role in `VIA_SHM_CHILD` and the shared
//! memfd, if any, at descriptor `CHILD_FD`.

use std::env;
use std::io::{self, BufRead, BufReader, IoSlice, IoSliceMut, Write};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering::*};
use std::thread;
use std::time::{Duration, Instant};

use via_shm::*;

const ROLE_ENV: &str = "VIA_SHM_CHILD";
const CHILD_FD: i32 = 100;
const MESSAGES: u64 = 200_000;
const RECEIVES: u64 = 5_000;
const INBOX_PUSHES: u64 = 100_000;
const INBOX_INDEX: usize = 5;
const CMA_BYTES: usize = 8 << 20;
const PAUSE: Duration = Duration::from_millis(200);

fn spawn(role: &str, fd: Option<BorrowedFd<'_>>) -> Child {
    let mut cmd = Command::new(env::current_exe().unwrap());
    cmd.args(["--exact", "child_process_entry", "--nocapture", "--test-threads=1"])
        .env(ROLE_ENV, role)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    if let Some(fd) = fd {
        let raw = fd.as_raw_fd();
        // SAFETY: dup2 is async-signal-safe; the new descriptor is not close-on-exec.
        unsafe {
            cmd.pre_exec(move || if libc::dup2(raw, CHILD_FD) < 0 { Err(io::Error::last_os_error()) } else { Ok(()) });
        }
    }
    cmd.spawn().unwrap()
}

fn finish(mut child: Child) {
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success(), "child failed");
}

fn child_fd() -> OwnedFd {
    // SAFETY: the parent placed the memfd at CHILD_FD and nothing else owns it.
    unsafe { OwnedFd::from_raw_fd(CHILD_FD) }
}

/// Entry point of the child processes; does nothing in a normal test run.
#[test]
fn child_process_entry() {
    let Ok(role) = env::var(ROLE_ENV) else { return };
    match role.as_str() {
        "ring_producer" => ring_producer(),
        "recv_taker" => recv_taker(),
        "inbox_producer" => inbox_producer(),
        "cma_target" => cma_target(),
        "futex_waker" => futex_waker(),
        other => panic!("unknown role {other}"),
    }
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len as u64).map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed * 97) >> 7) as u8).collect()
}

fn checksum(data: &[u8]) -> u32 {
    data.iter().fold(0x811c9dc5u32, |h, &b| (h ^ u32::from(b)).wrapping_mul(0x01000193))
}

fn message(i: u64) -> (SlotHeader, Vec<u8>) {
    let payload = pattern(i, (i as usize * 37) % (INLINE_MAX + 1));
    let hdr = SlotHeader {
        kind: SLOT_SEND,
        length: payload.len() as u32,
        imm: checksum(&payload),
        recv_seq: i,
        ..Default::default()
    };
    (hdr, payload)
}

fn ring_producer() {
    let seg = ConnSegment::new(SharedRegion::map(child_fd()).unwrap(), Side::B).unwrap();
    let push = |hdr: &SlotHeader, p: &[u8]| loop {
        let (x, y) = p.split_at(p.len() / 3);
        match seg.tx().push(hdr, &[x, y]) {
            Ok(()) => return,
            Err(ShmError::Full) => thread::sleep(Duration::from_micros(50)),
            Err(e) => panic!("{e}"),
        }
    };
    for i in 0..MESSAGES {
        let (hdr, payload) = message(i);
        push(&hdr, &payload);
    }
    thread::sleep(PAUSE);
    push(&SlotHeader { kind: SLOT_ERROR, aux: u64::MAX, ..Default::default() }, &[]);
}

fn thread_cpu_time() -> Duration {
    // SAFETY: getrusage fills the local struct.
    let ru = unsafe {
        let mut ru = std::mem::zeroed::<libc::rusage>();
        assert_eq!(libc::getrusage(libc::RUSAGE_THREAD, &mut ru), 0);
        ru
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

#[test]
fn ring_carries_messages_between_processes_and_sleeps_when_idle() {
    let region = SharedRegion::create("mp-ring", CONN_SEGMENT_BYTES).unwrap();
    let child = spawn("ring_producer", Some(region.fd()));
    let seg = ConnSegment::new(region, Side::A).unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut buf = vec![0u8; INLINE_MAX];
    let mut next = 0;
    while next < MESSAGES {
        assert!(Instant::now() < deadline, "stalled at message {next}");
        let Some(hdr) = seg.rx().peek().unwrap() else {
            seg.rx().wait(Some(Duration::from_millis(100)));
            continue;
        };
        let (half, rest) = buf.split_at_mut(500);
        let n = seg.rx().read_payload(&mut [half, rest]);
        let (want, payload) = message(next);
        assert_eq!((hdr, &buf[..n]), (SlotHeader { inline_len: n as u32, ..want }, &payload[..]));
        assert_eq!(checksum(&buf[..n]), hdr.imm);
        seg.rx().pop();
        next += 1;
    }
    // The producer now pauses: a sleeping consumer uses almost no CPU.
    let (cpu, start) = (thread_cpu_time(), Instant::now());
    let last = loop {
        match seg.rx().peek().unwrap() {
            Some(hdr) => break hdr,
            None => seg.rx().wait(Some(Duration::from_secs(10))),
        }
    };
    let (cpu, wall) = (thread_cpu_time() - cpu, start.elapsed());
    assert_eq!((last.kind, last.aux), (SLOT_ERROR, u64::MAX));
    assert!(wall >= PAUSE / 4, "no pause observed: {wall:?}");
    assert!(cpu < PAUSE / 2, "consumer burnt {cpu:?} of CPU in a {wall:?} pause");
    finish(child);
}

fn recv_segs(i: u64) -> Vec<RecvSeg> {
    (0..i % (MAX_SEGS as u64 + 1)).map(|j| RecvSeg { addr: i << 20 | j, len: (i + j) as u32, handle: 0 }).collect()
}

fn recv_taker() {
    let seg = ConnSegment::new(SharedRegion::map(child_fd()).unwrap(), Side::B).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut next = 0;
    while next < RECEIVES {
        assert!(Instant::now() < deadline);
        match seg.peer_recvs().take().unwrap() {
            Some(e) => {
                let want = recv_segs(next);
                assert_eq!((e.seq, e.segs()), (next, &want[..]));
                assert_eq!(e.total, want.iter().map(|s| u64::from(s.len)).sum::<u64>());
                next += 1;
            }
            None => thread::sleep(Duration::from_micros(100)),
        }
    }
}

#[test]
fn recv_cache_between_processes() {
    let region = SharedRegion::create("mp-recv", CONN_SEGMENT_BYTES).unwrap();
    let child = spawn("recv_taker", Some(region.fd()));
    let seg = ConnSegment::new(region, Side::A).unwrap();
    let mut i = 0;
    while i < RECEIVES {
        match seg.my_recvs().publish(recv_segs(i)) {
            Ok(seq) => {
                assert_eq!(seq, i);
                i += 1;
            }
            Err(ShmError::Full) => thread::sleep(Duration::from_millis(1)),
            Err(e) => panic!("{e}"),
        }
    }
    finish(child);
    assert_eq!((seg.my_recvs().taken(), seg.my_recvs().available()), (RECEIVES, 0));
}

/// Pushes `INBOX_PUSHES` entries tagged with producer `id`, retrying when full.
fn inbox_push_all(inbox: &Inbox, id: u64) {
    for i in 0..INBOX_PUSHES {
        while !inbox.push(INBOX_INDEX, id << 32 | i) {
            thread::yield_now();
        }
    }
}

fn inbox_producer() {
    let inbox = Inbox::map(child_fd()).unwrap();
    thread::scope(|s| {
        for id in [2, 3] {
            let inbox = &inbox;
            s.spawn(move || inbox_push_all(inbox, id));
        }
    });
}

#[test]
fn inbox_takes_entries_from_threads_and_processes_exactly_once() {
    let owner = Inbox::create_lane().unwrap();
    let child = spawn("inbox_producer", Some(owner.fd()));
    let local = Inbox::map(owner.fd().try_clone_to_owned().unwrap()).unwrap();
    let mut next = [0u64; 4];
    thread::scope(|s| {
        for id in [0, 1] {
            let local = &local;
            s.spawn(move || inbox_push_all(local, id));
        }
        let deadline = Instant::now() + Duration::from_secs(120);
        while next.iter().sum::<u64>() < 4 * INBOX_PUSHES {
            assert!(Instant::now() < deadline, "stalled at {next:?}");
            match owner.pop(INBOX_INDEX) {
                Some(v) => {
                    let (id, i) = ((v >> 32) as usize, v & 0xffff_ffff);
                    // Each producer's entries arrive once, in its order.
                    assert_eq!(i, next[id], "producer {id}");
                    next[id] += 1;
                }
                None => thread::sleep(Duration::from_micros(200)),
            }
        }
    });
    finish(child);
    assert_eq!(owner.pop(INBOX_INDEX), None);
    assert_eq!(next, [INBOX_PUSHES; 4]);
}

fn cma_target() {
    let buf = pattern(1, CMA_BYTES);
    // SAFETY: getppid has no preconditions.
    cma::allow_peer(unsafe { libc::getppid() });
    println!("ADDR {} {}", buf.as_ptr() as u64, buf.len());
    io::stdout().flush().unwrap();
    for line in io::stdin().lock().lines() {
        let seed: u64 = line.unwrap().trim().parse().unwrap();
        // The parent wrote into `buf` behind the compiler's back.
        let now = unsafe { std::slice::from_raw_parts(std::ptr::read_volatile(&buf.as_ptr()), buf.len()) };
        println!("{}", if now == &pattern(seed, CMA_BYTES)[..] { "SAME" } else { "DIFFERENT" });
        io::stdout().flush().unwrap();
    }
}

/// Splits `len` bytes into pieces of varying small sizes, then the remainder.
fn ranges(start: u64, len: usize, pieces: usize) -> Vec<(u64, usize)> {
    let mut out = Vec::new();
    let mut at = 0usize;
    for k in 0..pieces {
        let n = (k * 131) % 4000;
        out.push((start + at as u64, n));
        at += n;
    }
    out.push((start + at as u64, len - at));
    out
}

#[test]
fn cma_reads_and_writes_another_process() {
    let mut child = spawn("cma_target", None);
    let pid = child.id() as i32;
    let mut stdin = child.stdin.take().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    // The harness prints "test child_process_entry ... " before our line.
    let mut line = String::new();
    let at = loop {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "child ended early");
        if let Some(at) = line.find("ADDR ") {
            break at;
        }
    };
    let mut words = line[at..].split_whitespace().skip(1).map(|w| w.parse::<u64>().unwrap());
    let (addr, len) = (words.next().unwrap(), words.next().unwrap() as usize);
    assert_eq!(len, CMA_BYTES);
    let mut check = |seed: u64| {
        writeln!(stdin, "{seed}").unwrap();
        let mut l = String::new();
        out.read_line(&mut l).unwrap();
        l.trim() == "SAME"
    };
    assert!(cma::probe(pid, addr));
    assert!(!cma::probe(pid, 0));

    // Read 8 MiB from 3001 remote ranges (more than IOV_MAX) into 3 local buffers.
    let mut got = vec![0u8; CMA_BYTES];
    let (a, rest) = got.split_at_mut(1000);
    let (b, c) = rest.split_at_mut(5 << 20);
    let n = cma::read_remote(
        pid,
        &mut [IoSliceMut::new(a), IoSliceMut::new(b), IoSliceMut::new(c)],
        &ranges(addr, len, 3000),
    )
    .unwrap();
    assert_eq!(n, CMA_BYTES);
    assert!(got == pattern(1, CMA_BYTES));

    // Write 8 MiB gathered from 2501 local slices into 2 remote ranges.
    let data = pattern(2, CMA_BYTES);
    let local: Vec<IoSlice<'_>> = ranges(data.as_ptr() as u64, len, 2500)
        .iter()
        .map(|&(p, l)| IoSlice::new(&data[p as usize - data.as_ptr() as usize..][..l]))
        .collect();
    let remote = [(addr, 12345), (addr + 12345, len - 12345)];
    assert_eq!(cma::write_remote(pid, &local, &remote).unwrap(), CMA_BYTES);
    assert!(check(2));

    // Sizes from one byte to the whole buffer, one segment each.
    for size in [1usize, 4095, 4097, 1 << 20, CMA_BYTES] {
        let data = pattern(3, size);
        assert_eq!(cma::write_remote(pid, &[IoSlice::new(&data)], &[(addr, size)]).unwrap(), size);
        let mut back = vec![0u8; size];
        assert_eq!(cma::read_remote(pid, &mut [IoSliceMut::new(&mut back)], &[(addr, size)]).unwrap(), size);
        assert!(back == data, "size {size}");
    }
    assert!(check(3));

    // A bad remote range after a good one gives a short count; alone, an error.
    let small = [7u8; 8192];
    assert_eq!(cma::write_remote(pid, &[IoSlice::new(&small)], &[(addr, 4096), (0, 4096)]).unwrap(), 4096);
    assert!(cma::write_remote(pid, &[IoSlice::new(&small)], &[(0, 4096)]).is_err());
    drop(stdin);
    assert!(child.wait().unwrap().success());
}

fn futex_waker() {
    let region = SharedRegion::map(child_fd()).unwrap();
    // SAFETY: the word is at the start of the mapping.
    let word = unsafe { &*(region.as_ptr() as *const AtomicU32) };
    thread::sleep(PAUSE);
    word.store(1, SeqCst);
    futex_wake(word, 1);
}

#[test]
fn futex_wakes_across_processes() {
    let region = SharedRegion::create("mp-futex", 4096).unwrap();
    let child = spawn("futex_waker", Some(region.fd()));
    // SAFETY: the word is at the start of the mapping.
    let word = unsafe { &*(region.as_ptr() as *const AtomicU32) };
    let start = Instant::now();
    while word.load(SeqCst) == 0 {
        // A lost wake-up would sleep the full 10 s.
        assert!(futex_wait(word, 0, Some(Duration::from_secs(10))), "timed out");
    }
    assert!(start.elapsed() < Duration::from_secs(5));
    finish(child);
}
