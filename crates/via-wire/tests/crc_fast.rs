//! `via_wire::crc32c` and the `crc-fast` crate's CRC-32/ISCSI agree: on the
//! check value and the iSCSI vectors, on every length up to 4,200 and some
//! longer ones from every misalignment in a 64-byte line, from several
//! starting CRCs, and over appends cut at random points.

use crc_fast::{CrcAlgorithm, Digest};
use via_wire::crc32c::{crc32c, crc32c_append};

fn fast(data: &[u8]) -> u32 {
    crc_fast::crc32_iscsi(data)
}

fn fast_append(crc: u32, data: &[u8]) -> u32 {
    let mut d = Digest::new_with_init_state(CrcAlgorithm::Crc32Iscsi, u64::from(!crc));
    d.update(data);
    d.finalize() as u32
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn noise(len: usize) -> Vec<u8> {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    (0..len).map(|_| (rng.next() >> 32) as u8).collect()
}

#[test]
fn vectors() {
    let inc: Vec<u8> = (0u8..32).collect();
    let dec: Vec<u8> = (0u8..32).rev().collect();
    let vectors: [(&[u8], u32); 6] = [
        (b"123456789", 0xE306_9283),
        (&[0u8; 32], 0x8A91_36AA),
        (&[0xffu8; 32], 0x62A8_AB43),
        (&inc, 0x46DD_794E),
        (&dec, 0x113F_DB5C),
        (&[], 0),
    ];
    for (data, want) in vectors {
        assert_eq!(crc32c(data), want);
        assert_eq!(fast(data), want);
        assert_eq!(fast_append(0, data), want);
        assert_eq!(checksum_api(data), want);
    }
}

fn checksum_api(data: &[u8]) -> u32 {
    crc_fast::checksum(CrcAlgorithm::Crc32Iscsi, data) as u32
}

#[test]
fn every_length_and_alignment() {
    let data = noise(70_000);
    let base = data.as_ptr().align_offset(64);
    let starts = [0u32, 0xFFFF_FFFF, 0x1234_5678, 0x8000_0001];
    let lens = (0..=4200).chain([4095, 4096, 4097, 6144, 8972, 9000, 16384, 65535, 65536, 65536 + 13]);
    for n in lens {
        for misalign in [0usize, 1, 3, 4, 7, 8, 15, 16, 31, 32, 63] {
            let d = &data[base + misalign..][..n];
            assert_eq!(crc32c(d), fast(d), "length {n}, misalign {misalign}");
            for s in starts {
                assert_eq!(crc32c_append(s, d), fast_append(s, d), "length {n}, misalign {misalign}, start {s:#x}");
            }
        }
    }
}

#[test]
fn split_appends() {
    let data = noise(20_064);
    let mut rng = Rng(0x0123_4567_89AB_CDEF);
    for round in 0..3000 {
        let n = match round % 3 {
            0 => rng.below(1024),
            1 => rng.below(4097),
            _ => rng.below(20_001),
        };
        let off = rng.below(64);
        let d = &data[off..off + n];
        let start = rng.next() as u32;
        let mut cuts: Vec<usize> = (0..1 + rng.below(4)).map(|_| rng.below(n + 1)).collect();
        cuts.push(n);
        cuts.sort_unstable();
        let (mut ours, mut theirs, mut from) = (start, start, 0);
        for &cut in &cuts {
            ours = crc32c_append(ours, &d[from..cut]);
            theirs = fast_append(theirs, &d[from..cut]);
            from = cut;
        }
        assert_eq!(ours, theirs, "length {n}, start {start:#x}, cuts {cuts:?}");
        assert_eq!(ours, crc32c_append(start, d));
    }
}
