//! RACK-TLP (RFC 8985): time-based loss detection, and tail loss probes.
//!
//! A segment is lost when a segment sent after it has been delivered and
//! it has waited an RTT and a reordering window longer than that:
//! `now >= xmit_ts + RACK.rtt + RACK.reo_wnd` (§6.2 step 5). Counting time
//! rather than duplicate ACKs makes one rule judge first transmissions and
//! retransmissions alike, so a lost retransmission is found a round trip
//! after it left instead of by a retransmission timeout. The reordering
//! window is min_rtt / 4, grows by that step for each round trip with a
//! D-SACK and falls back after 16 recoveries without one (§6.2 step 4);
//! it is zero during recovery, or with `dup_thresh` segments SACKed, until
//! reordering has been seen. A timer catches what no later ACK will
//! (§6.3).
//!
//! When the sender goes quiet with data in flight and nothing SACKed, a
//! tail loss probe two smoothed RTTs later sends one segment, new data if
//! there is any, otherwise the highest segment again, so that a loss at the
//! tail of a flight draws SACKs and RACK can repair it without a timeout
//! (§7). One probe at a time; if the probe alone repaired a loss, the
//! congestion controller is told once (§7.4).
//!
//! Deviation: the reordering timer and the probe timer are armed at the
//! earliest moment a segment could be lost, rather than at the latest one
//! (§6.2 step 5 takes the maximum); a timer that fires early only runs the
//! detection again.

use std::time::Duration;

use super::{AckSummary, LossRecovery, LossState, Phase, TimerContext, TimerVerdict, Verdict};
use crate::proto::events::RecoveryTrigger;
use crate::proto::stream::scoreboard::Scoreboard;
use crate::proto::time::Time;
use crate::proto::tuning::{RecoveryKind, Tuning};

/// RFC 8985 §6.2 step 4: recoveries without D-SACK before the reordering
/// window returns to one step.
const REO_WND_PERSIST: u32 = 16;
/// RFC 8985 §7.2: the probe timeout before the first RTT sample.
const INITIAL_PTO: Duration = Duration::from_secs(1);

#[derive(Debug)]
pub(super) struct Rack {
    dup_thresh: u64,
    /// §6.1 RACK.xmit_ts and RACK.end_seq: the send time and number of
    /// the most recently sent segment delivered so far.
    newest: Option<(Time, u64)>,
    /// §6.1 RACK.rtt: that segment's RTT.
    rtt: Duration,
    /// §6.1 RACK.fack: the highest segment delivered so far.
    fack: Option<u64>,
    /// §6.2 step 3.
    reordering_seen: bool,
    reo_wnd_mult: u32,
    reo_wnd_persist: u32,
    /// snd_max when the last D-SACK widened the window: one step per round.
    dsack_round: Option<u64>,
    /// The reordering window, as last computed.
    reo_wnd: Duration,
    /// §6.3: when the earliest segment not yet lost would be.
    reo_timer: Option<Time>,
    /// §7.2: the probe timeout.
    pto: Option<Time>,
    /// §7.1 TLP.end_seq: snd_max after the outstanding probe went out.
    tlp_end: Option<u64>,
    /// §7.1 TLP.is_retrans.
    tlp_retrans: bool,
    /// The segment the outstanding probe sent.
    tlp_seg: u64,
    /// §7.4: a probe repaired a loss; the controller has not answered it.
    probe_loss: bool,
}

impl Rack {
    pub(super) fn new(t: &Tuning) -> Rack {
        Rack {
            dup_thresh: u64::from(t.dup_thresh),
            newest: None,
            rtt: Duration::ZERO,
            fack: None,
            reordering_seen: false,
            reo_wnd_mult: 1,
            reo_wnd_persist: REO_WND_PERSIST,
            dsack_round: None,
            reo_wnd: Duration::ZERO,
            reo_timer: None,
            pto: None,
            tlp_end: None,
            tlp_retrans: false,
            tlp_seg: 0,
            probe_loss: false,
        }
    }

