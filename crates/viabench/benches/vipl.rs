//! Micro-benchmarks of single VIPL calls on the data path, through the C
//! ABI: posting and completing a send and an RDMA write on a connected
//! loopback pair, polling an empty receive queue, polling an empty CQ with
//! 1 to 128 VIs attached, and registering memory; the cross-memory copy
//! under a shared-memory RDMA write, bare and through via-shm's wrapper;
//! and the CRC-32C that every UDP packet carries.
//!
//! `cargo bench -p viabench --bench vipl`.  The host agent is started on
//! demand (`target/release/viad`, or `$VIA_VIAD`) under a socket name of
//! this run's own.

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;
use std::time::{Duration, Instant};
use viabench::link::Mapping;
use viabench::vipl_api::*;

/// Handles as integers, to cross into the accepting thread.
#[derive(Clone, Copy)]
struct H(usize);

impl H {
    fn p(self) -> VIP_PVOID {
        self.0 as VIP_PVOID
    }
}

fn ok(call: &'static str, rc: VIP_RETURN) {
    check(call, rc).unwrap_or_else(|e| panic!("{e}"));
}

/// One side: a NIC, a tag, registered memory for descriptors and buffers.
struct Side {
    nic: VIP_PVOID,
    ptag: VIP_PVOID,
    mem: Mapping,
    mh: VIP_MEM_HANDLE,
    addr: Vec<u8>,
}

impl Side {
    fn open(bytes: usize) -> Side {
        let mut nic = std::ptr::null_mut();
        let mut ptag = std::ptr::null_mut();
        // SAFETY: valid name and out-pointers.
        unsafe {
            ok("VipOpenNic", VipOpenNic(c"/dev/via_lo".as_ptr(), &mut nic));
            ok("VipCreatePtag", VipCreatePtag(nic, &mut ptag));
        }
        let mem = Mapping::new(bytes).unwrap();
        let mut mh = 0;
        // RDMA writes allowed, for `rdma_path`; the other benchmarks do not use them.
        let attrs = VIP_MEM_ATTRIBUTES { Ptag: ptag, EnableRdmaWrite: 1, EnableRdmaRead: 0 };
        // SAFETY: our mapping, valid out-pointer.
        unsafe { ok("VipRegisterMem", VipRegisterMem(nic, mem.ptr() as VIP_PVOID, mem.len() as _, &attrs, &mut mh)) };
        let addr = nic_address(nic).unwrap();
        Side { nic, ptag, mem, mh, addr }
    }

    fn vi(&self, cq: VIP_PVOID) -> VIP_PVOID {
        let attrs = VIP_VI_ATTRIBUTES {
            ReliabilityLevel: VIP_SERVICE_RELIABLE_DELIVERY,
            MaxTransferSize: 4096,
            QoS: std::ptr::null_mut(),
            Ptag: self.ptag,
            EnableRdmaWrite: 1,
            EnableRdmaRead: 0,
        };
        let mut vi = std::ptr::null_mut();
        // SAFETY: valid attributes and out-pointer.
        unsafe { ok("VipCreateVi", VipCreateVi(self.nic, &attrs, std::ptr::null_mut(), cq, &mut vi)) };
        vi
    }

    /// Descriptor `i` of the region (64 bytes each from the start).
    fn desc(&self, i: usize) -> *mut Descriptor {
        assert!((i + 1) * 64 <= self.mem.len() / 2);
        // SAFETY: inside the mapping.
        unsafe { (self.mem.ptr() as *mut Descriptor).add(i) }
    }

    /// A buffer in the second half of the region.
    fn buf(&self) -> u64 {
        self.mem.ptr() as u64 + (self.mem.len() / 2) as u64
    }

    fn post_recv(&self, vi: VIP_PVOID, i: usize) {
        let d = self.desc(i);
        let mut desc = Descriptor::default();
        desc.cs.seg_count = 1;
        desc.ds[0] = DataSegment { data: self.buf(), handle: self.mh, length: 4096 };
        // SAFETY: a descriptor of our registered region, not posted.
        unsafe {
            std::ptr::write(d, desc);
            ok("VipPostRecv", VipPostRecv(vi, d, self.mh));
        }
    }
}

