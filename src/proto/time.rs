//! Time as the protocol sees it: a point on a caller-supplied clock.
//!
//! The sans-IO core never reads a clock. The simulator passes virtual time,
//! the I/O layer passes `Instant::elapsed()` since the connection started;
//! both become a [`Time`], nanoseconds since an arbitrary epoch.

use std::fmt;
use std::ops::{Add, AddAssign, Sub};
use std::time::Duration;

/// A point in time, in nanoseconds since the caller's epoch.
#[derive(Copy, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Time(u64);

impl Time {
    /// The epoch itself.
    pub const ZERO: Time = Time(0);

    /// `nanos` nanoseconds after the epoch.
    pub const fn from_nanos(nanos: u64) -> Time {
        Time(nanos)
    }

    /// `secs` seconds after the epoch, rounded to the nanosecond; a
    /// negative value is the epoch.
    #[cfg(test)]
    pub(crate) fn from_secs_f64(secs: f64) -> Time {
        Time((secs * 1e9).round().max(0.0) as u64)
    }

    /// Nanoseconds since the epoch.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Seconds since the epoch.
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1e9
    }

    /// The low 32 bits of the time in microseconds: what a data segment
    /// carries and an ACK echoes. Wraps every 71 minutes, which is harmless
    /// because only differences shorter than that are ever taken.
    pub(crate) fn wire_micros(self) -> u32 {
        (self.0 / 1_000) as u32
    }

    /// Elapsed time since `earlier`, or zero if `earlier` is later.
    pub fn saturating_since(self, earlier: Time) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl Add<Duration> for Time {
    type Output = Time;
    fn add(self, rhs: Duration) -> Time {
        Time(
            self.0
                .saturating_add(u64::try_from(rhs.as_nanos()).unwrap_or(u64::MAX)),
        )
    }
}

impl AddAssign<Duration> for Time {
    fn add_assign(&mut self, rhs: Duration) {
        *self = *self + rhs;
    }
}

impl Sub<Time> for Time {
    type Output = Duration;
    fn sub(self, rhs: Time) -> Duration {
        self.saturating_since(rhs)
    }
}

impl fmt::Debug for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.6}s", self.as_secs_f64())
    }
}

impl fmt::Display for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.6}", self.as_secs_f64())
    }
}

/// Duration between two 32-bit wire timestamps (microseconds, wrapping).
pub(crate) fn wire_elapsed(now: u32, then: u32) -> Duration {
    Duration::from_micros(u64::from(now.wrapping_sub(then)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_timestamps_survive_wraparound() {
        let before = Time::from_nanos((u64::from(u32::MAX) - 10) * 1_000);
        let after = before + Duration::from_micros(25);
        assert_eq!(
            wire_elapsed(after.wire_micros(), before.wire_micros()),
            Duration::from_micros(25)
        );
    }

    #[test]
    fn subtraction_saturates() {
        let a = Time::from_nanos(5);
        let b = Time::from_nanos(9);
        assert_eq!(a - b, Duration::ZERO);
        assert_eq!(b - a, Duration::from_nanos(4));
    }
}
