//! CRC-32C (Castagnoli), the checksum of every openvia packet.
//!
//! The `crc-fast` crate's CRC-32/ISCSI, which is CRC-32C (reflected
//! polynomial 0x82F63B78, register and result inverted): it picks the
//! CPU's best path at run time (the SSE 4.2 `crc32` instruction beside
//! carry-less multiplication folding, 512-bit with AVX-512 and VPCLMULQDQ,
//! a table-driven one without them).  This module keeps the two functions
//! the rest of openvia calls; a short CRC or append (a packet's header, a
//! small message's payload) runs the SSE 4.2 instruction itself.

use crc_fast::{CrcAlgorithm, Digest};

/// The CRC-32C of `data`.
#[inline]
pub fn crc32c(data: &[u8]) -> u32 {
    if let Some(c) = small_append(0, data) {
        return c;
    }
    crc_fast::crc32_iscsi(data)
}

/// Extends `crc` (the CRC-32C of some earlier bytes, 0 for none) with `data`,
/// so a packet can be checksummed in pieces.
#[inline]
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    if let Some(c) = small_append(crc, data) {
        return c;
    }
    // crc-fast's state is the register, before the final inversion.
    let mut d = Digest::new_with_init_state(CrcAlgorithm::Crc32Iscsi, u64::from(!crc));
    d.update(data);
    d.finalize() as u32
}

/// [`crc32c_append`] by the `crc32` instruction, where `data` is short
/// and the CPU has it.
#[inline(always)]
fn small_append(crc: u32, data: &[u8]) -> Option<u32> {
    #[cfg(target_arch = "x86_64")]
    if data.len() <= SMALL && std::arch::is_x86_feature_detected!("sse4.2") {
        // SAFETY: the CPU has SSE 4.2.
        return Some(!unsafe { small::update(!crc, data) });
    }
    let _ = (crc, data);
    None
}

/// CRCs and appends of at most this many bytes (a packet's header, a
/// small message's payload after it) run the `crc32` instruction eight
/// bytes at a time: crc-fast's dispatch and `Digest` cost more than such a
/// CRC.
#[cfg(target_arch = "x86_64")]
const SMALL: usize = 128;

#[cfg(target_arch = "x86_64")]
mod small {
    use std::arch::x86_64::{_mm_crc32_u16, _mm_crc32_u32, _mm_crc32_u64, _mm_crc32_u8};

