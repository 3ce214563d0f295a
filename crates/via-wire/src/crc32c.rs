//! CRC-32C (Castagnoli), the checksum of every openvia packet.
//!
//! A table-driven software implementation (slicing by eight) that uses the
//! SSE 4.2 `crc32` instruction, on three interleaved streams, when the CPU
//! has it.

/// The reflected Castagnoli polynomial.
const POLY: u32 = 0x82F6_3B78;

/// Eight 256-entry tables: table 0 is the classic byte table, table k
/// advances a byte that sits k positions further back.
static TABLES: [[u32; 256]; 8] = make_tables();

const fn make_tables() -> [[u32; 256]; 8] {
    let mut t = [[0u32; 256]; 8];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
            k += 1;
        }
        t[0][i] = c;
        i += 1;
    }
    let mut s = 1;
    while s < 8 {
        let mut i = 0;
        while i < 256 {
            let prev = t[s - 1][i];
            t[s][i] = (prev >> 8) ^ t[0][(prev & 0xff) as usize];
            i += 1;
        }
        s += 1;
    }
    t
}

/// The CRC-32C of `data`.
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c_append(0, data)
}

/// Extends `crc` (the CRC-32C of some earlier bytes, 0 for none) with `data`,
/// so a packet can be checksummed in pieces.
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("sse4.2") {
            // SAFETY: the CPU supports SSE 4.2, checked just above.
            return unsafe { hw::append(crc, data) };
        }
    }
    software_append(crc, data)
}

/// The portable implementation, public to the crate so tests can compare it
/// with the hardware one.
pub(crate) fn software_append(crc: u32, data: &[u8]) -> u32 {
    let mut c = !crc;
    let mut chunks = data.chunks_exact(8);
    for ch in &mut chunks {
        let lo = u32::from_le_bytes([ch[0], ch[1], ch[2], ch[3]]) ^ c;
        let hi = u32::from_le_bytes([ch[4], ch[5], ch[6], ch[7]]);
        c = TABLES[7][(lo & 0xff) as usize]
            ^ TABLES[6][((lo >> 8) & 0xff) as usize]
            ^ TABLES[5][((lo >> 16) & 0xff) as usize]
            ^ TABLES[4][(lo >> 24) as usize]
            ^ TABLES[3][(hi & 0xff) as usize]
            ^ TABLES[2][((hi >> 8) & 0xff) as usize]
            ^ TABLES[1][((hi >> 16) & 0xff) as usize]
            ^ TABLES[0][(hi >> 24) as usize];
    }
    for &b in chunks.remainder() {
        c = (c >> 8) ^ TABLES[0][((c ^ b as u32) & 0xff) as usize];
    }
    !c
}

#[cfg(target_arch = "x86_64")]
mod hw {
    use super::POLY;
    use std::arch::x86_64::{_mm_crc32_u64, _mm_crc32_u8};

    /// Bytes per stream in a short and in a long block.  The `crc32`
    /// instruction has a latency of 3 cycles but a throughput of 1, so a
    /// block runs three independent streams side by side.  Long blocks
    /// fold less often per byte; short ones leave at most 191 bytes to the
    /// single stream.  A long stream is as long as a whole short block, so
    /// the two share a table.
    const SHORT: usize = 64;
    const LONG: usize = 3 * SHORT;

    /// A linear operator on the raw (not inverted) CRC register, as four
    /// byte tables: the image of a register is the XOR of one entry per byte.
    type Shift = [[u32; 256]; 4];

    /// "Append `SHORT`, `LONG` and `3 * LONG` zero bytes".
    static SHIFT_SHORT: Shift = shift_table(SHORT);
    static SHIFT_LONG: Shift = shift_table(LONG);
    static SHIFT_3_LONG: Shift = shift_table(3 * LONG);

