//! Pacing: a token bucket that spreads transmissions at the controller's
//! rate.
//!
//! Tokens are bytes and accrue at the pacing rate up to a quantum: the
//! larger of two full datagrams and what the rate sends in
//! [`PACING_QUANTUM`]. A datagram may go when a full datagram's worth of
//! tokens is there, so the sender transmits a quantum in a burst after a
//! pause, then one datagram per `size / rate`. The simulator wakes the
//! sender at exactly the time [`Pacer::earliest`] gives; a real driver,
//! whose timers have millisecond resolution, wakes up to a millisecond
//! later and finds a quantum of tokens to spend (Linux fq's quantum, BBR's
//! send quantum; draft-ietf-ccwg-bbr "Pacing Rate").
//!
//! Integer arithmetic throughout: credit is kept in byte-nanoseconds, so a
//! run replays exactly.

use std::time::Duration;

use crate::proto::time::Time;

/// The time whose worth of sending a pacer may release in one burst:
/// the resolution of the I/O driver's timers.
pub(crate) const PACING_QUANTUM: Duration = Duration::from_millis(1);

/// How late past the time the pacer asked for a wake-up may come and
/// still be made up: tokio rounds a sleep up to its next millisecond tick,
/// and the poll that waits for it rounds to milliseconds again (measured
/// on a bridge at 100 Mbit/s: median 0.17 ms, 90th percentile 1.0 ms,
/// 99th 2.0 ms, none above 2.04 ms).
pub(crate) const MAX_WAKE_LATENESS: Duration = Duration::from_millis(2);

const NANOS_PER_SEC: u128 = 1_000_000_000;

#[derive(Debug, Clone)]
pub(crate) struct Pacer {
    /// Bytes of sending credit, times 10^9 (byte-nanoseconds per second).
    credit: u128,
    /// When `credit` was last brought up to date.
    updated: Time,
    /// Bytes per second the credit was last accruing at.
    rate: u64,
    /// The largest datagram, in bytes.
    mss: u64,
    /// When the sender asked to be woken to send, if it is waiting on the
    /// pacer.
    wake: Option<Time>,
    /// Credit a late wake-up is owed above the quantum, until spent.
    make_up: u128,
}

impl Pacer {
    /// A pacer for datagrams of at most `mss` bytes, starting with a full
    /// quantum (the initial window goes out at once, as unpaced).
    pub(crate) fn new(mss: u64, now: Time) -> Pacer {
        Pacer {
            credit: u128::MAX,
            updated: now,
            rate: 0,
            mss,
            wake: None,
            make_up: 0,
        }
    }

    /// The most credit the bucket holds at `rate`, in byte-nanoseconds.
    fn capacity(&self, rate: u64) -> u128 {
        let quantum = u128::from(rate) * PACING_QUANTUM.as_nanos() / NANOS_PER_SEC;
        quantum.max(2 * u128::from(self.mss)) * NANOS_PER_SEC
    }

    /// Brings the credit up to `now` at `rate` bytes per second. A wake-up
    /// that came later than asked keeps what accrued while it was late,
    /// up to [`MAX_WAKE_LATENESS`], on top of the quantum: the datagrams
    /// that would have gone had the timer been on time go now, so a driver
    /// with millisecond timers sends at the pacing rate and not below it
    /// (Linux fq makes up its timers' drift the same way, `fq_dequeue`).
    /// The simulator wakes on time: nothing changes there.
    fn refill(&mut self, now: Time, rate: u64) {
        let elapsed = u128::from(now.as_nanos().saturating_sub(self.updated.as_nanos()));
        if let Some(wake) = self.wake.filter(|&wake| now >= wake) {
            self.wake = None;
            let late = now.saturating_since(wake).min(MAX_WAKE_LATENESS);
            self.make_up = late.as_nanos() * u128::from(rate);
        }
        self.credit = self
            .credit
            .saturating_add(elapsed * u128::from(rate))
            .min(self.capacity(rate).saturating_add(self.make_up));
        self.updated = self.updated.max(now);
        self.rate = rate;
    }

    /// The earliest time a datagram of `mss` bytes may go at `rate` bytes
    /// per second: `now` or later.
    pub(crate) fn earliest(&mut self, now: Time, rate: u64) -> Time {
        self.refill(now, rate);
        let need = u128::from(self.mss) * NANOS_PER_SEC;
        if self.credit >= need || rate == 0 {
            return now;
        }
        let wait = (need - self.credit).div_ceil(u128::from(rate));
        now + Duration::from_nanos(u64::try_from(wait).unwrap_or(u64::MAX))
    }

    /// The sender waits for the pacer until `at` (or, with `None`, no
    /// longer waits on it).
    pub(crate) fn wait_until(&mut self, at: Option<Time>) {
        self.wake = at;
        if at.is_some() {
            self.make_up = 0;
        }
    }

