//! CRC-32C (Castagnoli), the checksum of every openvia packet.
//!
//! A table-driven software implementation (slicing by eight) that uses the
//! SSE 4.2 `crc32` instruction when the CPU has it.

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
    use std::arch::x86_64::{_mm_crc32_u64, _mm_crc32_u8};

    /// # Safety
    /// The CPU must support SSE 4.2.
    #[target_feature(enable = "sse4.2")]
    pub(super) unsafe fn append(crc: u32, data: &[u8]) -> u32 {
        let mut c = (!crc) as u64;
        let mut chunks = data.chunks_exact(8);
        for ch in &mut chunks {
            let v = u64::from_le_bytes(ch.try_into().expect("chunk of eight"));
            c = _mm_crc32_u64(c, v);
        }
        let mut c = c as u32;
        for &b in chunks.remainder() {
            c = _mm_crc32_u8(c, b);
        }
        !c
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
}
