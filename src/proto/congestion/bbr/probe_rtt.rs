//! draft-ietf-ccwg-bbr, "ProbeRTT": when the minimum RTT has not been seen
//! for five seconds, hold half a BDP in flight for 200 ms and a round trip
//! so the queue drains and the propagation delay shows.

use super::{Bbr, Sample, State, MIN_PIPE_CWND, PROBE_RTT_CWND_GAIN, PROBE_RTT_DURATION};

impl Bbr {
    /// "BBRCheckProbeRTT".
    /// Not on the first ACK after a restart from idle (§5.4.1
    /// `idle_restart`, idle.rs).
    pub(super) fn check_probe_rtt(&mut self, s: &Sample) {
        if self.state != State::ProbeRtt
            && self.probe_rtt_expired
            && self.filled_pipe
            && !self.idle_restart
        {
            self.enter_probe_rtt();
            self.save_cwnd();
            self.probe_rtt_done_stamp = None;
            self.ack_phase = super::AckPhase::ProbeStopping;
            self.start_round();
        }
        if self.state == State::ProbeRtt {
            self.handle_probe_rtt(s);
        }
        if s.delivered > 0 {
            self.idle_restart = false;
        }
    }

    /// "BBREnterProbeRTT".
    fn enter_probe_rtt(&mut self) {
        self.state = State::ProbeRtt;
        self.pacing_gain = 1.0;
        self.cwnd_gain = PROBE_RTT_CWND_GAIN;
    }

    /// "BBRHandleProbeRTT": once in flight is down to the ProbeRTT window,
    /// wait 200 ms and a round trip.
    fn handle_probe_rtt(&mut self, s: &Sample) {
        match self.probe_rtt_done_stamp {
            None if s.inflight <= self.probe_rtt_cwnd() => {
                self.probe_rtt_done_stamp = Some(s.now + PROBE_RTT_DURATION);
                self.probe_rtt_round_done = false;
                self.start_round();
            }
            None => {}
            Some(done) => {
                if self.round_start {
                    self.probe_rtt_round_done = true;
                }
                // "BBRCheckProbeRTTDone".
                if self.probe_rtt_round_done && s.now > done {
                    self.probe_rtt_min_stamp = s.now;
                    self.restore_cwnd();
                    self.exit_probe_rtt(s);
                }
            }
        }
    }

    /// "BBRExitProbeRTT" (draft-ietf-ccwg-bbr §5.3.4.4). Deviation: back
    /// in ProbeBW the flow keeps its own probe clock (`cycle_stamp`,
    /// `bw_probe_wait`, the rounds since its last probe) instead of
    /// starting a new cycle. Flows sharing a queue see its minimum RTT
    /// together and so leave ProbeRTT together; restarting every flow's
    /// cycle there put all of them on one 2–3 s schedule every 5 s, so
    /// their probes collided (two flows in ProbeBW_UP at once: neither
    /// gains share) and their Downs overlapped (the queue drains and no
    /// one probes into the room). Keeping each flow's randomised clock,
    /// drawn from its own seed, keeps their probes apart (two staggered
    /// flows: Jain 0.91 -> 0.96 on average over 14 seeds, 10–60 s).
    pub(super) fn exit_probe_rtt(&mut self, s: &Sample) {
        self.reset_lower_bounds();
        if self.filled_pipe {
            let clock = (
                self.cycle_stamp,
                self.bw_probe_wait,
                self.rounds_since_bw_probe,
            );
            self.start_probe_bw_down(s);
            self.start_probe_bw_cruise();
            (
                self.cycle_stamp,
                self.bw_probe_wait,
                self.rounds_since_bw_probe,
            ) = clock;
        } else {
            self.enter_startup();
        }
    }

    /// "BBRProbeRTTCwnd": half a BDP, at least the minimum window.
    pub(super) fn probe_rtt_cwnd(&self) -> u64 {
        (self.bdp_multiple(self.bw, PROBE_RTT_CWND_GAIN) as u64).max(MIN_PIPE_CWND)
    }

    /// "BBRBoundCwndForProbeRTT".
    pub(super) fn bound_cwnd_for_probe_rtt(&mut self) {
        if self.state == State::ProbeRtt {
            self.cwnd = self.cwnd.min(self.probe_rtt_cwnd());
        }
    }
}
