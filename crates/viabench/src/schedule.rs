//! NetPIPE's measurement schedule: which block sizes, how many repetitions.
//!
//! Sizes start at one byte and double; around each power of two `c` above
//! `4p` the perturbed sizes `c - p` and `c + p` are measured too (NetPIPE's
//! default `p` is 3), since a block slightly smaller or larger than an
//! internal buffer often behaves differently.  Each size is repeated enough
//! times to last the minimum time, and the best of several trials counts.

use std::time::Duration;

/// Fewest timed repetitions of one size.
pub const MIN_REPS: u64 = 3;
/// Most timed repetitions of one size.
pub const MAX_REPS: u64 = 2_000_000;

/// The block sizes from 1 byte up to `max`, doubling, with perturbation `p`.
pub fn netpipe_sizes(max: usize, p: usize) -> Vec<usize> {
    let mut sizes = Vec::new();
    let mut c: usize = 1;
    while c <= max {
        let perturb = p > 0 && c > 4 * p;
        if perturb {
            sizes.push(c - p);
        }
        sizes.push(c);
        if perturb && c + p <= max {
            sizes.push(c + p);
        }
        match c.checked_mul(2) {
            Some(next) => c = next,
            None => break,
        }
    }
    sizes
}

/// The sizes of `--quick`: a few, from latency to bandwidth.
pub fn quick_sizes(max: usize) -> Vec<usize> {
    [1usize, 4, 1024, 65536, 1 << 20].into_iter().filter(|&s| s <= max).collect()
}

/// Repetitions so that `per_iteration` times them lasts `min_time`.
pub fn reps_for(min_time: Duration, per_iteration: Duration) -> u64 {
    let per = per_iteration.as_secs_f64().max(1e-9);
    let n = (min_time.as_secs_f64() / per).ceil();
    (n as u64).clamp(MIN_REPS, MAX_REPS)
}

/// The time one iteration of `size` bytes is expected to take, from the
/// measurement of `prev_size`: constant while latency dominates, linear in
/// the size once bandwidth does; the geometric mean splits the difference.
pub fn estimate(prev_size: usize, prev: Duration, size: usize) -> Duration {
    let ratio = (size.max(1) as f64 / prev_size.max(1) as f64).max(1.0);
    prev.mul_f64(ratio.sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_double_with_perturbations_above_4p() {
        let s = netpipe_sizes(64, 3);
        assert_eq!(s, vec![1, 2, 4, 8, 13, 16, 19, 29, 32, 35, 61, 64]);
        assert!(s.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn sizes_without_perturbation_are_powers_of_two() {
        assert_eq!(netpipe_sizes(100, 0), vec![1, 2, 4, 8, 16, 32, 64]);
        assert_eq!(netpipe_sizes(0, 3), Vec::<usize>::new());
    }

    #[test]
    fn default_schedule_stops_at_max_transfer_size() {
        let s = netpipe_sizes(4 << 20, 3);
        assert_eq!(*s.first().unwrap(), 1);
        assert_eq!(*s.last().unwrap(), 4 << 20);
        assert!(s.contains(&((4 << 20) - 3)));
        assert!(!s.contains(&((4 << 20) + 3)));
        assert!(s.contains(&(1 << 20)) && s.contains(&((1 << 20) + 3)));
    }

    #[test]
    fn quick_sizes_respect_max() {
        assert_eq!(quick_sizes(4096), vec![1, 4, 1024]);
        assert_eq!(quick_sizes(4 << 20).len(), 5);
    }

    #[test]
    fn reps_fill_min_time_within_bounds() {
        assert_eq!(reps_for(Duration::from_millis(20), Duration::from_micros(10)), 2000);
        assert_eq!(reps_for(Duration::from_millis(20), Duration::from_secs(1)), MIN_REPS);
        assert_eq!(reps_for(Duration::from_secs(100), Duration::from_nanos(1)), MAX_REPS);
        assert_eq!(reps_for(Duration::from_millis(20), Duration::ZERO), MAX_REPS);
    }

    #[test]
    fn estimate_grows_with_size() {
        let t = Duration::from_micros(100);
        assert_eq!(estimate(1024, t, 512), t);
        let e = estimate(1024, t, 4096);
        assert_eq!(e, Duration::from_micros(200));
    }
}
