//! CUBIC (RFC 9438), with HyStart++ (RFC 9406) as its slow start, paced.
//!
//! Windows are in segments and time in seconds, as in the RFC's figures.
//! After a congestion event the window follows
//!
//! `W_cubic(t) = C·(t − K)³ + W_max`, `K = ∛((W_max − cwnd_epoch) / C)`
//!
//! from the start of congestion avoidance: concave up to the window of the
//! last congestion event, flat around it, convex beyond. β = 0.7 and
//! C = 0.4 (RFC 9438 §5.1, §4.6); fast convergence is on (§4.7).
//!
//! Pacing, as Linux paces every controller under the fq qdisc: cwnd per
//! smoothed RTT, times 2 in slow start and 1.2 in congestion avoidance.
//! HyStart++'s limit L on slow-start growth per ACK is then unbounded
//! (RFC 9406 §4.2). The initial window is `initsegs`; atou's AIMD knobs
//! (`multiplier`, `increment`, `vmss`, `thresh_init`) do not apply.

use std::time::Duration;

use super::reduction::Reduction;
use super::{reduction_base, AckEvent, CongestionEvent, Controller, RecoveryStep};
use crate::proto::path_memory::PathMemory;
use crate::proto::time::Time;
use crate::proto::tuning::{CcKind, Tuning};

/// RFC 9438 §5.1: C, in segments per second cubed.
const C: f64 = 0.4;
/// RFC 9438 §4.6: β_cubic, the multiplicative decrease factor.
const BETA: f64 = 0.7;
/// Linux's pacing ratios (tcp_pacing_ss_ratio, tcp_pacing_ca_ratio).
const PACING_GAIN_SS: f64 = 2.0;
const PACING_GAIN_CA: f64 = 1.2;

/// RFC 9438 §4.3: α_cubic = 3(1 − β) / (1 + β), the Reno-friendly
/// increase while W_est is below W_max.
fn alpha_cubic() -> f64 {
    3.0 * (1.0 - BETA) / (1.0 + BETA)
}

/// RFC 9406 §4.3 constants.
const MIN_RTT_THRESH: Duration = Duration::from_millis(4);
const MAX_RTT_THRESH: Duration = Duration::from_millis(16);
const MIN_RTT_DIVISOR: u32 = 8;
const N_RTT_SAMPLE: u32 = 8;
const CSS_GROWTH_DIVISOR: f64 = 4.0;
const CSS_ROUNDS: u32 = 5;

/// Where slow start stands (RFC 9406).
#[derive(Debug, Clone, Copy, PartialEq)]
enum SlowStart {
    /// Standard slow start.
    Standard,
    /// Conservative slow start, after an RTT increase at `baseline`.
    Conservative { baseline: Duration, rounds: u32 },
    /// Left: congestion avoidance from now on.
    Done,
}

/// RFC 9406 §4.2: round-trip accounting for HyStart++.
#[derive(Debug, Clone)]
struct HyStart {
    phase: SlowStart,
    /// The round ends when snd_una passes this (windowEnd).
    window_end: u64,
    last_round_min: Option<Duration>,
    current_round_min: Option<Duration>,
    samples: u32,
}

/// What HyStart++ decided on an ACK.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Growth {
    /// Grow by this many segments (fractional in CSS).
    By(f64),
    /// Conservative slow start is over: ssthresh = cwnd.
    Exit,
}

impl HyStart {
    fn new() -> HyStart {
        HyStart {
            phase: SlowStart::Standard,
            window_end: 0,
            last_round_min: None,
            current_round_min: None,
            samples: 0,
        }
    }

