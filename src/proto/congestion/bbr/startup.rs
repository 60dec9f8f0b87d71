//! draft-ietf-ccwg-bbr, "Startup": double the sending rate each round trip
//! until the bandwidth stops growing, or loss says the buffer is full.

use super::{
    Bbr, Sample, State, DEFAULT_CWND_GAIN, STARTUP_FULL_BW_COUNT, STARTUP_FULL_BW_THRESH,
    STARTUP_FULL_LOSS_COUNT, STARTUP_PACING_GAIN,
};

impl Bbr {
    /// "BBREnterStartup".
    pub(super) fn enter_startup(&mut self) {
        self.state = State::Startup;
        self.pacing_gain = STARTUP_PACING_GAIN;
        self.cwnd_gain = DEFAULT_CWND_GAIN;
    }

    /// "Exiting Startup Based on Bandwidth Plateau": three rounds without
    /// 25 % more bandwidth mean the pipe is full. Application-limited
    /// rounds prove nothing.
    pub(super) fn check_full_bw_reached(&mut self, s: &Sample) {
        if self.filled_pipe || !self.round_start || s.is_app_limited {
            return;
        }
        if self.max_bw >= self.full_bw * STARTUP_FULL_BW_THRESH {
            self.full_bw = self.max_bw;
            self.full_bw_count = 0;
            return;
        }
        self.full_bw_count += 1;
        if self.full_bw_count >= STARTUP_FULL_BW_COUNT {
            self.filled_pipe = true;
        }
    }

    /// "Exiting Startup Based on Packet Loss": a round with many loss
    /// events and more than the loss threshold lost ends Startup, and what
    /// was in flight bounds inflight from now on.
    /// (Counted as Linux counts them: ACKs that report new losses.)
    fn check_startup_high_loss(&mut self, s: &Sample) {
        if s.newly_lost > 0 {
            self.loss_events_in_round += 1;
        }
        if !self.filled_pipe
            && self.loss_round_start
            && self.loss_events_in_round >= STARTUP_FULL_LOSS_COUNT
            && self.is_inflight_too_high()
        {
            self.inflight_hi = self
                .bdp_multiple(self.max_bw, 1.0)
                .max(self.inflight_latest);
            self.filled_pipe = true;
        }
        if self.loss_round_start {
            self.loss_events_in_round = 0;
        }
    }

    /// "BBRCheckStartupDone".
    pub(super) fn check_startup_done(&mut self, s: &Sample) {
        if self.state != State::Startup {
            return;
        }
        self.check_startup_high_loss(s);
        if self.filled_pipe {
            self.enter_drain();
        }
    }
}