/// Connects `server[i]` with `client[i]` for every i: the server side waits
/// in a thread of its own.
fn connect(server: &Side, server_vis: &[VIP_PVOID], client: &Side, client_vis: &[VIP_PVOID], tag: &str) {
    let nic = H(server.nic as usize);
    let vis: Vec<H> = server_vis.iter().map(|v| H(*v as usize)).collect();
    let addr = server.addr.clone();
    let tag2 = tag.to_string();
    let waiter = std::thread::spawn(move || {
        for (i, vi) in vis.iter().enumerate() {
            let local = NetAddress::new(&addr, format!("{tag2}-{i}").as_bytes());
            let mut remote = NetAddress::empty();
            // SAFETY: plain data the provider fills.
            let mut attrs: VIP_VI_ATTRIBUTES = unsafe { std::mem::zeroed() };
            let mut conn = std::ptr::null_mut();
            // SAFETY: valid addresses and out-pointers.
            unsafe {
                ok(
                    "VipConnectWait",
                    VipConnectWait(nic.p(), local.as_ptr(), 30_000, remote.as_mut_ptr(), &mut attrs, &mut conn),
                );
                ok("VipConnectAccept", VipConnectAccept(conn, vi.p()));
            }
        }
    });
    for (i, vi) in client_vis.iter().enumerate() {
        let disc = format!("{tag}-{i}");
        let local = NetAddress::new(&client.addr, disc.as_bytes());
        let remote = NetAddress::new(&server.addr, disc.as_bytes());
        // SAFETY: plain data the provider fills.
        let mut attrs: VIP_VI_ATTRIBUTES = unsafe { std::mem::zeroed() };
        // SAFETY: valid addresses and out-pointer.
        unsafe { ok("VipConnectRequest", VipConnectRequest(*vi, local.as_ptr(), remote.as_ptr(), 30_000, &mut attrs)) };
    }
    waiter.join().unwrap();
}

fn environment() {
    let run = format!("viabench-bench-{}", std::process::id());
    std::env::set_var("VIA_AGENT_SOCKET", &run);
    std::env::set_var("VIA_VIAD_IDLE", "2");
    std::env::set_var("VIA_CM_PORT", "0");
}

fn send_path(c: &mut Criterion) {
    let rx = Side::open(1 << 20);
    let tx = Side::open(1 << 20);
    let (rvi, tvi) = (rx.vi(std::ptr::null_mut()), tx.vi(std::ptr::null_mut()));
    const BATCH: usize = 256;
    for i in 0..BATCH {
        rx.post_recv(rvi, i);
    }
    connect(&rx, &[rvi], &tx, &[tvi], "send");
    let d = tx.desc(0);
    let mut desc = Descriptor::default();
    desc.cs.seg_count = 1;
    desc.cs.length = 4;
    desc.ds[0] = DataSegment { data: tx.buf(), handle: tx.mh, length: 4 };
    let recycle = || {
        let mut done: *mut Descriptor = std::ptr::null_mut();
        // SAFETY: valid out-pointer; completed receives are reposted as they were.
        unsafe {
            while VipRecvDone(rvi, &mut done) == VIP_SUCCESS {
                let i = (done as usize - rx.mem.ptr() as usize) / 64;
                rx.post_recv(rvi, i);
            }
        }
    };
    c.bench_function("VipPostSend+VipSendDone 4B shm", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                let n = left.min(BATCH as u64);
                recycle();
                let start = Instant::now();
                for _ in 0..n {
                    let mut done: *mut Descriptor = std::ptr::null_mut();
                    // SAFETY: a descriptor of registered memory, reused once completed.
                    unsafe {
                        std::ptr::write(d, desc);
                        ok("VipPostSend", VipPostSend(tvi, d, tx.mh));
                        ok("VipSendDone", VipSendDone(tvi, &mut done));
                    }
                    black_box(done);
                }
                total += start.elapsed();
                left -= n;
            }
            recycle();
            total
        })
    });
    // Both ends of one message in one thread: the software a 4-byte
    // ping-pong pays per message, without the cache-line transfer.
    c.bench_function("one 4B message shm: VipPostRecv+VipPostSend+VipSendDone+VipRecvDone", |b| {
        recycle();
        b.iter(|| {
            let mut done: *mut Descriptor = std::ptr::null_mut();
            let mut got: *mut Descriptor = std::ptr::null_mut();
            // SAFETY: descriptors of registered memory, each reused once completed.
            unsafe {
                std::ptr::write(d, desc);
                ok("VipPostSend", VipPostSend(tvi, d, tx.mh));
                ok("VipSendDone", VipSendDone(tvi, &mut done));
                ok("VipRecvDone", VipRecvDone(rvi, &mut got));
                let i = (got as usize - rx.mem.ptr() as usize) / 64;
                rx.post_recv(rvi, i);
            }
            black_box((done, got));
        })
    });
    c.bench_function("VipRecvDone empty queue", |b| {
        b.iter(|| {
            let mut done: *mut Descriptor = std::ptr::null_mut();
            // SAFETY: valid out-pointer.
            black_box(unsafe { VipRecvDone(rvi, &mut done) })
        })
    });
    // SAFETY: our VIs, connected above.
    unsafe {
        VipDisconnect(tvi);
        VipDisconnect(rvi);
        VipDestroyVi(tvi);
        VipDestroyVi(rvi);
        VipCloseNic(tx.nic);
        VipCloseNic(rx.nic);
    }
}

