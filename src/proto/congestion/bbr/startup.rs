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

    /// "BBRCheckFullBWReached" (draft-ietf-ccwg-bbr §5.3.1.2): three
    /// rounds without 25 % more bandwidth mean the pipe is full for now
    /// (`full_bw_now`), and, the first time, for good (`filled_pipe`, the
    /// draft's full_bw_reached). The estimator runs again in every
    /// ProbeBW_UP (`start_probe_bw_up` resets it), where it decides when
    /// the probe has stopped finding bandwidth (`is_time_to_go_down`).
    /// Application-limited rounds prove nothing. In Startup the growth is
    /// judged on the max-bw estimate, which only rises; in UP on the
    /// round's delivery rate, as the draft has it, since the estimate
    /// there still holds the last cycle's maximum.
    pub(super) fn check_full_bw_reached(&mut self, s: &Sample) {
        if self.full_bw_now || !self.round_start || s.is_app_limited {
            return;
        }
        let bw = if self.filled_pipe {
            s.rate
        } else {
            self.max_bw
        };
        if bw >= self.full_bw * STARTUP_FULL_BW_THRESH {
            self.reset_full_bw();
            self.full_bw = bw;
            return;
        }
        self.full_bw_count += 1;
        self.full_bw_now = self.full_bw_count >= STARTUP_FULL_BW_COUNT;
        if self.full_bw_now {
            self.filled_pipe = true;
        }
    }

    /// "BBRResetFullBW".
    pub(super) fn reset_full_bw(&mut self) {
        self.full_bw = 0.0;
        self.full_bw_count = 0;
        self.full_bw_now = false;
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