    /// RFC 9406 §4.2, for an ACK of `acked` segments in slow start.
    fn on_ack(&mut self, acked: u64, rtt: Option<Duration>, snd_una: u64, snd_max: u64) -> Growth {
        // A round ends once everything sent before it began is acknowledged.
        if snd_una >= self.window_end {
            self.new_round(snd_max);
            if let SlowStart::Conservative { rounds, .. } = &mut self.phase {
                *rounds += 1;
                if *rounds >= CSS_ROUNDS {
                    self.phase = SlowStart::Done;
                    return Growth::Exit;
                }
            }
        }
        if let Some(rtt) = rtt {
            self.current_round_min = Some(self.current_round_min.map_or(rtt, |m| m.min(rtt)));
            self.samples += 1;
        }
        let enough = self.samples >= N_RTT_SAMPLE;
        match self.phase {
            SlowStart::Standard => {
                if let (true, Some(cur), Some(last)) =
                    (enough, self.current_round_min, self.last_round_min)
                {
                    // RttThresh = clamp(lastRoundMinRTT / 8, 4 ms, 16 ms).
                    let thresh = (last / MIN_RTT_DIVISOR).clamp(MIN_RTT_THRESH, MAX_RTT_THRESH);
                    if cur >= last + thresh {
                        self.phase = SlowStart::Conservative {
                            baseline: cur,
                            rounds: 0,
                        };
                    }
                }
            }
            SlowStart::Conservative { baseline, .. } => {
                // A lower RTT than the baseline: the exit was spurious,
                // resume standard slow start.
                if enough && self.current_round_min.is_some_and(|m| m < baseline) {
                    self.phase = SlowStart::Standard;
                }
            }
            SlowStart::Done => {}
        }
        // L is unbounded: CUBIC is paced.
        match self.phase {
            SlowStart::Conservative { .. } => Growth::By(acked as f64 / CSS_GROWTH_DIVISOR),
            SlowStart::Standard | SlowStart::Done => Growth::By(acked as f64),
        }
    }

    /// RFC 9406 §4.2: at the start of each round.
    fn new_round(&mut self, snd_max: u64) {
        self.window_end = snd_max;
        self.last_round_min = self.current_round_min.take();
        self.samples = 0;
    }

    /// Loss ends slow start, standard or conservative (RFC 9406 §4.2).
    fn on_congestion(&mut self) {
        self.phase = SlowStart::Done;
    }
}

/// The current congestion-avoidance stage (RFC 9438 §4.2).
#[derive(Debug, Clone, Copy)]
struct Epoch {
    /// t = 0 of W_cubic(t).
    start: Time,
    /// K, in seconds.
    k: f64,
}

#[derive(Debug)]
pub(crate) struct Cubic {
    cwnd: u64,
    /// Growth not yet a whole segment.
    credit: f64,
    ssthresh: u64,
    /// W_max: the window before the last reduction, less with fast
    /// convergence (RFC 9438 §4.7); zero before any.
    w_max: f64,
    /// RFC 9438 §4.3: the Reno-friendly estimate.
    w_est: f64,
    epoch: Option<Epoch>,
    /// The last reduction was a timeout (RFC 9438 §4.8).
    after_rto: bool,
    hystart: HyStart,
    reduction: Reduction,
    /// The sender window: cwnd never grows beyond it.
    cap: u64,
    mss: u64,
    srtt: Duration,
    last_ack: Time,
    /// The state before the last reduction, for `undo` (RFC 9438 §4.9).
    prior: Option<Prior>,
}

/// RFC 9438 §4.9: what a spurious congestion event restores.
#[derive(Debug, Clone, Copy)]
struct Prior {
    cwnd: u64,
    ssthresh: u64,
    w_max: f64,
    w_est: f64,
    epoch: Option<Epoch>,
    after_rto: bool,
}

impl Cubic {
    fn save_prior(&mut self) {
        self.prior = Some(Prior {
            cwnd: self.cwnd,
            ssthresh: self.ssthresh,
            w_max: self.w_max,
            w_est: self.w_est,
            epoch: self.epoch,
            after_rto: self.after_rto,
        });
    }

    pub(crate) fn new(t: &Tuning) -> Cubic {
        Cubic {
            cwnd: u64::from(t.initsegs),
            credit: 0.0,
            ssthresh: u64::MAX,
            w_max: 0.0,
            w_est: 0.0,
            epoch: None,
            after_rto: false,
            hystart: HyStart::new(),
            reduction: Reduction::for_tuning(t),
            cap: u64::from(t.rcvwin),
            mss: u64::from(t.mss),
            srtt: Duration::ZERO,
            last_ack: Time::ZERO,
            prior: None,
        }
    }