/// A 4-byte RDMA write into the peer's registered memory, posted and
/// completed: the check against the target's published registry and one
/// `process_vm_writev` (the pair is in one process, as the C library
/// allows).
fn rdma_path(c: &mut Criterion) {
    let target = Side::open(1 << 20);
    let init = Side::open(1 << 20);
    let (tvi, ivi) = (target.vi(std::ptr::null_mut()), init.vi(std::ptr::null_mut()));
    connect(&target, &[tvi], &init, &[ivi], "rdma");
    let d = init.desc(0);
    let mut desc = Descriptor::default();
    desc.cs.control = VIP_CONTROL_OP_RDMAWRITE;
    desc.cs.seg_count = 2;
    desc.cs.length = 4;
    desc.ds[0] = DataSegment { data: target.buf(), handle: target.mh, length: 0 };
    desc.ds[1] = DataSegment { data: init.buf(), handle: init.mh, length: 4 };
    let bytes = [0xC0u8, 0xFF, 0xEE, 0x42];
    // SAFETY: the initiator's registered buffer, 4 bytes of it.
    unsafe { std::ptr::write(init.buf() as *mut [u8; 4], bytes) };
    // Whether a write was posted: a filter that leaves this benchmark out
    // runs none.
    let mut wrote = false;
    c.bench_function("VipPostSend+VipSendDone RDMA write 4B shm", |b| {
        wrote = true;
        b.iter(|| {
            let mut done: *mut Descriptor = std::ptr::null_mut();
            // SAFETY: a descriptor of registered memory, reused once completed.
            unsafe {
                std::ptr::write(d, desc);
                ok("VipPostSend", VipPostSend(ivi, d, init.mh));
                ok("VipSendDone", VipSendDone(ivi, &mut done));
            }
            black_box(done)
        })
    });
    if wrote {
        // SAFETY: the target's registered buffer: the writes landed there.
        assert_eq!(unsafe { std::ptr::read(target.buf() as *const [u8; 4]) }, bytes);
    }
    // SAFETY: our VIs, connected above.
    unsafe {
        VipDisconnect(ivi);
        VipDisconnect(tvi);
        VipDestroyVi(ivi);
        VipDestroyVi(tvi);
        VipCloseNic(init.nic);
        VipCloseNic(target.nic);
    }
}

/// A 4-byte `process_vm_writev` into this process's own memory, bare (one
/// iovec a side) and through `via_shm::cma::write_remote` (what an RDMA
/// write on one host calls): the floor under the RDMA write above, and
/// what the wrapper adds to it.
fn cma_copy(c: &mut Criterion) {
    let target = Mapping::new(4096).expect("a page");
    let bytes = [0xC0u8, 0xFF, 0xEE, 0x42];
    let pid = std::process::id() as libc::pid_t;
    // Whether a copy ran: a filter that leaves both benchmarks out runs none.
    let mut copied = false;
    c.bench_function("process_vm_writev 4B bare", |b| {
        copied = true;
        let local = libc::iovec { iov_base: bytes.as_ptr() as *mut libc::c_void, iov_len: 4 };
        let remote = libc::iovec { iov_base: target.ptr() as *mut libc::c_void, iov_len: 4 };
        b.iter(|| {
            // SAFETY: a live local buffer and a page of our own.
            let n = unsafe { libc::process_vm_writev(pid, &local, 1, &remote, 1, 0) };
            assert_eq!(n, 4);
        })
    });
    c.bench_function("process_vm_writev 4B via_shm::cma::write_remote", |b| {
        copied = true;
        b.iter(|| {
            let n = via_shm::cma::write_remote(pid, &[std::io::IoSlice::new(&bytes)], &[(target.ptr() as u64, 4)]);
            assert_eq!(n.expect("a copy into ourselves"), 4);
        })
    });
    if copied {
        // SAFETY: the page the copies landed in.
        assert_eq!(unsafe { std::ptr::read(target.ptr() as *const [u8; 4]) }, bytes);
    }
}

