//! atou's AIMD: RFC 5681 slow start and congestion avoidance, with the
//! knobs of atou Table 1 and §4.1.
//!
//! - Start: cwnd = `initsegs` × `vmss`, ssthresh = `thresh_init` × rcvwin
//!   (unlimited when zero).
//! - Increase: slow start by appropriate byte counting (RFC 3465, L =
//!   `abc`, 2 by default; 0 counts ACKs as RFC 5681 and Linux 2.4 do);
//!   congestion avoidance `increment` × `vmss` segments per window of ACKs,
//!   tracked exactly.
//! - Decrease: ssthresh = max(`multiplier` × FlightSize, 2 × `vmss`)
//!   (RFC 5681 eq. (4) with atou's multiplier); a timeout leaves a loss
//!   window of one virtual segment.
//! - During fast recovery cwnd comes down to ssthresh in the way the
//!   recovery variant's accounting needs (`congestion::reduction`), and
//!   equals it when recovery ends (Brakmo §3.1, §3.6).
//!
//! Windows are capped at `rcvwin`: a cwnd that cannot be used is not
//! validated.

use super::hoe::StartupEstimate;
use super::reduction::Reduction;
use super::{AckEvent, CongestionEvent, Controller, RecoveryStep};
use crate::proto::path_memory::PathMemory;
use crate::proto::time::Time;
use crate::proto::tuning::{CcKind, SsthreshEstimate, Tuning};

/// Brakmo §3.5: an ACK of this many segments or more must not release a burst.
const MAX_BURST: u64 = 3;

#[derive(Debug)]
pub(crate) struct Aimd {
    /// Congestion window, in segments.
    cwnd: u64,
    /// Congestion-avoidance credit: cwnd grows by one when it reaches cwnd.
    cwnd_cnt: u64,
    ssthresh: u64,
    multiplier: f64,
    /// Congestion-avoidance increase per window of ACKs, in virtual segments.
    increment: u64,
    vmss: u64,
    /// Bytes per segment, to read a saved ssthresh in bytes.
    mss: u32,
    /// The sender window (`rcvwin`): cwnd never grows beyond it.
    cap: u64,
    reduction: Reduction,
    /// cwnd and ssthresh before the last reduction, for `undo`.
    prior: Option<(u64, u64)>,
    /// Slow start's per-ACK limit (RFC 3465's L); 0 counts ACKs.
    abc: u64,
    /// `ssthresh_estimate hoe`, until it has given its estimate or the
    /// first reduction has set ssthresh.
    startup: Option<StartupEstimate>,
}

impl Aimd {
    pub(crate) fn new(t: &Tuning) -> Aimd {
        Aimd {
            cwnd: u64::from(t.initsegs) * u64::from(t.vmss),
            cwnd_cnt: 0,
            ssthresh: t.initial_ssthresh(),
            multiplier: t.multiplier,
            increment: u64::from(t.increment),
            vmss: u64::from(t.vmss),
            mss: t.mss,
            cap: u64::from(t.rcvwin),
            reduction: Reduction::for_tuning(t),
            prior: None,
            abc: u64::from(t.abc),
            startup: (t.ssthresh_estimate == SsthreshEstimate::Hoe).then(StartupEstimate::default),
        }
    }

    /// RFC 5681 eq. (4), with atou's multiplier and the floor in virtual
    /// segments: ssthresh = max(multiplier x FlightSize, 2 x vmss).
    fn reduced_ssthresh(&self, flight: u64) -> u64 {
        ((flight as f64 * self.multiplier).floor() as u64).max(2 * self.vmss)
    }

    /// Slow start and congestion avoidance (RFC 5681 §3.1), capped at the
    /// sender window.
    fn grow(&mut self, newly_acked: u64) {
        if self.cwnd >= self.cap {
            return;
        }
        if self.cwnd < self.ssthresh {
            // RFC 3465 §2.2: appropriate byte counting with L = `abc`; 0
            // counts ACKs (RFC 5681 §3.1, Linux 2.4).
            self.cwnd += match self.abc {
                0 => 1,
                limit => newly_acked.min(limit),
            };
        } else {
            // RFC 5681 eq. (3), tracked exactly: `increment` virtual segments
            // per window of ACKs. Per ACK, not per segment acknowledged, so
            // delayed ACKs halve the rate (Mathis footnote 2) and the window
            // never grows more than `increment` per RTT (Brakmo §3.3–3.4).
            self.cwnd_cnt += self.increment * self.vmss;
            while self.cwnd_cnt >= self.cwnd {
                self.cwnd_cnt -= self.cwnd;
                self.cwnd += 1;
            }
        }
        self.cwnd = self.cwnd.min(self.cap);
    }

    /// Brakmo §3.5: an ACK of three or more segments must not release a
    /// burst; cwnd comes down to what is in flight plus three and slow start
    /// takes it back to where it was (ssthresh remembers it).
    fn moderate_burst(&mut self, newly_acked: u64, flight: u64) {
        if newly_acked < MAX_BURST {
            return;
        }
        if self.cwnd > flight + MAX_BURST {
            self.ssthresh = self.ssthresh.max(self.cwnd);
            self.cwnd = flight + MAX_BURST;
            self.cwnd_cnt = 0;
        }
    }
}