    /// RFC 9438 §4.1, Figure 1.
    fn w_cubic(&self, k: f64, t: f64) -> f64 {
        C * (t - k).powi(3) + self.w_max
    }

    /// Adds `by` segments, whole ones to cwnd and the rest as credit.
    fn add(&mut self, by: f64) {
        self.credit += by.max(0.0);
        let whole = self.credit.floor();
        self.cwnd = self.cwnd.saturating_add(whole as u64);
        self.credit -= whole;
    }

    fn slow_start(&mut self, ack: &AckEvent) {
        match self
            .hystart
            .on_ack(ack.newly_delivered, ack.rtt, ack.snd_una, ack.snd_max)
        {
            // RFC 5681 §3.1: slow start ends at ssthresh.
            Growth::By(n) => {
                self.add(n);
                self.cwnd = self.cwnd.min(self.ssthresh);
            }
            // RFC 9406 §4.2: enter congestion avoidance at this window.
            Growth::Exit => self.ssthresh = self.cwnd,
        }
    }

    /// Linux's tcp_is_cwnd_limited in slow start: the window is in use
    /// while it is less than twice what was in flight before this ACK.
    /// The delivery-rate sampler's application-limited mark lasts until a
    /// pipe's worth from when it was set is delivered; after a timeout
    /// (cwnd 1, one retransmission per round trip) that is one segment per
    /// round trip, and a mark set while the receiver's window was full
    /// held cwnd at 1 for 150 s on the bridge. A window that small is in
    /// use whatever the mark says.
    fn slow_start_filled(&self, ack: &AckEvent) -> bool {
        self.cwnd < self.ssthresh && self.cwnd < 2 * (ack.pipe + ack.newly_delivered)
    }

    /// RFC 9438 §4.2–4.5: one ACK in congestion avoidance.
    fn avoid_congestion(&mut self, now: Time, acked: u64) {
        let cwnd = self.cwnd as f64;
        let epoch = match self.epoch {
            Some(e) => e,
            None => {
                // A new congestion-avoidance stage. After a timeout, or
                // without a congestion event (HyStart++ left slow start),
                // W_max is where the stage starts and K = 0 (§4.8, §4.10).
                if self.after_rto || self.w_max == 0.0 {
                    self.w_max = cwnd;
                    self.after_rto = false;
                }
                // §4.2, Figure 2.
                let k = ((self.w_max - cwnd).max(0.0) / C).cbrt();
                self.w_est = cwnd;
                self.credit = 0.0;
                *self.epoch.insert(Epoch { start: now, k })
            }
        };
        let t = now.saturating_since(epoch.start).as_secs_f64();
        let rtt = self.srtt.as_secs_f64();
        // §4.3: W_est grows as Reno's would with the same β.
        let alpha = if self.w_est >= self.w_max {
            1.0
        } else {
            alpha_cubic()
        };
        self.w_est += alpha * acked as f64 / cwnd;
        if self.w_cubic(epoch.k, t) < self.w_est {
            // §4.3: the Reno-friendly region.
            self.cwnd = self.cwnd.max(self.w_est as u64);
        } else {
            // §4.4, §4.5: toward W_cubic one RTT ahead, at most 1.5 cwnd.
            let target = self.w_cubic(epoch.k, t + rtt).clamp(cwnd, 1.5 * cwnd);
            self.add((target - cwnd) / cwnd * acked as f64);
        }
    }
}

impl Controller for Cubic {
    fn kind(&self) -> CcKind {
        CcKind::Cubic
    }

    /// Linux's tcp_init_metrics: a saved ssthresh ends slow start where
    /// the last connection found the path full (HyStart++ may end it
    /// sooner).
    fn use_path_memory(&mut self, memory: &PathMemory) {
        if let Some(saved) = memory.ssthresh_segments(self.mss as u32) {
            self.ssthresh = saved;
        }
    }

