//! Data patterns: what each block carries, so that the receiver can check
//! every byte it got.
//!
//! Byte `k` of a block with seed `s` is byte `k % 8` of `mix(s ^ (k / 8))`,
//! so a chunk of a block can be checked on its own, given its offset in the
//! block, and blocks of different runs, directions or iterations differ.

/// The splitmix64 finaliser: a cheap, well-mixed 64-bit hash.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Which buffer of a run a block comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    /// The untimed first iteration.
    First = 0,
    /// Every timed iteration but the last.
    Middle = 1,
    /// The last timed iteration.
    Last = 2,
}

/// The seed of the blocks sent in `dir` (0: client to server, 1: back) from
/// buffer `which`, in the run with seed `run`.
pub fn seed(run: u64, dir: u8, which: Which) -> u64 {
    mix(run ^ mix(((dir as u64) << 8) | which as u64))
}

/// The expected byte at offset `k` of a block with seed `s`.
pub fn byte_at(s: u64, k: usize) -> u8 {
    (mix(s ^ (k / 8) as u64) >> ((k % 8) * 8)) as u8
}

/// Fills `buf` with the block of seed `s`.
pub fn fill(s: u64, buf: &mut [u8]) {
    let mut chunks = buf.chunks_exact_mut(8);
    for (i, c) in (&mut chunks).enumerate() {
        c.copy_from_slice(&mix(s ^ i as u64).to_le_bytes());
    }
    let tail_start = buf.len() / 8 * 8;
    for (j, b) in buf[tail_start..].iter_mut().enumerate() {
        *b = byte_at(s, tail_start + j);
    }
}

/// Checks that `data` is bytes `offset..offset + data.len()` of the block
/// of seed `s`; `Err` gives the first wrong block offset.
pub fn check(s: u64, offset: usize, data: &[u8]) -> Result<(), usize> {
    let mut k = 0;
    // Unaligned head, byte by byte.
    while k < data.len() && !(offset + k).is_multiple_of(8) {
        if data[k] != byte_at(s, offset + k) {
            return Err(offset + k);
        }
        k += 1;
    }
    // Whole words.
    while k + 8 <= data.len() {
        let word = mix(s ^ ((offset + k) / 8) as u64).to_le_bytes();
        if data[k..k + 8] != word {
            let bad = (0..8).find(|&j| data[k + j] != word[j]).unwrap_or(0);
            return Err(offset + k + bad);
        }
        k += 8;
    }
    while k < data.len() {
        if data[k] != byte_at(s, offset + k) {
            return Err(offset + k);
        }
        k += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_and_check_agree_at_any_offset() {
        let s = seed(42, 0, Which::Last);
        let mut block = vec![0u8; 1003];
        fill(s, &mut block);
        assert!(check(s, 0, &block).is_ok());
        for start in [0, 1, 7, 8, 9, 500, 1000] {
            for end in [start, start + 1, start + 3, 1003] {
                if end >= start && end <= 1003 {
                    assert!(check(s, start, &block[start..end]).is_ok(), "{start}..{end}");
                }
            }
        }
        assert_eq!(block[17], byte_at(s, 17));
    }

    #[test]
    fn check_finds_the_first_wrong_byte() {
        let s = seed(1, 1, Which::First);
        let mut block = vec![0u8; 64];
        fill(s, &mut block);
        block[37] ^= 1;
        assert_eq!(check(s, 0, &block), Err(37));
        assert_eq!(check(s, 30, &block[30..]), Err(37));
        block[3] ^= 0x80;
        assert_eq!(check(s, 0, &block), Err(3));
    }

    #[test]
    fn seeds_differ_by_run_direction_and_buffer() {
        let all = [
            seed(1, 0, Which::First),
            seed(1, 0, Which::Middle),
            seed(1, 0, Which::Last),
            seed(1, 1, Which::First),
            seed(2, 0, Which::First),
        ];
        for i in 0..all.len() {
            for j in i + 1..all.len() {
                assert_ne!(all[i], all[j]);
            }
        }
        // A block of one seed does not pass as another.
        let mut block = vec![0u8; 16];
        fill(all[1], &mut block);
        assert!(check(all[2], 0, &block).is_err());
    }
}
