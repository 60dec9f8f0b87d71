//! draft-ietf-ccwg-bbr, "Drain": pace below the bandwidth until the queue
//! Startup built is gone.

use super::{Bbr, Sample, State, DEFAULT_CWND_GAIN, DRAIN_PACING_GAIN};

impl Bbr {
    /// "BBREnterDrain".
    pub(super) fn enter_drain(&mut self) {
        self.state = State::Drain;
        self.pacing_gain = DRAIN_PACING_GAIN;
        self.cwnd_gain = DEFAULT_CWND_GAIN;
    }

    /// "BBRCheckDrainDone": in flight no more than one BDP.
    pub(super) fn check_drain_done(&mut self, s: &Sample) {
        if self.state == State::Drain && s.inflight as f64 <= self.inflight(self.max_bw, 1.0) {
            self.enter_probe_bw(s);
        }
    }
}