    /// RFC 8985 §6.2 steps 1–3: each delivered segment updates RACK.xmit_ts,
    /// RACK.rtt and RACK.fack, unless it was retransmitted and the ACK may
    /// be for an earlier copy (step 2, by the echoed timestamp or an RTT
    /// shorter than the minimum).
    fn on_deliveries(&mut self, sb: &Scoreboard, ack: &AckSummary) {
        for d in sb.deliveries() {
            // §6.2 step 3: delivered below the highest delivered, and not
            // because it was resent: the network reordered it.
            if !d.retransmitted && self.fack.is_some_and(|f| d.seg < f) {
                self.reordering_seen = true;
            }
            self.fack = Some(self.fack.map_or(d.seg, |f| f.max(d.seg)));
            let rtt = ack.now.saturating_since(d.xmit);
            if d.retransmitted {
                let echo_before_xmit = (d.xmit.wire_micros().wrapping_sub(ack.echo) as i32) > 0;
                if echo_before_xmit || rtt < ack.min_rtt {
                    continue;
                }
            }
            if self.newest.is_none_or(|n| (d.xmit, d.seg) > n) {
                self.newest = Some((d.xmit, d.seg));
                self.rtt = rtt;
            }
        }
    }

    /// RFC 8985 §6.2 step 4, RACK_update_reo_wnd.
    fn update_reo_wnd(&mut self, sb: &Scoreboard, st: &LossState, ack: &AckSummary) {
        if self.dsack_round.is_some_and(|r| sb.una() >= r) {
            self.dsack_round = None;
        }
        if self.dsack_round.is_none() && ack.dsack.is_some() {
            self.dsack_round = Some(sb.max());
            self.reo_wnd_mult = self.reo_wnd_mult.saturating_add(1);
            self.reo_wnd_persist = REO_WND_PERSIST;
        }
        let recovering = matches!(st.phase, Phase::Recovery | Phase::Loss);
        self.reo_wnd = if !self.reordering_seen && (recovering || sb.sacked() >= self.dup_thresh) {
            Duration::ZERO
        } else {
            (ack.min_rtt / 4 * self.reo_wnd_mult).min(ack.srtt)
        };
    }

    /// §6.2 step 4: leaving a recovery without D-SACK counts towards
    /// resetting the window.
    fn on_recovery_exit(&mut self) {
        self.reo_wnd_persist = self.reo_wnd_persist.saturating_sub(1);
        if self.reo_wnd_persist == 0 {
            self.reo_wnd_mult = 1;
        }
    }

    /// RFC 8985 §6.2 step 5, RACK_detect_loss, over the segments in flight
    /// oldest first: every one sent before RACK's segment whose time is up
    /// is lost (a retransmission too); the first whose time is not up sets
    /// the reordering timer (§6.3). Returns how many were marked.
    fn detect_loss(&mut self, now: Time, sb: &mut Scoreboard) -> u64 {
        self.reo_timer = None;
        let Some(newest) = self.newest else { return 0 };
        let mut lost = Vec::new();
        for (xmit, seg) in sb.in_flight_by_xmit() {
            // RACK_sent_after(RACK.xmit_ts, RACK.end_seq, xmit, seg).
            if (xmit, seg) >= newest {
                break;
            }
            let deadline = xmit + self.rtt + self.reo_wnd;
            if now >= deadline {
                lost.push(seg);
            } else {
                self.reo_timer = Some(deadline);
                break;
            }
        }
        for &seg in &lost {
            sb.mark_lost_again(seg);
        }
        lost.len() as u64
    }

