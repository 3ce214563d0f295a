//! CRC-32C (Castagnoli), the checksum of every openvia packet.
//!
//! A table-driven software implementation (slicing by eight) that uses the
//! SSE 4.2 `crc32` instruction, on three interleaved streams, when the CPU
//! has it.  Long inputs go to carry-less multiplication folding when the
//! CPU has VPCLMULQDQ and AVX-512 (256 bytes a step in four 512-bit
//! registers), VPCLMULQDQ and AVX2 (256 bytes in eight 256-bit registers)
//! or PCLMULQDQ (64 bytes a step in four 128-bit registers),
//! with the three `crc32` streams running on a 192-byte block beside each
//! step; the CPU's features are looked up at run time.

/// The reflected Castagnoli polynomial.
const POLY: u32 = 0x82F6_3B78;

/// The register after one zero bit: a multiplication by x modulo the
/// polynomial (bit 31 holds x^0 in the reflected order).
const fn mul_x(c: u32) -> u32 {
    if c & 1 != 0 {
        (c >> 1) ^ POLY
    } else {
        c >> 1
    }
}

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
            c = mul_x(c);
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
        if data.len() >= fold::MIN_LEN_512.min(fold::MIN_LEN_256).min(fold::MIN_LEN_128) {
            return long_append(crc, data);
        }
        if std::arch::is_x86_feature_detected!("sse4.2") {
            // SAFETY: the CPU supports SSE 4.2, checked just above.
            return unsafe { hw::append(crc, data) };
        }
    }
    software_append(crc, data)
}

/// [`crc32c_append`] for inputs long enough that folding may pay, out of
/// line so that short ones do not pay for its registers.
#[cfg(target_arch = "x86_64")]
#[inline(never)]
fn long_append(crc: u32, data: &[u8]) -> u32 {
    use std::sync::atomic::{AtomicU8, Ordering::Relaxed};
    /// The best path the CPU has, once known: checking the features one
    /// by one each time costs as much as folding a few hundred bytes saves.
    static PATH: AtomicU8 = AtomicU8::new(UNKNOWN);
    const UNKNOWN: u8 = 0;
    const FOLD_512: u8 = 1;
    const FOLD_256: u8 = 2;
    const FOLD_128: u8 = 3;
    const CRC32: u8 = 4;
    const SOFTWARE: u8 = 5;
    let mut path = PATH.load(Relaxed);
    if path == UNKNOWN {
        path = if fold::has_512() {
            FOLD_512
        } else if fold::has_256() {
            FOLD_256
        } else if fold::has_128() {
            FOLD_128
        } else if std::arch::is_x86_feature_detected!("sse4.2") {
            CRC32
        } else {
            SOFTWARE
        };
        PATH.store(path, Relaxed);
    }
    match path {
        // SAFETY: the CPU has what the 512-bit path needs, as `fold::has_512` found.
        FOLD_512 if data.len() >= fold::MIN_LEN_512 => unsafe { fold::append_512(crc, data) },
        // SAFETY: the CPU has what the 256-bit path needs, as `fold::has_256` found.
        FOLD_256 if data.len() >= fold::MIN_LEN_256 => unsafe { fold::append_256(crc, data) },
        // SAFETY: the CPU has PCLMULQDQ and SSE 4.2, as `fold::has_128` found.
        FOLD_128 if data.len() >= fold::MIN_LEN_128 => unsafe { fold::append_128(crc, data) },
        // SAFETY: every path but the software one has SSE 4.2.
        FOLD_512 | FOLD_256 | FOLD_128 | CRC32 => unsafe { hw::append(crc, data) },
        _ => software_append(crc, data),
    }
}