    /// The CRC-32C register `c` (not inverted) extended with `data`: eight
    /// bytes at a time, then four, two and one.
    ///
    /// # Safety
    /// The CPU has SSE 4.2.
    #[target_feature(enable = "sse4.2")]
    pub(super) unsafe fn update(c: u32, data: &[u8]) -> u32 {
        let n = data.len();
        let mut p = data.as_ptr();
        // SAFETY (each read): `p` stays within `data`, whose length the
        // loop and the tail's bits count down exactly.
        let words_end = unsafe { p.add(n & !7) };
        let mut c = u64::from(c);
        while p < words_end {
            c = _mm_crc32_u64(c, unsafe { p.cast::<u64>().read_unaligned() });
            p = unsafe { p.add(8) };
        }
        let mut c = c as u32;
        if n & 4 != 0 {
            c = _mm_crc32_u32(c, unsafe { p.cast::<u32>().read_unaligned() });
            p = unsafe { p.add(4) };
        }
        if n & 2 != 0 {
            c = _mm_crc32_u16(c, unsafe { p.cast::<u16>().read_unaligned() });
            p = unsafe { p.add(2) };
        }
        if n & 1 != 0 {
            c = _mm_crc32_u8(c, unsafe { *p });
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CRC-32C a bit at a time, straight from its definition: the
    /// reference the tests hold the crate's paths to.
    fn bitwise(crc: u32, data: &[u8]) -> u32 {
        let mut c = !crc;
        for &b in data {
            c ^= u32::from(b);
            for _ in 0..8 {
                c = if c & 1 != 0 { (c >> 1) ^ 0x82F6_3B78 } else { c >> 1 };
            }
        }
        !c
    }

    #[test]
    fn known_vectors() {
        // The check value of CRC-32C and the iSCSI test vectors (RFC 3720, B.4).
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
            assert_eq!(crc32c(data), want, "{data:02x?}");
            assert_eq!(crc32c_append(0, data), want, "append, {data:02x?}");
            assert_eq!(bitwise(0, data), want, "bitwise, {data:02x?}");
        }
    }

    #[test]
    fn pieces_agree() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 + i / 3) as u8).collect();
        let whole = crc32c(&data);
        for cut in [0, 1, 7, 8, 9, 500, 999, 1000] {
            let (a, b) = data.split_at(cut);
            assert_eq!(crc32c_append(crc32c(a), b), whole);
            assert_eq!(bitwise(bitwise(0, a), b), whole);
        }
    }

    /// A xorshift generator, so that no block looks like another.
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

    /// `len` pseudo-random bytes.
    fn noise(len: usize) -> Vec<u8> {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        (0..len).map(|_| (rng.next() >> 32) as u8).collect()
    }

    /// `data` from `misalign` bytes past a 64-byte boundary, and at least
    /// `len` bytes long.
    fn at(data: &[u8], misalign: usize, len: usize) -> &[u8] {
        let start = data.as_ptr().align_offset(64) + misalign;
        let d = &data[start..];
        assert!(d.len() >= len && (d.as_ptr() as usize) % 64 == misalign);
        d
    }

    const STARTS: [u32; 4] = [0, 0xFFFF_FFFF, 0x1234_5678, 0x8000_0001];
    const MISALIGNS: [usize; 14] = [0, 1, 2, 3, 4, 7, 8, 13, 15, 16, 31, 32, 48, 63];

    /// Every length up to 4000, from several starting CRCs and several
    /// misalignments, so every block count and tail length of each path
    /// the CPU takes meets the reference.  The reference CRCs of the
    /// prefixes come one byte at a time.
    #[test]
    fn every_length_matches_the_reference() {
        let data = noise(4000 + 128);
        for misalign in MISALIGNS {
            let d = at(&data, misalign, 4000);
            for start in STARTS {
                let mut want = start;
                for n in 0..=4000 {
                    if n > 0 {
                        want = bitwise(want, &d[n - 1..n]);
                    }
                    let got = crc32c_append(start, &d[..n]);
                    assert_eq!(got, want, "length {n}, misalign {misalign}, start {start:#x}");
                    if start == 0 {
                        assert_eq!(crc32c(&d[..n]), want, "crc32c: length {n}, misalign {misalign}");
                    }
                }
            }
        }
    }

    /// A few lengths past the 4000 of the test above.
    #[test]
    fn large_inputs_match_the_reference() {
        let data = noise(65536 + 13 + 128);
        for n in [4095, 4096, 4097, 6144, 8972, 65535, 65536, 65536 + 13] {
            for misalign in MISALIGNS {
                let d = &at(&data, misalign, n)[..n];
                assert_eq!(crc32c(d), bitwise(0, d), "length {n}, misalign {misalign}");
                for start in STARTS {
                    let want = bitwise(start, d);
                    assert_eq!(crc32c_append(start, d), want, "length {n}, misalign {misalign}, start {start:#x}");
                }
            }
        }
    }

    /// Appends split at random points give the CRC of the whole, so a
    /// piece may end anywhere in a block, a lane or a word.
    #[test]
    fn split_appends_match_the_reference() {
        let data = noise(20000 + 64);
        let mut rng = Rng(0x0123_4567_89AB_CDEF);
        for round in 0..1500 {
            let n = match round % 3 {
                0 => rng.below(1024),
                1 => rng.below(4097),
                _ => rng.below(20001),
            };
            let d = &at(&data, rng.below(64), n)[..n];
            let start = rng.next() as u32;
            let whole = bitwise(start, d);
            let mut cuts: Vec<usize> = (0..1 + rng.below(4)).map(|_| rng.below(n + 1)).collect();
            cuts.push(n);
            cuts.sort_unstable();
            let (mut c, mut from) = (start, 0);
            for &cut in &cuts {
                c = crc32c_append(c, &d[from..cut]);
                from = cut;
            }
            assert_eq!(c, whole, "length {n}, start {start:#x}, cuts {cuts:?}");
        }
    }
}