    /// RFC 8985 §7.4 (Linux's tcp_process_tlp_ack): once the cumulative
    /// ACK passes the probe, the episode ends. A D-SACK for the probe, or a
    /// pure duplicate, says both copies arrived; an ACK beyond the probe
    /// without either says the probe repaired a loss.
    fn on_probe_ack(&mut self, sb: &Scoreboard, ack: &AckSummary) {
        let Some(end) = self.tlp_end else { return };
        let una = sb.una();
        if una < end {
            return;
        }
        let probe_duplicated = ack
            .dsack
            .is_some_and(|b| b.start <= self.tlp_seg && self.tlp_seg < b.end);
        let pure_duplicate = ack.newly_acked == 0 && ack.newly_sacked == 0;
        if !self.tlp_retrans || probe_duplicated || pure_duplicate {
            // New data was probed, or both copies arrived: no loss.
            self.tlp_end = None;
        } else if una > end {
            self.probe_loss = true;
            self.tlp_end = None;
        }
    }
}

impl LossRecovery for Rack {
    fn kind(&self) -> RecoveryKind {
        RecoveryKind::Rack
    }

    fn on_ack(&mut self, sb: &mut Scoreboard, st: &mut LossState, ack: &AckSummary) -> Verdict {
        self.on_deliveries(sb, ack);
        self.update_reo_wnd(sb, st, ack);
        self.on_probe_ack(sb, ack);
        if sb.sacked() > 0 || st.phase != Phase::Open {
            // §7.2: no probe while SACKs or recovery are about.
            self.pto = None;
        }
        let marked = self.detect_loss(ack.now, sb);
        match st.phase {
            Phase::Recovery => {
                if st.recovery_point_acked(sb) {
                    self.on_recovery_exit();
                    return Verdict::Leave;
                }
                Verdict::Continue
            }
            Phase::Loss => Verdict::Stay,
            Phase::Open | Phase::Disorder => {
                if marked == 0 {
                    return Verdict::Stay;
                }
                Verdict::EnterMarked {
                    trigger: RecoveryTrigger::Rack,
                }
            }
        }
    }