impl Controller for Aimd {
    fn kind(&self) -> CcKind {
        CcKind::Aimd
    }

    fn on_ack(&mut self, ack: &AckEvent) {
        if let Some(estimate) = self.startup.as_mut().and_then(|e| e.on_ack(ack)) {
            // Hoe §3.1: slow start stops at the bandwidth-delay product.
            self.ssthresh = self.ssthresh.min(estimate);
            self.startup = None;
        }
        match ack.recovery {
            RecoveryStep::Outside if ack.newly_acked > 0 => self.grow(ack.newly_acked),
            RecoveryStep::Entered => {
                self.cwnd = self
                    .reduction
                    .on_entering_ack(self.cwnd, self.ssthresh, ack);
            }
            RecoveryStep::Outside | RecoveryStep::Left => {}
            RecoveryStep::During => {
                self.cwnd = self.reduction.on_ack(self.cwnd, self.ssthresh, ack);
            }
        }
        if !ack.recovery.in_recovery() {
            self.moderate_burst(ack.newly_acked, ack.flight);
        }
    }

    fn on_congestion_event(&mut self, event: &CongestionEvent) {
        self.startup = None;
        self.prior = Some((self.cwnd, self.ssthresh));
        self.ssthresh = self.reduced_ssthresh(event.flight);
        self.cwnd_cnt = 0;
        self.cwnd = self.reduction.start(self.cwnd, self.ssthresh, event);
    }

    /// Brakmo §3.1, §3.6: fast recovery ends with cwnd deflated to ssthresh.
    fn on_recovery_end(&mut self, _now: Time) {
        self.cwnd = self.ssthresh;
        self.cwnd_cnt = 0;
    }

    /// Linux's tcp_undo_cwnd_reduction (Sarolahti §6): cwnd back to at
    /// least what it was, ssthresh to what it was if that is higher.
    fn undo(&mut self, _now: Time) {
        if let Some((cwnd, ssthresh)) = self.prior.take() {
            self.cwnd = self.cwnd.max(cwnd).min(self.cap);
            self.ssthresh = self.ssthresh.max(ssthresh);
            self.cwnd_cnt = 0;
        }
    }

    fn on_rto(&mut self, _now: Time, flight: u64, first: bool) {
        self.startup = None;
        // RFC 5681 §3.1 eq. (4); a repeated timeout of the same data keeps ssthresh.
        if first {
            self.ssthresh = self.reduced_ssthresh(flight);
        }
        // RFC 5681 §3.1: loss window of one (virtual, atou §4.1) segment.
        self.cwnd = self.vmss;
        self.cwnd_cnt = 0;
    }

    fn window(&self) -> u64 {
        self.cwnd
    }

    /// Linux's tcp_init_metrics: a saved ssthresh replaces the unlimited
    /// one (never one set with `thresh_init`), floored as a reduction's is.
    fn use_path_memory(&mut self, memory: &PathMemory) {
        if self.ssthresh != u64::MAX {
            return;
        }
        if let Some(saved) = memory.ssthresh_segments(self.mss) {
            self.ssthresh = saved.max(2 * self.vmss);
        }
    }

    fn ssthresh(&self) -> Option<u64> {
        Some(self.ssthresh)
    }
}

#[cfg(test)]
mod tests {
    //! The arithmetic alone; the sender's tests and tests/papers.rs check
    //! it in context.
    use std::time::Duration;

    use super::*;
    use crate::proto::tuning::RecoveryKind;

    /// A controller with a sender window of 1000 segments.
    fn aimd(t: Tuning) -> Aimd {
        Aimd::new(&Tuning { rcvwin: 1000, ..t })
    }

    /// Linux's tcp_init_metrics: a saved ssthresh replaces the unlimited
    /// one, in this connection's segments, and never one the tuning set.
    #[test]
    fn a_saved_ssthresh_replaces_the_unlimited_one_only() {
        let memory = crate::proto::PathMemory {
            srtt: Duration::from_millis(100),
            rttvar: Duration::from_millis(10),
            ssthresh_bytes: Some(300 * 1000),
            btl_bw_bps: None,
            min_rtt: None,
            datagram_size: None,
            btl_bw_is_lower_bound: false,
        };
        let mut unset = aimd(Tuning {
            mss: 1000,
            ..Tuning::default()
        });
        assert_eq!(unset.ssthresh(), Some(u64::MAX));
        unset.use_path_memory(&memory);
        assert_eq!(unset.ssthresh(), Some(300));
        let mut set = aimd(Tuning {
            mss: 1000,
            thresh_init: 0.1,
            ..Tuning::default()
        });
        set.use_path_memory(&memory);
        assert_eq!(set.ssthresh(), Some(100), "thresh_init wins");
    }

    fn ack(newly_acked: u64, recovery: RecoveryStep, flight: u64) -> AckEvent {
        AckEvent {
            newly_acked,
            newly_delivered: newly_acked,
            is_dupack: newly_acked == 0,
            recovery,
            flight,
            pipe: flight,
            ..AckEvent::of_one_segment(Time::ZERO)
        }
    }

