//! Round-trip time measurement and the retransmission timeout.
//!
//! Every ACK echoes the timestamp of the segment that triggered it, so every
//! ACK gives an exact sample, retransmissions included (no Karn ambiguity).
//! Two estimators:
//! - fine-grained (`tick` = 0): RFC 6298 §2 with `min_rto`/`max_rto` bounds;
//! - coarse (`tick` > 0): the clock is read in ticks, as BSD did, and the RTO
//!   follows Brakmo & Peterson §3.2's corrected fixed-point algorithm.
//!
//! A fixed `timeout` (atou's default behaviour) overrides both, though the
//! estimators still run so the summary can report srtt and rttvar.

use std::time::Duration;

use crate::proto::time::Time;
use crate::proto::tuning::Tuning;

/// RFC 6298 §2.1: the RTO before any sample.
const INITIAL_RTO: Duration = Duration::from_secs(1);

#[derive(Debug, Clone)]
enum Estimator {
    /// Nanoseconds.
    Fine { srtt: u64, rttvar: u64 },
    /// Brakmo §3.2: `sa` = 32·a and `sd` = 16·d, in ticks.
    Coarse { sa: i64, sd: i64, rto_ticks: u64 },
}

#[derive(Debug, Clone)]
pub struct RttEstimator {
    tick: Duration,
    fixed: Option<Duration>,
    min_rto: Duration,
    max_rto: Duration,
    estimator: Option<Estimator>,
    /// The RTO before the first sample: RFC 6298 §2.1's one second, or
    /// what a path memory suggests ([`RttEstimator::seed`]).
    initial_rto: Duration,
    /// Consecutive timeouts: the RTO doubles for each (RFC 6298 §5.5).
    backoff: u32,
    min: Duration,
    max: Duration,
    sum: Duration,
    samples: u64,
}

impl RttEstimator {
    pub fn new(t: &Tuning) -> RttEstimator {
        RttEstimator {
            tick: t.tick,
            fixed: (!t.timeout.is_zero()).then_some(t.timeout),
            min_rto: t.min_rto,
            max_rto: t.max_rto,
            estimator: None,
            initial_rto: INITIAL_RTO,
            backoff: 0,
            min: Duration::MAX,
            max: Duration::ZERO,
            sum: Duration::ZERO,
            samples: 0,
        }
    }

    /// Seeds the RTO used before the first sample from a path's saved
    /// `srtt` and `rttvar`, as Linux's `tcp_init_metrics` seeds it from its
    /// cached RTT: RFC 6298 §2.3's RTO = SRTT + max(G, K*RTTVAR), with
    /// RTTVAR at least SRTT/2, as a first sample would set it (§2.2), so it
    /// is never below three saved round trips (Linux: crtt + max(2 crtt,
    /// rto_min)). The first real sample replaces it (§2.2); the saved
    /// values are never taken as measurements.
    pub fn seed(&mut self, srtt: Duration, rttvar: Duration) {
        let rttvar = rttvar.max(srtt / 2);
        self.initial_rto = srtt + (4 * rttvar).max(Duration::from_millis(1));
    }

    fn ticks(&self, t: Time) -> u64 {
        t.as_nanos() / self.tick.as_nanos().max(1) as u64
    }

    /// Records the round trip of a segment sent at `now - rtt`.
    pub fn on_sample(&mut self, now: Time, rtt: Duration) {
        self.min = self.min.min(rtt);
        self.max = self.max.max(rtt);
        self.sum += rtt;
        self.samples += 1;
        if self.tick.is_zero() {
            let r = rtt.as_nanos() as u64;
            self.estimator = Some(match self.estimator {
                // RFC 6298 §2.2
                None => Estimator::Fine {
                    srtt: r,
                    rttvar: r / 2,
                },
                // RFC 6298 §2.3: beta = 1/4, alpha = 1/8
                Some(Estimator::Fine { srtt, rttvar }) => Estimator::Fine {
                    rttvar: (3 * rttvar + srtt.abs_diff(r)) / 4,
                    srtt: (7 * srtt + r) / 8,
                },
                Some(Estimator::Coarse { .. }) => unreachable!("tick is fixed at creation"),
            });
        } else {
            // The clock ticks every `tick`; the sample is how many ticks
            // passed between sending and the ACK, as BSD measured it.
            let sent = Time::from_nanos(now.as_nanos().saturating_sub(rtt.as_nanos() as u64));
            let m = (self.ticks(now) - self.ticks(sent)) as i64;
            self.estimator = Some(match self.estimator.take() {
                // RFC 6298 §2.2's first-sample rule in Brakmo's scaled units:
                // a = m, d = m/2.
                None => Estimator::Coarse {
                    sa: m << 5,
                    sd: m << 3,
                    rto_ticks: brakmo_rto(m, m << 5, m << 3),
                },
                Some(Estimator::Coarse { mut sa, mut sd, .. }) => {
                    // Brakmo §3.2, the corrected algorithm.
                    let mut sdelta = (m << 2) - (sa >> 3);
                    sa += sdelta;
                    if sdelta < 0 {
                        sdelta = -sdelta;
                    }
                    sdelta -= sd >> 2;
                    sd += sdelta;
                    Estimator::Coarse {
                        sa,
                        sd,
                        rto_ticks: brakmo_rto(m, sa, sd),
                    }
                }
                Some(Estimator::Fine { .. }) => unreachable!("tick is fixed at creation"),
            });
        }
    }