    fn deadline(&self) -> Option<Time> {
        match (self.reo_timer, self.pto) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// RFC 8985 §7.2: a probe is due two smoothed RTTs after the last
    /// transmission or ACK (plus the peer's delayed-ACK time when one
    /// segment is in flight), never later than the retransmission timer;
    /// only in the Open state, with nothing SACKed, no probe outstanding
    /// and no reordering timer pending.
    fn arm(&mut self, ctx: &TimerContext, sb: &Scoreboard, st: &LossState) {
        let eligible = st.phase == Phase::Open
            && sb.sacked() == 0
            && sb.outstanding() > 0
            && self.tlp_end.is_none()
            && self.reo_timer.is_none();
        if !eligible {
            self.pto = None;
            return;
        }
        if !ctx.restart && self.pto.is_some() {
            return;
        }
        let pto = if ctx.srtt.is_zero() {
            INITIAL_PTO
        } else if sb.outstanding() == 1 {
            2 * ctx.srtt + ctx.max_ack_delay
        } else {
            2 * ctx.srtt
        };
        let at = ctx.now + pto;
        self.pto = Some(ctx.rto_at.map_or(at, |rto| at.min(rto)));
    }

    fn on_deadline(
        &mut self,
        now: Time,
        sb: &mut Scoreboard,
        st: &mut LossState,
        new_data: bool,
    ) -> TimerVerdict {
        if self.reo_timer.is_some_and(|t| t <= now) {
            // §6.3: the reordering timer.
            if self.detect_loss(now, sb) > 0 {
                return match st.phase {
                    Phase::Open | Phase::Disorder => TimerVerdict::Enter(RecoveryTrigger::Rack),
                    Phase::Recovery | Phase::Loss => TimerVerdict::Lost,
                };
            }
            return TimerVerdict::Nothing;
        }
        if self.pto.is_none_or(|t| t > now) {
            return TimerVerdict::Nothing;
        }
        self.pto = None;
        // §7.3: new data if the window allows, else the highest segment.
        let seg = if new_data {
            sb.max()
        } else {
            match sb.highest_unsacked() {
                Some(seg) => seg,
                None => return TimerVerdict::Nothing,
            }
        };
        self.tlp_retrans = !new_data;
        self.tlp_seg = seg;
        self.tlp_end = Some(if new_data { sb.max() + 1 } else { sb.max() });
        TimerVerdict::Probe(seg)
    }

    fn on_rto(&mut self) {
        self.pto = None;
        self.reo_timer = None;
        self.tlp_end = None;
    }

    fn take_probe_loss(&mut self) -> bool {
        std::mem::take(&mut self.probe_loss)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::congestion::DeliveryRate;
    use crate::proto::wire::SackBlock;

    const MS: Duration = Duration::from_millis(1);

    fn at(ms: u64) -> Time {
        Time::from_nanos(ms * 1_000_000)
    }

    /// Ten segments sent 1 ms apart from 0 ms.
    fn setup() -> (Rack, Scoreboard, LossState) {
        let t = Tuning::default();
        let mut rate = DeliveryRate::default();
        let mut sb = Scoreboard::default();
        for ms in 0..10 {
            let seg = sb.on_send_new();
            sb.stamp(seg, rate.on_sent(at(ms), seg, seg, 0));
        }
        (Rack::new(&t), sb, LossState::new(&t))
    }

    fn ack(now: Time, dsack: Option<(u64, u64)>) -> AckSummary {
        AckSummary {
            now,
            echo: now.wire_micros(),
            dsack: dsack.and_then(|(s, e)| SackBlock::new(s, e)),
            srtt: 100 * MS,
            min_rtt: 100 * MS,
            ..AckSummary::default()
        }
    }

    /// RFC 8985 §6.2 step 4: the window is min_rtt / 4, one more step per
    /// round trip with a D-SACK (not per D-SACK), and back to one step
    /// after 16 recoveries without one.
    #[test]
    fn rfc8985_6_2_reo_wnd_grows_with_dsacks_once_per_round() {
        let (mut rack, mut sb, mut st) = setup();
        sb.clear_deliveries();
        sb.apply_sack(SackBlock::new(5, 6).unwrap());
        rack.on_ack(&mut sb, &mut st, &ack(at(105), None));
        assert_eq!(rack.reo_wnd, 25 * MS);
        // Segments 0..=4 were sent before 5 and are not lost before
        // 0 + 100 + 25 ms: the timer says when.
        assert_eq!(rack.reo_timer, Some(at(125)));
        assert_eq!(sb.lost_pending(), 0);
        sb.clear_deliveries();
        rack.on_ack(&mut sb, &mut st, &ack(at(106), Some((2, 3))));
        assert_eq!(rack.reo_wnd, 50 * MS);
        rack.on_ack(&mut sb, &mut st, &ack(at(107), Some((3, 4))));
        assert_eq!(rack.reo_wnd, 50 * MS, "same round trip");
        // Once snd_una passes the round's end, a D-SACK counts again.
        sb.ack_through(10);
        sb.clear_deliveries();
        rack.on_ack(&mut sb, &mut st, &ack(at(210), Some((4, 5))));
        assert_eq!(rack.reo_wnd_mult, 3);
        for _ in 0..REO_WND_PERSIST {
            rack.on_recovery_exit();
        }
        assert_eq!(rack.reo_wnd_mult, 1);
    }

    /// RFC 8985 §6.2 step 5: at the timer, everything sent before the
    /// delivered segment whose time is up is lost.
    #[test]
    fn rfc8985_6_3_the_timer_marks_what_no_ack_will() {
        let (mut rack, mut sb, mut st) = setup();
        sb.clear_deliveries();
        sb.apply_sack(SackBlock::new(5, 6).unwrap());
        assert_eq!(
            rack.on_ack(&mut sb, &mut st, &ack(at(105), None)),
            Verdict::Stay
        );
        assert_eq!(
            rack.on_deadline(at(125), &mut sb, &mut st, true),
            TimerVerdict::Enter(RecoveryTrigger::Rack)
        );
        // 0 is due at 125 ms; 1 at 126 ms, so the timer goes again.
        assert_eq!(sb.lost_pending(), 1);
        assert_eq!(rack.deadline(), Some(at(126)));
    }
}
