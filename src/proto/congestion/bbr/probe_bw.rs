//! draft-ietf-ccwg-bbr, "ProbeBW": the steady state, a cycle of Down (drain
//! what probing queued), Cruise (at the estimate, with headroom), Refill
//! (fill the pipe again) and Up (probe for more bandwidth), 2–3 s apart or
//! sooner where a Reno flow would probe.

use std::time::Duration;

use super::{AckPhase, Bbr, Sample, State, DEFAULT_CWND_GAIN};

/// "BBRStartProbeBW_UP": pace a quarter above the estimate; also the
/// in-flight, in BDPs, past which a probe without an upper bound is only
/// queueing (`is_only_queueing`).
const PROBE_UP_PACING_GAIN: f64 = 1.25;

/// Refill's smallest RTT sample within this factor of min_rtt: no queue
/// stood when the probe began (`probe_began_without_queue`). Cruise alone
/// on the bench bridge holds 100.5-102 ms over a 100 ms base; beside a
/// loss-based flow or kernel bbr the queue adds tens of ms.
const EMPTY_QUEUE_RTT: f64 = 1.1;

impl Bbr {
    /// "BBREnterProbeBW".
    pub(super) fn enter_probe_bw(&mut self, s: &Sample) {
        self.start_probe_bw_down(s);
    }

    /// "BBRStartProbeBW_DOWN".
    pub(super) fn start_probe_bw_down(&mut self, s: &Sample) {
        self.reset_congestion_signals();
        self.bw_probe_up_cnt = f64::INFINITY;
        self.pick_probe_wait();
        self.cycle_stamp = s.now;
        self.ack_phase = AckPhase::ProbeStopping;
        self.start_round();
        self.state = State::ProbeBwDown;
        self.pacing_gain = 0.9;
        self.cwnd_gain = DEFAULT_CWND_GAIN;
    }

    /// "BBRStartProbeBW_CRUISE".
    pub(super) fn start_probe_bw_cruise(&mut self) {
        self.state = State::ProbeBwCruise;
        self.pacing_gain = 1.0;
        self.cwnd_gain = DEFAULT_CWND_GAIN;
    }

    /// "BBRStartProbeBW_REFILL": lower bounds off, a round at the estimate.
    fn start_probe_bw_refill(&mut self) {
        self.refill_min_rtt = None;
        self.reset_lower_bounds();
        self.bw_probe_up_rounds = 0;
        self.bw_probe_up_acks = 0.0;
        self.ack_phase = AckPhase::Refilling;
        self.start_round();
        self.state = State::ProbeBwRefill;
        self.pacing_gain = 1.0;
        self.cwnd_gain = DEFAULT_CWND_GAIN;
    }

    /// "BBRStartProbeBW_UP".
    fn start_probe_bw_up(&mut self, s: &Sample) {
        self.ack_phase = AckPhase::ProbeStarting;
        self.start_round();
        self.reset_full_bw();
        self.full_bw = s.rate;
        self.cycle_stamp = s.now;
        self.state = State::ProbeBwUp;
        self.pacing_gain = PROBE_UP_PACING_GAIN;
        self.cwnd_gain = 2.25;
        self.raise_inflight_hi_slope();
        self.probe_began_without_queue = match (self.refill_min_rtt, self.min_rtt) {
            (Some(refill), Some(min)) => refill <= min.mul_f64(EMPTY_QUEUE_RTT),
            _ => false,
        };
    }

    /// Another connection of the same transfer has finished
    /// (`Controller::on_sibling_done`): its share of the bottleneck is
    /// likely free, and the cycle would find that out only at its next
    /// probe, up to 3 s on (a 100 MB send over two streams at 1 % loss
    /// ran its last second at half the rate, one stream alone at its
    /// old share). So probe now, as "BBRCheckTimeToProbeBW" would, from
    /// Down or Cruise; and lift inflight_hi in any ProbeBW state: the
    /// loss that set it was met with the sibling's data in the queue, and
    /// Up would raise it only 1, 2, 4, ... segments a round. Startup,
    /// Drain and ProbeRTT go on as they are.
    pub(super) fn probe_for_a_siblings_share(&mut self) {
        if !self.state.is_probe_bw() {
            return;
        }
        self.inflight_hi = f64::INFINITY;
        if matches!(self.state, State::ProbeBwDown | State::ProbeBwCruise) {
            self.start_probe_bw_refill();
        }
    }