    /// The RTO in ticks of the coarse estimator, if it is in use and primed.
    pub fn rto_ticks(&self) -> Option<u64> {
        match self.estimator {
            Some(Estimator::Coarse { rto_ticks, .. }) => Some(rto_ticks),
            _ => None,
        }
    }

    /// The RTO without backoff.
    pub fn base_rto(&self) -> Duration {
        if let Some(fixed) = self.fixed {
            return fixed;
        }
        let rto = match &self.estimator {
            None => self.initial_rto,
            // RFC 6298 §2.3: RTO = SRTT + max(G, K*RTTVAR), with Linux's
            // floor under the variance term rather than under the sum
            // (tcp_set_rto: rttvar is at least rto_min), so the RTO stays
            // min_rto above SRTT. A sample on every ACK shrinks RTTVAR to
            // the jitter between neighbouring ACKs (Sarolahti & Kuznetsov
            // §4.1: "the RTT variance can decay to a small value when RTT
            // samples are taken for every segment"); behind a queue that
            // grows by more than that within a round trip, a retransmission
            // of snd_una came back after RFC 6298's RTO, which then resent
            // the whole flight though it had arrived (issue 29: half the
            // resends of two bbr streams beside a third flow at 1 % loss).
            Some(Estimator::Fine { srtt, rttvar }) => Duration::from_nanos(*srtt)
                .saturating_add(Duration::from_nanos(4 * rttvar).max(self.min_rto)),
            Some(Estimator::Coarse { rto_ticks, .. }) => self.tick * (*rto_ticks as u32),
        };
        rto.clamp(self.min_rto, self.max_rto)
    }

    /// The RTO including exponential backoff, capped at `max_rto`.
    pub fn rto(&self) -> Duration {
        let base = self.base_rto();
        base.checked_mul(1u32 << self.backoff.min(20))
            .unwrap_or(self.max_rto)
            .min(self.max_rto.max(base))
    }

    pub fn back_off(&mut self) {
        self.backoff = self.backoff.saturating_add(1);
    }

    pub fn reset_backoff(&mut self) {
        self.backoff = 0;
    }

    pub fn backoff(&self) -> u32 {
        self.backoff
    }

    /// When a timer of length `d` set at `now` fires. With a coarse clock it
    /// fires on a tick, after `ceil(d / tick)` ticks have been counted.
    pub fn deadline(&self, now: Time, d: Duration) -> Time {
        if self.tick.is_zero() {
            return now + d;
        }
        let tick = self.tick.as_nanos() as u64;
        let n = (d.as_nanos() as u64).div_ceil(tick).max(1);
        Time::from_nanos((self.ticks(now) + n).saturating_mul(tick))
    }

    pub fn srtt(&self) -> Duration {
        match self.estimator {
            None => Duration::ZERO,
            Some(Estimator::Fine { srtt, .. }) => Duration::from_nanos(srtt),
            Some(Estimator::Coarse { sa, .. }) => self.tick.mul_f64(sa.max(0) as f64 / 32.0),
        }
    }

    pub fn rttvar(&self) -> Duration {
        match self.estimator {
            None => Duration::ZERO,
            Some(Estimator::Fine { rttvar, .. }) => Duration::from_nanos(rttvar),
            Some(Estimator::Coarse { sd, .. }) => self.tick.mul_f64(sd.max(0) as f64 / 16.0),
        }
    }

    pub fn min(&self) -> Duration {
        if self.samples == 0 {
            Duration::ZERO
        } else {
            self.min
        }
    }

    pub fn max(&self) -> Duration {
        self.max
    }

    pub fn avg(&self) -> Duration {
        if self.samples == 0 {
            Duration::ZERO
        } else {
            self.sum / u32::try_from(self.samples).unwrap_or(u32::MAX)
        }
    }
}

