//! draft-ietf-ccwg-bbr, "Startup": double the sending rate each round trip
//! until the bandwidth stops growing, or loss says the buffer is full.

use super::{
    Bbr, Sample, State, DEFAULT_CWND_GAIN, STARTUP_FULL_BW_COUNT, STARTUP_FULL_BW_THRESH,
    STARTUP_FULL_LOSS_COUNT, STARTUP_PACING_GAIN,
};

/// `check_startup_known_path`: the share of the remembered bandwidth the
/// estimate must reach, and the RTT, in min_rtts, that shows a queue.
const KNOWN_PATH_REACHED: f64 = 0.9;
const KNOWN_PATH_QUEUE: f64 = 1.1;

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

    /// Deviation (not in the draft): on a path the path cache knows,
    /// Startup ends once the estimate has reached 0.9 of the bandwidth it
    /// remembered and an RTT sample shows a queue (a tenth of min_rtt):
    /// the pipe is full, and the plateau's three rounds would only fill
    /// the buffer (on a 100 Mbit/s, 100 ms bridge with 0.66 BDP of queue,
    /// 288-366 datagrams of each 30 MB send were dropped at the end of
    /// Startup; none since, docs/congestion.md). Both together: a path
    /// that is faster now shows no queue at the old rate, and a queue
    /// alone may be someone else's. Startup's pacing on such a path is
    /// capped too (`known_path_cap`).
    fn check_startup_known_path(&mut self, s: &Sample) {
        let (Some(known), Some(min_rtt), Some(rtt)) = (self.known_bw, self.min_rtt, s.rtt) else {
            return;
        };
        if !self.filled_pipe
            && self.max_bw >= KNOWN_PATH_REACHED * known
            && rtt > min_rtt.mul_f64(KNOWN_PATH_QUEUE)
        {
            self.filled_pipe = true;
        }
    }

    /// "BBRCheckStartupDone".
    pub(super) fn check_startup_done(&mut self, s: &Sample) {
        if self.state != State::Startup {
            return;
        }
        self.check_startup_high_loss(s);
        self.check_startup_known_path(s);
        if self.filled_pipe {
            self.enter_drain();
        }
    }
}