/// `VipCQDone` on an empty CQ against the number of receive queues attached:
/// O(1) with completion-queue entries (`VIA_CQ=cq1`), a scan of every queue
/// with `VIA_CQ=cq2` (Banikazemi et al.'s Table 3).
fn cq_poll(c: &mut Criterion) {
    let mut group = c.benchmark_group("VipCQDone empty CQ");
    for n in [1usize, 2, 4, 8, 16, 32, 64, 128] {
        let rx = Side::open(1 << 20);
        let tx = Side::open(1 << 20);
        let mut cq = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        unsafe { ok("VipCreateCQ", VipCreateCQ(rx.nic, 4096, &mut cq)) };
        let rvis: Vec<VIP_PVOID> = (0..n).map(|_| rx.vi(cq)).collect();
        let tvis: Vec<VIP_PVOID> = (0..n).map(|_| tx.vi(std::ptr::null_mut())).collect();
        for (i, vi) in rvis.iter().enumerate() {
            rx.post_recv(*vi, i);
        }
        connect(&rx, &rvis, &tx, &tvis, &format!("cq{n}"));
        group.bench_function(BenchmarkId::new("VIs attached", n), |b| {
            b.iter(|| {
                let mut vi = std::ptr::null_mut();
                let mut recv = 0;
                // SAFETY: valid out-pointers.
                black_box(unsafe { VipCQDone(cq, &mut vi, &mut recv) })
            })
        });
        // SAFETY: our objects.
        unsafe {
            for vi in tvis.iter().chain(rvis.iter()) {
                VipDisconnect(*vi);
                VipDestroyVi(*vi);
            }
            VipDestroyCQ(cq);
            VipCloseNic(tx.nic);
            VipCloseNic(rx.nic);
        }
    }
    group.finish();
}

fn registration(c: &mut Criterion) {
    let side = Side::open(4096);
    for (name, len) in [("4 KiB", 4096usize), ("1 MiB", 1 << 20)] {
        let mem = Mapping::new(len).unwrap();
        let attrs = VIP_MEM_ATTRIBUTES { Ptag: side.ptag, EnableRdmaWrite: 0, EnableRdmaRead: 0 };
        c.bench_function(&format!("VipRegisterMem+VipDeregisterMem {name}"), |b| {
            b.iter_batched(
                || (),
                |_| {
                    let mut mh = 0;
                    // SAFETY: our mapping; registered and deregistered again.
                    unsafe {
                        ok(
                            "VipRegisterMem",
                            VipRegisterMem(side.nic, mem.ptr() as VIP_PVOID, len as _, &attrs, &mut mh),
                        );
                        ok("VipDeregisterMem", VipDeregisterMem(side.nic, mem.ptr() as VIP_PVOID, mh));
                    }
                },
                BatchSize::SmallInput,
            )
        });
    }
    // SAFETY: our NIC.
    unsafe { VipCloseNic(side.nic) };
}

/// `via_wire::crc32c` over a small packet, over full packets at MTU 1500
/// and 9000 (the UDP payload sizes, and 1392, the data payload of a
/// 1472-byte datagram after the 80-byte header) and over a 64 KiB buffer.
fn crc32c(c: &mut Criterion) {
    let mut group = c.benchmark_group("crc32c");
    for len in [64usize, 1392, 1472, 8972, 65536] {
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 3) as u8).collect();
        group.throughput(Throughput::Bytes(len as u64));
        group.bench_function(BenchmarkId::from_parameter(len), |b| {
            b.iter(|| via_wire::crc32c::crc32c(black_box(&data)))
        });
    }
    group.finish();
}

fn config() -> Criterion {
    environment();
    Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
}

criterion_group! {
    name = benches;
    config = config();
    targets = crc32c, send_path, rdma_path, cma_copy, cq_poll, registration
}
criterion_main!(benches);