    /// "BBRPickProbeWait": 2–3 s, and 0 or 1 rounds, at random.
    fn pick_probe_wait(&mut self) {
        self.rounds_since_bw_probe = u64::from(self.random() < 0.5);
        self.bw_probe_wait = Duration::from_secs_f64(2.0 + self.random());
    }

    fn has_elapsed_in_phase(&self, now: crate::proto::time::Time, d: Duration) -> bool {
        now > self.cycle_stamp + d
    }

    /// "BBRIsRenoCoexistenceProbeTime": probe at least as often as Reno
    /// would grow its window by one BDP, capped at 63 rounds.
    fn is_reno_coexistence_probe_time(&self) -> bool {
        let reno_rounds = self.target_inflight().min(63.0);
        self.rounds_since_bw_probe as f64 >= reno_rounds
    }

    /// "BBRCheckTimeToProbeBW".
    fn check_time_to_probe_bw(&mut self, s: &Sample) -> bool {
        if self.has_elapsed_in_phase(s.now, self.bw_probe_wait)
            || self.is_reno_coexistence_probe_time()
        {
            self.start_probe_bw_refill();
            return true;
        }
        false
    }

    /// "BBRCheckTimeToCruise".
    fn check_time_to_cruise(&self, s: &Sample) -> bool {
        let inflight = s.inflight as f64;
        if inflight > self.inflight_with_headroom() {
            return false;
        }
        inflight <= self.inflight(self.max_bw, 1.0)
    }

    /// "BBRUpdateProbeBWCyclePhase".
    pub(super) fn update_probe_bw_cycle_phase(&mut self, s: &Sample) {
        if !self.filled_pipe {
            return;
        }
        // Judged before this ACK raises inflight_hi (and before cwnd
        // follows it): whether the window it sent under was full at the
        // bound.
        let held_by_inflight_hi = self.cwnd_limited && self.cwnd as f64 >= self.inflight_hi;
        if let (State::ProbeBwRefill, Some(rtt)) = (self.state, s.rtt) {
            self.refill_min_rtt = Some(self.refill_min_rtt.map_or(rtt, |m| m.min(rtt)));
        }
        self.adapt_upper_bounds(s);
        if !self.state.is_probe_bw() {
            return;
        }
        match self.state {
            State::ProbeBwDown => {
                if !self.check_time_to_probe_bw(s) && self.check_time_to_cruise(s) {
                    self.start_probe_bw_cruise();
                }
            }
            State::ProbeBwCruise => {
                self.check_time_to_probe_bw(s);
            }
            State::ProbeBwRefill => {
                // After a round of refilling, start probing.
                if self.round_start {
                    self.bw_probe_samples = true;
                    self.start_probe_bw_up(s);
                }
            }
            State::ProbeBwUp => {
                if self.is_only_queueing(s) || self.is_time_to_go_down(s, held_by_inflight_hi) {
                    self.start_probe_bw_down(s);
                }
            }
            State::Startup | State::Drain | State::ProbeRtt => {}
        }
    }

    /// "BBRIsTimeToGoDown" (draft-ietf-ccwg-bbr §5.3.3.6): the probe ends
    /// when it stops finding bandwidth, three rounds without 25 % more
    /// delivered (`full_bw_now`), or on loss (`check_inflight_too_high`).
    /// While the window is full at inflight_hi, a plateau is the bound's
    /// doing, not the path's: the estimator starts again and the probe
    /// goes on, raising inflight_hi 1, 2, 4, ... segments a round.
    ///
    /// Earlier drafts (and Linux's bbr3) end the probe once a min_rtt has
    /// passed with more than 1.25 BDP in flight. With two flows on one
    /// queue the BDP is under what each holds (the queue is part of it),
    /// so every probe ended after one round and inflight_hi grew by a
    /// segment or two a cycle: a late flow whose Startup loss had set a low
    /// inflight_hi stayed at its share (two atou flows: Jain 0.79 over
    /// 60 s, tests/fairness.rs).
    fn is_time_to_go_down(&mut self, s: &Sample, held_by_inflight_hi: bool) -> bool {
        if held_by_inflight_hi {
            self.reset_full_bw();
            self.full_bw = s.rate;
            return false;
        }
        self.full_bw_now
    }

