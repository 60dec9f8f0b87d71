//! draft-ietf-ccwg-bbr §5.4.1, "Restarting From Idle": when the
//! application pauses (a sender waiting on disk reads) and everything sent
//! has been acknowledged, the model stays; what changes is how the next
//! flight goes out. In ProbeBW it is paced at the estimate itself (not at
//! Down's 0.9 or Up's 1.25, which were meant for a flight in progress); a
//! ProbeRTT whose 200 ms have passed ends rather than hold its small
//! window over the restart; and ProbeRTT is not entered on the restart's
//! first ACK (`idle_restart`).
//!
//! The draft does this as sending resumes; the `Controller` hears only of
//! ACKs, so it is done on the ACK that leaves nothing in flight while the
//! sender is application-limited. The pacing rate set there holds until
//! the next ACK, which the restarted flight brings.

use super::{Bbr, Sample, State, PACING_MARGIN};

impl Bbr {
    /// "BBRHandleRestartFromIdle", at the ACK that leaves the connection
    /// idle.
    pub(super) fn handle_idle(&mut self, s: &Sample, app_limited: bool) {
        if s.inflight > 0 || !app_limited {
            return;
        }
        self.idle_restart = true;
        self.extra_acked_interval_start = s.now;
        if self.state.is_probe_bw() {
            // "BBRSetPacingRateWithGain(1)".
            self.pacing_rate = self.bw * (1.0 - PACING_MARGIN) * self.mss as f64;
        } else if self.state == State::ProbeRtt {
            // "BBRCheckProbeRTTDone", without waiting for a round: there is
            // no flight left to complete one.
            if self.probe_rtt_done_stamp.is_some_and(|done| s.now > done) {
                self.probe_rtt_min_stamp = s.now;
                self.restore_cwnd();
                self.exit_probe_rtt(s);
            }
        }
    }
}