    /// The register after one zero bit: a multiplication by x modulo the
    /// polynomial (bit 31 holds x^0 in the reflected order).
    const fn mul_x(c: u32) -> u32 {
        if c & 1 != 0 {
            (c >> 1) ^ POLY
        } else {
            c >> 1
        }
    }

    /// The tables of "append `n` zero bytes", that is, multiply by
    /// x^(8n).  That commutes with multiplying by x, so only the image of
    /// x^0 takes 8n steps; the other 31 basis vectors are one step apart,
    /// and each table entry is the XOR of the images of its set bits.
    const fn shift_table(n: usize) -> Shift {
        let mut image = [0u32; 32];
        let mut c = 0x8000_0000u32;
        let mut k = 0;
        while k < 8 * n {
            c = mul_x(c);
            k += 1;
        }
        let mut bit = 32;
        while bit > 0 {
            bit -= 1;
            image[bit] = c;
            c = mul_x(c);
        }
        let mut t = [[0u32; 256]; 4];
        let mut byte = 0;
        while byte < 4 {
            let mut v = 1;
            while v < 256 {
                // v without its lowest set bit is already done.
                t[byte][v] = t[byte][v & (v - 1)] ^ image[8 * byte + v.trailing_zeros() as usize];
                v += 1;
            }
            byte += 1;
        }
        t
    }

    fn shift(t: &Shift, c: u32) -> u32 {
        t[0][(c & 0xff) as usize]
            ^ t[1][((c >> 8) & 0xff) as usize]
            ^ t[2][((c >> 16) & 0xff) as usize]
            ^ t[3][(c >> 24) as usize]
    }