    /// A probe that only builds a queue ends once a min_rtt has passed in
    /// ProbeBW_UP with more than 1.25 BDP in flight: the estimated queue
    /// is a quarter of a BDP and the delivery rate has not followed (it
    /// would have raised max_bw, and the BDP with it).
    /// draft-cardwell-iccrg-bbr-congestion-control-02 §4.3.3.6 (ProbeBW_UP
    /// in BBRUpdateProbeBWCyclePhase) and Linux's bbr3 (`is_queuing` in
    /// bbr_update_cycle_phase) end every probe so; the current draft ends
    /// it only on loss or a plateau (`is_time_to_go_down`). Deviation:
    /// atou's bbr takes this exit while inflight_hi is unset, or when the
    /// probe began with no queue standing (`probe_began_without_queue`).
    /// On a deep buffer nothing else stops the probe before the plateau's
    /// three rounds, by which cwnd_gain has let the queue grow to a BDP,
    /// every cycle: mean RTT 119.2 ms over 30 s on a 100 Mbit/s, 100 ms
    /// path with a 1000-packet queue, 104.1 ms with this exit; and where
    /// Startup's overflow has set inflight_hi (the bench bridge's 0.66 BDP
    /// of queue), 113.7-114.1 ms before the second condition, 102.7-106.2
    /// with it (docs/congestion.md, "A short queue on deep buffers").
    /// Where a queue stood before the probe (another flow's: with flows
    /// sharing a queue, the queue is part of each one's in-flight) the
    /// draft's rule stands once loss has set inflight_hi: this exit ended
    /// every probe of both flows in its first round.
    fn is_only_queueing(&self, s: &Sample) -> bool {
        let Some(min_rtt) = self.min_rtt else {
            return false;
        };
        (self.inflight_hi.is_infinite() || self.probe_began_without_queue)
            && self.has_elapsed_in_phase(s.now, min_rtt)
            && s.inflight as f64 > self.inflight(self.max_bw, PROBE_UP_PACING_GAIN)
    }

    /// "BBRAdaptUpperBounds": a new cycle ages the bandwidth filter; loss
    /// above the threshold while probing sets inflight_hi; without loss,
    /// inflight_hi follows what was in flight and grows while probing up.
    fn adapt_upper_bounds(&mut self, s: &Sample) {
        if self.ack_phase == AckPhase::ProbeStarting && self.round_start {
            self.ack_phase = AckPhase::ProbeFeedback;
        }
        if self.ack_phase == AckPhase::ProbeStopping && self.round_start {
            self.bw_probe_samples = false;
            self.ack_phase = AckPhase::Init;
            if self.state.is_probe_bw() && !s.is_app_limited {
                self.advance_max_bw_filter();
            }
        }
        if self.check_inflight_too_high(s) {
            return;
        }
        if self.inflight_hi.is_infinite() {
            return;
        }
        if s.tx_in_flight as f64 > self.inflight_hi {
            self.inflight_hi = s.tx_in_flight as f64;
        }
        if self.state == State::ProbeBwUp {
            self.probe_inflight_hi_upward(s);
        }
    }

    /// "BBRCheckInflightTooHigh" and "BBRHandleInflightTooHigh".
    fn check_inflight_too_high(&mut self, s: &Sample) -> bool {
        if !s.has_rate || !self.is_inflight_too_high() {
            return false;
        }
        if self.bw_probe_samples {
            self.bw_probe_samples = false;
            if !s.is_app_limited {
                self.inflight_hi = (s.tx_in_flight as f64).max(self.target_inflight() * self.beta);
            }
            if self.state == State::ProbeBwUp {
                self.start_probe_bw_down(s);
            }
        }
        true
    }

    /// "BBRProbeInflightHiUpward": grow inflight_hi by 1, 2, 4, ... segments
    /// per round while the window is full.
    fn probe_inflight_hi_upward(&mut self, s: &Sample) {
        if s.is_app_limited || (self.cwnd as f64) < self.inflight_hi {
            return;
        }
        self.bw_probe_up_acks += s.newly_acked as f64;
        if self.bw_probe_up_acks >= self.bw_probe_up_cnt {
            let delta = (self.bw_probe_up_acks / self.bw_probe_up_cnt).floor();
            self.bw_probe_up_acks -= delta * self.bw_probe_up_cnt;
            self.inflight_hi += delta;
        }
        if self.round_start {
            self.raise_inflight_hi_slope();
        }
    }

    /// "BBRRaiseInflightHiSlope".
    fn raise_inflight_hi_slope(&mut self) {
        let growth_this_round = f64::from(1u32 << self.bw_probe_up_rounds);
        self.bw_probe_up_rounds = (self.bw_probe_up_rounds + 1).min(30);
        self.bw_probe_up_cnt = (self.cwnd as f64 / growth_this_round).max(1.0);
    }
}