    fn on_ack(&mut self, ack: &AckEvent) {
        if !ack.srtt.is_zero() {
            self.srtt = ack.srtt;
        }
        match ack.recovery {
            RecoveryStep::During => {
                self.cwnd = self.reduction.on_ack(self.cwnd, self.ssthresh, ack);
            }
            RecoveryStep::Entered => {
                self.cwnd = self
                    .reduction
                    .on_entering_ack(self.cwnd, self.ssthresh, ack);
            }
            RecoveryStep::Left => {}
            RecoveryStep::Outside if ack.newly_delivered == 0 || self.cwnd >= self.cap => {}
            RecoveryStep::Outside if ack.app_limited && !self.slow_start_filled(ack) => {
                // RFC 9438 §5.8: a window the application does not fill is
                // not grown, and the time it stays unfilled does not count
                // towards t.
                if let Some(e) = &mut self.epoch {
                    e.start += ack.now.saturating_since(self.last_ack);
                }
            }
            RecoveryStep::Outside => {
                if self.cwnd < self.ssthresh {
                    self.slow_start(ack);
                } else {
                    self.avoid_congestion(ack.now, ack.newly_delivered);
                }
                self.cwnd = self.cwnd.min(self.cap);
            }
        }
        self.last_ack = ack.now;
    }

    /// RFC 9438 §4.6–4.7.
    fn on_congestion_event(&mut self, event: &CongestionEvent) {
        self.save_prior();
        let cwnd = self.cwnd as f64;
        // §4.7 fast convergence: a flow whose window shrank since the last
        // event releases bandwidth for newer flows.
        self.w_max = if cwnd < self.w_max {
            cwnd * (1.0 + BETA) / 2.0
        } else {
            cwnd
        };
        // §4.6: ssthresh = flight_size × β_cubic, at least two segments.
        let base = reduction_base(event.flight, self.cwnd);
        self.ssthresh = ((base as f64 * BETA) as u64).max(2);
        self.cwnd = self.reduction.start(self.cwnd, self.ssthresh, event);
        self.epoch = None;
        self.after_rto = false;
        self.credit = 0.0;
        self.hystart.on_congestion();
    }

    fn on_recovery_end(&mut self, _now: Time) {
        self.cwnd = self.ssthresh;
        self.credit = 0.0;
    }

    /// RFC 9438 §4.8: Reno's loss window, ssthresh by β_cubic, and the next
    /// congestion-avoidance stage starts with K = 0.
    fn on_rto(&mut self, _now: Time, flight: u64, first: bool) {
        if first {
            self.save_prior();
            let base = reduction_base(flight, self.cwnd);
            self.ssthresh = ((base as f64 * BETA) as u64).max(2);
        }
        self.cwnd = 1;
        self.credit = 0.0;
        self.epoch = None;
        self.after_rto = true;
        self.hystart.on_congestion();
    }

    /// RFC 9438 §4.9: a spurious congestion event restores cwnd,
    /// ssthresh, W_max, W_est and the stage from before it.
    fn undo(&mut self, _now: Time) {
        if let Some(p) = self.prior.take() {
            self.cwnd = self.cwnd.max(p.cwnd).min(self.cap);
            self.ssthresh = p.ssthresh;
            self.w_max = p.w_max;
            self.w_est = p.w_est;
            self.epoch = p.epoch;
            self.after_rto = p.after_rto;
            self.credit = 0.0;
        }
    }

    fn window(&self) -> u64 {
        self.cwnd
    }

    fn ssthresh(&self) -> Option<u64> {
        Some(self.ssthresh)
    }

    fn pacing_rate(&self) -> Option<u64> {
        if self.srtt.is_zero() {
            return None;
        }
        let gain = if self.cwnd < self.ssthresh {
            PACING_GAIN_SS
        } else {
            PACING_GAIN_CA
        };
        let bytes = (self.cwnd * self.mss) as f64 * gain / self.srtt.as_secs_f64();
        Some(bytes as u64)
    }
}

#[cfg(test)]
mod tests {
    //! The controller alone, fed a steady ACK clock; tests/congestion.rs
    //! checks it in the simulator.
    use super::*;

    fn cubic() -> Cubic {
        Cubic::new(&Tuning {
            cc: CcKind::Cubic,
            rcvwin: 1_000_000,
            ..Tuning::default()
        })
    }

