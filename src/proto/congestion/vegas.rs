//! TCP Vegas (Brakmo, O'Malley & Peterson, SIGCOMM '94; the BSD 4.4 paper
//! in ../shared/papers compares it with Reno): congestion avoidance that
//! watches the RTT instead of waiting for a loss.
//!
//! Once per round trip, with BaseRTT the least RTT seen and RTT the mean
//! of this round's samples (Vegas times one segment per round trip;
//! Linux's tcp_vegas takes the least, which in slow start's bursts is the
//! first segment's, before the burst queues, and never ends slow start
//! on the Brakmo path):
//!
//! `Diff = (Expected − Actual) × BaseRTT = cwnd × (1 − BaseRTT / RTT)`,
//!
//! the segments this flow keeps queued at the bottleneck. Below `alpha`
//! cwnd grows by one, above `beta` it shrinks by one, between them it
//! stays. Slow start doubles the window only every other round trip, so
//! that Diff is measured on a window that is not changing, and ends as
//! soon as Diff exceeds `gamma`, with cwnd brought down to what the path
//! carries (Expected × RTT, plus one). Losses are repaired and answered
//! as Reno answers them (ssthresh = half the window, the recovery
//! variant's reduction), as Linux's tcp_vegas does; a timeout leaves one
//! segment and slow start.

use std::time::Duration;

use super::reduction::Reduction;
use super::{reduction_base, AckEvent, CongestionEvent, Controller, RecoveryStep};
use crate::proto::time::Time;
use crate::proto::tuning::{CcKind, Tuning};

#[derive(Debug)]
pub(crate) struct Vegas {
    cwnd: u64,
    ssthresh: u64,
    alpha: f64,
    beta: f64,
    gamma: f64,
    /// The least RTT seen: the path without this flow's queue.
    base_rtt: Option<Duration>,
    /// The sum and count of the current round trip's RTT samples.
    round_rtt: (Duration, u32),
    /// The round ends when snd_una passes this.
    round_end: u64,
    /// Slow start grows in every other round trip (Vegas §3.3).
    grow_this_round: bool,
    reduction: Reduction,
    cap: u64,
}

impl Vegas {
    pub(crate) fn new(t: &Tuning) -> Vegas {
        Vegas {
            cwnd: u64::from(t.initsegs),
            ssthresh: t.initial_ssthresh(),
            alpha: t.vegas_alpha,
            beta: t.vegas_beta,
            gamma: t.vegas_gamma,
            base_rtt: None,
            round_rtt: (Duration::ZERO, 0),
            round_end: 0,
            grow_this_round: true,
            reduction: Reduction::for_tuning(t),
            cap: u64::from(t.rcvwin),
        }
    }

    /// Diff, in segments, for the round that just ended.
    fn diff(&self) -> Option<(f64, Duration, Duration)> {
        let (sum, n) = self.round_rtt;
        let base = self.base_rtt?;
        let rtt = (n > 0).then(|| sum / n)?;
        let queued = self.cwnd as f64 * (1.0 - base.as_secs_f64() / rtt.as_secs_f64());
        Some((queued, base, rtt))
    }

    /// Vegas §3.2–3.3, at the end of each round trip.
    fn on_round_end(&mut self) {
        let Some((diff, base, rtt)) = self.diff() else {
            return;
        };
        if self.cwnd < self.ssthresh {
            if diff > self.gamma {
                // Leave slow start at what the path carries: Expected ×
                // RTT is cwnd × BaseRTT / RTT (Linux's target_cwnd).
                let target = (self.cwnd as f64 * base.as_secs_f64() / rtt.as_secs_f64()) as u64;
                self.cwnd = self.cwnd.min(target + 1).max(2);
                self.ssthresh = self.cwnd;
            } else {
                self.grow_this_round = !self.grow_this_round;
            }
        } else if diff < self.alpha {
            self.cwnd += 1;
        } else if diff > self.beta {
            self.cwnd = (self.cwnd - 1).max(2);
        }
        self.cwnd = self.cwnd.min(self.cap);
    }
}

impl Controller for Vegas {
    fn kind(&self) -> CcKind {
        CcKind::Vegas
    }

    fn on_ack(&mut self, ack: &AckEvent) {
        if let Some(rtt) = ack.rtt {
            self.base_rtt = Some(self.base_rtt.map_or(rtt, |b| b.min(rtt)));
            self.round_rtt.0 += rtt;
            self.round_rtt.1 += 1;
        }
        match ack.recovery {
            RecoveryStep::During => {
                self.cwnd = self.reduction.on_ack(self.cwnd, self.ssthresh, ack);
                return;
            }
            RecoveryStep::Entered => {
                self.cwnd = self
                    .reduction
                    .on_entering_ack(self.cwnd, self.ssthresh, ack);
                return;
            }
            RecoveryStep::Left | RecoveryStep::Outside => {}
        }
        if ack.snd_una >= self.round_end {
            self.on_round_end();
            self.round_end = ack.snd_max;
            self.round_rtt = (Duration::ZERO, 0);
        }
        if self.cwnd < self.ssthresh && self.grow_this_round && self.cwnd < self.cap {
            // Slow start, in the rounds that grow: one per segment.
            self.cwnd = (self.cwnd + ack.newly_delivered).min(self.ssthresh.max(2));
        }
        self.cwnd = self.cwnd.min(self.cap);
    }

    /// Reno's answer to a loss (Linux's tcp_vegas: tcp_reno_ssthresh).
    fn on_congestion_event(&mut self, event: &CongestionEvent) {
        self.ssthresh = (reduction_base(event.flight, self.cwnd) / 2).max(2);
        self.cwnd = self.reduction.start(self.cwnd, self.ssthresh, event);
    }

    fn on_recovery_end(&mut self, _now: Time) {
        self.cwnd = self.ssthresh;
    }

    fn on_rto(&mut self, _now: Time, flight: u64, first: bool) {
        if first {
            self.ssthresh = (reduction_base(flight, self.cwnd) / 2).max(2);
        }
        self.cwnd = 1;
        self.grow_this_round = true;
    }

    fn window(&self) -> u64 {
        self.cwnd
    }

    fn ssthresh(&self) -> Option<u64> {
        Some(self.ssthresh)
    }
}