    fn congestion(flight: u64, pipe: u64) -> CongestionEvent {
        CongestionEvent {
            flight,
            pipe,
            sent: 0,
        }
    }

    /// RFC 5681 eq. (3) with atou's `increment` and `vmss`: one window of
    /// ACKs adds increment × vmss segments, whatever each ACK covers.
    #[test]
    fn congestion_avoidance_adds_increment_times_vmss_per_window_of_acks() {
        for (increment, vmss) in [(1, 1), (10, 1), (2, 3)] {
            let mut c = aimd(Tuning {
                increment,
                vmss,
                thresh_init: 0.02, // ssthresh 20, below the window
                ..Tuning::default()
            });
            c.on_congestion_event(&congestion(80, 80));
            c.on_recovery_end(Time::ZERO);
            let start = c.window();
            assert_eq!(start, 40);
            for _ in 0..start {
                c.on_ack(&ack(1, RecoveryStep::Outside, 0));
            }
            let grown = c.window() - start;
            let expect = u64::from(increment * vmss);
            // The last increments come in as the window grows, so a window's
            // worth of ACKs adds at least expect - 1 and at most expect.
            assert!(
                grown + 1 >= expect && grown <= expect,
                "increment {increment} vmss {vmss}: grew {grown}"
            );
        }
    }

    /// RFC 5681 eq. (4): ssthresh = max(multiplier × FlightSize, 2 × vmss).
    #[test]
    fn a_congestion_event_keeps_multiplier_times_flight() {
        let mut c = aimd(Tuning {
            multiplier: 0.8,
            recovery: RecoveryKind::Sack,
            ..Tuning::default()
        });
        c.on_congestion_event(&congestion(50, 49));
        assert_eq!((c.window(), c.ssthresh()), (40, Some(40)));
        c.on_congestion_event(&congestion(2, 2));
        assert_eq!(c.ssthresh(), Some(2), "floor of two (virtual) segments");
    }

    /// RFC 5681 §3.2 and RFC 6582 §3.2: inflation by dup_thresh, one more
    /// per duplicate, deflation by a partial ACK, ssthresh at the end.
    #[test]
    fn reno_accounting_inflates_and_deflates() {
        let mut c = aimd(Tuning {
            recovery: RecoveryKind::NewReno,
            ..Tuning::default()
        });
        c.on_congestion_event(&congestion(20, 19));
        assert_eq!(c.window(), 13);
        c.on_ack(&ack(0, RecoveryStep::During, 20));
        c.on_ack(&ack(0, RecoveryStep::During, 20));
        assert_eq!(c.window(), 15);
        c.on_ack(&ack(5, RecoveryStep::During, 15));
        assert_eq!(c.window(), 11);
        c.on_recovery_end(Time::ZERO);
        assert_eq!(c.window(), 10);
    }

    /// Mathis appendix A: one segment down per two ACKs, never above
    /// pipe + 1, never below ssthresh by the ramp itself.
    #[test]
    fn rampdown_comes_down_one_segment_per_two_acks() {
        let mut c = aimd(Tuning {
            recovery: RecoveryKind::Fack,
            rampdown: true,
            initsegs: 20,
            ..Tuning::default()
        });
        c.on_congestion_event(&congestion(20, 100));
        assert_eq!((c.window(), c.ssthresh()), (20, Some(10)));
        let mut seen = Vec::new();
        for _ in 0..30 {
            c.on_ack(&ack(0, RecoveryStep::During, 100));
            seen.push(c.window());
        }
        assert_eq!(&seen[..4], &[20, 19, 19, 18]);
        assert_eq!(*seen.last().unwrap(), 10);
        c.on_ack(&AckEvent {
            pipe: 3,
            ..ack(0, RecoveryStep::During, 100)
        });
        assert_eq!(c.window(), 4, "pipe + 1");
    }

    /// Brakmo §3.5: an ACK of three or more segments brings cwnd down to
    /// flight + 3; ssthresh remembers where it was.
    #[test]
    fn a_big_cumulative_ack_does_not_release_a_burst() {
        let mut c = aimd(Tuning {
            initsegs: 30,
            thresh_init: 0.02, // ssthresh 20: congestion avoidance
            ..Tuning::default()
        });
        c.on_ack(&ack(2, RecoveryStep::Outside, 5));
        assert_eq!(c.window(), 30, "fewer than three: no moderation");
        c.on_ack(&ack(10, RecoveryStep::Outside, 5));
        assert_eq!((c.window(), c.ssthresh()), (8, Some(30)));
    }

    /// RFC 5681 §3.1: a timeout leaves one virtual segment; a repeated
    /// timeout keeps the ssthresh of the first.
    #[test]
    fn a_timeout_leaves_one_virtual_segment() {
        let mut c = aimd(Tuning {
            vmss: 3,
            ..Tuning::default()
        });
        c.on_rto(Time::ZERO, 40, true);
        assert_eq!((c.window(), c.ssthresh()), (3, Some(20)));
        c.on_rto(Time::ZERO, 3, false);
        assert_eq!(c.ssthresh(), Some(20));
    }
}