    /// A datagram of `len` bytes went out at `now`.
    pub(crate) fn on_sent(&mut self, now: Time, rate: u64, len: u64) {
        self.refill(now, rate);
        let spent = u128::from(len) * NANOS_PER_SEC;
        self.credit = self.credit.saturating_sub(spent);
        self.make_up = self.make_up.saturating_sub(spent);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MSS: u64 = 1000;

    fn at_us(us: u64) -> Time {
        Time::from_nanos(us * 1_000)
    }

    /// Sends as soon as the pacer lets it, from `from` until `until`;
    /// returns the send times.
    fn drain(p: &mut Pacer, rate: u64, from: Time, until: Time) -> Vec<Time> {
        let mut now = from;
        let mut sent = Vec::new();
        loop {
            now = p.earliest(now, rate);
            if now > until {
                return sent;
            }
            p.on_sent(now, rate, MSS);
            sent.push(now);
        }
    }

    /// After the first quantum, datagrams leave exactly `mss / rate` apart,
    /// and over a long run the average rate is the pacing rate.
    #[test]
    fn datagrams_leave_at_the_pacing_rate() {
        let rate = 10_000_000; // 10 MB/s: a 1000-byte datagram per 100 µs
        let mut p = Pacer::new(MSS, Time::ZERO);
        let sent = drain(&mut p, rate, Time::ZERO, at_us(1_000_000));
        // A quantum: 1 ms at 10 MB/s is 10 kB, ten datagrams at once.
        assert_eq!(sent.iter().filter(|&&t| t == Time::ZERO).count(), 10);
        for w in sent[10..].windows(2) {
            assert_eq!(w[1].saturating_since(w[0]), Duration::from_micros(100));
        }
        // One second: the quantum plus 10^4 spaced sends.
        assert_eq!(sent.len(), 10 + 10_000);
    }

    /// An idle pacer banks at most a quantum: a pause does not buy a burst
    /// beyond it.
    #[test]
    fn an_idle_pause_buys_at_most_a_quantum() {
        let rate = 1_000_000; // 1 MB/s: 1 ms is 1 kB, less than two datagrams
        let mut p = Pacer::new(MSS, Time::ZERO);
        drain(&mut p, rate, Time::ZERO, at_us(10_000));
        let burst = drain(&mut p, rate, at_us(5_000_000), at_us(5_000_000));
        assert_eq!(burst.len(), 2, "two datagrams, the floor of a quantum");
    }

    /// A driver that wakes late (a millisecond timer) finds the tokens that
    /// accrued meanwhile, up to a quantum, and sends them in one burst.
    #[test]
    fn a_late_wakeup_sends_what_accrued() {
        let rate = 100_000_000; // 100 MB/s: 100 datagrams per ms
        let mut p = Pacer::new(MSS, Time::ZERO);
        drain(&mut p, rate, Time::ZERO, Time::ZERO);
        let next = p.earliest(Time::ZERO, rate);
        assert_eq!(next, at_us(10));
        let late = drain(&mut p, rate, at_us(1_000), at_us(1_000));
        assert_eq!(late.len(), 100);
    }

    /// A driver whose timer fires later than the pacer asked sends the
    /// datagrams it owed, up to MAX_WAKE_LATENESS more than a quantum;
    /// without a wake-up asked for, a pause still buys a quantum only.
    #[test]
    fn a_late_timer_makes_up_what_it_owed() {
        let rate = 10_000_000; // 10 MB/s: a 1000-byte datagram per 100 µs
        let mut p = Pacer::new(MSS, Time::ZERO);
        drain(&mut p, rate, Time::ZERO, Time::ZERO);
        let at = p.earliest(Time::ZERO, rate);
        assert_eq!(at, at_us(100));
        p.wait_until(Some(at));
        // 1.5 ms late: 1.6 ms of credit, a quantum (1 ms) and 0.6 ms of
        // lateness made up, where the quantum alone allowed ten.
        let burst = drain(&mut p, rate, at_us(1_600), at_us(1_600));
        assert_eq!(burst.len(), 16);
        // 5 ms late: made up to MAX_WAKE_LATENESS (2 ms) and the quantum.
        let at = p.earliest(at_us(1_600), rate);
        p.wait_until(Some(at));
        let burst = drain(
            &mut p,
            rate,
            at + Duration::from_millis(5),
            at + Duration::from_millis(5),
        );
        assert_eq!(burst.len(), 30);
        // Not waiting on the pacer: a pause buys a quantum.
        p.wait_until(None);
        let burst = drain(&mut p, rate, at_us(100_000), at_us(100_000));
        assert_eq!(burst.len(), 10);
    }
}
