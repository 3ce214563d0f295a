//! `via_wire::crc32c` beside the `crc-fast` crate's CRC-32/ISCSI (the same
//! CRC), in one group so that both meet the same machine load: over one
//! buffer (`crc32c`), and shaped as a packet's checksum is computed (the
//! 76 header bytes before the checksum field, 4 zero bytes for the field,
//! then the payload: `crc32c` and two `crc32c_append`), at a header alone
//! (64 bytes, and 80 as a packet) and at the payloads of full datagrams at
//! MTU 1500 and 9000 (1392 and 8972) and 64 KiB.  The packet group also
//! has both with the header copied, its checksum field zeroed, and
//! checksummed in one call, the payload appended only when there is one.
//!
//! `cargo bench -p via-wire --bench crc32c`

use std::hint::black_box;
use std::time::Duration;

use crc_fast::{CrcAlgorithm, Digest};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use via_wire::crc32c::{crc32c, crc32c_append};

/// `crc-fast`'s CRC-32C extended from `crc` (a finished CRC, as ours takes).
fn crc_fast_append(crc: u32, data: &[u8]) -> u32 {
    let mut d = Digest::new_with_init_state(CrcAlgorithm::Crc32Iscsi, u64::from(!crc));
    d.update(data);
    d.finalize() as u32
}

fn whole(c: &mut Criterion) {
    let mut group = c.benchmark_group("crc32c");
    for len in [64usize, 1392, 8972, 65536] {
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 3) as u8).collect();
        group.throughput(Throughput::Bytes(len as u64));
        group.bench_function(BenchmarkId::new("via_wire", len), |b| b.iter(|| crc32c(black_box(&data))));
        group.bench_function(BenchmarkId::new("crc_fast", len), |b| b.iter(|| crc_fast::crc32_iscsi(black_box(&data))));
    }
    group.finish();
}

fn packet(c: &mut Criterion) {
    let mut group = c.benchmark_group("crc32c-packet");
    for payload in [0usize, 1392, 8972] {
        let header: Vec<u8> = (0..80).map(|i| (i * 5) as u8).collect();
        let data: Vec<u8> = (0..payload).map(|i| (i * 7 + i / 3) as u8).collect();
        group.throughput(Throughput::Bytes((80 + payload) as u64));
        group.bench_function(BenchmarkId::new("via_wire", 80 + payload), |b| {
            b.iter(|| {
                let c = crc32c(black_box(&header[..76]));
                let c = crc32c_append(c, &[0; 4]);
                crc32c_append(c, black_box(&data))
            })
        });
        group.bench_function(BenchmarkId::new("crc_fast", 80 + payload), |b| {
            b.iter(|| {
                let c = crc_fast::crc32_iscsi(black_box(&header[..76]));
                let c = crc_fast_append(c, &[0; 4]);
                crc_fast_append(c, black_box(&data))
            })
        });
        // The header copied with its checksum field zeroed, checksummed in
        // one piece, and the payload appended only if there is one.
        group.bench_function(BenchmarkId::new("via_wire_copied_header", 80 + payload), |b| {
            b.iter(|| {
                let mut h = [0u8; 80];
                h[..76].copy_from_slice(&black_box(&header)[..76]);
                let c = crc32c(&h);
                let data = black_box(&data);
                if data.is_empty() {
                    c
                } else {
                    crc32c_append(c, data)
                }
            })
        });
        group.bench_function(BenchmarkId::new("crc_fast_copied_header", 80 + payload), |b| {
            b.iter(|| {
                let mut h = [0u8; 80];
                h[..76].copy_from_slice(&black_box(&header)[..76]);
                let c = crc_fast::crc32_iscsi(&h);
                let data = black_box(&data);
                if data.is_empty() {
                    c
                } else {
                    crc_fast_append(c, data)
                }
            })
        });
    }
    group.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
}

criterion_group! {
    name = benches;
    config = config();
    targets = whole, packet
}
criterion_main!(benches);