/// The portable implementation, public to the crate so tests can compare it
/// with the hardware one.  Out of line, so that the dispatch in
/// [`crc32c_append`] saves no registers on its way to the others.
#[inline(never)]
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
    use super::mul_x;
    use std::arch::x86_64::{_mm_crc32_u16, _mm_crc32_u32, _mm_crc32_u64, _mm_crc32_u8};

    /// Bytes per stream in a short and in a long block.  The `crc32`
    /// instruction has a latency of 3 cycles but a throughput of 1, so a
    /// block runs three independent streams side by side.  Long blocks
    /// fold less often per byte; short ones leave at most 191 bytes to the
    /// single stream.  A long stream is as long as a whole short block, so
    /// the two share a table.
    pub(super) const SHORT: usize = 64;
    const LONG: usize = 3 * SHORT;

    /// A linear operator on the raw (not inverted) CRC register, as four
    /// byte tables: the image of a register is the XOR of one entry per byte.
    type Shift = [[u32; 256]; 4];

    /// "Append `SHORT`, `LONG` and `3 * LONG` zero bytes".
    static SHIFT_SHORT: Shift = shift_table(SHORT);
    static SHIFT_LONG: Shift = shift_table(LONG);
    static SHIFT_3_LONG: Shift = shift_table(3 * LONG);

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

    /// The raw register after `block` from zero, on three streams of
    /// `SHORT` bytes: for the folding paths, which run it beside their
    /// carry-less multiplications.
    #[target_feature(enable = "sse4.2")]
    #[inline]
    pub(super) fn short_block(block: &[u8; 3 * SHORT]) -> u32 {
        let (words, _) = block.as_chunks::<8>();
        let (a, bc) = words.split_at(SHORT / 8);
        let (b, cc) = bc.split_at(SHORT / 8);
        let (mut c0, mut c1, mut c2) = (0u64, 0u64, 0u64);
        for ((x, y), z) in a.iter().zip(b).zip(cc) {
            c0 = _mm_crc32_u64(c0, u64::from_le_bytes(*x));
            c1 = _mm_crc32_u64(c1, u64::from_le_bytes(*y));
            c2 = _mm_crc32_u64(c2, u64::from_le_bytes(*z));
        }
        shift(&SHIFT_SHORT, shift(&SHIFT_SHORT, c0 as u32) ^ c1 as u32) ^ c2 as u32
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
        !raw(!crc, data)
    }

    /// Extends the raw (not inverted) register `c` with `data`.
    #[target_feature(enable = "sse4.2")]
    pub(super) fn raw(c: u32, data: &[u8]) -> u32 {
        let (c, rest) = if data.len() >= 3 * SHORT { all_blocks(c, data) } else { (c, data) };
        let mut c = c as u64;
        let (words, tail) = rest.as_chunks::<8>();
        for w in words {
            c = _mm_crc32_u64(c, u64::from_le_bytes(*w));
        }
        let mut c = c as u32;
        if !tail.is_empty() {
            c = tail_bytes(c, tail);
        }
        c
    }

    /// The last 1 to 7 bytes, in at most three instructions.
    #[target_feature(enable = "sse4.2")]
    #[inline]
    fn tail_bytes(mut c: u32, mut tail: &[u8]) -> u32 {
        if let Some((w, rest)) = tail.split_first_chunk::<4>() {
            c = _mm_crc32_u32(c, u32::from_le_bytes(*w));
            tail = rest;
        }
        if let Some((w, rest)) = tail.split_first_chunk::<2>() {
            c = _mm_crc32_u16(c, u16::from_le_bytes(*w));
            tail = rest;
        }
        if let Some(&b) = tail.first() {
            c = _mm_crc32_u8(c, b);
        }
        c
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

/// Carry-less multiplication folding (Gopal et al., "Fast CRC Computation
/// for Generic Polynomials Using PCLMULQDQ Instruction", Intel 2009), in
/// the bit-reflected order of the `crc32` instruction.
///
/// A 16-byte lane loaded little-endian holds a polynomial of degree below
/// 128 with bit k as the coefficient of x^(127-k): the lane's low 64 bits
/// `L` are its high half, so the lane is `L x^64 + H`.  In that order a
/// carry-less product of two 64-bit halves `a` and `b` reads as `a b x`
/// (its bit 127 stays 0).  Moving a lane `d` bits further into the message
/// multiplies it by x^d, and
///
/// ```text
/// L x^(64+d) + H x^d  =  L (x^(d+63) mod P) x + H (x^(d-1) mod P) x
/// ```
///
/// modulo P, a 128-bit value that is XORed into the lane `d` bits on.  A
/// remainder of degree below 32 in the 64-bit reflected order is the
/// 32-bit reflected register placed in the low half times x^32, so the two
/// multipliers are the registers of x^(d+31) and x^(d-33) ([`keys`]).
///
/// A register belongs in the first four bytes after the bytes it covers,
/// as the `crc32` instruction XORs it into the next bytes.  Once everything
/// is folded into one lane, that lane is a message whose CRC from a zero
/// register is the CRC so far: two `crc32` instructions over its halves
/// finish it exactly, and the bytes after it continue on the same register.
///
/// The `crc32` instruction and the carry-less multiplier run largely side
/// by side, so each step of the main loops is a 192-byte block for the
/// three `crc32` streams followed by a folded block: the block's register,
/// from zero, goes into the first four bytes of the folded block after it.
/// (On a Zen 4, 64 KiB take about 1250 ns on the `crc32` streams alone,
/// 920 ns folding alone and 780 ns both ways at once.)  The incoming
/// register is a lane at the very start, whose only nonzero bytes are its
/// first four, moved on past the first 192 bytes by one multiplication, so
/// that it waits for no `crc32` stream.
#[cfg(target_arch = "x86_64")]
mod fold {
    use super::{hw, mul_x};
    use std::arch::x86_64::*;

    /// Below this many bytes [`super::crc32c_append`] keeps to the
    /// three-stream `crc32` path even when the CPU can fold.  Measured on a
    /// Zen 4 (AMD EPYC, 3.7 GHz), independent calls back to back: from 192
    /// bytes on the 512-bit path takes less time per call (256 bytes: 4.4
    /// against 7.3 ns; 1392: 19 against 30 ns).  With each call's result
    /// feeding the next, the `crc32` path is faster at 192 and 256 bytes
    /// (6.5 and 8.2 against 11.1 and 9.7 ns), the two trade places, within
    /// 25% either way, up to about 700 bytes, and folding is faster from
    /// there on (768: 15 against 19 ns; 1392: 20 against 31 ns).
    pub(super) const MIN_LEN_512: usize = 256;
    /// The same for the 128-bit path.  On the Zen 4 (called directly) it
    /// is even with the `crc32` path from 512 bytes on, within 5% either
    /// way, and not faster: there a 128-bit multiplication costs about as
    /// much as a 512-bit one.  It is meant for CPUs without VPCLMULQDQ
    /// whose multiplier and `crc32` unit issue on separate ports, where it
    /// has not been measured; from 1024 bytes it risks least.
    pub(super) const MIN_LEN_128: usize = 1024;
    /// The same for the 256-bit path: one step.  On a Zen 3 (AMD EPYC,
    /// independent calls back to back) it is as fast as the `crc32` path at
    /// 448 and 640 bytes and faster from there on (1024: 56 against 60 ns).
    pub(super) const MIN_LEN_256: usize = STEP_256;

    /// The register of x^n modulo the polynomial.
    const fn x_pow(n: u32) -> u32 {
        let mut c = 0x8000_0000u32;
        let mut k = 0;
        while k < n {
            c = mul_x(c);
            k += 1;
        }
        c
    }

    /// The multipliers that move a lane `bytes` bytes on: for its low and
    /// its high 64 bits.
    const fn keys(bytes: usize) -> [u64; 2] {
        let d = 8 * bytes as u32;
        [x_pow(d + 31) as u64, x_pow(d - 33) as u64]
    }

    /// The block of each step that the `crc32` instruction takes.
    const STREAMS: usize = 3 * hw::SHORT;
    /// A step of [`raw_128`]: a stream block and four lanes.
    const STEP_128: usize = STREAMS + 64;
    /// A step of [`raw_512`]: a stream block and four 64-byte registers.
    const STEP_512: usize = STREAMS + 256;
    /// A step of [`raw_256`]: a stream block and eight 32-byte registers.
    const STEP_256: usize = STREAMS + 256;

    const K16: [u64; 2] = keys(16);
    const K32: [u64; 2] = keys(32);
    const K48: [u64; 2] = keys(48);
    const K64: [u64; 2] = keys(64);
    const K96: [u64; 2] = keys(96);
    const K128: [u64; 2] = keys(128);
    const K160: [u64; 2] = keys(160);
    const K192: [u64; 2] = keys(192);
    const K224: [u64; 2] = keys(224);
    const K256: [u64; 2] = keys(256);
    const K_STREAMS: [u64; 2] = keys(STREAMS);
    const K_STEP_128: [u64; 2] = keys(STEP_128);
    const K_STEP_512: [u64; 2] = keys(STEP_512);
    const K_STEP_256: [u64; 2] = keys(STEP_256);

    /// `k` as a lane: the low multiplier in the low half.
    #[target_feature(enable = "sse2")]
    #[inline]
    fn lane(k: [u64; 2]) -> __m128i {
        _mm_set_epi64x(k[1] as i64, k[0] as i64)
    }

    #[inline]
    fn load16(b: &[u8; 16]) -> __m128i {
        // SAFETY: `b` is 16 readable bytes and the load is unaligned.
        unsafe { _mm_loadu_si128(b.as_ptr().cast()) }
    }

    /// A register as the first four bytes of a lane.
    #[target_feature(enable = "sse2")]
    #[inline]
    fn reg(c: u32) -> __m128i {
        _mm_cvtsi32_si128(c as i32)
    }

    /// `x` moved on by the distance of `k` and XORed with `next`.
    #[target_feature(enable = "pclmulqdq")]
    #[inline]
    fn fold16(x: __m128i, k: __m128i, next: __m128i) -> __m128i {
        let lo = _mm_clmulepi64_si128(x, k, 0x00);
        let hi = _mm_clmulepi64_si128(x, k, 0x11);
        _mm_xor_si128(_mm_xor_si128(lo, hi), next)
    }

    /// The incoming register `c` moved on past the first stream block:
    /// its lane has only a low half, so one multiplication does.
    #[target_feature(enable = "pclmulqdq")]
    #[inline]
    fn start(c: u32) -> __m128i {
        _mm_clmulepi64_si128(reg(c), lane(K_STREAMS), 0x00)
    }

    /// The CRC of the lane `x` and of the bytes after it, as a raw
    /// register.
    #[target_feature(enable = "sse4.2")]
    #[inline]
    fn finish(x: __m128i, rest: &[u8]) -> u32 {
        let c = _mm_crc32_u64(0, _mm_cvtsi128_si64(x) as u64);
        let c = _mm_crc32_u64(c, _mm_extract_epi64(x, 1) as u64);
        hw::raw(c as u32, rest)
    }

    /// A step's four lanes, the stream block's register in the first.
    #[target_feature(enable = "sse4.2")]
    #[inline]
    fn step_128(step: &[u8; STEP_128]) -> [__m128i; 4] {
        let (streams, lanes) = step.split_at(STREAMS);
        let (streams, _) = streams.as_chunks::<STREAMS>();
        let (l, _) = lanes.as_chunks::<16>();
        let r = reg(hw::short_block(&streams[0]));
        [_mm_xor_si128(load16(&l[0]), r), load16(&l[1]), load16(&l[2]), load16(&l[3])]
    }

    /// Extends the raw register `c` with `data`, 256 bytes a step: 192 on
    /// the `crc32` streams, 64 folded in four lanes.
    #[target_feature(enable = "sse4.2,pclmulqdq")]
    fn raw_128(c: u32, data: &[u8]) -> u32 {
        let (steps, rest) = data.as_chunks::<STEP_128>();
        let Some((first, more)) = steps.split_first() else {
            return hw::raw(c, data);
        };
        let mut x = step_128(first);
        x[0] = _mm_xor_si128(x[0], start(c));
        let k = lane(K_STEP_128);
        for step in more {
            for (x, next) in x.iter_mut().zip(step_128(step)) {
                *x = fold16(*x, k, next);
            }
        }
        // The first three lanes move on to the last one's place.
        let acc = fold16(x[0], lane(K48), x[3]);
        let acc = fold16(x[1], lane(K32), acc);
        let acc = fold16(x[2], lane(K16), acc);
        finish(acc, rest)
    }

    #[target_feature(enable = "avx512f")]
    #[inline]
    fn load64(b: &[u8; 64]) -> __m512i {
        // SAFETY: `b` is 64 readable bytes and the load is unaligned.
        unsafe { _mm512_loadu_si512(b.as_ptr().cast()) }
    }

    /// `k` in each of the four lanes.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn lanes(k: [u64; 2]) -> __m512i {
        _mm512_broadcast_i32x4(lane(k))
    }

    /// The four lanes of `x` each moved on by the distance of `k`, XORed
    /// with `next`.
    #[target_feature(enable = "avx512f,vpclmulqdq")]
    #[inline]
    fn fold64(x: __m512i, k: __m512i, next: __m512i) -> __m512i {
        let lo = _mm512_clmulepi64_epi128(x, k, 0x00);
        let hi = _mm512_clmulepi64_epi128(x, k, 0x11);
        // 0x96: the XOR of all three.
        _mm512_ternarylogic_epi64(lo, hi, next, 0x96)
    }

    /// A step's four 64-byte registers, the stream block's register in
    /// the first.
    #[target_feature(enable = "sse4.2,avx512f")]
    #[inline]
    fn step_512(step: &[u8; STEP_512]) -> [__m512i; 4] {
        let (streams, blocks) = step.split_at(STREAMS);
        let (streams, _) = streams.as_chunks::<STREAMS>();
        let (b, _) = blocks.as_chunks::<64>();
        let r = _mm512_zextsi128_si512(reg(hw::short_block(&streams[0])));
        [_mm512_xor_si512(load64(&b[0]), r), load64(&b[1]), load64(&b[2]), load64(&b[3])]
    }

    /// Extends the raw register `c` with `data`, 448 bytes a step: 192 on
    /// the `crc32` streams, 256 folded in four 512-bit registers.
    #[target_feature(enable = "sse4.2,pclmulqdq,avx512f,avx512vl,vpclmulqdq")]
    fn raw_512(c: u32, data: &[u8]) -> u32 {
        let (mut x, rest) = match data.as_chunks::<STEP_512>() {
            ([first, more @ ..], rest) => {
                let mut x = step_512(first);
                x[0] = _mm512_xor_si512(x[0], _mm512_zextsi128_si512(start(c)));
                let k = lanes(K_STEP_512);
                for step in more {
                    for (x, next) in x.iter_mut().zip(step_512(step)) {
                        *x = fold64(*x, k, next);
                    }
                }
                (x, rest)
            }
            ([], _) => match data.split_first_chunk::<256>() {
                Some((first, rest)) => {
                    let mut x = blocks_256(first);
                    x[0] = _mm512_xor_si512(x[0], _mm512_zextsi128_si512(reg(c)));
                    (x, rest)
                }
                None => {
                    return match data.split_first_chunk::<64>() {
                        Some((first, rest)) => {
                            finish_512(_mm512_xor_si512(load64(first), _mm512_zextsi128_si512(reg(c))), rest)
                        }
                        None => hw::raw(c, data),
                    };
                }
            },
        };
        // One more step without streams keeps the chain of single folds
        // in `finish_512` short.
        let rest = match rest.split_first_chunk::<256>() {
            Some((next, rest)) => {
                let k = lanes(K256);
                for (x, next) in x.iter_mut().zip(blocks_256(next)) {
                    *x = fold64(*x, k, next);
                }
                rest
            }
            None => rest,
        };
        // The first three registers move on to the last one's place.
        let y = _mm512_ternarylogic_epi64(
            fold64(x[0], lanes(K192), x[3]),
            fold64(x[1], lanes(K128), _mm512_setzero_si512()),
            fold64(x[2], lanes(K64), _mm512_setzero_si512()),
            0x96,
        );
        finish_512(y, rest)
    }

    #[target_feature(enable = "avx512f")]
    #[inline]
    fn blocks_256(b: &[u8; 256]) -> [__m512i; 4] {
        let (b, _) = b.as_chunks::<64>();
        [load64(&b[0]), load64(&b[1]), load64(&b[2]), load64(&b[3])]
    }

    /// Folds the 64-byte blocks of `rest` into `y`, then the lanes of `y`
    /// into one, and finishes with the bytes left.
    #[target_feature(enable = "sse4.2,pclmulqdq,avx512f,avx512vl,vpclmulqdq")]
    #[inline]
    fn finish_512(mut y: __m512i, rest: &[u8]) -> u32 {
        let (blocks, rest) = rest.as_chunks::<64>();
        let k = lanes(K64);
        for b in blocks {
            y = fold64(y, k, load64(b));
        }
        // The first three lanes move on to the last one's place.
        let (k16, k32, k48) = (lane(K16), lane(K32), lane(K48));
        let k = _mm512_inserti32x4(_mm512_inserti32x4(_mm512_castsi128_si512(k48), k32, 1), k16, 2);
        let t = fold64(y, k, _mm512_setzero_si512());
        let acc = _mm_ternarylogic_epi64(
            _mm512_extracti32x4_epi32(t, 0),
            _mm512_extracti32x4_epi32(t, 1),
            _mm512_extracti32x4_epi32(t, 2),
            0x96,
        );
        finish(_mm_xor_si128(acc, _mm512_extracti32x4_epi32(y, 3)), rest)
    }

    #[target_feature(enable = "avx")]
    #[inline]
    fn load32(b: &[u8; 32]) -> __m256i {
        // SAFETY: `b` is 32 readable bytes and the load is unaligned.
        unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
    }

    /// `k` in both lanes.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn lanes2(k: [u64; 2]) -> __m256i {
        _mm256_broadcastsi128_si256(lane(k))
    }

    /// The two lanes of `x` each moved on by the distance of `k`, XORed
    /// with `next`.
    #[target_feature(enable = "avx2,vpclmulqdq")]
    #[inline]
    fn fold32(x: __m256i, k: __m256i, next: __m256i) -> __m256i {
        let lo = _mm256_clmulepi64_epi128(x, k, 0x00);
        let hi = _mm256_clmulepi64_epi128(x, k, 0x11);
        _mm256_xor_si256(_mm256_xor_si256(lo, hi), next)
    }

    /// A step's eight 32-byte registers, the stream block's register in
    /// the first.
    #[target_feature(enable = "sse4.2,avx2")]
    #[inline]
    fn step_256(step: &[u8; STEP_256]) -> [__m256i; 8] {
        let (streams, blocks) = step.split_at(STREAMS);
        let (streams, _) = streams.as_chunks::<STREAMS>();
        let (b, _) = blocks.as_chunks::<32>();
        let r = _mm256_zextsi128_si256(reg(hw::short_block(&streams[0])));
        let mut x: [__m256i; 8] = std::array::from_fn(|i| load32(&b[i]));
        x[0] = _mm256_xor_si256(x[0], r);
        x
    }

    /// Extends the raw register `c` with `data`, 448 bytes a step: 192 on
    /// the `crc32` streams, 256 folded in eight 256-bit registers.  For
    /// CPUs with VPCLMULQDQ but not AVX-512 (AMD's Zen 3; Intel's cores
    /// since Alder Lake).  On a Zen 3 the `crc32` streams and the
    /// multiplications share execution units: 64 KiB take about 2760 ns on
    /// the streams alone, 2540 ns folding alone, 1970 ns both ways at once
    /// and 3280 ns on the 128-bit path.
    #[target_feature(enable = "sse4.2,pclmulqdq,avx2,vpclmulqdq")]
    fn raw_256(c: u32, data: &[u8]) -> u32 {
        let (steps, rest) = data.as_chunks::<STEP_256>();
        let Some((first, more)) = steps.split_first() else {
            return hw::raw(c, data);
        };
        let mut x = step_256(first);
        x[0] = _mm256_xor_si256(x[0], _mm256_zextsi128_si256(start(c)));
        let k = lanes2(K_STEP_256);
        for step in more {
            for (x, next) in x.iter_mut().zip(step_256(step)) {
                *x = fold32(*x, k, next);
            }
        }
        // The first seven registers move on to the last one's place.
        let zero = _mm256_setzero_si256();
        let mut y = x[7];
        for (x, k) in x.iter().zip([K224, K192, K160, K128, K96, K64, K32]) {
            y = _mm256_xor_si256(y, fold32(*x, lanes2(k), zero));
        }
        let (blocks, rest) = rest.as_chunks::<32>();
        let k = lanes2(K32);
        for b in blocks {
            y = fold32(y, k, load32(b));
        }
        let acc = fold16(_mm256_castsi256_si128(y), lane(K16), _mm256_extracti128_si256(y, 1));
        finish(acc, rest)
    }

    /// Whether the CPU has what [`append_256`] needs.
    pub(super) fn has_256() -> bool {
        std::arch::is_x86_feature_detected!("vpclmulqdq")
            && std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("pclmulqdq")
            && std::arch::is_x86_feature_detected!("sse4.2")
    }

    /// [`super::crc32c_append`] by 256-bit folding, for any length.
    ///
    /// # Safety
    /// The CPU must support what [`has_256`] checks.
    #[target_feature(enable = "sse4.2,pclmulqdq,avx2,vpclmulqdq")]
    pub(super) unsafe fn append_256(crc: u32, data: &[u8]) -> u32 {
        !raw_256(!crc, data)
    }

    /// Whether the CPU has what [`append_512`] needs.
    pub(super) fn has_512() -> bool {
        std::arch::is_x86_feature_detected!("vpclmulqdq")
            && std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("pclmulqdq")
            && std::arch::is_x86_feature_detected!("sse4.2")
    }

    /// Whether the CPU has what [`append_128`] needs.
    pub(super) fn has_128() -> bool {
        std::arch::is_x86_feature_detected!("pclmulqdq") && std::arch::is_x86_feature_detected!("sse4.2")
    }

    /// [`super::crc32c_append`] by 512-bit folding, for any length.
    ///
    /// # Safety
    /// The CPU must support what [`has_512`] checks.
    #[target_feature(enable = "sse4.2,pclmulqdq,avx512f,avx512vl,vpclmulqdq")]
    pub(super) unsafe fn append_512(crc: u32, data: &[u8]) -> u32 {
        !raw_512(!crc, data)
    }

    /// [`super::crc32c_append`] by 128-bit folding, for any length.
    ///
    /// # Safety
    /// The CPU must support what [`has_128`] checks.
    #[target_feature(enable = "sse4.2,pclmulqdq")]
    pub(super) unsafe fn append_128(crc: u32, data: &[u8]) -> u32 {
        !raw_128(!crc, data)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn x_pow_is_the_remainder() {
            // x^32 = the polynomial's lower terms, modulo itself.
            assert_eq!(x_pow(0), 0x8000_0000);
            assert_eq!(x_pow(31), 1);
            assert_eq!(x_pow(32), super::super::POLY);
        }

        /// Folding a lane by `bytes` gives a lane whose CRC is that of the
        /// lane followed by `bytes` zero bytes (zeros in front of a message
        /// do not change its CRC from a zero register).  The same for a
        /// register moved on by [`start`].
        #[test]
        fn keys_move_a_lane_on() {
            if !has_128() {
                eprintln!("no PCLMULQDQ: skipped");
                return;
            }
            let all = [
                (16, K16),
                (32, K32),
                (48, K48),
                (64, K64),
                (128, K128),
                (192, K192),
                (256, K256),
                (STREAMS, K_STREAMS),
                (STEP_128, K_STEP_128),
                (STEP_512, K_STEP_512),
                (STEP_256, K_STEP_256),
                (96, K96),
                (160, K160),
                (224, K224),
            ];
            let mut x = 0x2545_F491_4F6C_DD1Du64;
            for (bytes, k) in all {
                for _ in 0..20 {
                    let mut lane_bytes = [0u8; 16];
                    for b in lane_bytes.chunks_mut(8) {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        b.copy_from_slice(&x.to_le_bytes());
                    }
                    let mut moved = lane_bytes.to_vec();
                    moved.resize(16 + bytes, 0);
                    let want = !super::super::software_append(!0, &moved);
                    // SAFETY: the CPU has PCLMULQDQ and SSE 4.2, checked above.
                    let got = unsafe { fold_once(load16(&lane_bytes), lane(k)) };
                    assert_eq!(got, want, "{bytes} bytes, lane {lane_bytes:02x?}");
                }
            }
            for c in [1, 0x8000_0000, 0x1234_5678, 0xFFFF_FFFF] {
                let want = !super::super::software_append(!0, &[0; STREAMS + 16]);
                let want = want ^ !super::super::software_append(!c, &[0; STREAMS + 16]);
                // SAFETY: the CPU has PCLMULQDQ and SSE 4.2, checked above.
                assert_eq!(unsafe { finish(start(c), &[]) }, want, "register {c:#x}");
            }
        }

        /// The raw CRC of the lane `x` folded once by `k`.
        #[target_feature(enable = "sse4.2,pclmulqdq")]
        unsafe fn fold_once(x: __m128i, k: __m128i) -> u32 {
            finish(fold16(x, k, _mm_setzero_si128()), &[])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Append = fn(u32, &[u8]) -> u32;

    /// Every implementation this CPU can run, by name: the dispatching
    /// one and each path on its own, at every length.
    fn paths() -> Vec<(&'static str, Append)> {
        #[allow(unused_mut)]
        let mut paths: Vec<(&'static str, Append)> = vec![("crc32c_append", crc32c_append)];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("sse4.2") {
                // SAFETY: listed only when the CPU has SSE 4.2.
                paths.push(("crc32 x3", |c, d| unsafe { hw::append(c, d) }));
            } else {
                eprintln!("no SSE 4.2: the crc32 path is not tested");
            }
            if fold::has_128() {
                // SAFETY: listed only when the CPU has what the path needs.
                paths.push(("pclmulqdq", |c, d| unsafe { fold::append_128(c, d) }));
            } else {
                eprintln!("no PCLMULQDQ: the 128-bit folding path is not tested");
            }
            if fold::has_256() {
                // SAFETY: listed only when the CPU has what the path needs.
                paths.push(("vpclmulqdq 256", |c, d| unsafe { fold::append_256(c, d) }));
            } else {
                eprintln!("no VPCLMULQDQ and AVX2: the 256-bit folding path is not tested");
            }
            if fold::has_512() {
                // SAFETY: listed only when the CPU has what the path needs.
                paths.push(("vpclmulqdq", |c, d| unsafe { fold::append_512(c, d) }));
            } else {
                eprintln!("no VPCLMULQDQ and AVX-512: the 512-bit folding path is not tested");
            }
        }
        paths
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
            assert_eq!(software_append(0, data), want, "software, {data:02x?}");
            for (name, f) in paths() {
                assert_eq!(f(0, data), want, "{name}, {data:02x?}");
            }
        }
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
    /// misalignments, so every block count and tail length of every path
    /// meets the software one.  The software CRCs of the prefixes come one
    /// byte at a time.
    #[test]
    fn every_path_matches_software_at_every_length() {
        let data = noise(4000 + 128);
        let paths = paths();
        for misalign in MISALIGNS {
            let d = at(&data, misalign, 4000);
            for start in STARTS {
                let mut want = start;
                for n in 0..=4000 {
                    if n > 0 {
                        want = software_append(want, &d[n - 1..n]);
                    }
                    for (name, f) in &paths {
                        assert_eq!(
                            f(start, &d[..n]),
                            want,
                            "{name}: length {n}, misalign {misalign}, start {start:#x}"
                        );
                    }
                }
            }
        }
    }

    /// A few lengths past the 4000 of the test above.
    #[test]
    fn every_path_matches_software_on_large_inputs() {
        let data = noise(65536 + 13 + 128);
        let paths = paths();
        for n in [4095, 4096, 4097, 6144, 8972, 65535, 65536, 65536 + 13] {
            for misalign in MISALIGNS {
                let d = &at(&data, misalign, n)[..n];
                for start in STARTS {
                    let want = software_append(start, d);
                    for (name, f) in &paths {
                        assert_eq!(f(start, d), want, "{name}: length {n}, misalign {misalign}, start {start:#x}");
                    }
                }
            }
        }
    }

    /// Appends split at random points give the CRC of the whole, so a
    /// piece may end anywhere in a block, a lane or a word.
    #[test]
    fn split_appends_match_software() {
        let data = noise(20000 + 64);
        let paths = paths();
        let mut rng = Rng(0x0123_4567_89AB_CDEF);
        for round in 0..1500 {
            let n = match round % 3 {
                0 => rng.below(1024),
                1 => rng.below(4097),
                _ => rng.below(20001),
            };
            let d = &at(&data, rng.below(64), n)[..n];
            let start = rng.next() as u32;
            let whole = software_append(start, d);
            let mut cuts: Vec<usize> = (0..1 + rng.below(4)).map(|_| rng.below(n + 1)).collect();
            cuts.push(n);
            cuts.sort_unstable();
            for (name, f) in &paths {
                let (mut c, mut from) = (start, 0);
                for &cut in &cuts {
                    c = f(c, &d[from..cut]);
                    from = cut;
                }
                assert_eq!(c, whole, "{name}: length {n}, start {start:#x}, cuts {cuts:?}");
            }
        }
    }
}