    /// Folds the leading `3 * N`-byte blocks of `data` into the raw
    /// register `c`; returns it and the bytes left over.  By linearity a
    /// block's register is its three streams' registers, each started
    /// from 0, shifted past the bytes after them and XORed, and the
    /// incoming register only needs shifting past the whole block
    /// (`shift_3n`): one table step between blocks, while the streams of
    /// the next block already run.
    #[target_feature(enable = "sse4.2")]
    #[inline]
    fn blocks<'a, const N: usize>(
        mut c: u32,
        mut data: &'a [u8],
        shift_n: &Shift,
        shift_3n: &Shift,
    ) -> (u32, &'a [u8]) {
        while data.len() >= 3 * N {
            let (block, rest) = data.split_at(3 * N);
            let (a, bc) = block.split_at(N);
            let (b, cc) = bc.split_at(N);
            let (mut c0, mut c1, mut c2) = (0u64, 0u64, 0u64);
            for ((x, y), z) in a.as_chunks::<8>().0.iter().zip(b.as_chunks::<8>().0).zip(cc.as_chunks::<8>().0) {
                c0 = _mm_crc32_u64(c0, u64::from_le_bytes(*x));
                c1 = _mm_crc32_u64(c1, u64::from_le_bytes(*y));
                c2 = _mm_crc32_u64(c2, u64::from_le_bytes(*z));
            }
            let streams = shift(shift_n, shift(shift_n, c0 as u32) ^ c1 as u32) ^ c2 as u32;
            c = shift(shift_3n, c) ^ streams;
            data = rest;
        }
        (c, data)
    }

    /// The blocks of `data`, out of line so that short inputs do not pay
    /// for the registers the blocks use.
    #[target_feature(enable = "sse4.2")]
    #[inline(never)]
    fn all_blocks(c: u32, data: &[u8]) -> (u32, &[u8]) {
        let (c, data) = blocks::<LONG>(c, data, &SHIFT_LONG, &SHIFT_3_LONG);
        blocks::<SHORT>(c, data, &SHIFT_SHORT, &SHIFT_LONG)
    }

    /// # Safety
    /// The CPU must support SSE 4.2.
    #[target_feature(enable = "sse4.2")]
    pub(super) unsafe fn append(crc: u32, data: &[u8]) -> u32 {
        let (c, rest) = if data.len() >= 3 * SHORT { all_blocks(!crc, data) } else { (!crc, data) };
        let mut c = c as u64;
        let (words, tail) = rest.as_chunks::<8>();
        for w in words {
            c = _mm_crc32_u64(c, u64::from_le_bytes(*w));
        }
        let mut c = c as u32;
        for &b in tail {
            c = _mm_crc32_u8(c, b);
        }
        !c
    }

    #[test]
    fn tables_append_zero_bytes() {
        let zeros = [0u8; 3 * LONG];
        for (t, n) in [(&SHIFT_SHORT, SHORT), (&SHIFT_LONG, LONG), (&SHIFT_3_LONG, 3 * LONG)] {
            for reg in [1, 0x8000_0000, 0x1234_5678, 0xFFFF_FFFF] {
                // software_append works on the inverted register.
                assert_eq!(shift(t, reg), !super::software_append(!reg, &zeros[..n]), "{n} zero bytes");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vectors() {
        // The check value of CRC-32C and the iSCSI test vectors (RFC 3720, B.4).
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62A8_AB43);
        let inc: Vec<u8> = (0u8..32).collect();
        assert_eq!(crc32c(&inc), 0x46DD_794E);
        assert_eq!(crc32c(&[]), 0);
        assert_eq!(software_append(0, b"123456789"), 0xE306_9283);
        assert_eq!(software_append(0, &inc), 0x46DD_794E);
    }

    #[test]
    fn pieces_and_software_agree() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 + i / 3) as u8).collect();
        let whole = crc32c(&data);
        for cut in [0, 1, 7, 8, 9, 500, 999, 1000] {
            let (a, b) = data.split_at(cut);
            assert_eq!(crc32c_append(crc32c(a), b), whole);
            assert_eq!(software_append(software_append(0, a), b), whole);
        }
    }

    /// Pseudo-random bytes (xorshift), so that no block looks like another.
    fn noise(len: usize) -> Vec<u8> {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 32) as u8
            })
            .collect()
    }

    /// Every length up to past several long blocks and a few big ones, from
    /// several starting CRCs, so every block size and tail length of the
    /// three-stream path meets the software one.
    #[test]
    fn hardware_matches_software_at_every_length() {
        let data = noise(65536);
        let lengths = (0..=4000).chain([6143, 6144, 6145, 8972, 9000, 20000, 65535, 65536]);
        for n in lengths {
            for start in [0, 0xFFFF_FFFF, 0x1234_5678, 0x8000_0001] {
                let d = &data[65536 - n..];
                assert_eq!(crc32c_append(start, d), software_append(start, d), "length {n}, start {start:#x}");
            }
        }
    }

    /// Appends split anywhere give the CRC of the whole, so a piece may end
    /// in the middle of a block or a word.
    #[test]
    fn split_appends_match_software() {
        let data = noise(20000);
        let lengths = (0..=4000).step_by(37).chain([1472, 3072, 3456, 8972, 9000, 20000]);
        for n in lengths {
            let d = &data[..n];
            let whole = software_append(0x0BAD_CAFE, d);
            let cuts = [1, 4, 7, 8, 9, 76, 80, 383, 384, 385, 3071, 3072, 3073, n / 3, n / 2];
            for cut in cuts.into_iter().filter(|&c| c <= n).chain([0, n]) {
                let (a, b) = d.split_at(cut);
                assert_eq!(crc32c_append(crc32c_append(0x0BAD_CAFE, a), b), whole, "length {n}, cut {cut}");
                for cut2 in [cut + 1, cut + 8, cut + 385].into_iter().filter(|&c| c <= n) {
                    let (b1, b2) = d[cut..].split_at(cut2 - cut);
                    let c = crc32c_append(crc32c_append(crc32c_append(0x0BAD_CAFE, a), b1), b2);
                    assert_eq!(c, whole, "length {n}, cuts {cut} and {cut2}");
                }
            }
        }
    }
}
