//! SACK: RFC 6675's conservative loss recovery.
//!
//! A segment is lost once `dup_thresh` segments above it are SACKed (IsLost).
//! Recovery starts on `dup_thresh` duplicate ACKs or when snd_una is lost;
//! the sender transmits while `pipe < cwnd`, choosing with NextSeg: lost
//! segments first (rule 1), then new data (rule 2, in the sender), then
//! un-SACKed segments below the highest SACK (rule 3), then one rescue
//! retransmission (rule 4).
//!
//! Deviation: rules 3 and 4 apply only once the stream has no new data
//! left, the tail case they exist for. While the sender is merely held by
//! a window, more ACKs are coming and they would only resend segments
//! still in flight.

use super::{AckSummary, LossRecovery, LossState, Phase, Verdict};
use crate::proto::events::RecoveryTrigger;
use crate::proto::stream::scoreboard::Scoreboard;
use crate::proto::tuning::RecoveryKind;

#[derive(Debug, Default)]
pub(super) struct Sack {
    /// RFC 6675 RescueRxt: at most one rescue retransmission per recovery.
    rescue_sent: bool,
}

impl LossRecovery for Sack {
    fn kind(&self) -> RecoveryKind {
        RecoveryKind::Sack
    }

    fn on_ack(&mut self, sb: &mut Scoreboard, st: &mut LossState, ack: &AckSummary) -> Verdict {
        // RFC 6675 §4 IsLost: everything below the dup_thresh-th highest
        // SACKed segment has dup_thresh SACKed segments above it.
        let lost_below = sb.kth_highest_sacked(st.dup_thresh);
        match st.phase {
            Phase::Recovery => {
                // RFC 6675 §5 (A).
                if st.recovery_point_acked(sb) {
                    return Verdict::Leave;
                }
                if let Some(limit) = lost_below {
                    sb.mark_lost_below(limit);
                }
                Verdict::Continue
            }
            // RFC 6675 §5.1: no new recovery until the timeout is repaired.
            Phase::Loss => Verdict::Stay,
            Phase::Open | Phase::Disorder => {
                let una_lost = lost_below.is_some_and(|limit| sb.una() < limit);
                let enough_dupacks = st.enough_dupacks(ack);
                if !(enough_dupacks || una_lost) {
                    return Verdict::Stay;
                }
                self.rescue_sent = false;
                // RFC 6675 §5 (4): retransmit snd_una, mark what IsLost says.
                Verdict::Enter {
                    trigger: if enough_dupacks {
                        RecoveryTrigger::DupAcks
                    } else {
                        RecoveryTrigger::SackLoss
                    },
                    lost_below,
                }
            }
        }
    }

    fn tail_retransmission(&mut self, sb: &Scoreboard, st: &LossState) -> Option<u64> {
        if st.phase != Phase::Recovery {
            return None;
        }
        // RFC 6675 §4 NextSeg rule 3.
        if let Some(highest) = sb.highest_sacked() {
            if let Some(seg) = sb.next_unsacked_unretransmitted(sb.una(), highest) {
                return Some(seg);
            }
        }
        // RFC 6675 §4 NextSeg rule 4: one rescue retransmission.
        if !self.rescue_sent {
            if let Some(seg) = sb.highest_unsacked_unretransmitted() {
                self.rescue_sent = true;
                return Some(seg);
            }
        }
        None
    }
}