    fn ack(now: Time, srtt: Duration, rtt: Option<Duration>, una: u64, max: u64) -> AckEvent {
        AckEvent {
            rtt,
            srtt,
            snd_una: una,
            snd_max: max,
            ..AckEvent::of_one_segment(now)
        }
    }

    /// A loss at `w` segments in flight, recovery over at `at`.
    fn congestion(c: &mut Cubic, w: u64, at: Time) {
        c.cwnd = w;
        c.on_congestion_event(&CongestionEvent {
            flight: w,
            pipe: w,
            sent: 0,
        });
        c.on_recovery_end(at);
    }

    /// Runs congestion avoidance for `secs` with one ACK per segment, a
    /// window's worth per `rtt`; returns (t, cwnd) once per RTT.
    fn avoid(c: &mut Cubic, from: Time, rtt: Duration, secs: f64) -> Vec<(f64, u64)> {
        let mut now = from;
        let mut out = Vec::new();
        let end = from + Duration::from_secs_f64(secs);
        while now < end {
            let n = c.window();
            let step = rtt / n as u32;
            for _ in 0..n {
                now += step;
                c.on_ack(&ack(now, rtt, Some(rtt), 0, 0));
            }
            out.push((now.saturating_since(from).as_secs_f64(), c.window()));
        }
        out
    }

    /// RFC 9438 §4.6: ssthresh = β_cubic × flight, β = 0.7, and cwnd
    /// starts there once recovery ends.
    #[test]
    fn a_congestion_event_keeps_seven_tenths() {
        let mut c = cubic();
        congestion(&mut c, 1000, Time::ZERO);
        assert_eq!((c.window(), c.ssthresh()), (700, Some(700)));
        assert_eq!(c.w_max, 1000.0);
    }

    /// RFC 9438 §4.1–4.5: after a loss at W_max the window follows
    /// W_cubic(t) = C (t − K)³ + W_max: concave up to W_max at t = K,
    /// convex beyond; it never runs ahead of W_cubic one RTT on.
    #[test]
    fn the_window_follows_w_cubic() {
        let mut c = cubic();
        let rtt = Duration::from_millis(100);
        congestion(&mut c, 1000, Time::ZERO);
        let k = (300.0f64 / C).cbrt();
        let w = |t: f64| C * (t - k).powi(3) + 1000.0;
        let series = avoid(&mut c, Time::ZERO, rtt, 2.0 * k);
        for &(t, cwnd) in &series[1..] {
            let (lo, hi) = (w(t - 0.2) - 2.0, w(t + 0.1) + 2.0);
            assert!(
                lo <= cwnd as f64 && cwnd as f64 <= hi,
                "t {t:.2}: cwnd {cwnd} outside W_cubic [{lo:.1}, {hi:.1}]"
            );
        }
        // Flat around W_max at t = K, well beyond it at 2K.
        let near_k = series.iter().find(|s| s.0 >= k).unwrap().1;
        assert!((995..=1010).contains(&near_k), "{near_k} at K");
        assert!(series.last().unwrap().1 > 1150);
    }

    /// RFC 9438 §4.7: a loss below the previous W_max (a new flow is
    /// taking bandwidth) sets W_max to cwnd × (1 + β) / 2.
    #[test]
    fn fast_convergence_lowers_w_max() {
        let mut c = cubic();
        congestion(&mut c, 1000, Time::ZERO);
        congestion(&mut c, 900, Time::ZERO);
        assert_eq!(c.w_max, 900.0 * 0.85);
        congestion(&mut c, 1200, Time::ZERO);
        assert_eq!(c.w_max, 1200.0, "above W_max: no convergence");
    }

    /// RFC 9438 §4.3: with a short RTT, Reno's per-RTT growth outpaces
    /// the cubic curve and the window follows W_est instead.
    #[test]
    fn short_rtts_grow_as_reno_friendly() {
        let mut c = cubic();
        let rtt = Duration::from_millis(1);
        congestion(&mut c, 100, Time::ZERO);
        let series = avoid(&mut c, Time::ZERO, rtt, 0.1);
        // 100 RTTs: α = 3 × 0.3 / 1.7 ≈ 0.53 a round trip until W_est
        // reaches W_max (57 RTTs), one a round trip after: about 143,
        // where W_cubic(0.1 s) is below 75.
        let last = series.last().unwrap().1;
        assert!((138..=148).contains(&last), "{last}");
    }

