//! The session's clock reading: nanoseconds on the caller's monotonic
//! clock, from an epoch of the caller's choosing.
//!
//! A session adds a delay to the time and compares deadlines several
//! times for every packet it takes or sends.  On `std::time::Instant`
//! (seconds and nanoseconds) each such step normalises the pair; on one
//! `u64` it is an instruction or two.  smoltcp keeps a time type of its own
//! for the same reason.  Some 580 years of nanoseconds fit.

use std::time::Duration;

/// A point in time, `u64` nanoseconds from the caller's epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Time(u64);

impl Time {
    /// The time `ns` nanoseconds after the epoch.
    #[inline]
    pub const fn from_nanos(ns: u64) -> Time {
        Time(ns)
    }

    /// Nanoseconds since the epoch.
    #[inline]
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// `d` later, or `None` past the last representable time.
    #[inline]
    pub fn checked_add(self, d: Duration) -> Option<Time> {
        let n = d.as_secs().checked_mul(1_000_000_000)?.checked_add(u64::from(d.subsec_nanos()))?;
        self.0.checked_add(n).map(Time)
    }

    /// `ns` nanoseconds later, or `None` past the last representable time.
    #[inline]
    pub fn checked_add_nanos(self, ns: u64) -> Option<Time> {
        self.0.checked_add(ns).map(Time)
    }

    /// How long after `earlier` this is; zero if it is not later.
    #[inline]
    pub fn saturating_duration_since(self, earlier: Time) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

/// `d` in nanoseconds, at most `u64::MAX` (584 years).
pub(crate) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl std::ops::Add<Duration> for Time {
    type Output = Time;

    /// `d` later, at most the last representable time.
    #[inline]
    fn add(self, d: Duration) -> Time {
        self.checked_add(d).unwrap_or(Time(u64::MAX))
    }
}

impl std::ops::AddAssign<Duration> for Time {
    #[inline]
    fn add_assign(&mut self, d: Duration) {
        *self = *self + d;
    }
}

impl std::ops::Sub<Duration> for Time {
    type Output = Time;

    /// `d` earlier, at least the epoch.
    #[inline]
    fn sub(self, d: Duration) -> Time {
        Time(self.0.saturating_sub(nanos(d)))
    }
}

impl std::ops::Sub<Time> for Time {
    type Output = Duration;

    /// [`Time::saturating_duration_since`].
    #[inline]
    fn sub(self, earlier: Time) -> Duration {
        self.saturating_duration_since(earlier)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds_compares_and_subtracts_as_nanoseconds() {
        let t = Time::from_nanos(1_000);
        assert_eq!(t.checked_add(Duration::from_micros(2)), Some(Time::from_nanos(3_000)));
        assert_eq!((t + Duration::from_secs(1)).as_nanos(), 1_000_001_000);
        assert!(t < t + Duration::from_nanos(1));
        assert_eq!(Time::from_nanos(5_000) - t, Duration::from_nanos(4_000));
        assert_eq!(t - Time::from_nanos(5_000), Duration::ZERO);
        assert_eq!(Time::from_nanos(5_000) - Duration::from_nanos(4_000), t);
        assert_eq!(t - Duration::from_secs(1), Time::default());
        let mut u = t;
        u += Duration::from_nanos(7);
        assert_eq!(u.as_nanos(), 1_007);
        // Past the end: none, or the end.
        let late = Time::from_nanos(u64::MAX - 10);
        assert_eq!(late.checked_add(Duration::from_nanos(11)), None);
        assert_eq!(late.checked_add_nanos(10), Some(Time::from_nanos(u64::MAX)));
        assert_eq!(late.checked_add_nanos(11), None);
        assert_eq!(late + Duration::from_secs(1), Time::from_nanos(u64::MAX));
        assert_eq!(t.checked_add(Duration::MAX), None);
    }
}