/// Brakmo §3.2: `rto = max(m + 2, ((sa >> 3) + sd) >> 2)` ticks. The `m + 2`
/// keeps the RTO at least two ticks above what a tick-rounded RTT can hide.
fn brakmo_rto(m: i64, sa: i64, sd: i64) -> u64 {
    (m + 2).max(((sa >> 3) + sd) >> 2).max(0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fine() -> RttEstimator {
        RttEstimator::new(&Tuning {
            min_rto: Duration::from_millis(1),
            ..Tuning::default()
        })
    }

    #[test]
    fn rfc6298_first_and_second_sample() {
        let mut e = fine();
        assert_eq!(e.base_rto(), INITIAL_RTO);
        e.on_sample(Time::ZERO, Duration::from_millis(100));
        assert_eq!(e.srtt(), Duration::from_millis(100));
        assert_eq!(e.rttvar(), Duration::from_millis(50));
        assert_eq!(e.base_rto(), Duration::from_millis(300));
        e.on_sample(Time::ZERO, Duration::from_millis(200));
        // rttvar = 3/4*50 + 1/4*100 = 62.5; srtt = 7/8*100 + 1/8*200 = 112.5
        assert_eq!(e.rttvar(), Duration::from_micros(62_500));
        assert_eq!(e.srtt(), Duration::from_micros(112_500));
        assert_eq!(e.base_rto(), Duration::from_micros(362_500));
    }

    #[test]
    fn a_seed_sets_the_first_rto_and_the_first_sample_replaces_it() {
        let mut e = fine();
        e.seed(Duration::from_millis(100), Duration::from_millis(5));
        // rttvar is raised to srtt/2: 100 + 4 * 50.
        assert_eq!(e.base_rto(), Duration::from_millis(300));
        assert_eq!(e.srtt(), Duration::ZERO, "a hint is not a sample");
        e.on_sample(Time::ZERO, Duration::from_millis(20));
        assert_eq!(e.base_rto(), Duration::from_millis(60));
        let mut far = fine();
        far.seed(Duration::from_secs(2), Duration::from_millis(100));
        assert_eq!(
            far.base_rto(),
            Duration::from_secs(6),
            "longer than 1 s too"
        );
    }

    #[test]
    fn rto_is_bounded_and_backs_off() {
        let mut e = RttEstimator::new(&Tuning::default());
        e.on_sample(Time::ZERO, Duration::from_millis(10));
        // srtt 10 ms, 4 × rttvar 20 ms: min_rto floors the variance term.
        assert_eq!(e.rto(), Duration::from_millis(210), "min_rto applies");
        e.back_off();
        e.back_off();
        assert_eq!(e.rto(), Duration::from_millis(840));
        for _ in 0..30 {
            e.back_off();
        }
        assert_eq!(e.rto(), Duration::from_secs(60), "max_rto caps the backoff");
        e.reset_backoff();
        assert_eq!(e.rto(), Duration::from_millis(210));
    }

    /// Samples on every ACK behind a steady queue leave RTTVAR at the
    /// ACKs' jitter; the RTO must still leave `min_rto` for a queue that
    /// grows within the round trip (Sarolahti & Kuznetsov §4.1).
    #[test]
    fn per_ack_samples_leave_the_rto_min_rto_above_srtt() {
        let mut e = RttEstimator::new(&Tuning::default());
        for i in 0..1000u64 {
            e.on_sample(Time::ZERO, Duration::from_micros(200_000 + i % 2));
        }
        assert!(e.rttvar() < Duration::from_millis(1), "{:?}", e.rttvar());
        assert!(
            e.rto() >= e.srtt() + Duration::from_millis(200),
            "rto {:?} srtt {:?}",
            e.rto(),
            e.srtt()
        );
    }

    #[test]
    fn fixed_timeout_overrides_the_estimate() {
        let mut e = RttEstimator::new(&Tuning {
            timeout: Duration::from_millis(500),
            ..Tuning::default()
        });
        e.on_sample(Time::ZERO, Duration::from_millis(10));
        assert_eq!(e.rto(), Duration::from_millis(500));
        assert_eq!(e.srtt(), Duration::from_millis(10));
    }

    #[test]
    fn coarse_timers_fire_on_ticks() {
        let e = RttEstimator::new(&Tuning {
            tick: Duration::from_millis(500),
            ..Tuning::default()
        });
        // Set 0.7 s into a 0.5 s-tick clock, a 1.2 s timer counts three
        // ticks (at 1.0, 1.5 and 2.0 s) and fires on the third.
        let at = e.deadline(Time::from_secs_f64(0.7), Duration::from_millis(1200));
        assert_eq!(at, Time::from_secs_f64(2.0));
    }
}