    /// RFC 9406 §4.2: a round whose minimum RTT is up by RttThresh moves
    /// to conservative slow start (a quarter of the growth), which ends
    /// after CSS_ROUNDS rounds with ssthresh = cwnd; an RTT back below the
    /// baseline resumes standard slow start.
    #[test]
    fn hystart_leaves_slow_start_when_the_rtt_rises() {
        let mut h = HyStart::new();
        let ms = Duration::from_millis;
        let mut sent = 0;
        let mut round = |h: &mut HyStart, rtt: Duration| {
            let mut growth = Vec::new();
            let end = sent + 10;
            for una in sent + 1..=end {
                growth.push(h.on_ack(1, Some(rtt), una, end));
            }
            sent = end;
            growth
        };
        round(&mut h, ms(100));
        round(&mut h, ms(100));
        assert_eq!(h.phase, SlowStart::Standard);
        // RttThresh is 100 ms / 8 = 12.5 ms: 110 ms is not enough; then
        // 110 ms / 8 = 13.75 ms, so 125 ms is.
        round(&mut h, ms(110));
        assert_eq!(h.phase, SlowStart::Standard);
        let g = round(&mut h, ms(125));
        assert!(matches!(h.phase, SlowStart::Conservative { .. }));
        assert_eq!(*g.last().unwrap(), Growth::By(0.25));
        // Back below the baseline: spurious, resume.
        round(&mut h, ms(100));
        assert_eq!(h.phase, SlowStart::Standard);
        round(&mut h, ms(100));
        round(&mut h, ms(130));
        let mut exit = false;
        for _ in 0..CSS_ROUNDS + 1 {
            exit |= round(&mut h, ms(130)).contains(&Growth::Exit);
        }
        assert!(exit);
        assert_eq!(h.phase, SlowStart::Done);
    }

    /// RFC 9438 §5.8: an application-limited ACK grows nothing, except in
    /// slow start while the window is less than twice what was in flight
    /// (Linux's tcp_is_cwnd_limited): after a timeout the window of one
    /// grows even under a stale application-limited mark.
    #[test]
    fn after_a_timeout_slow_start_grows_under_a_stale_app_limited_mark() {
        let rtt = Duration::from_millis(100);
        let limited = |pipe, now| AckEvent {
            app_limited: true,
            pipe,
            ..ack(now, rtt, Some(rtt), 1, 10)
        };
        let mut c = cubic();
        c.on_ack(&ack(Time::ZERO, rtt, Some(rtt), 1, 10));
        c.on_rto(Time::ZERO, 200, true);
        assert_eq!(c.window(), 1);
        // The retransmission is acknowledged; nothing else is in flight.
        c.on_ack(&limited(0, Time::ZERO + rtt));
        assert_eq!(c.window(), 2, "a window of one in use grows");
        // A window well above twice what is in flight does not.
        let mut idle = cubic();
        idle.on_ack(&ack(Time::ZERO, rtt, Some(rtt), 1, 10));
        let before = idle.window();
        idle.on_ack(&limited(1, Time::ZERO + rtt));
        assert_eq!(idle.window(), before, "{before} > 2 x (1 + 1)");
    }

    /// Paced at cwnd per smoothed RTT: twice that in slow start, 1.2 times
    /// in congestion avoidance; unpaced before an RTT is known.
    #[test]
    fn pacing_rate_is_cwnd_per_srtt_with_gain() {
        let mut c = cubic();
        assert_eq!(c.pacing_rate(), None);
        c.on_ack(&ack(Time::ZERO, Duration::from_millis(100), None, 1, 10));
        // 11 segments of 1472 bytes per 100 ms, doubled.
        assert_eq!(c.pacing_rate(), Some(11 * 1472 * 10 * 2));
        congestion(&mut c, 100, Time::ZERO);
        assert_eq!(c.pacing_rate(), Some((70 * 1472 * 10) as u64 * 12 / 10));
    }
}
