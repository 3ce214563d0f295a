//! Round-trip time estimation and the retransmission timeout.

use crate::time::nanos;
use std::time::Duration;

/// Clock granularity term of the timeout, so a perfectly steady RTT (zero
/// variance) does not give a timeout equal to the RTT itself.
const GRANULARITY: u64 = 100_000;

/// Jacobson/Karels estimator (RFC 6298) with exponential backoff, in
/// nanoseconds: a sample per acknowledgement and the timeout at every
/// look at the timers cost a few integer operations each.
#[derive(Debug, Clone)]
pub(crate) struct RttEstimator {
    srtt: Option<u64>,
    rttvar: u64,
    /// The timeout before backoff.
    base: u64,
    /// Number of consecutive timer expiries since the last sample.
    backoff: u32,
    /// Added to every timeout: the peer may hold an ACK back this long.
    ack_delay: u64,
    min: u64,
    max: u64,
}

impl RttEstimator {
    pub(crate) fn new(initial: Duration, min: Duration, max: Duration, ack_delay: Duration) -> Self {
        let (min, max) = (nanos(min), nanos(max));
        let max = max.max(min);
        RttEstimator {
            srtt: None,
            rttvar: 0,
            base: nanos(initial).clamp(min, max),
            backoff: 0,
            ack_delay: nanos(ack_delay),
            min,
            max,
        }
    }

    /// The smoothed RTT, zero before the first sample.
    pub(crate) fn srtt(&self) -> Duration {
        Duration::from_nanos(self.srtt.unwrap_or(0))
    }

    /// The current retransmission timeout, backoff included.
    pub(crate) fn rto(&self) -> Duration {
        Duration::from_nanos(self.rto_nanos())
    }

    /// [`RttEstimator::rto`] in nanoseconds.
    #[inline]
    pub(crate) fn rto_nanos(&self) -> u64 {
        let factor = 1u64 << self.backoff.min(30);
        self.base.saturating_mul(factor).min(self.max)
    }

    /// Feeds one measurement.  Callers apply Karn's rule: never a sample from
    /// a packet that was retransmitted.
    pub(crate) fn sample(&mut self, r: Duration) {
        let r = nanos(r);
        match self.srtt {
            None => {
                self.srtt = Some(r);
                self.rttvar = r / 2;
            }
            Some(s) => {
                let diff = s.abs_diff(r);
                self.rttvar = self.rttvar.saturating_mul(3).saturating_add(diff) / 4;
                self.srtt = Some(s.saturating_mul(7).saturating_add(r) / 8);
            }
        }
        let srtt = self.srtt.unwrap_or(0);
        let var = self.rttvar.saturating_mul(4).max(GRANULARITY);
        self.base = srtt.saturating_add(var).saturating_add(self.ack_delay).clamp(self.min, self.max);
        // A fresh sample ends the backoff (Karn).
        self.backoff = 0;
    }

    /// The timer expired: double the timeout (up to the maximum).
    pub(crate) fn on_timeout(&mut self) {
        if self.base.saturating_mul(1 << self.backoff.min(30)) < self.max {
            self.backoff += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn first_sample_and_smoothing() {
        let mut r = RttEstimator::new(ms(10), ms(1), ms(500), Duration::ZERO);
        assert_eq!(r.rto(), ms(10));
        assert_eq!(r.srtt(), Duration::ZERO);
        r.sample(ms(4));
        // srtt = 4, rttvar = 2, rto = 4 + 4*2 = 12.
        assert_eq!(r.srtt(), ms(4));
        assert_eq!(r.rto(), ms(12));
        r.sample(ms(8));
        // rttvar = (3*2 + 4)/4 = 2.5, srtt = (7*4 + 8)/8 = 4.5, rto = 4.5 + 10 = 14.5.
        assert_eq!(r.srtt(), Duration::from_micros(4500));
        assert_eq!(r.rto(), Duration::from_micros(14500));
    }

    #[test]
    fn steady_rtt_converges_to_the_floor() {
        let mut r = RttEstimator::new(ms(10), ms(1), ms(500), Duration::from_micros(200));
        for _ in 0..200 {
            r.sample(Duration::from_micros(100));
        }
        // srtt 100 µs + granularity 100 µs + ack delay 200 µs, under the 1 ms minimum.
        assert_eq!(r.rto(), ms(1));
        for _ in 0..200 {
            r.sample(ms(3));
        }
        let rto = r.rto();
        assert!(rto > ms(3) && rto < ms(4), "{rto:?}");
    }

    #[test]
    fn backoff_doubles_up_to_the_cap_and_a_sample_resets_it() {
        let mut r = RttEstimator::new(ms(10), ms(1), ms(500), Duration::ZERO);
        let mut seen = vec![r.rto()];
        for _ in 0..10 {
            r.on_timeout();
            seen.push(r.rto());
        }
        assert_eq!(seen, [10, 20, 40, 80, 160, 320, 500, 500, 500, 500, 500].map(ms));
        // srtt 2 + 4 * rttvar 1.
        r.sample(ms(2));
        assert_eq!(r.rto(), ms(6));
    }

    #[test]
    fn huge_values_do_not_overflow() {
        let mut r = RttEstimator::new(Duration::MAX, Duration::ZERO, Duration::MAX, Duration::MAX);
        r.sample(Duration::MAX);
        r.sample(Duration::ZERO);
        for _ in 0..100 {
            r.on_timeout();
        }
        let _ = r.rto();
    }
}
